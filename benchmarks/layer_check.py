"""One MoE block of piper-train, measured under full load, against the planner's price of it
(issue 8's diagnostic: where the closed loop's under-prediction lives).

One command:  python benchmarks/layer_check.py  [--ranks 8] [--hardware cpu-local] [--iters 60]

`ranks` local gloo ranks (one thread each) run forward + backward of one MoE decoder block
(bf16 autocast over fp32 weights, rows padded as the spec says, a fresh input every call) at
once, with expert parallelism ep over consecutive ranks (flat all-to-all), for two widths:
tiny-moe's (d 64, expert f 96, 64 tokens) and small-moe-cpu's (d 256, f 512, 128 tokens),
8 experts top-2. Reported per (width, ep): the slowest rank's wall time per call (all ranks
busy, so the spec's full-load rates apply), the mean CPU per rank, and the planner's MoE layer
time for the same layout (estimate's layer_time_s['moe']: compute, row padding, weight casts,
layer overhead and the all-to-all calls), with measured / model. Then, to show one term the
model misses, the per-rank rates (all ranks at once) of the streaming kernels a block runs on
DRAM-sized tensors (c = a + b, the weight casts and the fp32 += bf16 gradient accumulation)
beside the spec's single streaming rate (memory_bandwidth_gbps x memory), which calibrate fits
mostly on cache-resident sizes."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

WIDTHS = ((64, 96, 64), (256, 512, 128))  # (hidden, expert ffn, tokens)
EPS = (1, 2, 4, 8)


def _spec(d: int, f: int, seq: int):
    from piper_plan.specs.model import ModelSpec

    return ModelSpec(name="layer-check", source="benchmarks/layer_check.py", num_layers=2, hidden_size=d,
                     num_heads=4, num_kv_heads=2, vocab_size=512, seq_len=seq, ffn_size=2 * d, dense_layers=1,
                     moe=dict(num_experts=8, top_k=2, expert_ffn_size=f, shared_experts=1, router="softmax"))


def _run(rank, n, path, ep, width, row_multiple, iters, out_path):
    os.environ["OMP_NUM_THREADS"] = "1"
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from piper_runtime.model import Block, BuildCtx
    from piper_runtime.moe.exchange_flat import FlatExchange

    from piper_runtime.host import keep_freed_pages

    keep_freed_pages()  # as piper-train's CPU ranks
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(path, n), rank=rank, world_size=n,
                            timeout=timedelta(seconds=60))
    groups = [dist.new_group(list(range(i, i + ep))) for i in range(0, n, ep)] if ep > 1 else []
    g = groups[rank // ep] if ep > 1 else None
    d, f, seq = width
    ctx = BuildCtx(seq=seq, dtype="bf16", row_multiple=row_multiple, ep=ep, ep_rank=rank % ep, ep_group=g,
                   exchange=FlatExchange(g) if ep > 1 else None)
    torch.manual_seed(rank)
    blk = Block(_spec(d, f, seq), 1, ctx)
    x = torch.randn(1, seq, d, requires_grad=True)

    def fb():
        x.data.normal_()  # a fresh input: new routed row counts, as in training
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            y = blk(x)
        y.float().sum().backward()

    for _ in range(40):  # past the GEMM library's per-shape builds
        fb()
    dist.barrier()
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(iters):
        fb()
    res = [None] * n
    dist.all_gather_object(res, ((time.perf_counter() - t0) / iters, (time.process_time() - c0) / iters))
    if rank == 0:
        with open(out_path, "w") as fh:
            fh.write(f"{max(r[0] for r in res)} {statistics.fmean(r[1] for r in res)}")
    dist.destroy_process_group()


def _streams(rank, n, path, out_path):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(path, n), rank=rank, world_size=n)
    rates = {}
    for numel in (2**20, 2**22):
        ws = [torch.randn(numel) for _ in range(6)]  # rotate buffers: no call finds its data cached
        hs = [w.to(torch.bfloat16) for w in ws]
        c, h = torch.empty(numel), torch.empty(numel, dtype=torch.bfloat16)
        kernels = {"c = a + b": (12, lambda i: torch.add(ws[i], ws[(i + 1) % 6], out=c)),
                   "fp32 -> bf16": (6, lambda i: h.copy_(ws[i])),
                   "bf16 -> fp32": (6, lambda i: c.copy_(hs[i])),
                   "fp32 += bf16": (10, lambda i: ws[i].add_(hs[i]))}
        for name, (bpe, fn) in kernels.items():
            fn(0)
            dist.barrier()
            t0 = time.perf_counter()
            for i in range(20):
                fn(i % 6)
            rates[f"{name} ({numel * 4 >> 20} MiB fp32)"] = bpe * numel * 20 / (time.perf_counter() - t0) / 1e9
    out = [None] * n
    dist.all_gather_object(out, rates)
    if rank == 0:
        with open(out_path, "w") as fh:
            for k in rates:
                fh.write(f"{k}\t{statistics.fmean(o[k] for o in out)}\n")
    dist.destroy_process_group()


def model_ms(hw, width, ep: int, ranks: int) -> float:
    from piper_plan.evaluate import estimate_layout
    from piper_plan.layout import Layout

    d, f, seq = width
    lay = Layout(gpus=ranks, pp=1, dp=ranks, ep=ep, mbs=1, global_batch=ranks, seq=seq, dtype="bf16",
                 fused_kernels=False, zero=1)
    return float(estimate_layout(_spec(d, f, seq), hw, lay).layer_time_s["moe"][0]) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--hardware", default="cpu-local")
    ap.add_argument("--iters", type=int, default=60)
    a = ap.parse_args(argv)
    import torch.multiprocessing as mp

    from piper_plan.specs.registry import load_hardware

    hw = load_hardware(a.hardware)
    print(f"{a.ranks} ranks on {os.cpu_count()} cores, one MoE block fwd+bwd each at once; model: {hw.name}")
    print(f"{'d':>4} {'tokens':>6} {'ep':>3} {'wall ms':>8} {'CPU/rank ms':>12} {'model ms':>9} {'meas/model':>11}")
    for width in WIDTHS:
        for ep in EPS:
            if a.ranks % ep:
                continue
            with tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "res")
                mp.spawn(_run, args=(a.ranks, os.path.join(tmp, "store"), ep, width,
                                     hw.accelerator.expert_row_multiple, a.iters, out), nprocs=a.ranks)
                wall, cpu = map(float, open(out).read().split())
            m = model_ms(hw, width, ep, a.ranks)
            print(f"{width[0]:>4} {width[2]:>6} {ep:>3} {wall * 1e3:8.2f} {cpu * 1e3:12.2f} {m:9.2f} {wall * 1e3 / m:11.2f}",
                  flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "res")
        mp.spawn(_streams, args=(a.ranks, os.path.join(tmp, "store"), out), nprocs=a.ranks)
        rows = [ln.split("\t") for ln in open(out).read().splitlines()]
    spec_rate = hw.accelerator.memory_bandwidth_gbps * hw.efficiency.memory
    print(f"\nstreaming kernels, GB/s per rank with {a.ranks} ranks at once (the spec prices all at {spec_rate:.1f}):")
    for name, rate in rows:
        print(f"   {name:<28} {float(rate):6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
