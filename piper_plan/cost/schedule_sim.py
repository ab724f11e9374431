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
Times are seconds; the same code takes milliseconds throughout.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Action = tuple[str, int, int]  # ("F" | "B", virtual stage, micro-batch)


def rank_orders(schedule: str, pp: int, vpp: int, M: int) -> list[list[Action]]:
    """Each rank's actions in the order it runs them. Virtual stage s lives on rank s % pp.

    - gpipe: every forward, then every backward, both in micro-batch order (torch's ScheduleGPipe);
    - 1f1b: pp - 1 - rank warm-up forwards, then one forward one backward, then the rest;
    - interleaved: torch's ScheduleInterleaved1F1B (schedules._get_warmup_ops with
      multiply_factor 2, _get_1f1b_rank_ops without its idle slots): (vpp - 1)·round +
      2·(pp - 1 - rank) warm-up forwards, rounds of `round` micro-batches a chunk, where
      round = M // max(1, M // pp)."""
    if schedule == "interleaved":
        return [_interleaved(pp, vpp, M, r) for r in range(pp)]
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


def _one_f_one_b(warm: int, fwds: list[tuple[int, int]], bwds: list[tuple[int, int]]) -> list[Action]:
    """`warm` forwards, then one forward one backward in turn, then the remaining backwards
    (fwds, bwds: each (stage, micro-batch) in the order the rank runs them)."""
    ops = [("F", *x) for x in fwds[:warm]]
    for f, b in zip(fwds[warm:], bwds):
        ops += [("F", *f), ("B", *b)]
    return ops + [("B", *x) for x in bwds[len(fwds) - warm:]]


def simulate(orders: Sequence[Sequence[Action]], fwd, bwd, msg: float, overlap: bool = True,
             posted: Sequence[dict[Action, int]] | None = None) -> float:
    """Seconds from the first action to the last, and the last message's delivery.

    orders: rank_orders(...); fwd, bwd: seconds of one chunk's forward and backward for one
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
    V = 1 + max(s for o in orders for _, s, _ in o)
    fwd, bwd = (np.broadcast_to(np.asarray(x, float), (pp,)) for x in (fwd, bwd))
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
                dep = (("F", s - 1, m) if s > 0 else None) if kind == "F" else \
                      (("B", s + 1, m) if s < V - 1 else ("F", s, m))
                if dep is not None and dep not in done:
                    break
                if dep is None or dep[1] % pp == r:
                    ready = 0.0 if dep is None else done[dep]
                elif posted is None:
                    ready = arrives[dep]
                else:  # the transfer waits for the receive: posted once the rank ends the action before
                    j, link = posted[r][(kind, s, m)], (dep[1] % pp, r)
                    when = ends[r][j - 1] if j > 0 else 0.0
                    ready = arrives[dep] = link_free[link] = max(done[dep], when, link_free.get(link, 0.0)) + msg
                end = max(clock[r], ready) + (fwd[r] if kind == "F" else bwd[r])
                done[(kind, s, m)], clock[r] = end, end
                ends[r].append(end)
                to = s + 1 if kind == "F" else s - 1
                if posted is None and 0 <= to < V and to % pp != r:
                    link = (r, to % pp)
                    arrives[(kind, s, m)] = link_free[link] = max(end, link_free.get(link, 0.0)) + msg
                    if not overlap:
                        clock[r] = arrives[(kind, s, m)]
                nxt[r] += 1
                remaining -= 1
                moved = True
        if not moved:
            raise ValueError("simulate: the action orders deadlock (an action waits on one never run)")
    return max(clock + list(arrives.values()))


def priced_step(schedule: str, pp: int, vpp: int, M: int, fwd_mb, bwd_mb, msg: float, overlap: bool = True) -> float:
    """The planner's closed form for the same pipeline (seconds): per rank, fwd_mb / bwd_mb are one
    micro-batch's forward and backward over all its chunks; each role's rank sends the messages
    of `msg` seconds estimate._p2p_sends counts, the interleaved steady state hides what
    estimate.p2p_hidden_mb hides where `overlap`, and schedule.pipeline_time runs over the
    busiest rank; the bubble keeps the hidden share's messages, as estimate does."""
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
    return float(step[0]) + (pp - 1) / vpp * hidden[busiest]
