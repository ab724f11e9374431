"""Routed experts of one rank, computed as grouped GEMMs over token-sorted rows.

Weights are stacked per local slot: w1 [n, d, f] (gate, or up when not gated), w3 [n, d, f]
(up, gated only), w2 [n, f, d] (down). Slot s holds the logical expert the layer's
ExpertPlacement assigns to it. Gate and up stay separate GEMMs: fusing them into one
[n, d, 2f] GEMM is no faster on CPU and leaves SwiGLU on strided halves, measured 2.4x
slower than on contiguous ones (4,096 tokens x 2, f 512, bf16, one thread). torch.nn.functional.grouped_mm is used when its
constraints hold (fp32/bf16, 16-byte aligned row strides; brief §8); otherwise, or when
the backend rejects it, a per-expert loop computes the same thing."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

_GROUPED_OK: dict[tuple, bool] = {}  # (device type, dtype) -> grouped_mm usable (probed once)


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the incoming gradient dense: grouped_mm's backward
    rejects expanded (stride-0) gradients such as the one of `y.sum()`."""

    @staticmethod
    def forward(ctx, x):
        return x.detach()  # not a view: the pipeline detach_()es stage outputs

    @staticmethod
    def backward(ctx, g):
        return g.contiguous()


def _pad_index(counts: list[int], multiple: int) -> tuple[torch.Tensor, list[int], int]:
    """Where each row goes when every slot's rows are padded with zero rows to a multiple of
    `multiple`: (index into the padded rows, padded counts, padded total). A CPU GEMM library
    builds a kernel the first time it meets a shape (~0.6 ms CPU for bf16, measured by
    benchmarks/closed_loop.py) and routed row counts are new shapes for dozens of steps;
    padding leaves 1/multiple as many. Zero rows change neither the real rows' outputs nor
    the weight gradients."""
    padded = [-(-c // multiple) * multiple for c in counts]
    pos, start = [], 0
    for c, p in zip(counts, padded):
        pos.append(torch.arange(start, start + c))
        start += p
    idx = torch.cat(pos) if pos else torch.zeros(0, dtype=torch.long)
    return idx, padded, start


def _aligned(*ts: torch.Tensor) -> bool:
    return all(t.dtype in (torch.float32, torch.bfloat16) and (t.shape[-1] * t.element_size()) % 16 == 0
               for t in ts)


def _probe(device: torch.device, dt: torch.dtype) -> bool:
    """Whether grouped_mm runs forward and backward for this device type and dtype (cached;
    e.g. CUDA kernels exist for bf16 on recent GPUs only)."""
    key = (device.type, dt)
    if key not in _GROUPED_OK:
        # the first call can come inside a checkpointed forward (full recompute): identity hooks
        # keep the probe's tensors out of the checkpoint's saved set, which its recomputation,
        # finding the answer cached, would not save again (a count mismatch at backward); and
        # under no_grad the probe's backward would fail and wrongly cache False
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            try:
                a = torch.randn(8, 16, device=device, dtype=dt, requires_grad=True)
                b = torch.randn(2, 16, 16, device=device, dtype=dt, requires_grad=True)
                offs = torch.tensor([3, 8], device=device, dtype=torch.int32)
                F.grouped_mm(a, b, offs=offs).square().sum().backward()
                _GROUPED_OK[key] = True
            except (RuntimeError, NotImplementedError, AttributeError):
                _GROUPED_OK[key] = False
    return _GROUPED_OK[key]


def grouped_matmul(x: torch.Tensor, w: torch.Tensor, counts: list[int], offs: torch.Tensor,
                   use_grouped: bool) -> torch.Tensor:
    """rows of x (grouped by slot, counts[s] rows for slot s) @ w[s]  ->  [M, w.shape[-1]]."""
    if use_grouped:
        return F.grouped_mm(x, w, offs=offs)
    outs, a = [], 0
    for s, c in enumerate(counts):
        outs.append(x[a:a + c] @ w[s])
        a += c
    return torch.cat(outs) if outs else x.new_zeros(0, w.shape[-1])


class GroupedExperts(nn.Module):
    """`n_local` routed experts (SwiGLU when gated, else GELU 2-matrix)."""

    def __init__(self, n_local: int, d: int, f: int, gated: bool = True, grouped: bool | None = None,
                 row_multiple: int = 1):
        super().__init__()
        self.row_multiple = row_multiple  # pad each slot's rows to a multiple of this (1: none)
        self.n_local, self.d, self.f, self.gated = n_local, d, f, gated
        self.w1 = nn.Parameter(torch.empty(n_local, d, f))
        self.w3 = nn.Parameter(torch.empty(n_local, d, f)) if gated else None
        self.w2 = nn.Parameter(torch.empty(n_local, f, d))
        self.grouped = grouped  # None: decide per call; False: always loop

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """x [M, d] sorted by slot, counts [n_local] rows per slot (sum M) -> [M, d] in x.dtype."""
        w1, w2 = self.w1.to(x.dtype), self.w2.to(x.dtype)
        w3 = self.w3.to(x.dtype) if self.gated else None
        use = (self.grouped is not False and _aligned(x, w1, w2) and _probe(x.device, x.dtype))
        idx = None
        if self.row_multiple > 1 and x.shape[0]:
            idx, padded, total = _pad_index(counts.tolist(), self.row_multiple)
            idx = idx.to(x.device)
            x = x.new_zeros(total, x.shape[1]).index_copy(0, idx, x)
            counts = torch.tensor(padded, dtype=counts.dtype, device=counts.device)
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        cl = [] if use else counts.tolist()
        h = grouped_matmul(x, w1, cl, offs, use)
        h = F.silu(h) * grouped_matmul(x, w3, cl, offs, use) if self.gated else F.gelu(h)
        y = grouped_matmul(h, w2, cl, offs, use)
        if idx is not None:
            y = y.index_select(0, idx)
        return _ContiguousGrad.apply(y)
