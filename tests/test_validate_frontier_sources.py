"""Frontier's GEMM plateau against Piper's own measurements on that machine (brief §5): its
single-MoE-layer rates (a kernel-level table) set it, and its full-model figures, whose GPU
counts are unpublished, bound it: the model's best plan must reach what a run reached."""
from pathlib import Path

import pytest

from piper_plan.specs.registry import load_hardware
from piper_plan.validate_bounds import full_model_bounds
from piper_plan.validate_kernels import implied_gemm, moe_layer_check


def test_one_gemm_plateau_prices_all_six_single_moe_layers_within_10_percent():
    rows = moe_layer_check()
    priced = [r for r in rows if r["predicted"] is not None]
    assert len(rows) == 8 and {r["model"] for r in rows if r["predicted"] is None} == {"Snowflake Arctic"}
    # the spec holds the plateau the six fit rows imply, and at it no model is off by more than 10 %
    assert {r["model"] for r in priced if r["fit"]} == {"Mixtral 8x22B", "Mixtral 8x7B", "Llama 4 Maverick",
                                                          "Llama 4 Scout", "DeepSeek-V3", "DeepSeek-V2"}
    assert load_hardware("frontier").efficiency.gemm == pytest.approx(implied_gemm(), abs=0.005)
    assert all(abs(r["predicted"] / r["published"] - 1) < 0.10 for r in priced), priced
    # coarse experts run faster than fine-grained ones, in the model as in the table
    by = {r["model"]: r["predicted"] for r in priced}
    assert by["Mixtral 8x22B"] > by["DeepSeek-V3"] and by["Mixtral 8x7B"] > by["DeepSeek-V2"]


def test_kimi_k2_given_a_spec_after_the_fit_is_priced_out_of_sample_and_moves_no_plateau(tmp_path):
    rows = {r["model"]: r for r in moe_layer_check()}
    assert not rows["Kimi K2"]["fit"] and abs(rows["Kimi K2"]["predicted"] / 81.7 - 1) < 0.05
    # a fit=no row is left out of the plateau: marking it fit moves the implied plateau
    table = (Path(__file__).parents[1] / "validation" / "moe_layer_piper_frontier.csv").read_text()
    as_fit = tmp_path / "t.csv"
    as_fit.write_text("\n".join(ln[:-3] + ",yes" if ln.startswith("Kimi K2,") else ln for ln in table.splitlines()))
    assert implied_gemm(as_fit) != implied_gemm()


def test_a_slower_plateau_prices_every_single_layer_slower():
    slow, spec = moe_layer_check(gemm=0.52), moe_layer_check()
    assert all(a["predicted"] < b["predicted"] for a, b in zip(slow, spec) if a["predicted"] is not None)


def test_the_best_plan_reaches_every_full_model_figure_piper_published():
    rows = full_model_bounds()
    assert len(rows) == 5 and all(r["reaches"] for r in rows), rows


def test_the_old_100_tflops_plateau_could_not_reach_piper_s_mixtral_8x7b():
    def old(hw):
        return hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"gemm": 0.52})})

    rows = {r["model"]: r for r in full_model_bounds(gcds=(16, 32, 64), hw_edit=old)}
    assert not rows["Mixtral 8x7B"]["reaches"] and rows["Mixtral 8x7B"]["best_predicted"] < 102.8 * 0.85
