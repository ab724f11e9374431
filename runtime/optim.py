"""Gradient reduction, global-norm clipping and (ZeRO-1 sharded) AdamW.

Every parameter has a replication group: expert weights the stage's expert-data-parallel
group (edp), everything else the stage's data-parallel group (dp). Gradients are summed
over it and divided by dp -- not edp: an expert's local gradient already holds the tokens
of all ep ranks of its EP group, so the edp sum covers all dp ranks.

With tensor parallelism, parameters marked tp-partial (tp.py) are first summed over the
stage's tp group, and a tp-replicated parameter enters the global norm from tp rank 0 only.

ZeRO-1/2 is our own rather than torch's ZeroRedundancyOptimizer: that one shards over one
process group, while expert and dense parameters replicate over different groups, and
its state_dict must be consolidated on one rank, while checkpoints here are written by
torch.distributed.checkpoint keyed per logical expert. Sharding is by whole parameters
(as ZeroRedundancyOptimizer does): the owner keeps the AdamW state (torch.optim.AdamW over
its parameters), steps them and broadcasts the new values to its group. ZeRO-2 also
shards gradients, as DeepSpeed's stage 2 does and as the planner prices it (a reduction per
micro-batch, only the owner's share kept between micro-batches): a hook on each parameter
hands its gradient to a bucket -- the parameters of one chunk, replication group and owner --
and drops it; when a micro-batch's backward has filled the bucket, its gradients go to the owner
as one flat dist.reduce (DeepSpeed buckets likewise), and the owner adds them to its running sums.
A bucket also goes once it holds BUCKET_CAP_BYTES, so the gradients held while the owners'
buckets fill side by side stay bounded (torch DDP's bucket_cap_mb default, 25 MiB).
One call a bucket rather than a tensor: tiny-moe on 4 CPU ranks had ZeRO-2 at 570 ms a step
against ZeRO-0's 324 with one call a tensor. Two kinds wait for the
step: tp-partial gradients (summed over tp first) and the tied embedding (summed over its two
stages first, which run their backwards at different times). Replicas run the same schedule,
so their hooks issue the same reductions in the same order.
Hybrid sharding (Layout.zero_replicas r > 1) draws the owners from each of r consecutive shards
of the group, so every shard holds each parameter's state once. ZeRO-1 still all-reduces over
the whole group; ZeRO-2 reduces each bucket within its shard and, once a step, the owners of the
same parameters in the r shards all-reduce their sums (torch fully_shard's HSDP reduction)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from .mesh import Groups
from .model import EXPERT_TAG
from .tp import is_partial, shard_dim


BUCKET_CAP_BYTES = 25 * 2**20  # ZeRO-2: a bucket is reduced once its gradients reach this


@dataclass
class PInfo:
    name: str
    param: torch.Tensor
    expert: bool
    group: object
    group_ranks: list[int]
    owner: int          # global rank that owns it (ZeRO) and counts it in the norm
    counts_norm: bool   # this rank's copy enters the global norm
    shard: object             # the group its owner broadcasts it over (ZeRO): `group`, or its
    shard_ranks: list[int]    # hybrid-sharding shard of it (Layout.zero_replicas), and its ranks
    copies: object            # hybrid sharding: the ranks owning it in every shard (None: one shard)


def _partition(names_sizes: list[tuple[str, int]], n: int) -> dict[str, int]:
    """Whole-parameter greedy balance by size over n group ranks (deterministic)."""
    load = [0] * n
    out = {}
    for name, size in sorted(names_sizes, key=lambda t: (-t[1], t[0])):
        r = min(range(n), key=lambda i: (load[i], i))
        out[name] = r
        load[r] += size
    return out


class DistOptimizer:
    """AdamW over this rank's parameters (all, or its ZeRO-1 share) plus the collectives
    around it. named: (global name, parameter) of this rank's chunks, deduplicated."""

    def __init__(self, named: list[tuple[str, torch.nn.Parameter]], groups: Groups, dp: int, zero: int,
                 lr: float, weight_decay: float, betas=(0.9, 0.95), eps: float = 1e-8,
                 chunk_of: dict[str, int] | None = None):
        """zero: 0 (replicated AdamW), 1 (sharded state) or 2 (sharded state and gradients).
        chunk_of: parameter name -> the local chunk it belongs to (ZeRO-2 buckets never span
        chunks, whose backwards interleave across micro-batches; default: one chunk)."""
        self.groups, self.dp, self.zero = groups, dp, int(zero)
        self.infos: list[PInfo] = []
        by_group: dict[str, list[tuple[str, torch.Tensor]]] = {"dp": [], "edp": []}
        for name, p in named:
            by_group["edp" if EXPERT_TAG in name else "dp"].append((name, p))
        me = dist.get_rank()
        last_tied_copy = bool(groups.emb_ranks) and me == groups.emb_ranks[1]
        for kind, items in by_group.items():
            g = getattr(groups, kind)
            ranks = dist.get_process_group_ranks(g)
            # hybrid sharding: owners are drawn from this rank's shard of the group, each shard
            # holding every parameter's state once; the first shard's owners count the norm
            shard = getattr(groups, f"{kind}_shard", None) or g
            copies = getattr(groups, f"{kind}_copies", None)
            owners = dist.get_process_group_ranks(shard)
            first_shard = ranks.index(me) < len(owners)
            part = _partition([(n, p.numel()) for n, p in items], len(owners))
            for n, p in sorted(items):
                owner = owners[part[n]]
                counts = owner == me and first_shard and not (last_tied_copy and n == "embed.weight")
                # a tp-replicated parameter is counted by tp rank 0 only (tp.py)
                counts = counts and (kind == "edp" or shard_dim(p) is not None or groups.tp_rank == 0)
                self.infos.append(PInfo(n, p, kind == "edp", g, ranks, owner, counts, shard, owners, copies))
        self.owned = [i for i in self.infos if (i.owner == me or not zero)]
        self.opt = make_adamw([i.param for i in self.owned], lr, weight_decay, betas, eps)
        self._sums: dict[int, torch.Tensor] = {}  # ZeRO-2: id(param) -> the owner's reduced sum so far
        self.hooked = {id(i.param) for i in self.infos if self._per_microbatch(i)}
        # ZeRO-2 buckets: (chunk, expert group?, owner) -> its parameters (in name order, the same
        # on every replica), and the gradients a bucket holds until the backward has filled it
        self._buckets: dict[tuple, list[PInfo]] = {}
        self._pending: dict[tuple, dict[int, torch.Tensor]] = {}
        self._held: dict[tuple, int] = {}  # bytes of gradients each pending bucket holds
        for i in self.infos:
            if id(i.param) in self.hooked:
                key = ((chunk_of or {}).get(i.name, 0), i.expert, i.owner)
                self._buckets.setdefault(key, []).append(i)
                i.param.register_post_accumulate_grad_hook(self._reduce_hook(key))

    def _per_microbatch(self, i: PInfo) -> bool:
        """ZeRO-2 reduces this gradient as each micro-batch's backward accumulates it (module
        docstring); not a tp-partial one, nor the tied embedding's, nor one without replicas."""
        tied = self.groups.emb is not None and i.name == "embed.weight"
        return self.zero >= 2 and len(i.group_ranks) > 1 and not is_partial(i.param) and not tied

    def _reduce_hook(self, key: tuple):
        def hook(p: torch.Tensor) -> None:
            pend = self._pending.setdefault(key, {})
            if id(p) in pend:  # a backward left the bucket short (a parameter it did not reach)
                self._flush(key)
                pend = self._pending.setdefault(key, {})
            pend[id(p)] = g = p.grad
            p.grad = None  # the next micro-batch accumulates afresh
            self._held[key] = self._held.get(key, 0) + g.numel() * g.element_size()
            if len(pend) == len(self._buckets[key]) or self._held[key] >= BUCKET_CAP_BYTES:
                self._flush(key)
        return hook

    def _flush(self, key: tuple) -> None:
        """Reduce a bucket's held gradients to its owner as one flat buffer; the owner adds
        them to its sums. Replicas fill and flush their buckets in the same order."""
        pend = self._pending.pop(key, None)
        self._held.pop(key, None)
        if not pend:
            return
        members = [i for i in self._buckets[key] if id(i.param) in pend]
        grads = [pend[id(i.param)] for i in members]
        flat = _flatten_dense_tensors(grads)
        dist.reduce(flat, dst=key[2], group=members[0].shard)  # the owner's shard (hybrid: copies later)
        if dist.get_rank() == key[2]:
            for i, g in zip(members, _unflatten_dense_tensors(flat, grads)):
                s = self._sums.get(id(i.param))
                self._sums[id(i.param)] = g if s is None else s.add_(g)

    # ---- gradients -----------------------------------------------------------------------
    def zero_grad(self) -> None:
        for i in self.infos:
            i.param.grad = None
        self._sums.clear()
        self._pending.clear()
        self._held.clear()

    def reduce_grads(self) -> None:
        """Sum the tied embedding's two copies, then sum over replication groups (÷ dp);
        with ZeRO-2 only each gradient's owner keeps the sum."""
        me = dist.get_rank()
        for key in sorted(self._pending):  # buckets some backward left short
            self._flush(key)
        for i in self.infos:
            if id(i.param) in self.hooked:  # reduced micro-batch by micro-batch (_reduce_hook)
                if i.param.grad is not None:  # accumulated outside autograd: a hook never saw it
                    raise RuntimeError(f"{i.name}: a ZeRO-2 gradient was accumulated without its reduction hook")
                i.param.grad = self._sums.pop(id(i.param), None) if i.owner == me else None
                if i.owner == me and i.param.grad is None:  # no micro-batch reached it
                    i.param.grad = torch.zeros_like(i.param)
            elif i.param.grad is None:
                i.param.grad = torch.zeros_like(i.param)
        partial = [i.param.grad for i in self.infos if is_partial(i.param)]
        if partial:  # tp-replicated parameters with per-rank partial gradients (tp.py)
            _allreduce(partial, self.groups.tp)
        if self.groups.emb is not None:  # before the dp sum: ZeRO-2 owners may differ per stage
            emb = [i for i in self.infos if i.name == "embed.weight"]
            _allreduce([emb[0].param.grad], self.groups.emb)
        for expert in (False, True):
            infos = [i for i in self.infos if i.expert == expert]
            if infos and len(infos[0].group_ranks) > 1:
                if self.zero >= 2:
                    left = [i for i in infos if id(i.param) not in self.hooked]
                    for owner in infos[0].shard_ranks:
                        mine = [i for i in left if i.owner == owner]
                        if mine:
                            _reduce([i.param.grad for i in mine], owner, infos[0].shard)
                    for i in infos:
                        if i.owner != me:
                            i.param.grad = None
                    if infos[0].copies is not None:  # hybrid: each shard's owner holds its shard's sum;
                        # the owners of the same parameters in every shard add theirs (HSDP's all-reduce)
                        mine = [i.param.grad for i in infos if i.owner == me]
                        if mine:
                            _allreduce(mine, infos[0].copies)
                else:
                    _allreduce([i.param.grad for i in infos], infos[0].group)
            if self.dp > 1:
                for i in infos:
                    if i.param.grad is not None:
                        i.param.grad.div_(self.dp)

    def clip(self, max_norm: float) -> float:
        """Global L2 norm over all ranks and stages (each parameter counted once), clipped
        in place like torch.nn.utils.clip_grad_norm_. Returns the norm before clipping."""
        sq = sum_squares([i.param.grad for i in self.infos if i.counts_norm], self.infos[0].param.device)
        dist.all_reduce(sq)
        total = sq.sqrt().to(torch.float32)
        if max_norm and max_norm > 0:
            torch.nn.utils.clip_grads_with_norm_([i.param for i in self.infos if i.param.grad is not None],
                                                 max_norm, total)
        return float(total)

    # ---- update ----------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> None:
        self.opt.step()
        if not self.zero:
            return
        for expert in (False, True):
            infos = [i for i in self.infos if i.expert == expert]
            if not infos or len(infos[0].shard_ranks) == 1:  # one owner in the shard: nothing to send
                continue
            for owner in infos[0].shard_ranks:
                mine = [i.param for i in infos if i.owner == owner]
                if not mine:
                    continue
                flat = _flatten_dense_tensors([p.data for p in mine])
                dist.broadcast(flat, src=owner, group=infos[0].shard)
                copy_back([p.data for p in mine], flat)

    def state_of(self, p: torch.Tensor) -> dict:
        """AdamW state of an owned parameter (created as zeros at step 0 when absent)."""
        st = self.opt.state[p]
        if not st:
            st["step"] = torch.tensor(0.0)
            st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return st


