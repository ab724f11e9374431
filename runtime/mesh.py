"""Process groups of one plan: pp, dp, tp, stage, ep, edp (and the tied-embedding pair),
built from the plan's rank_map -- the planner's placement (packed or spread) is the
authority -- every group with the collective timeout, and wrapped as a DeviceMesh
(pp, edp, ep) for code that wants mesh dimensions.

Degree conventions are the planner's (piper_plan/layout.py): dp is the attention
data-parallel degree, tp the tensor-parallel degree (tp fastest in the rank order), EP is
folded over the dp·tp ranks of a stage, edp = dp·tp / ep. `stage` is all dp·tp ranks of
one pipeline stage; `dp` joins the ranks of a stage with the same tp index."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist

from piper_plan.plan import GROUPS, Plan


@dataclass
class Groups:
    rank: int
    world: int
    pp_rank: int
    dp_rank: int
    ep_rank: int
    edp_rank: int
    pp: object
    dp: object
    ep: object
    edp: object
    emb: Optional[object]          # {first-chunk rank, last-chunk rank} when they differ (tied)
    emb_ranks: list[int]
    mesh: object = None            # DeviceMesh (pp, edp, ep) or None where it does not fit
    tp_rank: int = 0
    tp_size: int = 1
    tp: object = None              # the stage's ranks with this rank's dp index, by tp index
    stage: object = None           # every rank of this pipeline stage (dp·tp ranks)
    # hybrid sharding (Layout.zero_replicas r > 1): this rank's ZeRO shard of its dp and edp group,
    # the group's ranks cut into r consecutive blocks (the dp / edp groups themselves where r = 1),
    # and its copies: the r ranks at this rank's place in each shard, which own the same parameters
    # (ZeRO-2 all-reduces the owners' sums over them; None where r = 1)
    dp_shard: object = None
    edp_shard: object = None
    dp_copies: object = None
    edp_copies: object = None


def _enumerate(plan: Plan, key, order) -> list[list[int]]:
    """Partition ranks by `key(coord)`, each group sorted by `order(coord)`."""
    buckets: dict = {}
    for c in plan.rank_map:
        buckets.setdefault(key(c), []).append(c)
    return [[c.rank for c in sorted(v, key=order)] for _, v in sorted(buckets.items())]


def _subgroup(lists: list[list[int]], timeout: timedelta):
    if len(lists[0]) == dist.get_world_size():
        return dist.new_group(lists[0], timeout=timeout)
    g, _ = dist.new_subgroups_by_enumeration(lists, timeout=timeout)
    return g


def group_lists(plan: Plan) -> dict[str, list[list[int]]]:
    """Rank lists of every group kind (pure function of the plan; tests use it)."""
    out = {name: _enumerate(plan, lambda c, by=by: tuple(getattr(c, k) for k in by),
                            lambda c, own=own: getattr(c, own)) for name, by, own in GROUPS}
    out["stage"] = _enumerate(plan, lambda c: c.pp, lambda c: c.rank)
    r = plan.layout.zero_replicas
    if r > 1:  # each group's ranks in r consecutive blocks: the shards the planner prices (neighbours)
        for kind in ("dp", "edp"):
            out[f"{kind}_shard"] = [g[k * len(g) // r:(k + 1) * len(g) // r] for g in out[kind] for k in range(r)]
            if plan.layout.zero >= 2:  # ZeRO-1 all-reduces over the whole group: no copies to reconcile
                out[f"{kind}_copies"] = [g[k::len(g) // r] for g in out[kind] for k in range(len(g) // r)]
    first, last = plan.chunk_stage_rank(0), plan.chunk_stage_rank(plan.layout.stages - 1)
    if plan.model.tied_embeddings and first != last:
        out["emb"] = [[pp_list[first], pp_list[last]] for pp_list in out["pp"]]
    return out


def build_groups(plan: Plan, timeout_s: float) -> Groups:
    """Create every group (all ranks call this in the same order)."""
    to = timedelta(seconds=timeout_s)
    me = dist.get_rank()
    c = plan.rank_map[me]
    lists = group_lists(plan)
    made = {k: _subgroup(v, to) for k, v in lists.items()}
    emb_ranks = next((v for v in lists.get("emb", []) if me in v), [])
    g = Groups(rank=me, world=dist.get_world_size(), pp_rank=c.pp, dp_rank=c.dp, ep_rank=c.ep,
               edp_rank=c.edp, pp=made["pp"], dp=made["dp"], ep=made["ep"], edp=made["edp"],
               emb=made.get("emb"), emb_ranks=emb_ranks, tp_rank=c.tp, tp_size=plan.layout.tp,
               tp=made["tp"], stage=made["stage"], dp_shard=made.get("dp_shard", made["dp"]),
               edp_shard=made.get("edp_shard", made["edp"]), dp_copies=made.get("dp_copies"),
               edp_copies=made.get("edp_copies"))
    g.mesh = _device_mesh(plan, g)
    return g


def _device_mesh(plan: Plan, g: Groups):
    """DeviceMesh over the groups just made (no new communicators): dims (pp, edp, ep)."""
    from torch.distributed.device_mesh import DeviceMesh

    lay = plan.layout
    mesh = torch.empty(lay.pp, lay.edp, lay.ep, dtype=torch.int)
    for c in plan.rank_map:
        mesh[c.pp, c.edp, c.ep] = c.rank
    dev = "cuda" if torch.cuda.is_available() and dist.get_backend() == "nccl" else "cpu"
    return DeviceMesh.from_group([g.pp, g.edp, g.ep], dev, mesh=mesh, mesh_dim_names=("pp", "edp", "ep"))


def tp_of(plan: Plan, groups: Optional[Groups]):
    """This rank's tensor-parallel context (tp.TP; size 1 without groups or tp)."""
    from .tp import TP

    lay = plan.layout
    if groups is None or lay.tp == 1:
        return TP()
    return TP(size=lay.tp, rank=groups.tp_rank, group=groups.tp, sp=lay.sp)
