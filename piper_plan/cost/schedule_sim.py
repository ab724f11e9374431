"""A pipeline schedule run action by action: the check on schedule.py's closed forms.

The planner prices a schedule in closed form (schedule.pipeline_time, plus the messages
estimate._p2p_steady_share hides). This module runs the schedule itself: each rank executes its
action list in order (`rank_orders`, the orders torch.distributed.pipelining builds), an action
starts when its rank is free and its input has arrived, and each stage-boundary message occupies
its directed link (sender rank -> receiver rank) for `msg` seconds, one message after another
(`simulate`). With `overlap` a sender goes on as soon as it has posted its send (torch's
_PipelineScheduleRuntime, Megatron-Core's overlap_p2p_comm); without it the sender waits until
its message is delivered. The receiver always waits for its input.

It loops over actions (a few thousand per layout), so it checks chosen layouts and the closed
forms (tests/test_schedule_sim.py, benchmarks/p2p_overlap.py); the search stays vectorised.
zbv_dag_bubble runs torch's ZB-V order without messages as a static graph, vectorised over
candidates, the reference for schedule.zbv_bubble's closed form.
Times are seconds; the same code takes milliseconds throughout.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

# ("F" | "B" | "I" | "W", virtual stage, micro-batch): forward, full backward, or a backward split
# into its input part (I) and its weight part (W), as zbv runs it
Action = tuple[str, int, int]


def rank_orders(schedule: str, pp: int, vpp: int, M: int) -> list[list[Action]]:
    """Each rank's actions in the order it runs them. Virtual stage s lives on rank s % pp.

    - gpipe: every forward, then every backward, both in micro-batch order (torch's ScheduleGPipe);
    - 1f1b: pp - 1 - rank warm-up forwards, then one forward one backward, then the rest;
    - interleaved: torch's ScheduleInterleaved1F1B (schedules._get_warmup_ops with
      multiply_factor 2, _get_1f1b_rank_ops without its idle slots): (vpp - 1)·round +
      2·(pp - 1 - rank) warm-up forwards, rounds of `round` micro-batches a chunk, where
      round = M // max(1, M // pp);
    - zbv: torch's ScheduleZBVZeroBubble (_calculate_single_rank_operations, its idle slots
      dropped), chunks rank and 2·pp - 1 - rank on each rank (the V), backwards split into I and W."""
    if schedule == "interleaved":
        return [_interleaved(pp, vpp, M, r) for r in range(pp)]
    if schedule == "zbv":
        if vpp != 2:
            raise ValueError(f"rank_orders: zbv runs two chunks a rank, got vpp {vpp}")
        return [_zbv(pp, M, r) for r in range(pp)]
    if vpp != 1:
        raise ValueError(f"rank_orders: {schedule} runs one chunk a rank, got vpp {vpp}")
    if schedule == "gpipe":
        return [[("F", r, m) for m in range(M)] + [("B", r, m) for m in range(M)] for r in range(pp)]
    if schedule == "1f1b":
        return [_one_f_one_b(min(M, pp - 1 - r), [(r, m) for m in range(M)], [(r, m) for m in range(M)])
                for r in range(pp)]
    raise ValueError(f"rank_orders: no action order for schedule {schedule!r} (gpipe, 1f1b or interleaved)")


def _interleaved(pp: int, vpp: int, M: int, r: int) -> list[Action]:
    rnd = M // max(1, M // pp)
    warm = min((vpp - 1) * rnd + 2 * (pp - 1 - r), M * vpp)
    # the k-th forward (backward) runs chunk (k // rnd) % vpp (backwards: from the last chunk) on
    # that chunk's next micro-batch, as torch counts them
    mb = [(k // (rnd * vpp)) * rnd + k % rnd for k in range(M * vpp)]
    fwds = [((k // rnd) % vpp * pp + r, mb[k]) for k in range(M * vpp)]
    bwds = [((vpp - 1 - (k // rnd) % vpp) * pp + r, mb[k]) for k in range(M * vpp)]
    return _one_f_one_b(warm, fwds, bwds)


def _zbv(pp: int, M: int, r: int) -> list[Action]:
    """Rank r's actions as torch's ScheduleZBVZeroBubble._calculate_single_rank_operations lists
    them (torch 2.13; tests/test_schedule_sim.py checks the installed one): it plans
    max(M, 2·pp - 1) micro-batches and drops those past M."""
    n = max(2 * pp - 1, M)
    c0, c1 = r, 2 * pp - 1 - r
    f0 = f1 = b0 = b1 = 0
    ops: list[Action] = []
    for _ in range(2 * (pp - r) - 1):  # warm-up: chunk 0's forwards, then both chunks', then chunk 1's
        ops.append(("F", c0, f0))
        f0 += 1
    for _ in range(r):
        ops += [("F", c1, f1), ("F", c0, f0)]
        f1, f0 = f1 + 1, f0 + 1
    for _ in range(pp - r):
        ops += [("F", c1, f1), ("I", c1, b1), ("W", c1, b1)]
        f1, b1 = f1 + 1, b1 + 1
    while f1 < f0 or f0 < n:  # steady state: F I W on chunk 0, then on chunk 1
        if f0 < n:
            ops.append(("F", c0, f0))
            f0 += 1
        ops += [("I", c0, b0), ("W", c0, b0), ("F", c1, f1), ("I", c1, b1), ("W", c1, b1)]
        b0, f1, b1 = b0 + 1, f1 + 1, b1 + 1
    w0, w1 = b0, b1
    for _ in range(r):  # cool-down: backward-input first, the weight passes after
        ops += [("I", c0, b0), ("I", c1, b1)]
        b0, b1 = b0 + 1, b1 + 1
    for _ in range(pp - r):
        ops += [("I", c0, b0), ("W", c0, w0)]
        b0, w0 = b0 + 1, w0 + 1
    ops += [("W", c1, m) for m in range(w1, b1)] + [("W", c0, m) for m in range(w0, b0)]
    return [a for a in ops if a[2] < M]


def _one_f_one_b(warm: int, fwds: list[tuple[int, int]], bwds: list[tuple[int, int]]) -> list[Action]:
    """`warm` forwards, then one forward one backward in turn, then the remaining backwards
    (fwds, bwds: each (stage, micro-batch) in the order the rank runs them)."""
    ops = [("F", *x) for x in fwds[:warm]]
    for f, b in zip(fwds[warm:], bwds):
        ops += [("F", *f), ("B", *b)]
    return ops + [("B", *x) for x in bwds[len(fwds) - warm:]]


def _input(kind: str, s: int, m: int, V: int) -> Action | None:
    """The action whose output (kind, s, m) needs, None for the first stage's forward: a forward
    the previous stage's, a backward (or its input part) the next stage's, or at the last stage
    its own forward; a weight pass its own input part."""
    if kind == "F":
        return ("F", s - 1, m) if s > 0 else None
    if kind == "W":
        return ("I", s, m)
    return (kind, s + 1, m) if s < V - 1 else ("F", s, m)


def _placement(orders: Sequence[Sequence[Action]]) -> dict[int, int]:
    """Each virtual stage's rank, as the orders place it (looped or V)."""
    return {s: r for r, ops in enumerate(orders) for _, s, _ in ops}


