"""Kernel-level check of the cost model against published per-shape measurements.

validation/gemm_h100_xla.csv: bf16 GEMM throughput on H100 (sm_90) for the 375 shapes of
OpenXLA's default matmul table (tensorflow/tensorflow third_party/xla/xla/service/gpu/model/
matmul_interpolator_data.h @372d578: b in {1, 2, 4} batched GEMMs, m, n, k in 256..4096; the
table XLA's GPU cost model interpolates). `gemm_check` prices each shape with
kernels.gemm_time on the bundled dgx-h100 spec and reports predicted / measured time, by the
shape's measured time: what the step model sees of large GEMMs (tens of µs and more) and
where the roofline is known to miss (a few µs: split-K on few output tiles, short K loops).

validation/gemm_b200_xla.csv: the same 375 shapes measured on B200 (sm_100), bf16 and FP8
(e4m3 × e4m3 → bf16), from the table's later version (tensorflow/tensorflow third_party/xla/xla/
backends/gpu/cost_model/matmul_interpolator_data.h @a305421); `b200_gemm_checks()` prices them
on the bundled dgx-b200 spec, per dtype. The Blackwell plateaus were not set from it.

validation/gemm_te_b300.csv: Transformer Engine's own GEMM benchmark on B300 (its GEMM
profiling tutorial: the 12 GEMMs of a hidden-4096 / FFN-16384 layer at 15,872 tokens, BF16,
FP8 current scaling and MXFP8, with the dynamic quantisation (autocast) and without it
(pre-quantised)). The Blackwell specs' GEMM plateaus come from its kernel-only layer totals
(hardware/dgx-b300.yaml); `te_gemm_check` prices every row that times GEMM kernels alone (BF16,
and the pre-quantised FP8 rows) on dgx-b300, so the per-pass and per-shape spread is what the
wave and tile model adds around that fit.

validation/a2a_mcore_table7.csv: dispatch and combine latencies of Megatron-Core's NCCL
all-to-all dispatcher and of HybridEP on H100 and GB200 at EP 8-64 (the Megatron-Core MoE
report's Table 7: hidden 7168, sequence 4096, 256 experts). `a2a_check` prices one dispatch
with comm.a2a_flat / comm.a2a_dedup for DeepSeek-V3's routing (the bundled spec: top-8,
group-limited to 4 of 8 groups) and one sequence of 4096 bf16 tokens per rank; the report
states neither tokens per rank, top-k nor dtype, so those are the case study's (§4.2.2).

validation/a2a_rccl_mi250x_node.csv: RCCL's all-to-all on the 8 GCDs of one MI250X node (LUMI-G,
the node design Frontier has), called directly through OSU's osu_xccl_alltoall at 1 B-1 MiB to
each peer. `rccl_node_check` prices each size as one flat exchange on the bundled frontier spec
(comm.a2a_call): a check of its node level (one 50 GB/s xGMI link, the all-to-all bottleneck,
at efficiency.comm), which no training row isolates.

validation/moe_layer_piper_frontier.csv: Piper's "single MoE layer on one node (upper bound)"
TFLOPS per MI250X GCD for eight models (brief §5). `moe_layer_check` prices, for each model with a
bundled spec, the MoE block of one layer on one Frontier node (EP 8: router, permutation, expert
GEMMs, combine and the node's flat all-to-all, forward and backward, one 4096-token sequence a
GCD) and counts its model FLOPs (6 per routed, shared and router parameter per token); what the
benchmark included is not stated, and this reading is the one whose errors spread least across
the six (a whole layer with attention spreads about twice as wide). `implied_gemm` is the GEMM
plateau (efficiency.gemm) at which the six agree on average: a check of the spec's plateau, not
a setting of it. Those six are the table's fit=yes rows; Kimi K2 (fit=no), given a spec after
the plateau was set, is priced at the spec's plateau out of sample.

validation/layer_korthikanti_table4.csv: the forward and backward milliseconds of one transformer
layer of Korthikanti et al.'s 22B GPT (TP 8 on one DGX A100 node, micro-batch 4 of 2,048 tokens)
without recompute, with full and with selective recompute, each with and without sequence
parallelism (their Table 4). `layer_time_check` prices that layer as the step model does (its
compute and exposed tensor-parallel collectives per micro-batch, recompute in the backward),
with their runs' eager attention and dropout: a check of the A100 layer model, and of what
recompute costs, apart from any pipeline, data parallelism or batch.

The GEMM tables time kernels for fractions of a second (TE: 10 warmup + 100 timed iterations a
shape), before a GPU's clock settles at its power limit, so they are priced at the burst rate
(kernels.burst); training steps take efficiency.sustained_matmul on top.
"""
from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import get_args

