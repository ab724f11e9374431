"""piper-plan calibrate: the fits recover known parameters from synthetic measurements, the
written YAML loads as a HardwareSpec, and a seconds-long run on 2 local ranks works end to end.
The full `--quick` run (about a minute on 2 cores) runs only with PIPER_SLOW=1."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bad_input_support import one_line
from piper_plan.calibrate import CPU_TILES, _rescale_topology, build_spec, calibrate_cmd, match_bundled, to_yaml
from piper_plan.calibrate_bench import make_plan
from piper_plan.calibrate_fit import (ComputeRates, best_rates, comm_time, fit_comm, fit_compute, rated_spec,
                                      split_comm, split_compute)
from piper_plan.cost.kernels import flash_attention_time, gemm_time, stream_time
from piper_plan.specs import load_hardware

TRUE = ComputeRates(gemm_tflops={"bf16": 0.05, "fp32": 0.02}, stream_gbps=5.0, overhead_us=20.0,
                    attention_tflops=0.008, tile=(64, 64))


def _synthetic(noise: float = 0.0, seed: int = 0) -> dict:
    """Measurements of the quick CPU plan's shapes, timed by the model with TRUE's rates."""
    hw = rated_spec(load_hardware("cpu-local"), TRUE)
    plan = make_plan("quick", "cpu")
    rng = np.random.default_rng(seed)
    jit = lambda: float(np.exp(noise * rng.standard_normal()))  # noqa: E731
    eb = {"fp32": 4, "bf16": 2}
    gemm = [{"dtype": dt, "m": m, "n": n, "k": k, "groups": g,
             "seconds": float(gemm_time(hw, m, n, k, groups=g, dtype=dt, elt_bytes=eb[dt])) * jit()}
            for dt, m, n, k, g in plan.gemm if g == 1]
    stream = [{"nbytes": 12 * e, "seconds": float(stream_time(hw, 12 * e)) * jit()} for e in plan.stream]
    attn = []
    for b, h, s, d in plan.attention:
        fl = 2.0 * b * h * s * s * d
        attn.append({"dtype": "bf16", "flops": fl, "seconds": float(flash_attention_time(hw, fl)) * jit()})
    return {"gemm": gemm, "stream": stream, "attention": attn}


def _synthetic_comm(lat_us=800.0, bw=0.5, noise=0.0, seed=1) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"kind": k, "n": n, "nbytes": b,
             "seconds": float(comm_time(k, n, b, lat_us, bw)) * float(np.exp(noise * rng.standard_normal()))}
            for k in ("p2p", "allreduce", "alltoall") for n in (2, 4, 8) for b in (1024, 65536, 2**20, 2**22)]


@pytest.mark.parametrize("noise,tol", [(0.0, 0.01), (0.03, 0.06)])
def test_fit_compute_recovers_known_rates(noise, tol):
    fit = fit_compute(load_hardware("cpu-local"), _synthetic(noise), CPU_TILES)
    r = fit.rates
    assert r.tile == TRUE.tile
    for dt in ("bf16", "fp32"):
        assert r.gemm_tflops[dt] == pytest.approx(TRUE.gemm_tflops[dt], rel=tol)
    assert r.stream_gbps == pytest.approx(TRUE.stream_gbps, rel=tol)
    assert r.attention_tflops == pytest.approx(TRUE.attention_tflops, rel=tol)
    assert r.overhead_us == pytest.approx(TRUE.overhead_us, rel=3 * tol)
    if noise == 0.0:
        assert all(v["max_abs_pct"] < 1.0 for v in fit.residuals.values())


def test_fit_comm_recovers_alpha_beta():
    f = fit_comm(_synthetic_comm())
    assert f.latency_us == pytest.approx(800.0, rel=1e-3)
    assert f.bandwidth_gbps == pytest.approx(0.5, rel=1e-3)
    assert set(f.residuals) == {"comm_p2p", "comm_allreduce", "comm_alltoall"}
    noisy = fit_comm(_synthetic_comm(noise=0.05))
    assert noisy.latency_us == pytest.approx(800.0, rel=0.1)
    assert noisy.bandwidth_gbps == pytest.approx(0.5, rel=0.1)


def test_comm_model_counts_steps():
    # ring all-reduce: 2(n-1) messages of B/n; all-to-all: n-1 of B/n; p2p: one of B
    assert comm_time("p2p", 4, 4e9, 0.0, 1.0) == pytest.approx(4.0)
    assert comm_time("allreduce", 4, 4e9, 0.0, 1.0) == pytest.approx(6.0)
    assert comm_time("alltoall", 4, 4e9, 0.0, 1.0) == pytest.approx(3.0)
    assert comm_time("alltoall", 4, 0.0, 10.0, 1.0) == pytest.approx(30e-6)


def test_split_measured_mode_reproduces_rates_with_efficiencies_at_most_one():
    meas = _synthetic()
    best = best_rates(meas)
    s = split_compute(TRUE, best, None)
    for dt, p in TRUE.gemm_tflops.items():
        assert s["peak_tflops"][dt] * s["gemm"] == pytest.approx(p, rel=1e-5)
        assert s["peak_tflops"][dt] >= best["gemm_tflops"][dt] * (1 - 1e-6)
    assert 0 < s["gemm"] <= 1 and 0 < s["memory"] <= 1 and 0 < s["attention"] <= 1
    assert s["memory_bandwidth_gbps"] * s["memory"] == pytest.approx(TRUE.stream_gbps)
    assert s["peak_tflops"]["bf16"] * s["attention"] == pytest.approx(TRUE.attention_tflops, rel=1e-5)


def test_split_datasheet_mode_keeps_peaks():
    s = split_compute(TRUE, best_rates(_synthetic()), ({"bf16": 0.1, "fp32": 0.05, "fp8": 0.2}, 10.0))
    assert s["peak_tflops"]["bf16"] == 0.1 and s["peak_tflops"]["fp8"] == 0.2
    assert s["gemm"] == pytest.approx(0.5)
    assert s["memory"] == pytest.approx(0.5) and s["memory_bandwidth_gbps"] == 10.0


def test_written_yaml_loads_as_hardware_spec(tmp_path):
    base = load_hardware("cpu-local")
    meas = _synthetic(0.02)
    fit = fit_compute(base, meas, CPU_TILES)
    comp = split_compute(fit.rates, best_rates(meas), None)
    cm = _synthetic_comm(noise=0.02)
    cf = fit_comm(cm)
    dev = {"kind": "cpu", "name": "test cpu", "torch": "x", "cores": 2, "ram_gib": 24.0,
           "accelerator_name": "CPU rank (1/4)", "memory_gib": 5.0, "compute_units": 1}
    spec = build_spec(base, name="cpu-test", ranks=4, device=dev, comp=comp, comp_res=fit.residuals,
                      comm=split_comm(cf, cm), comm_res=cf.residuals, stamp="2026-01-01T00:00:00+00:00",
                      record="measurements in cpu-test.calibration.json", datasheet=False)
    path = tmp_path / "cpu-test.yaml"
    path.write_text(to_yaml(spec, ["header comment"]))
    hw = load_hardware(str(path))
    assert hw == spec
    assert hw.gpus_per_node == 4 and [lv.size for lv in hw.topology] == [4, 32]
    assert hw.efficiency.gemm_tile == (64, 64)
    assert hw.efficiency.kernel_overhead_us == pytest.approx(TRUE.overhead_us, rel=0.1)
    node = hw.topology[hw.node_level]
    assert node.bandwidth_gbps * hw.efficiency.comm == pytest.approx(0.5, rel=0.05)
    assert node.latency_us == pytest.approx(800.0, rel=0.05)
    assert "cpu-test.calibration.json" in hw.source and "2026-01-01" in hw.efficiency.source


def test_cuda_datasheet_spec_keeps_machine_shape():
    # the CUDA path on a device matched to a bundled data sheet (H100: 989 TFLOP/s bf16)
    base = load_hardware("dgx-h100")
    rates = ComputeRates({"bf16": 700.0}, 3000.0, 4.0, 450.0, (128, 256))
    best = {"gemm_tflops": {"bf16": 690.0}, "stream_gbps": 2900.0, "attention_tflops": 440.0}
    comp = split_compute(rates, best, (base.accelerator.peak_tflops, base.accelerator.memory_bandwidth_gbps))
    dev = {"kind": "cuda", "name": "NVIDIA H100 80GB HBM3", "torch": "x", "cores": 16, "ram_gib": 1000.0,
           "compute_units": 132}
    spec = build_spec(base, name="h100-cal", ranks=1, device=dev, comp=comp, comp_res={}, comm=None, comm_res=None,
                      stamp="t", record="r", datasheet=True)
    assert spec.accelerator.peak_tflops == base.accelerator.peak_tflops
    assert spec.gpus_per_node == base.gpus_per_node and spec.topology == base.topology
    assert spec.peak_flops("bf16") * spec.efficiency.gemm == pytest.approx(700e12, rel=1e-3)
    assert spec.efficiency.attention * spec.peak_flops("bf16") == pytest.approx(450e12, rel=1e-3)
    # the fitted rate is one rate at the probes' lengths, as the fit priced it: no block costs kept
    assert base.efficiency.attention_blocks is not None and spec.efficiency.attention_blocks is None


def test_a_calibrated_node_level_takes_the_fitted_fraction_not_its_bases_own():
    """dgx-b200's NVLink level carries its own ring and all-to-all fractions; a calibration that
    fits the node's collectives writes efficiency.comm, which the base's level values outranked."""
    base = load_hardware("dgx-b200")
    rates = ComputeRates({"bf16": 1700.0}, 7000.0, 4.0, 1100.0, (128, 256))
    comp = split_compute(rates, {"gemm_tflops": {"bf16": 1700.0}, "stream_gbps": 7000.0, "attention_tflops": 1100.0},
                         (base.accelerator.peak_tflops, base.accelerator.memory_bandwidth_gbps))
    dev = {"kind": "cuda", "name": "NVIDIA B200", "torch": "x", "cores": 16, "ram_gib": 1000.0, "compute_units": 148}
    spec = build_spec(base, name="b200-cal", ranks=8, device=dev, comp=comp, comp_res={},
                      comm=dict(comm=0.5, bandwidth_gbps=800.0, latency_us=4.0), comm_res={}, stamp="t", record="r",
                      datasheet=True)
    node = spec.topology[[lv.size for lv in spec.topology].index(spec.gpus_per_node)]
    assert (node.comm, node.a2a_comm, spec.efficiency.comm, node.bandwidth_gbps) == (None, None, 0.5, 800.0)


def test_a_calibrated_spec_names_the_collective_library_its_probes_ran_on():
    """calibrate measures with gloo on CPU and NCCL on GPUs (calibrate_bench), and piper-train runs
    the same there, so the spec it writes says which, whatever its base said: gloo's reduce moves
    twice a chain's bytes (cost/comm.py rooted)."""
    cpu = {"kind": "cpu", "name": "c", "torch": "x", "cores": 2, "ram_gib": 24.0, "accelerator_name": "CPU rank",
           "memory_gib": 5.0, "compute_units": 1}
    gpu = {"kind": "cuda", "name": "NVIDIA H100 80GB HBM3", "torch": "x", "cores": 16, "ram_gib": 1000.0,
           "compute_units": 132}
    rates = ComputeRates({"bf16": 700.0, "fp32": 50.0}, 3000.0, 4.0, 450.0, (128, 256))
    best = {"gemm_tflops": {"bf16": 690.0, "fp32": 50.0}, "stream_gbps": 2900.0, "attention_tflops": 440.0}
    for base_name, dev, want, sheet in (("cpu-local", cpu, "gloo", False), ("dgx-h100", gpu, "nccl", True)):
        base = load_hardware(base_name)
        base = base.model_copy(update={"collectives": "nccl" if want == "gloo" else "gloo"})  # the base says otherwise
        a = base.accelerator
        comp = split_compute(rates, best, (a.peak_tflops, a.memory_bandwidth_gbps) if sheet else None)
        spec = build_spec(base, name="c", ranks=1, device=dev, comp=comp, comp_res={}, comm=None, comm_res=None,
                          stamp="t", record="r", datasheet=sheet)
        assert spec.collectives == want


