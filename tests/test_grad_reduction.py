"""Data-parallel gradient reduction per ZeRO stage, and the MoE forward's count exchange."""
import numpy as np
import pytest

from piper_plan.cost import comm
from piper_plan.cost.batch import from_layouts
from piper_plan.cost.estimate import Routing, evaluate
from piper_plan.cost.layer import _layer_costs
from piper_plan.layout import Layout
from piper_plan.specs import load_hardware, load_model


def _dp_comm(zero: int, microbatches: int, overlap: bool) -> float:
    """dp_comm seconds of Mixtral 8x7B on 64 Frontier GCDs (PP 8, DP 8 across nodes, EP 8)
    at `microbatches` micro-batches a pipeline."""
    lay = Layout(gpus=64, tp=1, pp=8, dp=8, ep=8, mbs=1, global_batch=8 * microbatches, seq=4096,
                 schedule="1f1b", recompute="full", zero=zero, overlap_grad_reduce=overlap,
                 sequence_parallel=False)
    est = evaluate(load_model("mixtral-8x7b"), load_hardware("frontier"), from_layouts([lay]))
    return float(est.time["dp_comm"][0])


@pytest.mark.parametrize("zero", [0, 1])
def test_stages_below_two_reduce_the_accumulated_gradients_once(zero):
    assert _dp_comm(zero, 8, False) == pytest.approx(_dp_comm(zero, 16, False), rel=1e-9)


def test_zero2_reduce_scatters_every_micro_batch():
    """ZeRO-2 keeps only its gradient shard between micro-batches (as DeepSpeed's stage 2 does),
    so unoverlapped its reduction grows by one reduce-scatter per micro-batch."""
    t8, t16, t32 = (_dp_comm(2, M, False) for M in (8, 16, 32))
    per_mb = (t16 - t8) / 8
    assert per_mb > 0
    assert t32 - t16 == pytest.approx(16 * per_mb, rel=1e-9)
    # stage 1 pays the same reduce-scatter (and the same parameter gather) once a step
    assert t8 == pytest.approx(_dp_comm(1, 8, False) + 7 * per_mb, rel=1e-9)


def test_zero2_hides_each_reduction_behind_its_own_micro_batch_backward():
    """Overlapped, each micro-batch's reduce-scatter runs beside that micro-batch's backward
    (seconds of experts and attention at 4,096 tokens): nothing of it shows at any M."""
    assert _dp_comm(2, 8, True) == pytest.approx(_dp_comm(2, 32, True), abs=1e-9)
    assert _dp_comm(2, 32, True) < _dp_comm(2, 32, False) / 10


def test_moe_forward_pays_the_count_exchange_set_ups():
    """Before its dispatch, a MoE forward exchanges per-expert row counts over the EP group: a
    flat exchange of a few bytes, so one set-up per peer at its level (comm.a2a_flat). The
    backward reuses the counts, so forward and backward all-to-all differ by exactly that."""
    m, hw = load_model("deepseek-v3"), load_hardware("frontier")
    for ep in (8, 64, 256):
        lay = from_layouts([Layout(gpus=ep, dp=ep, ep=ep, mbs=1, global_batch=ep, seq=4096, zero=1)])
        lc = _layer_costs(m, hw, lay, Routing(), "bf16")
        exchange = comm.a2a_flat(hw, 8.0 * m.moe.num_experts, ep, 1)
        assert float(lc["a2a_fwd"][0] - lc["a2a_bwd"][0]) == pytest.approx(float(exchange), rel=1e-9)
    # across 32 nodes the set-ups reach a millisecond: 255 peers, most of them a group's 6 us away
    assert float(exchange) > 1e-3
    lat = np.array([lv.latency_us for lv in hw.topology])
    assert float(exchange) == pytest.approx((np.array([1, 6, 24, 224, 0]) * lat).sum() * 1e-6, rel=0.01)


