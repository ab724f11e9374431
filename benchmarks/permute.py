"""piper-train's MoE permutation (runtime/moe/permute.py), both of its token sums, against the
index_add it replaced, all measured in this run: forward and backward of the gather into expert
order plus the weighted combine, the expert computation left out (identity), at one layer's
shape.

    python benchmarks/permute.py [--tokens 8192 --hidden 1536 --experts 40 --topk 8]
                                 [--dtype bf16] [--device cuda] [--repeats 20]

"baseline" is piper-train's code before 5fa6972: rows gathered in x's dtype then cast, combined
by an fp32 product and an index_add over the tokens, whose backward index_adds the rows'
gradients back (k-way collisions: atomics on a GPU); counts by torch.bincount (two host
synchronisations a call on CUDA). "slots" sums each token's rows through an [N·k, d] buffer of
(token, choice) slots (what piper-train runs on a GPU), "gather_sum" by embedding_bag (what it
runs on a CPU). Defaults are Granite-3.0-3B-A800M's MoE layer at a 4 x 2,048 token micro-batch.
Prints the median seconds of each and baseline / each (above 1: faster), and which one
piper-train takes on this device; checks all agree (outputs and gradients) first."""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _args import int_at_least  # noqa: E402
from piper_runtime.moe.permute import Pairs, by_slot, combine, count, permute, sums_by_slot  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


class _OldGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, index, dtype):
        ctx.save_for_backward(index)
        ctx.n, ctx.xdtype = x.shape[0], x.dtype
        return x.index_select(0, index).to(dtype)

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        gx = g.new_zeros((ctx.n,) + tuple(g.shape[1:]), dtype=ctx.xdtype)
        return gx.index_add_(0, index, g.to(ctx.xdtype)), None, None


def baseline(x, experts, weights, E, dtype):
    N, k = experts.shape
    flat_e, w = experts.reshape(-1), weights.reshape(-1)
    token = torch.arange(N * k, device=x.device) // k
    order = torch.argsort(flat_e, stable=True)
    tok_sorted, w_sorted = token[order], w[order]
    counts = torch.bincount(flat_e, minlength=E)
    rows = _OldGather.apply(x, tok_sorted, dtype)
    contrib = rows.float() * w_sorted.unsqueeze(1)
    out = contrib.new_zeros(N, x.shape[1]).index_add(0, tok_sorted, contrib)
    return out.to(x.dtype), counts


def new(x, experts, weights, E, dtype, slots: bool):
    N, k = experts.shape
    flat_e = experts.reshape(-1)
    src = torch.argsort(flat_e, stable=True)
    counts = count(flat_e, E)
    with sums_by_slot(slots):
        pairs = Pairs.of(src, N, k)
    rows = permute(x, pairs, dtype)
    return combine(rows, pairs, weights, x.dtype), counts


def run(fn, x, experts, weights, E, dtype, sync):
    x.grad = weights.grad = None
    out, counts = fn(x, experts, weights, E, dtype)
    out.square().mean().backward()
    sync()
    return out, counts


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int_at_least(1), default=8192)
    ap.add_argument("--hidden", type=int_at_least(1), default=1536)
    ap.add_argument("--experts", type=int_at_least(1), default=40)
    ap.add_argument("--topk", type=int_at_least(1), default=8, help="at most --experts")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    # the first repeat is dropped (warm-up), so two is the fewest that times anything
    ap.add_argument("--repeats", type=int_at_least(2), default=20)
    a = ap.parse_args(argv)
    if a.topk > a.experts:
        ap.error(f"argument --topk: expected at most --experts ({a.experts}), got {a.topk}")
    try:
        dev = torch.device(a.device)
    except RuntimeError:
        ap.error(f"argument --device: expected a torch device such as cpu or cuda, got {a.device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        ap.error("argument --device: cuda is not available here")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    dev, dt = torch.device(a.device), DTYPES[a.dtype]
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(a.tokens, a.hidden, generator=g).to(dev).requires_grad_()  # fp32 residual stream
    logits = torch.randn(a.tokens, a.experts, generator=g).to(dev)
    w, e = torch.topk(torch.softmax(logits, -1), a.topk, -1)
    weights = w.contiguous().requires_grad_()

    variants = {"baseline": baseline, "slots": functools.partial(new, slots=True),
                "gather_sum": functools.partial(new, slots=False)}
    res = {}
    for name, fn in variants.items():
        out = run(fn, x, e, weights, a.experts, dt, sync)
        res[name] = [t.detach().clone() for t in out] + [x.grad.clone(), weights.grad.clone()]
    tol = 1e-5 if dt == torch.float32 else 1e-2
    for name in ("slots", "gather_sum"):
        for what, r, n in zip(("output", "counts", "x.grad", "weights.grad"), res["baseline"], res[name]):
            if not torch.allclose(r.float(), n.float(), rtol=tol, atol=tol * float(r.float().abs().max())):
                print(f"{name}: mismatch in {what}: max |diff| {float((r.float() - n.float()).abs().max()):.3g}")
                return 1
    times = {k: [] for k in variants}
    for _ in range(a.repeats):  # interleaved, so drift hits all alike
        for name, fn in variants.items():
            t0 = time.perf_counter()
            run(fn, x, e, weights, a.experts, dt, sync)
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v[1:]) for k, v in times.items()}
    print(f"{a.device} {a.dtype}: {a.tokens} tokens x top-{a.topk} of {a.experts}, d {a.hidden}; "
          f"forward+backward, median of {a.repeats - 1}; piper-train takes "
          f"{'slots' if by_slot(dev) else 'gather_sum'} here")
    for name, v in med.items():
        print(f"  {name:10s} {v * 1e3:9.3f} ms   baseline/{name} {med['baseline'] / v:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
