"""piper-train refuses, before any rank starts, what would make its run other than the one asked
for or its comparison with the plan untrue: a plan edited since it was priced, options that do
nothing as given, and a resume that would read other tokens than the saved run's next steps or a
checkpoint folder that does not hold what it says (an audit of the runtime, session 72)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
from click.testing import CliRunner  # noqa: E402

from piper_plan.cli import main as plan_main  # noqa: E402
from piper_runtime.checkpoint import CheckpointError, check_run, run_settings, validate  # noqa: E402
from piper_runtime.config import TrainConfig  # noqa: E402
from piper_runtime.launch import main, preflight  # noqa: E402
from piper_plan.plan import read_plan  # noqa: E402


def _priced(tmp_path, model="tiny-moe", *extra) -> Path:
    """A plan as piper-plan writes it for piper-train: priced, with what it priced recorded."""
    p = tmp_path / f"{model}.json"
    ep = ["--ep", "2"] if model == "tiny-moe" else []
    r = CliRunner().invoke(plan_main, ["estimate", "-m", model, "-H", "cpu-local", "-n", "2", *ep, "--global-batch",
                                       "4", "--runtime", "piper-train", *extra, "-o", str(p)])
    assert r.exit_code == 0, r.output
    return p


def _one_line(args, *needles):
    r = CliRunner().invoke(main, args)
    lines = [x for x in r.output.strip().splitlines() if x.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), r.output
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.mark.parametrize("edit", [
    lambda d: d["migration"].update(enabled=True, period_steps=1),
    lambda d: d["layout"].update(zero=2),
    lambda d: d["layout"].update(recompute="full"),
    lambda d: d["routing"].update(distribution="zipf", zipf_s=1.5),
])
def test_a_plan_edited_since_it_was_priced_is_refused(tmp_path, edit):
    p = _priced(tmp_path)
    doc = json.loads(p.read_text())
    edit(doc)
    p.write_text(json.dumps(doc))
    _one_line(["--plan", str(p), "--steps", "1"], "predicted.priced_for", "piper-plan estimate")


def test_deleting_what_the_figures_priced_does_not_let_an_edit_through(tmp_path):
    """An edited plan with predicted.priced_for deleted had run, compared with the old plan's figures;
    one with no predicted at all had skipped the host-memory check that sizes its ranks: its layout is
    priced now (10.9B parameters on 8 CPU ranks had been waved through)."""
    from piper_runtime.launch import _peak_gib

    p = _priced(tmp_path)
    doc = json.loads(p.read_text())
    doc["layout"]["zero"] = 2
    del doc["predicted"]["priced_for"]
    p.write_text(json.dumps(doc))
    _one_line(["--plan", str(p), "--steps", "1"], "predicted.priced_for: missing", "piper-plan estimate")
    r = CliRunner().invoke(plan_main, ["search", "-m", "xmoe-small", "-H", "dgx-h100", "-n", "8", "--runtime",
                                       "piper-train", "-o", str(tmp_path / "xs.json")])
    assert r.exit_code == 0, r.output
    priced = read_plan(tmp_path / "xs.json")
    bare = priced.model_copy(update={"predicted": None})
    assert _peak_gib(bare) == pytest.approx(priced.predicted.peak_memory_gib, rel=0.05) and _peak_gib(bare) > 30


def test_a_plan_priced_on_gpus_run_on_the_cpu_says_the_comparison_is_between_two_machines(tmp_path, capsys):
    import torch

    from piper_runtime.launch import _check_devices
    if torch.cuda.is_available():
        pytest.skip("on a GPU host the ranks run on the GPUs the plan was priced for")

    r = CliRunner().invoke(plan_main, ["estimate", "-m", "tiny-moe", "-H", "dgx-h100", "-n", "2", "--ep", "2",
                                       "--global-batch", "4", "--runtime", "piper-train",
                                       "-o", str(tmp_path / "g.json")])
    assert r.exit_code == 0, r.output
    _check_devices(read_plan(tmp_path / "g.json"), "g.json")
    assert "warning: g.json: priced on dgx-h100" in capsys.readouterr().err
    _check_devices(read_plan(_priced(tmp_path)), "c.json")  # a CPU spec's plan: nothing to say
    assert "warning" not in capsys.readouterr().err


def test_the_plan_as_written_is_what_was_priced():
    # every field the figures depend on, and only those: a re-read plan checks whole
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        plan = read_plan(_priced(Path(d)))
    assert plan.predicted.priced_for and preflight(plan, TrainConfig(steps=1), plan.layout.gpus) == 0


@pytest.mark.parametrize("model,args,needle", [
    ("tiny-moe", ["--checkpoint-every", "1"], "--checkpoint-every 1 needs --checkpoint DIR"),
    ("tiny-moe", ["--data-dtype", "uint32"], "--data-dtype uint32 needs --data FILE"),
    ("tiny-dense", ["--capacity-factor", "1.0"], "--capacity-factor 1: tiny-dense has no routed experts"),
    ("tiny-dense", ["--aux-loss-coef", "0.5"], "--aux-loss-coef 0.5: tiny-dense has no routed experts"),
    ("tiny-dense", ["--z-loss-coef", "0.1"], "--z-loss-coef 0.1: tiny-dense has no routed experts"),
])
def test_an_option_that_would_do_nothing_is_one_line(tmp_path, model, args, needle):
    _one_line(["--plan", str(_priced(tmp_path, model)), "--steps", "1", *args], needle)


def test_a_token_file_shorter_than_a_step_is_said(tmp_path, capsys):
    plan = read_plan(_priced(tmp_path))
    short = tmp_path / "short.npy"
    np.save(short, np.arange(100, dtype=np.uint16) % 64)  # 100 tokens; a step reads 4 sequences of 64 + 1
    preflight(plan, TrainConfig(steps=1, data=str(short)), plan.layout.gpus)
    assert (plan.layout.global_batch, plan.layout.seq) == (4, 64)
    assert "100 tokens, fewer than one step's global_batch x (seq + 1) = 260" in capsys.readouterr().err


@pytest.mark.parametrize("what", ["a folder", "a device"])
def test_a_token_path_that_is_no_file_says_so(tmp_path, what):
    path = str(tmp_path) if what == "a folder" else "/dev/null"
    _one_line(["--plan", str(_priced(tmp_path)), "--steps", "1", "--data", path], "not a regular file")


# ---- checkpoints -------------------------------------------------------------------------------
def _checkpoint(tmp_path, plan, step=4, latest=None, **meta) -> Path:
    """A checkpoint folder's files as save() writes them (no tensors: each check here comes first)."""
    ck = tmp_path / "ck"
    folder = ck / f"step_{step:08d}"
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps({"step": step, "model_hash": plan.model_hash, **meta}))
    (ck / "latest").write_text((folder.name if latest is None else latest) + "\n")
    return ck


