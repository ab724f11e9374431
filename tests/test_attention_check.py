"""The attention pricing against cuDNN 9.19's published SDPA sweep (validate_attention): each
spec's plateau, measured causal at 4,096 tokens, with the kernel's fixed cost a query block's
pass (Efficiency.attention_blocks) fitted to the sweep's unmasked rows at 4k-16k; the causal
rows are out of sample and follow the length law, the windowed ones less well on H200
(validation/README.md, "Fused attention's block costs")."""
import json

import pytest
from click.testing import CliRunner

from piper_plan.cli import main
from piper_plan.validate_attention import attention_check, summary

ROWS = attention_check()
SUMMARY = summary(ROWS, min_seq=2048)
SPECS = ("gb200-nvl72", "gb300-nvl72", "dgx-h200")


def test_every_row_of_the_sweep_is_priced_on_its_spec():
    assert len(ROWS) == 45
    assert {(r["hardware"], r["kind"]) for r in ROWS} == {(h, k) for h in SPECS
                                                          for k in ("no mask", "causal", "window")}
    assert all(r["forward_predicted"] > 0 and r["backward_predicted"] > 0 for r in ROWS)


@pytest.mark.parametrize("hw", SPECS)
def test_a_causal_layer_at_the_plateaus_length_takes_the_time_the_kernel_took(hw):
    # the plateaus come from other sources (the specs name them); this sweep is out of sample
    assert abs(SUMMARY[f"{hw} / causal"]["time_error_pct"][4096]) < 12.0


@pytest.mark.parametrize("hw", SPECS)
def test_a_causal_layers_time_keeps_its_4k_error_from_2k_to_32k(hw):
    # one flat rate drifted a quarter slow by 32k (+31 ... +34 %); the block costs follow the kernel
    err = SUMMARY[f"{hw} / causal"]["time_error_pct"]
    assert all(abs(e - err[4096]) <= 6.0 for e in err.values()), err


@pytest.mark.parametrize("hw", ["gb200-nvl72", "gb300-nvl72"])
def test_blackwells_narrow_windows_are_priced_within_an_eighth(hw):
    # the benchmark's 1,024-token window over GPT-OSS's heads of 64: one flat rate had priced them 16-29 % fast
    err = SUMMARY[f"{hw} / window"]["time_error_pct"]
    assert all(0.0 < e <= 13.0 for e in err.values()), err


def test_h200s_narrow_windows_stay_priced_a_quarter_to_a_third_slow():
    # the known miss (validation/README.md): against H200's own 4k causal error (+11 %), the windowed
    # rows read 14-21 points slower; the flat rate had them -8 ... +4 %
    err = SUMMARY["dgx-h200 / window"]["time_error_pct"]
    assert all(20.0 <= e <= 35.0 for e in err.values()), err


def test_validate_json_holds_the_check():
    out = CliRunner().invoke(main, ["validate", "--json"])
    assert out.exit_code == 0, out.output
    att = json.loads(out.output)["attention_cudnn"]
    assert len(att["rows"]) == 45 and "dgx-h200 / window" in att["summary"]