def test_zero3_gathers_and_reduce_scatters_hide_behind_compute_when_overlapped():
    # FSDP / ZeRO-3: each micro-batch gathers the parameters for its forward and its backward and
    # reduce-scatters its gradients; overlapped, that traffic runs behind the layers' compute
    # (prefetch), so only what compute cannot cover is exposed. Llama-3-8B-sized dense model on one
    # DGX H100 (Megatron-Bridge's FSDP recipe layout: 8 GPUs, MBS 1, GBS 128, seq 8192)
    from piper_plan.specs.model import ModelSpec

    m = ModelSpec(name="llama3-8b-like", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
                  vocab_size=128256, seq_len=8192, ffn_size=14336)
    hw = load_hardware("dgx-h100")
    kw = dict(gpus=8, pp=1, dp=8, mbs=1, global_batch=128, seq=8192)
    on, off, z1 = (evaluate(m, hw, from_layouts([Layout(**kw, **x)])) for x in
                   ({"zero": 3}, {"zero": 3, "overlap_grad_reduce": False}, {"zero": 1}))
    M = 16
    assert off.time["dp_comm"][0] > M * 0.05  # 16 micro-batches each move the whole model 3 times
    assert on.time["dp_comm"][0] < 0.01 * off.time["dp_comm"][0]  # ... behind ~0.5 s of compute each
    assert on.step_time_s[0] == pytest.approx(z1.step_time_s[0], rel=0.01)


def test_zero3_kept_gathered_to_the_backward_gathers_once_a_micro_batch():
    """reshard_after_forward false (torchtitan's fsdp_reshard_after_forward="never"): a unit
    gathered for a micro-batch's forward stays so for its backward, which reduce-scatters only.
    Unoverlapped, each micro-batch then moves the parameters twice instead of three times: the
    step saves one gather a micro-batch, a third of the traffic where gradients and parameters
    are the same size (bf16 reduction)."""
    m, hw = load_model("mixtral-8x7b"), load_hardware("frontier")
    kw = dict(gpus=64, dp=64, ep=8, mbs=1, global_batch=128, seq=4096, recompute="full", zero=3,
              overlap_grad_reduce=False, grad_dtype="bf16")
    t3, t2 = (float(evaluate(m, hw, from_layouts([Layout(**kw, reshard_after_forward=r)])).time["dp_comm"][0])
              for r in (True, False))
    assert t2 == pytest.approx(t3 * 2 / 3, rel=0.01)  # the norm's all-reduce is the rest


def test_the_step_waits_for_the_stage_holding_the_most_parameters():
    """Each pipeline stage reduces its own gradients and gathers its own parameters after its
    last backward, so the step's reduction is the heaviest stage's, not the busiest one's. GPT-OSS
    120B split by cost over 8 stages: the LM head's 201k-vocabulary GEMM makes the last stage the
    busiest with 1 layer, while the others hold 5. The reduction priced must cover 5 layers' worth
    of gradients and parameters (the embedding only adds); it had been priced for the last stage's
    one, so a faster HBM, which moved the busiest stage, had doubled the predicted step."""
    from piper_plan.cost.estimate import _group_terms
    from piper_plan.cost.memory import layer_params_per_rank

    m, hw = load_model("gpt-oss-120b"), load_hardware("dgx-b200")
    lay = from_layouts([Layout(gpus=64, tp=2, pp=8, dp=4, mbs=4, global_batch=1024, seq=4096,
                               recompute="selective", zero=1, overlap_grad_reduce=False, grad_dtype="bf16")])
    est = evaluate(m, hw, lay)
    assert (int(est.chunks.last[0]), int(est.chunks.first[0]), int(est.chunks.mid_hi[0])) == (1, 5, 5)
    _, rep, exp = (float(x[0]) for x in layer_params_per_rank(m, lay))
    grp = _group_terms(hw, lay, m.hidden_size)
    # ZeRO-1, unoverlapped, bf16: reduce-scatter the gradients, all-gather the parameters (2 B each)
    # over the replicated parameters' DP group and the experts' expert-DP group
    moved = sum(comm.ring_allreduce(hw, 5 * p * 2.0, n, s, 1.0, span)
                for p, n, s, span in ((rep, lay.dpcp, lay.tp, (grp["dp_bw"], grp["dp_lat"])),
                                      (exp, grp["edp"], grp["edp_stride"], (grp["edp_bw"], grp["edp_lat"]))))
    assert est.time["dp_comm"][0] >= float(moved[0])
    assert est.time["dp_comm"][0] < 1.3 * float(moved[0])  # the embedding (0.3B of the first stage's 16B) and skew
    faster = hw.model_copy(update={"accelerator": hw.accelerator.model_copy(
        update={"memory_bandwidth_gbps": 1.5 * hw.accelerator.memory_bandwidth_gbps})})
    assert evaluate(m, faster, lay).step_time_s[0] <= est.step_time_s[0]


