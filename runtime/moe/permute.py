"""The dispatcher's token permutation: counting, gathering rows into expert order, and the
weighted combine back into token order, with no host synchronisation and, on a GPU, no atomics.

Counts are a scatter-add into E bins instead of torch.bincount, whose CUDA kernel reads the
input's minimum and maximum back to the host to size its output (two synchronisations a call).
Summing each token's k rows (the combine, and the permute's backward) is an index_add on the
CPU, a plain loop there; on a GPU its k-way collisions are atomics, so each row is first copied
to its own (token, choice) slot of an [N·k, d] buffer (a unique index) and the k slots are
summed. benchmarks/permute.py measures both against each other; on 2 CPU cores the slot sum is
0.8-0.9x the index_add (the buffer's fill and the mixed-dtype product cost more than the loop
saves). `src` below is, for each row in expert order, its flat (token, choice) position t·k + j."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

import torch

_FORCED: Optional[bool] = None  # set by sums_by_slot(): count a GPU's op sequence on a CPU


def count(ids: torch.Tensor, n: int) -> torch.Tensor:
    """torch.bincount(ids, minlength=n) for ids in [0, n), on ids' device, no sync. -> [n] int64."""
    return torch.zeros(n, dtype=torch.long, device=ids.device).scatter_add_(0, ids, torch.ones_like(ids))


def by_slot(device: torch.device) -> bool:
    """Whether token sums go through the [N·k, d] slot buffer (no atomics) rather than index_add."""
    return device.type != "cpu" if _FORCED is None else _FORCED


@contextmanager
def sums_by_slot(flag: bool = True) -> Iterator[None]:
    """Take the slot sums (flag True) or index_add whatever the device, e.g. so that
    benchmarks/eager_bytes.py counts on a CPU the ops piper-train runs on a GPU."""
    global _FORCED
    old, _FORCED = _FORCED, flag
    try:
        yield
    finally:
        _FORCED = old


class Permute(torch.autograd.Function):
    """rows[i] = x[src[i] // k] in `dtype`: x [N, d] -> [A, d]. The cast runs on the N tokens
    before the gather (k times fewer elements than casting the rows); backward sums each token's
    row gradients in fp32 and returns them in x's dtype."""

    @staticmethod
    def forward(ctx, x, src, k: int, dtype, slots: bool):
        ctx.save_for_backward(src)
        ctx.n, ctx.k, ctx.xdtype, ctx.slots = x.shape[0], k, x.dtype, slots
        return x.to(dtype).index_select(0, torch.div(src, k, rounding_mode="floor"))

    @staticmethod
    def backward(ctx, g):
        (src,) = ctx.saved_tensors
        n, k = ctx.n, ctx.k
        if ctx.slots:
            gk = g.new_zeros(n * k, g.shape[1]).index_copy_(0, src, g)
            gx = gk.view(n, k, g.shape[1]).sum(1, dtype=torch.float32)
        else:
            tok = torch.div(src, k, rounding_mode="floor")
            gx = g.new_zeros(n, g.shape[1], dtype=torch.float32).index_add_(0, tok, g.float())
        return gx.to(ctx.xdtype), None, None, None, None


def permute(x: torch.Tensor, src: torch.Tensor, k: int, dtype: torch.dtype, slots: bool | None = None) -> torch.Tensor:
    """x [N, d] -> its rows in expert order [A, d] in `dtype` (slots: None = by_slot(x.device))."""
    return Permute.apply(x, src, k, dtype, by_slot(x.device) if slots is None else slots)


def combine(y: torch.Tensor, src: torch.Tensor, weights: torch.Tensor, out_dtype: torch.dtype,
            slots: bool | None = None) -> torch.Tensor:
    """Σ_j weights[t, j] · y[row of (t, j)] in fp32, cast to out_dtype: y [A, d] in expert
    order, weights [N, k] -> [N, d]. Pairs with no row (dropped) contribute 0."""
    n, k = weights.shape
    w = weights.float()
    if by_slot(y.device) if slots is None else slots:
        yk = y.new_zeros(n * k, y.shape[1]).index_copy(0, src, y).view(n, k, y.shape[1])
        return (yk * w.unsqueeze(-1)).sum(1).to(out_dtype)  # bf16 x fp32: an fp32 product
    contrib = y.float() * w.reshape(-1)[src].unsqueeze(1)
    tok = torch.div(src, k, rounding_mode="floor")
    return contrib.new_zeros(n, y.shape[1]).index_add(0, tok, contrib).to(out_dtype)
