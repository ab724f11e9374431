"""piper-train end to end (real processes) and its one-line errors on bad input."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from piper_plan.layout import Layout  # noqa: E402
from piper_plan.plan import make_plan, write_plan  # noqa: E402
from piper_plan.specs.registry import load_hardware, load_model  # noqa: E402
from piper_runtime.launch import main  # noqa: E402


def _cmd(name: str, module: str) -> list[str]:
    exe = shutil.which(name)
    return [exe] if exe else [sys.executable, "-m", module]


def _write(tmp_path, name="plan.json", model=None, **kw):
    # priced as piper-train runs it (search --runtime piper-train): eager modules, reduction after the pipeline
    lay = dict(gpus=2, pp=1, dp=2, ep=2, global_batch=4, seq=32, dtype="fp32", fused_kernels=False,
               overlap_grad_reduce=False)
    lay.update(kw)
    p = tmp_path / name
    write_plan(make_plan(model or load_model("tiny-moe"), load_hardware("cpu-local"), Layout(**lay)), p)
    return p


def _run(args, env=None):
    return subprocess.run(_cmd("piper-train", "piper_runtime.launch") + args, capture_output=True, text=True,
                          timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_train_ep2_bf16_from_token_file(tmp_path):
    plan = _write(tmp_path, dtype="bf16")
    data = tmp_path / "tokens.npy"
    np.save(data, (np.arange(5000) * 7 % 512).astype(np.uint16))
    r = _run(["--plan", str(plan), "--steps", "3", "--metrics", str(tmp_path / "m.jsonl"), "--data", str(data), "--lr", "1e-2"])
    assert r.returncode == 0, r.stderr[-2000:]
    recs = _records(tmp_path / "m.jsonl")
    steps = [x for x in recs if "step" in x]
    assert [x["step"] for x in steps] == [0, 1, 2]
    assert all(np.isfinite(x["loss"]) and x["tokens_per_s"] > 0 for x in steps)
    assert steps[-1]["loss"] < steps[0]["loss"]  # a periodic token stream is learnable
    # each record splits the slowest rank's step into phases (wall and CPU s) that add up to it
    ph = steps[-1]["phase_s"]
    walls = [ph[k] for k in ("pipeline", "grad_reduce", "clip", "optimizer")]
    assert all(w >= 0 for w in walls) and sum(walls) == pytest.approx(steps[-1]["step_time_s"], rel=1e-6)
    assert 0 < steps[-1]["cpu_s_all_ranks"]
    assert recs[-1]["summary"] and recs[-1]["measured_step_time_s"] > 0
    assert "step time: measured" in r.stdout


def test_search_then_train(tmp_path):
    plan = tmp_path / "plan.json"
    s = subprocess.run(_cmd("piper-plan", "piper_plan.cli") + ["search", "-m", "tiny-moe", "-H", "cpu-local", "-n", "4",
                                                                "--global-batch", "8", "--runtime", "piper-train",
                                                                "-o", str(plan)],
                       capture_output=True, text=True, timeout=120)
    assert s.returncode == 0, s.stderr[-2000:]
    r = _run(["--plan", str(plan), "--steps", "3", "--metrics", str(tmp_path / "m.jsonl")])
    assert r.returncode == 0, r.stderr[-2000:]
    summary = _records(tmp_path / "m.jsonl")[-1]
    assert summary["predicted_step_time_s"] > 0  # the planner's prediction is printed beside ours
    assert summary["measured_over_predicted"] == pytest.approx(
        summary["measured_step_time_s"] / summary["predicted_step_time_s"])
    assert "predicted" in r.stdout and "ratio" in r.stdout
    # the memory line parts the modelled bytes from the spec's fixed overhead, most of a tiny model's peak
    fixed = load_hardware("cpu-local").memory_overhead_gib
    assert f"modelled, {fixed:g} the spec's fixed memory_overhead_gib)" in r.stdout
    # the search's best runs every expert on each rank (ep 1): max/mean is 1 by definition, nothing to compare
    assert json.loads(plan.read_text())["layout"]["ep"] == 1
    assert "EP load" not in r.stdout and summary["measured_ep_max_over_mean"] is None
    assert summary["predicted_ep_max_over_mean"] is None


def test_the_run_reports_its_ep_load_beside_the_plan_s(tmp_path):
    from piper_plan.evaluate import build_plan, estimate_layout

    spec, hw = load_model("tiny-moe"), load_hardware("cpu-local")
    lay = Layout(gpus=2, dp=2, ep=2, global_batch=8, seq=32, dtype="fp32", fused_kernels=False,
                 overlap_grad_reduce=False)
    plan = tmp_path / "plan.json"
    write_plan(build_plan(spec, hw, lay, estimate_layout(spec, hw, lay)), plan)
    r = _run(["--plan", str(plan), "--steps", "3", "--metrics", str(tmp_path / "m.jsonl")])
    assert r.returncode == 0, r.stderr[-2000:]
    recs = _records(tmp_path / "m.jsonl")
    summary, measured = recs[-1], [v for x in recs[1:-1] for g in x["ep_max_over_mean"].values() for v in g.values()]
    assert summary["predicted_ep_max_over_mean"] > 1.0  # two ranks: some sampling noise is expected
    # the median over the steps the step time is measured on (the second half: steps 2-3 here)
    assert summary["measured_ep_max_over_mean"] == pytest.approx(statistics.median(measured))
    assert "EP load: measured max/mean" in r.stdout
    # the summary names the model it trained, so planning this model with its loads says nothing
    assert (summary["model"], summary["model_hash"]) == ("tiny-moe", json.loads(plan.read_text())["model_hash"])
    from piper_plan.cli import main as plan_cli

    again = CliRunner().invoke(plan_cli, ["estimate", "-m", "tiny-moe", "-H", "cpu-local", "-n", "2", "--dp", "2",
                                          "--ep", "2", "--global-batch", "8", "--seq", "32",
                                          "--routing", str(tmp_path / "m.jsonl")])
    assert again.exit_code == 0 and "warning" not in again.output, again.output


def test_a_run_more_unevenly_loaded_than_planned_is_pointed_at_its_own_routing(tmp_path):
    from piper_plan.evaluate import build_plan, estimate_layout
    from piper_runtime.metrics import routing_hint

    spec, hw = load_model("tiny-moe"), load_hardware("cpu-local")
    lay = Layout(gpus=2, dp=2, ep=2, global_batch=8, seq=32, dtype="fp32")
    plan = build_plan(spec, hw, lay, estimate_layout(spec, hw, lay))
    planned = plan.predicted.ep_load_step
    assert routing_hint(plan, planned, None) is None and routing_hint(plan, planned * 1.04, None) is None
    hint = routing_hint(plan, planned * 1.5, tmp_path / "m.jsonl")
    assert f"--routing {tmp_path / 'm.jsonl'}" in hint and "50% more unevenly" in hint


def _one_line_error(result, *needles):
    out = (result.stderr if hasattr(result, "stderr") else result.output).strip()
    assert result.exit_code == 2, result.output
    assert len(out.splitlines()) == 1 and out.startswith("error: "), out
    assert "Traceback" not in result.output
    for n in needles:
        assert n in out, out


def test_bad_inputs_give_one_line_errors(tmp_path):
    run = CliRunner().invoke
    plan = _write(tmp_path)

    _one_line_error(run(main, ["--plan", str(plan)], env={"RANK": "0", "WORLD_SIZE": "3"}),
                    "plan is for 2 ranks", "has 3")

    doc = json.loads(plan.read_text())
    doc["schema_version"] = 99
    bad = tmp_path / "v99.json"
    bad.write_text(json.dumps(doc))
    _one_line_error(run(main, ["--plan", str(bad)]), "schema_version", "99")

    # features of other runtimes the planner prices but piper-train does not run
    _one_line_error(run(main, ["--plan", str(_write(tmp_path, "ov.json", a2a_overlap=True))]),
                    "layout.a2a_overlap", "does not overlap")
    _one_line_error(run(main, ["--plan", str(_write(tmp_path, "ms.json", expert_gemm="multistream"))]),
                    "layout.expert_gemm", "multistream")
    _one_line_error(run(main, ["--plan", str(_write(tmp_path, "f8.json", fp8="mxfp8"))]), "layout.fp8", "mxfp8")
    _one_line_error(run(main, ["--plan", str(_write(tmp_path, "dd.json", a2a="dedup"))]), "layout.a2a", "dedup")
    _one_line_error(run(main, ["--plan", str(_write(tmp_path, "pa.json", expert_probs="activation", fused_kernels=True))]),
                    "layout.expert_probs", "activation")
    _one_line_error(run(main, ["--plan", str(_write(tmp_path, "cg.json", cuda_graphs=("attn",)))]),
                    "layout.cuda_graphs", "attn")
    _one_line_error(run(main, ["--plan", str(_write(tmp_path, "af8.json", attention_fp8=True, fp8="current"))]),
                    "layout.attention_fp8", "FP8")
    _one_line_error(run(main, ["--plan", str(_write(tmp_path, "tpo.json", tp_comm_overlap=True))]),
                    "layout.tp_comm_overlap", "pipelined")
    # a plan priced another way than piper-train runs: its prediction would not hold (tiny-moe on 4 CPU
    # ranks: 66.7 ms a step priced fused and overlapped, 88.4 ms as piper-train runs it)
    _one_line_error(run(main, ["--plan", str(_write(tmp_path, "fk.json", fused_kernels=True))]),
                    "layout.fused_kernels", "--runtime piper-train")
    _one_line_error(run(main, ["--plan", str(_write(tmp_path, "og.json", overlap_grad_reduce=True))]),
                    "layout.overlap_grad_reduce", "--runtime piper-train")
    mtp = load_model("tiny-moe").model_copy(update={"mtp_layers": 1})
    _one_line_error(run(main, ["--plan", str(_write(tmp_path, "mtp.json", model=mtp))]), "model.mtp_layers", "1")
    # ZeRO-2 reduces as autograd accumulates; torch's weight-split schedules accumulate by hand
    _one_line_error(run(main, ["--plan", str(_write(tmp_path, "z2.json", gpus=4, pp=2, vpp=2, schedule="zbv",
                                                    zero=2, global_batch=8))], env={"RANK": "0", "WORLD_SIZE": "4"}),
                    "layout.zero", "zbv")
    _one_line_error(run(main, ["--plan", str(_write(tmp_path, "rm.json", recompute="selective",
                                                    recompute_modules=("core_attn", "moe_act")))]),
                    "layout.recompute_modules", "moe_act")

    # tensor parallelism runs, but sequence parallelism needs the sequence split evenly (the planner
    # writes no such plan: a hand edit)
    tp_plan = _write(tmp_path, "tp.json", tp=2, dp=1, ep=1)
    doc = json.loads(tp_plan.read_text())
    doc["layout"]["seq"] = 33
    tp_plan.write_text(json.dumps(doc))
    _one_line_error(run(main, ["--plan", str(tp_plan)]), "sequence parallelism", "tp=2")

    empty = tmp_path / "nock"
    empty.mkdir()
    _one_line_error(run(main, ["--plan", str(plan), "--checkpoint", str(empty), "--resume"]), "no checkpoint")

    ck = tmp_path / "garbage"
    (ck / "step_00000002").mkdir(parents=True)
    (ck / "latest").write_text("step_00000002\n")
    (ck / "step_00000002" / "meta.json").write_text(json.dumps({"step": 2, "model_hash": json.loads(
        plan.read_text())["model_hash"]}))
    (ck / "step_00000002" / ".metadata").write_bytes(b"\x00not a pickle")
    _one_line_error(run(main, ["--plan", str(plan), "--checkpoint", str(ck), "--resume"]), ".metadata", "corrupted")

    wrong = tmp_path / "tokens.npy"
    np.save(wrong, np.arange(1000, dtype=np.int64))
    _one_line_error(run(main, ["--plan", str(plan), "--data", str(wrong)]), "tokens.npy", "int64")


def test_damaged_checkpoint_shard_is_one_line_error(tmp_path):
    """Only the worker that reads the shard can see this damage: still one line, exit 2."""
    plan = _write(tmp_path, gpus=1, dp=1, ep=1)
    ck = tmp_path / "ck"
    run = CliRunner().invoke
    ok = run(main, ["--plan", str(plan), "--steps", "1", "--checkpoint", str(ck)])
    assert ok.exit_code == 0, ok.output
    # resuming a run that has nothing left to do says so (it exited silently)
    done = run(main, ["--plan", str(plan), "--steps", "1", "--checkpoint", str(ck), "--resume"])
    assert done.exit_code == 0 and "at step 1 already; nothing to train" in done.output, done.output
    shard = next((ck / "step_00000001").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    _one_line_error(run(main, ["--plan", str(plan), "--steps", "2", "--checkpoint", str(ck), "--resume"]),
                    "cannot load")


def test_a_plan_whose_ranks_outgrow_this_hosts_memory_is_refused_before_any_rank_starts(tmp_path):
    """On the CPU every rank is a local process: DeepSeek-V3's 1,024-GCD plan (51 GiB a rank)
    started a thousand processes on a 2-core host and hung in the rendezvous. The ranks' predicted
    peak memory, summed, is now held against the host's available memory first."""
    from piper_plan.evaluate import build_plan, estimate_layout

    spec, hw = load_model("tiny-moe"), load_hardware("cpu-local")
    # a device that holds what the ranks need, as Frontier's GCD held DeepSeek-V3's ranks
    hw = hw.model_copy(update={"accelerator": hw.accelerator.model_copy(update={"memory_gib": 2e4})})
    lay = Layout(gpus=2, dp=2, ep=2, global_batch=4, seq=32, dtype="fp32", fused_kernels=False,
                 overlap_grad_reduce=False)
    doc = json.loads(build_plan(spec, hw, lay, estimate_layout(spec, hw, lay)).model_dump_json())
    for st in doc["predicted"]["memory_gib_per_stage"]:  # more than any host has, per rank, the figures agreeing
        st.update(activations=st["activations"] + 1e4, total=st["total"] + 1e4)
    doc["predicted"]["peak_memory_gib"] = max(st["total"] for st in doc["predicted"]["memory_gib_per_stage"])
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(doc))
    _one_line_error(CliRunner().invoke(main, ["--plan", str(plan), "--steps", "1"]), "layout.gpus",
                    "2 local ranks of 10000.", "GiB each", "GiB available")


