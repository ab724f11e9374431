"""Step time of a pipeline schedule from per-rank, per-micro-batch phase times.

F, B, W: forward, backward-input, backward-weight seconds of one micro-batch on a rank
(recompute included in B); `peak` the busiest rank, `total` the sum over ranks.

- gpipe, 1f1b:   Σ_r (F+B+W) + (M-1)·max_r (F+B+W)           (Narayanan 2021 §2.2: bubble (p-1)/m)
- interleaved:   M·max + (pp-1)·max / v                       (Narayanan 2021 §2.2.2)
- zbv:           M·max + (pp-1)·max(0, F + B - 2W)/2          (ZB-V, arXiv 2401.10241 Table 3;
                 chunk = half a rank's layers)
- dualpipev:     M·max + (pp-1)·max(0, F&B + B - 3W)/2, where F&B = max(F+B compute, comm):
                 forward and backward chunks of two micro-batches overlap, so the expert
                 all-to-all hides behind compute (DeepSeek-V3 report §3.2.1, DualPipe README);
                 under piper-train (torch's ScheduleDualPipeV, no overlap) comm_hidden is 0.
"""
from __future__ import annotations

import numpy as np


def pipeline_time(sched, pp, M, vpp, F, B, W, peak_sum, total_sum, comm_hidden=None):
    """Seconds for the forward/backward part of one step. `peak_sum` is max_r (F+B+W) and
    `total_sum` Σ_r (F+B+W); F, B, W are the peak rank's."""
    pp = pp.astype(float)
    M = M.astype(float)
    v = vpp.astype(float)
    Mp = M * peak_sum
    fb = np.where(sched <= 1, total_sum + (M - 1) * peak_sum, np.where(sched == 2, Mp + (pp - 1) * peak_sum / v, Mp))
    if comm_hidden is None:
        comm_hidden = np.zeros_like(F)
    zb = (pp - 1) * np.maximum(0.0, F + B - 2 * W) / 2
    dp_b = (pp - 1) * np.maximum(0.0, (F + B - comm_hidden) + B - 3 * W) / 2
    bubble_extra = np.where(sched == 3, zb, np.where(sched == 4, dp_b, 0.0))
    return np.where(pp == 1, Mp, fb + bubble_extra)