def test_an_exchange_hidden_behind_other_compute_opens_no_window_for_the_reduction():
    """DualPipeV hides a micro-batch's all-to-all behind another one's compute, so in the step the
    exchange takes no time of its own; the gradient reduction cannot run behind it either. Counted
    as window, recomputing the whole forward (which repeats the dispatch) had hidden more of the
    ZeRO-2 reduce-scatters than it cost, and full recompute priced this layout 14 % faster than
    none (5.57 s against 6.47 s)."""
    m, hw = load_model("gpt-oss-120b"), load_hardware("dgx-b200")
    kw = dict(gpus=64, pp=2, dp=32, ep=2, vpp=2, mbs=2, global_batch=1024, seq=4096, schedule="dualpipev",
              sequence_parallel=False, zero=2, placement="spread")
    none, full = (evaluate(m, hw, from_layouts([Layout(**kw, recompute=rc)])) for rc in ("none", "full"))
    assert (int(none.chunks.first[0]), int(full.chunks.first[0])) == (9, 9)  # the same split both ways
    assert full.time["a2a"][0] > none.time["a2a"][0]  # the repeated dispatch, partly exposed
    assert full.step_time_s[0] >= none.step_time_s[0]


@pytest.mark.parametrize("model,hardware", [("qwen3-30b-a3b", "frontier"), ("gpt-oss-120b", "dgx-b200")])
def test_a_stage_waiting_on_the_busiest_one_reduces_its_gradients_while_it_waits(model, hardware):
    """Under ZeRO-2 every stage reduce-scatters each micro-batch's gradients. A stage with less
    work a micro-batch than the busiest one waits for it each period of the steady state, and its
    reduce-scatters fill that wait too, so they cost the step nothing up to it. Priced behind the
    stage's own backward only, full recompute (a longer backward) came out faster than none on
    1,167 of these two jobs' 80,610 layouts with the same pipeline split: recompute on a stage
    other than the busiest one hid its reduction while the pipeline gained only the busiest
    stage's recompute. Over the 1F1B-family schedules, full recompute is now never priced faster
    than none where the split is the same. (gpipe keeps 27, all ZeRO-2 with every expert on each
    rank, EP 1: a stage whose backward waits on its reduce-scatter every micro-batch recomputes
    in that wait for nothing; they read 0.1-3.3 % faster.)

    Interleaved, 1F1B, zbv and dualpipev are priced by walking torch's order with each stage's own
    time (schedule.interleaved_step, v_orders.v_step), and their bubble need not grow with the work:
    recompute can move the busiest rank off the LM head's chunk and shorten the fill. The reduction's
    exposure is priced per micro-batch outside the walk (reduction.dp_comm_time), so where the longer
    backward hides several seconds of reduce-scatters the shorter bubble can tip the step: on under
    1 % of the walked layouts, by under 3 % (qwen3 282 of its 32,340 interleaved same-split layouts,
    by up to 0.9 %, and 9 of 10,635 1F1B ones, by up to 0.08 %; gpt-oss 162 of 28,053 interleaved,
    by up to 2.2 %, and 6 of 3,555 zbv ones, by up to 0.6 %; no dualpipev one)."""
    from dataclasses import replace

    from piper_plan.search import SearchSpace, default_global_batch, enumerate_layouts, round_batch

    m, hw = load_model(model), load_hardware(hardware)
    sp = SearchSpace(gpus=64, seq=m.seq_len, global_batch=round_batch(default_global_batch(m.seq_len), 64),
                     schedules=("1f1b", "interleaved", "zbv", "dualpipev"))
    lay, _ = enumerate_layouts(m, hw, sp)
    none, full = (evaluate(m, hw, replace(lay, recompute=np.full(len(lay), rc, lay.recompute.dtype))) for rc in (0, 2))
    same_split = ((none.chunks.first == full.chunks.first) & (none.chunks.last == full.chunks.last)
                  & (none.chunks.mid_hi == full.chunks.mid_hi))
    assert (lay.zero == 2).sum() > 1000 and same_split.mean() > 0.5
    faster = same_split & (full.step_time_s < none.step_time_s * (1 - 1e-9))
    for s in (1, 2, 3, 4):  # 1f1b, interleaved, zbv, dualpipev: each a walked order
        assert (faster & (lay.sched == s)).sum() < 0.01 * (same_split & (lay.sched == s)).sum()
    assert np.all(full.step_time_s[faster] > 0.97 * none.step_time_s[faster])