import numpy as np

from .cost import comm
from .cost.batch import from_layouts
from .cost.compute import gemm_dtype, moe_phase
from .cost.kernels import burst, gemm_time
from .layout import AttentionKernel, Layout
from .specs.hardware import MAX_GPUS
from .specs.model import MAX_SEQ
from .specs.registry import load_hardware, load_model, validation_dir

TABLES = validation_dir()  # the measured tables this module reads
TIME_CLASSES_US = ((0.0, 20.0), (20.0, 100.0), (100.0, float("inf")))


def read_table(path: Path) -> list[dict]:
    """A csv table's rows as dicts, the file closed once read."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def gemm_check(path: Path | None = None, hardware: str = "dgx-h100", dtype: str = "bf16") -> dict:
    """Predicted / measured GEMM time per measured-time class: {label: {shapes, median,
    p10, p90, sum_ratio}} (sum_ratio: Σ predicted / Σ measured seconds). A table with a dtype
    column (gemm_b200_xla.csv) is read for `dtype` alone; one without holds bf16 only."""
    return _gemm_ratios(read_table(path or TABLES / "gemm_h100_xla.csv"), hardware, dtype)


def b200_gemm_checks(path: Path | None = None) -> dict:
    """gemm_check of gemm_b200_xla.csv on dgx-b200, per dtype it holds: {"bf16": .., "fp8": ..}
    (the table read once)."""
    rows = read_table(path or TABLES / "gemm_b200_xla.csv")
    return {dt: _gemm_ratios(rows, "dgx-b200", dt) for dt in ("bf16", "fp8")}


def _gemm_ratios(rows: list[dict], hardware: str, dtype: str) -> dict:
    rows = [r for r in rows if r.get("dtype", "bf16") == dtype]
    b, m, n, k, fps = (np.array([float(r[c]) for r in rows]) for c in ("b", "m", "n", "k", "flops_per_s"))
    flops = 2.0 * b * m * n * k
    measured = flops / fps
    predicted = gemm_time(burst(load_hardware(hardware)), m, n, k, groups=b, dtype=dtype)
    ratio = predicted / measured
    out = {}
    for lo, hi in TIME_CLASSES_US:
        sel = (measured >= lo * 1e-6) & (measured < hi * 1e-6)
        if sel.any():
            label = f"{lo:g}-{hi:g} us" if np.isfinite(hi) else f">= {lo:g} us"
            out[label] = {"shapes": int(sel.sum()), "median": float(np.median(ratio[sel])),
                          "p10": float(np.percentile(ratio[sel], 10)), "p90": float(np.percentile(ratio[sel], 90)),
                          "sum_ratio": float(predicted[sel].sum() / measured[sel].sum())}
    return out


def te_gemm_check(path: Path | None = None, hardware: str = "dgx-b300") -> list[dict]:
    """Predicted vs measured ms for the rows of gemm_te_b300.csv that time GEMM kernels alone:
    one forward GEMM (op named, TE's M x K x N) or a layer's forward, dgrad or wgrad sum over its
    four GEMMs (op 'layer'). Autocast FP8 rows also time the benchmark's quantisation of both
    operands of every GEMM, which training does not repeat: they are not priced."""
    hw = burst(load_hardware(hardware))
    rows = read_table(path or TABLES / "gemm_te_b300.csv")
    by_op = {r["op"]: (int(r["k"]), int(r["n"])) for r in rows if r["op"] != "layer"}
    out = []
    for r in rows:
        if r["recipe"] != "bf16" and r["mode"] != "prequant":
            continue
        m, recipe = int(r["m"]), r["recipe"]
        dtype = gemm_dtype(recipe)
        shapes = [by_op[r["op"]]] if r["op"] != "layer" else list(by_op.values())
        t = 0.0
        for k, n in shapes:
            dims = {"fprop": (m, n, k), "dgrad": (m, k, n), "wgrad": (k, n, m)}[r["passes"]]
            t += float(gemm_time(hw, *dims, dtype=dtype, recipe=recipe))
        out.append({"op": r["op"], "pass": r["passes"], "mode": r["mode"], "recipe": recipe,
                    "measured_ms": float(r["ms"]), "predicted_ms": 1e3 * t, "ratio": 1e3 * t / float(r["ms"])})
    return out


def a2a_check(path: Path | None = None, tokens: int = 4096, elt_bytes: float = 2.0) -> list[dict]:
    """One row per (hardware, backend, EP): measured dispatch / combine µs and the model's
    one-dispatch µs (combine moves the same bf16 bytes back). NCCL rows are priced as the flat
    exchange, HybridEP rows as the token-level one (Layout.a2a dedup)."""
    m = load_model("deepseek-v3")
    mo = m.moe
    nbytes = tokens * mo.top_k * m.hidden_size * elt_bytes
    rows = read_table(path or TABLES / "a2a_mcore_table7.csv")
    specs = {name: load_hardware(name) for name in {r["hardware_spec"] for r in rows}}
    out = []
    for r in rows:
        hw, ep = specs[r["hardware_spec"]], int(r["ep"])
        # each EP size ran on as many GPUs: its one group starts at rank 0 (world = ep)
        if r["backend"] == "nccl":
            t = comm.a2a_flat(hw, nbytes, ep, 1, ep)
        else:
            t = comm.a2a_dedup(hw, nbytes, ep, 1, mo.num_experts, mo.top_k, *mo.routing_groups, world=ep)
        nodes = ep / float(comm.level_counts(hw, ep, 1, ep)[hw.scaleup_level])  # scale-up domains the group spans
        out.append({"hardware": r["hardware_spec"], "backend": r["backend"], "ep": ep, "domains": nodes,
                    "dispatch_us": float(r["dispatch_us"]), "combine_us": float(r["combine_us"]),
                    "predicted_us": float(t) * 1e6})
    return out


def rccl_node_check(path: Path | None = None) -> list[dict]:
    """One row per message size: RCCL's measured all-to-all µs on one MI250X node (median of five
    runs, with their range) and the model's one call of the same bytes per peer."""
    rows = read_table(path or TABLES / "a2a_rccl_mi250x_node.csv")
    specs = {name: load_hardware(name) for name in {r["hardware_spec"] for r in rows}}
    out = []
    for r in rows:
        n, per = int(r["gcds"]), float(r["bytes_per_peer"])
        hw = specs[r["hardware_spec"]]
        t = comm.a2a_call(hw, per * n, n, 1, False, wire=comm.a2a_flat(hw, per * n, n, 1, n), world=n)
        out.append({"hardware": r["hardware_spec"], "gcds": n, "bytes_per_peer": per,
                    "measured_us": float(r["latency_us"]), "min_us": float(r["latency_min_us"]),
                    "max_us": float(r["latency_max_us"]), "predicted_us": float(t) * 1e6})
    return out


