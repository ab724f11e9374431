"""Layout.a2a_overlap (Megatron-Core's EP overlap): each micro-batch's all-to-all hides behind
another micro-batch's compute, each exchange behind the compute node it is paired with; the
time breakdown still adds up."""
import numpy as np
import pytest

from piper_plan.cost.batch import from_layouts
from piper_plan.cost.estimate import evaluate
from piper_plan.layout import Layout
from piper_plan.specs.registry import load_hardware, load_model

PARTS = ("compute", "host", "a2a", "tp_comm", "p2p", "bubble", "dp_comm", "optimizer", "migration")


@pytest.fixture(scope="module")
def pair():
    m, hw = load_model("qwen3-235b-a22b"), load_hardware("dgx-h100")
    # the overlap's own accounting, without the host floor (which the overlapped layout can reach
    # sooner, its all-to-all being off the layer's stream: tests/test_host_floor.py)
    hw = hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"host_op_us": 0.0})})
    base = dict(gpus=256, tp=2, pp=1, dp=128, ep=32, global_batch=1024, seq=4096)
    lays = [Layout(**base, a2a_overlap=o) for o in (False, True)]
    return evaluate(m, hw, from_layouts(lays)), lays[0].microbatches


def test_overlap_hides_the_all_to_all_behind_compute(pair):
    est, M = pair
    a2a = est.time["a2a"][0]
    hidden = a2a - est.time["a2a"][1]
    # the all-to-all hides behind compute, no more than either, and the compute beside it runs
    # on the SMs its kernels leave (dgx-h100: 20 of 132 held)
    held = 20 / 132
    assert 0 < hidden <= min(a2a, est.time["compute"][0])
    assert est.step_time_s[0] - est.step_time_s[1] == pytest.approx(hidden * (1 - held), rel=1e-9)
    assert est.time["compute"][1] - est.time["compute"][0] == pytest.approx(hidden * held, rel=1e-9)
    assert M > 1


def test_each_exchange_hides_only_behind_its_partner():
    """Megatron-Core's 1F1B overlap pairs the backward's dispatch and combine with the forward's
    experts and attention, the forward's with the backward's: once an exchange outgrows its
    forward partner, what it hides is that partner, less than the totals would allow."""
    m, hw = load_model("qwen3-235b-a22b"), load_hardware("dgx-h100")
    eff = hw.efficiency.model_copy(update={"host_op_us": 0.0})
    base = dict(gpus=256, tp=2, pp=1, dp=128, ep=32, global_batch=1024, seq=4096)
    share = {}
    for speedup in (2.0, 6.0):  # NICs twice and six times as fast as DGX H100's
        nic = hw.network.model_copy(update={"nic_gbps": hw.network.nic_gbps * speedup})
        fast = hw.model_copy(update={"efficiency": eff, "network": nic})
        est = evaluate(m, fast, from_layouts([Layout(**base, a2a_overlap=o) for o in (False, True)]))
        a2a, compute = est.time["a2a"][0], est.time["compute"][0]
        share[speedup] = (a2a - est.time["a2a"][1]) / min(a2a, compute)
    # at 2x each exchange (about the compute / 4) outgrows its forward partner (a third of a
    # backward one): a fifth of what the totals allow stays exposed; at 6x every exchange hides
    assert share[2.0] < 0.85 and share[6.0] == pytest.approx(1.0)


def test_compute_units_held_by_communication_are_a_spec_figure(pair):
    """With overlap_comm_units 0 (not measured) the hidden all-to-all costs no compute."""
    est, _ = pair
    m, hw = load_model("qwen3-235b-a22b"), load_hardware("dgx-h100")
    assert hw.efficiency.overlap_comm_units == 20
    free = hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"overlap_comm_units": 0,
                                                                                "host_op_us": 0.0})})
    base = dict(gpus=256, tp=2, pp=1, dp=128, ep=32, global_batch=1024, seq=4096)
    e0 = evaluate(m, free, from_layouts([Layout(**base, a2a_overlap=o) for o in (False, True)]))
    assert e0.step_time_s[0] == pytest.approx(est.step_time_s[0], rel=1e-12)  # nothing overlapped: no change
    assert e0.step_time_s[0] - e0.step_time_s[1] == pytest.approx(e0.time["a2a"][0] - e0.time["a2a"][1])
    assert e0.time["compute"][1] == pytest.approx(e0.time["compute"][0])


def test_breakdown_adds_up_with_and_without_overlap(pair):
    est, _ = pair
    total = sum(est.time[k] for k in PARTS)
    np.testing.assert_allclose(total, est.step_time_s, rtol=1e-9)


def test_an_exchange_also_hides_behind_its_partners_issue_time():
    """Where the host issues a node slower than the GPU runs it, the node lasts its issue time,
    and the other micro-batch's exchange on the communication stream runs inside it: the slower
    the host, the less all-to-all stays exposed (none once the host bounds every node)."""
    m, hw = load_model("qwen3-235b-a22b"), load_hardware("dgx-h100")
    base = dict(gpus=256, tp=2, pp=1, dp=128, ep=32, global_batch=1024, seq=4096, a2a_overlap=True, fp8="current")
    exposed, idle = [], []
    for us in (0.0, 36.2, 100.0):
        h = hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"host_op_us": us})})
        est = evaluate(m, h, from_layouts([Layout(**base)]))
        exposed.append(est.time["a2a"][0])
        idle.append(est.time["host"][0])
    assert exposed[0] > exposed[1] > exposed[2] == 0.0
    assert idle[0] == 0.0 < idle[1] < idle[2]
