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
zbv_dag_bubble and dualpipev_dag_bubble run torch's ZB-V and DualPipeV orders without messages
as a static graph, vectorised over candidates, the references for schedule.zbv_bubble's and
schedule.dualpipev_bubble's closed forms.
Times are seconds; the same code takes milliseconds throughout.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

# ("F" | "B" | "I" | "W", virtual stage, micro-batch): forward, full backward, or a backward split
# into its input part (I) and its weight part (W), as zbv runs it
Action = tuple[str, int, int]
# what a rank runs in one go: an action, or dualpipev's overlapped pair (a forward, then another
# micro-batch's full backward: torch's OVERLAP_F_B, whose outputs are sent once both are done)
Op = Action | tuple[Action, Action]


def rank_orders(schedule: str, pp: int, vpp: int, M: int) -> list[list[Op]]:
    """Each rank's actions in the order it runs them. Virtual stage s lives on rank s % pp.

    - gpipe: every forward, then every backward, both in micro-batch order (torch's ScheduleGPipe);
    - 1f1b: pp - 1 - rank warm-up forwards, then one forward one backward, then the rest;
    - interleaved: torch's ScheduleInterleaved1F1B, as interleaved_positions places it: rounds of
      M // max(1, M // pp) micro-batches a chunk after (vpp - 1) rounds + 2·(pp - 1 - rank) warm-up
      forwards;
    - zbv: torch's ScheduleZBVZeroBubble (_calculate_single_rank_operations, its idle slots
      dropped), chunks rank and 2·pp - 1 - rank on each rank (the V), backwards split into I and W;
    - dualpipev: torch's ScheduleDualPipeV (DeepSeek's DualPipeV order), on the same V: full
      backwards (B), split ones (I, W) and overlapped pairs ((F, B) tuples, its OVERLAP_F_B)."""
    if schedule == "interleaved":
        return [_interleaved(pp, vpp, M, r) for r in range(pp)]
    if schedule in ("zbv", "dualpipev"):
        if vpp != 2:
            raise ValueError(f"rank_orders: {schedule} runs two chunks a rank, got vpp {vpp}")
        if schedule == "dualpipev" and M < 2 * pp:
            raise ValueError(f"rank_orders: dualpipev needs M >= 2·pp micro-batches, got {M} at pp {pp}")
        return [(_zbv if schedule == "zbv" else _dualpipev)(pp, M, r) for r in range(pp)]
    if vpp != 1:
        raise ValueError(f"rank_orders: {schedule} runs one chunk a rank, got vpp {vpp}")
    if schedule == "gpipe":
        return [[("F", r, m) for m in range(M)] + [("B", r, m) for m in range(M)] for r in range(pp)]
    if schedule == "1f1b":
        return [_one_f_one_b(min(M, pp - 1 - r), [(r, m) for m in range(M)], [(r, m) for m in range(M)])
                for r in range(pp)]
    raise ValueError(f"rank_orders: no action order for schedule {schedule!r}")


def _interleaved(pp: int, vpp: int, M: int, r: int) -> list[Action]:
    """Rank r's order, as interleaved_positions places its forwards and backwards."""
    (f_pos, f_stage, f_mb), (b_pos, b_stage, b_mb) = interleaved_positions(pp, vpp, M)
    ops: list[Action] = [("F", 0, 0)] * (2 * M * vpp)
    for pos, kind, stage, mb in ((f_pos, "F", f_stage, f_mb), (b_pos, "B", b_stage, b_mb)):
        for at, st, m in zip(pos[r].tolist(), stage[r].tolist(), mb[r].tolist()):
            ops[at] = (kind, st, m)
    return ops


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


