"""`piper-plan calibrate --check`: a spec's recorded probes run again and compared, so a plan's
misprediction can be traced to a different machine (e.g. a CPU without bf16 instructions)."""
from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from piper_plan.calibrate import calibrate_cmd
from piper_plan.calibrate_check import TOLERANCE, compare, record_for, sample_plan
from piper_plan.evaluate import build_plan, estimate_layout
from piper_plan.layout import Layout
from piper_plan.specs.registry import load_hardware, load_model
from piper_runtime.metrics import machine_hint


def _meas(bf16_s: float, fp32_s: float, stream_s: float = 1e-3) -> dict:
    return {"gemm": [{"dtype": "bf16", "m": 16, "n": 64, "k": 64, "groups": 1, "seconds": bf16_s},
                     {"dtype": "fp32", "m": 16, "n": 64, "k": 64, "groups": 1, "seconds": fp32_s}],
            "stream": [{"nbytes": 2**20, "seconds": stream_s}],
            "layers": [{"kind": "moe", "dtype": "bf16", "tokens": 64, "seconds": 0.01}]}


def test_the_same_times_match_and_a_slow_bf16_gemm_does_not():
    then = _meas(1e-4, 2e-4)
    same = compare(then, _meas(1.1e-4, 1.9e-4))
    assert same["ok"] and set(same["families"]) == {"gemm_bf16", "gemm_fp32", "stream", "layers_bf16"}
    slow = compare(then, _meas(1e-2, 2e-4))  # bf16 GEMM 100x slower, everything else equal
    assert not slow["ok"]
    assert abs(slow["families"]["gemm_bf16"] - 100) < 1e-6 and slow["families"]["gemm_fp32"] == 1.0


def test_a_family_just_inside_the_tolerance_still_matches():
    assert compare(_meas(1e-4, 1e-4), _meas(1e-4 * TOLERANCE * 0.99, 1e-4))["ok"]
    assert not compare(_meas(1e-4, 1e-4), _meas(1e-4 / (TOLERANCE * 1.01), 1e-4))["ok"]


def test_sample_takes_each_dtype_but_never_the_largest_gemm():
    _, rec = record_for("cpu-local")
    plan = sample_plan(rec)
    singles = [tuple(g) for g in rec["plan"]["gemm"] if g[4] == 1]
    for dt in ("bf16", "fp32"):
        mine = [g for g in plan.gemm if g[0] == dt]
        flops = sorted(g[1] * g[2] * g[3] for g in singles if g[0] == dt)
        assert len(mine) == 3 and all(g in singles for g in mine)
        assert max(g[1] * g[2] * g[3] for g in mine) < flops[-1]
    assert plan.stream and set(plan.stream) <= set(rec["plan"]["stream"])
    assert set(plan.layers) == {"fp32", "bf16"} and not plan.attention
    # each collective kind at a middle and the largest size; piper-train's 1F1B step once
    sizes = rec["plan"]["comm_sizes"]
    assert len(plan.comm_sizes) == 2 and max(sizes) in plan.comm_sizes and set(plan.comm_sizes) <= set(sizes)
    assert plan.comm_kinds == tuple(rec["plan"]["comm_kinds"]) and not plan.loaded_comm
    assert [s for s, _ in plan.pipelines] == ["1f1b"] and plan.pipeline_steps == rec["plan"]["pipeline_steps"]
    # the check times GEMMs as the record did: the training-layout probe, or a·b in a record
    # that predates it
    assert plan.gemm_probe == rec["plan"]["gemm_probe"] == "train"
    legacy = {**rec, "plan": {k: v for k, v in rec["plan"].items() if k != "gemm_probe"}}
    assert sample_plan(legacy).gemm_probe == "matmul"


def test_a_spec_without_a_record_is_a_one_line_error():
    r = CliRunner().invoke(calibrate_cmd, ["--check", "dgx-h100"])
    assert r.exit_code == 2
    assert "dgx-h100.calibration.json" in r.output and len(r.output.strip().splitlines()) == 1


def test_a_record_ten_thousand_times_slower_is_reported_as_another_machine(tmp_path, smoke_calibration):
    """End to end on 2 ranks: the smoke record with every time x10^4 cannot match this machine."""
    r, out = smoke_calibration
    assert r.exit_code == 0, r.output
    rec = json.loads(out.with_name(out.stem + ".calibration.json").read_text())
    for fam in ("gemm", "stream", "layers"):
        for p in rec["measurements"][fam]:
            p["seconds"] *= 1e4
    slow = tmp_path / "cpu-slow.yaml"
    shutil.copy(out, slow)
    (tmp_path / "cpu-slow.calibration.json").write_text(json.dumps(rec))
    r = CliRunner().invoke(calibrate_cmd, ["--check", str(slow), "--timeout", "60"])
    assert r.exit_code == 1, r.output
    assert "differs" in r.output and "gemm_fp32" in r.output and "layers_fp32" in r.output


def _plan(hw_name: str):
    spec, hw = load_model("tiny-moe"), load_hardware(hw_name)
    lay = Layout(gpus=2, dp=2, ep=2, global_batch=4, seq=64, fused_kernels=False, overlap_grad_reduce=False)
    return build_plan(spec, hw, lay, estimate_layout(spec, hw, lay))


def test_piper_train_points_at_the_check_only_when_the_prediction_is_off():
    plan = _plan("cpu-local")
    assert machine_hint(plan, 1.2) is None and machine_hint(plan, 0.8) is None
    assert "piper-plan calibrate --check cpu-local" in machine_hint(plan, 3.3)
    assert "piper-plan calibrate --check cpu-local" in machine_hint(plan, 0.3)
    # a data-sheet spec has no record to check against: the hint is to measure this machine
    assert "calibrate --quick" in machine_hint(_plan("dgx-h100"), 3.3)


def test_the_training_gemm_probe_runs_a_linear_layers_three_gemms():
    """forward x·Wᵀ with W stored as nn.Linear stores it, then both gradients; grouped: the
    runtime's grouped_mm over g x k x n expert weights and its backward."""
    import torch

    from piper_plan.calibrate_bench import _gemm_fn

    dx, dw = _gemm_fn(torch, torch.device("cpu"), "fp32", 8, 6, 4, 1, "train")()
    assert dx.shape == (8, 4) and dw.shape == (6, 4)
    try:  # (grouped_mm needs rows of 16-byte multiples: 8 fp32 columns)
        dx, dw = _gemm_fn(torch, torch.device("cpu"), "fp32", 32, 16, 8, 3, "train")()
    except (RuntimeError, NotImplementedError, AttributeError):
        pytest.skip("grouped_mm missing on this build (calibrate skips the point the same way)")
    assert dx.shape == (96, 8) and dw.shape == (3, 8, 16)


def test_collectives_and_the_runtime_step_are_families_of_their_own():
    then = {"comm": [{"kind": "alltoall", "n": 4, "nbytes": 2**20, "seconds": 0.004}],
            "pipelines": [{"schedule": "1f1b", "microbatches": 4, "vpp": 1, "seconds": 0.2}]}
    slow_network = {"comm": [{"kind": "alltoall", "n": 4, "nbytes": 2**20, "seconds": 0.008}],
                    "pipelines": [{"schedule": "1f1b", "microbatches": 4, "vpp": 1, "seconds": 0.21}]}
    r = compare(then, slow_network)
    assert r["families"] == {"comm_alltoall": pytest.approx(2.0), "pipeline_1f1b": pytest.approx(1.05)}
    assert not r["ok"]
