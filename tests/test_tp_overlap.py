"""Layout.tp_comm_overlap: Megatron-Core's --tp-comm-overlap pipelines each tensor-parallel
all-gather and reduce-scatter with the GEMM beside it, so the collectives hide behind a layer's
linear layers and only what those cannot cover stays on the step."""
import numpy as np
import pytest

from piper_plan.cost.batch import from_layouts
from piper_plan.cost.estimate import evaluate
from piper_plan.layout import Layout
from piper_plan.specs import load_hardware
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
