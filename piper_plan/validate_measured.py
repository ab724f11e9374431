"""A published figure against what its machine can do at all. A throughput above every peak its
hardware spec gives is a slip (TFLOP/s written in GFLOP/s, a thousands separator read as digits),
and so is one that makes a step last more than a day (no training run publishes such a step; a
figure of 1e308 s priced at -100 % and wrote Infinity into --json): refused in one line before it
is priced, as its error would enter the means."""
from __future__ import annotations

from .validate_rows import TableError

DAY_S = 86_400.0  # the longest step a published row can mean


def check_measured(path, row: dict, m, hw) -> None:
    """TableError where the row's value means more FLOP/s a GPU than `hw`'s highest peak (any
    dtype), or a step of more than a day where the row gives its batch and GPUs. tokens/s and step
    times are read as FLOP/s at the model's own count (causal attention, ModelSpec.flops_per_token):
    the least any run of the model executes a token."""
    metric, value = row["metric"], float(row["value"])
    peak = max(hw.accelerator.peak_tflops.values(), default=0.0)
    seq = int(row["seq"]) if row.get("seq") else m.seq_len  # (read_rows: ASCII digits or blank)
    fpt = m.flops_per_token(seq)
    if metric in ("hw_tflops_per_gpu", "model_tflops_per_gpu"):
        rate, what = value, f"{value:g} TFLOP/s a GPU"
    elif metric == "tokens_per_s_per_gpu":
        rate, what = value * fpt / 1e12, f"{value:g} tokens/s a GPU"
    elif metric == "iteration_time_s" and row.get("gbs") and row.get("gpus"):
        rate = int(row["gbs"]) * seq / value / int(row["gpus"]) * fpt / 1e12
        what = f"a {value:g} s step of {row['gbs']} sequences on {row['gpus']} GPUs"
    else:
        return
    if peak and rate > peak:
        at = "" if metric.endswith("tflops_per_gpu") else f" {rate:,.0f} TFLOP/s at {fpt / 1e9:,.1f} GFLOP a token,"
        raise TableError(path, row["id"], "value", f"{what} is{at} above {hw.name}'s highest peak ({peak:g} TFLOP/s); "
                         "expected a figure the machine can reach (a unit slip?)")
    step = (int(row["gbs"]) * seq / int(row["gpus"]) * fpt / 1e12 / rate if row.get("gbs") and row.get("gpus")
            else value if metric == "iteration_time_s" else 0.0)
    if step > DAY_S:
        raise TableError(path, row["id"], "value", f"{what} means a step of {step:,.3g} s, more than a day; "
                         "expected a figure a run publishes (a unit slip?)")