def test_piper_train_s_zero_is_priced_as_the_collectives_it_issues():
    """piper-train (eager, fused_kernels false) moves whole parameters through their owners
    (runtime/optim.py): under ZeRO-1 it all-reduces every gradient as under ZeRO-0, then each owner
    broadcasts its fp32 parameters; under ZeRO-2 each bucket is reduced to its owner. A broadcast
    or a reduce moves its whole buffer through the root (comm.rooted), where a fused stack's
    ZeRO reduce-scatters the gradients and all-gathers bf16 weights. benchmarks/zero_traffic.py
    measures it on gloo (test_piper_train_s_zero2_reduce_on_gloo_moves_an_all_reduce_s_bytes): over
    ZeRO-0, ZeRO-1 1.01-1.16 and ZeRO-2 0.91-1.06 measured in six runs, 1.05 and 1.02 priced (0.74
    and 0.70 priced as a fused stack's). This spec's library is NCCL."""
    from piper_plan.cost.estimate import _group_terms
    from piper_plan.cost.reduction import PipeWindow, collectives, dp_comm_time

    hw = load_hardware("frontier")
    rep, exp = np.array([1e9]), np.array([0.0])
    z = np.zeros(1)
    t = {}
    for fused in (True, False):
        for zero in (0, 1):
            b = from_layouts([Layout(gpus=64, dp=64, mbs=1, global_batch=64, seq=4096, zero=zero, fused_kernels=fused,
                                     overlap_grad_reduce=False, sequence_parallel=False)])
            c = collectives(hw, b, _group_terms(hw, b, 4096), rep, exp, 2.0)
            t[fused, zero] = (float(dp_comm_time(hw, b, np.zeros(1, int), PipeWindow(z, z, z, b.m), c)[0]),
                              float(c.rs_full[0]), float(c.rs_half[0]), float(c.ag[0]))
    eager0, eager1, fused1 = t[False, 0], t[False, 1], t[True, 1]
    ring = lambda nbytes, f: float(comm.ring_allreduce(hw, nbytes, 64, 1, f))  # noqa: E731  over 64 ranks
    rooted = lambda nbytes: float(comm.rooted(hw, nbytes, 64, 1))  # noqa: E731
    assert eager1[0] == pytest.approx(eager0[0] + eager1[3], rel=1e-12)  # ZeRO-0's all-reduce, then the gather
    assert (eager1[2], eager1[3]) == pytest.approx((rooted(4e9), rooted(4e9)), rel=1e-12)  # fp32 through owners
    assert (fused1[2], fused1[3]) == pytest.approx((ring(4e9, 0.5), ring(2e9, 0.5)), rel=1e-12)
    assert fused1[0] == pytest.approx(fused1[2] + fused1[3], rel=1e-12)  # a reduce-scatter and a gather
    # + the norm's 8-byte all-reduce, which NCCL's tuner runs as a tree over these 8 nodes
    norm = float(comm.allreduce(hw, 8.0, 64, 1))
    assert norm < float(comm.ring_allreduce(hw, 8.0, 64, 1))
    assert eager0[0] == pytest.approx(eager0[1] + norm, rel=1e-12)
    # a rooted collective moves its whole buffer: n/(n-1) of a ring's half, less a latency step
    assert rooted(4e9) > ring(4e9, 0.5)


def test_piper_train_s_zero2_reduce_on_gloo_moves_an_all_reduce_s_bytes():
    """gloo's reduce (gloo/reduce.cc) is a ring reduce-scatter followed by a gather of the reduced
    chunks into the root, so piper-train's ZeRO-2 bucket reduce on CPU moves 2(n-1)/n of its
    buffer through the root, an all-reduce's bytes, where NCCL's chained reduce moves it once;
    a broadcast is the same on both. Measured on 4 gloo ranks over 50 MB of fp32: all-reduce 65 ms,
    reduce 61, broadcast 36-41 (session 46); benchmarks/zero_traffic.py measures the step."""
    from piper_plan.cost.estimate import _group_terms
    from piper_plan.cost.reduction import collectives

    gloo = load_hardware("cpu-local")
    nccl = gloo.model_copy(update={"collectives": "nccl"})
    assert gloo.collectives == "gloo"
    rep, exp = np.array([1e7]), np.array([0.0])
    b = from_layouts([Layout(gpus=4, dp=4, mbs=1, global_batch=4, seq=16, zero=2, fused_kernels=False,
                             overlap_grad_reduce=False, sequence_parallel=False)])
    c = {hw.collectives: collectives(hw, b, _group_terms(hw, b, 16), rep, exp, 2.0) for hw in (gloo, nccl)}
    # the reduce: an all-reduce's bytes and n latency steps (its ring's n-1 and the gather's one)
    bw, lat = comm.group_span(gloo, 4, 1)
    lat = lat + gloo.efficiency.collective_step_us * 1e-6
    assert c["gloo"].rs_half[0] == pytest.approx(1.5 * 4e7 / bw + 4 * lat, rel=1e-12)
    assert c["nccl"].rs_half[0] == pytest.approx(4e7 / bw + 3 * lat, rel=1e-12)
    assert c["gloo"].ag[0] == c["nccl"].ag[0] > 0  # the owners' broadcasts do not depend on it
    assert c["gloo"].rs_full[0] == c["nccl"].rs_full[0]


