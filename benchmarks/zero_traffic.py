"""piper-train's ZeRO stages against their predictions where the data-parallel traffic is the step.

One command:  python benchmarks/zero_traffic.py  [--steps 8] [--rounds 3] [--ranks 4]

A CPU-sized dense model with wide layers and almost no compute (two 1,024-wide layers, a
4,096-token vocabulary, 16-token sequences, one micro-batch a rank: ~42 M parameters, 168 MB
of fp32 gradients), so a step is mostly its gradient reduction and, with ZeRO, the parameters'
return from their owners. Three plans, ZeRO 0, 1 and 2 on --ranks data-parallel gloo ranks
(pp 1, bf16, eager, reduction after the backward: what piper-train runs), each run --steps
steps, --rounds times interleaved (this shared machine's speed drifts over minutes); the median
over rounds of each run's median step is the measured time. Printed: measured and predicted
step per stage, and each stage's step over ZeRO-0's, measured beside predicted -- the
comparison that says whether the planner prices the traffic piper-train's ZeRO issues: ZeRO-1
all-reduces the fp32 gradients as ZeRO-0 does and then broadcasts each owner's fp32 parameters;
ZeRO-2 reduces each bucket to its owner, then broadcasts the same way. --replicas R (default 2;
1: none) adds ZeRO-1 and ZeRO-2 hybrid-sharded over R copies of --ranks / R ranks (labelled
1xR, 2xR): the broadcasts and ZeRO-2's reduces run within a shard, and ZeRO-2's owners then
all-reduce their sums across the copies."""
from __future__ import annotations

import argparse
import os
import statistics
import sys

from piper_plan.errors import PiperError
from piper_plan.evaluate import build_plan, estimate_layout
from piper_plan.layout import Layout
from piper_plan.specs.model import ModelSpec
from piper_plan.specs.registry import load_hardware
from piper_runtime.config import TrainConfig
from piper_runtime.launch import spawn_jobs

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _args import int_at_least  # noqa: E402

WIDE = dict(name="wide-dense-cpu", source="Piper benchmark model (inline in zero_traffic.py)", num_layers=2,
            hidden_size=1024, num_heads=8, vocab_size=4096, seq_len=16, ffn_size=4096, tied_embeddings=False)


def plans(ranks: int, replicas: int = 1) -> dict[str, object]:
    """label -> plan: ZeRO 0, 1, 2 and, with replicas > 1, ZeRO 1 and 2 over `replicas` shards."""
    m, hw = ModelSpec(**WIDE), load_hardware("cpu-local")
    stages = [(0, 1), (1, 1), (2, 1)] + ([(1, replicas), (2, replicas)] if replicas > 1 else [])
    out = {}
    for zero, r in stages:
        lay = Layout(gpus=ranks, dp=ranks, mbs=1, global_batch=ranks, seq=16, dtype="bf16", zero=zero,
                     zero_replicas=r, fused_kernels=False, sequence_parallel=False, overlap_grad_reduce=False)
        out[f"{zero}x{r}" if r > 1 else str(zero)] = build_plan(m, hw, lay, estimate_layout(m, hw, lay))
    return out


def parse_args(argv=None) -> tuple[argparse.Namespace, dict]:
    """The options and the plans they name, built before anything runs: a layout the planner
    refuses (--replicas not dividing --ranks into shards of 2 or more) is a one-line usage error."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # the first max(2, steps // 3) steps build kernels and buffers and are dropped: 3 keeps one
    ap.add_argument("--steps", type=int_at_least(3), default=8)
    ap.add_argument("--rounds", type=int_at_least(1), default=3)
    ap.add_argument("--ranks", type=int_at_least(1), default=4)
    ap.add_argument("--replicas", type=int_at_least(1), default=2,
                    help="ZeRO shard copies for the hybrid runs (1: none)")
    a = ap.parse_args(argv)
    try:
        return a, plans(a.ranks, a.replicas)
    except PiperError as e:
        ap.error(f"--ranks {a.ranks} --replicas {a.replicas}: {e}")


def main(argv=None) -> int:
    a, ps = parse_args(argv)
    labels = list(ps)
    recs = spawn_jobs([(ps[k], TrainConfig(steps=a.steps, timeout_s=600, log_every=0)) for _ in range(a.rounds)
                       for k in labels])
    drop = max(2, a.steps // 3)  # the first steps build kernels and buffers
    n = len(labels)
    meas = {k: statistics.median(statistics.median(r["step_time_s"] for r in recs[j * n + i][drop:])
                                 for j in range(a.rounds)) for i, k in enumerate(labels)}
    pred = {k: ps[k].predicted.step_time_s for k in labels}
    print(f"wide-dense-cpu ({ps['0'].model.total_params / 1e6:.1f} M parameters) on {a.ranks} gloo ranks, "
          f"{a.steps} steps x {a.rounds} rounds (median of steps {drop + 1}..{a.steps}, median over rounds)")
    print(f"{'ZeRO':>4} {'measured ms':>12} {'predicted ms':>13} {'pred dp_comm ms':>16} {'meas / ZeRO-0':>14} "
          f"{'pred / ZeRO-0':>14}")
    for k in labels:
        dp = ps[k].predicted.time_breakdown_s["dp_comm"]
        print(f"{k:>4} {meas[k] * 1e3:12.1f} {pred[k] * 1e3:13.1f} {dp * 1e3:16.1f} {meas[k] / meas['0']:14.2f} "
              f"{pred[k] / pred['0']:14.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