def test_rescale_topology_keeps_levels_valid():
    d = load_hardware("frontier").model_dump(mode="json")  # gcd-pair 2, node 8, switch 32, ...
    _rescale_topology(d, 4)
    sizes = [lv["size"] for lv in d["topology"]]
    assert sizes[:3] == [2, 4, 16] and d["gpus_per_node"] == 4


def test_rescale_topology_keeps_the_nodes_a_job_fills_of_each_domain():
    from piper_plan.specs.hardware import HardwareSpec
    from piper_plan.specs.registry import parse

    d = load_hardware("gb200-nvl72").model_dump(mode="json")  # trays of 4; a job fills 16 of a rack's 18
    _rescale_topology(d, 8)
    assert [(lv["size"], lv.get("job_block")) for lv in d["topology"]] == [(8, None), (144, 128), (36864, None)]
    assert parse(HardwareSpec, d, "rescaled").job_blocks == [8, 128, 36864]


def test_match_bundled_by_model_number():
    h100 = match_bundled("NVIDIA H100 80GB HBM3")
    assert h100 is not None and "H100" in load_hardware(h100).accelerator.name
    assert match_bundled("Some Unknown Accelerator") is None


def test_import_does_not_load_torch():
    code = "import sys, piper_plan.calibrate; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bad_base_is_one_line_error():
    r = CliRunner().invoke(calibrate_cmd, ["--base", "no-such-machine", "--smoke"])
    assert r.exit_code == 2
    assert "no-such-machine" in r.output and len(r.output.strip().splitlines()) == 1