def test_a_dense_model_pays_no_collective_for_the_experts_it_does_not_have():
    """The expert-data-parallel reduction of zero bytes issues no collective: a dense model's
    reduction is its dense all-reduce alone (it had paid 2(n-1) latency steps of an empty one)."""
    from piper_plan.cost.estimate import _group_terms
    from piper_plan.cost.reduction import collectives

    hw = load_hardware("frontier")
    b = from_layouts([Layout(gpus=64, dp=64, global_batch=64, seq=4096, sequence_parallel=False)])
    c = collectives(hw, b, _group_terms(hw, b, 4096), np.array([1e9]), np.array([0.0]), 2.0)
    assert c.rs_full[0] == pytest.approx(float(comm.ring_allreduce(hw, 4e9, 64, 1)), rel=1e-12)
    assert comm.ring_allreduce(hw, 0.0, 64, 1) == 0.0


@pytest.mark.parametrize("schedule,vpp,pays", [("1f1b", 1, True), ("interleaved", 2, True), ("zbv", 2, False)])
def test_a_tied_embedding_on_two_stages_sums_its_gradients_between_them_once_a_step(schedule, vpp, pays):
    """GPT's word embedding is tied to its LM head. Where the first stage and the last are two
    ranks, they all-reduce its gradient once a step, after the backward (Megatron-Core's
    _allreduce_word_embedding_grads, piper-train's embedding group); a V schedule's rank 0 holds
    both ends: nothing to sum. At dp 1 there is no other reduction, so the tied model's dp_comm
    exceeds the untied one's by exactly that all-reduce (the pipeline, and so the reduction's
    skew, is the same)."""
    m, hw = load_model("gpt-175b"), load_hardware("dgx-a100-80gb")
    lay = Layout(gpus=64, tp=8, pp=8, dp=1, mbs=1, global_batch=16, seq=2048, schedule=schedule, vpp=vpp,
                 recompute="full")
    tied, untied = (float(evaluate(x, hw, from_layouts([lay])).time["dp_comm"][0])
                    for x in (m, m.model_copy(update={"tied_embeddings": False})))
    # fp32 gradients of the tp-split table, between stage 0 and stage 7 (7 stages of 8 ranks apart)
    want = float(comm.ring_allreduce(hw, m.vocab_size * m.hidden_size / 8 * 4.0, 2, 7 * 8)) if pays else 0.0
    assert tied - untied == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert (want > 0) == pays


def _z3_dp_comm(model: str, gpus: int, gbs: int, ep: int, zero_replicas: int = 1) -> float:
    """Unoverlapped dp_comm seconds of a ZeRO-3 layout with no pipeline, tp 2, on DGX H100s."""
    lay = Layout(gpus=gpus, tp=2, pp=1, dp=gpus // 2, ep=ep, mbs=1, global_batch=gbs, seq=4096,
                 schedule="1f1b", recompute="full", zero=3, zero_replicas=zero_replicas,
                 overlap_grad_reduce=False)
    est = evaluate(load_model(model), load_hardware("dgx-h100"), from_layouts([lay]))
    return float(est.time["dp_comm"][0])


def test_zero3_gathers_a_layer_at_a_time_so_each_layer_pays_a_call_s_latency():
    """FSDP2 and Megatron-FSDP gather and reduce-scatter one unit (a layer) per call, and each
    call over n ranks waits n-1 steps: at 16,384 data-parallel ranks DeepSeek-V3's 61 layers
    pay ~57 ms a call, three calls a layer and micro-batch. Priced as one call per micro-batch,
    the time hardly grew from 2,048 ranks (8.64 -> 9.01 s); priced per layer, it doubles."""
    small = _z3_dp_comm("deepseek-v3", 4096, 2048, 16)
    large = _z3_dp_comm("deepseek-v3", 32768, 16384, 16)
    assert large > 2 * small
    # the latency is what grows: the same bytes over hybrid shards of 2,048 ranks (8 copies)
    # pay the small group's calls again, plus one all-reduce of the reduced shard
    hybrid = _z3_dp_comm("deepseek-v3", 32768, 16384, 16, zero_replicas=8)
    assert hybrid < large / 2


