"""Layout.a2a_overlap (Megatron-Core's EP overlap): a micro-batch's all-to-all hides behind
another micro-batch's compute, each exchange behind the compute node it is paired with, in the
steady state's paired steps only; the time breakdown still adds up."""
import numpy as np
import pytest

from piper_plan.cost.batch import from_layouts
from piper_plan.cost.estimate import _paired_share, evaluate
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
    # the hidden exchange no longer opens a window for the gradient reduction either
    lost_window = est.time["dp_comm"][1] - est.time["dp_comm"][0]
    assert lost_window >= 0
    assert est.step_time_s[0] - est.step_time_s[1] == pytest.approx(hidden * (1 - held) - lost_window, rel=1e-9)
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
    M = Layout(**base).microbatches
    for speedup in (2.0, 6.0):  # NICs twice and six times as fast as DGX H100's
        nic = hw.network.model_copy(update={"nic_gbps": hw.network.nic_gbps * speedup})
        fast = hw.model_copy(update={"efficiency": eff, "network": nic})
        est = evaluate(m, fast, from_layouts([Layout(**base, a2a_overlap=o) for o in (False, True)]))
        a2a, compute = est.time["a2a"][0], est.time["compute"][0]
        share[speedup] = (a2a - est.time["a2a"][1]) / min(a2a, compute)
    # at 2x each exchange (about the compute / 4) outgrows its forward partner (a third of a
    # backward one): a fifth of what the totals allow stays exposed; at 6x every paired exchange
    # hides, which is all but the lone first forward's and last backward's
    assert share[2.0] < 0.85 * (M - 1) / M and share[6.0] == pytest.approx((M - 1) / M)


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
    lost_window = e0.time["dp_comm"][1] - e0.time["dp_comm"][0]  # the reduction's, behind the hidden exchange
    assert e0.step_time_s[0] - e0.step_time_s[1] == pytest.approx(e0.time["a2a"][0] - e0.time["a2a"][1] - lost_window)
    assert e0.time["compute"][1] == pytest.approx(e0.time["compute"][0])


def test_a_layout_can_name_the_compute_units_its_exchange_holds(pair):
    """Layout.a2a_sms (Megatron-Core --moe-hybridep-num-sms) replaces the spec's
    overlap_comm_units: holding twice the SMs costs twice the compute beside the hidden exchange."""
    est, _ = pair
    m, hw = load_model("qwen3-235b-a22b"), load_hardware("dgx-h100")
    hw = hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"host_op_us": 0.0})})
    base = dict(gpus=256, tp=2, pp=1, dp=128, ep=32, global_batch=1024, seq=4096, a2a_overlap=True)
    lays = [Layout(**base), Layout(**base, a2a_sms=20), Layout(**base, a2a_sms=40)]
    e = evaluate(m, hw, from_layouts(lays))
    slow = e.time["compute"] - est.time["compute"][0]  # the compute the held SMs cost
    assert slow[0] == pytest.approx(slow[1], rel=1e-12) and slow[0] > 0
    assert slow[2] == pytest.approx(2 * slow[1], rel=1e-9)
    assert from_layouts(lays).layout(2).a2a_sms == 40 and from_layouts(lays).layout(0).a2a_sms is None


def test_breakdown_adds_up_with_and_without_overlap(pair):
    est, _ = pair
    total = sum(est.time[k] for k in PARTS)
    np.testing.assert_allclose(total, est.step_time_s, rtol=1e-9)


def test_an_exchange_also_hides_behind_its_partners_issue_time():
    """Where the host issues a node slower than the GPU runs it, the node lasts its issue time,
    and the other micro-batch's exchange on the communication stream runs inside it: the slower
    the host, the less all-to-all stays exposed (once the host bounds every node, none: the
    unpaired first forward's and last backward's run inside their own layer's issue gap, as an
    unoverlapped exchange does)."""
    m, hw = load_model("qwen3-235b-a22b"), load_hardware("dgx-h100")
    base = dict(gpus=256, tp=2, pp=1, dp=128, ep=32, global_batch=1024, seq=4096, a2a_overlap=True, fp8="current")
    exposed, idle = [], []
    for us in (0.0, 36.2, 100.0):
        h = hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"host_op_us": us})})
        est = evaluate(m, h, from_layouts([Layout(**base), Layout(**{**base, "a2a_overlap": False})]))
        exposed.append(est.time["a2a"][0])
        idle.append(est.time["host"][0])
        assert est.step_time_s[0] <= est.step_time_s[1]
    # at 100 us the host bounds every node: every exchange runs inside an issue gap
    assert exposed[0] > exposed[1] > exposed[2] == 0.0
    assert idle[0] == 0.0 < idle[1] < idle[2]


