"""An output that cannot be written, or whose write would lose a file, is a one-line error naming
the option, found before any work, and the file it would have replaced stays whole (the outputs
of test_bad_input.py's fuzzing passes)."""
from __future__ import annotations

import json
import os

import pytest
from bad_input_support import EST, REPO, SEARCH, SWEEP, _run, one_line


@pytest.mark.parametrize("where", ["afile/plan.json", "nodir/sub/plan.json"])
def test_an_unwritable_output_is_one_line_and_leaves_nothing_behind(tmp_path, where):
    (tmp_path / "afile").write_text("a file where a folder should be")
    out = tmp_path / where
    one_line([*SEARCH, "-o", str(out)], str(out), "cannot write")
    one_line([*EST, "-o", str(out)], str(out), "cannot write")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_a_readonly_folder_keeps_the_old_plan_whole(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    old = tmp_path / "plan.json"
    old.write_text("old")
    tmp_path.chmod(0o555)
    try:
        one_line([*SEARCH, "-o", str(old)], "cannot write")
    finally:
        tmp_path.chmod(0o755)
    assert old.read_text() == "old"


def test_calibrate_refuses_an_unwritable_output_before_measuring(tmp_path):
    from piper_plan.calibrate import calibrate_cmd

    (tmp_path / "afile").write_text("")
    line = one_line(["-o", str(tmp_path / "afile" / "x.yaml"), "--smoke"], "cannot create its folder",
                    cmd=calibrate_cmd)
    assert "afile" in line


@pytest.mark.parametrize("flag", ["--csv", "--json", "--plot"])
def test_sweep_checks_every_output_before_it_sweeps_and_leaves_the_others_whole(tmp_path, flag):
    # an output it could not write had failed after the sweep, with the outputs before it written
    kept = tmp_path / "kept.csv"
    kept.write_text("an earlier sweep\n")
    bad = str(tmp_path / "no-such-folder" / "out")
    args = [*SWEEP, "--vary", "nic_gbps=12.5,25"] + (["--csv", str(kept)] if flag != "--csv" else [])
    one_line([*args, flag, bad], bad, flag, "no folder")
    assert kept.read_text() == "an earlier sweep\n"


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs a folder the file system refuses writes into")
def test_an_output_in_a_folder_that_refuses_files_is_refused_before_the_sweep_even_for_root(tmp_path):
    # /proc passes os.access for root; the probe writes a file there as the atomic write would
    kept = tmp_path / "kept.csv"
    kept.write_text("an earlier sweep\n")
    one_line([*SWEEP, "--vary", "nic_gbps=12.5,25", "--csv", str(kept), "--plot", "/proc/x.png"], "/proc/x.png",
             "--plot", "cannot write")
    assert kept.read_text() == "an earlier sweep\n"


def test_a_write_through_a_symlink_updates_the_file_it_names(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "p.json").write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "real" / "p.json")
    code, out, _ = _run([*EST, "-o", str(link)])
    assert code == 0, out
    assert link.is_symlink() and json.loads((tmp_path / "real" / "p.json").read_text())["schema_version"] == 1


def test_a_metrics_file_may_go_into_folders_the_run_will_make(tmp_path):
    """piper-train makes --metrics' folders (metrics.py), so its pre-flight check accepts missing ones,
    and still refuses a file standing where a folder must go."""
    from piper_plan.errors import SpecError
    from piper_plan.files import check_writable

    check_writable(tmp_path / "runs" / "exp1" / "m.jsonl", "--metrics", make_parents=True)
    (tmp_path / "afile").write_text("")
    with pytest.raises(SpecError, match="not a folder"):
        check_writable(tmp_path / "afile" / "sub" / "m.jsonl", "--metrics", make_parents=True)
    with pytest.raises(SpecError, match="no folder"):
        check_writable(tmp_path / "runs2" / "m.jsonl", "--metrics")


@pytest.mark.parametrize("args,needle", [
    (["-o", ""], "-o: expected a file name (not empty, not a folder)"),
    (["-o", "{tmp}/newdir/"], "-o: expected a file name (not empty, not a folder)"),
    (["-m", "{tmp}/m.yaml", "-o", "{tmp}/m.yaml"], "-o: is the --model this run reads"),
])
def test_an_output_that_would_lose_a_file_is_refused(tmp_path, args, needle):
    (tmp_path / "m.yaml").write_text("base: tiny-moe\nname: mine\n")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    one_line([*EST, *args], needle)
    assert (tmp_path / "m.yaml").read_text() == "base: tiny-moe\nname: mine\n" and not (tmp_path / "newdir").exists()


def test_an_output_on_a_spec_s_base_or_a_bundled_spec_is_refused(tmp_path):
    from piper_plan.specs.registry import spec_files
    base = (REPO / "hardware" / "cpu-local.yaml").read_text()
    (tmp_path / "base.yaml").write_text(base)
    (tmp_path / "var.yaml").write_text("base: base.yaml\nname: mine\n")
    one_line(["sweep", "-m", "tiny-moe", "-H", str(tmp_path / "var.yaml"), "--gpus", "4", "--global-batch", "8",
              "--csv", str(tmp_path / "base.yaml")], "--csv: is the --hardware this run reads")
    assert (tmp_path / "base.yaml").read_text() == base
    # a bundled name stands for its file (checked on the list, not by writing over the repository's spec)
    assert spec_files("cpu-local", "hardware") == [REPO / "hardware" / "cpu-local.yaml"]
    assert [f.name for f in spec_files(str(tmp_path / "var.yaml"), "hardware")] == ["var.yaml", "base.yaml"]
    assert spec_files("no-such-machine", "hardware") == []
    (tmp_path / "plain").write_text("base: base.yaml\nname: mine\n")  # a YAML spec whatever its name
    assert [f.name for f in spec_files(str(tmp_path / "plain"), "hardware")] == ["plain", "base.yaml"]


