"""Layout.tp_comm_overlap: Megatron-Core's --tp-comm-overlap pipelines each tensor-parallel
all-gather and reduce-scatter with the GEMM beside it, so the collectives hide behind a layer's
linear layers and only what those cannot cover stays on the step."""
import numpy as np
import pytest

from piper_plan.cost.batch import from_layouts
from piper_plan.cost.estimate import evaluate
from piper_plan.layout import Layout
from piper_plan.specs import load_hardware, load_model
from piper_plan.specs.model import ModelSpec

# Llama-3-70B's shape (HF meta-llama/Meta-Llama-3-70B config.json) in Megatron-Bridge's DGX-H100 recipe layout
M70 = ModelSpec(name="llama3-70b-like", num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
                vocab_size=128256, seq_len=8192, ffn_size=28672)
KW = dict(gpus=64, tp=4, pp=8, dp=2, vpp=5, schedule="interleaved", mbs=1, global_batch=128, seq=8192, fp8="current")


def _pair(hw, **kw):
    lays = [Layout(**{**KW, **kw}, tp_comm_overlap=x) for x in (False, True)]
    return evaluate(M70, hw, from_layouts(lays))


def test_the_collectives_hide_behind_the_linear_layers_on_nvlink():
    est = _pair(load_hardware("dgx-h100"))
    off, on = est.time["tp_comm"]
    assert off > 0.1 * est.step_time_s[0]  # 13 % of the step without the overlap
    assert on < 0.01 * off                  # NVLink's collectives fit under the GEMMs beside them
    assert est.step_time_s[1] == pytest.approx(est.step_time_s[0] - (off - on), rel=0.02)
    np.testing.assert_allclose(est.time["compute"][1], est.time["compute"][0])


def test_without_tensor_parallelism_the_flag_changes_nothing():
    est = _pair(load_hardware("dgx-h100"), tp=1, dp=8)
    assert est.step_time_s[0] == est.step_time_s[1] and est.time["tp_comm"][0] == 0.0


def test_only_what_the_gemms_cannot_cover_stays_exposed():
    # a slow link (the tensor-parallel group across nodes: tp 16 over 8-GPU nodes) outlasts the GEMMs
    est = _pair(load_hardware("dgx-h100"), gpus=128, tp=16, dp=1, global_batch=64)
    off, on = est.time["tp_comm"]
    assert 0 < on < off
    assert est.step_time_s[1] < est.step_time_s[0]


def test_a_tensor_parallel_collective_pays_each_call_s_fixed_cost():
    # a CPU spec measures what a call waits for its peers between compute (collective_overhead_us):
    # a sequence-parallel all-reduce equivalent is two calls, an all-reduce one; GPU specs hold none
    from piper_plan.cost import comm
    from piper_plan.cost.layer import _tp_allreduce

    cpu = load_hardware("cpu-local")
    co = cpu.efficiency.collective_overhead_us * 1e-6
    assert co > 0
    lays = from_layouts([Layout(gpus=2, tp=2, global_batch=4, seq=64, sequence_parallel=sp) for sp in (True, False)]
                        + [Layout(gpus=2, dp=2, global_batch=4, seq=64)])
    ring = comm.ring_allreduce(cpu, 1e5, lays.tp, 1, world=lays.gpus)
    assert list(_tp_allreduce(cpu, lays, 1e5)) == pytest.approx(list(ring + co * np.array([2.0, 1.0, 0.0])))
    h100 = load_hardware("dgx-h100")
    assert list(_tp_allreduce(h100, lays, 1e5)) == list(comm.ring_allreduce(h100, 1e5, lays.tp, 1, world=lays.gpus))


