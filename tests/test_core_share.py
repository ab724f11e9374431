"""A CPU spec measured with ranks sharing cores prices a layout with fewer ranks a node at the
larger share of a core each rank gets (cost.estimate.core_share)."""
import numpy as np
import pytest

from piper_plan.cost.batch import from_layouts
from piper_plan.cost.estimate import core_share, evaluate
from piper_plan.layout import Layout
from piper_plan.specs.registry import load_hardware, load_model


def _lays(*gpus):
    return from_layouts([Layout(gpus=g, dp=g, ep=g, global_batch=2 * g, seq=64, fused_kernels=False) for g in gpus])


def test_cpu_local_ranks_get_a_larger_share_of_its_two_cores_when_fewer_run():
    hw = load_hardware("cpu-local")  # measured with 8 ranks on 2 cores: 4 ranks a core
    assert hw.accelerator.ranks_per_core == 4 and hw.gpus_per_node == 8
    assert core_share(hw, _lays(8, 4, 2, 1)).tolist() == [1.0, 0.5, 0.25, 0.25]  # one thread: at most a core


def test_gpus_own_their_device_whatever_the_layout():
    assert core_share(load_hardware("dgx-h100"), _lays(8, 2)).tolist() == [1.0, 1.0]


def test_the_step_and_every_component_scale_by_the_share_when_no_rank_shares_a_core():
    m, hw = load_model("tiny-moe"), load_hardware("cpu-local")
    full = hw.model_copy(update={"accelerator": hw.accelerator.model_copy(update={"ranks_per_core": 1.0})})
    lays = _lays(2)  # two ranks, two cores: a core each, a quarter of the time of the full-load rates
    a, b = evaluate(m, hw, lays), evaluate(m, full, lays)
    assert a.step_time_s[0] == pytest.approx(0.25 * b.step_time_s[0])
    parts = [k for k in a.time if k != "total"]
    assert np.allclose([a.time[k][0] for k in parts], [0.25 * b.time[k][0] for k in parts])
    assert sum(a.time[k][0] for k in parts) == pytest.approx(a.time["total"][0], rel=1e-6)
