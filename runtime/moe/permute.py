"""The dispatcher's token permutation: counting, gathering rows into expert order, and the
weighted combine back into token order, with no atomics and no host synchronisation.

Counts are a scatter-add into E bins instead of torch.bincount, whose CUDA kernel reads the
input's minimum and maximum back to the host to size its output (two synchronisations a call).
Summing each token's k rows (the combine, and the gather's backward) replaces an index_add of the
rows into their tokens, whose k-way collisions are atomics on a GPU, by the form each device runs
fastest (benchmarks/permute.py, forward + backward at Granite-3.0-3B-A800M's layer, against that
index_add):
- on a GPU, each row is copied to its own (token, choice) slot of an [N·k, d] buffer and the k
  slots are summed: ×1.39 and ×1.40 in two runs on an H200, where embedding_bag's gather-sum
  made ×1.10 (and the whole step of a Granite plan 734 ms against 688);
- on a CPU, embedding_bag's fused gather-sum over each pair's row index, the routing weights as
  its per-sample weights: ×1.8-2.1 on 2 cores (2,048 tokens; two runs), where the slot sums
  made ×0.88-0.90.

`Pairs.src` is, for each row in expert order, its flat (token, choice) position t·k + j; pairs
without a row (dropped by capacity) are those it does not name."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import torch.nn.functional as F

_FORCED: Optional[bool] = None  # set by sums_by_slot(): count a GPU's op sequence on a CPU


def count(ids: torch.Tensor, n: int) -> torch.Tensor:
    """torch.bincount(ids, minlength=n) for ids in [0, n), on ids' device, no sync. -> [n] int64."""
    return torch.zeros(n, dtype=torch.long, device=ids.device).scatter_add_(0, ids, torch.ones_like(ids))


def by_slot(device: torch.device) -> bool:
    """Whether token sums go through the [N·k, d] slot buffer rather than embedding_bag."""
    return device.type != "cpu" if _FORCED is None else _FORCED


@contextmanager
def sums_by_slot(flag: bool = True) -> Iterator[None]:
    """Take the slot sums (flag True) or the gather-sum whatever the device, e.g. so that
    benchmarks/eager_bytes.py counts on a CPU the ops piper-train runs on a GPU."""
    global _FORCED
    old, _FORCED = _FORCED, flag
    try:
        yield
    finally:
        _FORCED = old


@dataclass
class Pairs:
    """Where the routed (token, choice) pairs of n tokens x top-k sit in expert order."""

    src: torch.Tensor                   # [A] t·k + j of each row
    n: int
    k: int
    slots: bool                         # sum by slot buffer; else by gather-sum over `rows`
    rows: Optional[torch.Tensor] = None  # [n, k] each pair's row (0 where it has none)
    kept: Optional[torch.Tensor] = None  # [n, k] fp32 1 where the pair has a row; None: all do

    @classmethod
    def of(cls, src: torch.Tensor, n: int, k: int) -> "Pairs":
        if by_slot(src.device):
            return cls(src, n, k, True)
        a, dev = src.numel(), src.device
        idx = torch.arange(a, device=dev)
        if a == n * k:
            return cls(src, n, k, False, torch.empty_like(src).scatter_(0, src, idx).view(n, k))
        rows = torch.zeros(n * k, dtype=src.dtype, device=dev).scatter_(0, src, idx)
        kept = torch.zeros(n * k, device=dev).scatter_(0, src, torch.ones(a, device=dev))
        return cls(src, n, k, False, rows.view(n, k), kept.view(n, k))

    def token_sum(self, rows: torch.Tensor, weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        """out[t] = Σ_j weights[t, j] · rows[row of (t, j)] in fp32 (weights None: 1; pairs
        without a row: 0): rows [A, d] -> [n, d]."""
        d = rows.shape[1]
        if self.slots:
            if weights is not None:
                return _SlotCombine.apply(rows, weights.float(), self.src, self.n, self.k)
            return _slots(rows, self.src, self.n, self.k).sum(1, dtype=torch.float32)
        if rows.shape[0] == 0:  # no rows at all (no tokens, or all dropped): nothing to gather,
            # but the result stays in rows' graph as the slot sums' does (0 + an empty sum)
            return rows.new_zeros(self.n, d, dtype=torch.float32) + rows.float().sum()
        w = self.kept if weights is None else (weights.float() if self.kept is None else weights.float() * self.kept)
        return F.embedding_bag(self.rows, rows.float(), per_sample_weights=w, mode="sum")


def _slots(rows: torch.Tensor, src: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """rows [A, d] copied to their (token, choice) slots: [n, k, d], zeros where a pair has none."""
    return rows.new_zeros(n * k, rows.shape[1]).index_copy_(0, src, rows).view(n, k, rows.shape[1])


class _SlotCombine(torch.autograd.Function):
    """out[t] = Σ_j w[t, j] · y[row of (t, j)] through the [n·k, d] slot buffer, in fp32 (bf16 x
    fp32: an fp32 product). It saves the buffer and the weights only: autograd's index_copy
    would keep its source too, a second rows x d copy of the expert outputs per layer and
    micro-batch (benchmarks/memory_check.py counts what a block saves)."""

    @staticmethod
    def forward(ctx, y, w, src, n: int, k: int):
        yk = _slots(y, src, n, k)
        ctx.save_for_backward(yk, w, src)
        return (yk * w.unsqueeze(-1)).sum(1)

    @staticmethod
    def backward(ctx, g):
        yk, w, src = ctx.saved_tensors
        gw = (g.unsqueeze(1) * yk).sum(-1) if ctx.needs_input_grad[1] else None
        gy = None
        if ctx.needs_input_grad[0]:
            gk = (g.unsqueeze(1) * w.unsqueeze(-1)).to(yk.dtype)
            gy = gk.view(-1, yk.shape[2]).index_select(0, src)
        return gy, gw, None, None, None


class Permute(torch.autograd.Function):
    """rows[i] = x[src[i] // k] in `dtype`: x [N, d] -> [A, d]. The cast runs on the N tokens
    before the gather (k times fewer elements than casting the rows); backward sums each token's
    row gradients in fp32 and returns them in x's dtype."""

    @staticmethod
    def forward(ctx, x, pairs: Pairs, dtype):
        ctx.pairs, ctx.xdtype = pairs, x.dtype
        return x.to(dtype).index_select(0, torch.div(pairs.src, pairs.k, rounding_mode="floor"))

    @staticmethod
    def backward(ctx, g):
        return ctx.pairs.token_sum(g).to(ctx.xdtype), None, None


def permute(x: torch.Tensor, pairs: Pairs, dtype: torch.dtype) -> torch.Tensor:
    """x [N, d] -> its rows in expert order [A, d] in `dtype`."""
    return Permute.apply(x, pairs, dtype)


def combine(y: torch.Tensor, pairs: Pairs, weights: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """Σ_j weights[t, j] · y[row of (t, j)] in fp32, cast to out_dtype: y [A, d] in expert
    order, weights [N, k] -> [N, d]. Pairs without a row contribute 0 and get no gradient
    through their weight."""
    return pairs.token_sum(y, weights).to(out_dtype)
