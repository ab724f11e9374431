"""piper-train's hybrid sharding (Layout.zero_replicas): owners drawn from each shard of the
data-parallel groups, every shard holding each parameter's AdamW state once. Its ZeRO-1 trains
exactly as whole-group ZeRO-1 and resumes from its checkpoint; its ZeRO-2, which reduces within
the shard and then across the copies, trains as whole-group ZeRO-2 up to the order of the sums
(4 CPU ranks, gloo, tiny-moe, dp 4, EP 2)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from piper_plan.layout import Layout  # noqa: E402
from piper_plan.plan import make_plan  # noqa: E402
from piper_plan.specs.registry import load_hardware, load_model  # noqa: E402
from piper_runtime.config import TrainConfig  # noqa: E402
from piper_runtime.launch import spawn_jobs  # noqa: E402

from runtime_test_support import read_checkpoint  # noqa: E402

STEPS = 3


def _plan(replicas: int, zero: int = 1):
    lay = Layout(gpus=4, dp=4, ep=2, mbs=1, global_batch=8, seq=16, zero=zero, zero_replicas=replicas, dtype="fp32",
                 fused_kernels=False, overlap_grad_reduce=False)
    return make_plan(load_model("tiny-moe"), load_hardware("cpu-local"), lay)


def test_a_shard_s_copies_are_the_ranks_at_its_place_in_every_shard():
    from piper_runtime.mesh import group_lists

    lay = Layout(gpus=8, dp=8, mbs=1, global_batch=8, seq=16, zero=2, zero_replicas=2, fused_kernels=False,
                 overlap_grad_reduce=False)
    g = group_lists(make_plan(load_model("tiny-dense"), load_hardware("cpu-local"), lay))
    assert g["dp_shard"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert g["dp_copies"] == [[0, 4], [1, 5], [2, 6], [3, 7]]  # the owners of the same parameters
    one = lay.model_copy(update={"zero": 1})
    g1 = group_lists(make_plan(load_model("tiny-dense"), load_hardware("cpu-local"), one))
    assert "dp_copies" not in g1 and g1["dp_shard"] == g["dp_shard"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hybrid")
    jobs = {"whole": (_plan(1), TrainConfig(steps=STEPS, checkpoint=str(tmp / "whole"), timeout_s=60)),
            "hybrid": (_plan(2), TrainConfig(steps=STEPS, checkpoint=str(tmp / "hybrid"), timeout_s=60)),
            "first": (_plan(2), TrainConfig(steps=STEPS - 1, checkpoint=str(tmp / "resumed"), timeout_s=60)),
            "resumed": (_plan(2), TrainConfig(steps=STEPS, checkpoint=str(tmp / "resumed"), resume=True,
                                              timeout_s=60)),
            "whole2": (_plan(1, 2), TrainConfig(steps=STEPS, checkpoint=str(tmp / "whole2"), timeout_s=60)),
            "hybrid2": (_plan(2, 2), TrainConfig(steps=STEPS, checkpoint=str(tmp / "hybrid2"), timeout_s=60))}
    return dict(zip(jobs, spawn_jobs(list(jobs.values())))), tmp


def test_hybrid_sharded_zero1_trains_as_whole_group_zero1(runs):
    recs, tmp = runs
    whole, hybrid = ([(r["loss"], r["grad_norm"]) for r in recs[k] if "step" in r] for k in ("whole", "hybrid"))
    assert len(whole) == STEPS and hybrid == whole  # the norm counted once, not once per shard
    assert whole[-1][0] != whole[0][0]  # it trained
    a, b = (read_checkpoint(tmp / k / f"step_{STEPS:08d}") for k in ("whole", "hybrid"))
    params = [k for k in a if k.startswith("model.")]
    assert params and all(torch.equal(a[k], b[k]) for k in params)
    optim = [k for k in a if k.startswith("optim.")]  # each state written once, by an owner in some shard
    assert optim and set(optim) == {k for k in b if k.startswith("optim.")}
    assert all(torch.equal(a[k], b[k]) for k in optim)


def test_a_hybrid_sharded_run_resumes_as_the_run_that_never_stopped(runs):
    recs, _ = runs
    straight = [(r["loss"], r["grad_norm"]) for r in recs["hybrid"] if "step" in r]
    resumed = [(r["loss"], r["grad_norm"]) for r in recs["resumed"] if "step" in r]
    assert resumed == straight[STEPS - 1:]


def test_hybrid_sharded_zero2_trains_as_whole_group_zero2(runs):
    # a shard's owner holds its shard's sum only; without the copies' all-reduce the step would use
    # half the gradient (dp 4 in 2 shards) and the losses would part after the first step
    recs, tmp = runs
    whole, hybrid = ([v for r in recs[k] if "step" in r for v in (r["loss"], r["grad_norm"])]
                     for k in ("whole2", "hybrid2"))
    assert len(whole) == 2 * STEPS and whole[-2] != whole[0]
    assert hybrid == pytest.approx(whole, rel=1e-5)  # (a+b)+(c+d) against a ring's order of the same sum
    a, b = (read_checkpoint(tmp / k / f"step_{STEPS:08d}") for k in ("whole2", "hybrid2"))
    assert set(a) == set(b) and any(k.startswith("optim.") for k in a)
    assert all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-6) for k in a if torch.is_tensor(a[k]))
