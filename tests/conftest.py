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


@pytest.fixture(scope="module")
def plan_doc(tmp_path_factory):
    """A plan.json `search --runtime piper-train` wrote for tiny-moe on 4 CPU ranks, as a dict:
    the bad-input tests break copies of it by hand."""
    import json

    from bad_input_support import SEARCH, _run

    p = tmp_path_factory.mktemp("plan") / "plan.json"
    code, out, _ = _run([*SEARCH, "--runtime", "piper-train", "-o", str(p)])
    assert code == 0, out
    return json.loads(p.read_text())
