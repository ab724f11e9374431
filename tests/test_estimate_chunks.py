"""efficiency.pipeline_chunk_us: a multi-chunk schedule pays its executor's measured cost per
extra chunk and micro-batch on every rank; single-chunk schedules pay nothing."""
import numpy as np
import pytest

from piper_plan.cost.batch import from_layouts
from piper_plan.cost.estimate import evaluate
from piper_plan.layout import Layout
from piper_plan.specs.registry import load_hardware, load_model


def _with(hw, chunk_us):
    return hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"pipeline_chunk_us": chunk_us})})


def test_interleaved_compute_grows_by_microbatches_times_extra_chunks_times_cost():
    m, hw = load_model("tiny-moe"), load_hardware("cpu-local")
    lays = [Layout(gpus=8, pp=2, dp=4, ep=1, vpp=v, mbs=1, global_batch=16, seq=64, schedule=s, dtype="bf16",
                   fused_kernels=False) for v, s in ((1, "1f1b"), (2, "interleaved"), (2, "zbv"))]
    batch = from_layouts(lays)
    before = evaluate(m, _with(hw, {}), batch)
    after = evaluate(m, _with(hw, {"interleaved": 2500.0}), batch)
    M = 4  # 16 sequences / dp 4 / mbs 1
    dc = after.time["compute"] - before.time["compute"]
    assert dc[0] == 0.0 and dc[2] == 0.0  # 1f1b has one chunk; zbv was not given a cost
    assert dc[1] == pytest.approx(M * 1 * 2500e-6)
    assert after.step_time_s[1] > before.step_time_s[1]
    np.testing.assert_array_equal(after.step_time_s[[0, 2]], before.step_time_s[[0, 2]])


def test_negative_chunk_cost_is_rejected():
    from pydantic import ValidationError

    hw = load_hardware("cpu-local")
    with pytest.raises(ValidationError):
        type(hw.efficiency).model_validate({**hw.efficiency.model_dump(), "pipeline_chunk_us": {"zbv": -1.0}})
