"""The host's side of an eager step (cost/host.py): a layer pass lasts at least the time the host
takes to issue its operations; CUDA graphs replace a scope's issues with one launch."""
import numpy as np
import pytest

from piper_plan.cost import host
from piper_plan.cost.batch import from_layouts
from piper_plan.cost.estimate import evaluate
from piper_plan.layout import Layout
from piper_plan.specs import load_hardware, load_model

EAGER_MOE = dict(gpus=8, tp=1, pp=1, dp=8, ep=8, mbs=1, global_batch=64, seq=4096, a2a="flat",
                 expert_gemm="multistream", fp8="mxfp8")
PARTS = ("compute", "host", "a2a", "tp_comm", "p2p", "bubble", "dp_comm", "optimizer", "migration")


@pytest.fixture(scope="module")
def qwen():
    return load_model("qwen3-30b-a3b"), load_hardware("dgx-b200")


def _est(m, hw, *layouts):
    return evaluate(m, hw, from_layouts(list(layouts)))


def test_a_host_bound_layer_pass_lasts_its_issue_time(qwen):
    m, hw = qwen
    lay = Layout(**EAGER_MOE)
    est = _est(m, hw, lay)
    _, moe_ops = host.layer_ops(m, from_layouts([lay]))
    # attention (5 + 2 projections and their MXFP8 quantisations), router + preprocess (31 + 1),
    # 10 more, 16 local experts at 2 GEMMs + 2 quantisations each; the backward issues twice that
    assert moe_ops[0] == (5 + 2 * 2) + (31 + 1) + 10 + 16 * 2 * 2
    issue = 3 * moe_ops[0] * hw.efficiency.host_op_us * 1e-6
    assert est.layer_time_s["moe"][0] == pytest.approx(issue, rel=1e-9)
    assert est.time["host"][0] > 0
    assert sum(est.time[k][0] for k in PARTS) == pytest.approx(est.step_time_s[0], rel=1e-9)


def test_no_measured_host_cost_no_floor(qwen):
    m, hw = qwen
    unmeasured = hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"host_op_us": 0.0})})
    est = _est(m, unmeasured, Layout(**EAGER_MOE))
    assert est.time["host"][0] == 0
    assert est.layer_time_s["moe"][0] < _est(m, hw, Layout(**EAGER_MOE)).layer_time_s["moe"][0]
    assert load_hardware("frontier").efficiency.host_op_us == 0  # no published figure: no floor


def test_cuda_graphs_cut_the_issue_time_and_a_full_iteration_graph_removes_it(qwen):
    m, hw = qwen
    scopes = [(), ("moe_router", "moe_preprocess"), ("attn", "moe_router", "moe_preprocess"), ("full_iteration",)]
    est = _est(m, hw, *(Layout(**EAGER_MOE, cuda_graphs=s) for s in scopes))
    h = est.time["host"]
    assert h[0] > h[1] > h[2] > h[3] == 0
    assert np.all(np.diff(est.step_time_s) <= 0)


def test_bigger_micro_batches_hide_the_host_behind_gpu_work(qwen):
    m, hw = qwen
    est = _est(m, hw, *(Layout(**{**EAGER_MOE, "mbs": b}) for b in (1, 2, 4, 8)))
    per_pass = est.time["host"] / (64 / (8 * np.array([1, 2, 4, 8])) * m.num_layers)  # idle s per layer pass
    assert np.all(np.diff(per_pass) < 0)


def test_per_expert_launches_scale_with_local_experts_a_grouped_kernel_does_not(qwen):
    m, _ = qwen
    lays = [Layout(**{**EAGER_MOE, "gpus": g, "dp": g, "ep": g, "global_batch": 8 * g, "expert_gemm": e})
            for e in ("multistream", "grouped") for g in (8, 16)]
    _, ops = host.layer_ops(m, from_layouts(lays))
    assert ops[0] - ops[1] == 8 * 2 * 2  # EP8 -> EP16: 8 fewer local experts, 4 issues each
    assert ops[2] == ops[3]


def test_overlapped_all_to_all_does_not_hide_the_host(qwen):
    """An overlapped all-to-all runs beside another micro-batch's compute: the layer's own
    stream is shorter, so more of the issue time shows."""
    m, hw = qwen
    est = _est(m, hw, Layout(**{**EAGER_MOE, "mbs": 4}), Layout(**{**EAGER_MOE, "mbs": 4, "a2a_overlap": True}))
    assert est.time["host"][1] >= est.time["host"][0]


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_overlapping_the_all_to_all_never_slows_a_host_bound_layer(recompute):
    """A host-bound layer lasts its issue time whether its all-to-all runs in its own stream or
    beside another micro-batch's compute: the exchange's part no partner hides (full recompute's
    re-run forward exchange hides behind none) and the compute units it holds run on the GPU
    while it waits for the host, so switching the overlap on never makes the step slower."""
    m, hw = load_model("qwen3-235b-a22b"), load_hardware("gb200-nvl72")
    base = dict(gpus=256, tp=4, dp=64, ep=128, global_batch=1024, seq=4096, recompute=recompute)
    est = _est(m, hw, Layout(**base), Layout(**base, a2a_overlap=True))
    assert est.time["host"][1] > est.time["a2a"][0]  # host-bound: the issue gap outlasts the exchange
    assert est.step_time_s[1] <= est.step_time_s[0]
    # nor faster than its exchanges, one after another on the communication stream
    assert est.step_time_s[1] >= est.time["a2a"][0]


