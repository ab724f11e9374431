"""efficiency.dglu_dbias_gemm: the fused grouped-MLP backward kernel (fc2's dgrad GEMM with a GLU's
backward and fc1's bias gradient in its epilogue) priced at a stated multiple of that GEMM, as the
cuDNN frontend release in NeMo 26.06.01 ran it (hardware/gb*-nvl72-nemo260601.yaml). Only gated,
biased experts launched as one grouped kernel run that kernel; everything else is untouched."""
import numpy as np
import pytest

from piper_plan.cost.batch import from_layouts
from piper_plan.cost.compute import gemm_dtype, moe_phase
from piper_plan.cost.kernels import gemm_time
from piper_plan.layout import Layout
from piper_plan.specs import load_hardware, load_model

FIXED, REGRESSED = load_hardware("gb300-nvl72"), load_hardware("gb300-nvl72-nemo260601")


def _lays(m, expert_gemm):
    return from_layouts([Layout(gpus=64, dp=64, ep=16, mbs=4, global_batch=1280, seq=4096, fp8="mxfp8",
                                expert_gemm=expert_gemm)])


def _moe(m, hw, lay):
    return moe_phase(m, hw, lay, "mxfp8", 1.0)


def test_the_regressed_kernel_adds_its_measured_multiple_of_fc2s_dgrad_to_the_backward_alone():
    m = load_model("gpt-oss-120b")
    assert m.moe.gated and m.moe.expert_bias
    lay = _lays(m, "grouped")
    fixed, slow = _moe(m, FIXED, lay), _moe(m, REGRESSED, lay)
    mo, t = m.moe, 4 * 4096.0
    rows = t * mo.top_k * lay.ep / mo.num_experts  # rows an expert, balanced (no padding on GB300)
    dgrad = gemm_time(FIXED, rows, mo.expert_ffn_size, m.hidden_size, groups=mo.num_experts / lay.ep,
                      dtype=gemm_dtype("mxfp8"), elt_bytes=lay.act_bytes, recipe="mxfp8")
    assert slow.b - fixed.b == pytest.approx((REGRESSED.efficiency.dglu_dbias_gemm - 1.0) * dgrad, rel=1e-9)
    for part in ("f", "w", "r"):
        np.testing.assert_array_equal(getattr(slow, part), getattr(fixed, part))


@pytest.mark.parametrize("model, expert_gemm", [("gpt-oss-120b", "multistream"),  # per-expert GEMMs: not that kernel
                                                ("qwen3-30b-a3b", "grouped")])    # no expert biases
def test_experts_that_do_not_run_the_fused_dglu_dbias_kernel_are_priced_as_on_the_fixed_release(model, expert_gemm):
    m = load_model(model)
    lay = _lays(m, expert_gemm)
    np.testing.assert_array_equal(_moe(m, REGRESSED, lay).v, _moe(m, FIXED, lay).v)


def test_the_variant_is_its_base_machine_but_for_that_kernel():
    a, b = FIXED.model_dump(), REGRESSED.model_dump()
    assert b["efficiency"].pop("dglu_dbias_gemm") > 1.0 and a["efficiency"].pop("dglu_dbias_gemm", 1.0) == 1.0
    for d in (a, b):
        d.pop("name"), d.pop("source"), d["efficiency"].pop("source")
    assert a == b