def _dualpipev(pp: int, M: int, r: int) -> list[Op]:
    """Rank r's ops as torch's ScheduleDualPipeV._calculate_single_rank_operations lists them
    (torch 2.13, DeepSeek's dualpipev.py steps 1-8; tests/test_schedule_sim.py checks the installed
    one). A micro-batch index counts per chunk and kind: a full backward takes the next backward
    index, and a weight pass runs the oldest split backward not yet weighed."""
    c0, c1 = r, 2 * pp - 1 - r
    fwd, bwd = {c0: 0, c1: 0}, {c0: 0, c1: 0}
    pending: list[tuple[int, int]] = []  # split backwards whose weight pass is still to run
    ops: list[Op] = []

    def f(c):
        fwd[c] += 1
        return ("F", c, fwd[c] - 1)

    def b(c, kind="B"):
        bwd[c] += 1
        if kind == "I":
            pending.append((c, bwd[c] - 1))
        return (kind, c, bwd[c] - 1)

    def weigh():
        if pending:
            ops.append(("W", *pending.pop(0)))

    ops += [f(c0) for _ in range(2 * (pp - r - 1))]  # 1: chunk 0's forwards
    for _ in range(r + 1):  # 2: both chunks' forwards
        ops += [f(c0), f(c1)]
    for _ in range(pp - r - 1):  # 3: zero bubble on chunk 1
        ops.append(b(c1, "I"))
        weigh()
        ops.append(f(c1))
    for i in range(M - 2 * pp + r + 1):  # 4: the main step, a forward beside a backward
        # the last rank runs its first pair's two halves apart (torch: "to further reduce bubble size")
        ops += [f(c0), b(c1)] if i == 0 and r == pp - 1 else [(f(c0), b(c1))]
        ops.append((f(c1), b(c0)))
    for _ in range(pp - r - 1):  # 5
        ops += [b(c1), (f(c1), b(c0))]
    split = False
    for i in range(r + 1):  # 6: both chunks' backwards, split from the middle on
        split |= i == (r + 1) // 2 and r % 2 == 1
        ops.append(b(c1, "I" if split else "B"))
        split |= i == (r + 1) // 2 and r % 2 == 0
        ops.append(b(c0, "I" if split else "B"))
    for _ in range(pp - r - 1):  # 7
        weigh()
        ops.append(b(c0, "I" if split else "B"))
    for _ in range(r + 1):  # 8: the weight passes left
        weigh()
    return ops


def _one_f_one_b(warm: int, fwds: list[tuple[int, int]], bwds: list[tuple[int, int]]) -> list[Action]:
    """`warm` forwards, then one forward one backward in turn, then the remaining backwards
    (fwds, bwds: each (stage, micro-batch) in the order the rank runs them)."""
    ops = [("F", *x) for x in fwds[:warm]]
    for f, b in zip(fwds[warm:], bwds):
        ops += [("F", *f), ("B", *b)]
    return ops + [("B", *x) for x in bwds[len(fwds) - warm:]]


def _parts(op: Op) -> tuple[Action, ...]:
    """An op's actions: itself, or an overlapped pair's forward and backward."""
    return op if isinstance(op[0], tuple) else (op,)


def _made(a: Action) -> Action:
    """The output an action makes, as _input names it: a backward's input gradient ("B") whether
    the backward is full (B) or split (its input part, I); dualpipev runs both."""
    return ("B", a[1], a[2]) if a[0] == "I" else a


def _input(kind: str, s: int, m: int, V: int) -> Action | None:
    """The output (named as _made names it) that action (kind, s, m) needs, None for the first
    stage's forward: a forward the previous stage's, a backward (full or its input part) the next
    stage's, or at the last stage its own forward; a weight pass its own input part."""
    if kind == "F":
        return ("F", s - 1, m) if s > 0 else None
    if kind == "W":
        return ("B", s, m)
    return ("B", s + 1, m) if s < V - 1 else ("F", s, m)


def _placement(orders: Sequence[Sequence[Op]]) -> dict[int, int]:
    """Each virtual stage's rank, as the orders place it (looped or V)."""
    return {s: r for r, ops in enumerate(orders) for op in ops for _, s, _ in _parts(op)}


