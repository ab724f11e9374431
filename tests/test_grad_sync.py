"""Layout.grad_sync step (fully_shard's set_requires_gradient_sync(is_last_microbatch)): ZeRO-3's
gradients accumulate unsharded through the step and are reduce-scattered once, in the last
micro-batch's backward, instead of in every micro-batch's; the rank holds its whole share of them."""
import numpy as np
import pytest
from bad_input_support import one_line

from piper_plan.cost.batch import WGRAD_ACCUMS, from_layouts
from piper_plan.cost.estimate import evaluate
from piper_plan.cost.memory import zero3_gathered_bytes
from piper_plan.cost.reduction import PipeWindow, RankParams, held_grad_adds
from piper_plan.errors import LayoutError
from piper_plan.layout import Layout, check_for
from piper_plan.search import SearchSpace, search
from piper_plan.specs.registry import load_hardware, load_model


def _layouts(micro_batches: int, **kw) -> list[Layout]:
    # Llama 3 8B on 16 H100 (two nodes: the reduce-scatter crosses the NICs), FSDP over all of them
    base = dict(gpus=16, dp=16, mbs=1, seq=4096, global_batch=16 * micro_batches, zero=3, fsdp2=True,
                overlap_grad_reduce=False, **kw)  # not overlapped: each collective shows whole
    return [Layout(**base, grad_sync=s) for s in ("microbatch", "step")]


def test_reducing_once_a_step_saves_a_reduce_scatter_for_every_other_micro_batch():
    m, hw = load_model("llama3-8b"), load_hardware("dgx-h100")
    saved = {}
    for M in (1, 2, 4, 8):
        # bf16: each later micro-batch's add into the held gradients costs the same, the first casts nothing
        est = evaluate(m, hw, from_layouts(_layouts(M, grad_dtype="bf16")))
        each, once = est.time["dp_comm"]
        saved[M] = each - once
    assert saved[1] == 0.0  # one micro-batch: nothing to defer
    one = saved[2]
    assert one > 0
    assert saved[4] == pytest.approx(3 * one) and saved[8] == pytest.approx(7 * one)


@pytest.mark.parametrize("reshard", [True, False])
def test_the_gathers_follow_the_units_lifetime_and_the_compute_is_unchanged(reshard):
    m, hw = load_model("llama3-8b"), load_hardware("dgx-h100")
    kw = dict(reshard_after_forward=reshard, grad_dtype="bf16")
    step = {M: evaluate(m, hw, from_layouts(_layouts(M, **kw))) for M in (1, 2, 4)}
    dp = {M: e.time["dp_comm"][1] for M, e in step.items()}
    more = dp[2] - dp[1]  # what one more micro-batch adds once the reduction waits for the step's end
    assert dp[4] - dp[1] == pytest.approx(3 * more)
    add = _held_add_s(m, 6.0)  # and each later micro-batch adds its gradients into the held ones
    if reshard:  # freed after each forward and backward: every micro-batch gathers its units twice
        assert more > 2 * add
    else:  # kept gathered to the backward, and from one micro-batch to the next: it gathers once a step
        assert more == pytest.approx(add)
    assert all(e.time["compute"][0] == e.time["compute"][1] for e in step.values())
    # overlapped, the one reduce-scatter left hides behind the last backward as the others did; the
    # adds run on the compute stream, which hides nothing
    est = evaluate(m, hw, from_layouts([x.model_copy(update={"overlap_grad_reduce": True}) for x in _layouts(4, **kw)]))
    each, once = est.time["dp_comm"]
    assert 0 <= once - 3 * add <= each


def _stream_s(nbytes: float, kernels: float = 10.0) -> float:
    """Seconds for dgx-h100 to stream `nbytes` at its sustained rate in `kernels` launches."""
    hw = load_hardware("dgx-h100")
    acc, eff = hw.accelerator, hw.efficiency
    return nbytes / (acc.memory_bandwidth_gbps * 1e9 * eff.memory) + kernels * eff.kernel_overhead_us * 1e-6


