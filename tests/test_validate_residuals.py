"""validate --residuals: errors grouped by recipe setting, one setup counted once, biases tested."""
import json
import math

from click.testing import CliRunner

from piper_plan.cli import main
from piper_plan.validate import Result
from piper_plan.validate_residuals import MIN_SETUPS, residuals, setups


def _row(i, dispatcher, model="m", pp="1"):
    return {"id": i, "model": model, "model_spec": "", "hardware": "h", "hardware_spec": "", "precision": "bf16",
            "dispatcher": dispatcher, "cuda_graphs": "", "a2a_overlap": "", "expert_gemm": "", "recompute": "none",
            "pp": pp, "group": "g"}


def _result(i, err_pct, layout, metric="tokens_per_s_per_gpu", kind="moe", fit=False):
    pub = 100.0
    pred = pub * (1 + err_pct / 100) if not metric.endswith("time_s") else pub / (1 + err_pct / 100)
    return Result(i, "g", kind, metric, pub, pred, layout, fit)


def _table():
    """Five setups where hybridep runs 30 % faster in the model than measured, five near 0 %, and
    one of the biased setups re-published four more times (same layout, same prediction)."""
    res, rows = [], []
    for n, e in enumerate((28, 30, 31, 32, 29)):
        res.append(_result(f"h{n}", e, f"ep{n + 1}"))
        rows.append(_row(f"h{n}", "hybridep"))
    for k in range(4):
        res.append(_result(f"h0-again{k}", 28, "ep1"))
        rows.append(_row(f"h0-again{k}", "hybridep"))
    for n, e in enumerate((-2, 1, 0.5, -1, 2)):
        res.append(_result(f"a{n}", e, f"ep{n + 1}-a2a"))
        rows.append(_row(f"a{n}", "alltoall"))
    return res, rows


def test_rows_of_one_setup_count_once():
    res, rows = _table()
    units = setups(res, rows)
    assert len(units) == 10
    assert sorted(len(u["ids"]) for u in units)[-1] == 5  # h0 and its four re-publications


def test_a_biased_setting_is_flagged_and_an_unbiased_one_is_not():
    d = residuals(*_table())
    by = {(s["factor"], s["level"]): s for s in d["levels"]}
    hy, aa = by[("dispatcher", "hybridep")], by[("dispatcher", "alltoall")]
    assert hy["bias"] and hy["setups"] == 5 and hy["rows"] == 9
    assert math.isclose(hy["mean_pct"], 30.0, abs_tol=1.0)  # the geometric mean of +28 … +32 %
    assert not aa["bias"] and abs(aa["mean_pct"]) < 1.0


def test_an_iteration_time_row_too_short_reads_as_the_model_too_fast():
    rows = [_row(f"t{n}", "x") for n in range(4)]
    res = [_result(f"t{n}", 25 + n, f"l{n}", metric="iteration_time_s") for n in range(4)]
    for r in res:
        assert r.predicted < r.published  # a shorter step than measured
    s, = residuals(res, rows)["levels"]  # every setting holds the same four setups: tested once
    assert s["factor"] == "model" and s["mean_pct"] > 20 and s["bias"]


def test_a_level_with_too_few_setups_is_not_tested_and_memory_and_fitted_rows_are_left_out():
    rows = [_row(f"r{n}", "rare" if n < MIN_SETUPS - 1 else "common") for n in range(8)]
    res = [_result(f"r{n}", 50.0, f"l{n}") for n in range(8)]
    res[-1] = _result("r7", 50.0, "l7", kind="memory")
    res[-2] = _result("r6", 50.0, "l6", fit=True)
    d = residuals(res, rows)
    assert d["setups"] == 6
    assert ("dispatcher", "rare") not in {(s["factor"], s["level"]) for s in d["levels"]}
    common = next(s for s in d["levels"] if s["level"] == "common")
    assert common["setups"] == 4


def test_cli_prints_the_clusters_and_their_json():
    out = CliRunner().invoke(main, ["validate", "--residuals", "--group", "megatron-bridge-moe"])
    assert out.exit_code == 0, out.output
    assert "where the errors cluster" in out.output
    res = CliRunner().invoke(main, ["validate", "--residuals", "--group", "megatron-bridge-moe", "--json"])
    d = json.loads(res.output)
    assert d["setups"] > 20 and d["levels"]
    assert all(0.0 <= s["q"] <= 1.0 and s["setups"] >= MIN_SETUPS for s in d["levels"])
    none = CliRunner().invoke(main, ["validate", "--residuals", "--group", "korthikanti2022-fig1"])
    assert none.exit_code == 0 and "nothing to group" in none.output
    bad = CliRunner().invoke(main, ["validate", "--residuals", "--blind"])
    assert bad.exit_code != 0 and "--residuals" in bad.output


def test_an_error_that_grows_with_the_gpu_count_is_a_trend_and_noise_is_not():
    rows, res = [], []
    for n, (g, e) in enumerate(zip((8, 16, 32, 64, 128, 256, 512, 1024), (-4, -1, 2, 5, 9, 12, 16, 21))):
        r = _row(f"g{n}", "x")
        r.update(gpus=str(g), ep="8", mbs="1", seq="4096", hidden="2048", experts="64", topk="4")
        rows.append(r)
        res.append(_result(f"g{n}", e, f"l{n}"))
    trends = {t["setting"]: t for t in residuals(res, rows)["trends"]}
    assert trends["gpus"]["trend"] and trends["gpus"]["rho"] > 0.95
    assert "ep" not in trends  # one value: nothing to correlate
    noisy = [_result(f"g{n}", e, f"l{n}") for n, e in enumerate((3, -2, 1, -4, 2, -1, 0, 2))]
    assert not {t["setting"]: t for t in residuals(noisy, rows)["trends"]}["gpus"]["trend"]