# ---- per-tensor host work, shared with piper-plan calibrate's optimizer probe ------------
def make_adamw(params: list[torch.Tensor], lr: float, weight_decay: float, betas=(0.9, 0.95),
               eps: float = 1e-8) -> torch.optim.AdamW:
    """torch's single-tensor AdamW (foreach=False: one fused-per-tensor kernel sequence, no
    multi-tensor copies), decay on matrices only."""
    return torch.optim.AdamW([{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
                              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
                             lr=lr, betas=betas, eps=eps, foreach=False)


def sum_squares(grads: list[torch.Tensor], device) -> torch.Tensor:
    """Σ‖g‖² in fp64: per-tensor norm in the gradient's dtype (one read, as torch's
    clip_grad_norm_), squared in fp64 -- 2.7x less CPU than an fp64 copy of each gradient."""
    sq = torch.zeros((), dtype=torch.float64, device=device)
    for g in grads:
        sq += torch.linalg.vector_norm(g.detach()).double().square()
    return sq


def copy_back(tensors: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy a collective's flat buffer back into the tensors it was packed from."""
    for t, v in zip(tensors, _unflatten_dense_tensors(flat, tensors)):
        t.copy_(v)


def _reduce(tensors: list[torch.Tensor], dst: int, group) -> None:
    flat = _flatten_dense_tensors(tensors)
    dist.reduce(flat, dst=dst, group=group)
    if dist.get_rank() == dst:
        copy_back(tensors, flat)


def _allreduce(tensors: list[torch.Tensor], group) -> None:
    flat = _flatten_dense_tensors(tensors)
    dist.all_reduce(flat, group=group)
    copy_back(tensors, flat)
