"""How the searched rows move with the global batch their sources do not publish.

A "planner's choice" row (Piper's Fig. 13 and weak-scaling runs) compares the best plan the
search finds with a published figure, and the search needs a global batch that the paper does
not give. validate prices these rows at the default batch (4M tokens, rounded to the GPUs);
this asks how much of a row's error that one unpublished input could carry. Each searched row
is priced again at k sequences per GPU for each k in PER_GPU, and the report gives the range
and whether the published figure lies inside it. Nothing here changes what validate reports
or which batch it uses: choosing the batch that matches a row would be fitting that row.
"""
from __future__ import annotations

from pathlib import Path

from .search import search
from .validate import data_path, is_searched, row_specs, searched_figure, searched_space
from .validate_rows import missing_hardware, missing_model, read_rows

# sequences per GPU per step: 1 is the least Piper's PP x EP mesh can run under 1F1B with one
# sequence a micro-batch (M = PP micro-batches on each of the EP = GPUs/PP pipelines), 16 is
# what the default 4M-token batch gives the 110B weak-scaling run at 64 GCDs
PER_GPU = (1, 2, 4, 8, 16)
# groups that are weak-scaling series: the work per GPU is the same in every run, so at any one
# batch per GPU the ratio of a run's throughput to the smallest run's needs no batch at all
WEAK_SCALING = ("piper2026-weak-scaling",)


def _best(m, hw, space, metric: str) -> tuple[float | None, str]:
    """(the best plan's figure in the row's `metric`, as validate prices a searched row: model or
    hardware TFLOPS per GPU, tokens/s per GPU or the step's seconds; its layout) in `space`;
    (None, "") if nothing fits."""
    res = search(m, hw, space)
    if res.best is None:
        return None, ""
    lay = res.batch.layout(res.best)
    return (searched_figure(res.est, res.best, lay, metric),
            f"pp{lay.pp} ep{lay.ep} dp{lay.dp} mbs{lay.mbs} rc={lay.recompute}")


def batch_scan(group: str | None = None, per_gpu=PER_GPU, path: Path | None = None) -> list[dict]:
    """[{id, group, gpus, published, default: {global_batch, predicted, layout},
    scan: [{per_gpu, global_batch, predicted, layout}], low, high, inside}] for every searched
    row (in the row's metric; predicted None where nothing fits at that batch)."""
    out, specs = [], {}
    path = path or data_path()
    for row in read_rows(path):
        if not is_searched(row) or (group and row["group"] != group) or row["metric"].endswith("gib_per_gpu") \
                or missing_model(row) or missing_hardware(row):
            continue  # (a memory row needs the layout it was measured under: validate refuses it unsearched;
            # a row with no spec for its model or machine is not priced, as in the plain pass)
        m, hw = row_specs(row, specs, path)
        gpus = int(row["gpus"])
        space = searched_space(row, hw)
        pred, lay = _best(m, hw, space, row["metric"])
        scan = []
        for k in per_gpu:
            p, lay_k = _best(m, hw, searched_space(row, hw, k * gpus), row["metric"])
            scan.append({"per_gpu": k, "global_batch": k * gpus, "predicted": p, "layout": lay_k})
        vals = [s["predicted"] for s in scan if s["predicted"] is not None] + ([pred] if pred is not None else [])
        pub = float(row["value"])
        low, high = (min(vals), max(vals)) if vals else (None, None)
        out.append({"id": row["id"], "group": row["group"], "gpus": gpus, "published": pub,
                    "default": {"global_batch": space.global_batch, "predicted": pred, "layout": lay},
                    "scan": scan, "low": low, "high": high,
                    "inside": vals != [] and low <= pub <= high})
    _weak_scaling(out)
    return out


def _weak_scaling(rows: list[dict]) -> None:
    """Give each row of a WEAK_SCALING group `relative`: its published TFLOPS per GPU over its
    series' smallest run's, and the predicted one at each batch per GPU of the scan (None
    where either run has no plan). The unpublished batch moves a run's level by up to 1.8x
    (the scan); it moves this ratio far less, so the ratio tests the cost of scaling out."""
    for g in WEAK_SCALING:
        fam = sorted((r for r in rows if r["group"] == g), key=lambda r: r["gpus"])
        if len(fam) < 2:
            continue
        base = fam[0]
        for r in fam:
            pred = [None if a["predicted"] is None or b["predicted"] is None else a["predicted"] / b["predicted"]
                    for a, b in zip(r["scan"], base["scan"])]
            r["relative"] = {"to": base["id"], "published": r["published"] / base["published"], "predicted": pred}
