"""Tensor parallelism inside a pipeline stage (Megatron-LM, arXiv 1909.08053 and 2205.05198).

The tp ranks of a stage (plan.rank_map: tp fastest) hold column shards of QKV / gate-up
projections and the vocabulary, row shards of the attention-output and down projections.
Parameters stay plain local tensors -- the optimizer, ZeRO and the gradient buckets work
on flat local buffers -- and the communication is explicit autograd functions over the tp
group (c10d all_reduce / all_gather_single / reduce_scatter_single, which gloo and
NCCL both have). torch.distributed.tensor.parallel (DTensor) was tried first: its
Colwise/Rowwise/SequenceParallel styles run on gloo, but they turn parameters and
gradients into DTensors, which the runtime's flat gradient reduction, global-norm clip and
ZeRO broadcast reject ("aten.cat got mixed torch.Tensor and DTensor", "c10d.allreduce_
has no sharding strategy"), and the MoE token split and GQA with tp > kv heads are no
ParallelStyle. DTensor is used where it helps: checkpoints wrap each shard as a DTensor
(`global_view`) so DCP writes the logical full tensor under its global name.

Conventions (no sequence parallelism): activations between blocks are replicated over tp
and carry their full gradient on every rank; a region starts with `enter` (identity,
all-reduce in backward: Megatron's f) and ends with `exit` (all-reduce: g). With sequence
parallelism the residual stream is split along the sequence (dim 1 of [B, S, d]); `enter`
all-gathers it (backward: reduce-scatter) and `exit` reduce-scatters (backward:
all-gather). A replicated parameter used inside a region (MLA down-projections and their
norms, GQA key/value weights when tp > kv heads, the router) or on a sequence shard (norms
under SP) gets a partial gradient, marked `tp_partial` and summed over tp by the optimizer;
a sharded parameter is marked with its shard dim (`tp_dim`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist


@dataclass
class TP:
    """The tp group of this rank's stage (size 1: no tensor parallelism)."""

    size: int = 1
    rank: int = 0
    group: object = None
    sp: bool = False            # sequence parallelism (plan.layout.sp)
    mesh: object = None         # 1-D DeviceMesh over `group` (checkpoints), made lazily

    def shard(self, n: int, what: str) -> int:
        if n % self.size:
            raise ValueError(f"{what} = {n} is not divisible by tp = {self.size}")
        return n // self.size

    # ---- region boundaries ----------------------------------------------------------------
    def enter(self, x: torch.Tensor) -> torch.Tensor:
        """Into a tensor-parallel region: [B, S(/tp), d] -> replicated [B, S, d]."""
        if self.size == 1:
            return x
        return _GatherSeq.apply(x, self) if self.sp else _CopyIn.apply(x, self)

    def exit(self, x: torch.Tensor) -> torch.Tensor:
        """Out of it: partial sums [B, S, d] -> the residual stream's layout."""
        if self.size == 1:
            return x
        return _ReduceScatterSeq.apply(x, self) if self.sp else _ReduceOut.apply(x, self)

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        """All-reduce sum, identity backward (the sum is used replicated downstream)."""
        return x if self.size == 1 else _ReduceOut.apply(x, self)

    def split_rows(self, x: torch.Tensor) -> torch.Tensor:
        """Replicated [N, ...] -> this rank's N/tp rows (backward: all-gather)."""
        return x if self.size == 1 else _SplitRows.apply(x, self)

    def gather_rows(self, x: torch.Tensor) -> torch.Tensor:
        """[N/tp, ...] per rank -> replicated [N, ...] (backward: this rank's rows)."""
        return x if self.size == 1 else _GatherRows.apply(x, self)

    def device_mesh(self):
        if self.mesh is None:
            from torch.distributed.device_mesh import DeviceMesh

            dev = "cuda" if torch.cuda.is_available() and dist.get_backend() == "nccl" else "cpu"
            self.mesh = DeviceMesh.from_group(self.group, dev, mesh_dim_names=("tp",))
        return self.mesh


# ---- raw collectives on dim 0 -------------------------------------------------------------
def _all_reduce(x: torch.Tensor, tp: TP) -> torch.Tensor:
    x = x.contiguous().clone()
    dist.all_reduce(x, group=tp.group)
    return x


def _all_gather0(x: torch.Tensor, tp: TP) -> torch.Tensor:
    x = x.contiguous()
    out = x.new_empty((x.shape[0] * tp.size, *x.shape[1:]))
    dist.all_gather_single(out, x, group=tp.group)
    return out


