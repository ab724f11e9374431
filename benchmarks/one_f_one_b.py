"""1F1B priced by walking its order against the closed form, both against torch's order run
action by action, on the balanced split's stages.

One command:  python benchmarks/one_f_one_b.py

The balanced split (stages.chunk_sizes, materialise) gives a stage a layer more than the others
where the layers do not divide evenly, and the ends hold the embedding and the LM head. Where the
busiest stage is not the last, the stages after it absorb part of the fill and the drain, and
1F1B's closed form Σ + (M - 1)·max (Narayanan 2021 §2.2) over-prices the step; the planner now
walks torch's Schedule1F1B order there (schedule.interleaved_step's vpp-1 case, the walk at
min(M, 3pp) micro-batches and the busiest stage's work for each further one; where the last
stage is the busiest the closed form is exact and stays). Printed per (model shape, pp, M): the
order run action by action (schedule_sim.simulate on rank_orders' 1f1b, messages free, each
stage's backward twice its forward), the closed form over it, and the planner's price over it.
Seconds are in layer-forwards; no clock is read, nothing is noisy.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from piper_plan.cost.schedule import interleaved_step
from piper_plan.cost.schedule_sim import rank_orders, simulate

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from v_chunks import stage_seconds  # noqa: E402

# (name, layers, embedding's and LM head's extra layers' worth), as benchmarks/v_chunks.py counts them
MODELS = (("DeepSeek-V3 + MTP", 61, 0.1, 2.7), ("Qwen3-235B", 94, 0.1, 1.5), ("Llama 3.1 405B", 126, 0.1, 1.0),
          ("GPT 1T", 128, 0.1, 0.3), ("Qwen3-30B", 48, 0.1, 1.0))
BACKWARD = 2.0  # a stage's backward over its forward


def row(L: int, x_first: float, x_last: float, pp: int, M: int) -> tuple[float, float, float]:
    """(the order run action by action, the closed form, the planner's price: the walk where the
    last stage is not the busiest, as estimate._pipeline chooses), in layer-forwards."""
    f = stage_seconds(L, pp, x_first, x_last, v_shape=False)
    b = BACKWARD * f
    ran = simulate(rank_orders("1f1b", pp, 1, M), f, b, 0.0)
    closed = float((f + b).sum() + (M - 1) * (f + b).max())
    if f[-1] >= f.max():
        return ran, closed, closed
    walked = float(interleaved_step(np.array([pp]), np.array([1]), np.array([M]), f[:, None], b[:, None])[0])
    return ran, closed, walked


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)  # no options: refuses any
    print(f"{'model':18} {'layers':>6} {'pp':>3} {'M':>4} {'busiest':>7} {'order':>8} {'closed/order':>12} "
          f"{'planner/order':>13}")
    worst = {"closed": 0.0, "planner": 0.0}
    for name, L, xf, xl in MODELS:
        for pp in (4, 8, 16, 32):
            for M in (pp, 2 * pp, 8 * pp):
                ran, closed, priced = row(L, xf, xl, pp, M)
                units = stage_seconds(L, pp, xf, xl, v_shape=False)
                busiest = "last" if units[-1] >= units.max() else f"{int(np.argmax(units))}"
                worst["closed"] = max(worst["closed"], closed / ran - 1)
                worst["planner"] = max(worst["planner"], abs(priced / ran - 1))
                print(f"{name:18} {L:6} {pp:3} {M:4} {busiest:>7} {ran:8.1f} {closed / ran:12.4f} {priced / ran:13.4f}")
    print(f"closed form: up to {worst['closed']:+.1%} over the order; the planner: within {worst['planner']:.2%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
