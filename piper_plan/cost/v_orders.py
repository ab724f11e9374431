"""torch's ZB-V and DualPipeV orders priced stage by stage, vectorised over layouts.

A V schedule's rank r runs virtual stages r and 2·pp - 1 - r (stages.rank_stages), so rank 0
holds the embedding's stage and the LM head's, and rank pp - 1 the two where the V turns. A
stage's seconds depend on its kind (stages.stage_kind) and its rank's role alone (rank 0, the
middle ranks as the representative one, rank pp - 1), as on the interleaved order
(interleaved.interleaved_pipe): v_pipe shares each role's windows among its two stages as their
compute and v_step walks the order with those figures. The closed forms (schedule.zbv_bubble,
dualpipev_bubble) read a rank's two chunks as halves, every rank alike: where the chunks differ
(a heavy LM head, the balanced split's larger middle chunks) they miss by -8 ... +8 %
(benchmarks/v_chunks.py).
"""
from __future__ import annotations

import functools

import numpy as np

from ..layout import SCHEDULES
from .batch import distinct_keys, distinct_rows, row_groups
from .schedule_sim import v_fewest, v_path
from .stages import kind_by_role, kind_role_rows, stage_kind, v_mid_rank

ZBV = SCHEDULES.index("zbv")


def v_step(sched, pp, M, F, I, W, H, rows=None) -> np.ndarray:  # noqa: E741
    """Seconds torch's zbv or dualpipev order (`sched`: layout.SCHEDULES' index) takes for M micro-batches (at least
    schedule_sim.v_fewest's), without messages, per layout: F, I, W, H [>= 2·pp, n] each virtual
    stage's forward, backward-input and weight-pass seconds of one micro-batch and what a
    dualpipev pair whose forward runs on it hides (schedule_sim.v_path); or, with `rows` = (maps
    [G, >= 2·pp], which [n]), [R, n] a few distinct figures, stage s of layout i reading row
    maps[which[i], s] (v_pipe: a stage's kind and its rank's role).

    The order's critical path at its fewest micro-batches (v_path), and past them each
    micro-batch the busiest rank's work (its two stages' forward, backward-input and weight pass;
    dualpipev: its two pairs, the steady state's floor). Never below the whole order, and equal to
    it on the balanced split's stages (benchmarks/v_chunks.py); on stages drawn at random from
    0.2-1.5 its steady state starts later and this reads up to 2.7 % over
    (tests/test_v_orders.py). Each distinct column priced once, one walk of each (schedule, pp)
    graph for all of its columns. Not rounded to a grid, as interleaved_step's are: the walk stays
    exactly monotone in every stage's seconds, and a V search prices few enough columns."""
    sched, pp, M = (np.asarray(x, int) for x in (sched, pp, M))
    fig = np.stack([np.asarray(x, float) for x in np.broadcast_arrays(F, I, W, H)])  # [4, R, n]
    maps, which = (np.arange(fig.shape[1])[None], np.zeros(len(pp), int)) if rows is None else rows
    _, first, pattern = distinct_rows(sched, pp, which)
    stages = maps[which[first]]  # [patterns, >= 2·pp]: each stage's row
    V = 2 * pp[first]
    used = np.zeros((len(first), fig.shape[1]), bool)
    for g, v in enumerate(V):
        used[g, stages[g, :v]] = True
    hide = np.clip(fig[3], 0.0, fig[0])  # a pair hides no more than its forward (v_path's floor)
    # the figures a layout's stages read, the others 0: its distinct columns walked once each
    figs = np.where(used[pattern].T[None], np.concatenate([fig[:3], hide[None]]), 0.0).reshape(-1, len(pp))
    one, back = distinct_keys(np.column_stack([pattern, figs.T]))
    path, busiest = np.empty(len(one)), np.empty(len(one))
    R = fig.shape[1]
    for f, cols in row_groups(sched[one], pp[one]):  # the columns that share a graph
        s, p, c = int(sched[one[f]]), int(pp[one[f]]), one[cols]
        at = stages[pattern[c], :2 * p].T  # [2·pp, columns]: each stage's row
        block = np.concatenate([figs[q * R + at, c] for q in range(4)])  # [4·2pp, columns]
        path[cols], busiest[cols] = _v_walk(s, p, block.tobytes(), block.shape)
    return path[back] + (M - v_fewest(sched == ZBV, pp)) * busiest[back]


