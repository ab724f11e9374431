"""`piper-plan validate --sensitivity`: the errors again with the hardware efficiencies scaled."""
import pytest

from piper_plan.specs import load_hardware
from piper_plan.validate import run
from piper_plan.validate_sensitivity import compute_scan, scaled, sensitivity


def test_scaling_makes_kernels_faster_and_caps_fractions_of_a_peak_at_one():
    hw = load_hardware("dgx-h100")
    fast = scaled(hw, ("gemm", "comm", "kernel_overhead_us", "host_op_us"), 1.25)
    assert fast.efficiency.gemm == pytest.approx(hw.efficiency.gemm * 1.25)
    assert fast.efficiency.gemm_dtype["fp8"] == pytest.approx(hw.efficiency.gemm_dtype["fp8"] * 1.25)
    assert fast.efficiency.comm == 1.0  # 0.8 x 1.25 is the whole link, and no more
    assert fast.efficiency.kernel_overhead_us == pytest.approx(hw.efficiency.kernel_overhead_us / 1.25)
    assert fast.efficiency.host_op_us == pytest.approx(hw.efficiency.host_op_us / 1.25)
    assert fast.efficiency.attention == hw.efficiency.attention  # families not named stay as measured
    assert hw.efficiency.gemm == 0.80  # the loaded spec is not touched


def test_the_comm_family_moves_a_levels_own_measured_efficiency_too():
    hw = load_hardware("gb200-nvl72")
    slow = scaled(hw, ("comm",), 0.8)
    assert [lv.comm for lv in slow.topology] == [pytest.approx(lv.comm * 0.8) if lv.comm else None
                                                 for lv in hw.topology]


def test_slower_gemms_lower_every_dense_throughput_prediction():
    base = {r.id: r.predicted for r in run("narayanan2021-table1")}
    slow = run("narayanan2021-table1", hw_edit=lambda hw: scaled(hw, ("gemm",), 0.8))
    assert all(r.predicted < base[r.id] for r in slow)


def test_the_report_starts_from_the_specs_as_published():
    rows = sensitivity(factors=(0.8, 1.25), families=("gemm",), group="korthikanti2022-table5")
    assert [(r["family"], r["factor"]) for r in rows] == [("none", 1.0), ("gemm", 0.8), ("gemm", 1.25)]
    # the measured GEMM plateau fits Korthikanti's runs better than a fifth either way (Narayanan's
    # Table 1, at its script's micro-batches, reads the model ~9 % fast: x0.8 fits it better,
    # validation/README.md says why nothing is set from that)
    assert rows[0]["dense"]["mape"] < min(rows[1]["dense"]["mape"], rows[2]["dense"]["mape"])
    scan = compute_scan(factors=(1.0,), group="korthikanti2022-table5")
    assert scan[0]["dense"] == rows[0]["dense"]  # scale 1 is the specs unchanged


def test_cli_prints_the_scaled_errors_as_json():
    import json

    from click.testing import CliRunner

    from piper_plan.cli import main

    res = CliRunner().invoke(main, ["validate", "--sensitivity", "--group", "narayanan2021-table1", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    families = {r["family"] for r in rows}
    assert {"none", "gemm", "attention", "memory", "comm", "kernel_overhead_us", "host_op_us",
            "gemm+attention+memory"} == families
    assert all(r["dense"]["rows"] == 10 for r in rows)