def _held_add_s(m, nbytes: float) -> float:
    """_stream_s of `nbytes` per parameter of the whole model (llama3-8b at dp 16 holds all of it
    unsharded), with a kernel launch per fully_shard unit (32 blocks, the embedding and the head:
    FSDP2's units)."""
    return _stream_s(nbytes * m.total_params, kernels=33)


def test_each_later_micro_batch_adds_its_gradients_into_the_held_ones():
    m, hw = load_model("llama3-8b"), load_hardware("dgx-h100")
    kw = dict(reshard_after_forward=False)  # one gather a step: what grows with the micro-batches is the adds
    dp = {(g, M): evaluate(m, hw, from_layouts(_layouts(M, grad_dtype=g, **kw))).time["dp_comm"][1]
          for g in ("bf16", "fp32") for M in (1, 2, 3)}
    # bf16 (autograd's in-place .grad += new): read both, write one, 6 B a parameter
    assert dp["bf16", 3] - dp["bf16", 2] == pytest.approx(_held_add_s(m, 6.0), rel=1e-3)
    # fp32 (FSDP2's unsharded_accumulated_grad += grad): 2 + 4 read, 4 written
    assert dp["fp32", 3] - dp["fp32", 2] == pytest.approx(_held_add_s(m, 10.0), rel=1e-3)
    # and once a step the first gradient cast up (2 + 4) and the reduction's copy reading 4 B, not 2
    once = dp["fp32", 2] - dp["fp32", 1] - (dp["fp32", 3] - dp["fp32", 2])
    assert once == pytest.approx(_held_add_s(m, 8.0), rel=1e-3)
    # one micro-batch reduces its own gradients: nothing is held, nothing added
    microbatch = evaluate(m, hw, from_layouts([x.model_copy(update={"grad_sync": "microbatch"})
                                               for x in _layouts(1, **kw)])).time["dp_comm"][1]
    assert dp["fp32", 1] == pytest.approx(microbatch)


def test_the_rank_holds_its_whole_share_of_the_gradients_unsharded():
    def per_param(**kw):
        lay = from_layouts([Layout(gpus=8, dp=8, global_batch=32, seq=128, zero=3, **kw)])
        return float(zero3_gathered_bytes(lay, 2.0, unit=1.0, held=10.0)[0])

    # every micro-batch: two bf16 copies of the largest unit and its fp32 reduce-scatter input
    assert per_param(grad_dtype="fp32") == 2 * 2.0 + 4.0
    # once a step: all ten parameters' fp32 gradients accumulated, and the unit's copy for the reduction
    assert per_param(grad_dtype="fp32", grad_sync="step") == 2 * 2.0 + 10 * 4.0 + 4.0
    assert per_param(grad_dtype="bf16", grad_sync="step") == 2 * 2.0 + 10 * 2.0 + 2.0
    assert per_param(grad_dtype="bf16", grad_sync="step", reshard_after_forward=False) == 10 * 2.0 + 11 * 2.0


def test_the_peak_grows_by_the_accumulated_gradients():
    m, hw = load_model("llama3-8b"), load_hardware("dgx-h100")
    est = evaluate(m, hw, from_layouts(_layouts(4, grad_dtype="bf16")))
    grown = est.peak_memory_gib[1] - est.peak_memory_gib[0]
    # 8.03 B parameters, all on every rank's stage, each with a bf16 gradient; less the unit's
    # transient copy that both hold (2 B against max(2, 2) B)
    assert grown == pytest.approx(m.total_params * 2.0 / 2**30, rel=0.02)


def test_grad_sync_step_is_refused_beside_another_zero_stage():
    m, hw = load_model("llama3-8b"), load_hardware("dgx-h100")
    for zero in (0, 1, 2):
        with pytest.raises(LayoutError, match="grad_sync step with zero 3"):
            check_for(Layout(gpus=8, dp=8, global_batch=32, seq=128, zero=zero, grad_sync="step"), m, hw)
    with pytest.raises(LayoutError, match="grad_sync step with zero 3"):
        SearchSpace(gpus=8, global_batch=32, seq=128, zeros=(1, 2), grad_sync="step")


