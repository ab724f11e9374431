"""Expert placement planners: pure, deterministic functions of per-expert load.

A placement is a list of ep lists of logical expert ids, E/ep per rank (slots keep the
experts-per-rank count constant, as migration by swaps must). Loads are any non-negative
unit (tokens, probabilities), shape [E]. Every planner minimises the maximum rank load;
`lower_bound` says how far any placement could go, so each result can be judged.

Planners (all return sorted per-rank lists and never a placement worse than the input):
- swap_placement: the paper's hill climbing (brief §4): swap the pair of experts between
  the most- and the least-loaded rank that most narrows their gap, until no swap helps;
- lpt_local_placement: longest-processing-time packing, its ranks relabelled to keep as
  many experts where they are as possible, then best-improvement swaps of the busiest
  rank with any rank; also the same local search started from the input placement; the
  better of the two within the move budget.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

_REL_TOL = 1e-12  # improvements smaller than this share of the total load are float noise


def rank_loads(load: np.ndarray, placement: list[list[int]]) -> np.ndarray:
    """Per-rank sum of expert loads, shape [ep]."""
    load = np.asarray(load, dtype=float)
    return np.array([load[list(s)].sum() for s in placement])


def lower_bound(load: np.ndarray, ep: int) -> float:
    """No placement with E/ep experts per rank beats max(heaviest expert, mean rank load)."""
    load = np.asarray(load, dtype=float)
    return float(max(load.max(), load.sum() / ep))


def slot_lower_bound(load: np.ndarray, ep: int) -> float:
    """A tighter bound when slots are fixed (E/ep experts per rank): the rank holding the
    heaviest expert also holds E/ep - 1 others, at least the lightest ones. Never below
    `lower_bound`; no placement with E/ep experts per rank beats it either."""
    load = np.sort(np.asarray(load, dtype=float))
    per = len(load) // ep
    return float(max(load.sum() / ep, load[-1] + load[:per - 1].sum()))


def contiguous_placement(num_experts: int, ep: int) -> list[list[int]]:
    per = num_experts // ep
    return [list(range(r * per, (r + 1) * per)) for r in range(ep)]


def lpt_placement(load: np.ndarray, ep: int) -> list[list[int]]:
    """Longest-processing-time first with a per-rank slot cap: heaviest expert to the
    least-loaded rank that still has a free slot (ties: lower rank, lower expert id)."""
    load = np.asarray(load, dtype=float)
    E = len(load)
    if E % ep:
        raise ValueError(f"{E} experts do not split over ep={ep}")
    per = E // ep
    order = sorted(range(E), key=lambda e: (-load[e], e))
    sums = np.zeros(ep)
    slots: list[list[int]] = [[] for _ in range(ep)]
    for e in order:
        free = [r for r in range(ep) if len(slots[r]) < per]
        r = min(free, key=lambda r: (sums[r], r))
        slots[r].append(e)
        sums[r] += load[e]
    return [sorted(s) for s in slots]


def moved_experts(before: list[list[int]], after: list[list[int]]) -> int:
    """Number of experts whose rank differs between two placements (what migration moves)."""
    return int((_rank_of(before) != _rank_of(after)).sum())


def _rank_of(placement: list[list[int]]) -> np.ndarray:
    E = sum(len(s) for s in placement)
    out = np.full(E, -1, dtype=np.int64)
    for r, s in enumerate(placement):
        out[list(s)] = r
    if (out < 0).any():
        raise ValueError("placement must hold every expert id 0..E-1 exactly once")
    return out


def _to_lists(rank_of: np.ndarray, ep: int) -> list[list[int]]:
    return [np.flatnonzero(rank_of == r).tolist() for r in range(ep)]


def _check(load, placement):
    load = np.asarray(load, dtype=float)
    if load.ndim != 1 or (load < 0).any() or not np.isfinite(load).all():
        raise ValueError("load must be a 1-D array of finite non-negative numbers")
    rank_of = _rank_of(placement)
    if len(rank_of) != len(load):
        raise ValueError(f"placement holds {len(rank_of)} experts, load has {len(load)}")
    if len({len(s) for s in placement}) != 1:
        raise ValueError("every rank must hold the same number of experts")
    return load, rank_of


def swap_placement(load: np.ndarray, placement: list[list[int]], max_moves: Optional[int] = None) -> list[list[int]]:
    """The paper's hill climbing (brief §4). load [E]; placement: ep lists of expert ids.

    Repeat: A = most-loaded rank, B = least-loaded rank (ties: lower rank id); over all
    pairs (a on A, b on B) with 0 < load[a] - load[b] < gap(A, B), swap the pair leaving
    the smallest |gap| (ties: lower a, then lower b); stop when no pair qualifies or the
    swap would leave more than `max_moves` experts away from their input rank."""
    load, rank_of = _check(load, placement)
    ep, home = len(placement), rank_of.copy()
    tol = _REL_TOL * max(load.sum(), 1e-300)
    for _ in range(4 * len(load) * ep + 1):
        sums = np.bincount(rank_of, weights=load, minlength=ep)
        A, B = int(np.argmax(sums)), int(np.argmin(sums))
        gap = sums[A] - sums[B]
        if A == B or gap <= tol:
            break
        a = np.flatnonzero(rank_of == A)
        b = np.flatnonzero(rank_of == B)
        delta = load[a][:, None] - load[b][None, :]          # [|A|, |B|]
        ok = (delta > tol) & (delta < gap - tol)
        if max_moves is not None:
            moved = int((rank_of != home).sum())
            da = (B != home[a]).astype(int) - (A != home[a]).astype(int)
            db = (A != home[b]).astype(int) - (B != home[b]).astype(int)
            ok &= moved + da[:, None] + db[None, :] <= max_moves
        if not ok.any():
            break
        score = np.where(ok, np.abs(gap - 2.0 * delta), np.inf)
        i, j = np.unravel_index(int(np.argmin(score)), score.shape)  # first minimum: lower a, lower b
        rank_of[a[i]], rank_of[b[j]] = B, A
    return _to_lists(rank_of, ep)


def _local_search(load: np.ndarray, rank_of: np.ndarray, home: np.ndarray, ep: int,
                  max_moves: Optional[int]) -> np.ndarray:
    """Best-improvement swaps between the busiest rank A and any other rank: the swap that
    minimises max(new A, new B), strictly below the old A (ties: fewer experts away from
    `home`, then lower ids). Each accepted swap lowers the sorted load vector, so it ends."""
    rank_of = rank_of.copy()
    tol = _REL_TOL * max(load.sum(), 1e-300)
    E = len(load)
    for _ in range(4 * E * ep + 1):
        sums = np.bincount(rank_of, weights=load, minlength=ep)
        A = int(np.argmax(sums))
        a = np.flatnonzero(rank_of == A)
        b = np.flatnonzero(rank_of != A)
        if not len(b):
            break
        rb = rank_of[b]
        delta = load[a][:, None] - load[b][None, :]            # [|A|, E-|A|]
        new_max = np.maximum(sums[A] - delta, sums[rb][None, :] + delta)
        ok = new_max < sums[A] - tol
        moved = int((rank_of != home).sum())
        dm = ((rb[None, :] != home[a][:, None]).astype(int) - (A != home[a]).astype(int)[:, None]
              + (A != home[b]).astype(int)[None, :] - (rb != home[b]).astype(int)[None, :])
        if max_moves is not None:
            ok &= moved + dm <= max_moves
        if not ok.any():
            break
        cand = np.flatnonzero(ok.ravel())
        # lexsort: last key is primary -> new max, then moves, then (a, b) in id order
        ai, bj = np.unravel_index(cand, ok.shape)
        pick = cand[np.lexsort((b[bj], a[ai], dm.ravel()[cand], new_max.ravel()[cand]))[0]]
        i, j = np.unravel_index(pick, ok.shape)
        rank_of[a[i]], rank_of[b[j]] = rank_of[b[j]], A
    return rank_of


def _relabel(lpt: list[list[int]], home: np.ndarray) -> np.ndarray:
    """Give LPT's bins to ranks so that as many experts as possible stay (Hungarian method)."""
    from scipy.optimize import linear_sum_assignment

    ep = len(lpt)
    overlap = np.array([[int((home[s] == r).sum()) for r in range(ep)] for s in lpt])  # [bin, rank]
    bins, ranks = linear_sum_assignment(-overlap)
    out = np.empty_like(home)
    for bi, r in zip(bins, ranks):
        out[lpt[bi]] = r
    return out