def test_the_first_forward_and_last_backward_run_alone():
    """Megatron-Core pairs a forward with another micro-batch's backward only in the steady
    state: without pipelining, of M micro-batches M - 1 pairs hide (one micro-batch hides
    nothing); interleaved, a rank's warm-up forwards (one more than the plain schedule's) and as
    many cool-down backwards run alone."""
    m, hw = load_model("qwen3-235b-a22b"), load_hardware("dgx-h100")
    hw = hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"host_op_us": 0.0})})
    base = dict(gpus=256, tp=2, pp=1, dp=128, ep=32, seq=4096)
    lays = [Layout(**base, global_batch=128 * M, a2a_overlap=o) for M in (1, 2, 8) for o in (False, True)]
    est = evaluate(m, hw, from_layouts(lays))
    a2a = est.time["a2a"].reshape(3, 2)
    hidden = (a2a[:, 0] - a2a[:, 1]) / a2a[:, 0]  # share of the all-to-all hidden
    assert hidden[0] == 0.0
    # per paired step the same share hides: (M - 1) / M of the steady one
    assert hidden[2] / hidden[1] == pytest.approx((7 / 8) / (1 / 2), rel=1e-9)
    # interleaved, pp 4, vpp 2, 8 micro-batches (16 virtual): rank 0 warms up 2*3 + 1*4 + 1 = 11,
    # the last rank 0 + 4 + 1 = 5, a middle rank (1) 2*2 + 4 + 1 = 9
    lay = from_layouts([Layout(gpus=512, tp=2, pp=4, vpp=2, dp=64, ep=32, global_batch=512, seq=4096,
                               schedule="interleaved", a2a_overlap=True)])
    share = _paired_share(lay)
    assert [float(share[r][0]) for r in ("first", "mid", "last")] == pytest.approx([5 / 16, 7 / 16, 11 / 16])


def _dualpipev_counts(M, pp, rank):
    """(chunk forwards, forwards paired with a backward) on one rank, walking DualPipeV's steps
    as deepseek-ai/DualPipe's dualpipev.py runs them."""
    forwards = 2 * (pp - rank - 1)          # step 1: F0 alone
    forwards += 2 * (rank + 1)              # step 2: F0 F1, alone
    forwards += pp - rank - 1               # step 3: B1 W1 F1, in turn
    main = M - 2 * pp + rank + 1            # step 4: F0&B1, F1&B0
    paired = 2 * main - (1 if rank == pp - 1 else 0)  # the last rank runs its first pair apart
    forwards += 2 * main
    forwards += pp - rank - 1               # step 5: B1, F1&B0
    paired += pp - rank - 1
    return forwards, paired


@pytest.mark.parametrize("pp,M", [(4, 8), (4, 20), (8, 16), (8, 64)])
def test_dualpipev_hides_only_its_paired_chunks(pp, M):
    lay = from_layouts([Layout(gpus=pp * 32, tp=1, pp=pp, dp=32, ep=32, global_batch=32 * M, seq=4096,
                               schedule="dualpipev", vpp=2)])
    share = _paired_share(lay)
    for role, rank in (("first", 0), ("mid", (pp - 1) // 2), ("last", pp - 1)):
        forwards, paired = _dualpipev_counts(M, pp, rank)
        assert forwards == 2 * M
        assert float(share[role][0]) == pytest.approx(paired / forwards)


def test_piper_train_s_dualpipev_hides_no_all_to_all():
    """DeepSeek's DualPipe overlaps a forward chunk with another micro-batch's backward; torch's
    ScheduleDualPipeV, which piper-train runs (fused_kernels false), performs the two in turn
    (no custom OVERLAP_F_B function registered), so its all-to-all stays exposed."""
    m, hw = load_model("qwen3-235b-a22b"), load_hardware("dgx-h100")
    hw = hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"host_op_us": 0.0})})
    base = dict(gpus=256, tp=1, pp=4, vpp=2, dp=64, ep=32, global_batch=512, seq=4096, schedule="dualpipev")
    lays = [Layout(**base, fused_kernels=f) for f in (True, False)]
    est = evaluate(m, hw, from_layouts(lays))
    unhidden = evaluate(m, hw, from_layouts([Layout(**{**base, "schedule": "zbv"}, fused_kernels=False)]))
    assert est.time["a2a"][0] < est.time["a2a"][1]
    # unfused: what is exposed is the whole exchange, as under a schedule that overlaps nothing
    assert est.time["a2a"][1] == pytest.approx(unhidden.time["a2a"][0], rel=1e-9)


def test_a_layout_without_tensor_parallelism_reports_no_tensor_parallel_time():
    """tp_comm is what is left of the communication after the other parts: at tp 1 the leftover is
    rounding (6.9e-16 s printed in estimate's table), reported as 0."""
    from piper_plan.search import SearchSpace, enumerate_layouts

    m, hw = load_model("deepseek-v3"), load_hardware("dgx-h800")
    lay, _ = enumerate_layouts(m, hw, SearchSpace(gpus=2048, global_batch=4096, seq=m.seq_len))
    t = evaluate(m, hw, lay).time["tp_comm"]
    none = (lay.tp == 1) & (lay.etp == 1)
    assert none.sum() > 1000 and not t[none].any() and (t[~none] > 0).all()


