"""Step time of a pipeline schedule from per-rank, per-micro-batch phase times.

F, B, W: forward, backward-input, backward-weight seconds of one micro-batch on a rank
(recompute included in B; a V rank's two chunks together); `peak` the busiest rank, `total` the
sum over ranks; v = vpp.

- gpipe, 1f1b:   Σ_r (F+B+W) + (M-1)·max_r (F+B+W)           (Narayanan 2021 §2.2: bubble (p-1)/m),
                 exact for gpipe, and for 1f1b where the last rank is the busiest; elsewhere the
                 ranks after the busiest one absorb part of the fill and drain, and
                 interleaved_step walks torch's Schedule1F1B order (its vpp-1 case)
- interleaved:   M·max + (Σ - max)/v                          (Narayanan 2021 §2.2.2, each rank's own
                 share of the fill and drain: (pp-1)·max/v on equal ranks), exact where every chunk
                 takes as long; interleaved_step walks torch's order where they differ
- zbv:           M·max + zbv_bubble: the idle time of torch's ScheduleZBVZeroBubble order, which
                 piper-train runs (cost/schedule_sim.zbv_dag_bubble walks it)
- dualpipev:     M·max + dualpipev_bubble: the idle time of torch's ScheduleDualPipeV order (DeepSeek's
                 DualPipeV steps 1-8; cost/schedule_sim.dualpipev_dag_bubble walks it): with f, b, w
                 a chunk's, max(2(pp-1)·f, (pp-2)·f + (pp-1)·b) + (pp-1)·max(0, b - w), less what
                 the rank's forward-backward pairs hide (h: DeepSeek's DualPipe and Megatron-Core
                 overlap each pair; piper-train runs the two in turn, h 0). DualPipe's README
                 (PP/2-1)(F&B + B - 3W), PP = 2·pp, is its value where f = b >= w.
                 Both closed forms are exact where every chunk takes as long; estimate walks the
                 V orders stage by stage (v_orders.v_step), where chunks and ranks differ, and
                 where a dualpipev pair is bound by its longer half (it hides at most its
                 shorter one, which the steady state's M·max does not see)
The V schedules' F, B, W (and h) cover a rank's two chunks: their bubbles read a chunk's, half.
"""
from __future__ import annotations

import functools

import numpy as np

from .batch import distinct_keys, distinct_rows, row_groups
from .schedule_sim import interleaved_path


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


def dualpipev_bubble(pp, F, B, W, hidden=0.0, unpaired=None):
    """Seconds torch's ScheduleDualPipeV leaves a rank idle a step beyond its own work, for any M >=
    2·pp. F, B, W: a rank's forward, backward-input and backward-weight seconds a micro-batch
    (both chunks; arrays broadcast together); with f, b, w a chunk's (half), every rank with these
    times, the critical path of the order less 2M·(f + b + w) is
    max(2(pp-1)·f, (pp-2)·f + (pp-1)·b) + (pp-1)·max(0, b - w), four linear pieces
    (schedule_sim.dualpipev_dag_bubble walks the graph; tests/test_schedule_sim.py holds them equal
    on every (f, b, w) for pp 2-16, 24, 32, 64). It is never below (pp-1)·F: the last rank waits
    (pp-1)·f for its first input and as long for its last backwards, which come back only after
    the last micro-batch's forward has run down the V's other arm, a pair on each rank before it
    (torch sends a pair's forward output once its backward is done too).

    hidden: the exchange seconds a micro-batch that a rank's forward-backward pairs hide (both
    chunks: each pair, a chunk's forward beside another micro-batch's chunk backward, runs
    hidden/2 shorter than the two in turn, never shorter than the longer of them, the pair's
    synchronous floor). The critical path runs 2M - pp - 2 pairs; a rank runs 2M - unpaired
    (`unpaired`: its chunk forwards outside a pair, torch's 3pp - 1 - rank, one more on the last
    rank; default the last rank's 2pp + 1), so its idle time is the above less
    (unpaired - pp - 2)·hidden/2, the README's (pp-1)·h/2 on the last rank: M micro-batches of the
    rank's work, its own pairs' hiding taken off (estimate._paired_share), plus this is the
    critical path. The wait for the first input runs before any pair, so the last rank's stays at
    least (pp-1)·F/2."""
    p = np.asarray(pp, float)
    f, b, w = (np.asarray(x, float) / 2 for x in (F, B, W))
    sync = np.maximum(2 * (p - 1) * f, (p - 2) * f + (p - 1) * b) + (p - 1) * np.maximum(0.0, b - w)
    pair_hides = np.minimum(np.asarray(hidden, float) / 2, np.minimum(f, b + w))
    u = 2 * p + 1 if unpaired is None else np.asarray(unpaired, float)
    return sync - (u - p - 2) * pair_hides


