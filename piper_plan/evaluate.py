"""Glue between one Layout (or many) and the vectorised cost model, and Plan assembly.

Both `estimate` and `search` go through here, so a plan written by the search reproduces
under `estimate` exactly."""
from __future__ import annotations

from pathlib import Path

from .cost.batch import from_layouts
from .cost.estimate import Estimate, Routing, evaluate
from .cost.imbalance import expert_popularity, observed_rows, step_imbalance
from .cost.stages import materialise
from .errors import SpecError
from .layout import Layout, check_for
from .plan import MAX_ZIPF_S, Migration, Plan, Predicted, Routing as PlanRouting, make_plan_from
from .specs.hardware import HardwareSpec
from .specs.model import ModelSpec


def parse_routing(text: str | None) -> Routing:
    """'uniform', 'zipf' / 'zipf:1.2', or a path to a runtime metrics JSONL (tokens per expert)."""
    if not text or text == "uniform":
        return Routing()
    if text.startswith("zipf"):
        _, _, s = text.partition(":")
        try:
            z = 1.0 if text == "zipf" else float(s) if s else float("nan")  # "zipf:" with no s is a typo
        except ValueError:
            z = float("nan")
        if not 0.0 <= z <= MAX_ZIPF_S:  # NaN fails this too
            raise SpecError("--routing", "zipf", f"expected zipf:<s> with s from 0 to {MAX_ZIPF_S:g} (at 10 one "
                            f"expert takes 99.9 % of the tokens), got {text!r}")
        return Routing("zipf", z)
    p = Path(text)
    try:
        is_file = p.is_file()
    except OSError as e:  # a name stat() refuses (too long): one line, not a traceback
        raise SpecError(text, "--routing", f"cannot read ({e.strerror or e})") from None
    if p.suffix == ".jsonl" and not is_file:
        raise SpecError(text, "<file>", "no such metrics file")
    if is_file:
        return Routing("histogram", histogram=_histogram_from_metrics(p))
    raise SpecError("--routing", "<value>", f"expected uniform, zipf[:s] or a metrics .jsonl file, got {text!r}")


def _histogram_from_metrics(path: Path) -> list:
    """Routed tokens per expert of a piper-train metrics file, one row per MoE layer."""
    from .cost.migration import load_histogram

    _check_metrics_records(path)
    return load_histogram(path).tolist()


def _check_metrics_records(path: Path) -> None:
    """What load_histogram's json.loads and float conversion let through, refused: a key repeated in
    one record (JSON lets the last win; a config.json's repeat is refused by the same hook,
    registry._unique_keys) and counts that are no numbers ("5" and true, which numpy reads as 5.0
    and 1.0). A line that is no JSON at all is load_histogram's to name."""
    import json

    from .files import read_text
    from .specs.registry import _unique_keys

    for n, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line, object_pairs_hook=_unique_keys(f"{path}: line {n}"))
        except (ValueError, RecursionError):
            continue
        tpe = rec.get("tokens_per_expert") if isinstance(rec, dict) else None
        if isinstance(tpe, dict):
            items = tpe.items()
        elif isinstance(tpe, list):
            items = enumerate(tpe if tpe and isinstance(tpe[0], list) else [tpe])
        else:
            continue
        for layer, counts in items:
            bad = [x for x in counts if isinstance(x, bool) or not isinstance(x, (int, float))] \
                if isinstance(counts, list) else []
            if bad:  # (load_histogram's words)
                raise SpecError(str(path), f"line {n}: tokens_per_expert[{layer}]",
                                f"expected a list of finite, non-negative token counts, got {json.dumps(bad[0])[:40]}")


def to_plan_routing(r: Routing) -> PlanRouting:
    return PlanRouting(distribution=r.distribution, zipf_s=r.zipf_s, histogram=r.histogram)


def from_plan_routing(r: PlanRouting, migration: Migration | None = None) -> Routing:
    return Routing(r.distribution, r.zipf_s, r.histogram, migration=migration if migration and migration.enabled else None)


def estimate_layout(model: ModelSpec, hw: HardwareSpec, layout: Layout, routing: Routing | None = None,
                    headroom_gib: float = 0.0) -> Estimate:
    """Check the layout's constraints, then evaluate it (one-element Estimate)."""
    check_for(layout, model, hw)
    return evaluate(model, hw, from_layouts([layout]), routing, headroom_gib)


def predicted_of(est: Estimate, i: int, ep_load_step: float = 1.0) -> Predicted:
    r = est.row(i)
    return Predicted(step_time_s=r["step_time_s"], tokens_per_s=r["tokens_per_s"], tflops_per_gpu=r["tflops_per_gpu"],
                     hw_tflops_per_gpu=r["hw_tflops_per_gpu"], mfu=r["mfu"], peak_memory_gib=r["peak_memory_gib"],
                     fits=r["fits"], a2a_time_s=r["a2a_time_s"], imbalance=max(1.0, r["imbalance"]),
                     ep_load_step=ep_load_step, memory_gib_per_stage=r["memory_gib_per_stage"],
                     time_breakdown_s=r["time_breakdown_s"])


def ep_load_step(model: ModelSpec, layout: Layout, routing: Routing) -> float:
    """Expected max/mean routed rows per EP rank over one optimizer step (cost.imbalance
    step_imbalance): a rank's rows are its DP replica's tokens, split as the estimate splits a
    micro-batch's (over cp and tp, pooled over etp), times top-k, all micro-batches together."""
    if model.moe is None or layout.ep <= 1:
        return 1.0
    p = expert_popularity(model.moe.num_experts, routing.distribution, routing.zipf_s, routing.histogram)
    rows = layout.global_batch / layout.dp * layout.seq / layout.cp / layout.tp * model.moe.top_k * layout.etp
    mig = routing.migration
    return step_imbalance(p, layout.ep, rows, mig.planner if mig else None, mig.max_moves if mig else None,
                          observed_rows(routing.histogram, routing.distribution))


def build_plan(model: ModelSpec, hw: HardwareSpec, layout: Layout, est: Estimate, i: int = 0,
               routing: Routing | None = None, migration: Migration | None = None) -> Plan:
    """Plan for the i-th layout of an Estimate, with the partition the estimate assumed."""
    part = materialise(model.num_layers, layout.stages, est.chunks, i)
    routing = routing or Routing()
    return make_plan_from(model, hw, layout, part, routing=to_plan_routing(routing), migration=migration,
                          predicted=predicted_of(est, i, ep_load_step(model, layout, routing)))
