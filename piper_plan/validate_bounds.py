"""Piper's full-model results on Frontier as bounds on the model (brief §5).

validation/full_models_piper_frontier.csv: five models Piper trained on Frontier, TFLOPS per
GCD, with neither GPU count, batch nor layout published, so no row can be priced as run. A run
did reach each figure, though: the best plan the model finds for that model, over the GCD counts
such a run could have used and inside what Piper's runtime runs (validate.piper_space), must
reach it as well. A figure above the model's best means the model prices the hardware too slow
(as the spec's GEMM plateau of 100 TFLOPS did for Mixtral 8x7B; validation/README.md).
"""
from __future__ import annotations

from pathlib import Path

from .report import layout_str
from .search import search
from .specs.registry import load_hardware, load_model
from .validate import piper_space
from .validate_kernels import TABLES, read_table

GCDS = (8, 16, 32, 64, 128, 256, 512, 1024)  # one node to one dragonfly group's 128 nodes


def full_model_bounds(path: Path | None = None, gcds: tuple[int, ...] = GCDS, hw_edit=None) -> list[dict]:
    """One row per model: published TFLOPS per GCD, the model's best over `gcds` (TFLOPS,
    GCDs, layout) and whether the best reaches the published figure. hw_edit, if given, maps
    the hardware spec first (as validate.run's)."""
    out = []
    for r in read_table(path or TABLES / "full_models_piper_frontier.csv"):
        m, hw = load_model(r["model_spec"]), load_hardware(r["hardware_spec"])
        if hw_edit is not None:
            hw = hw_edit(hw)
        best = (0.0, 0, "nothing fits")
        for n in gcds:
            res = search(m, hw, piper_space(n, m.seq_len))
            if res.best is None:
                continue
            t = float(res.est.tflops_per_gpu[res.best])
            if t > best[0]:
                best = (t, n, layout_str(res.batch.layout(res.best).model_dump()))
        t, n, lay = best
        published = float(r["tflops_per_gcd"])
        out.append({"model": r["model"], "published": published, "best_predicted": t, "gcds": n,
                    "layout": lay, "reaches": t >= published})
    return out

