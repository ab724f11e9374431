"""What the bundled validation says of the model and machine a plan is made for: their published
runs' mean signed error and its bias test (validate_residuals), so a prediction is read beside
how far the model has been off for that model and machine before.

The figures are validate --residuals' own output for the bundled table, stored as
validation/track_record.json (`piper-plan validate --residuals --json -o
validation/track_record.json`); tests/test_track_record.py holds the file to a fresh pass over
the table, so a change to the cost model that moves them fails until the file is written again.
Reading a stored file keeps scipy and the table's pricing out of estimate's and search's start.
"""
from __future__ import annotations

import json
import math

from .specs.registry import validation_dir

FILE = "track_record.json"


def path():
    return validation_dir() / FILE


def _stored() -> dict:
    """The stored residuals; {} where the file is missing or unreadable (a track record is
    context, never a reason to fail a plan)."""
    try:
        return json.loads(path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _levels_of(d: dict, model_name: str, hardware_name: str) -> list[dict]:
    want = {("model", model_name), ("hardware", hardware_name),
            ("model x hardware", f"{model_name} x {hardware_name}")}
    return [s for s in d.get("levels", []) if (s.get("factor"), s.get("level")) in want]


def levels_for(model_name: str, hardware_name: str) -> list[dict]:
    """The stored levels that name this model, this machine, or the two together."""
    return _levels_of(_stored(), model_name, hardware_name)


def lines(model_name: str, hardware_name: str) -> list[str]:
    """One sentence per stored level of this model and machine, biased ones said as such."""
    d = _stored()
    max_q = d.get("thresholds", {}).get("max_q")
    at = "" if max_q is None else f" at q {max_q:g}"
    out = []
    for s in _levels_of(d, model_name, hardware_name):
        sign = "too fast" if s["mean_pct"] > 0 else "too slow"
        verdict = (f"a bias (q {s['q']:.3f}): the model has been {sign} here" if s["bias"]
                   else f"no bias{at} (q {s['q']:.2f})")
        out.append(f"track record, {s['level']}: {s['setups']} published setups ({s['rows']} rows) read "
                   f"{s['mean_pct']:+.1f} % on average (spread {s['sd_pct']:.1f} %), {verdict}; "
                   "piper-plan validate --residuals")
    return out


def memory_margin_line(peak_gib: float, device_gib: float, leanest_gib: float | None = None) -> str | None:
    """A note where a plan's busiest rank is predicted fuller than any published run the memory
    model was checked on and predicts to fit (validate_residuals.memory_checked), with the
    --headroom-gib that keeps a search within that, or, where even the search's leanest fitting
    plan (`leanest_gib`) is fuller, that none of its plans is; None where the plan is within it,
    or where nothing is stored."""
    m = _stored().get("memory") or {}
    share = m.get("max_share")
    if not share or device_gib <= 0 or peak_gib <= share * device_gib:
        return None
    said = (f"note: the best plan's busiest rank is predicted at {100 * peak_gib / device_gib:.1f} % of the device's "
            f"{device_gib:g} GiB; of the {m['runs']} published runs the memory model is checked on and predicts "
            f"to fit, none is above {100 * share:.1f} % ({m['at']}): ")
    if leanest_gib is not None and leanest_gib > share * device_gib:
        return said + ("no plan of this search is within that (more GPUs, or less memory a rank, would be; the "
                       "allocator's fragmentation is not modelled)")
    keep = math.ceil(10 * device_gib * (1.0 - share)) / 10  # to 0.1 GiB: a small device's margin is small
    return said + f"--headroom-gib {keep:g} keeps plans within that (the allocator's fragmentation is not modelled)"
