"""How the validation errors move when the hardware efficiencies move.

Every efficiency in the bundled specs comes from a published micro-benchmark, not from the
validation rows. This asks the converse question a user should ask of such a table: would a
different (mis-measured) efficiency have explained the misses? Each family of efficiencies is
scaled by one factor on every spec at once (fractions of a peak capped at 1), every row is
priced again, and the errors per kind are reported. `compute_scan` scales all compute and
memory efficiencies together: the one knob that could trade dense accuracy for MoE accuracy.
"""
from __future__ import annotations

from pathlib import Path

from .specs.hardware import AttentionPlateau, HardwareSpec
from .validate import run, summary

# each family: the efficiency fields it scales (fractions of a peak, capped at 1, or per-call
# times, TIMES, scaled the other way: a slower launch is a larger overhead)
FAMILIES = {
    "gemm": ("gemm", "gemm_dtype"),
    "attention": ("attention", "attention_bwd", "attention_fa2"),
    "memory": ("memory", "memory_dram", "quant_memory"),
    "comm": ("comm", "a2a_fanout"),
    "kernel_overhead_us": ("kernel_overhead_us",),
    "host_op_us": ("host_op_us",),
}
TIMES = ("kernel_overhead_us", "host_op_us")  # per-call costs: faster means smaller
COMPUTE = ("gemm", "attention", "memory")


def scaled(hw: HardwareSpec, families, factor: float) -> HardwareSpec:
    """hw with every efficiency of `families` (FAMILIES keys) made `factor` times faster:
    fractions of a peak × factor (capped at 1), per-call host and kernel costs ÷ factor."""
    eff = hw.efficiency
    upd = {}
    for fam in families:
        for field in FAMILIES[fam]:
            v = getattr(eff, field)
            if v is None:
                continue
            if field in TIMES:
                upd[field] = v / factor
            elif isinstance(v, dict):
                upd[field] = {k: min(1.0, x * factor) for k, x in v.items()}
            elif isinstance(v, AttentionPlateau):  # another kernel's plateaus: its rates, not its share
                upd[field] = v.model_copy(update={k: min(1.0, getattr(v, k) * factor) for k in ("forward", "backward")
                                                  if getattr(v, k) is not None})
            else:
                upd[field] = min(1.0, v * factor)
    topo = hw.topology
    if "comm" in families:  # a level's own measured fraction (Level.comm) moves with the family
        topo = [lv.model_copy(update={k: min(1.0, getattr(lv, k) * factor) for k in ("comm", "a2a_comm")
                                      if getattr(lv, k)}) for lv in topo]
    return hw.model_copy(update={"efficiency": eff.model_copy(update=upd), "topology": topo})


def _kinds(results) -> dict:
    keep = ("mape", "max_abs_pct", "within_target_max", "rows")
    return {kind: {k: d[k] for k in keep} for kind, d in summary(results)["kinds"].items()}


def sensitivity(factors=(0.8, 1.25), families=tuple(FAMILIES), group: str | None = None,
                path: Path | None = None) -> list[dict]:
    """[{family, factor, <kind>: {mape, max_abs_pct, within_target_max, rows}}], the unscaled
    specs first (family 'none', factor 1); `path`: a table other than the bundled one."""
    out = [{"family": "none", "factor": 1.0, **_kinds(run(group, path))}]
    for fam in families:
        for f in factors:
            out.append({"family": fam, "factor": f,
                        **_kinds(run(group, path, hw_edit=lambda hw: scaled(hw, (fam,), f)))})
    return out


def compute_scan(factors=(0.6, 0.7, 0.8, 0.9, 1.0), group: str | None = None, path: Path | None = None) -> list[dict]:
    """Every compute and memory efficiency (gemm, attention, memory) scaled together."""
    return [{"family": "+".join(COMPUTE), "factor": f,
             **_kinds(run(group, path, hw_edit=lambda hw: scaled(hw, COMPUTE, f)))} for f in factors]
