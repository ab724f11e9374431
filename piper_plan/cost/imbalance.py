"""Routing distribution -> max/mean routed rows per rank of an EP group.

Two effects combine (their excesses over 1 in quadrature, imbalance.combined):
- placement: with expert popularity p (sums to 1) and E/ep experts per rank, the busiest
  rank holds max_r Σ_{e on r} p_e versus the mean 1/ep. Without migration experts sit in
  id order (Megatron's contiguous placement) and popularity is not known to follow ids, so
  Zipf popularity ranks are spread by a fixed pseudo-random permutation; with migration the
  placement is the one its planner would install (piper_plan.placement: swap or LPT);
- sampling: a rank's μ = t·k routed rows per micro-batch are a multinomial draw, whose
  expected maximum over ep ranks is ≈ μ + σ·√(2 ln ep), σ² = μ(1 − 1/ep).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

_PERM_SEED = 20260505


def expert_popularity(num_experts: int, distribution: str = "uniform", zipf_s: float = 1.0,
                      histogram=None) -> np.ndarray:
    """Probability of each expert receiving a routed token, shape [E], sorted by expert id; a
    histogram of several MoE layers ([layers, E], as piper-train measures it) keeps a row a layer,
    each normalised: each layer's straggler rank sets that layer's time, so their imbalances are
    taken apart (imbalance) rather than of the layers' average, which looks balanced wherever
    the layers' hot experts differ."""
    if distribution == "uniform":
        return np.full(num_experts, 1.0 / num_experts)
    if distribution == "zipf":
        w = 1.0 / np.arange(1, num_experts + 1) ** zipf_s
        w = w[np.random.default_rng(_PERM_SEED).permutation(num_experts)]
        return w / w.sum()
    if distribution == "histogram":
        h = np.asarray(histogram, dtype=float)
        bad_shape = h.ndim not in (1, 2) or h.shape[-1] != num_experts
        if bad_shape or not h.sum() > 0:
            from ..errors import SpecError

            why = (f"the histogram has {h.shape[-1] if h.ndim else 0} experts; the model has {num_experts}"
                   if bad_shape else "the histogram routes no tokens (every count is 0)")
            raise SpecError("--routing", "tokens_per_expert", why)
        if h.ndim == 2:
            h = h[h.sum(1) > 0]  # a layer that routed nothing tells nothing
            return h[0] / h[0].sum() if len(h) == 1 else h / h.sum(1, keepdims=True)
        return h / h.sum()
    raise ValueError(f"unknown routing distribution {distribution!r}")


def placement_imbalance(p: np.ndarray, ep: int, planner: str | None = None, max_moves: int | None = None) -> float:
    """max/mean rank load for popularity p over ep ranks: contiguous ids (planner None), or
    the placement migration would install ("swap" or "lpt", piper_plan.placement)."""
    from ..placement import contiguous_placement, plan_placement, rank_loads

    if ep <= 1:
        return 1.0
    pl = contiguous_placement(len(p), ep)
    if planner is not None:
        pl = plan_placement(p, pl, planner, max_moves)
    return float(rank_loads(p, pl).max() * ep / p.sum())


@lru_cache(maxsize=256)
def _placement_cached(key: tuple, ep: int, planner: str | None, max_moves: int | None) -> float:
    return placement_imbalance(np.array(key), ep, planner, max_moves)


def sampling_factor(ep, rows_per_rank) -> np.ndarray:
    """Expected max/mean of ep multinomial rank loads of mean `rows_per_rank` rows each:
    ≈ 1 + √(2 ln ep)·√((1 − 1/ep)/μ)."""
    ep = np.asarray(ep, dtype=float)
    mu = np.maximum(np.asarray(rows_per_rank, dtype=float), 1.0)
    return np.where(ep > 1, 1.0 + np.sqrt(2.0 * np.log(np.maximum(ep, 1.0))) * np.sqrt((1.0 - 1.0 / ep) / mu), 1.0)


def imbalance(p: np.ndarray, ep, rows_per_rank, planner: str | None = None, max_moves: int | None = None,
              observed=None) -> np.ndarray:
    """Expected max/mean routed rows per rank, vectorised over (ep, rows_per_rank) arrays;
    `planner` set = expert migration keeps that planner's placement. `p` [layers, E] (one row a
    MoE layer): the mean of the layers' placement factors, each layer waiting on its own
    busiest rank. `observed`: the routed rows each row of p was counted from (a measured
    histogram, observed_rows), whose own sampling noise is taken off its placement factor."""
    ep = np.asarray(ep)
    rows = [tuple(np.round(r, 12)) for r in np.atleast_2d(p)]
    seen = None if observed is None or planner is not None else np.atleast_1d(np.asarray(observed, float))
    place = np.ones(ep.shape)
    for e in sorted(set(ep.ravel().tolist())):  # np.unique would load numpy.ma on first use (~7 ms)
        f = np.array([_placement_cached(key, int(e), planner, max_moves) for key in rows])
        if seen is not None:
            f = denoised(f, sampling_factor(e, seen / e))
        place = np.where(ep == e, float(np.mean(f)), place)
    return np.where(ep > 1, combined(place, sampling_factor(ep, rows_per_rank)), 1.0)


def combined(placement, sampling) -> np.ndarray:
    """Max/mean of rank loads whose means spread by `placement` and whose draws by `sampling`:
    their excesses over 1 in quadrature. Each limit is exact: with even means the max is the
    sampling's; with one rank well ahead, the max is that rank's mean, the others' draws rarely
    passing it (the product of the two had counted the sampling's excess on top: tiny-moe on 8
    ranks at EP 8 re-planned from its own histogram at 1.346 against 1.225 measured)."""
    a, b = np.asarray(placement, float) - 1.0, np.asarray(sampling, float) - 1.0
    return 1.0 + np.sqrt(a * a + b * b)


def denoised(measured, noise) -> np.ndarray:
    """A placement factor read off a histogram of finite counts, less the max/mean that counting
    alone gives (`noise`: sampling_factor of the histogram's rows a rank): their excesses over 1
    taken apart in quadrature, as independent spreads add. The planner adds the sampling of the
    run it prices back (imbalance); left in, a run's own histogram counted it twice. A placement
    a migration planner made from the histogram is left as it is: fitted to the noise, it is not
    independent of it."""
    m, s = np.asarray(measured, float) - 1.0, np.asarray(noise, float) - 1.0
    return 1.0 + np.sqrt(np.maximum(m * m - s * s, 0.0))


def observed_rows(histogram, distribution: str = "histogram") -> np.ndarray | None:
    """Routed rows each layer's row of a tokens-per-expert histogram was counted from, in
    expert_popularity's rows (a layer that routed nothing left out); None without one, or where
    the routing priced is another `distribution` (a histogram beside a Zipf one is not its)."""
    if histogram is None or distribution != "histogram":
        return None
    h = np.atleast_2d(np.asarray(histogram, dtype=float))
    tot = h.sum(1)
    return tot[tot > 0]


def step_imbalance(p: np.ndarray, ep: int, rows_per_step: float, planner: str | None = None,
                   max_moves: int | None = None, observed=None) -> float:
    """Expected max/mean of the routed rows an EP rank receives over a whole optimizer step
    (`rows_per_step`: a rank's mean, all micro-batches): what piper-train reports as
    ep_max_over_mean. The placement factor is the micro-batch's; sampling noise averages over
    the step's M micro-batches, so the step's figure is nearer 1 than one micro-batch's."""
    return float(imbalance(p, np.array([ep]), np.array([float(rows_per_step)]), planner, max_moves, observed)[0])
