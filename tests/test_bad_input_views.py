"""Bad input to the commands that read and show (show, show-spec, sweep's outputs, validate on a
user's table) is one line naming the file or option and what was expected, and a plan whose
figures price another layout is said: found by session 73's audits of those commands, beside
test_bad_input.py's cases."""
from __future__ import annotations

import json

import pytest
from bad_input_support import EST, REPO, SWEEP, _run, one_line


def test_a_plan_priced_for_another_layout_is_shown_with_a_warning(tmp_path, plan_doc):
    """show renders a hand-edited plan (to inspect the edit) and says its figures price another one."""
    doc = json.loads(json.dumps(plan_doc))
    doc["layout"]["zero"] = 0 if doc["layout"]["zero"] else 1
    p = tmp_path / "x.json"
    p.write_text(json.dumps(doc))
    code, out, _ = _run(["show", str(p)])
    assert code == 0 and f"warning: {p}: predicted.priced_for: the figures were priced for another plan" in out


@pytest.mark.parametrize("name,needle", [("frontir", "did you mean frontier?"), ("dgx-h10", "did you mean dgx-h100?"),
                                         ("mixtrl", "did you mean mixtral-8x7b?"),
                                         ("", "expected a bundled model or hardware name")])
def test_show_spec_of_a_misspelt_name_suggests_a_model_or_a_machine(name, needle):
    one_line(["show-spec", name], "<name>", needle)


def test_a_plan_given_as_a_spec_is_told_to_use_show(tmp_path, plan_doc):
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(plan_doc))
    for args in (["show-spec", str(p)], [*EST[:2], str(p), *EST[3:]], [*EST[:4], str(p), *EST[5:]]):
        one_line(args, str(p), "this is a plan.json, not a spec: render it with piper-plan show")


def test_sweep_gpu_counts_take_ascii_digits_only():
    one_line(["sweep", "-m", "tiny-moe", "-H", "cpu-local", "--gpus", "4,²"], "--gpus",
             "distinct GPU counts, each 1..16,777,216")


def test_sweep_refuses_a_headroom_that_leaves_every_scenario_nothing():
    one_line([*SWEEP, "--headroom-gib", "100"], "--headroom-gib", "leaves nothing")
    one_line([*SWEEP, "--headroom-gib", "3", "--vary", "hbm_gib=2,2.5"], "--headroom-gib", "expected less than 2.5")


@pytest.mark.parametrize("cmd", [SWEEP, ["validate", "--group", "narayanan2021-table1"]])
def test_a_plot_in_a_format_matplotlib_cannot_write_is_one_line(tmp_path, cmd):
    one_line([*cmd, "--plot", str(tmp_path / "x.docx")], "--plot", "expected a suffix matplotlib writes", "got .docx")


def _published(tmp_path, edit):
    src = (REPO / "validation" / "published.csv").read_text().splitlines()
    row = next(x for x in src if x.startswith("nar21-t1-1.7b,"))
    assert ",hw_tflops_per_gpu,137," in row
    p = tmp_path / "mine.csv"
    p.write_text(src[0] + "\n" + edit(row) + "\n")
    return str(p)


@pytest.mark.parametrize("metric,value,needle", [
    ("hw_tflops_per_gpu", "137000", "137000 TFLOP/s a GPU is above dgx-a100-80gb's highest peak (312 TFLOP/s)"),
    ("hw_tflops_per_gpu", "1e308", "TFLOP/s a GPU is above"),
    ("tokens_per_s_per_gpu", "9e9", "tokens/s a GPU is"),
    # as slow as no run publishes: a step of more than a day (1e308 s had written -Infinity into --json)
    ("iteration_time_s", "1e308", "means a step of 1e+308 s, more than a day"),
    ("tokens_per_s_per_gpu", "1e-300", "more than a day"),
])
def test_a_measured_figure_above_what_its_machine_can_do_is_a_unit_slip(tmp_path, metric, value, needle):
    """A unit slip had been priced at -99.9 % and entered the means; 1e308 had written Infinity."""
    p = _published(tmp_path, lambda r: r.replace(",hw_tflops_per_gpu,137,", f",{metric},{value},"))
    one_line(["validate", "--table", p], p, "row nar21-t1-1.7b: value:", needle, "a unit slip?")


def test_explain_names_one_row_so_a_group_beside_it_is_refused():
    one_line(["validate", "--explain", "nar21-t1-1.7b", "--group", "xmoe2025"], "--explain names one row",
             "not with --group")


def test_validate_json_holds_no_infinity_or_nan():
    from piper_plan.cli_validate import _finite
    assert _finite({"a": [float("inf"), 1.5, float("nan")], "b": -float("inf")}) == {"a": [None, 1.5, None], "b": None}


def test_explain_of_a_row_on_a_machine_without_a_spec_says_it_is_not_priced(tmp_path):
    p = _published(tmp_path, lambda r: r.replace(",dgx-a100-80gb,", ",Gaudi 3,", 1)
                   .replace(",dgx-a100-80gb,no,", ",,no,"))
    code, out, _ = _run(["validate", "--table", p, "--explain", "nar21-t1-1.7b"])
    assert code == 0 and "published 137, no hardware spec: 'Gaudi 3'" in out


def test_a_batch_scan_with_no_planner_s_choice_row_says_so(tmp_path):
    p = _published(tmp_path, lambda r: r)
    code, out, _ = _run(["validate", "--table", p, "--batch-scan"])
    assert code == 0 and out.strip() == ("no planner's-choice rows (their layout left to the search) to price at "
                                         "other batches: nothing to scan")