def test_smoke_run_on_two_ranks_writes_loadable_yaml(smoke_calibration):
    r, out = smoke_calibration
    assert r.exit_code == 0, r.output
    hw = load_hardware(str(out))
    assert hw.name == "cpu-test" and hw.gpus_per_node == 2
    rec = json.loads(out.with_name("cpu-test.calibration.json").read_text())
    m = rec["measurements"]
    assert all(m[f] for f in ("gemm", "stream", "attention", "comm"))
    assert {c["n"] for c in m["comm"]} == {2}
    # every directly timed point took time; a loaded row's "seconds" is a difference (what a call
    # adds to a burst), which a shared machine's noise can push to or below 0 (CI saw it)
    assert all(p["seconds"] > 0 for f in m if f != "loaded_comm" for p in m[f])
    assert all(p["burst_s"] > 0 and math.isfinite(p["seconds"]) for p in m["loaded_comm"])
    assert rec["timestamp"] and rec["residuals"]["gemm_fp32"]["points"] == 3
    assert rec["plan"]["gemm_probe"] == "train"  # GEMMs timed in the layouts training runs them
    # piper-train ran the pipeline probe under every schedule; the multi-chunk ones got a cost
    assert [p["schedule"] for p in m["pipelines"]] == ["1f1b", "interleaved", "zbv", "dualpipev"]
    assert [p["vpp"] for p in m["pipelines"]] == [1, 2, 2, 2]
    assert set(hw.efficiency.pipeline_chunk_us) == {"interleaved", "zbv", "dualpipev"}
    # the eager optimizer's per-tensor host work: every part measured, each tensor costs time
    assert [p["part"] for p in m["optimizer"]] == ["adamw", "grad", "copy"]
    assert set(hw.efficiency.optimizer_tensor_us) == {"adamw", "grad", "copy"}
    assert all(v > 0 for v in hw.efficiency.optimizer_tensor_us.values())
    # arrival skew: one all-to-all over every rank after a 4× longer burst; the fit takes its base
    # (the short burst, ms) only from a long row that measured an added time, else prices no skew
    longs = [r for r in m["loaded_comm"] if r.get("skew")]
    assert len(longs) == 1
    short = next(r for r in m["loaded_comm"] if not r.get("skew") and r["kind"] == "alltoall" and r["n"] == 2)
    base = round(short["burst_s"] * 1e3, 3) if longs[0]["seconds"] > 0 else 0.0
    assert hw.efficiency.collective_skew_base_ms == base
    # a rank's fixed memory is measured (torch, gloo, piper_runtime), not the 2 GiB GPU default
    assert hw.memory_overhead_gib == round(rec["device"]["baseline_rss_gib"], 3)
    assert 0.1 < hw.memory_overhead_gib < 1.0


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("PIPER_SLOW") != "1", reason="about a minute on 2 cores: PIPER_SLOW=1")
def test_a_quick_run_writes_a_loadable_spec_and_its_record(tmp_path):
    # (its wall time is calibrate's own report, rec["wall_s"], not a unit test's claim)
    out = tmp_path / "cpu-local.yaml"
    r = CliRunner().invoke(calibrate_cmd, ["--quick", "-o", str(out)])
    assert r.exit_code == 0, r.output
    rec = json.loads((tmp_path / "cpu-local.calibration.json").read_text())
    assert rec["wall_s"] > 0
    assert load_hardware(str(out)).gpus_per_node == 8


def test_fit_recovers_per_dtype_gemm_overhead():
    # bf16 GEMMs paying a 60 us fixed cost per call that fp32 GEMMs do not (a CPU repacking bf16 operands)
    global TRUE
    saved = TRUE
    TRUE = ComputeRates(saved.gemm_tflops, saved.stream_gbps, saved.overhead_us, saved.attention_tflops, saved.tile,
                        {"bf16": 60.0, "fp32": 0.0})
    try:
        meas = _synthetic()
    finally:
        TRUE = saved
    r = fit_compute(load_hardware("cpu-local"), meas, CPU_TILES).rates
    assert r.gemm_overhead_us["bf16"] == pytest.approx(60.0, rel=0.05)
    assert r.gemm_overhead_us["fp32"] < 1.0
    assert r.overhead_us == pytest.approx(saved.overhead_us, rel=0.05)


def test_layer_overhead_does_not_depend_on_the_bases_own_overhead():
    """Re-calibrating from a calibrated base must not subtract the base's overhead again."""
    from piper_plan.calibrate_fit import fit_layer_overhead

    hw = load_hardware("cpu-local")
    rows = [{"kind": "dense", "dtype": "fp32", "tokens": 16, "seconds": 0.004},
            {"kind": "moe", "dtype": "fp32", "tokens": 16, "seconds": 0.008}]
    bare = hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"layer_overhead_us": {}})})
    loaded = hw.model_copy(update={"efficiency": hw.efficiency.model_copy(
        update={"layer_overhead_us": {"dense_fp32": 3000.0, "moe_fp32": 6000.0}})})
    a, _ = fit_layer_overhead(bare, rows)
    b, detail = fit_layer_overhead(loaded, rows)
    assert a == b
    # what remains is the measured time less the kernel model's price of the block, never negative
    for key, d in detail.items():
        assert d["kernel_model_us"] > 0
        assert a[key] == pytest.approx(max(0.0, d["measured_us"] - d["kernel_model_us"]), abs=0.02)