@pytest.mark.parametrize("latest", ["../elsewhere/step_00000004", "", "/tmp/step_00000004"])
def test_latest_names_a_folder_of_the_checkpoint_directory_only(tmp_path, latest):
    plan = read_plan(_priced(tmp_path))
    with pytest.raises(CheckpointError, match="latest: expected the name of a checkpoint folder"):
        validate(_checkpoint(tmp_path, plan, latest=latest), plan)


@pytest.mark.parametrize("step", [3, "4", 4.0, True])
def test_the_saved_step_is_the_folders_as_a_whole_number(tmp_path, step):
    plan = read_plan(_priced(tmp_path))
    ck = _checkpoint(tmp_path, plan)
    meta = ck / "step_00000004" / "meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "step": step}))
    with pytest.raises(CheckpointError, match="step: expected the folder's step as a whole number"):
        validate(ck, plan)


def test_a_checkpoint_that_saved_its_experts_placement_needs_it(tmp_path):
    plan = read_plan(_priced(tmp_path))
    with pytest.raises(CheckpointError, match="experts.json: missing, and the run saved one"):
        validate(_checkpoint(tmp_path, plan, experts=True), plan)


@pytest.mark.parametrize("key,opt", [("global_batch", "--global-batch"), ("seq", "--seq")])
def test_a_resume_at_another_batch_or_length_is_refused_as_it_reads_other_tokens(tmp_path, key, opt):
    """A step's rows are read by step, batch and length: a resume at another global batch had re-read
    windows the saved run trained on, without a word. Another layout at the same batch still loads."""
    plan = read_plan(_priced(tmp_path))
    saved = plan.layout.model_dump(mode="json")
    was = saved[key]
    ck = _checkpoint(tmp_path, plan, layout={**saved, key: 2 * was})
    with pytest.raises(CheckpointError, match=rf"layout\.{key}: the run trained at {2 * was:,}, the plan runs "
                                              rf"{was:,}, which reads other tokens .* plan with {opt} {2 * was}"):
        validate(ck, plan)
    other = {**saved, "ep": 1, "dp": saved["dp"]}  # another layout at the same batch and length
    assert _check_stream_passes(tmp_path / "b", plan, other)


