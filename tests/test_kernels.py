"""Kernel-time model: how expert GEMMs launch (one grouped kernel, streams, a loop) and what
FP8 quantisation adds to a linear layer."""
import numpy as np
import pytest

from piper_plan.cost.compute import _linears
from piper_plan.cost.kernels import burst, gemm_time, stream_time
from piper_plan.specs import load_hardware


@pytest.fixture(scope="module")
def h100():
    # the shape model at the rate the plateaus were measured at; the power-limit share on top is
    # test_sustained_clock's
    return burst(load_hardware("dgx-h100"))


def test_a_loop_of_expert_gemms_costs_each_gemm_in_turn(h100):
    # one kernel per expert, one at a time (X-MoE's Python loop): waves and launches do not
    # pool, so 8 GEMMs cost exactly 8 times one
    for m, n, k in ((1024, 5760, 2880), (96, 1536, 2048), (20000, 4096, 4096)):
        one = gemm_time(h100, m, n, k)
        assert gemm_time(h100, m, n, k, groups=8, streams=1) == pytest.approx(8 * one, rel=1e-12)


def test_concurrent_streams_share_waves_but_launch_per_batch(h100):
    # 1024 x 1024 outputs in 128 x 256 tiles: 32 tiles, so four GEMMs on four streams fill one
    # wave of 132 SMs together; 16 experts take 4 waves either way, and 4 launches instead of 1
    m = n = k = 1024
    grouped = gemm_time(h100, m, n, k, groups=16)
    streams = gemm_time(h100, m, n, k, groups=16, streams=4)
    assert streams - grouped == pytest.approx(3 * h100.efficiency.kernel_overhead_us * 1e-6, rel=1e-9)
    # one at a time each GEMM is a quarter-full wave: four times the grouped kernel's waves
    loop = gemm_time(h100, m, n, k, groups=16, streams=1)
    assert loop > 3.5 * grouped


def test_a_partial_last_batch_of_streams_runs_its_own_waves(h100):
    # 6 GEMMs on 4 streams: a batch of 4, then a batch of 2 (each of 40 tiles: 160 > 132 SMs
    # takes 2 waves for the four, 1 for the two)
    m, n, k = 1280, 1024, 1024  # 10 x 4 = 40 tiles each
    t = gemm_time(h100, m, n, k, groups=6, streams=4)
    g = 6 * m * n
    e_wave = g / ((2 + 1) * 132 * 128 * 256)
    flop = 2.0 * g * k / (h100.peak_flops("bf16") * h100.efficiency.gemm * e_wave)
    assert t == pytest.approx(flop + 2 * h100.efficiency.kernel_overhead_us * 1e-6, rel=1e-9)


def test_fp8_linears_pay_the_quantisation_passes(h100):
    # Transformer Engine current scaling: forward quantises the input (m x k_in), backward the
    # output gradient (m x n_out), 6 B per element each (amax read 2, cast read 2, write 1 + 1)
    m = np.array([4096.0, 16384.0])  # two layouts: the per-layout columns must stay apart
    n, k = 1536.0, 2048.0
    ph8, = _linears(h100, "fp8", 2.0, (m, n, k))
    f_gemm = gemm_time(h100, m, n, k, dtype="fp8")
    dgrad = gemm_time(h100, m, k, n, dtype="fp8")
    np.testing.assert_allclose(ph8.f - f_gemm, stream_time(h100, 6.0 * m * k, 2), rtol=1e-12)
    np.testing.assert_allclose(ph8.b - dgrad, stream_time(h100, 6.0 * m * n, 2), rtol=1e-12)
    # experts launched one by one quantise each expert's rows apart: two kernels an expert
    ex8, = _linears(h100, "fp8", 2.0, (m, n, k, 16, 4))
    np.testing.assert_allclose(ex8.f - gemm_time(h100, m, n, k, groups=16, dtype="fp8", streams=4),
                               stream_time(h100, 6.0 * m * k * 16, 32), rtol=1e-12)
    # bf16 layers pay none of it
    ph16, = _linears(h100, "bf16", 2.0, (m, n, k))
    np.testing.assert_allclose(ph16.f, gemm_time(h100, m, n, k), rtol=1e-12)