def test_grouped_gemm_pays_the_dtype_overhead_once_per_group():
    """A CPU's bf16 GEMM repacks each operand pair, so 8 groups cost 8 repacks, one launch;
    the grouped measurements of the 2026-11-30 calibration (tests/data: the bundled cpu-local
    until 2026-12-02) agree within 25% (they were 34-57% off with one repack per call)."""
    data = Path(__file__).parent / "data"
    hw = load_hardware(str(data / "cpu-local-20261130.yaml"))
    eff = hw.efficiency
    one = float(gemm_time(hw, 16, 64, 64, groups=1, dtype="bf16"))
    eight = float(gemm_time(hw, 16, 64, 64, groups=8, dtype="bf16"))
    flops8 = eight - eff.kernel_overhead_us * 1e-6 - 8 * eff.gemm_overhead_us["bf16"] * 1e-6
    flops1 = one - eff.kernel_overhead_us * 1e-6 - eff.gemm_overhead_us["bf16"] * 1e-6
    assert flops8 == pytest.approx(8 * flops1, rel=1e-6)
    cal = json.loads((data / "cpu-local-20261130.calibration.json").read_text())
    grouped = [g for g in cal["measurements"]["gemm"] if g["groups"] > 1]
    assert grouped
    for g in grouped:
        model = float(gemm_time(hw, g["m"], g["n"], g["k"], groups=g["groups"], dtype=g["dtype"],
                                elt_bytes=2 if g["dtype"] == "bf16" else 4))
        assert model == pytest.approx(g["seconds"], rel=0.25)


def test_eager_bf16_blocks_pay_their_weight_casts():
    """piper-train (eager, autocast over fp32 weights) moves 24 B per local weight per micro-batch
    that a fused runtime with bf16 weights does not: two 6 B casts at the measured cast rate and
    the 12 B gradient accumulation at the streaming rate; fp32 runs cast nothing."""
    from piper_plan.cost.batch import from_layouts
    from piper_plan.cost.estimate import Routing
    from piper_plan.cost.layer import _layer_costs
    from piper_plan.cost.memory import layer_params_per_rank
    from piper_plan.layout import Layout
    from piper_plan.specs import load_model

    hw, m = load_hardware("cpu-local"), load_model("tiny-moe")
    lays = from_layouts([Layout(gpus=2, dp=2, ep=2, global_batch=4, seq=64, dtype=dt, fused_kernels=fk)
                         for dt, fk in (("bf16", True), ("bf16", False), ("fp32", True), ("fp32", False))])
    moe = _layer_costs(m, hw, lays, Routing(), "bf16")["moe"].total
    _, rep, exp = layer_params_per_rank(m, lays)
    p = rep[1] + exp[1]
    cast = float(2 * stream_time(hw, 6.0 * p, 0) / hw.efficiency.cast + stream_time(hw, 12.0 * p, 0))
    assert moe[1] - moe[0] == pytest.approx(cast, rel=1e-9)
    assert moe[3] == pytest.approx(moe[2], rel=1e-12)


def test_attention_backward_fit_recovers_its_rate_and_per_row_cost():
    """Backward times made by flash_attention_bwd_time with a known efficiency and per-row
    cost (3% noise) come back from fit_attention_bwd within 10%."""
    from piper_plan.calibrate_fit import fit_attention_bwd
    from piper_plan.cost.kernels import flash_attention_bwd_time

    hw = load_hardware("cpu-local")
    eff = hw.efficiency.model_copy(update={"attention_bwd": 0.3, "attention_bwd_row_us": 2.5})
    hw = hw.model_copy(update={"efficiency": eff})
    rng = np.random.default_rng(3)
    rows = []
    for b, h, s, d in make_plan("full", "cpu").attention:
        fl = 2.0 * b * h * s * s * d
        t = float(flash_attention_bwd_time(hw, fl, b * h * s)) * float(np.exp(0.03 * rng.standard_normal()))
        rows.append({"flops": fl, "rows": b * h * s, "seconds": 1.0, "seconds_bwd": t})
    got, res = fit_attention_bwd(hw.accelerator.peak_tflops["bf16"], eff.kernel_overhead_us, rows)
    assert got["attention_bwd"] == pytest.approx(0.3, rel=0.1)
    assert got["attention_bwd_row_us"] == pytest.approx(2.5, rel=0.1)
    assert res["attention_bwd"]["median_abs_pct"] < 5


def test_attention_backward_defaults_to_flash_attention_2_flops_at_the_forward_rate():
    """Without a measured backward (frontier's spec), the backward is 2.5x the forward's FLOPs
    at the forward's efficiency: one kernel launch, no per-row cost. With one (H100: cuDNN's
    422 TFLOPS backward at seq 4096), the same FLOPs at that rate."""
    from piper_plan.cost.kernels import flash_attention_bwd_time

    hw = load_hardware("frontier")
    assert hw.efficiency.attention_bwd is None and hw.efficiency.attention_bwd_row_us == 0
    fl = 3e12
    launch = hw.efficiency.kernel_overhead_us * 1e-6
    bwd = float(flash_attention_bwd_time(hw, fl, 10**6))
    assert bwd - launch == pytest.approx(2.5 * (float(flash_attention_time(hw, fl)) - launch), rel=1e-12)
    h100 = load_hardware("dgx-h100")
    bwd = float(flash_attention_bwd_time(h100, fl, 10**6)) - h100.efficiency.kernel_overhead_us * 1e-6
    # held under the power limit, as every tensor-core kernel of a step (efficiency.sustained_matmul)
    assert bwd == pytest.approx(2.5 * fl / (989e12 * 0.427 * h100.efficiency.sustained_matmul), rel=1e-12)


def test_eager_runtime_pays_for_flat_buffer_copies_and_clipping():
    """The step's optimizer term streams AdamW's state, clipping's 3 passes over each gradient
    the rank clips, and, for piper-train (eager), the flatten/unflatten copies of the gradient
    reduction (+ the ÷dp) and of the ZeRO gather: 24 + 16 B per replicated parameter, and
    torch's single-tensor AdamW: 80 B per owned parameter against a fused Adam's 30."""
    from piper_plan.evaluate import estimate_layout
    from piper_plan.layout import Layout
    from piper_plan.specs import load_model

    hw, m = load_hardware("cpu-local"), load_model("tiny-moe")
    # one streaming rate (no cache knee), so byte differences are time differences
    hw = hw.model_copy(update={"accelerator": hw.accelerator.model_copy(update={"cache_mib": None}),
                               "efficiency": hw.efficiency.model_copy(update={"optimizer_tensor_us": {}})})
    lays = [Layout(gpus=8, dp=8, ep=8, global_batch=16, seq=64, dtype="bf16", zero=1, fused_kernels=fk)
            for fk in (True, False)]
    opt = [estimate_layout(m, hw, lay).time["optimizer"][0] for lay in lays]
    # pp 1, dp 8, ep 8: the rank holds every non-expert parameter (replicated over dp: reduced,
    # gathered, 40 B) and an eighth of the experts (expert-dp 1: only divided by dp, 8 B)
    experts = m.moe_layer_expert_params * m.num_moe_layers
    rep, own = m.total_params - experts, experts / 8
    bw = hw.accelerator.memory_bandwidth_gbps * 1e9 * hw.efficiency.memory
    # (within 0.1%: the planner's per-rank count leaves out the final norm's 64 weights)
    local = rep / 8 + own  # ZeRO-1: a dp-eighth of the replicated state; experts have expert-dp 1
    adam = (80.0 - (2 * 12 + 4 + 2)) * local  # eager 8 passes vs fused (fp32 grad, bf16 weight)
    clip = 12.0 * (rep - rep / 8)  # the fused ZeRO-1 clips its shard, piper-train every gradient
    assert opt[1] - opt[0] == pytest.approx((40.0 * rep + 8.0 * own + adam + clip) / bw, rel=1e-3)


