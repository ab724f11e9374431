"""Torch's interleaved 1F1B order, and its 1F1B order (vpp 1), priced stage by stage, vectorised
over layouts.

A balanced split's virtual stages come in four kinds (stages.stage_kind: the first, the larger
middle ones, the smaller middle ones, the last), and a stage's seconds depend on its kind and its
rank's role alone (rank 0, the middle ranks, rank pp - 1): kind_phases gives each kind's compute
a micro-batch, interleaved_pipe shares each role's pipeline windows among its rank's stages and
walks the order with those twelve figures a layout (schedule.interleaved_step). estimate._pipeline
calls both; the closed form (schedule.pipeline_time) is exact only where every chunk takes as long
(1F1B: or where the last rank is the busiest).
"""
from __future__ import annotations

import numpy as np

from .schedule import interleaved_step
from .stages import kind_by_role, kind_counts, kind_role_rows


def kind_phases(nd, nm, v: dict, weight_apart: bool = False) -> tuple:
    """([4, n] forward, [4, n] backward: input, weight and recompute) compute seconds of one
    micro-batch through each kind of virtual stage's `nd` dense and `nm` MoE layers
    (estimate._kind_layers), the embedding on the first and the LM head on the last, from the
    per-layer phases `v` (lc's dense_v, moe_v, emb_v, head_v, [4, n] each, f b w r).
    `weight_apart`: (forward, backward-input with recompute, weight pass), as the V orders split them."""
    k = np.arange(4)[:, None]
    first, last = k == 0, k == 3
    # (forward, backward) of a dense layer, a MoE layer, the embedding and the LM head
    fb = [(x[0], x[1] + x[3], x[2]) if weight_apart else (x[0], x[1] + x[2] + x[3])
          for x in (v["dense_v"], v["moe_v"], v["emb_v"], v["head_v"])]
    return tuple(nd * d + nm * mo + first * e + last * h for d, mo, e, h in zip(*fb))


def interleaved_pipe(pp, vpp, M, n_hi, kind_f, kind_b, role_f, role_b, role_time) -> np.ndarray:
    """Seconds of the pipeline's part of a step under torch's interleaved order
    (schedule.interleaved_step), each rank at its steady state's pace: each virtual stage's forward
    and backward its rank's role's (rank 0, the middle ranks as the representative one, rank
    pp - 1; `role_f`, `role_b` [roles, n] the role's pipeline windows, scaled to its time a
    micro-batch `role_time`, its hidden messages off: estimate._pipeline adds the fill's and
    drain's back), shared among the rank's stages as their compute (`kind_f`, `kind_b` [4, n]:
    each kind of stage's, kind_phases; `n_hi` the larger middle stages, stages.stage_kind). A
    longer backward (recompute) so never shortens a stage's forward, and each stage keeps its own
    mix (the LM head's chunk recomputes nothing).
    A stage's seconds depend on its kind and its rank's role alone: the walk reads those twelve
    figures a layout, row kind·3 + role, through each (pp, vpp, n_hi)'s map of its stages."""
    # each role's rank's compute, forward and backward (its stages j·pp + rank): what its windows are shared by
    counts = [kind_counts(pp, vpp, n_hi, r) for r in (0, 1, pp - 1)]
    held = lambda x: np.stack([(c * x).sum(axis=0) for c in counts])  # noqa: E731
    scale = role_time / np.maximum(role_f + role_b, 1e-300)  # the hidden exchange, taken off both alike
    per_f = role_f * scale / np.maximum(held(kind_f), 1e-300)
    per_b = role_b * scale / np.maximum(held(kind_b), 1e-300)
    return interleaved_step(pp, vpp, M, kind_by_role(kind_f, per_f), kind_by_role(kind_b, per_b),
                            kind_role_rows(pp, vpp, n_hi, v_shape=False))