def interleaved_step(pp, vpp, M, F, B, rows=None) -> np.ndarray:
    """Seconds torch's ScheduleInterleaved1F1B order takes for M micro-batches (a multiple of pp),
    or at vpp 1 its Schedule1F1B order (any M; schedule_sim.interleaved_path),
    without messages, per layout: F, B [>= pp·vpp, n] each virtual stage's forward and backward
    seconds of one micro-batch (stage s on rank s % pp); or, with `rows` = (maps [G, >= pp·vpp],
    which [n]), F, B [R, n] a few distinct figures, stage s of layout i taking row maps[which[i], s]
    (interleaved.interleaved_pipe: a stage's kind and its rank's role). pipeline_time's closed form
    is exact where every chunk takes as long; where they differ (the balanced split's early chunks
    hold a layer more, stages.materialise; the ends hold the embedding and the LM head) the fill
    runs through the larger chunks, and a rank's forward of one chunk and backward of another,
    paired in its steady state, take unequal turns that the ranks before and after it wait on: 48
    layers on pp 8 x vpp 4, M 16, the order takes 12.7 % longer than the closed form, and a rank
    whose chunks are lighter than the busiest one's shortens it.

    The order's critical path (schedule_sim.interleaved_path) at min(M, 3pp) micro-batches, and past
    them each micro-batch the busiest rank's work (the steady state's floor): on the
    balanced split's chunks of 24-126 layers, pp 2-8, vpp 2-4, M up to 16pp, within -1.6 ... +1.4 %
    of the whole order where chunks hold two layers or more on average, -10 ... +0.1 % below (the
    steady state's own excess there; tests/test_schedule_sim.py). The closed form erred by
    -9 ... +7 % and -20 ... +7 %. 1F1B on those splits (pp 2-32, M 1-16pp): 0 ... +0.07 % of its
    whole order, where Σ + (M - 1)·max erred by up to +22 %. Monotone in every stage's seconds, as
    the order is. Each distinct column priced once, its seconds rounded up to 1/4096 of the power
    of two at or above its largest stage (about 0.05 % more, up to 0.1 % where most stages are far
    shorter than the largest); one walk of each (pp, vpp, micro-batches walked) graph for all of
    its columns, whichever map of rows they read."""
    pp, vpp, M = (np.asarray(x, int) for x in (pp, vpp, M))
    F, B = np.asarray(F, float), np.asarray(B, float)
    maps, which = (np.arange(len(F))[None], np.zeros(len(pp), int)) if rows is None else rows
    j = np.minimum(M, 3 * pp)  # micro-batches walked
    _, first, pattern = distinct_rows(pp, vpp, which)
    stages, used, ranks = _patterns(pp[first], vpp[first], maps, which[first], len(F))
    fb = F + B
    u = used[pattern].T  # [R, n]: the rows a layout's stages read
    # each second up to the next 1/4096 of a power of two at least the column's largest stage: the
    # grid coarsens only by halves, so a longer stage never rounds shorter
    grid = 2.0 ** np.ceil(np.log2(np.max(np.where(u, fb, 0.0), axis=0))) / 4096
    # a code is at most 4096 (no stage exceeds its column's largest): two bytes each keep the keys
    # below, hashed and sorted, short
    small = np.int16 if len(first) < 2 ** 15 else np.int32
    codes = np.where(np.vstack([u, u]), np.ceil(np.vstack([F, B]) / grid - 1e-9), 0.0).astype(small)
    # the distinct (pattern, micro-batches walked, codes) columns: each one's as one opaque key, sorted once
    one, back = distinct_keys(np.column_stack([pattern, j, codes.T]).astype(small))
    walked = np.empty(len(one))
    # the columns that share a graph, (pp, vpp, micro-batches walked): stage s of column c reads its pattern's row
    for f, cols in row_groups(pp[one], vpp[one], j[one]):
        p, v, c = int(pp[one[f]]), int(vpp[one[f]]), one[cols]
        block = codes[stages[pattern[c], :2 * p * v].T, c]  # [2·pp·vpp, columns]
        walked[cols] = _interleaved_walk(p, v, int(j[one[f]]), block.tobytes(), block.shape, small)
    # the steady state's floor: the busiest rank's work a micro-batch, its stages' rows counted
    busiest = np.einsum("nkr,rn->nk", ranks[pattern], fb).max(axis=1)
    return walked[back] * grid + (M - j) * busiest