def test_fp8_gemms_run_at_their_own_measured_plateau(h100):
    # ml-engineering MAMF: H100 bf16 794.5 of 989 TFLOPS, fp8 1402.6 of 1979 (efficiency.gemm_dtype)
    m = n = k = 16384  # compute-bound, whole waves
    ratio = gemm_time(h100, m, n, k, dtype="bf16") / gemm_time(h100, m, n, k, dtype="fp8")
    fixed = h100.efficiency.kernel_overhead_us * 1e-6
    flop = 2.0 * m * n * k / (8192 / (63 * 132))  # 8192 tiles of 128 x 256 in 63 waves of 132 SMs
    assert ratio == pytest.approx((flop / (989e12 * 0.80) + fixed) / (flop / (1979e12 * 0.709) + fixed), rel=1e-9)
    assert 1.7 < ratio < 1.8  # not the 2x the peaks alone would promise


def test_gemm_dtype_outside_0_1_is_rejected(h100):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="gemm_dtype.fp8"):
        type(h100.efficiency).model_validate({**h100.efficiency.model_dump(), "gemm_dtype": {"fp8": 1.5}})


def test_mxfp8_quantises_in_one_pass_with_block_scales(h100):
    # MXFP8: one kernel reads 2 B and writes row- and column-wise fp8 copies plus a 1-byte scale
    # per 32 elements each: 4.0625 B an element (no separate amax pass)
    m, n, k = np.array([8192.0]), 4096.0, 4096.0
    mx, = _linears(h100, "mxfp8", 2.0, (m, n, k))
    np.testing.assert_allclose(mx.f - gemm_time(h100, m, n, k, dtype="fp8"),
                               stream_time(h100, 4.0625 * m * k, 1), rtol=1e-12)


def test_blockwise_fp8_quantises_in_one_pass_with_fp32_tile_scales(h100):
    # DeepSeek-V3's recipe (TE Float8BlockScaling): one kernel reads 2 B and writes row- and
    # column-wise fp8 copies plus a 4-byte scale per 128 elements each: 4.0625 B an element
    m, n, k = np.array([8192.0]), 4096.0, 4096.0
    blk, = _linears(h100, "fp8_blockwise", 2.0, (m, n, k))
    np.testing.assert_allclose(blk.f - gemm_time(h100, m, n, k, dtype="fp8"),
                               stream_time(h100, 4.0625 * m * k, 1), rtol=1e-12)


def test_one_fp8_recipe_per_evaluated_batch():
    from piper_plan.cost.batch import from_layouts
    from piper_plan.cost.estimate import evaluate
    from piper_plan.layout import Layout
    from piper_plan.specs import load_model

    m, hw = load_model("qwen3-30b-a3b"), load_hardware("dgx-h100")
    # the GPU's side only: at MBS 1 the host's issue time bounds both (cost/host.py), and the
    # recipe's quantisation kernels are more for it to issue
    gpu = hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"host_op_us": 0.0})})
    lays = [Layout(gpus=8, dp=8, ep=8, global_batch=64, seq=4096, fp8=f) for f in ("none", "current")]
    one = [float(evaluate(m, gpu, from_layouts([x])).step_time_s[0]) for x in lays]
    assert one[1] < one[0]  # fp8 GEMMs outrun their quantisation passes at this size
    issued = [float(evaluate(m, hw, from_layouts([x])).time["host"][0]) for x in lays]
    assert issued[1] > issued[0] > 0
    with pytest.raises(ValueError, match="one FP8 recipe"):
        evaluate(m, hw, from_layouts(lays))


def test_gemm_model_matches_measured_h100_gemms_that_last():
    # OpenXLA's measured H100 bf16 GEMM table (validation/gemm_h100_xla.csv): GEMMs of 20 us and
    # more (what a training step is made of) are priced within a few percent in sum; the
    # few-us ones are not (split-K and short K loops, which the roofline leaves out)
    from piper_plan.validate_kernels import gemm_check

    got = gemm_check()
    assert sum(d["shapes"] for d in got.values()) == 375
    long = got[">= 100 us"]
    assert 0.95 < long["median"] < 1.08 and 0.95 < long["sum_ratio"] < 1.08
    mid = got["20-100 us"]
    assert 0.9 < mid["median"] < 1.1 and 0.9 < mid["sum_ratio"] < 1.15


