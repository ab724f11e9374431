"""click parameter types shared by piper-plan and piper-train."""
from __future__ import annotations

import math

import click


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
