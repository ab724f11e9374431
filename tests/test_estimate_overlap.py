"""Layout.a2a_overlap (Megatron-Core's EP overlap): each micro-batch's all-to-all hides behind
another micro-batch's compute, up to that compute; the time breakdown still adds up."""
import numpy as np
import pytest

from piper_plan.cost.batch import from_layouts
from piper_plan.cost.estimate import evaluate
from piper_plan.layout import Layout
from piper_plan.specs.registry import load_hardware, load_model

PARTS = ("compute", "a2a", "tp_comm", "p2p", "bubble", "dp_comm", "optimizer", "migration")


@pytest.fixture(scope="module")
def pair():
    m, hw = load_model("qwen3-235b-a22b"), load_hardware("dgx-h100")
    base = dict(gpus=256, tp=2, pp=1, dp=128, ep=32, global_batch=1024, seq=4096)
    lays = [Layout(**base, a2a_overlap=o) for o in (False, True)]
    return evaluate(m, hw, from_layouts(lays)), lays[0].microbatches


def test_overlap_hides_the_all_to_all_behind_compute(pair):
    est, M = pair
    a2a = est.time["a2a"][0]
    # without pipelining, the step shrinks by exactly the hidden all-to-all: min(a2a, compute)
    hidden = min(a2a, est.time["compute"][0])
    assert hidden > 0
    assert est.step_time_s[0] - est.step_time_s[1] == pytest.approx(hidden, rel=1e-9)
    assert est.time["a2a"][1] == pytest.approx(a2a - hidden, abs=1e-9)
    assert M > 1


def test_breakdown_adds_up_with_and_without_overlap(pair):
    est, _ = pair
    total = sum(est.time[k] for k in PARTS)
    np.testing.assert_allclose(total, est.step_time_s, rtol=1e-9)
