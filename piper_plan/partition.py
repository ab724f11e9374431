"""Layers -> pipeline chunks, balanced by predicted time.

The embedding rides on the first chunk and the LM head (with the loss) on the last, so
their cost is added to the first and last layer and the split may be uneven to compensate."""
from __future__ import annotations

import numpy as np


def _greedy(c: np.ndarray, cap: float) -> list[int] | None:
    """Cut points of the greedy fill under `cap`; None if some single layer exceeds it."""
    cuts, acc = [], 0.0
    for i, x in enumerate(c):
        if x > cap:
            return None
        if acc + x > cap:
            cuts.append(i)
            acc = 0.0
        acc += x
    return cuts


def balanced_partition(layer_cost, chunks: int, first_extra: float = 0.0,
                       last_extra: float = 0.0) -> list[list[int]]:
    """Contiguous split of L layers into `chunks` non-empty chunks minimising the largest
    chunk cost (any unit, e.g. seconds). Exact: the optimum is one of the O(L²) contiguous
    sums; binary search over them with a greedy feasibility test.

    layer_cost: shape [L]. Returns `chunks` lists of layer indices."""
    c = np.asarray(layer_cost, dtype=float).copy()
    L = len(c)
    if not 1 <= chunks <= L:
        raise ValueError(f"cannot split {L} layers into {chunks} chunks")
    c[0] += first_extra
    c[-1] += last_extra
    pref = np.concatenate([[0.0], np.cumsum(c)])
    sums = np.unique((pref[None, :] - pref[:, None])[np.triu_indices(L + 1, 1)])
    lo, hi = 0, len(sums) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        cuts = _greedy(c, sums[mid] * (1 + 1e-12))
        if cuts is not None and len(cuts) + 1 <= chunks:
            hi = mid
        else:
            lo = mid + 1
    cuts = _greedy(c, sums[lo] * (1 + 1e-12))
    bounds = [0, *cuts, L]
    # fewer chunks than asked: split the longest ones (never raises the maximum)
    while len(bounds) - 1 < chunks:
        widths = np.diff(bounds)
        j = int(np.argmax(widths))
        bounds.insert(j + 1, bounds[j] + widths[j] // 2)
    return [list(range(a, b)) for a, b in zip(bounds, bounds[1:])]
