"""plan.json: a versioned, self-contained description of one training layout.

It embeds the model and hardware specs (with a hash of each), the degrees, the rank map,
the layer -> stage partition, micro-batching, routing assumption and predicted metrics,
so the runtime needs nothing else. Writes are atomic (files.atomic_write_text)."""
from __future__ import annotations

import hashlib
import json
import os
import math
from typing import Annotated, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from . import __version__
from .errors import LayoutError, SpecError, from_validation
from .files import atomic_write_text, parse_json, read_text
from .layout import Layout, RankCoord, check_for, cp_comm_refusal
from .specs.hardware import HardwareSpec
from .specs.model import ModelSpec

SCHEMA_VERSION = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# Zipf exponents past this describe no router: at s = 10 the hottest expert already takes 99.9 % of the
# tokens (1/zeta(10)), so a larger s prices the same collapse onto one expert, and from s ~ 64 a model's
# 65,536 experts (MAX_EXPERTS) raised to s overflow float64 (RuntimeWarnings, then NaN). Measured routing
# is s ~ 0-2.
MAX_ZIPF_S = 10.0


class Routing(_Strict):
    """Assumed token -> expert distribution: uniform, Zipf(s) over experts, or a measured
    histogram (tokens per expert, one list per MoE layer or one for all)."""

    distribution: Literal["uniform", "zipf", "histogram"] = "uniform"
    zipf_s: float = Field(1.0, ge=0, le=MAX_ZIPF_S)
    histogram: Optional[list[list[Annotated[float, Field(ge=0)]]]] = None

    @model_validator(mode="after")
    def _histogram(self):
        if self.distribution == "histogram" and not self.histogram:
            raise ValueError("distribution histogram needs the histogram (tokens per expert, a list per MoE layer)")
        if self.histogram and len({len(h) for h in self.histogram}) != 1:
            raise ValueError("every histogram row needs one count per expert (the rows differ in length)")
        return self


class Migration(_Strict):
    enabled: bool = False
    period_steps: int = Field(50, ge=1, description="re-plan placement every K optimizer steps")
    threshold: float = Field(1.1, ge=1.0, description="... or when max/mean rank load passes this")
    planner: Literal["swap", "lpt"] = "lpt"
    window: int = Field(20, ge=1, description="moving-average window of per-expert loads, steps")
    max_moves: Optional[int] = Field(None, ge=0, description="cap on experts moved per migration")


# the parts of a step cost.estimate reports in time_breakdown_s (offload only where activations are
# offloaded), and "total": the step time they share
TIME_PARTS = ("compute", "host", "a2a", "tp_comm", "cp_comm", "p2p", "bubble", "dp_comm", "optimizer", "migration",
              "offload", "total")


class Predicted(_Strict):
    step_time_s: float = Field(gt=0)
    tokens_per_s: float = Field(gt=0)
    tflops_per_gpu: float = Field(gt=0)
    hw_tflops_per_gpu: float = Field(gt=0, description="model FLOPs plus recomputed ones, per GPU")
    mfu: float = Field(gt=0, description="tflops_per_gpu over the peak of layout.dtype (FP8 GEMMs may pass 1)")
    peak_memory_gib: float = Field(ge=0)
    fits: bool
    a2a_time_s: float = Field(0.0, ge=0)
    # absent from plans written before they were recorded (None: not known, not 1)
    imbalance: Optional[float] = Field(None, ge=1.0, description="expected max/mean routed rows per rank of an EP "
                                       "group in one micro-batch (what the step time is priced with)")
    ep_load_step: Optional[float] = Field(None, ge=1.0, description="expected max/mean routed rows per rank of an EP "
                                          "group summed over one optimizer step: what piper-train measures as "
                                          "ep_max_over_mean")
    memory_gib_per_stage: list[dict] = Field(default_factory=list)
    time_breakdown_s: dict[str, float] = Field(default_factory=dict)
    # absent from plans written before it was recorded: piper-train refuses such a plan (priced_refusal)
    priced_for: Optional[str] = Field(None, description="priced_hash of the plan these figures were priced for: "
                                      "piper-train refuses a plan whose layout, partition, rank map, routing or "
                                      "migration was edited since, as its comparison would not hold")