def _limited(args, bytes_per_file: int):
    """piper-train with `args` where no process may write a file past `bytes_per_file` (ulimit -f)."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (bytes_per_file, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    return subprocess.run(_cmd("piper-train", "piper_runtime.launch") + args, capture_output=True, text=True,
                          timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"}, preexec_fn=limit)


def test_a_metrics_write_that_fails_leaves_whole_records_that_the_next_run_appends_to(tmp_path):
    """A file-size limit (or a full disk) mid-run: the failed write left part of a record, the next
    run's first record was glued to it, and `piper-plan search --routing` refused the file
    ("line 16: expected one JSON object per line")."""
    from piper_plan.cost.migration import load_histogram

    plan, m = _write(tmp_path), tmp_path / "m.jsonl"
    r = _limited(["--plan", str(plan), "--steps", "40", "--metrics", str(m), "--log-every", "0"], 20 * 1024)
    assert r.returncode == 2 and r.stderr.strip() == f"error: {m}: --metrics: cannot write a record (File too large)"
    assert m.read_bytes().endswith(b"\n") and all(isinstance(x, dict) for x in _records(m)), m.read_bytes()[-200:]
    again = _run(["--plan", str(plan), "--steps", "2", "--metrics", str(m), "--log-every", "0"])
    assert again.returncode == 0, again.stderr[-2000:]
    assert _records(m)[-1]["summary"] and load_histogram(m).sum() > 0


def test_a_record_a_killed_run_left_half_written_is_dropped_before_the_next_run_appends(tmp_path):
    """A run killed inside a write leaves a last line without its newline: the next run's records
    start on a line of their own, and the half record (never a record) goes; a whole last record
    that lacks only its newline stays."""
    from piper_runtime.metrics import open_records

    half, whole = tmp_path / "half.jsonl", tmp_path / "whole.jsonl"
    half.write_text('{"step": 0, "loss": 6.2}\n{"step": 1, "lo')
    whole.write_text('{"step": 0, "loss": 6.2}\n{"step": 1, "loss": 6.1}')
    for f in (half, whole):
        with open_records(f) as fh:
            fh.write(b'{"step": 2, "loss": 6.0}\n')
    assert [r["step"] for r in _records(half)] == [0, 2]
    assert [r["step"] for r in _records(whole)] == [0, 1, 2]
    # text that is no record of ours (`--metrics /dev/stdout >> log`) is kept, the records after it
    log = tmp_path / "log.txt"
    log.write_text("previous log line without newline")
    with open_records(log) as fh:
        fh.write(b'{"step": 0, "loss": 6.0}\n')
    assert log.read_text() == 'previous log line without newline\n{"step": 0, "loss": 6.0}\n'


def test_a_failed_checkpoint_write_is_named_by_its_os_error_wherever_dcp_nests_it():
    """DCP gathers each rank's failure into a CheckpointException, and a later phase can gather those
    again; a writer may re-raise ENOSPC as a RuntimeError. The disk test below read
    "(CheckpointException)" in one CI run where the reason sat one level deeper."""
    from torch.distributed.checkpoint.api import CheckpointException

    from piper_runtime.checkpoint import _first_os_error

    enospc = OSError(28, "No space left on device")
    inner = CheckpointException("write", {1: (enospc, None)})
    assert _first_os_error(CheckpointException("finish", {0: (inner, None)})) == "No space left on device"
    try:
        try:
            raise enospc
        except OSError:
            raise RuntimeError("file write failed")  # the OSError is its __context__
    except RuntimeError as e:
        assert _first_os_error(CheckpointException("write", {0: (e, None)})) == "No space left on device"
    text = RuntimeError("PytorchStreamWriter failed writing file data/0: [Errno 28] No space left on device")
    assert _first_os_error(CheckpointException("write", {0: (text, None)})) == "No space left on device"
    assert _first_os_error(CheckpointException("write", {0: (ValueError("odd"), None)})) == "CheckpointException"


def test_a_checkpoint_write_whose_os_error_was_lost_is_named_by_the_space_left(tmp_path):
    """gather_object pickles each rank's failure, which drops the OSError that torch.save's
    RuntimeError ("unexpected pos") carries as its context: the file system's free space says it."""
    import shutil

    from piper_runtime.checkpoint import _space_left

    free = shutil.disk_usage(tmp_path).free
    assert _space_left(tmp_path / ".step_00000002.tmp", free * 2).startswith("No space left on device: ")
    assert _space_left(tmp_path, 1) is None  # a disk with room: the failure was something else


