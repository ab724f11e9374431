"""Training with expert migration equals training without it (placement changes where an
expert lives, not what it computes), and checkpoints move between placements.

One spawn of 4 CPU ranks (gloo) runs: pp1 x dp4 x ep2 (edp 2, ZeRO-1) with and without
migration (LPT planner, re-planned every step); pp2 x dp2 x ep2 (ZeRO-2, 1f1b) with and
without (swap planner); a run that resumes the migrated run's checkpoint under another EP
degree (so the default contiguous placement), compared with an uninterrupted run; and a
migrating run resumed from a migrated checkpoint, against one that never stopped."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from piper_plan.layout import Layout  # noqa: E402
from piper_plan.plan import Migration, make_plan  # noqa: E402
from piper_plan.specs.registry import load_hardware, load_model  # noqa: E402
from piper_runtime.config import TrainConfig  # noqa: E402
from piper_runtime.launch import spawn_jobs  # noqa: E402
from runtime_test_support import read_checkpoint  # noqa: E402

REL = 1e-6


def _plan(pp, dp, zero, migration=None, schedule="1f1b", ep=2, priced=False):
    lay = Layout(gpus=pp * dp, pp=pp, dp=dp, ep=ep, mbs=1, global_batch=8, seq=32, schedule=schedule, zero=zero,
                 dtype="fp32")
    m, hw = load_model("tiny-moe"), load_hardware("cpu-local")
    if not priced:
        return make_plan(m, hw, lay, migration=migration)
    from piper_plan.evaluate import Routing, build_plan, estimate_layout  # as estimate -o writes it

    routing = Routing(migration=migration)
    lay = lay.model_copy(update={"fused_kernels": False})
    return build_plan(m, hw, lay, estimate_layout(m, hw, lay, routing), 0, routing, migration)


def _mig(planner):
    # threshold 1.0 and period 1: re-plan after every step; a layer moves when it gains >= 1 %
    return Migration(enabled=True, period_steps=1, threshold=1.0, planner=planner, window=2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mig")
    cfg = lambda **kw: TrainConfig(timeout_s=60, log_every=0, **kw)  # noqa: E731
    jobs = {
        "a": (_plan(1, 4, 1), cfg(steps=5, checkpoint=str(tmp / "a"), checkpoint_every=3)),
        "a_mig": (_plan(1, 4, 1, _mig("lpt"), priced=True), cfg(steps=3, checkpoint=str(tmp / "a_mig"),
                                                  metrics=str(tmp / "a_mig.jsonl"))),
        "a_resumed": (_plan(1, 4, 1, ep=4), cfg(steps=5, checkpoint=str(tmp / "a_mig"), resume=True)),
        # the same migrating run straight through 5 steps, and stopped after 3 and resumed
        "m5": (_plan(1, 4, 1, _mig("lpt")), cfg(steps=5, checkpoint=str(tmp / "m5"))),
        "m3": (_plan(1, 4, 1, _mig("lpt")), cfg(steps=3, checkpoint=str(tmp / "m"))),
        "m3_5": (_plan(1, 4, 1, _mig("lpt")), cfg(steps=5, checkpoint=str(tmp / "m"), resume=True)),
        # and over two pipeline stages, whose layers' states rank 0 merges
        "cm5": (_plan(2, 2, 2, _mig("swap")), cfg(steps=5, checkpoint=str(tmp / "cm5"))),
        "cm3": (_plan(2, 2, 2, _mig("swap")), cfg(steps=3, checkpoint=str(tmp / "cm"))),
        "cm3_5": (_plan(2, 2, 2, _mig("swap")), cfg(steps=5, checkpoint=str(tmp / "cm"), resume=True)),
        "c": (_plan(2, 2, 2), cfg(steps=3, checkpoint=str(tmp / "c"))),
        "c_mig": (_plan(2, 2, 2, _mig("swap")), cfg(steps=3, checkpoint=str(tmp / "c_mig"))),
    }
    recs = spawn_jobs(list(jobs.values()))
    return dict(zip(jobs, recs)), tmp


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return float(torch.linalg.vector_norm(a - b)) <= REL * max(float(torch.linalg.vector_norm(b)), 1e-30)


@pytest.mark.parametrize("base,mig", [("a", "a_mig"), ("c", "c_mig")])
def test_migration_changes_where_not_what(runs, base, mig):
    recs, tmp = runs
    events = [r["migration"] for r in recs[mig] if "migration" in r]
    moved = [e for e in events if e["ok"] and sum(e["moved"].values())]
    assert moved, f"no migration happened in {mig}: {events}"
    assert all(e["checksum"] for e in moved)  # state verified equal before and after each one
    assert not any("migration" in r for r in recs[base])
    n = len(recs[mig])
    assert [r["loss"] for r in recs[mig]] == pytest.approx([r["loss"] for r in recs[base][:n]], rel=REL)
    assert [r["grad_norm"] for r in recs[mig]] == pytest.approx([r["grad_norm"] for r in recs[base][:n]], rel=REL)
    ref, got = read_checkpoint(tmp / base / "step_00000003"), read_checkpoint(tmp / mig / "step_00000003")
    assert set(ref) == set(got)
    experts = [k for k in ref if ".moe.experts." in k and k.startswith(("model.", "optim."))]
    assert any(k.startswith("optim.") for k in experts)  # Adam moments per logical expert too
    bad = [k for k in ref if torch.is_tensor(ref[k]) and not _close(got[k], ref[k])]
    assert not bad, f"{len(bad)} tensors differ, e.g. {bad[:3]}"


def test_a_runs_metrics_file_records_each_migration_as_its_records_do(runs):
    # the events had reached only the records returned to Python: a command-line user could not
    # see that experts moved
    import json

    recs, tmp = runs
    lines = [json.loads(x) for x in (tmp / "a_mig.jsonl").read_text().splitlines()]
    steps = [x for x in lines if not x.get("summary")]
    assert [x.get("migration") for x in steps] == [r.get("migration") for r in recs["a_mig"]]
    assert any(x.get("migration") for x in steps)


def test_a_migrating_steps_time_holds_its_migration_and_the_summary_compares_it(runs):
    # the step clock had stopped at the optimizer, before the load all-reduce, re-planning and
    # transfers, while the plan's step time holds migration's share: measured and predicted differed
    import json

    recs, tmp = runs
    for r in recs["a_mig"]:
        walls = {k: v for k, v in r["phase_s"].items() if not k.endswith("_cpu")}
        assert walls["migration"] > 0
        assert r["step_time_s"] == pytest.approx(sum(walls.values()), rel=1e-9)
    summary = [x for x in map(json.loads, (tmp / "a_mig.jsonl").read_text().splitlines()) if x.get("summary")][-1]
    moved = [r["phase_s"]["migration"] for r in recs["a_mig"][1:]]  # the summary's measured steps: 2-3
    assert summary["measured_migration_s_per_step"] == pytest.approx(sum(moved) / len(moved))
    assert summary["predicted_migration_s_per_step"] > 0
    assert summary["migration_measured_over_predicted"] == pytest.approx(
        summary["measured_migration_s_per_step"] / summary["predicted_migration_s_per_step"])
    assert summary["hardware"] == "cpu-local" and len(summary["hardware_hash"]) > 8
    assert all("migration" not in r["phase_s"] for r in recs["a"])  # no migration, no such phase


def test_every_stage_s_migrations_reach_the_records(runs):
    # only rank 0's stage's event had reached the record: experts moved in stage 1's layers unseen
    import json

    recs, tmp = runs
    saved = json.loads((tmp / "cm5" / "step_00000005" / "experts.json").read_text())
    moved = {int(k) for k, st in saved.items() if st["rank_of"] != sorted(st["rank_of"])}
    recorded = {layer for r in recs["cm5"] if r.get("migration", {}).get("ok") for layer in r["migration"]["layers"]}
    stage1 = set(range(2, 4))  # tiny-moe's 4 layers over 2 stages: layers 2 and 3 on rank 1's
    assert moved & stage1, saved  # the run does move stage 1's experts
    assert moved <= recorded


def test_the_stages_migrations_make_one_record():
    from piper_runtime.metrics import merge_migrations

    a = dict(ok=True, error=None, step=2, trigger="period", seconds=0.01, plan_s=0.001, layers=[1], moved={"1": 2},
             max_over_mean={"1": [1.3, 1.0]}, bytes_sent=100, checksum="aa")
    b = dict(ok=False, error="rank 3: checksum", step=2, trigger="threshold", seconds=0.02, plan_s=0.002, layers=[2],
             moved={"2": 1}, max_over_mean={"2": [1.2, 1.1]}, bytes_sent=0, checksum=None)
    assert merge_migrations([]) is None and merge_migrations([a]) is a
    assert merge_migrations([a, b]) == dict(
        ok=False, error="rank 3: checksum", step=2, trigger="period", seconds=0.02, plan_s=0.002, layers=[1, 2],
        moved={"1": 2, "2": 1}, max_over_mean={"1": [1.3, 1.0], "2": [1.2, 1.1]}, bytes_sent=100, checksum=None)


def test_a_migration_reads_as_one_console_line():
    from piper_runtime.metrics import migration_line

    ev = dict(ok=True, step=4, trigger="period", seconds=0.0123, layers=[0, 1], moved={"0": 2, "1": 1},
              max_over_mean={"0": [1.31, 1.02], "1": [1.2, 1.05]})
    assert migration_line(ev) == ("step 5: migrated 3 experts in 2 layers (period, 12.3 ms); "
                                  "EP max/mean L0 1.31->1.02, L1 1.20->1.05")
    assert migration_line(dict(ok=False, step=0, error="rank 2: checksum")) == \
        "step 1: expert migration failed, placement unchanged (rank 2: checksum)"


def test_checkpoint_from_one_placement_loads_under_another(runs):
    recs, tmp = runs
    # a_mig saved step 3 under a migrated placement; a_resumed loads it at EP 4, into the contiguous one
    assert [r["step"] for r in recs["a_resumed"]] == [3, 4]
    assert [r["loss"] for r in recs["a_resumed"]] == pytest.approx([r["loss"] for r in recs["a"][3:]], rel=REL)
    ref, got = read_checkpoint(tmp / "a" / "step_00000005"), read_checkpoint(tmp / "a_mig" / "step_00000005")
    bad = [k for k in ref if torch.is_tensor(ref[k]) and not _close(got[k], ref[k])]
    assert not bad, f"{len(bad)} tensors differ, e.g. {bad[:3]}"


@pytest.mark.parametrize("straight_id,resumed_id,folder", [("m5", "m3_5", "m"), ("cm5", "cm3_5", "cm")])
def test_a_resumed_migrating_run_places_and_moves_experts_as_the_uninterrupted_one(runs, straight_id, resumed_id,
                                                                                   folder):
    # the checkpoint had kept the weights per logical expert but not where they lived nor the
    # load window, so a resumed run restarted from the contiguous placement and an empty
    # window: other experts moved, and its step times were not the uninterrupted run's
    import json

    recs, tmp = runs
    straight, resumed = recs[straight_id][3:], recs[resumed_id]
    assert [r["step"] for r in resumed] == [3, 4]
    assert [r.get("migration") is not None for r in resumed] == [r.get("migration") is not None for r in straight]
    for a, b in zip(straight, resumed):
        if "migration" in a:
            for k in ("ok", "layers", "moved", "max_over_mean", "checksum"):
                assert b["migration"][k] == a["migration"][k], k
    assert [r["loss"] for r in resumed] == pytest.approx([r["loss"] for r in straight], rel=REL)
    saved = [json.loads((tmp / d / "step_00000005" / "experts.json").read_text()) for d in (straight_id, folder)]
    assert saved[0] == saved[1]
    assert any(st["rank_of"] != sorted(st["rank_of"]) for st in saved[0].values())  # experts did move
    assert all(len(st["loads"]) == 2 for st in saved[0].values())  # the window (2 steps) is kept


def test_a_damaged_experts_file_is_refused_before_any_rank_starts(runs, tmp_path):
    import shutil

    from piper_runtime.checkpoint import CheckpointError, validate

    _, tmp = runs
    ck = tmp_path / "ck"
    shutil.copytree(tmp / "m5", ck)
    f = ck / "step_00000005" / "experts.json"
    f.write_text(f.read_text().replace('"ep":2', '"ep":3', 1))
    with pytest.raises(CheckpointError, match=r"experts\.json: layer \d+: .*does not divide 8 experts"):
        validate(ck, _plan(1, 4, 1, _mig("lpt")))


def test_a_window_is_restored_only_from_a_checkpoint_that_kept_one():
    # a checkpoint written without migration has placements but no load window: a migrating
    # resume starts its window empty rather than failing on the missing loads
    import numpy as np

    from piper_runtime.migrate import LoadTracker, Migrator, restore_window

    mig = Migrator.__new__(Migrator)
    mig.layers, mig.ep_ranks, mig.since = {1: None, 2: None}, [0, 1], 0
    mig.tracker = LoadTracker(2, 4, window=2)
    placed = dict(ep=2, rank_of=[0, 0, 1, 1], slot_of=[0, 1, 0, 1], since=0)
    assert not restore_window(mig, {"1": dict(placed, loads=None), "2": dict(placed, loads=None)})
    assert not mig.tracker.hist
    kept = {"1": dict(placed, loads=[[1, 2, 3, 4]], since=1), "2": dict(placed, loads=[[4, 3, 2, 1]], since=1)}
    assert restore_window(mig, kept) and mig.since == 1
    assert np.array_equal(mig.tracker.mean(), [[1, 2, 3, 4], [4, 3, 2, 1]])