def test_gpipe_pairs_no_forward_with_a_backward():
    """GPipe runs all of a step's forwards before its backwards: no exchange has another
    micro-batch's compute beside it, so the overlap hides nothing (and never makes the step
    faster through a ZeRO-2 window it no longer fills)."""
    m, hw = load_model("deepseek-v3"), load_hardware("dgx-h800")
    base = dict(gpus=256, tp=2, pp=4, dp=32, ep=2, mbs=8, global_batch=1024, seq=4096, schedule="gpipe", zero=2,
                placement="spread", pipeline_split="even")
    lay = from_layouts([Layout(**base, a2a_overlap=True)])
    assert all(float(s[0]) == 0.0 for s in _paired_share(lay).values())
    est = evaluate(m, hw, from_layouts([Layout(**base), Layout(**base, a2a_overlap=True)]))
    assert est.step_time_s[1] == pytest.approx(est.step_time_s[0], rel=1e-12)


def _step(model, hw, lay):
    return float(evaluate(model, hw, from_layouts([lay])).time["total"][0])


def test_a_faster_link_never_slows_zero_2_behind_overlapped_pipeline_messages():
    # interleaved, messages behind the other micro-batch's compute (p2p_overlap): a message that
    # takes no wall time opens no window for the reduce-scatter ZeRO-2 runs every micro-batch, so
    # shortening it must not expose more of that (it had: 67.25 s at 25 GB/s NICs, 68.14 s at 50)
    from piper_plan.sweep import set_field

    m, hw = load_model("gpt-oss-20b"), load_hardware("frontier")
    lay = Layout(gpus=32, tp=8, pp=4, ep=2, dp=1, mbs=4, global_batch=1024, schedule="interleaved", vpp=6,
                 recompute="selective", zero=2, a2a="flat", pipeline_split="even", seq=m.seq_len)
    steps = [_step(m, set_field(hw, "network.nic_gbps", hw.network.nic_gbps * f), lay) for f in (0.5, 1, 2, 4, 8)]
    assert all(b <= a + 1e-9 for a, b in zip(steps, steps[1:])), steps


def test_a_paired_step_s_reduction_runs_behind_the_whole_pair():
    # dualpipev pairs one micro-batch's backward with another's forward: the ZeRO-2 reduce-scatter
    # of the backward's gradients runs for the pair's wall time. Read from the backward's own
    # parts, faster compute (which moves the exposed exchange to the forward's side) had shrunk
    # that window and priced 1.5x the FLOPs 2.2 % slower; what is left is the unpaired warm-up and
    # cool-down micro-batches' (0.24 % since session 79, where a pair hides each chunk's exchange
    # behind the other's compute alone: 0.05 s, the same at 4x and 16x the micro-batches)
    from piper_plan.sweep import set_field

    m, hw = load_model("qwen3-30b-a3b"), load_hardware("frontier-rocm57")
    lay = Layout(gpus=128, tp=8, pp=2, dp=8, ep=16, mbs=2, global_batch=1024, schedule="dualpipev", vpp=2,
                 recompute="none", zero=2, a2a="halo", pipeline_split="even", seq=4096)
    peak = hw.accelerator.peak_tflops["bf16"]
    base, faster = (_step(m, set_field(hw, "accelerator.peak_tflops.bf16", peak * f), lay) for f in (1.0, 1.5))
    assert faster < base * 1.003


@pytest.mark.parametrize("zero", [0, 1, 3])
def test_hiding_the_exchange_never_widens_the_windows_of_reductions_outside_the_pairs(zero):
    # ZeRO-0/1 reduce behind the last backward, which runs alone; ZeRO-3 gathers behind the
    # forward and again behind the backward, one window each: the pair's wall time is ZeRO-2's
    # per-micro-batch rounds' alone (it had priced ZeRO-3 at 39.7 s against 45.5 s of its own
    # serial traffic, and ZeRO-0's reduction shorter with the exchange hidden than exposed)
    m, hw = load_model("qwen3-30b-a3b"), load_hardware("frontier-rocm57")
    dp = []
    for overlap in (False, True):
        lay = Layout(gpus=128, tp=8, pp=1, dp=16, ep=16, mbs=2, global_batch=1024, seq=4096, a2a="halo",
                     a2a_overlap=overlap, zero=zero)
        dp.append(float(evaluate(m, hw, from_layouts([lay])).time["dp_comm"][0]))
    assert dp[1] >= dp[0] - 1e-12, dp
