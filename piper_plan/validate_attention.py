"""Kernel-level check of the fused attention pricing against cuDNN's published SDPA sweeps.

validation/attention_cudnn.csv: NVIDIA cudnn-frontend's training SDPA benchmark (cuDNN 9.19; its
results/*_919_only_cudnn files) on GB200, GB300 and H200: forward and backward TFLOPS of Llama
3.1's attention (64 query and 8 KV heads of 128, batch 1) at 2,048-32,768 tokens with no mask and
causal, and of GPT-OSS's heads in a window (64 / 8 heads of 64, batch 2, a 1,024-token window: the
benchmark's; GPT-OSS's own is 128) over the same lengths. The benchmark counts the FLOPs of the
pairs a query attends (4 per pair and head dimension forward, 2.5x that backward), as
ModelSpec.attended_keys does.

Each row is priced as the step model prices a layer's core attention (compute.core_attention):
the counted FLOPs at the spec's plateau (kernels.flash_attention_time, flash_attention_bwd_time,
with the head-dimension term), at the burst rate (kernels.burst: the benchmark times ten calls),
times the kernel's tiles per counted tile at the row's length and mask over the plateau's
(kernels.block_factor: the sweep runs faster with length and slower in narrow windows). The one
thing fitted here is each GPU's fixed cost a query block's pass (Efficiency.attention_blocks),
to its rows with no mask at 4k-16k tokens (fit_block_costs); its causal and windowed rows are out
of sample. FlashAttention-2's are fitted the same way to the FlashAttention-3 paper's H100 charts
(validation/attention_fa3_h100.csv, fit_chart_block_costs).
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from .cost.kernels import block_factor, burst, flash_attention_bwd_time, flash_attention_time, tile_cost
from .specs.registry import load_hardware
from .validate_kernels import TABLES, read_table

TABLE = "attention_cudnn.csv"
BWD_FLOPS = 2.5  # the benchmark's backward FLOPs per forward FLOP (flash_attention_bwd_time's too)


def _counted_flops(r: dict) -> float:
    """Forward FLOPs of a row as the benchmark counts them: 4 · batch · heads · head_dim per
    (query, key) pair attended."""
    s = float(r["seq"])
    if r["mask"] == "none":
        keys = s
    elif r["window"]:
        w = min(float(r["window"]), s)
        keys = w * (1.0 - w / (2.0 * s))
    else:
        keys = s / 2.0
    return 4.0 * float(r["batch"]) * float(r["heads"]) * float(r["head_dim"]) * s * keys


def price_row(r: dict, hw=None) -> tuple[float, float]:
    """(forward, backward) TFLOPS the step model gives one row of the table on its spec (or `hw`)."""
    hw = burst(hw or load_hardware(r["hardware_spec"]))
    s, d = float(r["seq"]), float(r["head_dim"])
    flops = _counted_flops(r)
    tiles_f, tiles_b = block_factor(hw, s, float(r["window"]) if r["window"] else None, causal=r["mask"] != "none")
    t_f = flash_attention_time(hw, flops * tiles_f, "bf16", d, d)
    t_b = flash_attention_bwd_time(hw, flops * tiles_b, float(r["batch"]) * float(r["heads"]) * s, "bf16", d, d)
    return float(flops / t_f / 1e12), float(BWD_FLOPS * flops / t_b / 1e12)


FIT_SEQ = (4096, 16384)  # the lengths the block costs are fitted over (2k runs short; GB300's 32k dips below its 16k)
FA3_CHARTS = "attention_fa3_h100.csv"  # the FlashAttention-3 paper's H100 charts: FA2 and mid-2024 cuDNN


def _fit_passes(seq, tflops, block: int = 128) -> float:
    """The fixed cost a query block's pass, in tiles, that makes unmasked rates at `seq` tokens
    follow tile_cost: rate = E / (1 + c / n) over n query blocks, E and c fitted in least squares
    of the relative errors."""
    from scipy.optimize import least_squares

    s, y = np.asarray(seq, dtype=float), np.asarray(tflops, dtype=float)
    fit = least_squares(lambda p: p[0] / tile_cost(p[1], s, causal=False, block=block) / y - 1.0, [y.max(), 1.0],
                        bounds=([0.0, 0.0], [np.inf, 1000.0]))
    return float(fit.x[1])


def fit_block_costs(hardware: str, path: Path | None = None, block: int = 128) -> tuple[float, float]:
    """(forward, backward) fixed cost a query block's pass of cuDNN 9.19's kernel on `hardware`,
    fitted to its unmasked rows at FIT_SEQ tokens (Efficiency.attention_blocks)."""
    rows = [r for r in read_table(path or TABLES / TABLE) if r["hardware_spec"] == hardware
            and r["mask"] == "none" and FIT_SEQ[0] <= int(r["seq"]) <= FIT_SEQ[1]]
    seq = [r["seq"] for r in rows]
    return (_fit_passes(seq, [r["forward_tflops"] for r in rows], block),
            _fit_passes(seq, [r["backward_tflops"] for r in rows], block))


def fit_chart_block_costs(kernel: str = "fa2", path: Path | None = None, block: int = 128) -> tuple[float, float]:
    """(forward, backward) fixed cost a query block's pass of `kernel` (fa2, or cudnn of mid-2024) on
    H100, fitted to the FlashAttention-3 paper's non-causal rows at FIT_SEQ tokens
    (validation/attention_fa3_h100.csv; AttentionPlateau.blocks for fa2)."""
    rows = [r for r in read_table(path or TABLES / FA3_CHARTS) if r["kernel"] == kernel and r["mask"] == "none"
            and FIT_SEQ[0] <= int(r["seq"]) <= FIT_SEQ[1]]
    out = []
    for ps in ("forward", "backward"):
        sel = [r for r in rows if r["pass"] == ps]
        out.append(_fit_passes([r["seq"] for r in sel], [r["tflops"] for r in sel], block))
    return out[0], out[1]


def kind(r: dict) -> str:
    """no mask / causal / window."""
    return "window" if r["window"] else ("no mask" if r["mask"] == "none" else "causal")


def attention_check(path: Path | None = None) -> list[dict]:
    """Per row: its spec, kind, seq, measured and predicted forward and backward TFLOPS with
    their errors (predicted / measured − 1, %), and the error of a layer's attention time
    (forward plus backward seconds; predicted / measured − 1, %: + the model is slower)."""
    out = []
    for r in read_table(path or TABLES / TABLE):
        pf, pb = price_row(r)
        mf, mb = float(r["forward_tflops"]), float(r["backward_tflops"])
        time_err = (1.0 / pf + BWD_FLOPS / pb) / (1.0 / mf + BWD_FLOPS / mb) - 1.0
        out.append({"hardware": r["hardware_spec"], "kind": kind(r), "seq": int(r["seq"]),
                    "forward": mf, "forward_predicted": pf, "forward_error_pct": 100.0 * (pf / mf - 1.0),
                    "backward": mb, "backward_predicted": pb, "backward_error_pct": 100.0 * (pb / mb - 1.0),
                    "time_error_pct": 100.0 * time_err})
    return out


def summary(rows: list[dict], min_seq: int = 4096) -> dict:
    """{"hardware / kind": {rows, forward_mape, backward_mape, time_error_pct_<seq>...}} over rows
    of at least `min_seq` tokens (training's lengths), in table order: mean |error| % of each
    pass, and the layer-time error at each length, which shows how well the block costs follow it."""
    groups = defaultdict(list)
    for r in rows:
        if r["seq"] >= min_seq:
            groups[f"{r['hardware']} / {r['kind']}"].append(r)
    mape = lambda v, ph: float(np.mean([abs(r[f"{ph}_error_pct"]) for r in v]))  # noqa: E731
    return {k: {"rows": len(v), "forward_mape": mape(v, "forward"), "backward_mape": mape(v, "backward"),
                "time_error_pct": {r["seq"]: r["time_error_pct"] for r in v}}
            for k, v in groups.items()}


def bundled() -> dict:
    """What validate --json holds of this check: the rows and their summary."""
    rows = attention_check()
    return {"rows": rows, "summary": summary(rows)}
