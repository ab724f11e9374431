"""Expert placement planners: pure, deterministic functions of per-expert load.

A placement is a list of ep lists of logical expert ids, E/ep per rank (slots keep the
experts-per-rank count constant, as migration by swaps must). Loads are any non-negative
unit (tokens, probabilities).
"""
from __future__ import annotations

import numpy as np


def rank_loads(load: np.ndarray, placement: list[list[int]]) -> np.ndarray:
    """Per-rank sum of expert loads, shape [ep]."""
    load = np.asarray(load, dtype=float)
    return np.array([load[list(s)].sum() for s in placement])


def lower_bound(load: np.ndarray, ep: int) -> float:
    """No placement with E/ep experts per rank beats max(heaviest expert, mean rank load)."""
    load = np.asarray(load, dtype=float)
    return float(max(load.max(), load.sum() / ep))


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