def test_a_single_call_latency_is_none_for_one_rank():
    hw = load_hardware("dgx-h100")
    assert float(comm.call_latency(hw, 1, 1)) == 0.0
    assert float(comm.call_latency(hw, 16, 1)) == pytest.approx(14 * 3e-6 + 1 * 5e-6, rel=1e-9)


def test_only_the_layers_holding_experts_pay_the_expert_group_s_calls():
    """DeepSeek-V3's 3 dense layers gather over the dense group alone: of a rank's 62 units (61
    layers and the embedding's), the expert group's call latency is paid on its 58 MoE layers."""
    from piper_plan.cost.reduction import _unit_extra

    hw = load_hardware("dgx-h100")
    groups = ((2048, 2, None, 32768), (2048, 16, None, 32768))
    dense, expert = (float(comm.call_latency(hw, 2048, st, None, 32768)) for st in (2, 16))
    got = float(_unit_extra(hw, 1.0, groups, 62, 58))
    assert got == pytest.approx(61 * dense + 57 * expert, rel=1e-12)
    assert float(_unit_extra(hw, 0.0, groups, 62, 0)) == pytest.approx(61 * dense, rel=1e-12)  # no experts held


def test_hybrid_zero3_copies_all_reduce_a_unit_at_a_time(monkeypatch):
    """FSDP2's HSDP all-reduces each unit's reduced shard across the copies (foreach_reduce per
    fully_shard unit): unoverlapped, the step pays what a call a unit adds over one call (each
    call priced at its own size, a ring or NCCL's tree: tests/test_tree_allreduce.py), for a
    rank's 62 units (58 of them over the expert copies too)."""
    from piper_plan.cost import reduction

    seen = []
    real = reduction._unit_allreduce_extra

    def spy(*a):
        out = real(*a)
        seen.append(np.asarray(out, dtype=float).copy())
        return out

    monkeypatch.setattr(reduction, "_unit_allreduce_extra", spy)
    with_units = _z3_dp_comm("deepseek-v3", 32768, 16384, 16, zero_replicas=8)
    monkeypatch.setattr(reduction, "_unit_allreduce_extra", lambda *a: np.zeros_like(np.asarray(a[-1], dtype=float)))
    once = _z3_dp_comm("deepseek-v3", 32768, 16384, 16, zero_replicas=8)
    per_step = float(seen[0].max())  # one stage (pp 1): its rank, in the roles it plays
    assert per_step > 1e-3 and with_units - once == pytest.approx(per_step, rel=1e-6)


def test_the_copies_all_reduce_waits_for_the_last_unit_s_calls_before_it():
    """Hybrid ZeRO-3, overlapped: the copies' all-reduce follows the last micro-batch's gathers and
    reduce-scatter, per-unit call latency included, so it leaves the backward's window sooner.
    Gather and reduce-scatter 1 s each plus 0.5 s of per-unit latency, a 3.5 s backward window:
    the all-reduce (0.6 s + 0.2 s a unit) starts at 3 s and 0.3 s of it is exposed; counted
    without the latency it would start at 2 s and hide whole."""
    from piper_plan.cost.reduction import Collectives, PipeWindow, dp_comm_time

    lay = from_layouts([Layout(gpus=64, tp=1, pp=1, dp=64, mbs=1, global_batch=64, seq=4096, schedule="1f1b",
                               recompute="none", zero=3, zero_replicas=2, overlap_grad_reduce=True)])
    hw, one = load_hardware("dgx-h100"), np.ones(1)
    win = PipeWindow(F=2.0 * one, B=3.0 * one, W=0.5 * one, M=one)

    def dp(extra):
        coll = Collectives(rs_full=one, rs_half=one, ag=one, ar_rep=0.6 * one, units=33 * one,
                           unit_extra=extra * one, rep_unit_extra=0.2 * one)
        return float(dp_comm_time(hw, lay, one, win, coll)[0])

    assert dp(0.5) - dp(0.0) == pytest.approx(0.3, abs=1e-12)