def _patterns(pp, vpp, maps, which, R: int) -> tuple:
    """For each distinct (pp, vpp, map) of interleaved_step: the rows of F, B its stages' forwards,
    then backwards, read ([patterns, 2·max pp·vpp] indices into the [2R] rows; a pattern's first
    2·pp·vpp are its own), which of the R rows they read ([patterns, R] bool), and each distinct
    rank's count of its stages on each row ([patterns, ranks, R], zero-padded)."""
    each = [_pattern(p, v, tuple(maps[w, :p * v].tolist()), R) for p, v, w in zip(pp.tolist(), vpp.tolist(),
                                                                                  which.tolist())]
    stages = np.zeros((len(each), 2 * max((len(at) for at, _ in each), default=0)), int)
    used = np.zeros((len(each), R), bool)
    ranks = np.zeros((len(each), max((len(c) for _, c in each), default=0), R))
    for g, (at, c) in enumerate(each):
        stages[g, :2 * len(at)] = np.concatenate([at, R + at])
        used[g, at] = True
        ranks[g, :len(c)] = c  # a row of zeros is no rank's work, never the busiest
    return stages, used, ranks


@functools.lru_cache(maxsize=1024)
def _pattern(pp: int, vpp: int, at: tuple, R: int) -> tuple:
    """_patterns' for one: the rows `at` its stages read, and each distinct rank's count of its
    stages on each of the R rows."""
    at = np.asarray(at)
    c = np.zeros((pp, R))
    np.add.at(c, (np.arange(pp * vpp) % pp, at), 1.0)
    return at, np.unique(c, axis=0)


@functools.lru_cache(maxsize=1024)
def _interleaved_walk(pp: int, vpp: int, M: int, codes: bytes, shape: tuple, dtype) -> np.ndarray:
    """schedule_sim.interleaved_path on interleaved_step's distinct columns of one graph (`codes`:
    their [2·pp·vpp, columns] `dtype` rows, each virtual stage's forward, then its backward, in its
    column's grid), kept: validate and sweep price the same layouts again."""
    c = np.frombuffer(codes, dtype).reshape(shape).astype(float)
    return interleaved_path(pp, vpp, M, c[:pp * vpp], c[pp * vpp:])


def pipeline_time(sched, pp, M, vpp, F, B, W, peak_sum, total_sum, comm_hidden=None, paired=None):
    """Seconds for the forward/backward part of one step. `peak_sum` is max_r (F+B+W) and
    `total_sum` Σ_r (F+B+W); F, B, W are the peak rank's. dualpipev: `comm_hidden` the exchange
    seconds a micro-batch its forward-backward pairs hide, `paired` the share of the rank's chunks
    in a pair (estimate._paired_share; dualpipev_bubble)."""
    pp = pp.astype(float)
    M = M.astype(float)
    v = vpp.astype(float)
    Mp = M * peak_sum
    # the interleaved fill and drain: every rank's chunk once, the busiest one's in the steady state
    fb = np.where(sched <= 1, total_sum + (M - 1) * peak_sum, np.where(sched == 2, Mp + (total_sum - peak_sum) / v, Mp))
    hidden = 0.0 if comm_hidden is None else comm_hidden
    unpaired = None if paired is None else 2 * M * (1 - paired)
    zb = zbv_bubble(pp, F, B, W)
    dp_b = dualpipev_bubble(pp, F, B, W, hidden, unpaired)
    bubble_extra = np.where(sched == 3, zb, np.where(sched == 4, dp_b, 0.0))
    return np.where(pp == 1, Mp, fb + bubble_extra)