MOE_LAYER_TOKENS = 4096  # one sequence a GCD: the brief's sequence length on Frontier (§5)


def _moe_block_tflops(m, hw, tokens: int = MOE_LAYER_TOKENS, ep: int = 8) -> float:
    """Model TFLOPS of one MoE block (no attention) trained on `ep` GCDs of one node: forward,
    backward-input and backward-weight of router, experts and combine, plus two all-to-alls
    each way (flat: one node)."""
    lay = from_layouts([Layout(gpus=ep, ep=ep, dp=ep, mbs=1, global_batch=ep, seq=tokens)])
    ph = moe_phase(m, hw, lay, "bf16", np.ones(1))
    mo = m.moe
    a2a = 4.0 * float(comm.a2a_flat(hw, tokens * mo.top_k * m.hidden_size * 2.0, ep, 1, ep))
    seconds = float(ph.f[0] + ph.b[0] + ph.w[0]) + a2a
    flops = 6.0 * tokens * (m.router_params + mo.top_k * m.expert_params + m.shared_params)
    return flops / seconds / 1e12


def _moe_layer_rows(path: Path | None) -> list[tuple[dict, object, object]]:
    """(row, model spec or None, hardware spec) for each row of moe_layer_piper_frontier.csv,
    each spec read once."""
    rows = read_table(path or TABLES / "moe_layer_piper_frontier.csv")
    specs = {name: load_hardware(name) for name in {r["hardware_spec"] for r in rows}}
    return [(r, load_model(r["model_spec"]) if r["model_spec"] else None, specs[r["hardware_spec"]]) for r in rows]