def test_a_checkpoint_past_the_file_size_limit_is_named_by_it(tmp_path):
    """ulimit -f below a rank's checkpoint file: torch.save's short write loses the EFBIG on the way
    (as it does a full disk's ENOSPC), and the one line said only "(CheckpointException)"."""
    plan, ck = _write(tmp_path), tmp_path / "ck"
    r = _limited(["--plan", str(plan), "--steps", "1", "--checkpoint", str(ck), "--log-every", "0"], 2**20)
    lines = (r.stdout + r.stderr).strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, lines[:5]
    assert lines[0].startswith(f"error: {ck}: cannot write checkpoint step 1 (File too large: files may hold 1.0 MiB "
                               "here (ulimit -f)"), lines
    assert not list(ck.glob(".step_*")) and not (ck / "latest").exists()


def test_a_checkpoint_the_disk_cannot_hold_is_one_line_and_keeps_the_previous_one(tmp_path):
    """A full file system mid-run: DeepCheckpoint's exception (every rank's traceback, 466 lines in
    an audit) becomes one line naming the folder and the reason, and the last good checkpoint and
    its `latest` stay. Needs a small tmpfs, so root."""
    small = tmp_path / "small"
    small.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(small)],
                                           capture_output=True).returncode:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        plan, ck = _write(tmp_path), small / "ck"
        first = _run(["--plan", str(plan), "--steps", "1", "--checkpoint", str(ck), "--log-every", "0"])
        assert first.returncode == 0, first.stderr[-2000:]
        st = os.statvfs(small)  # leave 1 MiB: less than a checkpoint of this plan (about 8 MiB)
        (small / "filler").write_bytes(b"\0" * (st.f_bavail * st.f_frsize - 2**20))
        r = _run(["--plan", str(plan), "--steps", "2", "--checkpoint", str(ck), "--resume", "--log-every", "0"])
        lines = (r.stdout + r.stderr).strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, lines[:5]
        assert lines[0].startswith(f"error: {ck}: cannot write checkpoint step 2") and "No space left" in lines[0]
        assert (ck / "latest").read_text().strip() == "step_00000001" and not list(ck.glob(".step_*"))
    finally:
        subprocess.run(["umount", str(small)], capture_output=True)