def _check_stream_passes(tmp_path, plan, layout) -> bool:
    from piper_runtime.checkpoint import _check_stream
    _check_stream(tmp_path, layout, plan)
    return True


def _run(**kw) -> dict:
    base = dict(seed=1, data=None, data_bytes=None, data_dtype=None, lr=3e-4, weight_decay=0.1, clip=1.0,
                aux_coef=1e-2, z_coef=0.0, capacity_factor=None)
    return {**base, **kw}


def test_a_resume_must_read_the_tokens_the_saved_run_would_have():
    p = Path("ck/step_00000004")
    with pytest.raises(CheckpointError, match="trained with --seed 1; --seed 7 reads other tokens"):
        check_run(p, _run(), _run(seed=7))
    with pytest.raises(CheckpointError, match="trained on synthetic tokens; --data /d.npy"):
        check_run(p, _run(), _run(data="/d.npy", data_bytes=1000))
    with pytest.raises(CheckpointError, match="trained on /d.npy"):
        check_run(p, _run(data="/d.npy", data_bytes=1000), _run(data="/e.npy", data_bytes=2000))
    # a token file is read by step: its seed decides nothing, and the same file moved is the same tokens
    assert check_run(p, _run(data="/d.npy", data_bytes=1000), _run(seed=9, data="/moved/d.npy",
                                                                    data_bytes=1000)) == []
    # the optimisation settings may change, and are said to
    assert check_run(p, _run(), _run(lr=1e-3)) == [f"warning: {p}: the run trained with --lr 0.0003, resumed with "
                                                   "0.001"]


def test_a_token_file_is_recorded_with_the_dtype_it_is_read_as(tmp_path):
    npy, raw = tmp_path / "t.npy", tmp_path / "t.bin"
    np.save(npy, np.arange(300, dtype=np.uint32))
    raw.write_bytes(np.arange(300, dtype=np.uint16).tobytes())
    assert run_settings(TrainConfig(data=str(npy)))["data_dtype"] == "uint32"  # the file's own
    assert run_settings(TrainConfig(data=str(raw)))["data_dtype"] == "uint16"  # a raw file's default
    # so a resume naming the default it ran with reads the same tokens
    assert run_settings(TrainConfig(data=str(raw), data_dtype="uint16")) == run_settings(TrainConfig(data=str(raw)))


def test_a_real_resume_with_another_seed_is_refused(tmp_path):
    plan = _priced(tmp_path, "tiny-moe")
    ck = tmp_path / "run"
    ok = CliRunner().invoke(main, ["--plan", str(plan), "--steps", "1", "--seed", "1", "--checkpoint", str(ck),
                                   "--log-every", "0"])
    assert ok.exit_code == 0, ok.output
    assert json.loads((ck / "step_00000001" / "meta.json").read_text())["run"]["seed"] == 1
    _one_line(["--plan", str(plan), "--steps", "2", "--seed", "2", "--checkpoint", str(ck), "--resume"],
              "trained with --seed 1; --seed 2 reads other tokens")
