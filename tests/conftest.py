"""Fixtures more than one test file reads."""
from __future__ import annotations

import pytest
from click.testing import CliRunner


@pytest.fixture(scope="session")
def smoke_calibration(tmp_path_factory):
    """`piper-plan calibrate --smoke` on 2 ranks, run once for the session: (CLI result, YAML
    path); the record is the YAML's sibling <stem>.calibration.json. Readers must not write it."""
    from piper_plan.calibrate import calibrate_cmd

    out = tmp_path_factory.mktemp("smoke-calibration") / "cpu-test.yaml"
    r = CliRunner().invoke(calibrate_cmd, ["--smoke", "--ranks", "2", "-o", str(out), "--timeout", "60"])
    return r, out