def simulate(orders: Sequence[Sequence[Op]], fwd, bwd, msg: float, overlap: bool = True,
             posted: Sequence[dict[Action, int]] | None = None, wgt=0.0, hide: float = 0.0) -> float:
    """Seconds from the first action to the last, and the last message's delivery.

    orders: rank_orders(...); fwd, bwd, wgt: seconds of one chunk's forward, backward-input part
    and backward-weight part for one micro-batch on each rank (scalars or length-pp sequences) or
    of each virtual stage (length-pp·vpp sequences, where pp·vpp differs from pp); a
    full backward (B) takes bwd + wgt, so where no backward is split bwd is the whole of it and
    wgt 0. An overlapped pair (dualpipev) runs its forward and full backward as one op, `hide`
    seconds shorter than the two in turn (the exchange each hides behind the other's compute; 0
    where they run in turn, as torch's runtime runs them), never shorter than the longer of the
    two, and sends both outputs when it ends. msg: seconds a stage-boundary
    message holds its link. `posted` (with overlap; None: a message moves as soon as it is
    sent): per rank, for each action whose input crosses ranks, the index in that rank's order
    of the op before which its receive is posted; the transfer starts once the receive is
    posted too (a rendezvous, as NCCL's and gloo's send / receive pairs run), and the link then
    carries the messages in the order their receivers take them (benchmarks/p2p_overlap.py's
    torch_recv_posts reads them from torch's lowered schedule). A deadlocked order raises ValueError."""
    if posted is not None and not overlap:
        raise ValueError("simulate: posted receives need overlap (a waiting sender posts nothing ahead)")
    pp = len(orders)
    rank_of = _placement(orders)
    V = len(rank_of)
    on = np.array([rank_of[s] for s in range(V)])
    # per rank (every chunk of a rank alike) or per virtual stage
    fwd, bwd, wgt = (np.asarray(x, float) for x in (fwd, bwd, wgt))
    fwd, bwd, wgt = (x if x.shape == (V,) else np.broadcast_to(x, (pp,))[on] for x in (fwd, bwd, wgt))
    took = {"F": fwd, "B": bwd + wgt, "I": bwd, "W": wgt}
    done: dict[Action, float] = {}     # output (_made) -> when it is usable by its own rank
    arrives: dict[Action, float] = {}  # output (_made) -> when it reaches the next stage's rank
    link_free: dict[tuple[int, int], float] = {}
    clock, nxt = [0.0] * pp, [0] * pp
    ends: list[list[float]] = [[] for _ in range(pp)]  # each rank's op ends, in its order
    remaining = sum(len(o) for o in orders)
    while remaining:
        moved = False
        for r in range(pp):
            while nxt[r] < len(orders[r]):
                acts = _parts(orders[r][nxt[r]])
                deps = [_input(*a, V) for a in acts]
                if any(dep is not None and dep not in done for dep in deps):
                    break
                ready = 0.0
                for a, dep in zip(acts, deps):
                    if dep is None or rank_of[dep[1]] == r:
                        at = 0.0 if dep is None else done[dep]
                    elif posted is None:
                        at = arrives[dep]
                    else:  # the transfer waits for the receive: posted once the rank ends the op before
                        j, link = posted[r][a], (rank_of[dep[1]], r)
                        when = ends[r][j - 1] if j > 0 else 0.0
                        at = arrives[dep] = link_free[link] = max(done[dep], when, link_free.get(link, 0.0)) + msg
                    ready = max(ready, at)
                each = [took[k][s] for k, s, _ in acts]
                end = max(clock[r], ready) + (each[0] if len(acts) == 1 else max(sum(each) - hide, *each))
                clock[r] = end
                ends[r].append(end)
                for kind, s, m in acts:
                    done[_made((kind, s, m))] = end
                    to = s + 1 if kind == "F" else s - 1 if kind != "W" else -1  # a weight pass sends nothing
                    if posted is None and 0 <= to < V and rank_of[to] != r:
                        link = (r, rank_of[to])
                        # a waiting sender sends a pair's second output once its first is delivered
                        t = max(clock[r], link_free.get(link, 0.0)) + msg
                        arrives[_made((kind, s, m))] = link_free[link] = t
                        if not overlap:
                            clock[r] = t
                nxt[r] += 1
                remaining -= 1
                moved = True
        if not moved:
            raise ValueError("simulate: the action orders deadlock (an action waits on one never run)")
    return max(clock + list(arrives.values()))


# the kinds of op the graph walk prices: forward, backward-input, weight pass, full backward, overlapped pair
KINDS = "FIWBP"