def _reduce_scatter0(x: torch.Tensor, tp: TP) -> torch.Tensor:
    x = x.contiguous()
    out = x.new_empty((x.shape[0] // tp.size, *x.shape[1:]))
    dist.reduce_scatter_single(out, x, group=tp.group)
    return out


def _rows(x: torch.Tensor, tp: TP) -> torch.Tensor:
    n = x.shape[0] // tp.size
    return x.narrow(0, tp.rank * n, n).contiguous()


# The sequence is dim 1 of [B, S, d]; collectives work on dim 0, so S moves to the front
# (a copy; B is the micro-batch size, 1 in most plans, where the move costs nothing).
def _seq_gather(x, tp):
    return _all_gather0(x.transpose(0, 1), tp).transpose(0, 1).contiguous()


def _seq_reduce_scatter(x, tp):
    return _reduce_scatter0(x.transpose(0, 1), tp).transpose(0, 1).contiguous()


def _conjugate(name: str, fwd, bwd) -> type:
    """An autograd Function whose forward is fwd(x, tp) and whose backward is bwd(g, tp):
    each tensor-parallel collective below is paired with its conjugate."""
    def forward(ctx, x, tp):
        ctx.tp = tp
        return fwd(x, tp)

    def backward(ctx, g):
        return bwd(g, ctx.tp), None
    return type(name, (torch.autograd.Function,), {"forward": staticmethod(forward), "backward": staticmethod(backward)})


# identity forward / all-reduce backward (the input is used replicated), and the converse
_CopyIn = _conjugate("_CopyIn", lambda x, tp: x.view_as(x), _all_reduce)
_ReduceOut = _conjugate("_ReduceOut", _all_reduce, lambda g, tp: g)
_GatherSeq = _conjugate("_GatherSeq", _seq_gather, _seq_reduce_scatter)
_ReduceScatterSeq = _conjugate("_ReduceScatterSeq", _seq_reduce_scatter, _seq_gather)
_SplitRows = _conjugate("_SplitRows", _rows, _all_gather0)
_GatherRows = _conjugate("_GatherRows", _all_gather0, _rows)


# ---- parameters ---------------------------------------------------------------------------
def mark_shard(p: torch.nn.Parameter, dim: int, tp: TP) -> None:
    """p is this rank's slice `tp.rank` of a logical tensor split evenly along `dim`."""
    if tp.size > 1:
        p.tp_dim, p.tp_ctx = dim, tp


def mark_partial(p: Optional[torch.nn.Parameter], tp: TP, when: bool = True) -> None:
    """p is replicated over tp, each rank's gradient a partial sum."""
    if p is not None and tp.size > 1 and when:
        p.tp_partial = True


def shard_dim(p: torch.Tensor) -> Optional[int]:
    return getattr(p, "tp_dim", None)


def is_partial(p: torch.Tensor) -> bool:
    return getattr(p, "tp_partial", False)


def logical_shape(p: torch.Tensor) -> tuple[int, ...]:
    d = shard_dim(p)
    if d is None:
        return tuple(p.shape)
    s = list(p.shape)
    s[d] *= p.tp_ctx.size
    return tuple(s)


def local_slice(full: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """This rank's part of the logical tensor `full` of parameter p."""
    d = shard_dim(p)
    if d is None:
        return full
    n = p.shape[d]
    return full.narrow(d, p.tp_ctx.rank * n, n)


def global_view(p: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """`t` (p's data or an optimizer state of p's shape) as a DTensor of the logical
    tensor when p is tp-sharded, so DCP saves and loads it by its global name."""
    d = shard_dim(p)
    if d is None:
        return t
    from torch.distributed.tensor import DTensor, Shard

    shape = logical_shape(p)
    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(t, p.tp_ctx.device_mesh(), [Shard(d)], run_check=False, shape=shape, stride=stride)


# ---- vocabulary-parallel cross-entropy -------------------------------------------------------
def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, tp: TP) -> torch.Tensor:
    """Mean cross-entropy of logits [N, V/tp] (this rank's vocabulary slice) against
    targets [N] (global ids), without gathering the logits: three all-reduces of N values
    (max, Σexp, target logit) replace an all-gather of N·V (Megatron's
    _VocabParallelCrossEntropy, here through autograd). Identical on every tp rank."""
    logits = logits.float()
    n_local = logits.shape[-1]
    lo = tp.rank * n_local
    with torch.no_grad():
        m = logits.max(-1).values
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=tp.group)
    z = logits - m.unsqueeze(-1)
    local = targets - lo
    inside = (local >= 0) & (local < n_local)
    picked = z.gather(-1, local.clamp(0, n_local - 1).unsqueeze(-1)).squeeze(-1) * inside
    sumexp = tp.reduce(z.exp().sum(-1))
    target_logit = tp.reduce(picked)
    return (sumexp.log() - target_logit).mean()
