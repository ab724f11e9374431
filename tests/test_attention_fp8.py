"""Layout.attention_fp8: Transformer Engine's fp8_dot_product_attention runs the fused attention in
FP8, at the speed-up over bf16 that cuDNN's SDPA benchmark measures on each Blackwell part
(efficiency.attention_fp8); a spec without that measurement prices it as bf16."""
import numpy as np
import pytest

from piper_plan.cost.batch import from_layouts
from piper_plan.cost.compute import attention_phase
from piper_plan.layout import Layout
from piper_plan.specs import load_hardware, load_model

M = load_model("qwen3-30b-a3b")


def _core(hw_name):
    hw = load_hardware(hw_name)
    lays = [Layout(gpus=8, dp=8, ep=8, mbs=1, global_batch=64, seq=4096, fp8="mxfp8", attention_fp8=x,
                   recompute="selective") for x in (False, True)]
    # selective recompute prices r = the core attention's forward alone
    return hw, attention_phase(M, hw, from_layouts(lays), "mxfp8")


def test_the_attention_core_runs_at_the_measured_fp8_speed_up():
    hw, ph = _core("gb300-nvl72")
    sf, sb = hw.efficiency.attention_fp8
    core16, core8 = ph.r  # forward of the core attention, bf16 then FP8
    ovh = hw.efficiency.kernel_overhead_us * 1e-6
    assert (core16 - ovh) / (core8 - ovh) == pytest.approx(sf, rel=1e-6)
    # the projections and everything else in the block are untouched: the whole forward moves by
    # exactly the core's saving
    assert ph.f[0] - ph.f[1] == pytest.approx(core16 - core8)
    assert ph.b[0] > ph.b[1]


def test_a_spec_without_the_measurement_prices_fp8_attention_as_bf16():
    hw, ph = _core("dgx-h100")
    assert hw.efficiency.attention_fp8 is None
    np.testing.assert_array_equal(ph.f[0], ph.f[1])
    np.testing.assert_array_equal(ph.b[0], ph.b[1])
