"""The track record estimate and search print: validate --residuals' figures for the model and
machine planned, read from validation/track_record.json, which must match the table today."""
import json
import math

import pytest
from click.testing import CliRunner

from piper_plan import track_record
from piper_plan.cli import main
from piper_plan.validate import run_with_rows
from piper_plan.validate_residuals import residuals

REWRITE = "piper-plan validate --residuals --json -o validation/track_record.json"


def _key(s):
    return s["factor"], s["level"]


def test_the_stored_track_record_is_what_the_table_gives_today():
    stored = json.loads(track_record.path().read_text())
    fresh = residuals(*run_with_rows())
    assert (stored["setups"], stored["rows"]) == (fresh["setups"], fresh["rows"]), f"stale: {REWRITE}"
    old, new = {_key(s): s for s in stored["levels"]}, {_key(s): s for s in fresh["levels"]}
    assert old.keys() == new.keys(), f"stale: {REWRITE}"
    for k, s in new.items():
        o = old[k]
        assert (o["setups"], o["rows"], o["bias"]) == (s["setups"], s["rows"], s["bias"]), f"{k} stale: {REWRITE}"
        for f in ("mean_pct", "sd_pct", "q"):
            assert math.isclose(o[f], s[f], rel_tol=1e-6, abs_tol=1e-9), f"{k} {f} stale: {REWRITE}"
    old_t, new_t = {t["setting"]: t for t in stored["trends"]}, {t["setting"]: t for t in fresh["trends"]}
    assert old_t.keys() == new_t.keys(), f"stale: {REWRITE}"
    for k, t in new_t.items():
        assert old_t[k]["setups"] == t["setups"] and old_t[k]["trend"] == t["trend"], f"{k} stale: {REWRITE}"
        assert math.isclose(old_t[k]["rho"], t["rho"], rel_tol=1e-6, abs_tol=1e-9), f"{k} stale: {REWRITE}"
    m_old, m_new = stored["memory"], fresh["memory"]
    assert (m_old["runs"], m_old["at"]) == (m_new["runs"], m_new["at"]), f"memory stale: {REWRITE}"
    assert math.isclose(m_old["max_share"], m_new["max_share"], rel_tol=1e-9), f"memory stale: {REWRITE}"


def test_a_search_whose_best_plan_is_fuller_than_any_checked_run_says_so_and_how_to_keep_a_margin():
    """The search keeps no margin of its own (--headroom-gib 0): a best plan predicted fuller than
    every published run the memory model was checked on (none above 92.6 % of its device) gets a
    note naming the headroom that keeps plans within that; with that headroom, no note."""
    share = json.loads(track_record.path().read_text())["memory"]["max_share"]
    args = ["search", "-m", "qwen3-235b-a22b", "-H", "dgx-h100", "-n", "256", "--global-batch", "2048", "--top", "1"]
    r = CliRunner().invoke(main, args + ["--json"])
    d = json.loads(r.output)
    from piper_plan.specs.registry import load_hardware

    peak, device = d["top"][0]["peak_memory_gib"], load_hardware("dgx-h100").accelerator.memory_gib
    assert peak > share * device and d["memory_note"].startswith("note: the best plan's busiest rank is predicted at")
    keep = math.ceil(10 * device * (1 - share)) / 10
    assert f"--headroom-gib {keep:g} keeps plans within that" in d["memory_note"]
    r = CliRunner().invoke(main, args + ["--headroom-gib", str(keep), "--json"])
    d = json.loads(r.output)
    assert d["memory_note"] is None and d["top"][0]["peak_memory_gib"] <= share * device


def test_where_no_plan_of_the_search_is_within_the_checked_share_the_note_names_no_headroom():
    # Mixtral 8x22B on 32 H100: even the leanest fitting plan is fuller than any checked run, so a
    # headroom would leave nothing that fits
    args = ["search", "-m", "mixtral-8x22b", "-H", "dgx-h100", "-n", "32", "--top", "1", "--objective", "memory",
            "--json"]
    note = json.loads(CliRunner().invoke(main, args).output)["memory_note"]
    assert "no plan of this search is within that" in note and "--headroom-gib" not in note


def test_a_biased_model_is_said_to_be_and_an_unvalidated_one_says_nothing():
    said = track_record.lines("gpt-oss-120b", "dgx-b300")
    assert any(line.startswith("track record, gpt-oss-120b:") and "a bias" in line and "too fast" in line
               for line in said)
    assert any(line.startswith("track record, dgx-b300:") and "no bias" in line for line in said)
    assert track_record.lines("tiny-moe", "cpu-local") == []


def test_a_missing_or_broken_file_gives_no_track_record(tmp_path, monkeypatch):
    monkeypatch.setattr(track_record, "path", lambda: tmp_path / "absent.json")
    assert track_record.lines("gpt-oss-120b", "dgx-b300") == []
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    monkeypatch.setattr(track_record, "path", lambda: bad)
    assert track_record.levels_for("gpt-oss-120b", "dgx-b300") == []


def test_estimate_prints_the_track_record_of_what_it_plans():
    out = CliRunner().invoke(main, ["estimate", "-m", "gpt-oss-120b", "-H", "dgx-h100", "-n", "64", "--pp", "4",
                                    "--ep", "8", "--global-batch", "1280", "--seq", "4096"])
    assert out.exit_code == 0, out.output
    assert "track record, gpt-oss-120b:" in out.output and "track record, dgx-h100:" in out.output


def test_validate_writes_its_json_to_a_file_and_refuses_o_without_json(tmp_path):
    f = tmp_path / "r.json"
    out = CliRunner().invoke(main, ["validate", "--residuals", "--group", "xmoe2025", "--json", "-o", str(f)])
    assert out.exit_code == 0 and f"wrote {f}" in out.output
    assert json.loads(f.read_text())["setups"] >= 1
    bad = CliRunner().invoke(main, ["validate", "--group", "xmoe2025", "-o", str(tmp_path / "x.json")])
    assert bad.exit_code != 0 and "--json" in bad.output
    assert not (tmp_path / "x.json").exists()


def test_an_edited_copy_of_a_bundled_spec_gets_no_track_record(tmp_path):
    import yaml

    from piper_plan.specs.registry import bundled_dir

    spec = yaml.safe_load((bundled_dir("models") / "gpt-oss-120b.yaml").read_text())
    spec["num_layers"] = 24  # same name, another model
    edited = tmp_path / "gpt-oss-120b.yaml"
    edited.write_text(yaml.safe_dump(spec))
    out = CliRunner().invoke(main, ["estimate", "-m", str(edited), "-H", "dgx-h100", "-n", "64", "--pp", "4",
                                    "--ep", "8", "--global-batch", "1280", "--seq", "4096"])
    assert out.exit_code == 0, out.output
    assert "track record, gpt-oss-120b" not in out.output and "track record, dgx-h100:" in out.output



def test_the_readme_states_the_memory_margin_as_stored():
    from pathlib import Path

    m = json.loads(track_record.path().read_text())["memory"]
    readme = Path(__file__).parents[1] / "README.md"
    if not readme.exists():
        pytest.skip("an installed wheel carries no top-level README.md")
    text = " ".join(readme.read_text(encoding="utf-8").split())
    assert f"any of the {m['runs']} published runs the memory model is checked on and predicts to fit (none " \
           f"above {100 * m['max_share']:.1f} % of its device;" in text
