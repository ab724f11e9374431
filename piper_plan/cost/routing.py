"""How many destinations (ranks or nodes) one token's top-k experts reach.

A token-level exchange (DeepEP, HybridEP) sends a token once to every destination that holds
at least one of its experts, so its bytes scale with the expected number of destinations hit,
not with k. Routing is taken as uniform (the force-balanced routing of benchmarks, and what a
trained load-balanced router approaches). Destinations hold equal runs of consecutive expert
ids (Megatron's contiguous placement).

Group-limited routing (DeepSeek-V2 group_limited_greedy, V3 noaux_tc; n_group / topk_group):
the experts form `groups` runs of consecutive ids; a token first picks `limit` groups, then its
k experts inside them. Uniformly: the L groups are a uniform L-subset, the k experts a uniform
k-subset of the L·E/G experts in them. Confining a token to L of G groups confines it to the
destinations holding those groups: DeepSeek-V3 on 8 nodes reaches at most 4 (its paper §3.4:
"each token will be sent to at most 4 nodes").
"""
from __future__ import annotations

from functools import lru_cache
from itertools import combinations
from math import comb

import numpy as np

_MAX_SUBSETS = 20000  # beyond this many group subsets, unaligned layouts ignore the group limit


def _miss(pool: int, held: float, k: int) -> float:
    """P(none of k experts drawn without replacement from `pool` falls among `held` of them):
    C(pool − held, k) / C(pool, k) as the product Π_i (pool − held − i) / (pool − i)."""
    p = 1.0
    for i in range(k):
        p *= max(0.0, (pool - held - i) / (pool - i))
    return p


@lru_cache(maxsize=1024)
def destinations_hit(experts: int, top_k: int, dests: float, groups: int = 1, limit: int = 1) -> float:
    """Expected number of the `dests` destinations (each holding experts/dests consecutive
    experts) that receive a token, under uniform routing, group-limited when limit < groups
    (a fractional `dests`, e.g. a group that fills its last node partly, ignores the groups).
    Without groups: dests · (1 − C(E − E/D, k) / C(E, k))."""
    E, k, D = experts, top_k, float(dests)
    if D <= 1:
        return 1.0
    if D != int(D):
        return D * (1.0 - _miss(E, E / D, k))
    D = int(D)
    if groups <= 1 or limit >= groups:
        if E % D:  # uneven runs (Megatron requires EP | E; a node count need not divide it)
            return sum(1.0 - _miss(E, held, k) for held in _held(E, D, 1)[:, 0])
        return D * (1.0 - _miss(E, E / D, k))
    Eg, pool = E // groups, limit * (E // groups)
    if groups % D == 0:  # each destination holds g whole groups: j of them chosen ~ hypergeometric
        g = groups // D
        p = sum(comb(g, j) * comb(groups - g, limit - j) / comb(groups, limit) * (1.0 - _miss(pool, j * Eg, k))
                for j in range(0, min(g, limit) + 1))
        return D * p
    if D % groups == 0:  # each destination holds E/D experts of one group, chosen with prob L/G
        return D * limit / groups * (1.0 - _miss(pool, E // D, k))
    if comb(groups, limit) > _MAX_SUBSETS:
        return destinations_hit(E, k, D)
    # unaligned: each destination's experts in every group, averaged over the group subsets
    overlap = _held(E, D, groups)
    total = 0.0
    subsets = list(combinations(range(groups), limit))
    for s in subsets:
        held = overlap[:, list(s)].sum(1)
        total += sum(1.0 - _miss(pool, h, k) for h in held)
    return total / len(subsets)


def _held(experts: int, dests: int, groups: int) -> np.ndarray:
    """[dests, groups]: experts of each group that each destination holds, expert e sitting on
    destination e·D // E (consecutive runs, as even as integers allow)."""
    e = np.arange(experts)
    out = np.zeros((dests, groups))
    np.add.at(out, (e * dests // experts, e * groups // experts), 1.0)
    return out


def dedup_fraction(experts: int, top_k: int, dests, groups: int = 1, limit: int = 1) -> np.ndarray:
    """Bytes a token-level exchange sends to the `dests` destinations over those of an
    expert-level one (k copies per token): destinations_hit / k, at most 1; 1 for one
    destination. Vectorised over `dests`."""
    d = np.maximum(np.asarray(dests, dtype=float), 1.0)
    out = np.ones_like(d)
    for v in sorted(set(d.ravel().tolist())):
        if v > 1:
            out = np.where(d == v, min(1.0, destinations_hit(experts, top_k, v, groups, limit) / top_k), out)
    return out