def _live(pgid: int) -> list[int]:
    """Processes of a process group that have not exited (zombies aside)."""
    out = []
    for st in Path("/proc").glob("[0-9]*/stat"):
        try:
            f = st.read_text().rsplit(")", 1)[1].split()  # state, ppid, pgrp, ...
        except (OSError, IndexError):
            continue
        if int(f[2]) == pgid and f[0] != "Z":
            out.append(int(st.parent.name))
    return out


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads process groups from /proc")
def test_ctrl_c_stops_every_rank_in_one_line_and_the_checkpoint_resumes(tmp_path):
    """Ctrl-C (SIGINT to the terminal's process group) mid-run: each rank printed a KeyboardInterrupt
    traceback (87 lines on 2 ranks, then click's "Aborted!", exit 1), and a SIGINT to the launcher
    alone left the ranks training to the end. Now: one line naming the checkpoint to resume, exit
    130, no rank left; that checkpoint resumes, and its save clears the temp folder an interrupted
    save left. A fresh run into a folder that holds a checkpoint is refused (it re-pointed `latest`
    and replaced or pruned the old run's steps)."""
    plan, ck = _write(tmp_path), tmp_path / "ck"

    def ctrl_c():
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # a background job's ignored SIGINT would be inherited
        os.setsid()

    r = subprocess.Popen(_cmd("piper-train", "piper_runtime.launch") + [
        "--plan", str(plan), "--steps", "100000", "--checkpoint", str(ck), "--checkpoint-every", "2",
        "--log-every", "0", "--timeout", "30"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"}, preexec_fn=ctrl_c)
    try:
        end = time.monotonic() + 90
        while not (ck / "latest").is_file() and r.poll() is None and time.monotonic() < end:
            time.sleep(0.2)
        assert (ck / "latest").is_file(), r.communicate(timeout=30)
        os.killpg(r.pid, signal.SIGINT)
        out, err = r.communicate(timeout=30)
    finally:
        if r.poll() is None:
            os.killpg(r.pid, signal.SIGKILL)
    held = (ck / "latest").read_text().strip()
    assert r.returncode == 130 and "Traceback" not in err, err[-2000:]
    assert err.strip().splitlines() == [f"error: interrupted, every rank stopped; {ck} holds {held} "
                                        "(--resume continues from it)"]
    end = time.monotonic() + 10
    while _live(r.pid) and time.monotonic() < end:
        time.sleep(0.2)
    assert not _live(r.pid)

    fresh = CliRunner().invoke(main, ["--plan", str(plan), "--steps", "1", "--checkpoint", str(ck)])
    _one_line_error(fresh, f"--checkpoint {ck}: holds a checkpoint already ({held})", "--resume")

    (ck / ".step_99999999.tmp").mkdir()  # what a save interrupted at a step never reached again leaves
    step = int(held.split("_")[1])
    again = _run(["--plan", str(plan), "--steps", str(step + 2), "--checkpoint", str(ck), "--resume",
                  "--metrics", str(tmp_path / "m.jsonl")])
    assert again.returncode == 0, again.stderr[-2000:]
    assert (ck / "latest").read_text().strip() == f"step_{step + 2:08d}" and not list(ck.glob(".step_*"))
    # the summary numbers the steps it measured as the run does: a resumed run's second half is its last step
    summary = _records(tmp_path / "m.jsonl")[-1]
    assert summary["measured_steps"] == [step + 2, step + 2]


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _training(plan, metrics, timeout_s, sigint) -> subprocess.Popen:
    """piper-train running `plan` without end in its own process group, SIGINT set to `sigint`
    there, once its first step record is in `metrics`."""
    def own_group():
        signal.signal(signal.SIGINT, sigint)
        os.setsid()

    r = subprocess.Popen(_cmd("piper-train", "piper_runtime.launch") + [
        "--plan", str(plan), "--steps", "100000", "--metrics", str(metrics), "--log-every", "0",
        "--timeout", str(timeout_s)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"}, preexec_fn=own_group)
    end = time.monotonic() + 90
    while not (metrics.is_file() and metrics.read_text().strip()) and r.poll() is None and time.monotonic() < end:
        time.sleep(0.2)
    return r


def _ranks(r: subprocess.Popen) -> list[int]:
    """The ranks of the run `r` started (its forkserver's children), oldest first."""
    group = _live(r.pid)
    ranks = sorted(p for p in group if _ppid(_ppid(p)) == r.pid)
    assert len(ranks) == 2, (group, r.poll())
    return ranks


def _finish(r: subprocess.Popen) -> tuple[str, str]:
    """Let a launcher held by SIGSTOP go once every rank of its run has exited, and wait for it:
    the survivors then always lose their peer and write their records before the launcher looks."""
    def held() -> bool:
        try:
            stopped = Path(f"/proc/{r.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
        except (OSError, IndexError):
            return False
        return stopped and not any(_ppid(_ppid(p)) == r.pid for p in _live(r.pid))

    end = time.monotonic() + 60
    while not held() and time.monotonic() < end:
        time.sleep(0.2)
    os.kill(r.pid, signal.SIGCONT)
    return r.communicate(timeout=60)


def _kill_all(r: subprocess.Popen) -> None:
    if r.poll() is None:
        os.kill(r.pid, signal.SIGCONT)
        os.killpg(r.pid, signal.SIGKILL)
        r.communicate(timeout=30)
    else:
        for p in _live(r.pid):
            os.kill(p, signal.SIGKILL)


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads process groups from /proc")
def test_a_rank_that_stops_answering_is_one_line_soon_after_the_timeout(tmp_path):
    # every surviving rank had printed its traceback and torch's pipelining its whole action
    # table, 268 lines on 4 ranks before the one that said what happened; and torch's join gave
    # the frozen rank 30 s to act on a SIGTERM it could not see before it sent SIGKILL
    metrics = tmp_path / "m.jsonl"
    r = _training(_write(tmp_path, pp=2, dp=1, ep=1), metrics, 5, signal.SIG_DFL)
    try:
        ranks = _ranks(r)
        os.kill(ranks[-1], signal.SIGSTOP)
        t0 = time.monotonic()
        out, err = r.communicate(timeout=120)
        took = time.monotonic() - t0
    finally:
        _kill_all(r)
    lines = err.strip().splitlines()
    assert r.returncode == 1 and "Traceback" not in err, err[-3000:]
    assert len(lines) <= 3, lines  # one line a surviving rank naming the failed action, then the launcher's
    assert re.match(r"error: a rank failed: rank \d: no reply from a peer within --timeout 5 s", lines[-1]), lines
    assert took < 5 + 15, f"the run ended {took:.0f} s after a rank froze, its collective timeout is 5 s"


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads process groups from /proc")
def test_a_rank_killed_mid_run_is_named_in_one_line_not_a_survivor_that_lost_it(tmp_path):
    """SIGKILL to one rank (the OOM killer, a user): each survivor printed the traceback of its lost
    connection ("Connection closed by peer"), and the one line blamed a survivor's RuntimeError
    where the survivors wrote theirs before the launcher saw the death (3 runs in 8 in a review).
    The launcher is held here until every rank has exited, so the survivors always write first."""
    r = _training(_write(tmp_path), tmp_path / "m.jsonl", 30, signal.SIG_DFL)
    try:
        ranks = _ranks(r)
        os.kill(r.pid, signal.SIGSTOP)
        os.kill(ranks[-1], signal.SIGKILL)
        out, err = _finish(r)
    finally:
        _kill_all(r)
    assert r.returncode == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err[-3000:]
    assert re.fullmatch(r"error: a rank failed: rank \d: process terminated with signal SIGKILL", err.strip()), err


# a rank's optimizer fails at its 3rd step, after holding the launcher (SIGSTOP): the forkserver's parent
_FAIL_A_RANK = """
import os, signal
if os.environ.get("PIPER_TEST_FAIL_RANK"):
    import torch.distributed as dist
    import piper_runtime.optim as optim

    step, calls = optim.DistOptimizer.step, []

    def failing(self):
        calls.append(1)
        if dist.get_rank() == int(os.environ["PIPER_TEST_FAIL_RANK"]) and len(calls) == 3:
            stat = open(f"/proc/{os.getppid()}/stat").read()
            os.kill(int(stat.rsplit(")", 1)[1].split()[1]), signal.SIGSTOP)
            raise ValueError("injected failure")
        return step(self)

    optim.DistOptimizer.step = failing
"""


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads process groups from /proc")
def test_a_rank_that_raises_is_named_with_its_error_not_a_survivor_that_lost_it(tmp_path, monkeypatch):
    """An exception on rank 1: rank 0, which lost its peer, printed its traceback too and the one
    line blamed its "Connection closed by peer" (the lowest-numbered rank's record won). Now the
    failing rank's traceback is the only one and the line names that rank and its error."""
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(_FAIL_A_RANK)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(inject), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("PIPER_TEST_FAIL_RANK", "1")
    r = _training(_write(tmp_path), tmp_path / "m.jsonl", 30, signal.SIG_DFL)
    try:
        out, err = _finish(r)
    finally:
        _kill_all(r)
    lines = err.strip().splitlines()
    assert r.returncode == 1 and err.count("Traceback") == 1 and "by peer" not in err, err[-3000:]
    assert lines[-1] == "error: a rank failed: rank 1: ValueError: injected failure", lines


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads process groups from /proc")
def test_a_run_started_with_ctrl_c_ignored_keeps_its_ranks_shielded(tmp_path):
    # the ranks reset SIGINT to its default whatever the launcher inherited: a job shielded from
    # the terminal's Ctrl-C (nohup-like) lost every rank to it and failed
    metrics = tmp_path / "m.jsonl"
    r = _training(_write(tmp_path), metrics, 30, signal.SIG_IGN)
    try:
        os.killpg(r.pid, signal.SIGINT)
        seen = len(metrics.read_text().splitlines())
        end = time.monotonic() + 30
        while len(metrics.read_text().splitlines()) < seen + 3 and r.poll() is None and time.monotonic() < end:
            time.sleep(0.2)
        assert r.poll() is None and len(metrics.read_text().splitlines()) >= seen + 3, r.poll()
    finally:
        os.killpg(r.pid, signal.SIGKILL)
        r.communicate(timeout=30)


def test_the_ranks_exit_when_the_launcher_is_killed_outright(tmp_path):
    """A launcher killed with SIGKILL (or by the OOM killer) runs no handler: its ranks, the
    forkserver's children, trained on to --steps, writing checkpoints and metrics nobody waited for.
    Each rank's watchdog now exits once the launcher is gone."""
    plan, m = _write(tmp_path), tmp_path / "m.jsonl"
    r = subprocess.Popen(_cmd("piper-train", "piper_runtime.launch") + [
        "--plan", str(plan), "--steps", "100000", "--metrics", str(m), "--log-every", "0", "--timeout", "30"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"},
        start_new_session=True)
    try:
        end = time.monotonic() + 90
        while not (m.is_file() and m.read_text().count("\n") >= 2) and r.poll() is None and time.monotonic() < end:
            time.sleep(0.2)  # two steps' records: the ranks are training
        assert r.poll() is None and m.is_file(), "the run did not start"
        os.kill(r.pid, signal.SIGKILL)  # the launcher alone
        r.wait(timeout=10)
        end = time.monotonic() + 15
        while _live(r.pid) and time.monotonic() < end:
            time.sleep(0.2)
        left = _live(r.pid)
    finally:
        if _live(r.pid):
            os.killpg(r.pid, signal.SIGKILL)
    assert not left, f"{len(left)} processes of the run still alive 15 s after the launcher died"


def test_ctrl_c_while_the_ranks_start_stops_the_ranks_it_started(tmp_path, monkeypatch):
    # a SIGINT before start_ranks returned left its ranks running for minutes (the launcher had no
    # handle on them yet): it is held until they exist, then stops them as any Ctrl-C does
    import signal

    import piper_runtime.launch as L
    from piper_plan.plan import read_plan
    from piper_runtime.train import TrainConfig
    started = []

    def interrupted(*a):
        os.kill(os.getpid(), signal.SIGINT)  # arrives inside the start, as a user's Ctrl-C may
        ctx = real(*a)
        started.append(ctx)
        return ctx
    real = L.start_ranks
    monkeypatch.setattr(L, "start_ranks", interrupted)
    with pytest.raises(KeyboardInterrupt):
        L.spawn_jobs([(read_plan(_write(tmp_path)), TrainConfig(steps=50, timeout_s=60, log_every=0))])
    assert started and not any(p.is_alive() for p in started[0].processes)