def simulate(orders: Sequence[Sequence[Action]], fwd, bwd, msg: float, overlap: bool = True,
             posted: Sequence[dict[Action, int]] | None = None, wgt=0.0) -> float:
    """Seconds from the first action to the last, and the last message's delivery.

    orders: rank_orders(...); fwd, bwd, wgt: seconds of one chunk's forward, backward (its input
    part where the backward is split) and backward-weight part for one
    micro-batch on each rank (scalars or length-pp sequences); msg: seconds a stage-boundary
    message holds its link. `posted` (with overlap; None: a message moves as soon as it is
    sent): per rank, for each action whose input crosses ranks, the index in that rank's order
    of the action before which its receive is posted; the transfer starts once the receive is
    posted too (a rendezvous, as NCCL's and gloo's send / receive pairs run), and the link then
    carries the messages in the order their receivers take them (benchmarks/p2p_overlap.py's
    torch_recv_posts reads them from torch's lowered schedule). A deadlocked order raises ValueError."""
    if posted is not None and not overlap:
        raise ValueError("simulate: posted receives need overlap (a waiting sender posts nothing ahead)")
    pp = len(orders)
    rank_of = _placement(orders)
    V = len(rank_of)
    fwd, bwd, wgt = (np.broadcast_to(np.asarray(x, float), (pp,)) for x in (fwd, bwd, wgt))
    took = {"F": fwd, "B": bwd, "I": bwd, "W": wgt}
    done: dict[Action, float] = {}     # action -> when its output is usable by its own rank
    arrives: dict[Action, float] = {}  # action -> when its output reaches the next stage's rank
    link_free: dict[tuple[int, int], float] = {}
    clock, nxt = [0.0] * pp, [0] * pp
    ends: list[list[float]] = [[] for _ in range(pp)]  # each rank's action ends, in its order
    remaining = sum(len(o) for o in orders)
    while remaining:
        moved = False
        for r in range(pp):
            while nxt[r] < len(orders[r]):
                kind, s, m = orders[r][nxt[r]]
                dep = _input(kind, s, m, V)
                if dep is not None and dep not in done:
                    break
                if dep is None or rank_of[dep[1]] == r:
                    ready = 0.0 if dep is None else done[dep]
                elif posted is None:
                    ready = arrives[dep]
                else:  # the transfer waits for the receive: posted once the rank ends the action before
                    j, link = posted[r][(kind, s, m)], (rank_of[dep[1]], r)
                    when = ends[r][j - 1] if j > 0 else 0.0
                    ready = arrives[dep] = link_free[link] = max(done[dep], when, link_free.get(link, 0.0)) + msg
                end = max(clock[r], ready) + took[kind][r]
                done[(kind, s, m)], clock[r] = end, end
                ends[r].append(end)
                to = s + 1 if kind == "F" else s - 1 if kind != "W" else -1  # a weight pass sends nothing
                if posted is None and 0 <= to < V and rank_of[to] != r:
                    link = (r, rank_of[to])
                    arrives[(kind, s, m)] = link_free[link] = max(end, link_free.get(link, 0.0)) + msg
                    if not overlap:
                        clock[r] = arrives[(kind, s, m)]
                nxt[r] += 1
                remaining -= 1
                moved = True
        if not moved:
            raise ValueError("simulate: the action orders deadlock (an action waits on one never run)")
    return max(clock + list(arrives.values()))


