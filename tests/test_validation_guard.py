"""Regression guard on the accuracy figures of `piper-plan validate` (see validation/README.md)."""
import pytest

from piper_plan.validate import TARGETS, run, summary


@pytest.fixture(scope="module")
def results():
    return run()


def test_dense_rows_meet_the_targets(results):
    k = summary(results)["kinds"]["dense"]
    assert k["rows"] == 18 and k["mape"] <= TARGETS["dense"][0] and k["max_abs_pct"] <= TARGETS["dense"][1]


def test_memory_rows_each_within_10_percent(results):
    mem = [r for r in results if r.kind == "memory"]
    assert len(mem) == 12 and all(abs(r.error_pct) <= 10 for r in mem)


def test_moe_rows_do_not_regress(results):
    # The MoE target (MAPE <= 20 %, max 35 %) is NOT met yet (issue 4 stays open); this guard
    # pins today's level so a change that makes the MoE model worse fails.
    k = summary(results)["kinds"]["moe"]
    assert k["rows"] == 33 and k["mape"] <= 50.0  # 47.6 % over the 33 rows (43.9 % over the first 17)


def test_dense_ranking_follows_measurement(results):
    g = summary(results)["groups"]["narayanan2021-table1"]
    assert g["kendall_tau"]["hw_tflops_per_gpu"] > 0.5
