"""A wheel install carries what its commands read: the bundled specs, the calibration record beside
a calibrated spec, and the measured tables `piper-plan validate` prices."""
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "piper_plan", "runtime", "models", "hardware", "validation")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The project built as a wheel from a copy of its sources (the build's scratch stays out of
    the checkout)."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for name in SOURCES:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(p, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                    str(src)], check=True, capture_output=True, timeout=300)
    whl, = out.glob("*.whl")
    return whl


def test_the_wheel_holds_every_validation_table_the_track_record_and_calibration_record(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for table in [*(ROOT / "validation").glob("*.csv"), ROOT / "validation" / "track_record.json"]:
        assert f"piper_plan/bundled/validation/{table.name}" in names
    for rec in (ROOT / "hardware").glob("*.calibration.json"):
        assert f"piper_plan/bundled/hardware/{rec.name}" in names


def test_validate_runs_from_the_installed_wheel_outside_the_checkout(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(target)}  # the venv's dependencies, this wheel's piper_plan
    code = ("import piper_plan, sys; from piper_plan.cli import main; "
            "assert piper_plan.__file__.startswith(sys.argv[1]), piper_plan.__file__; "
            "main(['validate', '--group', 'narayanan2021-table1'])")
    out = subprocess.run([sys.executable, "-c", code, str(target)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "nar21-t1-1.7b" in out.stdout and "against the targets" in out.stdout
    code = ("from piper_plan.track_record import lines; "
            "assert lines('gpt-oss-120b', 'dgx-h100'), 'no track record in the wheel'")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