@functools.lru_cache(maxsize=None)
def _zbv_waves(pp: int):
    """torch's ZB-V order at M = 2·pp - 1 (its fewest micro-batches) as a static graph for
    zbv_dag_bubble: each action after its rank's previous one and after its input (_input).
    Returns (waves, nodes, ends): the actions numbered from 1 (0 is a zero start) in topological
    waves, each wave (start, stop, kind 0/1/2 for F/I/W, rank predecessors, cross-rank inputs or
    None); `ends` each rank's last action."""
    orders = rank_orders("zbv", pp, 2, 2 * pp - 1)
    rank_of, V = _placement(orders), 2 * pp
    index: dict[Action, int] = {}
    kind, preds, level = [], [], []
    nxt, last = [0] * pp, [-1] * pp
    remaining = sum(len(o) for o in orders)
    while remaining:  # the orders' own topological sweep, as simulate runs them
        for r, ops in enumerate(orders):
            while nxt[r] < len(ops):
                k, s, m = ops[nxt[r]]
                dep = _input(k, s, m, V)
                if dep is not None and dep not in index:
                    break
                # an input made on this rank ended before the rank's previous action did
                d = index[dep] if dep is not None and rank_of[dep[1]] != r else -1
                p = last[r]
                level.append(1 + max(level[p] if p >= 0 else 0, level[d] if d >= 0 else 0))
                index[(k, s, m)] = last[r] = len(kind)
                kind.append("FIW".index(k))
                preds.append((p, d))
                nxt[r] += 1
                remaining -= 1
    kind_a, pred, lev = np.array(kind), np.array(preds), np.array(level)
    cross = pred[:, 1] >= 0
    order = np.lexsort((cross, kind_a, lev))  # a wave's actions of one kind and one input shape, contiguous
    new = np.empty_like(order)
    new[order] = np.arange(1, len(order) + 1)
    pred = np.where(pred >= 0, new[np.maximum(pred, 0)], 0)[order]
    key = np.stack([lev[order], kind_a[order], cross[order]], axis=1)
    cuts = np.r_[0, np.flatnonzero(np.any(np.diff(key, axis=0) != 0, axis=1)) + 1, len(order)]
    waves = [(a + 1, z + 1, int(key[a, 1]), pred[a:z, 0], pred[a:z, 1] if key[a, 2] else None)
             for a, z in zip(cuts[:-1], cuts[1:])]
    return waves, len(order) + 1, new[np.array(last)]