def test_a_slower_host_makes_the_planner_batch_more_per_issue(qwen):
    """What-if sweep over the host's per-operation cost: with the host free the best plan keeps
    small micro-batches; at Grace's measured cost it moves to larger ones, which hide the issue
    time behind more GPU work per layer pass."""
    from piper_plan.search import SearchSpace
    from piper_plan.sweep import parse_vary, run_sweep

    m, _ = qwen
    hw = load_hardware("gb200-nvl72")
    space = SearchSpace(gpus=8, global_batch=512, seq=4096, expert_gemm="multistream", fp8="mxfp8")
    rows = run_sweep(m, hw, [8], parse_vary(["host_op_us=0,99.66"]), space)
    free, grace = (int(r["layout"].split(" mbs")[1].split()[0]) for r in rows)  # "... mbs16 1f1b ..."
    assert free < grace
    assert rows[0]["tokens_per_s"] > rows[1]["tokens_per_s"]


def test_layouts_priced_together_get_their_own_host_floor(qwen):
    """The per-layer costs are shared between layouts that agree on the columns they read: a
    dualpipev layout in the same batch as a 1f1b one still has its all-to-all off the stream."""
    m, hw = qwen
    base = {**EAGER_MOE, "gpus": 16, "dp": 8, "pp": 2, "mbs": 4, "global_batch": 512}
    one = Layout(**base, schedule="1f1b")
    dual = Layout(**base, schedule="dualpipev", vpp=2)
    together = _est(m, hw, one, dual)
    assert together.time["host"][1] == pytest.approx(_est(m, hw, dual).time["host"][0], rel=1e-12)
    assert together.time["host"][0] == pytest.approx(_est(m, hw, one).time["host"][0], rel=1e-12)


def test_gpt_oss_expert_bias_and_clamp_cost_where_experts_launch_one_by_one():
    """Megatron-Core adds GPT-OSS's fc2 bias per local expert outside the GEMM and clamps the GLU
    input with separate kernels (cost.compute._expert_extras): they add host operations and
    memory passes on per-expert GEMMs, and nothing where one fused grouped kernel runs the experts."""
    m, hw = load_model("gpt-oss-120b"), load_hardware("dgx-h100")
    plain = m.model_copy(update={"moe": m.moe.model_copy(update={"expert_bias": False, "glu_clamp": None})})
    base = dict(gpus=8, tp=1, pp=1, dp=8, ep=8, mbs=1, global_batch=64, seq=4096, a2a="flat")
    lays = [Layout(**base, expert_gemm=g) for g in ("multistream", "grouped")]
    _, ops = host.layer_ops(m, from_layouts(lays))
    _, plain_ops = host.layer_ops(plain, from_layouts(lays))
    local = 128 // 8
    assert ops[0] - plain_ops[0] == 3 + 2 * local + 4  # clamp kernels; 2 ops an expert + split, cat, cast
    assert ops[1] == plain_ops[1]
    est, est_plain = _est(m, hw, *lays), _est(plain, hw, *lays)
    assert est.step_time_s[0] > est_plain.step_time_s[0]
    assert est.step_time_s[1] == pytest.approx(est_plain.step_time_s[1], rel=1e-12)


def test_moe_act_recompute_reruns_the_clamp():
    m, hw = load_model("gpt-oss-120b"), load_hardware("dgx-b200")
    plain = m.model_copy(update={"moe": m.moe.model_copy(update={"glu_clamp": None})})
    lays = [Layout(gpus=8, tp=1, pp=1, dp=8, ep=8, mbs=1, global_batch=64, seq=4096, expert_gemm="multistream",
                   recompute="selective", recompute_modules=mods) for mods in (("moe_act",), ("layernorm",))]
    clamp_cost = _est(m, hw, *lays).step_time_s - _est(plain, hw, *lays).step_time_s
    assert clamp_cost[0] > clamp_cost[1] > 0  # the clamp runs again when the activation is recomputed


def test_the_dispatchers_host_sync_splits_a_forward_into_two_stretches():
    """After the sync the GPU queue is empty: the expert issue cannot overlap the GPU work that
    follows it up to the next sync, so a forward lasts at least their sum (host.host_gap)."""
    z = np.zeros(1)
    gpu = host.Phase(np.array([5.0]), z, z, z)
    issue = host.Phase(np.array([3.0]), z, z, z)  # fewer seconds of issue than of GPU work
    assert host.host_gap(issue, gpu, host.Phase(z, z, z, z)).f[0] == 0.0
    assert host.host_gap(issue, gpu, host.Phase(z, z, z, z), after_sync=2.5, before_sync=4.0).f[0] == 1.5


def test_a_gpu_bound_eager_moe_layer_still_waits_for_its_expert_issue(qwen, monkeypatch):
    m, hw = qwen
    lay = Layout(**{**EAGER_MOE, "mbs": 4, "cuda_graphs": ("attn", "moe_router", "moe_preprocess")})
    lb = from_layouts([lay])
    _, moe_ops = host.layer_ops(m, lb)
    after = host.post_sync_ops(m, lb)
    # dispatch, sort, activation, unsort, combine, unpermute, residual; 16 experts' GEMMs + quantisations
    assert after[0] == 7 + 16 * 2 * 2
    assert after[0] < moe_ops[0]
    synced = _est(m, hw, lay)
    monkeypatch.setattr(host, "post_sync_ops", lambda m, lay: np.zeros(len(lay)))
    unsynced = _est(m, hw, lay)
    assert unsynced.time["host"][0] == 0  # by totals the GPU work hides the whole issue
    assert synced.time["host"][0] > 0
    graphed = Layout(**{**EAGER_MOE, "mbs": 4, "cuda_graphs": ("attn", "moe_router", "moe_preprocess", "moe")})
    assert host.post_sync_ops(m, from_layouts([graphed]))[0] == 0  # a captured MoE block has static shapes
