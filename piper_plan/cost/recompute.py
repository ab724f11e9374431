"""What recompute changes in a layer's costs: the backward's re-run forward, what stays saved,
the collectives, all-to-all and host issue run again (layer._layer_base prices a layer once
without recompute; these derive each layout's variant from it)."""
from __future__ import annotations

import numpy as np

from ..specs.model import ModelSpec
from .batch import LayoutBatch
from .compute import Phase


def full_recompute_share(m: ModelSpec, lay: LayoutBatch) -> np.ndarray:
    """Share of a rank's layers that full recompute re-runs: all of them, or with
    Layout.recompute_layers N the first N of each pipeline chunk (Megatron-Core --recompute-method
    block --recompute-num-layers N), of a chunk's mean L / (pp·vpp) layers, at most all."""
    chunk = (m.num_layers + m.mtp_layers) / (lay.pp * lay.vpp).astype(float)
    return np.where(lay.rc_layers > 0, np.minimum(lay.rc_layers / chunk, 1.0), 1.0)


def with_recompute(base: dict, recompute, share=1.0) -> dict:
    """layer._layer_base's costs under each layout's recompute, for a layer of a rank's mean:
    full re-runs the forward (r = f; only the layer input is saved) in `share` of the layers
    (full_recompute_share) and nothing in the rest, selective what its modules list (r as
    _layer_base priced it, with the collectives of the modules it re-runs: the attention's
    tensor-parallel one where the whole attention block re-runs, the all-to-all where the MoE block
    does), none nothing."""
    full, sel = recompute == 2, recompute == 1
    part = np.where(full, share, 0.0)  # the share of layers that re-run their whole forward
    out = dict(base)
    for k in ("dense", "moe"):
        ph = base[k]
        out[k] = Phase(ph.f, ph.b, ph.w, np.where(full, part * ph.f, np.where(sel, ph.r, 0.0)))
        kept = np.where(sel, base[f"a_{k}_sel"], base[f"a_{k}_none"])  # full's other layers keep all
        out[f"a_{k}"] = part * base["a_in"] + (1.0 - part) * kept
        # what a re-run layer rebuilds in the backward beside the input it kept (rank_memory._rebuilt)
        out[f"rc_{k}"] = np.maximum(base[f"a_{k}_none"] - base["a_in"], 0.0)
        # and beside what selective recompute kept (rank_memory._rebuilt: Megatron's modules, torchtitan's
        # per-op policy), but what a compiled block neither keeps nor rebuilds (activations.compiled_unsaved)
        unsaved = base["a_unsaved"] if k == "dense" else 0.0
        out[f"rc_{k}_sel"] = np.maximum(base[f"a_{k}_none"] - base[f"a_{k}_sel"] - unsaved, 0.0)
        # full recompute re-issues the forward: its host gap (in ph.f, so in r) again
        out[f"{k}_host"] = base[f"{k}_host"] + part * base[f"{k}_host_f"]
    # full recompute repeats the forward's collectives; selective those of the modules it re-runs
    # (layer._layer_base: <k>_r), the MoE block's all-to-all among them
    for k in ("dense_comm", "moe_comm"):
        ph = base[k]
        out[k] = Phase(ph.f, ph.b, ph.w, np.where(full, part * ph.f, np.where(sel, base[f"{k}_r"], 0.0)))
    # what of those the context-parallel ring exposes, a layer (either kind), reported apart
    out["cp_layer"] = base["cp_f"] + base["cp_b"] + np.where(full, part * base["cp_f"], np.where(sel, base["cp_r"], 0.0))
    return out
