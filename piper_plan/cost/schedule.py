"""Step time of a pipeline schedule from per-rank, per-micro-batch phase times.

F, B, W: forward, backward-input, backward-weight seconds of one micro-batch on a rank
(recompute included in B; a V rank's two chunks together); `peak` the busiest rank, `total` the
sum over ranks; v = vpp.

- gpipe, 1f1b:   Σ_r (F+B+W) + (M-1)·max_r (F+B+W)           (Narayanan 2021 §2.2: bubble (p-1)/m)
- interleaved:   M·max + (Σ - max)/v                          (Narayanan 2021 §2.2.2, each rank's own
                 share of the fill and drain: (pp-1)·max/v on equal ranks)
- zbv:           M·max + zbv_bubble: the idle time of torch's ScheduleZBVZeroBubble order, which
                 piper-train runs (cost/schedule_sim.zbv_dag_bubble walks it)
- dualpipev:     M·max + (pp-1)·max(0, F + 2B - W - h)/2: DualPipe's (PP/2-1)(F&B + B - 3W) per
                 chunk with PP = 2·pp (DualPipeV is DualPipe cut in half), its B a full backward
                 (input + weight) and F&B a forward beside a full backward, less the exchange h
                 hidden between them (DeepSeek-V3 report §3.2.1, DualPipe README); under
                 piper-train (torch's ScheduleDualPipeV, no overlap) h is 0.
The V schedules' F, B, W (and h) cover a rank's two chunks: their bubbles read a chunk's, half.
"""
from __future__ import annotations

import numpy as np


def zbv_bubble(pp, F, B, W):
    """Seconds torch's ScheduleZBVZeroBubble leaves a step idle beyond M·(F + B + W), for any M >=
    2·pp - 1. F, B, W: a rank's forward, backward-input and backward-weight seconds a micro-batch
    (both chunks; arrays broadcast together). The critical path of torch's order, every rank with
    these times, reduced to its eight linear pieces; with f, b, w a chunk's (half) and
    m = min(b, 2w) it is the largest of max(f, b) + (pp-2)·w, (pp-1)·(2b - m),
    2(pp-1)·f - w - (pp-1)·m and (2pp-3)·f + b - (pp-1)·m (schedule_sim.zbv_dag_bubble walks the
    graph; tests/test_schedule_sim.py holds them equal on every (f, b, w) for pp 2-16, 24, 31, 32, 64).
    It is never below (pp-1)·F/2, the wait of the last rank for its first input, pp - 1 chunks'
    forwards away: ZB-V's (pp-1)·(F + B - 2W)/2 (arXiv 2401.10241 Table 3), below that where W
    is large, needs its optimizer step to run ahead of the last backward, which torch's does not."""
    p = np.asarray(pp, float)
    f, b, w = (np.asarray(x, float) / 2 for x in (F, B, W))
    m = np.minimum(b, 2 * w)
    tail = np.maximum(2 * (p - 1) * f - w, (2 * p - 3) * f + b) - (p - 1) * m
    return np.maximum(np.maximum(np.maximum(f, b) + (p - 2) * w, (p - 1) * (2 * b - m)), tail)


def pipeline_time(sched, pp, M, vpp, F, B, W, peak_sum, total_sum, comm_hidden=None):
    """Seconds for the forward/backward part of one step. `peak_sum` is max_r (F+B+W) and
    `total_sum` Σ_r (F+B+W); F, B, W are the peak rank's."""
    pp = pp.astype(float)
    M = M.astype(float)
    v = vpp.astype(float)
    Mp = M * peak_sum
    # the interleaved fill and drain: every rank's chunk once, the busiest one's in the steady state
    fb = np.where(sched <= 1, total_sum + (M - 1) * peak_sum, np.where(sched == 2, Mp + (total_sum - peak_sum) / v, Mp))
    if comm_hidden is None:
        comm_hidden = np.zeros_like(F)
    zb = zbv_bubble(pp, F, B, W)
    dp_b = (pp - 1) * np.maximum(0.0, F + 2 * B - W - comm_hidden) / 2
    bubble_extra = np.where(sched == 3, zb, np.where(sched == 4, dp_b, 0.0))
    return np.where(pp == 1, Mp, fb + bubble_extra)