def test_the_vocab_parallel_embedding_and_cross_entropy_are_priced_as_collectives():
    # the embedding's sum over tp, the head's gather and the cross-entropy's three per-token
    # all-reduces (max, sum of exponentials, target logit) had been priced as nothing
    from piper_plan.cost import comm
    from piper_plan.cost.layer import _rows_half, _vocab_parallel

    m, hw = load_model("gpt-1.7b"), load_hardware("dgx-h100")
    lay = from_layouts([Layout(gpus=8, tp=8, global_batch=8, seq=2048)])  # sequence parallel
    t = float(lay.tokens[0])
    rows = t * m.hidden_size * 2.0
    half = float(comm.ring_allreduce(hw, rows, 8, 1, 0.5, world=8))
    ce = 3.0 * float(comm.ring_allreduce(hw, t * 4.0, 8, 1, world=8))
    emb, head = _vocab_parallel(m, hw, lay, _rows_half(m, hw, lay))
    assert (float(emb.f[0]), float(emb.b[0])) == pytest.approx((half, half))
    assert (float(head.f[0]), float(head.b[0])) == pytest.approx((half + ce, half))


def test_a_moe_layer_prices_its_shared_experts_and_routing_collectives_over_tp():
    # the shared experts' FFN enters and leaves the tensor-parallel region as a dense FFN does,
    # replicated tokens are split before routing and gathered after, and piper-train's router sums
    # its statistics over tp: a MoE layer had been priced its attention's collectives alone
    from piper_plan.cost import comm
    from piper_plan.cost.layer import _moe_tp_extra, _router_stats, _rows_half, _tp_allreduce

    cpu = load_hardware("cpu-local")
    m = load_model("tiny-moe")
    assert m.moe.shared_experts
    lays = from_layouts([Layout(gpus=2, tp=2, global_batch=4, seq=64, sequence_parallel=sp, fused_kernels=False)
                         for sp in (True, False)])
    t, d, E = 64.0, m.hidden_size, m.moe.num_experts
    tp_ar = _tp_allreduce(cpu, lays, lays.tokens * d * lays.act_bytes)
    co = cpu.efficiency.collective_overhead_us * 1e-6
    stats = float(comm.ring_allreduce(cpu, (2 * E + 2) * 4.0, 2, 1, world=2)) + co
    rows = float(comm.ring_allreduce(cpu, t * d * 2.0, 2, 1, 0.5, world=2)) + co
    extra = _moe_tp_extra(m, lays, tp_ar, _rows_half(m, cpu, lays), _router_stats(m, cpu, lays))
    assert list(extra.f) == pytest.approx([tp_ar[0] + stats, tp_ar[1] + rows + stats])
    assert list(extra.b) == pytest.approx([tp_ar[0], tp_ar[1] + rows])
    plain = m.model_copy(update={"moe": m.moe.model_copy(update={"shared_experts": 0})})
    assert list(_moe_tp_extra(plain, lays, tp_ar, _rows_half(plain, cpu, lays), _router_stats(plain, cpu, lays)).b) \
        == pytest.approx([0.0, rows])


def test_the_lm_head_s_input_gradient_all_reduce_runs_beside_its_weight_gradient_where_the_stack_does_so():
    # a column-parallel layer without sequence parallelism all-reduces its input gradient while its
    # weight gradient computes (Layout.tp_async_dgrad): the head is one, as q/k/v and fc1 are
    from piper_plan.cost import comm
    from piper_plan.cost.compute import lm_head_phase
    from piper_plan.cost.layer import _rows_half, _vocab_parallel

    m, hw = load_model("llama3-70b"), load_hardware("dgx-h100")
    lays = from_layouts([Layout(gpus=8, tp=8, global_batch=8, seq=4096, sequence_parallel=False, tp_async_dgrad=a,
                                fused_kernels=f) for a, f in ((False, True), (True, True), (True, False))])
    w = lm_head_phase(m, hw, lays, "bf16").w
    whole = comm.ring_allreduce(hw, lays.tokens * m.hidden_size * 2.0, 8, 1, world=8)
    _, head = _vocab_parallel(m, hw, lays, _rows_half(m, hw, lays), w)
    assert list(head.b) == pytest.approx([whole[0], max(whole[1] - w[1], 0.0), whole[2]])  # eager: no async dgrad
