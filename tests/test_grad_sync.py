"""Layout.grad_sync step (fully_shard's set_requires_gradient_sync(is_last_microbatch)): ZeRO-3's
gradients accumulate unsharded through the step and are reduce-scattered once, in the last
micro-batch's backward, instead of in every micro-batch's; the rank holds its whole share of them."""
import numpy as np
import pytest
from bad_input_support import one_line

from piper_plan.cost.batch import from_layouts
from piper_plan.cost.estimate import evaluate
from piper_plan.cost.memory import zero3_gathered_bytes
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
        est = evaluate(m, hw, from_layouts(_layouts(M)))
        each, once = est.time["dp_comm"]
        saved[M] = each - once
    assert saved[1] == 0.0  # one micro-batch: nothing to defer
    one = saved[2]
    assert one > 0
    assert saved[4] == pytest.approx(3 * one) and saved[8] == pytest.approx(7 * one)


@pytest.mark.parametrize("reshard", [True, False])
def test_the_gathers_follow_the_units_lifetime_and_the_compute_is_unchanged(reshard):
    m, hw = load_model("llama3-8b"), load_hardware("dgx-h100")
    step = {M: evaluate(m, hw, from_layouts(_layouts(M, reshard_after_forward=reshard))) for M in (1, 2, 4)}
    dp = {M: e.time["dp_comm"][1] for M, e in step.items()}
    gather = dp[2] - dp[1]  # what one more micro-batch adds once the reduction waits for the step's end
    if reshard:  # freed after each forward and backward: every micro-batch gathers its units twice
        assert gather > 0 and dp[4] - dp[1] == pytest.approx(3 * gather)
    else:  # kept gathered to the backward, and from one micro-batch to the next: once a step
        assert dp[4] == pytest.approx(dp[1]) and dp[2] == pytest.approx(dp[1])
    assert all(e.time["compute"][0] == e.time["compute"][1] for e in step.values())
    # overlapped, the one reduce-scatter left hides behind the last backward as the others did
    est = evaluate(m, hw, from_layouts([x.model_copy(update={"overlap_grad_reduce": True}) for x in _layouts(4)]))
    assert 0 <= est.time["dp_comm"][1] <= est.time["dp_comm"][0]


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
