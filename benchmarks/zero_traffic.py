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
ZeRO-2 reduces each bucket to its owner, then broadcasts the same way."""
from __future__ import annotations

import argparse
import statistics

from piper_plan.evaluate import build_plan, estimate_layout
from piper_plan.layout import Layout
from piper_plan.specs.model import ModelSpec
from piper_plan.specs.registry import load_hardware
from piper_runtime.config import TrainConfig
from piper_runtime.launch import spawn_jobs

WIDE = dict(name="wide-dense-cpu", source="Piper benchmark model (inline in zero_traffic.py)", num_layers=2,
            hidden_size=1024, num_heads=8, vocab_size=4096, seq_len=16, ffn_size=4096, tied_embeddings=False)


def plans(ranks: int):
    m, hw = ModelSpec(**WIDE), load_hardware("cpu-local")
    out = []
    for zero in (0, 1, 2):
        lay = Layout(gpus=ranks, dp=ranks, mbs=1, global_batch=ranks, seq=16, dtype="bf16", zero=zero,
                     fused_kernels=False, sequence_parallel=False, overlap_grad_reduce=False)
        out.append(build_plan(m, hw, lay, estimate_layout(m, hw, lay)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=4)
    a = ap.parse_args()
    ps = plans(a.ranks)
    recs = spawn_jobs([(p, TrainConfig(steps=a.steps, timeout_s=600, log_every=0)) for _ in range(a.rounds)
                       for p in ps])
    drop = max(2, a.steps // 3)  # the first steps build kernels and buffers
    meas = {z: statistics.median(statistics.median(r["step_time_s"] for r in recs[k * 3 + z][drop:])
                                 for k in range(a.rounds)) for z in (0, 1, 2)}
    pred = {z: ps[z].predicted.step_time_s for z in (0, 1, 2)}
    print(f"wide-dense-cpu ({ps[0].model.total_params / 1e6:.1f} M parameters) on {a.ranks} gloo ranks, "
          f"{a.steps} steps x {a.rounds} rounds (median of steps {drop + 1}..{a.steps}, median over rounds)")
    print(f"{'ZeRO':>4} {'measured ms':>12} {'predicted ms':>13} {'pred dp_comm ms':>16} {'meas / ZeRO-0':>14} "
          f"{'pred / ZeRO-0':>14}")
    for z in (0, 1, 2):
        dp = ps[z].predicted.time_breakdown_s["dp_comm"]
        print(f"{z:>4} {meas[z] * 1e3:12.1f} {pred[z] * 1e3:13.1f} {dp * 1e3:16.1f} {meas[z] / meas[0]:14.2f} "
              f"{pred[z] / pred[0]:14.2f}")


if __name__ == "__main__":
    main()
