"""Routing distribution -> max/mean routed rows per rank of an EP group.

Two effects multiply:
- placement: with expert popularity p (sums to 1) and E/ep experts per rank, the busiest
  rank holds max_r Σ_{e on r} p_e versus the mean 1/ep. Without migration experts sit in
  id order (Megatron's contiguous placement) and popularity is not known to follow ids, so
  popularity ranks are spread by a fixed pseudo-random permutation; with migration the
  placement is re-balanced (greedy longest-processing-time packing, see piper_plan.placement);
- sampling: a rank's μ = t·k routed rows per micro-batch are a multinomial draw, whose
  expected maximum over ep ranks is ≈ μ + σ·√(2 ln ep), σ² = μ(1 − 1/ep).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

_PERM_SEED = 20260505


def expert_popularity(num_experts: int, distribution: str = "uniform", zipf_s: float = 1.0,
                      histogram=None) -> np.ndarray:
    """Probability of each expert receiving a routed token, shape [E], sorted by expert id."""
    if distribution == "uniform":
        return np.full(num_experts, 1.0 / num_experts)
    if distribution == "zipf":
        w = 1.0 / np.arange(1, num_experts + 1) ** zipf_s
        w = w[np.random.default_rng(_PERM_SEED).permutation(num_experts)]
        return w / w.sum()
    if distribution == "histogram":
        h = np.asarray(histogram, dtype=float)
        h = h.mean(0) if h.ndim == 2 else h
        if h.shape != (num_experts,) or h.sum() <= 0:
            raise ValueError(f"histogram needs {num_experts} non-negative counts with a positive sum")
        return h / h.sum()
    raise ValueError(f"unknown routing distribution {distribution!r}")


def placement_imbalance(p: np.ndarray, ep: int, balanced: bool) -> float:
    """max/mean rank load for popularity p over ep ranks (contiguous ids, or balanced)."""
    E = len(p)
    if ep <= 1:
        return 1.0
    if balanced:
        from ..placement import lpt_placement

        slots = lpt_placement(p, ep)
        loads = np.array([p[s].sum() for s in slots])
    else:
        loads = p.reshape(ep, E // ep).sum(1)
    return float(loads.max() * ep)


@lru_cache(maxsize=256)
def _placement_cached(key: tuple, ep: int, balanced: bool) -> float:
    return placement_imbalance(np.array(key), ep, balanced)


def imbalance(p: np.ndarray, ep, rows_per_rank, balanced: bool = False) -> np.ndarray:
    """Expected max/mean routed rows per rank, vectorised over (ep, rows_per_rank) arrays."""
    ep = np.asarray(ep)
    mu = np.maximum(np.asarray(rows_per_rank, dtype=float), 1.0)
    key = tuple(np.round(p, 12))
    uniq = np.unique(ep)
    place = np.ones(ep.shape)
    for e in uniq:
        place = np.where(ep == e, _placement_cached(key, int(e), balanced), place)
    epf = ep.astype(float)
    samp = 1.0 + np.sqrt(2.0 * np.log(np.maximum(epf, 1.0))) * np.sqrt((1.0 - 1.0 / epf) / mu)
    return np.where(ep > 1, place * samp, 1.0)
