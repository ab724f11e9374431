"""ZB-V and DualPipeV walked stage by stage and priced on chunk halves, against torch's order run
action by action with each stage's own seconds.

One command:  python benchmarks/v_chunks.py

The planner walks a V schedule's order stage by stage (v_orders.v_step: torch's order at its
fewest micro-batches, then the busiest rank's work a micro-batch). Before session 79 it priced a
rank from its two chunks summed (schedule.zbv_bubble, dualpipev_bubble read a chunk as half of
them, every rank alike) and took the slowest rank. The balanced V split (stages.chunk_sizes with
v_shape) can leave rank 0 two unequal chunks where the LM head is heavy: its first chunk holds
the embedding, its last the head. This prints, per (schedule, layers, pp, M), torch's order run
action by action (schedule_sim.simulate, messages free, each stage's forward = backward-input =
weight pass = its layers' worth) against the walk and against that closed form, and the same
order with rank 0's two chunks evened (what the halves assume), so the residual's source shows.
Seconds are in layer-forwards; no clock is read, nothing is noisy. validation/README.md ("ZB-V
and DualPipeV at pp 16", session 77; session 79) quotes it.
"""
from __future__ import annotations

import argparse

import numpy as np

from piper_plan.cost.schedule import dualpipev_bubble, zbv_bubble
from piper_plan.cost.schedule_sim import rank_orders, simulate
from piper_plan.cost.stages import chunk_sizes, materialise
from piper_plan.cost.v_orders import v_step

# (layers, embedding's and LM head's extra layers' worth): near DeepSeek-V3 with one MTP module,
# near Qwen3-235B, and a short model with a light head
MODELS = ((61, 0.1, 2.7), (94, 0.1, 1.5), (36, 0.1, 1.0))


def stage_seconds(L: int, pp: int, x_first: float, x_last: float, v_shape: bool = True) -> np.ndarray:
    """Each of the 2pp V stages' layers' worth on the balanced split (`v_shape` False: the pp
    stages of a one-chunk pipeline, benchmarks/one_f_one_b.py's), the extras on the end chunks."""
    C = 2 * pp if v_shape else pp
    cs = chunk_sizes(L, np.array([C]), np.array([x_first]), np.array([x_last]), minimise=np.array([True]),
                     v_shape=np.array([v_shape]))
    s = np.array([len(c) for c in materialise(L, C, cs)], float)
    s[0] += x_first
    s[-1] += x_last
    return s


def closed_form(schedule: str, pp: int, M: int, s: np.ndarray) -> float:
    """The planner's price: each rank's two chunks summed, its bubble from their halves, the slowest rank."""
    bubble = zbv_bubble if schedule == "zbv" else dualpipev_bubble
    ranks = [s[r] + s[2 * pp - 1 - r] for r in range(pp)]
    return max(M * 3 * F + float(bubble(pp, F, F, F)) for F in ranks)


def walked(schedule: str, pp: int, M: int, s: np.ndarray) -> float:
    """The planner's price: torch's order walked stage by stage (v_orders.v_step), no pair hiding."""
    col = s[:, None]
    return float(v_step([3 if schedule == "zbv" else 4], [pp], [M], col, col, col, 0.0 * col)[0])


def row(schedule: str, L: int, x_first: float, x_last: float, pp: int, M: int) -> tuple:
    """(the order run action by action, the planner's walk, the closed form on chunk halves, the
    order with rank 0's two chunks evened), in layer-forwards."""
    s = stage_seconds(L, pp, x_first, x_last)
    even = s.copy()
    even[0] = even[-1] = (s[0] + s[-1]) / 2
    orders = rank_orders(schedule, pp, 2, M)
    return (simulate(orders, s, s, 0.0, wgt=s), walked(schedule, pp, M, s), closed_form(schedule, pp, M, s),
            simulate(orders, even, even, 0.0, wgt=even))


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)  # no options: refuses any
    print(f"{'schedule':9} {'layers':>6} {'pp':>3} {'M':>4} {'order':>8} {'walked/order':>12} {'closed':>8} "
          f"{'closed/order':>12} {'rank 0 evened':>13} {'closed/evened':>13}")
    for schedule in ("zbv", "dualpipev"):
        for L, xf, xl in MODELS:
            for pp in (4, 8, 16):
                for M in (2 * pp, 4 * pp, 8 * pp):
                    ran, walk, priced, evened = row(schedule, L, xf, xl, pp, M)
                    print(f"{schedule:9} {L:6} {pp:3} {M:4} {ran:8.1f} {walk / ran:12.4f} {priced:8.1f} "
                          f"{priced / ran:12.3f} {evened:13.1f} {priced / evened:13.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
