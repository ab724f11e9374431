"""The track record estimate and search print: validate --residuals' figures for the model and
machine planned, read from validation/track_record.json, which must match the table today."""
import json
import math

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

