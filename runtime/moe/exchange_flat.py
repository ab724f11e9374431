"""Flat expert-parallel exchange: one all_to_all_single over the EP group.

The exchange interface (shared with HALO, moe/halo.py): an object called as
`exchange(x[N, d], send_splits, recv_splits, counts=None) -> Tensor[sum(recv_splits), d]`
with exactly the semantics of dist.all_to_all_single over the EP group (rows for group peer
j sent in order, received rows ordered by source rank), differentiable: its backward is the
same exchange with the splits swapped. `counts` (halo.Counts, the group's whole W x W row
count matrix, which the dispatcher already has) spares an exchange that needs more than its
own splits a count exchange of its own; the flat exchange needs none and ignores it."""
from __future__ import annotations

import torch
import torch.distributed as dist


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, send_splits, recv_splits, group):
        ctx.splits, ctx.group = (send_splits, recv_splits), group
        return _a2a(x, send_splits, recv_splits, group)

    @staticmethod
    def backward(ctx, grad):
        send, recv = ctx.splits
        return _a2a(grad, recv, send, ctx.group), None, None, None


def _a2a(x: torch.Tensor, send: list[int], recv: list[int], group) -> torch.Tensor:
    # gloo needs contiguous inputs; uneven and all-zero splits are fine (brief §8)
    x = x.contiguous()
    out = x.new_empty((sum(recv),) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, x, output_split_sizes=list(recv), input_split_sizes=list(send), group=group)
    return out


class FlatExchange:
    """all_to_all_single over `group` (the EP group of one pipeline stage)."""

    def __init__(self, group):
        self.group = group

    def __call__(self, x: torch.Tensor, send_splits: list[int], recv_splits: list[int], counts=None) -> torch.Tensor:
        return _AllToAll.apply(x, list(send_splits), list(recv_splits), self.group)