class Plan(_Strict):
    schema_version: int = SCHEMA_VERSION
    created_by: str = f"piper-plan {__version__}"
    model: ModelSpec
    model_hash: str
    hardware: HardwareSpec
    hardware_hash: str
    layout: Layout
    partition: list[list[int]] = Field(..., description="model chunk -> layer indices (pp*vpp chunks)")
    rank_map: list[RankCoord]
    routing: Routing = Routing()
    migration: Migration = Migration()
    predicted: Optional[Predicted] = None

    def chunk_stage_rank(self, chunk: int) -> int:
        """Pipeline rank that runs model chunk `chunk`: looped for interleaved/1f1b/gpipe
        (chunk c on rank c % pp), V-shaped for zbv/dualpipev (0..pp-1 then back)."""
        pp = self.layout.pp
        if self.layout.schedule in ("zbv", "dualpipev"):
            return chunk if chunk < pp else 2 * pp - 1 - chunk
        return chunk % pp


def spec_hash(spec: BaseModel, exclude: set[str] | None = None) -> str:
    """sha256 of the canonical JSON of a spec, less the fields `exclude` names (first 16 hex digits)."""
    blob = json.dumps(spec.model_dump(mode="json", exclude=exclude), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def priced_hash(plan: Plan) -> str:
    """spec_hash of what a plan's `predicted` prices: the plan without it (and without who wrote
    it), the specs by their hashes."""
    return spec_hash(plan, {"predicted", "created_by", "schema_version", "model", "hardware"})


def priced_refusal(plan: Plan) -> str:
    """Why `plan.predicted` does not price this plan ("" where it does, or where it has none): its
    layout, partition, rank map, routing or migration changed since, or the record of what it priced
    was deleted (which had let an edited plan through, compared with the old plan's figures)."""
    p = plan.predicted
    if p is None or p.priced_for == priced_hash(plan):
        return ""
    if p.priced_for is None:
        return ("predicted.priced_for: missing, so nothing says the figures price this plan (deleted with an "
                "edit?); price it again with piper-plan estimate")
    return ("predicted.priced_for: the figures were priced for another plan (its layout, partition, rank_map, "
            "routing or migration edited since?); price this one again with piper-plan estimate")


def write_plan(plan: Plan, path: str | os.PathLike, what: str = "-o") -> None:
    atomic_write_text(path, plan.model_dump_json(indent=2) + "\n", what)


def read_plan(path: str | os.PathLike) -> Plan:
    """Load and validate plan.json; any problem is a one-line SpecError."""
    src = str(path)
    text = read_text(path)
    data = parse_json(text, src)  # for the checks below, which say more than a schema error would
    if not isinstance(data, dict):
        raise SpecError(src, "<root>", "expected a JSON object")
    ver = data.get("schema_version")
    if ver != SCHEMA_VERSION:
        raise SpecError(src, "schema_version", f"expected {SCHEMA_VERSION}, got {ver!r}")
    try:  # strict, in JSON mode (arrays are tuples there): "2" or 2.0 for a degree is an edit's slip, not a 2
        plan = Plan.model_validate_json(text, strict=True)
    except ValidationError as e:
        raise from_validation(src, e) from None
    plan = _cp_comm_of_old(plan, data)
    if spec_hash(plan.model) != plan.model_hash:
        raise SpecError(src, "model_hash", "does not match the embedded model spec (edited by hand?)")
    if spec_hash(plan.hardware) != plan.hardware_hash:
        raise SpecError(src, "hardware_hash", "does not match the embedded hardware spec (edited by hand?)")
    if len(plan.rank_map) != plan.layout.gpus:
        raise SpecError(src, "rank_map", f"expected {plan.layout.gpus} entries, got {len(plan.rank_map)}")
    if len(plan.partition) != plan.layout.stages:
        raise SpecError(src, "partition", f"expected {plan.layout.stages} chunks, got {len(plan.partition)}")
    check_consistent(plan, src)
    return plan


def _cp_comm_of_old(plan: Plan, data: dict) -> Plan:
    """A plan written before Layout.cp_comm, for a model with local attention under context
    parallelism, read as the first of all_gather and a2a that can run it (a window: all_gather;
    chunks: a2a): it was priced at one kernel pass a rank, as those run, and the ring it would
    default to is refused there (layout.cp_comm_refusal). Any other plan without the field ran,
    and reads as, the p2p ring."""
    lay, m = data.get("layout"), plan.model
    local = m.sliding_window is not None or m.attention_chunk is not None
    if not (isinstance(lay, dict) and "cp_comm" not in lay and plan.layout.cp > 1 and local):
        return plan
    way = next((w for w in ("all_gather", "a2a") if cp_comm_refusal(m, plan.layout.tp, plan.layout.cp, w,
                                                                        plan.layout.attention_fp8) is None), "p2p")
    return plan.model_copy(update={"layout": plan.layout.model_copy(update={"cp_comm": way})})


def check_consistent(plan: Plan, src: str) -> None:
    """What the schema alone cannot say, checked before any rank starts: the layout's rules for
    this model (layout.check_for), every layer in exactly one chunk in order, and a rank map holding
    each rank once at coordinates inside the degrees (a custom placement may reorder ranks, but
    within each group its coordinate must rise with the global rank, as torch orders groups)."""
    lay, m = plan.layout, plan.model
    try:
        check_for(lay, m, plan.hardware)
    except LayoutError as e:
        raise SpecError(src, "layout", str(e).removeprefix("layout: ")) from None
    if any(not chunk for chunk in plan.partition) or \
            [i for chunk in plan.partition for i in chunk] != list(range(m.num_layers)):
        raise SpecError(src, "partition", f"expected {lay.stages} non-empty chunks holding layers 0..{m.num_layers - 1} "
                        "in order, each once")
    if plan.migration.enabled and (why := migration_refusal(m, lay)):
        raise SpecError(src, "migration.enabled", "expected false: " + why)
    if plan.routing.histogram and m.moe and len(plan.routing.histogram[0]) != m.moe.num_experts:
        raise SpecError(src, "routing.histogram", f"expected {m.moe.num_experts} counts a row (one an expert), "
                        f"got {len(plan.routing.histogram[0])}")
    if plan.predicted:
        _check_predicted(plan, src)
        _check_stage_memory(plan, src)
    gpn = plan.hardware.gpus_per_node
    bounds = {"pp": lay.pp, "dp": lay.dp, "tp": lay.tp, "cp": lay.cp, "ep": lay.ep, "edp": lay.edp,
              "etp": lay.etp, "local": gpn, "node": -(-lay.gpus // gpn)}
    for i, c in enumerate(plan.rank_map):
        if c.rank != i:
            raise SpecError(src, f"rank_map[{i}].rank", f"expected {i} (entry i describes rank i)")
        for k, n in bounds.items():
            if not 0 <= getattr(c, k) < n:
                raise SpecError(src, f"rank_map[{i}].{k}", f"expected 0..{n - 1}, got {getattr(c, k)}")
    _check_group_order(plan, src)
    for what, key in (("(node, local)", lambda c: (c.node, c.local)), ("(pp, dp, cp, tp)", lambda c: (c.pp, c.dp, c.cp, c.tp)),
                      ("(pp, edp, ep, etp)", lambda c: (c.pp, c.edp, c.ep, c.etp))):
        seen = {}
        for c in plan.rank_map:
            if key(c) in seen:
                raise SpecError(src, f"rank_map[{c.rank}]", f"{what} = {key(c)} is rank {seen[key(c)]}'s too")
            seen[key(c)] = c.rank


def migration_refusal(model: ModelSpec, layout: Layout) -> str:
    """Why expert migration has nothing to move in this layout ("" when it has)."""
    if model.moe is None:
        return f"{model.name} has no experts to re-place"
    if layout.ep == 1:
        return "with ep 1 every rank holds every expert, so there is no placement to even out"
    return ""


# each group piper-train builds (runtime/mesh.group_lists): (its name, the coordinates it joins
# ranks by, its own coordinate, which orders the group)
GROUPS = (("pp", ("dp", "tp"), "pp"), ("dp", ("pp", "tp"), "dp"), ("tp", ("pp", "dp"), "tp"),
           ("ep", ("pp", "edp"), "ep"), ("edp", ("pp", "ep"), "edp"))


def _check_group_order(plan: Plan, src: str) -> None:
    """torch.distributed.new_group orders a group's members by global rank, so a rank's place in
    each group is its rank order there: a map whose coordinates run against it (a hand edit)
    would send expert rows and stage messages to the wrong peers."""
    for name, by, own in GROUPS:
        groups: dict = {}
        for c in plan.rank_map:
            groups.setdefault(tuple(getattr(c, k) for k in by), []).append(c)
        for members in groups.values():
            ranks = [c.rank for c in sorted(members, key=lambda c: getattr(c, own))]
            if ranks != sorted(ranks):
                bad = next(r for r, s in zip(ranks, sorted(ranks)) if r != s)
                raise SpecError(src, f"rank_map[{bad}].{own}", f"expected the {name} group's {own} coordinates "
                                f"to rise with the global rank ({ranks} by {own}; torch orders a group by rank)")


def _check_predicted(plan: Plan, src: str) -> None:
    """The predicted figures derive from one another; a plan whose figures disagree was edited by
    hand, and piper-train would compare its measurements with figures no model priced."""
    p, lay = plan.predicted, plan.layout
    tokens = lay.global_batch * lay.seq / p.step_time_s
    if not math.isclose(p.tokens_per_s, tokens, rel_tol=1e-6):
        raise SpecError(src, "predicted.tokens_per_s", f"expected global_batch*seq/step_time_s = {tokens:.6g}, "
                        f"got {p.tokens_per_s:.6g}")
    if p.hw_tflops_per_gpu < p.tflops_per_gpu * (1 - 1e-9):
        raise SpecError(src, "predicted.hw_tflops_per_gpu", f"expected at least tflops_per_gpu "
                        f"({p.tflops_per_gpu:.6g}; recomputation only adds FLOPs), got {p.hw_tflops_per_gpu:.6g}")
    peak = plan.hardware.accelerator.peak_tflops.get(lay.dtype)
    if peak and not math.isclose(p.mfu, p.tflops_per_gpu / peak, rel_tol=1e-6):
        raise SpecError(src, "predicted.mfu", f"expected tflops_per_gpu / {lay.dtype} peak = "
                        f"{p.tflops_per_gpu / peak:.6g}, got {p.mfu:.6g}")
    tb = p.time_breakdown_s
    if tb:  # ({}: a plan written before the breakdown was recorded)
        where = "predicted.time_breakdown_s"
        for k, v in tb.items():
            if k not in TIME_PARTS:
                raise SpecError(src, f"{where}.{k}", f"unknown part of the step (known: {', '.join(TIME_PARTS)})")
            if not (math.isfinite(v) and v >= 0):
                raise SpecError(src, f"{where}.{k}", f"expected finite seconds >= 0, got {v!r}")
        if "total" not in tb:
            raise SpecError(src, f"{where}.total", "required field is missing (the step time the parts share)")
        if not math.isclose(tb["total"], p.step_time_s, rel_tol=1e-6):
            raise SpecError(src, f"{where}.total", f"expected step_time_s = {p.step_time_s:.6g}, got {tb['total']:.6g}")
        parts = sum(v for k, v in tb.items() if k != "total")
        if not math.isclose(parts, tb["total"], rel_tol=1e-6):
            raise SpecError(src, where, f"expected parts that add up to total = {tb['total']:.6g} s, got {parts:.6g}")


def _check_stage_memory(plan: Plan, src: str) -> None:
    """Each stage's memory: the same parts as the first stage's, finite GiB >= 0, its total their
    sum (the host's apart: it is not on the device), and the peak the largest total. Figures are
    written to 1e-4 GiB, so sums hold to 1e-3."""
    p = plan.predicted
    stages = p.memory_gib_per_stage
    for i, st in enumerate(stages):
        where = f"predicted.memory_gib_per_stage[{i}]"
        if not (isinstance(st.get("stage"), int) and isinstance(st.get("role"), str) and "total" in st and
                all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0
                    for k, v in st.items() if k != "role")):
            raise SpecError(src, where, "expected stage, role, total and finite GiB figures >= 0 per component")
        if st.keys() != stages[0].keys():
            odd = sorted(st.keys() ^ stages[0].keys())[0]
            raise SpecError(src, f"{where}.{odd}", "expected the parts stage 0's figures have, no other "
                            f"({', '.join(k for k in stages[0] if k not in ('stage', 'role'))})")
        parts = sum(v for k, v in st.items() if k not in ("stage", "role", "total", "host"))
        if not math.isclose(st["total"], parts, rel_tol=1e-6, abs_tol=1e-3):
            raise SpecError(src, f"{where}.total", f"expected the sum of its parts, {parts:.4f} GiB; "
                            f"got {st['total']!r}")
    top = max((st["total"] for st in stages), default=None)
    if top is not None and not math.isclose(p.peak_memory_gib, top, rel_tol=1e-6, abs_tol=1e-3):
        raise SpecError(src, "predicted.peak_memory_gib", f"expected the largest stage total, {top:.4f} GiB; "
                        f"got {p.peak_memory_gib!r}")
    if p.fits and p.peak_memory_gib > plan.hardware.accelerator.memory_gib:
        raise SpecError(src, "predicted.fits", f"expected false: the peak {p.peak_memory_gib:.2f} GiB exceeds the "
                        f"device's {plan.hardware.accelerator.memory_gib:g} GiB")


def json_schema() -> dict:
    """Plan's JSON Schema, with what read_plan requires beyond pydantic's: schema_version present
    and this version (a default in the model, so written plans always carry it)."""
    schema = Plan.model_json_schema()
    schema["properties"]["schema_version"]["const"] = SCHEMA_VERSION
    schema["required"] = ["schema_version", *schema.get("required", [])]
    return schema


def make_plan_from(model: ModelSpec, hardware: HardwareSpec, layout: Layout, partition: list[list[int]], *,
                   routing: Routing | None = None, migration: Migration | None = None,
                   predicted: Predicted | None = None) -> Plan:
    """Assemble a Plan from a given layer partition."""
    from .layout import rank_coords

    plan = Plan(model=model, model_hash=spec_hash(model), hardware=hardware, hardware_hash=spec_hash(hardware),
                layout=layout, partition=partition, rank_map=rank_coords(layout, hardware.gpus_per_node),
                routing=routing or Routing(), migration=migration or Migration())
    if predicted is None:
        return plan
    return plan.model_copy(update={"predicted": predicted.model_copy(update={"priced_for": priced_hash(plan)})})


def make_plan(model: ModelSpec, hardware: HardwareSpec, layout: Layout, *, layer_cost=None,
              first_extra: float = 0.0, last_extra: float = 0.0, routing: Routing | None = None,
              migration: Migration | None = None, predicted: Predicted | None = None) -> Plan:
    """Assemble a Plan. `layer_cost` (shape [L], seconds) balances the partition; without
    it layers weigh by their active parameters (a proxy for their time)."""
    from .partition import balanced_partition

    check_for(layout, model, hardware)
    if layer_cost is None:
        act = model.moe_layer_nonexpert_params + (model.moe.top_k * model.expert_params if model.moe else 0)
        layer_cost = [act if model.layer_is_moe(i) else model.dense_layer_params for i in range(model.num_layers)]
    part = balanced_partition(layer_cost, layout.stages, first_extra, last_extra)
    return make_plan_from(model, hardware, layout, part, routing=routing, migration=migration, predicted=predicted)
