"""Expert migration in the cost model: what re-placing experts buys and what it costs.

- predict_imbalance: max/mean rank load of an EP group for a popularity vector, under the
  placement the runtime would hold -- contiguous ids without migration, the planner's
  result (piper_plan.placement: "swap" or "lpt") with it -- beside both lower bounds;
- bytes per expert = expert parameters × bytes per parameter that travel (weights,
  gradients, Adam moments, fp32 master where the dtype keeps one; the ZeRO-sharded parts
  divided over the expert-data-parallel group, as each rank moves only its shard);
- migration time: one batched P2P exchange inside the EP group per migration, carrying
  every MoE layer of the stage; the moved bytes spread over the group's peers like an
  all-to-all (piper_plan.cost.comm.a2a_flat over the EP group's topology levels);
- amortised over the period: seconds per step = migration time / period_steps.

Volume per migration: the experts the planner moves away from the contiguous placement
(the first migration; a drifting distribution moves about as many each period). Seconds
and bytes throughout."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np

from ..errors import SpecError
from ..files import read_text
from ..placement import (
    contiguous_placement, lower_bound, moved_experts, plan_placement, rank_loads, slot_lower_bound,
)
from ..specs.hardware import HardwareSpec
from ..specs.model import ModelSpec
from . import comm


def predict_imbalance(p: np.ndarray, ep: int, placement_planner: Optional[str] = None,
                      max_moves: Optional[int] = None) -> dict:
    """p [E]: share of routed tokens per logical expert (any non-negative unit; normalised
    here); ep: EP group size; placement_planner: None (no migration: expert e on rank
    e // (E/ep)) or "swap" / "lpt". Returns max_over_mean (rank load), lower_bound
    (max(heaviest expert, mean rank) / mean), slot_lower_bound (the same with E/ep slots
    per rank), moved (experts re-placed), arrivals_max (most experts one rank receives)
    and placement (ep lists of expert ids)."""
    p = np.asarray(p, dtype=float)
    if p.ndim != 1 or p.sum() <= 0:
        raise ValueError("p must be a 1-D array of non-negative loads with a positive sum")
    p = p / p.sum()
    E = len(p)
    if ep < 1 or E % ep:
        raise ValueError(f"ep={ep} does not divide {E} experts")
    base = contiguous_placement(E, ep)
    pl = base if placement_planner is None else plan_placement(p, base, placement_planner, max_moves)
    mean = 1.0 / ep
    arrivals = [sum(1 for e in s if e not in set(b)) for s, b in zip(pl, base)]
    return dict(max_over_mean=float(rank_loads(p, pl).max() / mean), lower_bound=lower_bound(p, ep) / mean,
                slot_lower_bound=slot_lower_bound(p, ep) / mean, moved=moved_experts(base, pl),
                arrivals_max=max(arrivals), placement=pl)


def bytes_per_param(act_bytes, grad_bytes, zero, edp, move_grads: bool = True, casts=False) -> np.ndarray:
    """Bytes of one expert parameter that a migration moves from one rank: weight
    (act_bytes: 2 for bf16, 4 for fp32), gradient (grad_bytes; 0 with move_grads=False),
    fp32 master (4, bf16 only), Adam moments (8); ZeRO >= 1 shards master and moments,
    ZeRO 2 also gradients, ZeRO 3 the weights too, over `edp` ranks. bf16 + fp32 grads + ZeRO-0 = 2+4+4+8 = 18;
    brief §4's 16 B/param is bf16 weights and gradients. `casts` (LayoutBatch.unfused: piper-train)
    where the weight is the fp32 parameter itself and bf16 a per-step autocast copy that does not
    move: 4 + 4 + 8 = 16 (runtime/migrate.py expert_fields sends the parameter, its gradient and
    the moments)."""
    act_bytes, grad_bytes = np.asarray(act_bytes, dtype=float), np.asarray(grad_bytes, dtype=float)
    zero, edp = np.asarray(zero), np.maximum(np.asarray(edp, dtype=float), 1.0)
    casts = np.asarray(casts, bool)
    master = np.where((act_bytes < 4) & ~casts, 4.0, 0.0)
    act_bytes = np.where(casts, 4.0, act_bytes)
    opt_share = np.where(zero >= 1, 1.0 / edp, 1.0)
    grad_share = np.where(zero >= 2, 1.0 / edp, 1.0)
    weight_share = np.where(zero >= 3, 1.0 / edp, 1.0)  # ZeRO-3 shards the weights too
    g = grad_bytes * grad_share if move_grads else 0.0
    return act_bytes * weight_share + g + (master + 8.0) * opt_share


def _arrivals(p: Optional[np.ndarray], E: int, ep: int, planner: str, max_moves) -> float:
    """Experts the busiest rank receives a MoE layer (p [layers, E]: their mean, each layer
    re-placed for its own loads)."""
    if ep <= 1:
        return 0
    if p is None:
        return E // ep  # worst case: a rank receives a whole new set of experts
    return float(np.mean([predict_imbalance(r, ep, planner, max_moves)["arrivals_max"] for r in np.atleast_2d(p)]))


def migration_time(m: ModelSpec, hw: HardwareSpec, lay, p: Optional[np.ndarray] = None, planner: str = "lpt",
                   max_moves: Optional[int] = None, move_grads: bool = True) -> np.ndarray:
    """Seconds of one migration per layout of `lay` (a LayoutBatch): the busiest rank
    receives `arrivals` experts of every MoE layer of its stage (from the planner's result
    for popularity p, or all E/ep without p), its 1/etp shard of each, as one exchange spread
    over the EP group, whose members sit LayoutBatch.ep_stride ranks apart."""
    assert m.moe is not None
    E = m.moe.num_experts
    ep = np.asarray(lay.ep)
    uniq, inv = np.unique(ep, return_inverse=True)  # the planner runs once per distinct ep
    arrivals = np.array([_arrivals(p, E, int(e), planner, max_moves) for e in uniq], dtype=float)[inv]
    layers = _stage_moe_layers(m, lay)
    per_param = bytes_per_param(lay.act_bytes, lay.grad_bytes, lay.zero, _owners(m, lay, layers), move_grads,
                                lay.unfused)
    nbytes = arrivals * layers * m.expert_params * per_param / np.asarray(lay.etp, dtype=float)
    # a2a_flat counts a self share of 1/n: scale so that n-1 peers carry `nbytes`
    n = np.maximum(ep, 2)
    move = comm.a2a_flat(hw, nbytes * n / (n - 1), ep, lay.ep_stride, lay.gpus)
    return np.where(ep > 1, move + _agreement(m, hw, lay, layers), 0.0)


def _owners(m: ModelSpec, lay, layers) -> np.ndarray:
    """The ZeRO shard's width as the busiest owner of a stage's expert state sees it: a fused
    stack shards every tensor over the shard's ranks (1/edp each); piper-train's ZeRO gives each
    owner whole parameters (runtime/optim._partition, greedy by size), and a stage's expert
    tensors are its MoE layers' w1, w3 and w2 (w1 and w2 ungated), all one size, so its busiest
    owner holds ceil(n / edp) of the n: width n / ceil(n / edp) (tiny-moe, 9 tensors over 2
    owners: 5 of 9, not half)."""
    shard = lay.zero_shard(lay.edp)
    n = (3.0 if m.moe.gated else 2.0) * layers
    return np.where(lay.unfused, n / np.ceil(n / shard), shard)


def _stage_ranks(lay) -> np.ndarray:
    return (lay.dp * lay.cp * lay.tp).astype(int)  # a stage's ranks, consecutive (layout.rank_coords)


def _stage_moe_layers(m: ModelSpec, lay) -> np.ndarray:
    return np.ceil(m.num_moe_layers / np.asarray(lay.pp, dtype=float))  # the busiest stage's MoE layers


def _agreement(m: ModelSpec, hw: HardwareSpec, lay, layers) -> np.ndarray:
    """Seconds of the small all-reduces a migration agrees by (runtime/migrate.py): its commit
    vote over the stage's ranks, the ready flag and the before/after checksums of every expert
    (2 x layers x E int64) over the EP group. Latency-bound at any size that matters; a CPU pays
    about a millisecond each."""
    E = m.moe.num_experts
    ep = np.asarray(lay.ep)
    over_stage = comm.allreduce(hw, 8.0, _stage_ranks(lay), 1, world=lay.gpus)
    span = comm.group_span(hw, ep, lay.ep_stride, lay.gpus)  # the EP group's, for both of its all-reduces
    over_ep = (comm.allreduce(hw, 8.0, ep, lay.ep_stride, span=span, world=lay.gpus)
               + comm.allreduce(hw, 16.0 * layers * E, ep, lay.ep_stride, span=span, world=lay.gpus))
    return over_stage + over_ep


def load_counting_time(m: ModelSpec, hw: HardwareSpec, lay) -> np.ndarray:
    """Seconds a step of the load tracking migration needs whether or not it moves anything: the
    stage's per-expert token counts (layers x E int64) all-reduced over its ranks after every
    optimizer step (runtime/migrate.py Migrator.gather_counts), 0 without expert parallelism."""
    counts = 8.0 * _stage_moe_layers(m, lay) * m.moe.num_experts
    t = comm.allreduce(hw, counts, _stage_ranks(lay), 1, world=lay.gpus)
    return np.where(np.asarray(lay.ep) > 1, t, 0.0)


def migration_step_time(m: ModelSpec, hw: HardwareSpec, lay, period_steps: int, p: Optional[np.ndarray] = None,
                        planner: str = "lpt", max_moves: Optional[int] = None) -> np.ndarray:
    """Migration seconds per training step: one migration every `period_steps` steps, and the
    load counts every step."""
    return (migration_time(m, hw, lay, p, planner, max_moves) / max(int(period_steps), 1)
            + load_counting_time(m, hw, lay))


def migration_overhead(model: ModelSpec, hw: HardwareSpec, layout, period: int, step_time_s: Optional[float] = None,
                       p: Optional[np.ndarray] = None, planner: str = "lpt", max_moves: Optional[int] = None) -> dict:
    """One layout (piper_plan.layout.Layout): seconds per migration, amortised seconds per
    step (with the load counts every step), and their share of `step_time_s` (the step time
    without migration) if given."""
    from .batch import from_layouts

    lay = from_layouts([layout])
    t = float(migration_time(model, hw, lay, p, planner, max_moves)[0])
    per_step = t / max(int(period), 1) + float(load_counting_time(model, hw, lay)[0])
    return dict(seconds_per_migration=t, seconds_per_step=per_step,
                share=(per_step / (step_time_s + per_step) if step_time_s else None))


def predict_moe_layer_time(model: ModelSpec, hw: HardwareSpec, layout, imb: float) -> float:
    """Forward + backward seconds of one MoE layer's MoE block (router to combine) per
    micro-batch on the straggler rank, whose routed rows are `imb` × the mean."""
    from .batch import from_layouts
    from .compute import moe_phase

    lay = from_layouts([layout])
    ph = moe_phase(model, hw, lay, layout.dtype, np.array([float(imb)]))
    return float((ph.f + ph.b + ph.w)[0])


def metrics_model(path: str | Path) -> Optional[tuple[str, str]]:
    """(model name, model_hash) a piper-train metrics JSONL's summary record names, or None
    (a run that did not finish, or one from before the summary carried them)."""
    for line in reversed(read_text(path).splitlines()):
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):  # not a record (malformed, a huge number, nested too deep)
            continue
        if isinstance(rec, dict) and rec.get("summary") and rec.get("model_hash"):
            return str(rec.get("model", "")), str(rec["model_hash"])
    return None


def load_histogram(path: str | Path, num_experts: Optional[int] = None) -> np.ndarray:
    """Routed tokens per expert [MoE layers, E] summed over the steps of a piper-train
    metrics JSONL (`tokens_per_expert`: {layer: [E counts]} per step record), of its last run:
    piper-train appends each run to the file and ends it with a summary record, and the runs
    before may have trained another plan or model (metrics_model reads the last one's too).
    A run stopped before its summary and resumed from its checkpoint wrote again the steps past
    that checkpoint: a step's record supersedes those of the same and later steps before it."""
    steps: dict = {}  # step -> {layer: counts}, of the run being read
    width = None  # experts a row (the first row's, or num_experts)
    last = -1  # the run's last step number read
    ended = False  # a summary record closed the run the rows hold
    for n, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            raise SpecError(str(path), f"line {n}", "expected one JSON object per line") from None
        if isinstance(rec, dict) and rec.get("summary"):
            ended = True
            continue
        tpe = rec.get("tokens_per_expert") if isinstance(rec, dict) else None
        if not tpe:
            continue
        if ended:  # the first step of a later run
            steps, width, last, ended = {}, None, -1, False
        if not isinstance(tpe, (dict, list)):
            raise SpecError(str(path), f"line {n}: tokens_per_expert", "expected {layer: [counts]} or a list of lists")
        step = rec.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            if step <= last:  # redone by a resumed run (steps rise otherwise: no scan a record)
                for s in [s for s in steps if isinstance(s, int) and s >= step]:
                    del steps[s]
                if not steps:  # every earlier record superseded: a new run, perhaps of another model
                    width = None
            last = step
        else:
            step = ("line", n)  # a record without its step number stands alone
        rows = steps[step] = {}
        items = tpe.items() if isinstance(tpe, dict) else enumerate(tpe if tpe and isinstance(tpe[0], list) else [tpe])
        for layer, counts in items:
            want = num_experts or width
            where = f"line {n}: tokens_per_expert[{layer}]"
            try:
                c = np.asarray(counts, dtype=float)
            except (TypeError, ValueError):
                c = np.array([np.nan])
            if c.ndim != 1 or not len(c) or not np.isfinite(c).all() or (c < 0).any():
                raise SpecError(str(path), where, "expected a list of finite, non-negative token counts")
            if want and len(c) != want:
                raise SpecError(str(path), where, f"expected {want} counts (one an expert), got {len(c)}")
            key = str(layer)
            if not key.isdigit():
                raise SpecError(str(path), where, "expected a layer index as the key")
            width = width or len(c)
            rows[key] = rows[key] + c if key in rows else c
    total: dict[str, np.ndarray] = {}
    for rows in steps.values():
        for key, c in rows.items():
            total[key] = total[key] + c if key in total else c
    if not total:
        raise SpecError(str(path), "tokens_per_expert", "no step record carries tokens_per_expert")
    return np.stack([total[k] for k in sorted(total, key=int)])