def lpt_local_placement(load: np.ndarray, placement: list[list[int]],
                        max_moves: Optional[int] = None) -> list[list[int]]:
    """LPT packing + local search with a bound on moved experts. load [E] (any unit);
    placement: the current ep lists of expert ids. Candidates: (1) LPT relabelled to the
    current ranks, then local search (kept only if within `max_moves`); (2) local search
    from the current placement within `max_moves`. Returns the candidate with the lowest
    max rank load (ties: fewer moved experts, then the first)."""
    load, home = _check(load, placement)
    ep = len(placement)
    cands = [_local_search(load, home, home, ep, max_moves)]
    start = _relabel(lpt_placement(load, ep), home)
    if max_moves is None or int((start != home).sum()) <= max_moves:
        cands.append(_local_search(load, start, home, ep, max_moves))
    tol = _REL_TOL * max(load.sum(), 1e-300)
    best, best_key = None, None
    for r in cands:
        key = (np.bincount(r, weights=load, minlength=ep).max(), int((r != home).sum()))
        if best is None or key[0] < best_key[0] - tol or (abs(key[0] - best_key[0]) <= tol and key[1] < best_key[1]):
            best, best_key = r, key
    return _to_lists(best, ep)


PLANNERS = {"swap": swap_placement, "lpt": lpt_local_placement}


def plan_placement(load: np.ndarray, placement: list[list[int]], planner: str = "lpt",
                   max_moves: Optional[int] = None) -> list[list[int]]:
    """Dispatch by plan.migration.planner: "swap" (paper) or "lpt" (LPT + local search)."""
    if planner not in PLANNERS:
        raise ValueError(f"unknown placement planner {planner!r} (expected one of {sorted(PLANNERS)})")
    return PLANNERS[planner](load, placement, max_moves)
