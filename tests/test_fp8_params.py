"""FP8 weights (Layout.fp8_params; Megatron's fp8_param_gather): what Transformer Engine keeps per
GEMM weight under each FP8 recipe (cost/memory.fp8_weight_bytes), with and without a bf16 copy,
and what the ZeRO gather then moves (cost/reduction.weight_bytes, gathered_bytes)."""
import pytest
from click.testing import CliRunner

from piper_plan.cli import main
from piper_plan.cost.batch import from_layouts
from piper_plan.cost.estimate import evaluate
from piper_plan.cost.memory import GIB, layer_params_per_rank
from piper_plan.cost.reduction import gathered_bytes, weight_bytes
from piper_plan.errors import LayoutError
from piper_plan.layout import Layout, check_layout
from piper_plan.search import SearchSpace
from piper_plan.specs import load_hardware, load_model

GB200, H100 = load_hardware("gb200-nvl72"), load_hardware("dgx-h100")
LLAMA = load_model("llama3-8b")
BASE = dict(gpus=8, dp=8, mbs=1, global_batch=64, seq=4096, zero=1)


def _weights_gib(hw, **kw):
    est = evaluate(LLAMA, hw, from_layouts([Layout(**{**BASE, **kw})]))
    return float(est.memory["first"]["weights"][0])


def _gemm_weights():
    """The layers' parameters on the one stage: everything but the embedding and the LM head."""
    dense, _, _ = layer_params_per_rank(LLAMA, from_layouts([Layout(**BASE)]))
    return LLAMA.num_layers * float(dense[0])


@pytest.mark.parametrize("hw, fp8, fp8_copy", [
    (GB200, "current", 1.0),            # Blackwell's FP8 GEMMs take any layout: one copy
    (H100, "current", 2.0),             # Hopper's take TN only: the copy and its transpose
    (GB200, "mxfp8", 2.0 + 2.0 / 32),   # row- and column-wise copies, an E8M0 scale per 32
])
def test_fp8_weights_hold_the_recipe_s_copies_and_bf16_weights_hold_both(hw, fp8, fp8_copy):
    bf16 = _weights_gib(hw)
    cached = _weights_gib(hw, fp8=fp8)           # bf16 weights + TE's cached FP8 copy of each
    in_fp8 = _weights_gib(hw, fp8=fp8, fp8_params=True)  # the FP8 copy is the weight
    n = _gemm_weights()
    assert cached - bf16 == pytest.approx(n * fp8_copy / GIB)
    assert in_fp8 - bf16 == pytest.approx(n * (fp8_copy - 2.0) / GIB)


def test_fp8_weights_free_a_blackwell_rank_a_byte_a_parameter_against_the_bf16_stack():
    base = evaluate(LLAMA, GB200, from_layouts([Layout(**BASE, fp8="current")]))
    fp8w = evaluate(LLAMA, GB200, from_layouts([Layout(**BASE, fp8="current", fp8_params=True)]))
    assert float(base.peak_memory_gib[0] - fp8w.peak_memory_gib[0]) == pytest.approx(2.0 * _gemm_weights() / GIB)


def test_the_zero_gather_moves_the_fp8_bytes_for_tensor_scaling_and_bf16_for_mxfp8():
    lays = from_layouts([Layout(**BASE, fp8=f, fp8_params=p) for f, p in
                         (("current", True), ("blockwise", True), ("mxfp8", True), ("current", False))])
    assert weight_bytes(lays, lays.act_bytes.astype(float)).tolist() == [1.0, 1.0, 2.0, 2.0]
    # the gather runs after the backward here: half its bytes, less of the step
    slow = dict(BASE, overlap_grad_reduce=False, fp8="current")
    t = [float(evaluate(LLAMA, H100, from_layouts([Layout(**slow, fp8_params=p)])).time["dp_comm"][0])
         for p in (False, True)]
    assert t[1] < t[0]


def test_the_gather_moves_the_embedding_and_lm_head_in_bf16_beside_fp8_layer_weights():
    lays = from_layouts([Layout(**BASE, fp8="current", fp8_params=True), Layout(**BASE, fp8="current")])
    # 10 replicated parameters, 4 of them the tables: 6 FP8 weights at 1 B and 4 bf16 at 2 B
    assert gathered_bytes(lays, lays.act_bytes.astype(float), 10.0, 4.0).tolist() == [14.0, 20.0]


def test_fp8_weights_need_an_fp8_recipe_in_a_layout_a_search_and_the_cli():
    lay = Layout(**BASE, fp8_params=True)
    with pytest.raises(LayoutError, match="fp8_params with an fp8 recipe"):
        check_layout(lay, LLAMA.num_layers)
    with pytest.raises(LayoutError, match="fp8_params with an fp8 recipe"):
        SearchSpace(gpus=8, global_batch=64, seq=4096, fp8_params=True)
    r = CliRunner().invoke(main, ["estimate", "-m", "llama3-8b", "-H", "dgx-h100", "-n", "8", "--fp8-params"])
    assert r.exit_code != 0 and "fp8_params with an fp8 recipe" in r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output