def test_gemm_model_prices_measured_b200_gemms_that_last_no_faster_than_they_ran():
    # OpenXLA's measured B200 table (validation/gemm_b200_xla.csv, bf16 and FP8, 375 shapes each),
    # not used to set the Blackwell plateaus: GEMMs of 20 us and more are priced within about 10 %
    # and on the slow side in sum, so the Blackwell MoE rows' lean to the fast side
    # (validation/README.md) is not the GEMM kernel model's
    from piper_plan.validate_kernels import b200_gemm_checks

    got = b200_gemm_checks()
    bf16, fp8 = got["bf16"], got["fp8"]
    assert sum(d["shapes"] for d in bf16.values()) == sum(d["shapes"] for d in fp8.values()) == 375
    assert 1.0 <= bf16[">= 100 us"]["median"] < 1.12 and 1.0 <= bf16[">= 100 us"]["sum_ratio"] < 1.12
    assert 0.9 < bf16["20-100 us"]["median"] < 1.1 and 1.0 <= bf16["20-100 us"]["sum_ratio"] < 1.15
    assert 0.95 < fp8["20-100 us"]["median"] < 1.12 and 1.0 <= fp8["20-100 us"]["sum_ratio"] < 1.12


def test_block_scaled_gemms_run_at_their_own_plateau_where_measured(h100):
    """Transformer Engine's B300 benchmark times MXFP8 GEMMs 5 % slower than per-tensor FP8 on the
    same shapes: a recipe with its own measured plateau uses it; a spec without one (H100 has no
    MXFP8) prices the recipe at its dtype's plateau."""
    b300 = load_hardware("dgx-b300")
    shape = (15872, 16384, 4096)
    mx = gemm_time(b300, *shape, dtype="fp8", recipe="mxfp8")
    per_tensor = gemm_time(b300, *shape, dtype="fp8")
    assert mx / per_tensor == pytest.approx(b300.efficiency.gemm_dtype["fp8"] / b300.efficiency.gemm_dtype["mxfp8"],
                                            rel=1e-3)
    assert gemm_time(h100, *shape, dtype="fp8", recipe="fp8_blockwise") == gemm_time(h100, *shape, dtype="fp8")


def test_blackwell_plateaus_reproduce_te_b300_gemm_benchmark():
    """validation/gemm_te_b300.csv: the B300 spec's plateaus come from the benchmark's kernel-only
    layer totals, so each pass (forward, dgrad, wgrad; BF16, FP8, MXFP8) lands within a few
    percent; single forward GEMMs spread wider (the wave model around one plateau)."""
    from piper_plan.validate_kernels import te_gemm_check

    rows = te_gemm_check()
    passes = [r for r in rows if r["op"] == "layer"]
    assert len(passes) == 12 and {r["recipe"] for r in passes} == {"bf16", "fp8", "mxfp8"}
    assert all(abs(r["ratio"] - 1) < 0.05 for r in passes)
    singles = [r for r in rows if r["op"] != "layer"]
    assert len(singles) == 4 and all(abs(r["ratio"] - 1) < 0.25 for r in singles)


def test_quantisation_streams_at_its_measured_bandwidth():
    """A quantisation kernel measured below the copy rate (efficiency.quant_memory) makes an FP8
    layer's quantisation passes slower by the bandwidth ratio and leaves a bf16 layer alone."""
    hw = load_hardware("dgx-b200")
    at_copy_rate = hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"quant_memory": None})})
    shape = tuple(np.array([x]) for x in (16384, 1536, 2048))
    slow, fast = (_linears(h, "mxfp8", 2.0, shape)[0] for h in (hw, at_copy_rate))
    assert slow.f[0] > fast.f[0] and slow.b[0] > fast.b[0] and slow.w[0] == fast.w[0]
    assert _linears(hw, "bf16", 2.0, shape)[0].f[0] == _linears(at_copy_rate, "bf16", 2.0, shape)[0].f[0]


def test_narrow_attention_heads_run_slower_per_flop(h100):
    """FlashAttention-3's paper measures cuDNN at 408 TFLOPS with head dim 64 against 609 at 128
    (H100, seq 4k): the spec's softmax share reproduces that ratio; wider heads than the plateau's
    are not credited, and a spec without a measured head dim has no term."""
    from piper_plan.cost.kernels import flash_attention_time, head_dim_slowdown

    assert head_dim_slowdown(h100, 64, 64) == pytest.approx(609 / 408, rel=0.01)
    assert head_dim_slowdown(h100, 192, 128) == 1.0  # MLA's wider heads: no speed-up claimed
    flops = 1e12
    assert flash_attention_time(h100, flops, "bf16", 64, 64) > flash_attention_time(h100, flops, "bf16", 128, 128)
    assert head_dim_slowdown(load_hardware("frontier"), 40, 40) == 1.0  # its figure spans head dims
