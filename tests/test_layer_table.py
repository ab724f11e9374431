"""`piper-plan validate --layer-table FILE`: single-layer times a user measured, each layer priced as
the step model prices it, beside the measurement; bad rows are one line naming the file, the row
and the field (validation/layer_korthikanti_table4.csv is the schema and the bundled example)."""
import json

import pytest

from piper_plan.specs.registry import validation_dir
from piper_plan.validate_kernels import LAYER_COLUMNS, layer_time_check

from test_bad_input import _run, one_line

BUNDLED = validation_dir() / "layer_korthikanti_table4.csv"
GOOD = {"experiment": "mine", "model_spec": "gpt-22b", "hardware_spec": "dgx-a100-80gb", "tp": "8", "mbs": "4",
        "seq": "2048", "recompute": "none", "sequence_parallel": "no", "forward_ms": "7.7", "backward_ms": "11.9"}


def _table(tmp_path, **changes):
    row = {**GOOD, **changes}
    path = tmp_path / "layers.csv"
    path.write_text(",".join(row) + "\n" + ",".join(str(v) for v in row.values()) + "\n")
    return path


def test_a_user_table_is_priced_as_the_bundled_one(tmp_path):
    code, out, _ = _run(["validate", "--layer-table", str(BUNDLED), "--json"])
    assert code == 0, out
    assert json.loads(out) == layer_time_check()
    mine = layer_time_check(_table(tmp_path, attention="eager", dropout="yes"))
    assert mine[0]["predicted_fwd_ms"] == pytest.approx(layer_time_check()[0]["predicted_fwd_ms"], rel=1e-12)


def test_a_moe_model_s_layer_is_its_moe_layer_with_every_expert_local(tmp_path):
    code, out, _ = _run(["validate", "--layer-table", str(_table(tmp_path, model_spec="mixtral-8x7b",
                                                                   hardware_spec="dgx-h100", tp="2")), "--json"])
    assert code == 0, out
    (row,) = json.loads(out)
    assert row["model"] == "mixtral-8x7b" and row["predicted_bwd_ms"] > row["predicted_fwd_ms"] > 0


@pytest.mark.parametrize("change, field", [
    (dict(recompute="some"), "recompute"), (dict(tp="two"), "tp"), (dict(forward_ms="-1"), "forward_ms"),
    (dict(model_spec="no-such-model"), "model_spec"), (dict(hardware_spec="no-such-gpu"), "hardware_spec"),
    (dict(tp="7"), "tp"), (dict(sequence_parallel="maybe"), "sequence_parallel"), (dict(dtype="int4"), "dtype"),
    (dict(seq="99999999999"), "seq: expected a whole number from 1 to 16,777,216"),
    (dict(tp="2\u00b2"), "tp: expected a whole number"),  # str.isdigit() took it, int() raised
])
def test_a_bad_row_is_one_line_naming_the_file_the_row_and_the_field(tmp_path, change, field):
    path = _table(tmp_path, **change)
    one_line(["validate", "--layer-table", str(path)], str(path), "row mine", field)


def test_a_table_without_a_column_names_what_it_lacks(tmp_path):
    path = tmp_path / "layers.csv"
    path.write_text("experiment,tp\nmine,8\n")
    one_line(["validate", "--layer-table", str(path)], str(path), "columns", "model_spec")
    assert "backward_ms" in LAYER_COLUMNS


def test_it_is_its_own_question(tmp_path):
    code, out, _ = _run(["validate", "--layer-table", str(BUNDLED), "--residuals"])
    assert code == 2 and "one of them a call" in out
    code, out, _ = _run(["validate", "--layer-table", str(BUNDLED), "--group", "narayanan2021-table1"])
    assert code == 2 and "--layer-table" in out


def test_a_row_spilling_past_the_header_is_refused_not_shifted(tmp_path):
    # an unquoted comma in the experiment's name would shift every later cell one column right
    path = tmp_path / "layers.csv"
    path.write_text(",".join(GOOD) + "\n" + "mine, 2 nodes," + ",".join(list(GOOD.values())[1:]) + "\n")
    one_line(["validate", "--layer-table", str(path)], str(path), "cells", "must be quoted")


@pytest.mark.parametrize("text,needle", [
    ("", "columns"), ("\ufeff", "columns"),                     # empty, or a BOM alone: no header
    (",".join(GOOD) + "\n", "rows: the table has no rows"),      # a header alone
    (",".join(GOOD) + ",dtpye\n" + ",".join(GOOD.values()) + ",bf16\n", "dtpye not in the schema"),
    (",".join(GOOD) + "\n" + (",".join(GOOD.values()) + "\n") * 2, "experiment: appears twice"),
])
def test_an_empty_misspelt_or_repeated_table_is_one_line_not_a_trace_or_an_empty_report(tmp_path, text, needle):
    path = tmp_path / "layers.csv"
    path.write_text(text, encoding="utf-8")
    one_line(["validate", "--layer-table", str(path)], str(path), needle)