def test_eager_adamw_streams_from_cache_when_a_tensor_state_fits():
    """Single-tensor AdamW whose mean owned tensor's 24 B/param state fits the cache share:
    28 B a parameter from DRAM (first reads, write-backs), the other 52 of its 80 B at the
    cache rate. A bigger tensor, a fused layout or a spec without a cache knee: not priced
    this way (all bytes stream as one call)."""
    from piper_plan.cost.batch import from_layouts
    from piper_plan.cost.reduction import eager_adam_in_cache
    from piper_plan.layout import Layout

    hw = load_hardware("cpu-local")
    acc, eff = hw.accelerator, hw.efficiency
    lays = from_layouts([Layout(gpus=8, dp=8, global_batch=16, seq=64, dtype="bf16", fused_kernels=fk)
                         for fk in (False, False, True)])
    cache = acc.cache_mib * 2**20
    local = np.array([1e6, 1e6, 1e6])
    tensors = np.array([24e6 / cache * 1.01, 24e6 / cache * 0.99, 100.0])  # fits; just too big; fused
    t, fits = eager_adam_in_cache(hw, lays, local, tensors)
    bw = acc.memory_bandwidth_gbps * 1e9
    assert fits.tolist() == [True, False, False]
    assert t[0] == pytest.approx(1e6 * (28 / (bw * eff.memory_dram) + 52 / (bw * eff.memory)))
    assert t[1] == t[2] == 0.0
    flat = hw.model_copy(update={"accelerator": acc.model_copy(update={"cache_mib": None})})
    assert not eager_adam_in_cache(flat, lays, local, tensors)[1].any()


def test_eager_optimizer_pays_its_measured_cost_per_parameter_tensor():
    """Efficiency.optimizer_tensor_us, counted by hand for tiny-moe at pp 1, dp 8, ep 8,
    ZeRO-1: AdamW (+ norm) on the owned tensors (a dp-eighth of the replicated ones, every
    expert tensor: expert-dp 1), clip scale on every held gradient, and one copy per
    replicated tensor out of the reduction's buffer and again out of the ZeRO gather's.
    Fused layouts pay nothing."""
    from piper_plan.evaluate import estimate_layout
    from piper_plan.layout import Layout
    from piper_plan.specs import load_model

    hw, m = load_hardware("cpu-local"), load_model("tiny-moe")
    us = {"adamw": 100.0, "grad": 10.0, "copy": 1.0}
    hws = [hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"optimizer_tensor_us": u})})
           for u in ({}, us)]
    nt = m.param_tensors
    rep = (m.num_dense_layers * nt["dense_layer"] + m.num_moe_layers * nt["moe_replicated"]
           + nt["embedding"] + nt["head"] + nt["final_norm"])
    exp = m.num_moe_layers * nt["moe_experts"]
    for fused in (False, True):
        lay = Layout(gpus=8, dp=8, ep=8, global_batch=16, seq=64, dtype="bf16", zero=1, fused_kernels=fused)
        before, after = (estimate_layout(m, h, lay).time for h in hws)
        d_opt = after["optimizer"][0] - before["optimizer"][0]
        d_dp = after["dp_comm"][0] - before["dp_comm"][0]
        if fused:
            assert d_opt == 0 and d_dp == 0
            continue
        assert d_dp == pytest.approx(rep * 1e-6)
        assert d_opt == pytest.approx(((rep / 8 + exp) * 100 + (rep + exp) * 10 + rep * 1) * 1e-6)


def test_optimizer_tensor_fit_is_the_time_beyond_the_bytes_per_tensor():
    from piper_plan.calibrate_fit import OPT_PART_BYTES, fit_optimizer_tensor
    from piper_plan.cost.kernels import stream_time

    hw = load_hardware("cpu-local")
    rows = [{"part": p, "tensors": 64, "numel": 12544,
             "seconds": float(stream_time(hw, OPT_PART_BYTES[p] * 12544, 0)) + 64 * us * 1e-6}
            for p, us in (("adamw", 250.0), ("grad", 40.0), ("copy", 12.5))]
    got, detail = fit_optimizer_tensor(hw, rows)
    assert got == pytest.approx({"adamw": 250.0, "grad": 40.0, "copy": 12.5}, abs=0.01)
    assert set(detail) == {"adamw", "grad", "copy"}


def test_stream_fit_recovers_cache_size_and_dram_rate():
    """Stream times made by the two-rate model (cache rate 24 GB/s up to 10 MiB, 7 GB/s
    beyond, 5 us per call, 3% noise) come back from fit_stream_cache; a machine with one
    rate (no drop beyond any size) gets no cache."""
    from piper_plan.calibrate_fit import fit_stream_cache

    rng = np.random.default_rng(4)
    sizes = [12 * e for e in (1, 16, 256, 4096, 2**16, 2**18, 2**20, 2**22, 2**24)]

    def rows(bc, c, bd):
        return [{"nbytes": n, "seconds": (5e-6 + min(n, c) / bc + max(0, n - c) / bd)
                 * float(np.exp(0.03 * rng.standard_normal()))} for n in sizes]
    got, res = fit_stream_cache(rows(24e9, 10 * 2**20, 7e9), 5.0)
    assert got["cache_mib"] == pytest.approx(10, rel=0.15)
    assert got["dram_gbps"] == pytest.approx(7, rel=0.1)
    assert got["cache_gbps"] == pytest.approx(24, rel=0.1)
    assert res["stream_cache"]["median_abs_pct"] < 5
    assert fit_stream_cache(rows(20e9, 1e12, 20e9), 5.0) == ({}, {})


