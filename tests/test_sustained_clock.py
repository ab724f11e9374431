"""Tensor-core work in a training step runs at the rate a GPU holds under its power limit, not at
the short-burst rate its GEMM and attention plateaus were measured at (efficiency.sustained_matmul);
per-kernel timing tables, which time short runs, are still compared at the burst rate."""
import pytest

from piper_plan import validate_kernels
from piper_plan.cost.kernels import burst, flash_attention_bwd_time, flash_attention_time, gemm_time, stream_time
from piper_plan.specs import load_hardware

# (spec, sustained TFLOPS, burst TFLOPS) as each spec's comment cites them: the sustained figure is
# the part's (or its same-die, same-limit sibling's) MSMF or a 10,000-warmup cuBLASLt run, the burst
# the MAMF its plateau is set from
SOURCES = [
    ("dgx-a100-80gb", 256.5, 268.0),   # Azure ND A100 v4 FP16 16384^3 / ml-engineering MAMF
    ("dgx-h100", 755.0, 794.5),        # H200 MSMF (same GH100 die, 700 W) / H100 MAMF
    ("dgx-h200", 755.0, 794.5),
    ("dgx-h800", 755.0, 794.5),
    ("dgx-b200", 1439.0, 1745.0),      # B200 MSMF / MAMF
    ("dgx-b300", 1519.0, 1769.0),      # B300 MSMF / MAMF
    ("gb200-nvl72", 2906.9, 3615.6),   # Azure ND GB200 v6 FP8 16384^3 / GB200 FP8 MAMF
    ("gb300-nvl72", 3308.5, 3615.6),   # Azure ND GB300 v6 FP8 16384^3 / GB200 FP8 MAMF (the plateau GB300 borrows)
]


@pytest.mark.parametrize("name,sustained,burst_rate", SOURCES)
def test_each_gpu_spec_holds_the_sustained_share_its_sources_measure(name, sustained, burst_rate):
    assert load_hardware(name).efficiency.sustained_matmul == pytest.approx(sustained / burst_rate, abs=5e-4)


def test_specs_without_a_burst_benchmark_price_no_throttle():
    # Frontier's plateau is Piper's own training-shape figure; CPU specs are calibrated in place
    for name in ("frontier", "cpu-local"):
        assert load_hardware(name).efficiency.sustained_matmul == 1.0


def test_compute_bound_kernels_slow_by_the_sustained_share_and_streaming_ones_do_not():
    hw = load_hardware("dgx-b200")
    s = hw.efficiency.sustained_matmul
    fixed = hw.efficiency.kernel_overhead_us * 1e-6
    big = (8192, 8192, 8192)  # compute-bound: its FLOPs set the time
    assert gemm_time(hw, *big) - fixed == pytest.approx((gemm_time(burst(hw), *big) - fixed) / s, rel=1e-12)
    skinny = (16, 8192, 8192)  # memory-bound: HBM streaming does not follow the SM clock
    assert gemm_time(hw, *skinny) == pytest.approx(gemm_time(burst(hw), *skinny), rel=1e-12)
    assert stream_time(hw, 1e9) == stream_time(burst(hw), 1e9)
    flops = 1e12
    assert flash_attention_time(hw, flops) - fixed == pytest.approx((flash_attention_time(burst(hw), flops) - fixed) / s)
    assert (flash_attention_bwd_time(hw, flops, 1e6) - fixed == pytest.approx(
        (flash_attention_bwd_time(burst(hw), flops, 1e6) - fixed) / s))


def test_burst_leaves_an_unthrottled_spec_as_it_is():
    cpu = load_hardware("cpu-local")
    assert burst(cpu) is cpu
    b200 = load_hardware("dgx-b200")
    assert burst(b200).efficiency.sustained_matmul == 1.0 and b200.efficiency.sustained_matmul < 1.0


def test_kernel_tables_are_compared_at_the_burst_rate():
    # TE's B300 GEMM benchmark runs 10 warmup + 100 timed iterations a shape: a burst. Its BF16
    # layer rows price as before the sustained term (the plateau was set from them), within the
    # band the fit left
    checked = validate_kernels.te_gemm_check()
    rows = [r for r in checked if r["recipe"] == "bf16" and r["op"] == "layer"]
    assert rows and all(0.9 < r["ratio"] < 1.1 for r in rows)
    hw = load_hardware("dgx-b300")
    m, n, k = 15872, 12288, 4096  # qkv_proj fprop, compute-bound
    one = [r for r in checked if r["op"] == "qkv_proj" and r["pass"] == "fprop" and r["recipe"] == "bf16"][0]
    assert one["predicted_ms"] == pytest.approx(1e3 * float(gemm_time(burst(hw), m, n, k)), rel=1e-12)
    assert float(gemm_time(hw, m, n, k)) > 1.1 * float(gemm_time(burst(hw), m, n, k))
