"""Layers -> pipeline chunks, vectorised: the rule the search, `estimate` and plan.json share.

The first chunk carries the embedding, the last the LM head and loss; their cost, in
layer-equivalents x_f and x_l, is taken off those chunks so every chunk does about
(L + x_f + x_l) / C layers' work. The middle chunks share the rest evenly (the first
few get one more). Leading dense layers fall in the first chunk(s).

Per rank the cost model needs three representatives: the rank holding chunk 0 (rank 0),
the rank holding the last chunk (rank pp-1 looped; rank 0 for V schedules) and the
busiest middle rank (vpp middle chunks of the larger size).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np


@dataclass
class ChunkSizes:
    first: np.ndarray  # layers in chunk 0
    last: np.ndarray   # layers in chunk C-1
    mid_hi: np.ndarray  # layers in the larger middle chunks
    mid_avg: np.ndarray  # mean layers per middle chunk (float)
    n_hi: np.ndarray   # number of middle chunks with mid_hi layers

    def take(self, idx) -> "ChunkSizes":
        return ChunkSizes(*(np.asarray(getattr(self, f.name)).take(idx) for f in fields(self)))


def chunk_sizes(L: int, chunks, x_first, x_last) -> ChunkSizes:
    """Arrays over layouts: chunks = pp·vpp, x_* extras in layer-equivalents."""
    C = np.asarray(chunks)
    target = (L + x_first + x_last) / C
    one = C == 1
    first = np.clip(np.rint(target - x_first), 1, L).astype(int)
    last = np.clip(np.rint(target - x_last), 1, L).astype(int)
    mids = np.maximum(C - 2, 0)
    # leave at least one layer for every middle chunk
    over = np.maximum(first + last + mids - L, 0)
    cut_last = np.minimum(over, last - 1)
    last = last - cut_last
    first = first - np.minimum(over - cut_last, first - 1)
    rem = L - first - last
    mids_safe = np.maximum(mids, 1)
    base = np.where(mids > 0, rem // mids_safe, 0)
    n_hi = np.where(mids > 0, rem % mids_safe, 0)
    mid_hi = base + (n_hi > 0)
    # two chunks: whatever is left joins them (rem may be non-zero after rounding)
    two = C == 2
    first = np.where(two, first + np.maximum(rem, 0) // 2 + (np.maximum(rem, 0) % 2), first)
    last = np.where(two, L - first, last)
    first = np.where(one, L, first)
    last = np.where(one, L, last)
    mid_avg = np.where(mids > 0, rem / mids_safe, 0.0)
    return ChunkSizes(first, last, np.where(mids > 0, mid_hi, 0), mid_avg, n_hi)


def materialise(L: int, chunks: int, cs: ChunkSizes, i: int = 0) -> list[list[int]]:
    """Chunk -> layer ids for one layout (index i of the arrays)."""
    if chunks == 1:
        return [list(range(L))]
    f, l_ = int(np.atleast_1d(cs.first)[i]), int(np.atleast_1d(cs.last)[i])
    sizes = [f]
    if chunks > 2:
        hi, nh = int(np.atleast_1d(cs.mid_hi)[i]), int(np.atleast_1d(cs.n_hi)[i])
        rem = L - f - l_
        base = rem // (chunks - 2)
        sizes += [base + 1 if j < nh else base for j in range(chunks - 2)]
        assert max(sizes[1:]) <= max(hi, base)
    sizes.append(l_)
    assert sum(sizes) == L and min(sizes) >= 1, sizes
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    return [list(range(a, b)) for a, b in zip(bounds, bounds[1:])]