def test_one_slow_mid_size_stream_does_not_fit_a_cache_smaller_than_any_timed_stream():
    """Stream times a quick calibration measured on a shared 2-core host, its 786 KB point read
    4x slow (that point's own spread there was 1.8x): the fit had put the knee at its lower
    bound, 1.1e-5 MiB, which the spec then rounded to 0 and refused after the whole run. A
    knee can only be where a timed stream (one the fixed cost does not hide) shows it."""
    from piper_plan.calibrate_fit import fit_stream_cache

    sizes = (12, 768, 786432, 12582912, 50331648, 100663296)
    secs = (9.887e-06, 9.987e-06, 5.111e-05, 1.1884e-03, 1.2061e-02, 2.1004e-02)
    for slow in (1, 2, 3, 4, 8):
        rows = [{"nbytes": n, "seconds": t * (slow if n == 786432 else 1)} for n, t in zip(sizes, secs)]
        got, _ = fit_stream_cache(rows, 5.0)
        assert not got or got["cache_mib"] * 2**20 > 786432, (slow, got)
        if slow == 1:
            assert got["cache_mib"] == pytest.approx(9.5, rel=0.05)


def test_streams_beyond_the_cache_run_at_the_dram_rate():
    from piper_plan.cost.kernels import stream_time

    hw = load_hardware("cpu-local")
    acc = hw.accelerator.model_copy(update={"memory_bandwidth_gbps": 20.0, "cache_mib": 1.0})
    eff = hw.efficiency.model_copy(update={"memory": 1.0, "memory_dram": 0.25, "kernel_overhead_us": 0.0})
    hw = hw.model_copy(update={"accelerator": acc, "efficiency": eff})
    mib = 2.0**20
    assert float(stream_time(hw, 0.5 * mib)) == pytest.approx(0.5 * mib / 20e9)
    assert float(stream_time(hw, 3 * mib)) == pytest.approx(mib / 20e9 + 2 * mib / 5e9)
    assert load_hardware("dgx-h100").accelerator.cache_mib is None  # GPU specs: one HBM rate


def test_pipeline_chunk_cost_is_what_the_model_leaves_unexplained_per_extra_chunk():
    from piper_plan.calibrate_bench import pipeline_probes
    from piper_plan.calibrate_fit import fit_pipeline_chunk
    from piper_plan.cost.batch import from_layouts
    from piper_plan.cost.estimate import evaluate
    from piper_plan.plan import Plan

    hw = load_hardware("cpu-local").model_copy()
    hw = hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"pipeline_chunk_us": {}})})
    probes = pipeline_probes(hw, 8, ("1f1b", "interleaved", "zbv"))
    pred = {}
    for s, pj in probes:
        p = Plan.model_validate_json(pj)
        pred[s] = (float(evaluate(p.model, hw, from_layouts([p.layout])).step_time_s[0]), p.layout)
    # measured = predicted + 4 micro-batches x 1 extra chunk x (3 ms interleaved, 7 ms zbv) + 20 ms both
    extra = {"1f1b": 0.0, "interleaved": 4 * 3e-3, "zbv": 4 * 7e-3}
    rows = [{"schedule": s, "seconds": t + extra[s] + 0.02, "microbatches": lay.microbatches, "vpp": lay.vpp}
            for s, (t, lay) in pred.items()]
    us, detail = fit_pipeline_chunk(hw, probes, rows)
    assert us == pytest.approx({"interleaved": 3000.0, "zbv": 7000.0}, abs=0.01)
    assert set(detail) == {"interleaved", "zbv"}
    # a schedule measured faster than predicted costs nothing, not a negative time
    rows[1]["seconds"] = pred["interleaved"][0] - 0.05
    assert fit_pipeline_chunk(hw, probes, rows)[0]["interleaved"] == 0.0


def test_loaded_allreduce_pays_a_floor_per_ring_step():
    """Loaded calls made by the model (floor 500 us a call, and 700 us more per ring step of an
    all-reduce) come back from fit_collective_overhead, and ring_allreduce then charges the
    step cost 2(n-1) times."""
    from piper_plan.calibrate_fit import comm_time, fit_collective_overhead
    from piper_plan.cost.comm import ring_allreduce

    lat, bw = 740.0, 0.5
    rows = []
    for kind in ("p2p", "alltoall", "allreduce"):
        for n in (2, 4, 8):
            nb = 256 * n
            t = float(comm_time(kind, n, nb, lat, bw)) + 500e-6 + (2 * (n - 1) * 700e-6 if kind == "allreduce" else 0)
            rows.append({"kind": kind, "n": n, "nbytes": nb, "seconds": t})
    co, step, res = fit_collective_overhead(rows, lat, bw)
    assert co == pytest.approx(500.0, abs=1e-6) and step == pytest.approx(700.0, abs=1e-6)
    assert res["comm_loaded"]["max_abs_pct"] < 1e-6
    hw = load_hardware("cpu-local")
    e0 = hw.efficiency.model_copy(update={"collective_step_us": 0.0})
    e1 = hw.efficiency.model_copy(update={"collective_step_us": 700.0})
    t0 = ring_allreduce(hw.model_copy(update={"efficiency": e0}), 4096.0, 8, 1)
    t1 = ring_allreduce(hw.model_copy(update={"efficiency": e1}), 4096.0, 8, 1)
    assert float(t1 - t0) == pytest.approx(14 * 700e-6)
    # without steps measured (GPU specs) the loaded one-round calls alone give the floor
    assert fit_collective_overhead([r for r in rows if r["kind"] != "allreduce"], lat, bw)[:2] == \
        pytest.approx((500.0, 0.0), abs=1e-6)


def test_weight_casts_run_at_the_measured_cast_rate():
    """Cast pairs measured 2.5x slower than the stream model for their bytes give cast = 0.4,
    and the planner then prices autocast's weight casts (6 B forward, 6 B backward per
    parameter) 2.5x slower while the gradient accumulation (12 B) keeps the streaming rate."""
    from piper_plan.calibrate_fit import fit_cast
    from piper_plan.cost.batch import from_layouts
    from piper_plan.cost.layer import _weight_casts
    from piper_plan.cost.kernels import stream_time
    from piper_plan.layout import Layout

    hw = load_hardware("cpu-local")
    hw = hw.model_copy(update={"accelerator": hw.accelerator.model_copy(update={"cache_mib": None}),
                               "efficiency": hw.efficiency.model_copy(update={"cast": None})})
    rows = [{"nbytes": 12 * n, "seconds": 2.5 * float(stream_time(hw, 12 * n, 2))} for n in (2**16, 2**20, 2**22)]
    got, res = fit_cast(hw, rows)
    assert got["cast"] == pytest.approx(0.4) and res["cast"]["max_abs_pct"] < 1e-6
    lay = from_layouts([Layout(gpus=8, dp=8, global_batch=8, seq=64, dtype="bf16", fused_kernels=False)])
    p = np.array([1e6])
    plain = _weight_casts(hw, lay, p)
    slow = _weight_casts(hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update=got)}), lay, p)
    bw = hw.accelerator.memory_bandwidth_gbps * 1e9 * hw.efficiency.memory
    assert slow.f[0] == pytest.approx(2.5 * plain.f[0]) and plain.f[0] == pytest.approx(6e6 / bw)
    assert slow.b[0] - plain.b[0] == pytest.approx(1.5 * 6e6 / bw)