def test_the_search_bound_drops_no_fp8_layout_that_fits():
    # the state bound drops layouts before pricing them; with FP8 weights it must still only drop
    # layouts that do not fit
    from piper_plan.search import STATE_BOUND, enumerate_layouts
    m = load_model("llama3-70b")
    for hw, fp8, fp8_params in ((H100, "current", False), (H100, "current", True), (GB200, "current", True),
                                (GB200, "mxfp8", False)):
        sp = SearchSpace(gpus=32, global_batch=64, seq=4096, fp8=fp8, fp8_params=fp8_params, zeros=(0, 1))
        every, _ = enumerate_layouts(m, hw, sp)
        kept, rejected = enumerate_layouts(m, hw, sp, headroom_gib=0.0)
        assert rejected.get(STATE_BOUND, 0) > 0  # the bound binds here
        fits = lambda b: int(evaluate(m, hw, b).fits.sum())  # noqa: E731
        assert fits(kept) == fits(every) > 0


def test_a_table_row_with_fp8_weights_needs_an_fp8_precision(tmp_path):
    from piper_plan.validate_rows import TableError, read_rows
    header = "id,group,model,hardware,gpus,seq,metric,value,precision,fp8_params\n"
    p = tmp_path / "t.csv"
    p.write_text(header + "r1,g,llama3-8b,dgx-h100,8,4096,tokens_per_s_per_gpu,1000,bf16,yes\n")
    with pytest.raises(TableError, match="fp8_params") as e:
        read_rows(p)
    assert "r1" in str(e.value) and "FP8 precision" in str(e.value)


def test_a_search_that_fits_only_with_fp8_weights_says_so_with_the_plan_s_throughput():
    # Qwen3-235B in FP8 on 22 GB200 (185 GiB each): bf16 weights beside their FP8 copies leave no
    # layout room
    from piper_plan.diagnose import diagnose
    from piper_plan.search import search
    m = load_model("qwen3-235b-a22b")
    sp = SearchSpace(gpus=22, global_batch=64, seq=4096, fp8="current")
    res = search(m, GB200, sp)
    assert res.best is None
    with_fp8 = search(m, GB200, SearchSpace(gpus=22, global_batch=64, seq=4096, fp8="current", fp8_params=True))
    assert with_fp8.best is not None
    said = [x for x in diagnose(m, GB200, sp, res) if "--fp8-params" in x]
    assert said == [f"fits with the weights kept in FP8 (--fp8-params, Megatron's --fp8-param-gather): best "
                    f"{with_fp8.est.tokens_per_s[with_fp8.best]:,.0f} tokens/s"]
    # already asked for, it is not suggested again (nothing fits 8 H100 either way)
    asked = SearchSpace(gpus=8, global_batch=64, seq=4096, fp8="current", fp8_params=True)
    lines = diagnose(m, H100, asked, search(m, H100, asked))
    assert lines and not any("--fp8-params" in x for x in lines)


def test_where_fp8_gemms_take_any_layout_the_current_scaling_cast_writes_no_transpose():
    # TE's quantizers write the transpose only where FP8 GEMMs take TN alone: on Blackwell the
    # cast of a GEMM's input moves 5 B an element (amax read 2, cast read 2, write 1), not 6
    from piper_plan.cost.compute import _linears
    tn_only = GB200.model_copy(update={"accelerator": GB200.accelerator.model_copy(update={"fp8_any_layout": False})})
    m, n, k = 8192.0, 4096.0, 8192.0
    fwd = [float(_linears(hw, "fp8", 2.0, (m, n, k))[0].f[0]) for hw in (GB200, tn_only)]
    rate = GB200.accelerator.memory_bandwidth_gbps * 1e9 * GB200.efficiency.quant_memory
    assert fwd[1] - fwd[0] == pytest.approx(m * k / rate)


def test_a_plan_says_how_it_keeps_its_weights(tmp_path):
    plan = tmp_path / "p.json"
    args = ["search", "-m", "qwen3-30b-a3b", "-H", "dgx-h100", "-n", "16", "--global-batch", "256", "--fp8", "current"]
    for extra, said in (([], "bf16, fp8 current GEMMs, bf16 weights with cached FP8 copies"),
                        (["--fp8-params"], "bf16, fp8 current GEMMs, FP8 weights")):
        assert CliRunner().invoke(main, args + extra + ["-o", str(plan)]).exit_code == 0
        shown = CliRunner().invoke(main, ["show", str(plan)], terminal_width=200)
        assert shown.exit_code == 0 and said in shown.output
