"""click parameter types shared by piper-plan and piper-train, and piper-plan's one-line errors."""
from __future__ import annotations

import functools
import math
import os
import sys

import click

from .errors import PiperError


class FiniteFloat(click.FloatRange):
    """click.FloatRange that also refuses NaN and infinities (FloatRange lets NaN through: every
    comparison with it is False)."""

    name = "finite float"

    def convert(self, value, param, ctx):
        v = super().convert(value, param, ctx)
        if not math.isfinite(v):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return v


POSITIVE = click.IntRange(min=1)
# finite bounds where a typo's value would overflow the cost model's integer arithmetic
SEQUENCE = click.IntRange(1, 1 << 24)   # tokens (the model spec's own MAX_SEQ)
GPU_COUNT = click.IntRange(1, 1 << 24)
BATCH = click.IntRange(1, 1 << 30)      # sequences (a step or a micro-batch): the search lists the divisors


def one_line_errors(fn):
    """Bad input -> one line on stderr, exit 2, no traceback."""

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except PiperError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(e.exit_code)
        except MemoryError:  # numpy's too: a search space whose columns outgrow the host's memory
            click.echo("error: out of memory: the layouts asked for do not fit this host's memory; narrow the "
                       "space (--schedules, --etp, --cp, --a2a lists, a smaller --global-batch)", err=True)
            sys.exit(1)

    return wrapper


class OneLineUsage:
    """Mixin for a click command or group: click's own usage errors (a bad option value, an
    unknown option or command) as one line, `error: <command>: <what>`, exit 2, like every other
    bad input, instead of click's usage block, hint and message on three or four lines."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            # non-standalone, click returns the code of a ctx.exit() (--help, --version) instead of exiting
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as e:
            where = (e.ctx.command_path if e.ctx is not None else "") or prog_name or os.path.basename(sys.argv[0])
            # click lists a choice's values a line each: joined, so the error stays one line
            click.echo(f"error: {where}: {' '.join(e.format_message().split())}", err=True)
            sys.exit(e.exit_code)
        except click.ClickException as e:
            click.echo(f"error: {' '.join(e.format_message().split())}", err=True)
            sys.exit(e.exit_code)
        except click.exceptions.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


class OneLineCommand(OneLineUsage, click.Command):
    """A click command whose usage errors are one line (OneLineUsage)."""
