"""Group-limited routing (DeepSeek's n_group / topk_group, ModelSpec.moe.route_groups /
route_group_limit) and the destinations a token-level exchange (DeepEP, HybridEP) sends a
token to (piper_plan.cost.routing)."""
from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path

import pytest

from piper_plan.cost import comm
from piper_plan.cost.routing import dedup_fraction, destinations_hit
from piper_plan.errors import SpecError
from piper_plan.specs.hf import model_from_hf_config
from piper_plan.specs.registry import load_hardware, load_model

HF = Path(__file__).parent / "data" / "hf"


def _enumerated(E: int, k: int, D: int, G: int, L: int) -> float:
    """Expected destinations hit, by enumerating every group subset and every expert subset."""
    Eg, total, count = E // G, 0.0, 0
    for groups in combinations(range(G), L):
        pool = [e for g in groups for e in range(g * Eg, (g + 1) * Eg)]
        for experts in combinations(pool, k):
            total += len({e * D // E for e in experts})
            count += 1
    return total / count


@pytest.mark.parametrize("D", [2, 3, 4, 8, 16])
def test_destinations_hit_equals_enumeration(D):
    # 16 experts in 4 groups, top-2 from 2 groups: aligned (D divides or is divided by G) and not (3)
    assert destinations_hit(16, 2, D, 4, 2) == pytest.approx(_enumerated(16, 2, D, 4, 2), rel=1e-12)
    assert destinations_hit(16, 3, D) == pytest.approx(_enumerated(16, 3, D, 1, 1), rel=1e-12)


def test_deepseek_v3_reaches_at_most_four_nodes():
    """DeepSeek-V3 report §3.4: each token is sent to at most 4 nodes; on 8 nodes (one group
    each) the expected count is 4 × P(its group gets one of the 8 experts) — below the 5.3 of
    unrestricted top-8 routing."""
    m = load_model("deepseek-v3").moe
    assert (m.route_groups, m.route_group_limit) == (8, 4)
    hit = destinations_hit(256, 8, 8, 8, 4)
    assert hit == pytest.approx(4 * (1 - _miss(128, 32, 8)), rel=1e-12)
    assert 3.5 < hit < 4 < destinations_hit(256, 8, 8) < 5.5
    assert float(dedup_fraction(256, 8, 8, 8, 4)) == pytest.approx(hit / 8)


def _miss(pool, held, k):
    from math import comb
    return comb(pool - held, k) / comb(pool, k)


def test_token_level_exchange_is_cheaper_under_group_limits():
    hw = load_hardware("dgx-h100")
    nbytes = 4096 * 8 * 7168 * 2.0
    for ep in (16, 32, 64):
        free = float(comm.a2a_dedup(hw, nbytes, ep, 1, 256, 8))
        limited = float(comm.a2a_dedup(hw, nbytes, ep, 1, 256, 8, 8, 4))
        assert limited < free


def test_hf_import_reads_group_limited_routing():
    v3 = model_from_hf_config(json.loads((HF / "deepseek-v3.json").read_text()), "v3/config.json")
    v2 = model_from_hf_config(json.loads((HF / "deepseek-v2.json").read_text()), "v2/config.json")
    assert (v3.moe.route_groups, v3.moe.route_group_limit) == (8, 4)
    assert (v2.moe.route_groups, v2.moe.route_group_limit) == (8, 3)
    lite = json.loads((HF / "deepseek-v2.json").read_text()) | {"topk_method": "greedy"}  # V2-Lite's router
    assert model_from_hf_config(lite, "lite/config.json").moe.route_groups is None
    bad = json.loads((HF / "deepseek-v3.json").read_text()) | {"n_group": 7}
    with pytest.raises(SpecError) as e:
        model_from_hf_config(bad, "bad/config.json")
    assert str(e.value).startswith("bad/config.json: n_group") and "must divide n_routed_experts" in str(e.value)


def test_spec_rejects_inconsistent_groups():
    base = load_model("deepseek-v3").moe.model_dump()
    for bad in ({"route_group_limit": None}, {"route_groups": 7}, {"route_group_limit": 9},
                {"route_groups": 64, "route_group_limit": 1}):  # 1 group of 4 experts cannot hold top-8
        with pytest.raises(ValueError):
            type(load_model("deepseek-v3").moe).model_validate(base | bad)
