"""Which recipe a table row that states none ran: the nearest row of the bundled table.

A row in the published schema gives its layout but not how its software ran it: the dispatcher,
EP overlap, CUDA graphs, recompute modules, pipeline split (the bundled table's recipe columns,
RECIPE; validation/README.md). Priced with none of them, a Megatron-Core row of 2026 runs as an
eager, flat-all-to-all job it never was (tens of per cent off). What the bundled table read
from each publisher's recipes is the best evidence there is of what an unread row of the same
publisher ran, so a row that states no recipe column takes the recipe of the bundled row
nearest to it (nearest_reference):

1. the same software stack, required (stack): Megatron-Core's groups (Megatron-Bridge, the
   Megatron-Core report, Megatron-LM's recipes, docs and Megatron-FSDP case study, the model
   zoo, and a table's own group whose name or source says Megatron or NeMo) are one stack; the
   2021-22 Megatron-LM papers another; other groups only themselves (X-MoE, Piper);
2. the same setup (model, system, precision, layout, recompute: the row's twin in another
   release; its recipe is the row's), then the same kind (MoE or dense: Megatron's recipes are
   set by kind before system; a dense model takes no expert dispatcher or MoE graph scope, and
   only dense recipes overlap TP communication: every dense row of the bundled table at tp > 1
   does, none of its MoE rows there), the same system, the same publication (the source
   without its release: one series of recipes, such as Megatron-Bridge's performance tables),
   the same model, the same precision, the same group, the nearest release (the "(26.06.01)"
   of a Megatron-Bridge source), in that order;
3. among the references that rank first, the recipe most of them ran (the first on a tie).

The recompute modules are taken only when both rows say "per recipe": a row that states its
recompute (none, full, selective) keeps it. The ZeRO stage (PER_MODEL) is taken only from a
reference of the same model. A setting the row's layout exercises and its reference's did not
(EXERCISED: TP communication overlap at tp > 1) comes from the nearest reference that did.
`validate --blind` measures what this inference is worth on rows whose setup the bundled table
does not hold (validate_blind).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from .validate_rows import table_name

# the columns that say how a row's software ran (validation/README.md), not what it measured
RECIPE = ("recompute_modules", "cuda_graphs", "pipeline_split", "dispatcher", "a2a_overlap", "a2a_sms",
          "tp_comm_overlap", "attention_fp8", "expert_gemm", "zero_stage", "grad_reduce", "overlap_grad_reduce",
          "fp8_params")
# recipe columns a publisher chooses per model and scale, not per stack: taken from a reference
# of the same model only (Megatron-FSDP for one single-node Llama 8B run is no default for 512 GPUs)
PER_MODEL = ("zero_stage",)
# recipe columns a run exercises only under some layouts: a reference that did not cannot say
# what the row, which does, ran; the nearest reference that did says it (TP communication
# overlap needs tp > 1). Not the pipeline split: Megatron's embedding/loss accounting is chosen
# per model, where its layers plus two divide among the chunks
EXERCISED = {"tp_comm_overlap": lambda r: int(r.get("tp") or 1) > 1}
# a run's layout and recompute: with the specs, what makes two rows the same setup
LAYOUT = ("precision", "gpus", "tp", "cp", "pp", "vpp", "ep", "etp", "dp", "mbs", "gbs", "seq", "recompute")
# a layout's degrees and batch: the cells a row may leave blank for its source's own choice
DEGREES = ("tp", "pp", "vpp", "ep", "dp", "mbs", "gbs")
# Megatron-Core with Transformer Engine, as each publisher runs it
MEGATRON_GROUPS = ("megatron-bridge-moe", "mcore2026-moe-report", "mlm-moe-recipes", "mlm-docs", "mcore-modelzoo",
                   "megatron-bridge-dense", "mlm-fsdp")
# Megatron-LM of 2021-22 (eager attention, dropout, no distributed optimizer): groups by prefix
MEGATRON_2021 = ("narayanan", "korthikanti")
_MCORE = re.compile(r"megatron|nemo")
_RELEASE = re.compile(r"\((\d\d)\.(\d\d)(?:\.(\d\d))?\)")

# (model spec name, hardware spec name, MoE or not) a row is priced on
Resolve = Callable[[dict], "tuple[str, str, bool]"]


def stack(row: dict) -> str:
    """The software a row ran: "megatron-core" for Megatron-Core's groups and for any other whose
    group or source names Megatron-Bridge, Megatron-Core, Megatron-LM or NeMo (all Megatron-Core
    underneath; not Megatron-DeepSpeed, X-MoE's fork), "megatron-lm-2021" for the 2021-22 papers'
    groups, else the group itself."""
    g = row["group"]
    if g.startswith(MEGATRON_2021):
        return "megatron-lm-2021"
    if g in MEGATRON_GROUPS:
        return "megatron-core"
    text = f"{g} {row.get('source', '')}".lower()
    if g != "xmoe2025" and "deepspeed" not in text and _MCORE.search(text):
        return "megatron-core"
    return g


def release(source: str) -> float | None:
    """A release the source names as "(YY.MM[.PP])", in months (a patch a hundredth of one:
    26.06.01 -> 26·12 + 6 + 0.01), None if none."""
    m = _RELEASE.search(source)
    return None if m is None else int(m.group(1)) * 12 + int(m.group(2)) + int(m.group(3) or 0) / 100


def setup(row: dict, specs: tuple) -> tuple:
    """What makes two rows the same run setup: their specs, layout and recompute."""
    return (*specs, *(row.get(c, "") for c in LAYOUT))


def document(source: str) -> str:
    """The publication a source names, without its release ("Megatron-Bridge
    docs/performance-summary.md (26.06)" -> "... performance-summary.md"): one recipe series."""
    return _RELEASE.sub("", source).strip()


def _rank(row: dict, specs: tuple, ref: dict, ref_specs: tuple) -> tuple:
    """How near `ref` is to `row` (larger is nearer; module docstring, step 2)."""
    src, ref_src = row.get("source", ""), ref.get("source", "")
    rel, ref_rel = release(src), release(ref_src)
    gap = abs(rel - ref_rel) if rel is not None and ref_rel is not None else float("inf")
    return (setup(row, specs) == setup(ref, ref_specs), ref_specs[2] == specs[2], ref_specs[1] == specs[1],
            document(ref_src) == document(src), ref_specs[0] == specs[0], ref["precision"] == row["precision"],
            ref["group"] == row["group"], -gap)


def nearest_reference(row: dict, reference: Iterable[dict], resolve: Resolve) -> dict | None:
    """The reference row whose recipe `row` runs (module docstring), None where no reference
    of its stack states a recipe."""
    specs = resolve(row)
    ranked = [(_rank(row, specs, x, resolve(x)), x) for x in reference
              if stack(x) == stack(row) and any(x.get(c) for c in RECIPE)]
    if not ranked:
        return None
    top = max(k for k, _ in ranked)
    firsts = [x for k, x in ranked if k == top]
    recipes = [tuple(x[c] for c in RECIPE) for x in firsts]
    return firsts[recipes.index(max(recipes, key=recipes.count))]  # max keeps the first of equal counts


def inherit_recipes(rows: list[dict], reference: list[dict], resolve: Resolve) -> dict[str, str]:
    """Fill the recipe columns of each row that states none from its nearest reference row
    (nearest_reference). Returns {row id: reference id} for the rows filled; rows in place."""
    out = {}
    for r in rows:
        if any(r.get(c) for c in RECIPE):
            continue
        src = nearest_reference(r, reference, resolve)
        if src is None:
            continue
        r.update((c, src[c]) for c in RECIPE)
        if not (r["recompute"] == src["recompute"] == "per recipe"):
            r["recompute_modules"] = ""
        if resolve(src)[0] != resolve(r)[0] or r.get("fsdp"):  # a row's own FSDP column says its sharding
            r.update(dict.fromkeys(PER_MODEL, ""))
        out[r["id"]] = src["id"]
        for col, used in EXERCISED.items():  # a setting src never had occasion to use
            if used(r) and not used(src):
                alt = nearest_reference(r, [x for x in reference if used(x)], resolve)
                if alt is not None and alt[col] != r[col]:  # named only where it changes the recipe
                    r[col] = alt[col]
                    out[r["id"]] += f" ({col} from {alt['id']})"
    return out


def inherit_layouts(rows: list[dict], reference: list[dict], resolve: Resolve) -> dict[str, str]:
    """Fill the blank layout cells (DEGREES) of each row that is not the planner's choice from
    its twin in `reference`: the row of the same group, model spec, hardware name, precision,
    GPUs and sequence length whose layout agrees with every cell the row states, where all
    such rows give one layout ("X-MoE recipe" rows, whose layout X-MoE's launch scripts give and
    the bundled table quotes). The twin's hardware spec comes with it (X-MoE ran ROCm 5.7 on
    Frontier: frontier-rocm57), and a recompute that names the source's recipe ("X-MoE recipe
    ...", "per recipe") becomes the twin's. Returns {row id: reference id} for the rows filled;
    rows in place."""
    def run(x):
        return x["group"], resolve(x)[0], table_name(x["hardware"]), x["precision"], x["gpus"], x["seq"]

    out = {}
    for r in rows:
        if r["recompute"] == "planner's choice" or all(r.get(c) for c in DEGREES):
            continue
        twins = [x for x in reference if run(x) == run(r) and all(not r.get(c) or r[c] == x[c] for c in DEGREES)]
        if len({tuple(x[c] for c in DEGREES) for x in twins}) != 1:
            continue  # none, or several layouts the row's cells cannot choose between
        src = twins[0]
        r.update((c, r.get(c) or src[c]) for c in (*DEGREES, "hardware_spec"))
        if r["recompute"] == "per recipe" or r["recompute"].startswith("X-MoE recipe"):
            r["recompute"] = src["recompute"]
        out[r["id"]] = src["id"]
    return out