def _graph(orders: Sequence[Sequence[Op]]):
    """The orders as a static graph, each op after its rank's previous one and after its inputs
    (_input), numbered from 1 (0 is a zero start) in the orders' own topological sweep, as
    simulate runs them. Returns (kind (index in KINDS), stage (a pair's: its forward's), preds
    [ops, 3]: the rank's previous op, then the inputs made on other ranks, -1 where none; level,
    last: each rank's last op, work [pp, len(KINDS)]: how many ops of each kind each rank runs)."""
    pp = len(orders)
    rank_of = _placement(orders)
    V = len(rank_of)
    index: dict[Action, int] = {}
    kind, stage, preds, level = [], [], [], []
    work = np.zeros((pp, len(KINDS)), int)
    nxt, last = [0] * pp, [-1] * pp
    remaining = sum(len(o) for o in orders)
    while remaining:
        for r, ops in enumerate(orders):
            while nxt[r] < len(ops):
                acts = _parts(ops[nxt[r]])
                deps = [_input(*a, V) for a in acts]
                if any(d is not None and d not in index for d in deps):
                    break
                # an input made on this rank ended before the rank's previous op did
                p = [last[r]] + sorted({index[d] for d in deps if d is not None and rank_of[d[1]] != r})
                level.append(1 + max(level[q] if q >= 0 else 0 for q in p))
                for a in acts:
                    index[_made(a)] = len(kind)
                last[r] = len(kind)
                kind.append(KINDS.index("P" if len(acts) == 2 else acts[0][0]))
                stage.append(acts[0][1])
                work[r, kind[-1]] += 1
                preds.append(p + [-1] * (3 - len(p)))
                nxt[r] += 1
                remaining -= 1
    return np.array(kind), np.array(stage), np.array(preds), np.array(level), np.array(last), work


def _grouped(keys: tuple, pred: np.ndarray, level: np.ndarray, last: np.ndarray, every: bool = False):
    """Ops renumbered in topological waves of one value of each of `keys` (arrays over the ops;
    level first): (waves, nodes, ends, order); a wave (start, stop, its keys' values, its ops'
    predecessors [k, ops]). `every`: each op reads all of pred's columns, a missing one the zero
    start (fewer, wider waves)."""
    width = (pred >= 0).sum(axis=1) + (pred[:, 0] < 0)  # a rank's first op: the zero start and its input
    width = np.full_like(width, pred.shape[1]) if every else width
    order = np.lexsort((width, *keys[::-1], level))  # a wave's ops of one key and one input count, contiguous
    new = np.empty_like(order)
    new[order] = np.arange(1, len(order) + 1)
    pred = np.where(pred >= 0, new[np.maximum(pred, 0)], 0)[order]
    key = np.stack([level[order], *(k[order] for k in keys), width[order]], axis=1)
    cuts = np.r_[0, np.flatnonzero(np.any(np.diff(key, axis=0) != 0, axis=1)) + 1, len(order)]
    waves = [(a + 1, z + 1, key[a, 1:-1], pred[a:z, :key[a, -1]].T) for a, z in zip(cuts[:-1], cuts[1:])]
    return waves, len(order) + 1, new[last], order


@functools.lru_cache(maxsize=None)
def _waves(schedule: str, pp: int):
    """torch's zbv or dualpipev order at its fewest micro-batches (2·pp - 1, 2·pp) as a static
    graph for _dag_path (_graph), in topological waves of one kind of op each. Returns (waves,
    nodes, ends, work): a wave (start, stop, kind (index in KINDS), its ops' predecessors [k,
    ops]); `ends` each rank's last op; `work` [pp, len(KINDS)] how many ops of each kind each
    rank runs."""
    kind, _, pred, level, last, work = _graph(rank_orders(schedule, pp, 2, int(v_fewest(schedule == "zbv", pp))))
    waves, nodes, ends, _ = _grouped((kind,), pred, level, last)
    return [(a, z, int(k[0]), p) for a, z, k, p in waves], nodes, ends, work


def v_fewest(zbv, pp) -> np.ndarray:
    """The fewest micro-batches torch's zbv (`zbv` true: 2·pp - 1) or dualpipev (2·pp) order runs
    (arrays broadcast together)."""
    return 2 * np.asarray(pp) - np.asarray(zbv, int)