def zbv_dag_bubble(pp: int, f, b, w, cells: int = 1 << 20) -> np.ndarray:
    """Seconds torch's ScheduleZBVZeroBubble idles a step beyond a rank's work, without messages:
    its critical path at M = 2·pp - 1 less that M's 2·M·(f + b + w). f, b, w: one chunk's
    forward, backward-input and backward-weight seconds a micro-batch, the same on every rank
    (arrays broadcast together; one graph walk for all). The actions' finish times are computed
    a wave at a time over every candidate, in blocks of about `cells` numbers. The bubble is the
    same for any M >= 2·pp - 1 (tests/test_schedule_sim.py)."""
    waves, nodes, ends = _zbv_waves(pp)
    t = np.stack(np.broadcast_arrays(*(np.asarray(x, float) for x in (f, b, w))))
    flat = t.reshape(3, -1)
    path = np.empty(flat.shape[1])
    step = max(1, cells // nodes)
    for j in range(0, flat.shape[1], step):
        dur = flat[:, j:j + step]
        fin = np.zeros((nodes, dur.shape[1]))
        for a, z, k, rank_pred, cross in waves:
            fin[a:z] = fin[rank_pred] if cross is None else np.maximum(fin[rank_pred], fin[cross])
            fin[a:z] += dur[k]
        path[j:j + step] = fin[ends].max(axis=0)
    return (path - 2 * (2 * pp - 1) * flat.sum(axis=0)).reshape(t.shape[1:])


def priced_step(schedule: str, pp: int, vpp: int, M: int, fwd_mb, bwd_mb, msg: float, overlap: bool = True) -> float:
    """The planner's closed form for the same pipeline (seconds): per rank, fwd_mb / bwd_mb are one
    micro-batch's forward and backward over all its chunks; each role's rank sends the messages
    of `msg` seconds estimate._p2p_sends counts, the interleaved steady state hides what
    estimate.p2p_hidden_mb hides where `overlap`, and schedule.pipeline_time runs over the
    busiest rank; the bubble keeps each other rank's hidden messages, as estimate does."""
    from ..layout import SCHEDULES, Layout
    from .batch import from_layouts
    from .estimate import _p2p_sends, _p2p_steady_share, p2p_hidden_mb
    from .schedule import pipeline_time

    fwd_mb, bwd_mb = (np.broadcast_to(np.asarray(x, float), (pp,)) for x in (fwd_mb, bwd_mb))
    lay = from_layouts([Layout(gpus=pp, pp=pp, dp=1, vpp=vpp, mbs=1, global_batch=M, seq=1, schedule=schedule,
                               p2p_overlap=overlap)])
    share, sends = _p2p_steady_share(lay), _p2p_sends(lay)
    roles = ["first"] + ["mid"] * (pp - 2) + ["last"] if pp > 1 else ["first"]
    on = [(float(sends[role][0][0]) * msg, float(sends[role][1][0]) * msg) for role in roles]
    hidden = np.array([float(p2p_hidden_mb(share[role][0], mf, mb, f, b))
                       for role, (mf, mb), f, b in zip(roles, on, fwd_mb, bwd_mb)])
    totals = fwd_mb + bwd_mb + np.array([mf + mb for mf, mb in on]) - hidden
    busiest = int(np.argmax(totals))
    z = np.zeros(1)
    step = pipeline_time(np.array([SCHEDULES.index(schedule)]), np.array([pp]), np.array([M]), np.array([vpp]),
                         z, z, z, np.array([totals[busiest]]), np.array([totals.sum()]))
    return float(step[0]) + (hidden.sum() - hidden[busiest]) / vpp