def test_the_search_reduces_once_a_step_on_its_zero_3_layouts_only():
    m, hw = load_model("llama3-8b"), load_hardware("dgx-h100")
    res = search(m, hw, SearchSpace(gpus=16, global_batch=64, seq=4096, zeros=(1, 3), grad_sync="step"))
    z3 = res.batch.zero == 3
    assert z3.any() and (~z3).any()
    assert np.array_equal(res.batch.gstep, z3)


def test_piper_train_cannot_run_it():
    from piper_plan.errors import PiperError
    from piper_plan.search import for_runtime

    with pytest.raises(PiperError, match="it cannot run --grad-sync step"):
        for_runtime(SearchSpace(gpus=8, global_batch=32, seq=128, grad_sync="step"), "piper-train")


def test_the_cli_refuses_grad_sync_step_without_zero_3_in_one_line():
    one_line(["estimate", "-m", "tiny-moe", "-H", "cpu-local", "-n", "4", "--global-batch", "8",
              "--grad-sync", "step"], "grad_sync step with zero 3")


def test_experts_accumulating_in_place_is_refused_on_a_model_without_experts():
    m, hw = load_model("llama3-8b"), load_hardware("dgx-h100")
    with pytest.raises(LayoutError, match="wgrad_accum experts needs routed experts: llama3-8b has none"):
        search(m, hw, SearchSpace(gpus=16, global_batch=64, seq=4096, wgrad_accum="experts"))
    one_line(["estimate", "-m", "tiny-dense", "-H", "cpu-local", "-n", "4", "--global-batch", "8",
              "--wgrad-accum", "experts"], "wgrad_accum experts needs routed experts")
    # on a MoE model it means what it says
    moe = load_model("tiny-moe")
    res = search(moe, load_hardware("cpu-local"), SearchSpace(gpus=4, global_batch=8, seq=128, wgrad_accum="experts"))
    assert (res.batch.wacc == WGRAD_ACCUMS.index("experts")).all()