def test_collective_skew_fit_recovers_the_square_root_law():
    """All-to-alls after bursts of 1.5, 22 and 88 ms that add 3.5 ms + 0.47 ms·(√W − √1.5)
    give k = 470 us/√ms from the 1.5 ms base; the short rows stay the floor's."""
    from piper_plan.calibrate_fit import fit_collective_skew

    k, base = 0.47e-3, 1.5
    rows = [{"kind": "alltoall", "n": 8, "nbytes": 2048, "seconds": 3.5e-3, "burst_s": base * 1e-3},
            {"kind": "alltoall", "n": 4, "nbytes": 1024, "seconds": 2.0e-3, "burst_s": base * 1e-3}]
    rows += [{"kind": "alltoall", "n": 8, "nbytes": 2048, "skew": True, "burst_s": w * 1e-3,
              "seconds": 3.5e-3 + k * (np.sqrt(w) - np.sqrt(base))} for w in (22.0, 88.0)]
    got_k, got_base, stats = fit_collective_skew(rows)
    assert got_k == pytest.approx(470.0, rel=1e-6) and got_base == pytest.approx(base)
    assert fit_collective_skew(rows[:2])[:2] == (0.0, 0.0)  # no long bursts measured: no term
    # a long row whose call "added" negative time measured only noise: the others carry the fit
    noisy = rows + [{"kind": "alltoall", "n": 8, "nbytes": 2048, "skew": True, "burst_s": 0.134, "seconds": -0.016}]
    got_k, _, stats = fit_collective_skew(noisy)
    assert got_k == pytest.approx(470.0, rel=1e-6) and stats["comm_skew"] == {"median_abs_pct": 0.0, "max_abs_pct": 0.0, "points": 2}


def test_skew_adds_to_a_layouts_all_to_alls_only_with_expert_parallelism():
    """comm.skew is 0 up to the calibration burst, k·(√W − √base) beyond it; an EP layout's
    all-to-all time grows with it, an ep 1 layout's step does not change."""
    from piper_plan.cost import comm
    from piper_plan.evaluate import estimate_layout
    from piper_plan.layout import Layout
    from piper_plan.specs import load_model

    hw, m = load_hardware("cpu-local"), load_model("tiny-moe")
    eff = {"collective_skew_us": 500.0, "collective_skew_base_ms": 4.0}
    on = hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update=eff)})
    off = hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"collective_skew_us": 0.0})})
    assert float(comm.skew(on, 3e-3)) == 0.0
    assert float(comm.skew(on, 16e-3)) == pytest.approx(500e-6 * (4.0 - 2.0))
    ep = Layout(gpus=8, dp=8, ep=8, global_batch=16, seq=64, dtype="bf16", fused_kernels=False)
    dense = Layout(gpus=8, dp=8, ep=1, global_batch=16, seq=64, dtype="bf16", fused_kernels=False)
    a, b = estimate_layout(m, off, ep), estimate_layout(m, on, ep)
    assert b.time["a2a"][0] > a.time["a2a"][0] and b.step_time_s[0] > a.step_time_s[0]
    a, b = estimate_layout(m, off, dense), estimate_layout(m, on, dense)
    assert b.time["a2a"][0] == a.time["a2a"][0] == 0.0


def test_a_fitted_gemm_plateau_stays_under_the_accelerator_s_peak():
    """One H200's probes (tests/data/calibrate): its small GEMMs cost ~60 us a call, more than the
    model's overhead explains, and the unbounded fit lifted the plateau to 1,170 of 989 TFLOP/s."""
    import json
    from pathlib import Path

    from piper_plan.calibrate import GPU_TILES
    from piper_plan.calibrate_fit import best_rates, fit_compute
    from piper_plan.specs import load_hardware

    meas = json.loads((Path(__file__).parent / "data/calibrate/h200-2026-12-04.json").read_text())["measurements"]
    hw = load_hardware("dgx-h200")
    fit = fit_compute(hw, meas, GPU_TILES)
    best = best_rates(meas)
    assert best["gemm_tflops"]["bf16"] <= fit.rates.gemm_tflops["bf16"] <= hw.accelerator.peak_tflops["bf16"] * (1 + 1e-9)
    assert fit.rates.attention_tflops <= hw.accelerator.peak_tflops["bf16"]


def _built(ranks: int, cores: int = 2, meas=None):
    base = load_hardware("cpu-local")
    meas = meas or _synthetic(0.0)
    fit = fit_compute(base, meas, CPU_TILES)
    comp = split_compute(fit.rates, best_rates(meas), None)
    cm = _synthetic_comm()
    cf = fit_comm(cm)
    dev = {"kind": "cpu", "name": "test cpu", "torch": "x", "cores": cores, "ram_gib": 24.0,
           "accelerator_name": f"CPU rank (1/{ranks})", "memory_gib": 5.0, "compute_units": 1}
    return build_spec(base, name="cpu-test", ranks=ranks, device=dev, comp=comp, comp_res=fit.residuals,
                      comm=split_comm(cf, cm), comm_res=cf.residuals, stamp="2026-01-01T00:00:00+00:00",
                      record="r", datasheet=False), comp


def test_ranks_that_each_had_a_core_are_written_as_one_rank_a_core():
    # the base spec's 4 ranks a core had been kept, pricing a lone rank 2x faster than it ran
    assert _built(ranks=2, cores=2)[0].accelerator.ranks_per_core == 1.0
    assert _built(ranks=8, cores=2)[0].accelerator.ranks_per_core == 4.0