def _in_fit(row: dict) -> bool:
    """Whether a moe_layer_piper_frontier.csv row is one the plateau was fit on (its fit column;
    a table without the column: every row)."""
    return row.get("fit", "yes") == "yes"


def _priced_layers(rows, gemm: float | None) -> list[dict]:
    out = []
    for r, m, hw in rows:
        if gemm is not None:
            hw = hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"gemm": gemm})})
        out.append({"model": r["model"], "hardware": r["hardware_spec"], "published": float(r["tflops_per_gcd"]),
                    "predicted": None if m is None else _moe_block_tflops(m, hw), "gemm": hw.efficiency.gemm,
                    "fit": _in_fit(r)})
    return out


def moe_layer_check(path: Path | None = None, gemm: float | None = None) -> list[dict]:
    """One row per model of moe_layer_piper_frontier.csv: published and predicted TFLOPS per
    GCD (None for a model without a bundled spec). gemm: price with this GEMM plateau instead of
    the spec's."""
    return _priced_layers(_moe_layer_rows(path), gemm)


def implied_gemm(path: Path | None = None) -> float:
    """The GEMM plateau at which moe_layer_check's predictions match the published rates in
    geometric mean over the rows the spec was fit to (the table's fit column; scipy's brentq
    between 0.3 and 0.95 of peak). Rows marked fit=no (a model given a spec after the fit)
    are priced at the spec's plateau as out-of-sample checks and move nothing here."""
    from scipy.optimize import brentq

    # read once, priced per trial
    rows = [row for row in _moe_layer_rows(path) if row[1] is not None and _in_fit(row[0])]

    def log_gap(g):
        return float(np.mean([np.log(r["predicted"] / r["published"]) for r in _priced_layers(rows, g)]))

    return float(brentq(log_gap, 0.3, 0.95, xtol=1e-4))


LAYER_COLUMNS = ("experiment", "model_spec", "hardware_spec", "tp", "mbs", "seq", "recompute", "sequence_parallel",
                 "forward_ms", "backward_ms")
_CHOICES = {"recompute": ("none", "selective", "full"), "sequence_parallel": ("yes", "no"),
            "attention": get_args(AttentionKernel), "dropout": ("yes", "no"), "dtype": ("bf16", "fp16", "fp32"),
            "async_allreduce": ("yes", "no")}
_DEFAULTS = {"attention": "flash", "dropout": "no", "dtype": "bf16", "async_allreduce": "yes"}