def _held(dp: int = 8, slack: float = 0.0, **kw) -> float:
    """held_grad_adds of a rank with 1e9 replicated and 3e9 expert parameters (EP 4: dp / 4 copies of
    each expert), 4 micro-batches, 10 units."""
    hw = load_hardware("dgx-h100")
    ep = min(dp, 4)
    lay = from_layouts([Layout(gpus=8, dp=dp, tp=8 // dp, ep=ep, global_batch=32, seq=128, **kw)])
    eb, z = lay.act_bytes.astype(float), np.zeros(1)
    win = PipeWindow(z, z, z, np.array([4]), slack=np.array([slack]))
    edp = np.array([dp // ep])
    return float(held_grad_adds(hw, lay, edp, RankParams(np.array([1e9]), np.array([3e9]), ()), eb, win, 10.0)[0])


@pytest.mark.parametrize("stage", [dict(zero=3, fsdp2=True, grad_sync="step"), dict(zero=1)])
def test_where_the_gemms_add_in_place_only_the_others_gradients_cost_an_add(stage):
    bf16 = dict(grad_dtype="bf16", **stage)
    # three later micro-batches, each reading the new and the held gradient and writing one (2 + 2 + 2 B)
    assert _held(wgrad_accum="add", **bf16) == pytest.approx(3 * _stream_s(6.0 * 4e9))
    # Dist-MoE's routed experts add inside their weight-gradient GEMMs: the replicated ones alone
    assert _held(wgrad_accum="experts", **bf16) == pytest.approx(3 * _stream_s(6.0 * 1e9))
    assert _held(wgrad_accum="gemm", **bf16) == 0.0
    # a rank with less work than the busiest one adds while it would wait for it
    one = _stream_s(6.0 * 4e9)
    assert _held(wgrad_accum="add", slack=one / 4, **bf16) == pytest.approx(3 * one * 3 / 4)
    assert _held(wgrad_accum="add", slack=2 * one, **bf16) == 0.0


def test_megatron_core_fuses_the_accumulation_and_torch_stacks_add():
    # Megatron-Core's modules: gradient_accumulation_fusion (its layouts price as before)
    assert WGRAD_ACCUMS[from_layouts([Layout(gpus=8, dp=8, global_batch=32, seq=128)]).wacc[0]] == "gemm"
    assert _held(zero=1) == 0.0
    # a PyTorch-native stack at ZeRO-1 (torchtitan's eager block) adds in autograd
    native = from_layouts([Layout(gpus=8, dp=8, global_batch=32, seq=128, native_eager=True)])
    assert WGRAD_ACCUMS[native.wacc[0]] == "add" and native.layout(0).wgrad_accum is None  # its stack's own
    assert _held(zero=1, native_eager=True, grad_dtype="bf16") == pytest.approx(3 * _stream_s(6.0 * 4e9))
    asked = from_layouts([Layout(gpus=8, dp=8, global_batch=32, seq=128, zero=1, wgrad_accum="add")])
    assert asked.layout(0).wgrad_accum == "add"


def test_piper_train_adds_into_its_fp32_grad_here_only_in_fp32():
    # in bf16 its weight casts hold the add (layer._weight_casts); in fp32, 4 + 4 read and 4 written
    assert _held(zero=1, fused_kernels=False, dtype="bf16") == 0.0
    assert _held(zero=1, fused_kernels=False, dtype="fp32") == pytest.approx(3 * _stream_s(12.0 * 4e9))


def test_a_shard_is_not_held_but_a_group_of_one_holds_it_all():
    # ZeRO-2's and ZeRO-3's per-micro-batch reductions add into 1/dp of the gradients, on FSDP2's reduce
    # stream: not priced
    assert _held(zero=2, wgrad_accum="add") == 0.0
    assert _held(zero=3, fsdp2=True, wgrad_accum="add") == 0.0
    # with no one to share them with, every ZeRO stage holds the whole gradients: they price alike
    whole = [_held(dp=1, zero=z, wgrad_accum="add", grad_dtype="bf16") for z in (0, 1, 2, 3)]
    assert whole[0] > 0 and whole == pytest.approx([whole[0]] * 4)
    # EP over the whole data-parallel group: each expert has one copy, its gradients held whole
    assert _held(dp=4, zero=2, wgrad_accum="add", grad_dtype="bf16") == pytest.approx(3 * _stream_s(6.0 * 3e9))


def test_the_search_takes_its_stacks_default_or_the_one_asked_for():
    m, hw = load_model("llama3-8b"), load_hardware("dgx-h100")
    # torch FSDP2's space adds in autograd at every ZeRO stage, Megatron-Core's fuses
    for fsdp2, own in ((True, "add"), (False, "gemm")):
        res = search(m, hw, SearchSpace(gpus=16, global_batch=64, seq=4096, zeros=(1, 3), fsdp2=fsdp2))
        assert (res.batch.wacc == WGRAD_ACCUMS.index(own)).all() and (res.batch.zero == 1).any()
    # Megatron-Core's space asked for autograd's separate add, in place of its fused default
    res = search(m, hw, SearchSpace(gpus=16, global_batch=64, seq=4096, zeros=(1, 3), wgrad_accum="add"))
    assert (res.batch.wacc == WGRAD_ACCUMS.index("add")).all()
    # the best layout re-priced alone reads what the search read
    alone = evaluate(m, hw, from_layouts([res.batch.layout(res.best)]))
    assert alone.tokens_per_s[0] == pytest.approx(res.est.tokens_per_s[res.best])
    with pytest.raises(LayoutError, match="wgrad_accum one of add, experts, gemm"):
        SearchSpace(gpus=8, global_batch=32, seq=128, wgrad_accum="fused")
