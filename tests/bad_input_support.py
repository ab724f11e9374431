"""What the bad-input tests share (test_bad_input.py, test_bad_output.py): a CLI run in process,
the assertion that it gave one line of error, and the tiny-moe commands they break."""
from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from piper_plan.cli import main

REPO = Path(__file__).resolve().parents[1]
EST = ["estimate", "-m", "tiny-moe", "-H", "cpu-local", "-n", "4", "--global-batch", "8"]
SEARCH = ["search", "-m", "tiny-moe", "-H", "cpu-local", "-n", "4", "--global-batch", "8"]
SWEEP = ["sweep", "-m", "tiny-moe", "-H", "cpu-local", "--gpus", "4", "--global-batch", "8"]


def _run(args, cmd=main):
    r = CliRunner().invoke(cmd, args)
    out = r.output + (r.stderr if hasattr(r, "stderr") and r.stderr not in r.output else "")
    return r.exit_code, out, r


def one_line(args, *needles, cmd=main):
    """The command exits 2 with exactly one line, `error: ...`, holding every needle."""
    code, out, r = _run(args, cmd)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    lines = [x for x in out.strip().splitlines() if x.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:"), out
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def refused(args, *needles, cmd=main):
    """click refuses the option value (its usage error, exit 2) or the command gives one line."""
    code, out, r = _run(args, cmd)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert code == 2 and "Traceback" not in out, out
    for n in needles:
        assert n in out, out
