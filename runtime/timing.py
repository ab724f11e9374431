"""Wall-clock accumulators that also see the backward pass.

A region [start, end) of the forward graph is bracketed by two identity autograd nodes:
forward time is measured directly; backward time runs from when the gradient reaches the
`end` marker to when it leaves the `start` marker. The CPU autograd engine runs nodes one
at a time, highest sequence number first, so for a chain such as an all-to-all the
backward gap is the region's own backward. On CUDA, times are host-side (the markers
synchronise nothing), so they are lower bounds unless the caller synchronises."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch


def in_backward() -> bool:
    """True while autograd runs a backward pass (e.g. a checkpoint recompute): statistics
    gathered in forward must not be counted twice."""
    return torch._C._current_graph_task_id() != -1


@dataclass
class Acc:
    """Seconds and calls, forward and backward, reset each step."""

    fwd_s: float = 0.0
    bwd_s: float = 0.0
    calls: int = 0
    _t_fwd: float = field(default=0.0, repr=False)
    _t_bwd: list = field(default_factory=list, repr=False)

    def reset(self) -> None:
        self.fwd_s = self.bwd_s = 0.0
        self.calls = 0
        self._t_bwd.clear()


class _Start(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, acc: Acc):
        ctx.acc = acc
        acc._t_fwd = time.perf_counter()  # a recompute's re-run is timed too: the plan prices it
        return x.detach()  # not a view: the pipeline detach_()es stage outputs

    @staticmethod
    def backward(ctx, g):
        acc = ctx.acc
        if acc._t_bwd:
            acc.bwd_s += time.perf_counter() - acc._t_bwd.pop()
        return g, None


class _End(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, acc: Acc):
        ctx.acc = acc
        acc.fwd_s += time.perf_counter() - acc._t_fwd
        if not in_backward():  # a call is the forward's; its re-run under recompute is not another
            acc.calls += 1
        return x.detach()  # not a view: the pipeline detach_()es stage outputs

    @staticmethod
    def backward(ctx, g):
        ctx.acc._t_bwd.append(time.perf_counter())
        return g, None


def start(x: torch.Tensor, acc: Acc) -> torch.Tensor:
    return _Start.apply(x, acc) if x.requires_grad else _plain_start(x, acc)


def end(x: torch.Tensor, acc: Acc) -> torch.Tensor:
    return _End.apply(x, acc) if x.requires_grad else _plain_end(x, acc)


def _plain_start(x, acc):
    acc._t_fwd = time.perf_counter()
    return x


def _plain_end(x, acc):
    acc.fwd_s += time.perf_counter() - acc._t_fwd
    acc.calls += 1
    return x