def test_a_stream_without_a_fitted_knee_keeps_no_cache_knee_of_the_base():
    # three sizes: too few to fit a knee; the base's 9.7 MiB knee must not sit beside this run's rate
    meas = _synthetic(0.0)
    meas["stream"] = meas["stream"][:3]
    spec, comp = _built(ranks=4, meas=meas)
    assert "cache_mib" not in comp
    assert spec.accelerator.cache_mib is None and spec.efficiency.memory_dram is None


def test_the_rated_spec_prices_bursts_at_one_rate():
    # probes time short bursts at one streaming rate: no power-limit throttle, no cache knee of the base
    h100 = load_hardware("dgx-h100")
    r = rated_spec(h100, ComputeRates(gemm_tflops={"bf16": 800.0}, stream_gbps=3000.0, overhead_us=3.0,
                                      attention_tflops=500.0, tile=(128, 128)))
    assert r.efficiency.sustained_matmul == 1.0 and r.accelerator.cache_mib is None


def test_a_check_against_a_malformed_record_is_one_line(tmp_path):
    from piper_plan.calibrate_check import record_for
    from piper_plan.errors import PiperError
    spec = tmp_path / "m.yaml"
    spec.write_text((Path(__file__).resolve().parents[1] / "hardware" / "cpu-local.yaml").read_text())
    for bad in ({"plan": [], "measurements": {}, "ranks": 2}, {"plan": {}, "measurements": {}, "ranks": "two"}):
        (tmp_path / "m.calibration.json").write_text(json.dumps(bad))
        with pytest.raises(PiperError, match="not a calibration record"):
            record_for(str(spec))


def test_a_spec_that_cannot_be_written_leaves_the_old_spec_beside_its_own_record(tmp_path, monkeypatch):
    from piper_plan import calibrate as cal
    from piper_plan.errors import SpecError
    rec, out = tmp_path / "m.calibration.json", tmp_path / "m.yaml"
    rec.write_text("old record")
    out.write_text("old spec")
    real = cal.atomic_write_text

    def full_disk(path, text, what="<file>"):
        if Path(path) == out:
            raise SpecError(str(path), what, "cannot write (No space left on device)")
        real(path, text, what)

    monkeypatch.setattr(cal, "atomic_write_text", full_disk)
    with pytest.raises(SpecError):
        cal.write_pair(rec, "new record", out, "new spec")
    assert (rec.read_text(), out.read_text()) == ("old record", "old spec")
    rec.unlink()
    with pytest.raises(SpecError):
        cal.write_pair(rec, "new record", out, "new spec")
    assert not rec.exists()


def test_a_spec_error_shows_a_numpy_number_as_a_number():
    """A calibrated figure the spec refuses is named as the number it is, not numpy's repr."""
    from pydantic import BaseModel, Field, ValidationError

    from piper_plan.errors import from_validation

    class Acc(BaseModel):
        cache_mib: float = Field(gt=0)

    with pytest.raises(ValidationError) as e:
        Acc(cache_mib=np.float64(0.0))
    said = str(from_validation("my-machine.yaml", e.value))
    assert said.endswith("cache_mib: Input should be greater than 0 (got 0.0)"), said


def test_a_fused_zero1_rank_clips_only_its_shard_where_piper_train_clips_all_it_holds():
    """Megatron-Core's distributed optimizer takes the norm of, and scales, only its shard's main
    gradients (get_main_grads_for_grad_norm), as a ZeRO-2 rank does; piper-train's ZeRO-1 clips
    every gradient it holds (optim.clip), 3 passes of 4 B over the rest."""
    from piper_plan.evaluate import estimate_layout
    from piper_plan.layout import Layout
    from piper_plan.specs import load_model

    hw, m = load_hardware("cpu-local"), load_model("tiny-moe")
    hw = hw.model_copy(update={"accelerator": hw.accelerator.model_copy(update={"cache_mib": None}),
                               "efficiency": hw.efficiency.model_copy(update={"optimizer_tensor_us": {}})})

    def opt(zero, fused):
        lay = Layout(gpus=8, dp=8, global_batch=16, seq=64, dtype="bf16", zero=zero, fused_kernels=fused)
        return estimate_layout(m, hw, lay).time["optimizer"][0]

    assert opt(1, True) == pytest.approx(opt(2, True), rel=1e-12)
    bw = hw.accelerator.memory_bandwidth_gbps * 1e9 * hw.efficiency.memory
    # (within 0.1%: the per-rank count leaves out the final norm's weights)
    assert opt(1, False) - opt(2, False) == pytest.approx(3 * 4.0 * m.total_params * 7 / 8 / bw, rel=1e-3)


def test_what_one_rank_or_an_odd_count_cannot_measure_is_kept_from_the_base_and_said(capsys):
    """One rank runs no collective and an odd count pairs no pipeline probe: an empty or zero
    field had priced those costs at nothing, with a source saying they were measured."""
    from piper_plan.calibrate import kept_from_base

    base = load_hardware("cpu-local")
    fresh = base.model_copy(update={"efficiency": base.efficiency.model_copy(update={
        "pipeline_chunk_us": {}, "collective_overhead_us": 0.0, "collective_skew_us": 0.0})})
    one = kept_from_base(fresh, base, 1, True)
    assert one.efficiency.pipeline_chunk_us == base.efficiency.pipeline_chunk_us != {}
    assert one.efficiency.collective_overhead_us == base.efficiency.collective_overhead_us > 0
    assert one.efficiency.source.endswith("--ranks 1 is not even): kept from the base spec 'cpu-local'")
    assert "collective_*: not measured (one rank runs no collective)" in one.efficiency.source
    assert "warning: calibrate: collective_*" in capsys.readouterr().err
    three = kept_from_base(fresh, base, 3, True)
    assert three.efficiency.pipeline_chunk_us == base.efficiency.pipeline_chunk_us
    assert three.efficiency.collective_overhead_us == 0.0  # measured, as fresh says
    assert kept_from_base(fresh, base, 2, False) is fresh  # all measured: nothing kept, nothing said


def test_calibrate_check_refuses_a_device_as_it_refuses_the_other_run_options():
    one_line(["--check", "cpu-local", "--device", "cuda"], "--device do not apply", cmd=calibrate_cmd)


def test_calibrate_does_not_write_over_the_base_spec_it_reads(tmp_path):
    pytest.importorskip("torch")
    base = tmp_path / "mine.yaml"
    base.write_text((Path(__file__).resolve().parents[1] / "hardware" / "cpu-local.yaml").read_text())
    before = base.read_bytes()
    one_line(["--smoke", "--ranks", "2", "--base", str(base), "-o", str(base)], "-o: is the --base this run reads",
             cmd=calibrate_cmd)
    assert base.read_bytes() == before