def test_two_outputs_on_one_file_are_refused_before_the_sweep(tmp_path):
    p = str(tmp_path / "x.out")
    one_line(["sweep", "-m", "tiny-moe", "-H", "cpu-local", "--gpus", "4", "--global-batch", "8", "--csv", p,
              "--json", p], "--json: is --csv's file too")


def test_a_validation_output_on_its_own_table_is_refused(tmp_path):
    t = tmp_path / "t.csv"
    t.write_text((REPO / "validation" / "published.csv").read_text())
    one_line(["validate", "--table", str(t), "--json", "-o", str(t)], "-o: is the --table this run reads")


def test_piper_train_metrics_on_the_plan_or_a_full_disk_is_one_line(tmp_path, plan_doc):
    pytest.importorskip("torch")
    from piper_runtime.launch import main as train

    p = tmp_path / "plan.json"
    p.write_text(json.dumps(plan_doc))
    one_line(["--plan", str(p), "--steps", "1", "--metrics", str(p)], "--metrics: is the --plan this run reads",
             cmd=train)
    assert json.loads(p.read_text()) == plan_doc
    if os.path.exists("/dev/full"):  # a write that fails mid-run: the run's one-line error, not a rank's trace
        one_line(["--plan", str(p), "--steps", "1", "--metrics", "/dev/full"], "cannot write a record", cmd=train)


# ---- file names the file system cannot hold, links that lead nowhere, write-time errors -------------
LONG = "p" * 300 + ".json"  # past NAME_MAX (255 bytes): stat() itself raises ENAMETOOLONG


@pytest.mark.parametrize("args,needle", [
    (["estimate", "-m", LONG, "-H", "cpu-local", "-n", "4"], "<file>: cannot read (File name too long)"),
    (["estimate", "-m", "tiny-moe", "-H", LONG, "-n", "4"], "<file>: cannot read (File name too long)"),
    ([*EST, "--ep", "2", "--routing", LONG], "--routing: cannot read (File name too long)"),
    ([*SEARCH, "-o", LONG], "-o: cannot write (File name too long)"),
    ([*SEARCH, "-o", LONG + "/plan.json"], "-o: cannot write (File name too long)"),
    (["sweep", "-m", "tiny-moe", "-H", "cpu-local", "--gpus", "4", "--global-batch", "8", "--csv", LONG],
     "--csv: cannot write (File name too long)"),
    (["validate", "--json", "-o", LONG], "-o: cannot write (File name too long)"),
    (["calibrate", "--quick", "-o", "c" * 250 + ".yaml"], "-o (its .calibration.json): cannot write"),
])
def test_a_file_name_too_long_for_the_file_system_is_one_line(tmp_path, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)
    one_line(args, needle)


@pytest.mark.parametrize("option", ["--metrics", "--checkpoint", "--data"])
def test_a_piper_train_file_name_too_long_is_one_line(tmp_path, monkeypatch, plan_doc, option):
    pytest.importorskip("torch")
    from piper_runtime.launch import main as train

    monkeypatch.chdir(tmp_path)
    (tmp_path / "plan.json").write_text(json.dumps(plan_doc))
    one_line(["--plan", "plan.json", "--steps", "1", option, LONG], f"{option}: cannot", "File name too long",
             cmd=train)


def test_an_output_name_of_255_bytes_is_written(tmp_path):
    """A name NAME_MAX holds is written: the temp file beside it has a short fixed prefix (".{name}."
    made one past 255 bytes, and the write failed after the search)."""
    out = tmp_path / ("o" * 250 + ".json")
    code, text, _ = _run([*SEARCH, "-o", str(out)])
    assert code == 0, text
    assert json.loads(out.read_text())["schema_version"] == 1
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temp file left behind


def test_a_dangling_symlink_output_is_refused_before_the_work(tmp_path, monkeypatch):
    """The write follows the link, so the folder of the file it names must exist; checked up front
    (calibrate would otherwise measure for minutes and then lose the result)."""
    link = tmp_path / "out.json"
    link.symlink_to(tmp_path / "nonexistent" / "dir" / "x.json")
    one_line([*SEARCH, "-o", str(link)], "-o: cannot write: no folder", "nonexistent")
    one_line(["calibrate", "--quick", "-o", str(link)], "-o: cannot write: no folder")


def test_a_write_that_fails_after_the_work_names_the_option(tmp_path):
    """/dev/full passes every up-front check (a device, in a writable folder); the write's own error
    names --csv, not <file>."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    code, out, r = _run(["sweep", "-m", "tiny-moe", "-H", "cpu-local", "--gpus", "4", "--global-batch", "8",
                         "--csv", "/dev/full"])
    assert code == 2 and isinstance(r.exception, SystemExit), out  # (the sweep's table comes first)
    assert out.strip().splitlines()[-1].startswith("error: /dev/full: --csv: cannot write"), out