@functools.lru_cache(maxsize=64)
def _v_walk(sched: int, pp: int, figs: bytes, shape: tuple) -> tuple:
    """(v_path, the busiest rank's work a micro-batch) on v_step's distinct columns of one graph
    (`figs`: their [4·2pp, columns] rows, each stage's F, then I, W and H), kept: validate and
    sweep price the same layouts again."""
    F, I, W, H = np.frombuffer(figs).reshape(shape).reshape(4, 2 * pp, -1)  # noqa: E741
    path = v_path("zbv" if sched == ZBV else "dualpipev", pp, F, I, W, H)
    if sched == ZBV:
        each = F + I + W
    else:  # the steady state runs pairs: stage s's forward beside its rank's other stage's backward
        back = (I + W)[::-1]
        each = np.maximum(F + back - H, np.maximum(F, back))
    return path, (each[:pp] + each[::-1][:pp]).max(axis=0)


def pair_hiding(a2a_f, a2a_b, comp_f, comp_b):
    """Seconds of exchange a dualpipev pair hides (arrays broadcast together): one micro-batch's
    forward chunk (compute comp_f, exchange a2a_f) beside another's backward chunk (comp_b,
    a2a_b, a re-run's included) hides each one's exchange behind the other's compute, never
    behind its own: a micro-batch's layers run in turn, each exchange between its own layers'
    compute (DeepSeek-V3 report, Fig. 4: the forward's dispatch and combine beside the backward's
    computation, and the backward's beside the forward's). min(a2a_f, comp_b) + min(a2a_b,
    comp_f), so the pair lasts at least its longer chunk, the floor the walk holds each pair to
    (schedule_sim.v_path). The whole micro-batch's compute had bounded it, min(a2a_f + a2a_b,
    comp_f + comp_b), which let a chunk's own compute hide its exchange."""
    return np.minimum(a2a_f, comp_b) + np.minimum(a2a_b, comp_f)


def v_pipe(sched, pp, M, n_hi, kinds, windows, hide) -> np.ndarray:
    """Seconds of the pipeline's part of a step under torch's zbv or dualpipev order (v_step), each
    virtual stage's forward, backward-input and weight pass its rank's role's (rank 0, the
    middle ranks as the representative one, rank pp - 1; `windows` (F, B, W) [roles, n] the
    role's pipeline windows a micro-batch, both chunks, estimate._window's) shared between the
    rank's two stages as their compute (`kinds` (forward, backward-input with recompute, weight
    pass) [4, n] each kind of stage's: interleaved.kind_phases; `n_hi` the larger middle stages,
    stages.stage_kind), and what a dualpipev pair hides (`hide` [roles, n]: seconds a
    micro-batch the role's rank's pairs save, both chunks) shared as their whole compute, the
    pair whose forward runs on stage s hiding stage s's share, so a rank's two pairs hide `hide`.
    The walk reads twelve figures of each a layout, row kind·3 + role."""
    pp = np.asarray(pp)
    V = 2 * pp
    ranks = np.stack([np.zeros_like(pp), v_mid_rank(n_hi, pp), pp - 1])  # [roles, n]
    k_lo, k_hi = stage_kind(ranks, V, n_hi), stage_kind(V - 1 - ranks, V, n_hi)
    held = lambda x: np.take_along_axis(x, k_lo, 0) + np.take_along_axis(x, k_hi, 0)  # noqa: E731
    rows = [kind_by_role(k, w / np.maximum(held(k), 1e-300)) for k, w in zip(kinds, windows)]
    whole = sum(kinds)
    rows_h = kind_by_role(whole, np.asarray(hide, float) / np.maximum(held(whole), 1e-300))
    return v_step(sched, pp, M, *rows, rows_h, kind_role_rows(pp, 2, n_hi, v_shape=True))
