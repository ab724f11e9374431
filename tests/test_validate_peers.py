"""Other planners' predictions of bundled rows (validation/peers.csv), beside Piper's."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from click.testing import CliRunner

from piper_plan import validate as V
from piper_plan.cli import main
from piper_plan.validate_peers import beside, read_peers


@pytest.fixture(scope="module")
def kor22():
    return V.run(group="korthikanti2022-table5")


def test_calculons_rows_reproduce_its_published_accuracy_on_its_own_eight_points():
    """Calculon (SC23) reports 3.65 % mean / 8.87 % max iteration-time error on Korthikanti 2022
    Table 5's eight runs; its predictions as bundled, against the bundled table's published times,
    give exactly that, so the rows are Calculon's output and not a transcription slip."""
    peers = [p for p in read_peers() if p["peer"] == "calculon"]
    published = {r["id"]: float(r["value"]) for r in csv.DictReader(open(V.data_path(), newline="",
                                                                           encoding="utf-8"))}
    err = np.array([abs(p["predicted"] / published[p["id"]] - 1) * 100 for p in peers])
    assert len(peers) == 8 and all(p["id"].startswith("kor22-t5-") for p in peers)
    assert round(float(err.mean()), 2) == 3.65 and round(float(err.max()), 2) == 8.87
    assert all(p["source"].startswith("calculon-ai/calculon") for p in peers)


def test_each_peer_row_sits_beside_pipers_prediction_of_the_same_row(kor22):
    got = beside(kor22)
    mine = {r.id: r for r in kor22}
    assert len(got["rows"]) == 8
    for row in got["rows"]:
        r = mine[row["id"]]
        assert row["published"] == r.published and row["predicted"] == r.predicted
        assert row["error_pct"] == pytest.approx(r.error_pct)
        assert row["peer_error_pct"] == pytest.approx(100 * (row["peer_predicted"] / r.published - 1))
    s = got["peers"]["calculon"]
    assert s["rows"] == 8
    assert s["mape"] == pytest.approx(np.mean([abs(r.error_pct) for r in kor22]))
    assert s["peer_mape"] == pytest.approx(3.65, abs=0.005)


def test_a_peer_row_in_another_metric_or_of_an_unpriced_row_is_left_out(kor22):
    peer = dict(read_peers()[0])
    other_metric = dict(peer, metric="model_tflops_per_gpu")
    unknown = dict(peer, id="no-such-row")
    assert beside(kor22, [other_metric, unknown]) == {"rows": [], "peers": {}}


def test_validate_prints_the_peer_table_and_puts_it_in_the_json():
    r = CliRunner().invoke(main, ["validate", "--group", "korthikanti2022-table5"])
    assert r.exit_code == 0, r.output
    assert "other planners' predictions of the same rows" in r.output
    assert "calculon: mean |error| 3.7%, max 8.9% against Piper's" in " ".join(r.output.split())
    r = CliRunner().invoke(main, ["validate", "--group", "korthikanti2022-table5", "--json"])
    assert r.exit_code == 0
    assert json.loads(r.output)["peers"]["peers"]["calculon"]["rows"] == 8
    r = CliRunner().invoke(main, ["validate", "--group", "narayanan2021-table1"])
    assert r.exit_code == 0 and "other planners" not in r.output  # no peer predicted those rows


def test_the_validation_readme_states_both_tools_errors_as_priced_now(kor22):
    """validation/README.md's Calculon table: its last line holds both tools' mean / max |error|
    over the eight runs, Piper's as the model prices them now."""
    s = beside(kor22)["peers"]["calculon"]
    text = (V.data_path().parent / "README.md").read_text(encoding="utf-8")
    line = f"| mean / max \\|error\\| | | | {s['peer_mape']:.2f} / {s['peer_max_abs_pct']:.2f} % | | " \
           f"{s['mape']:.2f} / {s['max_abs_pct']:.2f} % |"
    assert line in text, line


def test_the_readme_states_both_tools_errors_as_priced_now(kor22):
    s = beside(kor22)["peers"]["calculon"]
    text = " ".join((V.data_path().parents[1] / "README.md").read_text(encoding="utf-8").split()) \
        if (V.data_path().parents[1] / "README.md").exists() else None
    if text is None:
        pytest.skip("an installed wheel carries no top-level README.md")
    assert f"reports {s['peer_mape']:.2f} % mean / {s['peer_max_abs_pct']:.2f} % max iteration-time error" in text
    assert f"Piper reads {s['mape']:.2f} % mean / {s['max_abs_pct']:.2f} % max, out of sample" in text