def _v_graph(schedule: str, pp: int):
    """_graph's (kind, stage, preds [ops, 3], level, last) for torch's zbv or dualpipev order at its
    fewest micro-batches, from arrays over all ops at once rather than swept op by op (_graph: 0.4
    s for both orders at pp 64, a first search's share), the levels set as the interleaved
    order's (_levels) over each rank's ops padded to the longest rank's, the padding dropped after."""
    M = int(v_fewest(schedule == "zbv", pp))
    V = 2 * pp
    orders = rank_orders(schedule, pp, 2, M)
    n = max(len(o) for o in orders)
    code = {k: i for i, k in enumerate(KINDS)}
    acts = np.full((pp, n, 2, 3), -1)  # each op's actions (kind, stage, micro-batch); a lone one's second -1
    none = ("", -1, -1)
    code[""] = -1
    for r, ops in enumerate(orders):
        for j, part in enumerate(zip(*(op if type(op[0]) is tuple else (op, none) for op in ops))):
            acts[r, :len(ops), j] = [(code[k], s, m) for k, s, m in part]
    real = acts[:, :, 0, 0] >= 0
    k, s, m = acts[..., 0], acts[..., 1], acts[..., 2]
    node = np.arange(pp * n).reshape(pp, n, 1)
    # the output each action makes (_made: an input part's is its backward's), numbered forward
    # (stage, micro-batch), then backward; a weight pass's none anyone waits on
    made = np.where(k == code["F"], 0, V * M) + s * M + m
    made = np.where((k >= 0) & (k != code["W"]), made, -1)
    maker = np.full(2 * V * M, -1)
    maker[made[made >= 0]] = np.broadcast_to(node, made.shape)[made >= 0]
    # the input each needs (_input): a forward the previous stage's, a backward the next stage's
    # (the last stage's its own forward, on its own rank); a weight pass its own rank's input part
    need = np.where(k == code["F"], np.where(s > 0, (s - 1) * M + m, -1),
                    np.where(s < V - 1, V * M + (s + 1) * M + m, -1))
    need = np.where((k >= 0) & (k != code["W"]), need, -1)
    src = np.where(need >= 0, maker[np.maximum(need, 0)], -1)
    rank = np.arange(pp)[:, None, None]
    cross = np.where((src >= 0) & (src // n != rank), src, -1).reshape(pp * n, 2)
    level = _levels(pp, n, cross)
    keep = real.ravel()
    new = np.cumsum(keep) - 1  # the real ops renumbered
    prev = np.where(np.arange(pp * n) % n > 0, new[np.arange(pp * n) - 1], -1)
    pred = np.column_stack([prev, np.where(cross >= 0, new[np.maximum(cross, 0)], -1)])[keep]
    kind = np.where(k[..., 1] >= 0, code["P"], k[..., 0]).ravel()[keep]
    last = new[np.arange(pp) * n + real.sum(axis=1) - 1]
    return kind, s[..., 0].ravel()[keep], pred, level[keep], last


@functools.lru_cache(maxsize=None)
def _v_waves(schedule: str, pp: int):
    """torch's zbv or dualpipev order at its fewest micro-batches as _waves gives it, but by
    level alone, each op's row in v_path's durations: its kind's block (KINDS order) of 2·pp
    rows, the row of its stage (a pair's: its forward's)."""
    kind, stage, pred, level, last = _v_graph(schedule, pp)
    waves, nodes, ends, order = _grouped((), pred, level, last, every=True)
    row = kind * 2 * pp + stage
    return [(a, z, row[order[a - 1:z - 1]], p) for a, z, _, p in waves], nodes, ends


def v_path(schedule: str, pp: int, F, I, W, H=0.0) -> np.ndarray:
    """Seconds from the first action to the last of torch's zbv or dualpipev order at its fewest
    micro-batches (v_fewest) without messages (simulate's, at msg 0), for each column of F, I, W,
    H ([2·pp, n]: each virtual stage's forward, backward-input and weight-pass seconds of one
    micro-batch, and what an overlapped pair whose forward runs on that stage hides: the pair, a
    forward on stage s beside the backward of the rank's other stage 2·pp - 1 - s, lasts the two
    in turn less that, never less than the longer; simulate's `hide` per pair). One walk of the
    order's graph for every column."""
    F, I, W, H = np.broadcast_arrays(*(np.asarray(x, float) for x in (F, I, W, H)))
    back = (I + W)[::-1]  # the backward beside stage s's forward: the rank's other stage's
    pair = np.maximum(F + back - H, np.maximum(F, back))
    waves, nodes, ends = _v_waves(schedule, pp)
    return _walk(waves, nodes, ends, np.concatenate([F, I, W, I + W, pair]), 1 << 22)


def interleaved_positions(pp: int, vpp: int, M: int, extra: int = 0):
    """torch's ScheduleInterleaved1F1B order (schedules._get_warmup_ops with multiply_factor 2,
    _get_1f1b_rank_ops without its idle slots) by arithmetic, every rank at once: (forward,
    backward), each ([pp, n] position in the rank's order, virtual stage, micro-batch) of the
    rank's i-th forward (backward), n = M·vpp. Micro-batches go in rounds of
    round = M // max(1, M // pp) (pp where M is a multiple of pp, as Megatron needs): the i-th
    forward runs chunk (i // round) % vpp (a backward, from the last chunk) on that chunk's next
    micro-batch, at position i, or w + 2(i - w) past the rank's w = (vpp - 1)·round + 2(pp - 1 - r)
    warm-up forwards (`extra` more: Megatron-Core's EP overlap); the i-th backward at w + 2i + 1,
    or n + i once its forwards are done. At vpp 1 a rank runs one chunk and the order is torch's
    Schedule1F1B (multiply_factor 1: w = pp - 1 - r; Megatron-Core's non-interleaved 1F1B too),
    rank_orders' 1f1b."""
    n = M * vpp
    rnd = M // max(1, M // pp)
    r = np.arange(pp)[:, None]
    i = np.arange(n)[None, :]
    factor = 1 if vpp == 1 else 2
    w = np.minimum((vpp - 1) * rnd + factor * (pp - 1 - r) + extra, n)
    mb = np.broadcast_to((i // (rnd * vpp)) * rnd + i % rnd, (pp, n))
    fwd = (np.where(i < w, i, w + 2 * (i - w)), (i // rnd) % vpp * pp + r, mb)
    bwd = (np.where(i < n - w, w + 2 * i + 1, n + i), (vpp - 1 - (i // rnd) % vpp) * pp + r, mb)
    return fwd, bwd


def _interleaved_graph(pp: int, vpp: int, M: int):
    """_graph's (kind, stage, preds [ops, 2], level, last) for torch's interleaved order (1F1B's
    at vpp 1: interleaved_positions), built from its arithmetic over all ops at once
    rather than swept op by op (_graph); the levels (each op's longest chain of ops from the
    start) relaxed over all ops at once, or a level at a time above pp 32 (_levels)."""
    n, V = M * vpp, pp * vpp
    (f_pos, f_stage, mbs), (b_pos, b_stage, _) = interleaved_positions(pp, vpp, M)
    r = np.arange(pp)[:, None]
    node = lambda pos: r * 2 * n + pos  # noqa: E731
    f_of = np.full((V, M), -1)
    b_of = np.full((V, M), -1)
    f_of[f_stage, mbs] = node(f_pos)
    b_of[b_stage, mbs] = node(b_pos)
    kind = np.empty(2 * n * pp, int)
    stage = np.empty(2 * n * pp, int)
    cross = np.full(2 * n * pp, -1)
    kind[node(f_pos).ravel()], stage[node(f_pos).ravel()] = KINDS.index("F"), f_stage.ravel()
    kind[node(b_pos).ravel()], stage[node(b_pos).ravel()] = KINDS.index("B"), b_stage.ravel()
    # a forward waits for the previous stage's (another rank's), a backward for the next stage's; the
    # last stage's backward for its own forward, which its rank ran before
    cross[node(f_pos).ravel()] = np.where(f_stage > 0, f_of[np.maximum(f_stage - 1, 0), mbs], -1).ravel()
    cross[node(b_pos).ravel()] = np.where(b_stage < V - 1, b_of[np.minimum(b_stage + 1, V - 1), mbs], -1).ravel()
    prev = np.where(np.arange(2 * n * pp) % (2 * n) > 0, np.arange(2 * n * pp) - 1, -1)
    pred = np.stack([prev, cross], axis=1)
    level = _levels(pp, 2 * n, cross)
    return kind, stage, pred, level, np.arange(1, pp + 1) * 2 * n - 1


def _levels(pp: int, ops: int, cross: np.ndarray) -> np.ndarray:
    """Each op's level: _relaxed_levels, or _stepped_levels above pp 32, where the steps cost less."""
    return (_stepped_levels if pp > 32 else _relaxed_levels)(pp, ops, cross)


def _relaxed_levels(pp: int, ops: int, cross: np.ndarray) -> np.ndarray:
    """Each op's level (its longest chain of ops from the start) in a graph of pp ranks running
    `ops` ops each in turn, op i of rank r numbered r·ops + i, each after its rank's previous one
    and after `cross` (another rank's op, -1: none). Along a rank, level_i = i + 1 +
    max(0, max_{j <= i} (level[cross_j] - j)), a running maximum, relaxed from every rank running
    without waiting (a lower bound), all ops at once, until nothing rises: each pass settles one
    more hop between ranks, 2pp - 1 passes on torch's interleaved order. _stepped_levels gives the
    same levels a level at a time: the passes grow with pp and each covers every rank's ops, so
    above pp 32 the steps cost less (pp 64 x vpp 2 to 6 at M 3pp: 17-46 ms against 57-156 ms,
    here)."""
    cross = cross.reshape(pp * ops, -1)  # an op may wait on several (a V order's overlapped pair)
    pos = np.arange(ops * pp) % ops
    level = pos + 1
    while True:
        lift = np.where(cross >= 0, level[np.maximum(cross, 0)] - pos[:, None], 0).max(axis=1).reshape(pp, ops)
        new = np.maximum.accumulate(np.maximum(lift, 0), axis=1).ravel() + pos + 1
        if np.array_equal(new, level):
            return level
        level = new


def _stepped_levels(pp: int, ops: int, cross: np.ndarray) -> np.ndarray:
    """_relaxed_levels' by steps: each rank's next op takes the next level once its input has
    one, every rank at once (on torch's interleaved order, ops + 2(pp - 1) steps of pp ops each)."""
    cross = cross.reshape(pp * ops, -1)
    level = np.full(len(cross), np.iinfo(np.int64).max)
    at = np.zeros(pp, int)  # each rank's next op in its order
    step = 0
    while (at < ops).any():
        step += 1
        rr = np.flatnonzero(at < ops)
        op = rr * ops + at[rr]
        go = ((cross[op] < 0) | (level[np.maximum(cross[op], 0)] < step)).all(axis=1)
        level[op[go]] = step
        at[rr[go]] += 1
    return level


@functools.lru_cache(maxsize=256)
def _interleaved_waves(pp: int, vpp: int, M: int):
    """torch's interleaved order (1F1B's at vpp 1) as _waves gives the V orders, its waves by
    level alone, with each op's row in interleaved_path's durations (F: its stage, B: V + its stage)."""
    kind, stage, pred, level, last = _interleaved_graph(pp, vpp, M)
    waves, nodes, ends, order = _grouped((), pred, level, last, every=True)
    row = np.where(kind == KINDS.index("F"), 0, pp * vpp) + stage
    return [(a, z, row[order[a - 1:z - 1]], p) for a, z, _, p in waves], nodes, ends


def interleaved_path(pp: int, vpp: int, M: int, F, B) -> np.ndarray:
    """Seconds from the first action to the last of torch's ScheduleInterleaved1F1B order without
    messages (simulate's, at msg 0), for each column of F and B ([pp·vpp, n]: each virtual
    stage's forward and backward seconds of one micro-batch); one walk of the order's graph for
    every column. At vpp 1, torch's Schedule1F1B order (rank_orders' 1f1b: pp - 1 - r warm-up
    forwards, where the interleaved order's multiply_factor 2 would give twice that)."""
    waves, nodes, ends = _interleaved_waves(pp, vpp, M)
    return _walk(waves, nodes, ends, np.concatenate([np.asarray(F, float), np.asarray(B, float)]), 1 << 22)


def _dag_path(schedule: str, pp: int, dur: np.ndarray, cells: int) -> np.ndarray:
    """The critical path (seconds) of _waves(schedule, pp) for each column of `dur` ([len(KINDS),
    n]: each kind of op's seconds)."""
    waves, nodes, ends, _ = _waves(schedule, pp)
    return _walk(waves, nodes, ends, dur, cells)


def _walk(waves, nodes: int, ends, dur: np.ndarray, cells: int) -> np.ndarray:
    """Each column's critical path through a graph in topological waves (_grouped's: a wave's ops
    start once their predecessors end and take their rows of `dur`, one row for the wave or one an
    op), a wave at a time over every column, in blocks of about `cells` numbers."""
    path = np.empty(dur.shape[1])
    step = max(1, cells // nodes)
    for j in range(0, dur.shape[1], step):
        d = dur[:, j:j + step]
        fin = np.zeros((nodes, d.shape[1]))
        for a, z, rows, pred in waves:
            fin[a:z] = fin[pred[0]]
            for q in pred[1:]:
                np.maximum(fin[a:z], fin[q], out=fin[a:z])
            fin[a:z] += d[rows]
        path[j:j + step] = fin[ends].max(axis=0)
    return path


def _kind_seconds(f, b, w, hide=0.0):
    """([len(KINDS), n] seconds of each kind of op, the broadcast shape) from one chunk's f, b, w
    and what an overlapped pair hides (simulate's `hide`: never shorter than its longer half)."""
    t = np.stack(np.broadcast_arrays(*(np.asarray(x, float) for x in (f, b, w, hide))))
    f, b, w, h = t.reshape(4, -1)
    return np.stack([f, b, w, b + w, np.maximum(f + b + w - h, np.maximum(f, b + w))]), t.shape[1:]


def zbv_dag_bubble(pp: int, f, b, w, cells: int = 1 << 20) -> np.ndarray:
    """Seconds torch's ScheduleZBVZeroBubble idles a step beyond a rank's work, without messages:
    its critical path at M = 2·pp - 1 less that M's 2·M·(f + b + w). f, b, w: one chunk's
    forward, backward-input and backward-weight seconds a micro-batch, the same on every rank
    (arrays broadcast together; one graph walk for all). The actions' finish times are computed
    a wave at a time over every candidate, in blocks of about `cells` numbers. The bubble is the
    same for any M >= 2·pp - 1 (tests/test_schedule_sim.py)."""
    dur, shape = _kind_seconds(f, b, w)
    return (_dag_path("zbv", pp, dur, cells) - 2 * (2 * pp - 1) * dur[[0, 1, 2]].sum(axis=0)).reshape(shape)


def dualpipev_dag_bubble(pp: int, f, b, w, hide=0.0, cells: int = 1 << 20) -> np.ndarray:
    """Seconds torch's ScheduleDualPipeV leaves each rank idle a step beyond its own work, without
    messages: [pp, *shape], rank r's row its critical path at M = 2·pp less r's ops. f, b, w:
    one chunk's forward, backward-input and backward-weight seconds a micro-batch, the same on
    every rank; `hide`: seconds an overlapped pair hides (simulate's; 0 under torch's runtime,
    where every rank's row is the same); arrays broadcast together. The same for any M >= 2·pp
    (tests/test_schedule_sim.py)."""
    dur, shape = _kind_seconds(f, b, w, hide)
    *_, work = _waves("dualpipev", pp)
    return (_dag_path("dualpipev", pp, dur, cells) - work @ dur).reshape((pp, *shape))


def priced_step(schedule: str, pp: int, vpp: int, M: int, fwd_mb, bwd_mb, msg: float, overlap: bool = True) -> float:
    """The planner's price for the same pipeline (seconds): per rank, fwd_mb / bwd_mb are one
    micro-batch's forward and backward over all its chunks, each chunk an equal share; each role's
    rank sends the messages of `msg` seconds estimate._p2p_sends counts, the interleaved steady
    state hides what estimate.p2p_hidden_mb hides where `overlap`. schedule.pipeline_time's closed
    form runs over the busiest rank, the bubble keeping each other rank's hidden messages; the
    interleaved order, and 1F1B's where its last rank is not the busiest, are walked as
    interleaved.interleaved_pipe walks them (schedule.interleaved_step:
    each stage a vpp-th of its rank's seconds a micro-batch, its hidden messages off), the fill and
    the drain keeping the other ranks' hidden messages as the closed form adds them."""
    if schedule in ("zbv", "dualpipev"):
        raise ValueError(f"priced_step: the looped schedules; estimate prices {schedule} as v_orders.v_pipe walks it")
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
    # 1F1B: walked as estimate._pipeline walks it, where the last rank is not the busiest
    walked = schedule == "interleaved" or (schedule == "1f1b" and totals[-1] < totals.max())
    if walked and pp > 1:
        from .schedule import interleaved_step

        fwd, bwd = fwd_mb + [mf for mf, _ in on], bwd_mb + [mb for _, mb in on]
        pace = totals / (fwd + bwd)  # each rank's steady state: its hidden messages off
        f_s, b_s = (np.tile(x * pace, vpp)[:, None] / vpp for x in (fwd, bwd))
        walked = float(interleaved_step(np.array([pp]), np.array([vpp]), np.array([M]), f_s, b_s)[0])
        return walked + (hidden.sum() - hidden[busiest]) / vpp
    z = np.zeros(1)
    step = pipeline_time(np.array([SCHEDULES.index(schedule)]), np.array([pp]), np.array([M]), np.array([vpp]),
                         z, z, z, np.array([totals[busiest]]), np.array([totals.sum()]))
    return float(step[0]) + (hidden.sum() - hidden[busiest]) / vpp