def read_layer_table(path: Path) -> list[dict]:
    """A table of measured single-layer times (layer_korthikanti_table4.csv's schema: LAYER_COLUMNS,
    and optionally attention flash|eager, dropout yes|no, dtype bf16|fp16|fp32, async_allreduce
    yes|no, source), each row's values checked and typed: TableError names the file, the row and
    the field of the first bad one."""
    from .errors import PiperError
    from .validate_rows import TableError, _cells, _delimiter

    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f, delimiter=_delimiter(f))
            header = list(reader.fieldnames or ())  # read here: an empty file has none, and the file closes
            raw = [_cells(path, reader, r) for r in reader]  # a row spilling past the header is refused
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise TableError(path, None, "<file>", f"cannot read ({getattr(e, 'strerror', None) or e})") from None
    missing = [c for c in LAYER_COLUMNS if c not in header]
    if missing:
        raise TableError(path, None, "columns", f"expected {', '.join(LAYER_COLUMNS)}; missing {', '.join(missing)}")
    unknown = [c for c in header if c and c not in (*LAYER_COLUMNS, *_DEFAULTS, "source")]
    if unknown:  # a misspelt optional column would otherwise be dropped without a word
        raise TableError(path, None, "columns", f"{', '.join(unknown)} not in the schema (optional: "
                         f"{', '.join((*_DEFAULTS, 'source'))})")
    if not raw:
        raise TableError(path, None, "rows", "the table has no rows")
    out, seen = [], set()
    for i, r in enumerate(raw, start=2):  # the header is line 1
        name = (r.get("experiment") or "").strip() or f"at line {i}"
        if name in seen:
            raise TableError(path, name, "experiment", "appears twice: name each measurement once")
        seen.add(name)
        v = {k: (r.get(k) or "").strip() for k in (*LAYER_COLUMNS, *_DEFAULTS, "source")}
        for k, d in _DEFAULTS.items():
            v[k] = v[k] or d
        for k, allowed in _CHOICES.items():
            if v[k] not in allowed:
                raise TableError(path, name, k, f"expected one of {', '.join(allowed)}, got {v[k]!r}")
        for k, most in (("tp", MAX_GPUS), ("mbs", MAX_SEQ), ("seq", MAX_SEQ)):
            if not re.fullmatch("[0-9]+", v[k]) or not 1 <= int(v[k]) <= most:  # (isdigit() takes '2²')
                raise TableError(path, name, k, f"expected a whole number from 1 to {most:,}, got {v[k]!r}")
            v[k] = int(v[k])
        for k in ("forward_ms", "backward_ms"):
            try:
                x = float(v[k])
            except ValueError:
                x = float("nan")
            if not (x > 0 and np.isfinite(x)):
                raise TableError(path, name, k, f"expected a positive number of milliseconds, got {v[k]!r}")
            v[k] = x
        for k, load in (("model", load_model), ("hardware", load_hardware)):
            try:
                v[k] = load(v[f"{k}_spec"])
            except PiperError as e:
                raise TableError(path, name, f"{k}_spec", str(e)) from None
        out.append(v)
    return out


def _layer_layout(v: dict) -> Layout:
    """The Layout one row of a layer table times: tp ranks, one micro-batch, no pipeline, data or
    expert parallelism (LayoutError where the model cannot run it)."""
    from .layout import check_for

    lay = Layout(gpus=v["tp"], tp=v["tp"], dp=1, mbs=v["mbs"], global_batch=v["mbs"], seq=v["seq"],
                 recompute=v["recompute"], sequence_parallel=v["sequence_parallel"] == "yes" and v["tp"] > 1,
                 attention_kernel=v["attention"], dropout=v["dropout"] == "yes", dtype=v["dtype"],
                 tp_async_dgrad=v["async_allreduce"] == "yes")
    check_for(lay, v["model"], v["hardware"])
    return lay


def layer_time_check(path: Path | None = None) -> list[dict]:
    """One row per row of a layer table (read_layer_table; default the bundled
    layer_korthikanti_table4.csv): measured and predicted forward and backward ms of one layer
    (cost.layer._layer_costs: compute plus the exposed tensor-parallel collectives, the backward
    with its recompute): a dense model's layer, or a MoE model's MoE layer with every expert on the
    row's tp ranks (no expert parallelism, so no all-to-all)."""
    from .cost.layer import _layer_costs
    from .errors import LayoutError
    from .evaluate import Routing
    from .validate_rows import TableError

    path = path or TABLES / "layer_korthikanti_table4.csv"
    out = []
    for v in read_layer_table(path):
        try:
            lay = _layer_layout(v)
        except LayoutError as e:
            raise TableError(path, v["experiment"], "tp", str(e)) from None
        m, hw = v["model"], v["hardware"]
        hw.require_peaks((lay.dtype,), v["hardware_spec"])
        hw.require_attention(lay.attention_kernel, v["hardware_spec"])
        lc = _layer_costs(m, hw, from_layouts([lay]), Routing(), lay.dtype)
        ph = (lc["moe"] + lc["moe_comm"]) if m.moe is not None else (lc["dense"] + lc["dense_comm"])
        out.append({"experiment": v["experiment"], "model": m.name, "hardware": hw.name, "tp": v["tp"],
                    "recompute": v["recompute"], "sequence_parallel": lay.sequence_parallel,
                    "measured_fwd_ms": v["forward_ms"], "measured_bwd_ms": v["backward_ms"],
                    "predicted_fwd_ms": float(ph.f[0]) * 1e3,
                    "predicted_bwd_ms": float(ph.b[0] + ph.w[0] + ph.r[0]) * 1e3})
    return out
