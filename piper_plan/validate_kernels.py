"""Kernel-level check of the cost model against published per-shape measurements.

validation/gemm_h100_xla.csv: bf16 GEMM throughput on H100 (sm_90) for the 375 shapes of
OpenXLA's default matmul table (tensorflow/tensorflow third_party/xla/xla/service/gpu/model/
matmul_interpolator_data.h @372d578: b in {1, 2, 4} batched GEMMs, m, n, k in 256..4096; the
table XLA's GPU cost model interpolates). `gemm_check` prices each shape with
kernels.gemm_time on the bundled dgx-h100 spec and reports predicted / measured time, by the
shape's measured time: what the step model sees of large GEMMs (tens of µs and more) and
where the roofline is known to miss (a few µs: split-K on few output tiles, short K loops).
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from .cost.kernels import gemm_time
from .specs.registry import load_hardware

TIME_CLASSES_US = ((0.0, 20.0), (20.0, 100.0), (100.0, float("inf")))


def gemm_table_path() -> Path:
    return Path(__file__).resolve().parent.parent / "validation" / "gemm_h100_xla.csv"


def gemm_check(path: Path | None = None, hardware: str = "dgx-h100") -> dict:
    """Predicted / measured GEMM time per measured-time class: {label: {shapes, median,
    p10, p90, sum_ratio}} (sum_ratio: Σ predicted / Σ measured seconds)."""
    rows = list(csv.DictReader(open(path or gemm_table_path())))
    b, m, n, k, fps = (np.array([float(r[c]) for r in rows]) for c in ("b", "m", "n", "k", "flops_per_s"))
    flops = 2.0 * b * m * n * k
    measured = flops / fps
    predicted = gemm_time(load_hardware(hardware), m, n, k, groups=b)
    ratio = predicted / measured
    out = {}
    for lo, hi in TIME_CLASSES_US:
        sel = (measured >= lo * 1e-6) & (measured < hi * 1e-6)
        if sel.any():
            label = f"{lo:g}-{hi:g} us" if np.isfinite(hi) else f">= {lo:g} us"
            out[label] = {"shapes": int(sel.sum()), "median": float(np.median(ratio[sel])),
                          "p10": float(np.percentile(ratio[sel], 10)), "p90": float(np.percentile(ratio[sel], 90)),
                          "sum_ratio": float(predicted[sel].sum() / measured[sel].sum())}
    return out
