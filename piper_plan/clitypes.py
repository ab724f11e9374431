"""click parameter types shared by piper-plan and piper-train, and piper-plan's one-line errors."""
from __future__ import annotations

import functools
import math
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


def one_line_errors(fn):
    """Bad input -> one line on stderr, exit 2, no traceback."""

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except PiperError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(e.exit_code)

    return wrapper
