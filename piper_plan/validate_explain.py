"""One row of a validation table in full (`piper-plan validate --explain ID`): the layout and
settings it is priced under, the predicted step and its parts, the first stage's memory and what
the model misses per layer where the published figure fixes a step time."""
from __future__ import annotations

from pathlib import Path

from .errors import PiperError
from .validate import (_compared, _inherit, _priced, _row_value, _step_gap, data_path, missing_hardware,
                       missing_model, nothing_fits, read_rows)


def explain(row_id: str, path: Path | None = None) -> dict:
    """One row in full: the layout and settings it is priced under, the predicted step and its
    breakdown, and (where the published figure gives a step time: tokens/s, iteration time) the
    measured step time and what the model misses per transformer layer and micro-batch on a rank."""
    path = path or data_path()
    rows = [r for r in read_rows(path) if r["id"] == row_id]
    if not rows:
        raise PiperError(f"{path}: id: no row {row_id!r}")
    row = rows[0]
    if why := missing_model(row) or missing_hardware(row):  # as the plain pass: not priced, and why
        return {"id": row_id, "group": row["group"], "metric": row["metric"], "published": float(row["value"]),
                "predicted": None, "source": row["source"], "notes": row["notes"], "not_priced": why}
    _inherit(rows, path, {})
    m, lay, est, i = _priced(row, path=path)
    pred, _ = _row_value(row, m, lay, est, i)
    metric, pub = _compared(row, m)
    out = {"id": row_id, "group": row["group"], "metric": metric, "published": pub, "predicted": pred,
           "fit": row.get("fit", "no") == "yes", "source": row["source"], "notes": row["notes"]}
    if lay is None:  # JSON has no NaN: no prediction, and why
        return {**out, "predicted": None, "not_priced": nothing_fits(row)}
    out.update(layout=lay.model_dump(mode="json"), step_time_s=float(est.step_time_s[i]),
               time_breakdown_s={k: float(v[i]) for k, v in est.time.items()},
               # the first stage's, whose parts the memory rows compare (Korthikanti's Fig. 1)
               memory_first_stage_gib={k: float(v[i]) for k, v in est.memory["first"].items()})
    out.update(_step_gap(row, m, lay, est, i))
    return out
