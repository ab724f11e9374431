"""piper-train throughput on local CPU ranks, and our MoE layer against torchtitan's.

One command:  python benchmarks/runtime_throughput.py  [--steps 6] [--ranks 4,8] [--skip-peer]

Part 1: tokens/s of tiny-moe (models/tiny-moe.yaml) and small-moe-cpu (defined below) on 4
and 8 local gloo ranks, three layouts each, bf16, built with the planner's own estimate so
each row prints the measured step time beside the predicted one (hardware: cpu-local).
All layouts of one rank count run in one process start (launch.spawn_jobs).

Part 2: one MoE layer (4,096 tokens, d 256, expert width 512, 8 experts, top-2, softmax
router, SwiGLU experts, no shared expert), forward + backward, ours against torchtitan
0.3.0's `torchtitan.models.common.moe.MoE` (the peer; optional: `pip install --no-deps
torchtitan==0.3.0 tyro spmd_types==0.2.3 einops torchdata safetensors torch_checkpointing
docstring_parser typeguard triton`), identical weights and input, same process, rounds
interleaved, median of rounds, one thread, timed as this process's CPU time (the shared
dev machine's other load inflates wall time; wall medians are printed too). torchtitan
computes its experts in bf16 on any device, so the ratio compares our bf16 path; our fp32
path is shown for reference."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from piper_plan.evaluate import build_plan, estimate_layout
from piper_plan.layout import Layout
from piper_plan.specs.model import ModelSpec
from piper_plan.specs.registry import load_hardware, load_model
from piper_runtime.config import TrainConfig
from piper_runtime.launch import spawn_jobs

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _args import comma_list, int_at_least, one_of  # noqa: E402

# what the peer needs and no more (torchtitan's own dependencies would replace this torch);
# triton too: torchtitan 0.3.0's MoE imports it even on CPU (without it: No module named 'triton')
PEER_PIP = ("pip install --no-deps torchtitan==0.3.0 tyro spmd_types==0.2.3 einops torchdata safetensors "
            "torch_checkpointing docstring_parser typeguard triton")

# A CPU model ~10x tiny-moe's FLOPs per token (not a published model).
SMALL = dict(name="small-moe-cpu", source="Piper benchmark model (inline in runtime_throughput.py)",
             num_layers=4, hidden_size=256, num_heads=8, num_kv_heads=4, vocab_size=2048, seq_len=128,
             ffn_size=512, dense_layers=1,
             moe=dict(num_experts=8, top_k=2, expert_ffn_size=512, shared_experts=1, router="softmax"))

# (ranks) -> three layouts: (pp, dp, ep, vpp, schedule)
LAYOUTS = {
    4: [(1, 4, 4, 1, "1f1b"), (2, 2, 2, 1, "1f1b"), (2, 2, 2, 2, "zbv")],
    8: [(1, 8, 8, 1, "1f1b"), (2, 4, 4, 1, "1f1b"), (4, 2, 2, 1, "1f1b")],
}


def _plans(ranks: int):
    hw = load_hardware("cpu-local")
    out = []
    for spec, seq, gb in ((load_model("tiny-moe"), 64, 16), (ModelSpec(**SMALL), 128, 16)):
        for pp, dp, ep, vpp, sched in LAYOUTS[ranks]:
            lay = Layout(gpus=ranks, pp=pp, dp=dp, ep=ep, vpp=vpp, mbs=1, global_batch=gb, seq=seq,
                         schedule=sched, dtype="bf16", zero=1, fused_kernels=False)
            out.append(build_plan(spec, hw, lay, estimate_layout(spec, hw, lay)))
    return out


def throughput(ranks_list: list[int], steps: int) -> None:
    print(f"\n== piper-train throughput: cpu-local, bf16, {steps} steps (mean of steps 3..{steps}), "
          f"OMP_NUM_THREADS=1 per rank, {torch.get_num_threads()} cores visible")
    print(f"{'model':<14} {'ranks':>5}  {'layout':<26} {'step ms':>8} {'tokens/s':>9} {'pred ms':>8} "
          f"{'meas/pred':>9} {'a2a ms':>7} {'EP max/mean':>11}")
    for ranks in ranks_list:
        plans = _plans(ranks)
        t0 = time.perf_counter()
        recs = spawn_jobs([(p, TrainConfig(steps=steps, timeout_s=300, log_every=0)) for p in plans])
        wall = time.perf_counter() - t0
        for plan, rr in zip(plans, recs):
            lay = plan.layout
            use = rr[2:] if len(rr) > 2 else rr
            step = statistics.fmean(r["step_time_s"] for r in use)
            a2a = statistics.fmean(r["a2a_time_s"] for r in use)
            bal = [v for r in use for g in r["ep_max_over_mean"].values() for v in g.values()]
            pred = plan.predicted.step_time_s if plan.predicted else float("nan")
            name = f"pp{lay.pp} dp{lay.dp} ep{lay.ep} {lay.schedule}" + (f" v{lay.vpp}" if lay.vpp > 1 else "")
            print(f"{plan.model.name:<14} {ranks:>5}  {name:<26} {step * 1e3:8.1f} "
                  f"{lay.global_batch * lay.seq / step:9.0f} {pred * 1e3:8.1f} {step / pred:9.2f} {a2a * 1e3:7.1f} "
                  f"{(statistics.fmean(bal) if bal else 1.0):11.2f}")
        print(f"   ({ranks} ranks: {len(plans)} runs in one process start, {wall:.0f} s wall)")


def _peer_moe(T, D, F, E, K):
    from torchtitan.models.common.linear import Linear
    from torchtitan.models.common.moe import MoE, RoutedExperts, TokenChoiceTopKRouter
    from torchtitan.models.common.moe import GroupedExperts as TTExperts
    from torchtitan.models.common.token_dispatcher import LocalTokenDispatcher

    cfg = MoE.Config(
        num_experts=E,
        routed_experts=RoutedExperts.Config(inner_experts=TTExperts.Config(dim=D, hidden_dim=F, num_experts=E),
                                            token_dispatcher=LocalTokenDispatcher.Config(num_experts=E, top_k=K)),
        router=TokenChoiceTopKRouter.Config(num_experts=E, gate=Linear.Config(in_features=D, out_features=E),
                                            top_k=K, score_func="softmax", route_norm=False),
        load_balance_coeff=None, shared_experts=None)
    return cfg.build()


def _our_moe(peer, D, F, E, K, dtype):
    from piper_runtime.moe.dispatch import EPDispatcher
    from piper_runtime.moe.experts import GroupedExperts
    from piper_runtime.moe.layer import MoELayer
    from piper_runtime.moe.placement import ExpertPlacement
    from piper_runtime.moe.router import TopKRouter

    ex = GroupedExperts(E, D, F, gated=True)
    m = MoELayer(TopKRouter(D, E, K, "softmax", norm_topk=False), ex, None,
                 EPDispatcher(ExpertPlacement.contiguous(E, 1)), compute_dtype=dtype)
    with torch.no_grad():  # the peer's weights, in our [in, out] layout
        m.router.gate.weight.copy_(peer.router.gate.weight)
        pe = peer.routed_experts.inner_experts
        ex.w1.copy_(pe.w1_EFD.transpose(1, 2))
        ex.w3.copy_(pe.w3_EFD.transpose(1, 2))
        ex.w2.copy_(pe.w2_EDF.transpose(1, 2))
    return m


def moe_layer(rounds: int) -> bool:
    """Time our MoE layer against torchtitan's; False where the peer could not be built (the
    ratio was not measured: said in one line with the install command)."""
    T, D, F, E, K = 4096, 256, 512, 8, 2
    torch.set_num_threads(1)
    print(f"\n== MoE layer forward+backward: {T} tokens, d {D}, expert width {F}, {E} experts, top-{K}; "
          f"1 thread, median of {rounds} interleaved rounds")
    import warnings

    warnings.filterwarnings("ignore", message=".*CPU autocast.*|.*In CPU autocast.*")
    try:
        peer = _peer_moe(T, D, F, E, K)
    except Exception as e:  # report exactly why the peer is missing, and how to get it
        print(f"   torchtitan MoE unavailable: {type(e).__name__}: {e}")
        print(f"   peer ratio NOT measured (ours vs torchtitan's MoE layer); to measure it: {PEER_PIP}")
        return False
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in peer.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    mods = {"torchtitan 0.3.0 (bf16 experts)": peer,
            "piper (bf16 experts)": _our_moe(peer, D, F, E, K, torch.bfloat16),
            "piper (fp32)": _our_moe(peer, D, F, E, K, torch.float32)}
    x = torch.randn(1, T, D, generator=g)
    gy = torch.randn(1, T, D, generator=g)

    def fwd_bwd(m):
        xi = x.clone().requires_grad_()
        y = m(xi)
        y.float().backward(gy)
        return y.detach().float()

    ref = fwd_bwd(peer)
    for name, m in mods.items():  # warm-up, and the same function: outputs agree
        err = float((fwd_bwd(m) - ref).abs().max() / ref.abs().max())
        print(f"   {name:<32} max |out - peer| / max |peer| = {err:.1e}")
    cpu = {k: [] for k in mods}
    wall = {k: [] for k in mods}
    for _ in range(rounds):
        for k, m in mods.items():
            t, c = time.perf_counter(), time.process_time()
            fwd_bwd(m)
            cpu[k].append(time.process_time() - c)
            wall[k].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in cpu.items()}
    medw = {k: statistics.median(v) for k, v in wall.items()}
    peer_k = "torchtitan 0.3.0 (bf16 experts)"
    for k in mods:
        print(f"   {k:<32} CPU {med[k] * 1e3:7.1f} ms (ratio {med[k] / med[peer_k]:4.2f})   "
              f"wall {medw[k] * 1e3:7.1f} ms (ratio {medw[k] / medw[peer_k]:4.2f})")
    print(f"   => ours / torchtitan, same bf16 expert math: {med['piper (bf16 experts)'] / med[peer_k]:.2f} CPU time, "
          f"{medw['piper (bf16 experts)'] / medw[peer_k]:.2f} wall (< 1: ours is faster)")
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int_at_least(1), default=6)
    ap.add_argument("--ranks", type=comma_list(one_of([str(r) for r in LAYOUTS])), default=["4", "8"],
                    help=f"comma-separated local rank counts, of {','.join(map(str, LAYOUTS))}")
    ap.add_argument("--rounds", type=int_at_least(1), default=20, help="MoE-layer timing rounds")
    ap.add_argument("--skip-peer", action="store_true", help="only the throughput part")
    ap.add_argument("--skip-throughput", action="store_true", help="only the MoE-layer comparison")
    a = ap.parse_args(argv)
    if not a.skip_throughput:
        throughput([int(r) for r in a.ranks], a.steps)
    if not a.skip_peer:  # a missing peer is said in moe_layer's last line, not an error: what ran stands
        moe_layer(a.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
