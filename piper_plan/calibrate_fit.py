"""Fit the hardware model to micro-benchmark measurements (pure numpy/scipy, no torch).

Measurements are plain JSON-able dicts, times in seconds:

- gemm:      {dtype, m, n, k, groups, seconds}     C[m×n] = A[m×k]·B[k×n], `groups` of them
- stream:    {nbytes, seconds}                      one elementwise kernel moving nbytes
- attention: {dtype, flops, seconds, ...}          causal SDPA forward; flops = 2·b·h·s²·d
                                                    (causal counted as half of full, brief §9);
             optional seconds_bwd, rows (b·h·s)     its backward alone (fit_attention_bwd)
- comm:      {kind: p2p|allreduce|alltoall, n, nbytes, seconds}; nbytes is the per-rank buffer

The compute model is piper_plan.cost.kernels itself (gemm_time, stream_time,
flash_attention_time), so what is fitted is exactly what the planner evaluates. The fit works
on raw rates — per-dtype GEMM plateau rate P_d = peak_d·e_gemm, streaming rate
BW = HBM·e_mem, overhead o, attention rate P_a = peak_bf16·e_attn — because the model only
sees those products. `split_*` then turns rates into the schema's peak × efficiency pairs.

Communication, α-β per message (the planner's model): a message of B bytes costs
α + B/β with α = latency_us·1e-6 and β = bandwidth_gbps·1e9·comm. Ring all-reduce over n
ranks: 2(n−1) steps of B/n bytes; all-to-all: n−1 messages of B/n bytes; P2P: one message.

scipy.optimize is imported by the fits that use it: every piper-plan command loads this module
(the CLI registers `calibrate`), and importing it took 0.26 of the 0.56 s the CLI took to start.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .cost.reduction import ADAMW_EAGER_BYTES
from .cost.kernels import flash_attention_time, gemm_time, stream_time
from .specs.hardware import HardwareSpec

ELT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
COMM_KINDS = ("p2p", "allreduce", "alltoall")


# ---- communication model -------------------------------------------------------------
def comm_steps(kind: str, n, nbytes):
    """(messages in sequence, bytes per message) of one collective; n ranks, nbytes per rank."""
    n = np.asarray(n, dtype=float)
    b = np.asarray(nbytes, dtype=float)
    if kind == "p2p":
        return np.ones_like(n * b), b
    if kind == "allreduce":
        return 2.0 * (n - 1.0), b / n
    if kind == "alltoall":
        return n - 1.0, b / n
    raise ValueError(f"unknown collective {kind!r} (expected one of {', '.join(COMM_KINDS)})")


def comm_time(kind: str, n, nbytes, latency_us: float, bandwidth_gbps: float, comm: float = 1.0):
    """Seconds for one collective under the α-β model (arrays broadcast)."""
    steps, per = comm_steps(kind, n, nbytes)
    return steps * (latency_us * 1e-6 + per / (bandwidth_gbps * 1e9 * comm))


def comm_bandwidth(kind: str, n, nbytes, seconds):
    """Achieved per-rank bandwidth, GB/s: bytes the model moves in sequence / time."""
    steps, per = comm_steps(kind, n, nbytes)
    return steps * per / np.asarray(seconds, dtype=float) / 1e9


# ---- compute model on raw rates --------------------------------------------------------
@dataclass(frozen=True)
class ComputeRates:
    """Raw fitted rates: TFLOP/s per GEMM dtype, streaming GB/s, overhead us, attention TFLOP/s,
    and the extra fixed cost per GEMM call by dtype, us (Efficiency.gemm_overhead_us)."""

    gemm_tflops: dict[str, float]
    stream_gbps: float
    overhead_us: float
    attention_tflops: float | None
    tile: tuple[int, int]
    gemm_overhead_us: dict[str, float] = field(default_factory=dict)


def rated_spec(hw: HardwareSpec, r: ComputeRates, attn_dtype: str = "bf16") -> HardwareSpec:
    """`hw` with efficiencies 1 and peaks = the raw rates (unvalidated copy, for evaluation)."""
    peaks = {**hw.accelerator.peak_tflops, **r.gemm_tflops}
    ref = peaks.get(attn_dtype, 1.0)
    # one rate, no cache knee (the knee is fitted on its own: fit_stream_cache), no power-limit
    # throttle (the probes time bursts: kernels.burst)
    acc = hw.accelerator.model_copy(update={"peak_tflops": peaks, "memory_bandwidth_gbps": r.stream_gbps,
                                            "cache_mib": None})
    eff = hw.efficiency.model_copy(update={
        "memory_dram": None, "sustained_matmul": 1.0,
        "gemm": 1.0, "memory": 1.0, "kernel_overhead_us": r.overhead_us, "gemm_tile": tuple(r.tile),
        "gemm_overhead_us": dict(r.gemm_overhead_us),
        "attention": (r.attention_tflops / ref) if r.attention_tflops else hw.efficiency.attention})
    return hw.model_copy(update={"accelerator": acc, "efficiency": eff})


def _head_dims(pts: list):
    """The probes' head dimensions where they record them (None: the plateau's own)."""
    dims = [p.get("head_dim") for p in pts]
    return None if any(d is None for d in dims) else np.array(dims, dtype=float)


def predict(hw: HardwareSpec, meas: dict) -> dict[str, np.ndarray]:
    """Model seconds for every compute measurement, by family ('gemm_<dtype>', 'stream', 'attention')."""
    out: dict[str, np.ndarray] = {}
    for dt in sorted({g["dtype"] for g in meas.get("gemm", [])}):
        pts = [g for g in meas["gemm"] if g["dtype"] == dt]
        col = lambda k: np.array([p.get(k, 1) for p in pts], dtype=float)  # noqa: E731
        out[f"gemm_{dt}"] = gemm_time(hw, col("m"), col("n"), col("k"), groups=col("groups"),
                                      dtype=dt, elt_bytes=ELT_BYTES[dt])
    if meas.get("stream"):
        out["stream"] = stream_time(hw, np.array([p["nbytes"] for p in meas["stream"]], dtype=float))
    if meas.get("attention"):
        pts = meas["attention"]
        # each probe at its own head dimension, as the planner prices a model's (head_dim_slowdown)
        out["attention"] = np.concatenate([
            flash_attention_time(hw, np.array([p["flops"] for p in pts if p["dtype"] == dt]), dt,
                                 _head_dims([p for p in pts if p["dtype"] == dt]))
            for dt in sorted({p["dtype"] for p in pts})])
    return out


def measured(meas: dict) -> dict[str, np.ndarray]:
    """Measured seconds in the same family order as `predict`."""
    out: dict[str, np.ndarray] = {}
    for dt in sorted({g["dtype"] for g in meas.get("gemm", [])}):
        out[f"gemm_{dt}"] = np.array([g["seconds"] for g in meas["gemm"] if g["dtype"] == dt])
    if meas.get("stream"):
        out["stream"] = np.array([p["seconds"] for p in meas["stream"]])
    if meas.get("attention"):
        pts = meas["attention"]
        out["attention"] = np.concatenate([np.array([p["seconds"] for p in pts if p["dtype"] == dt])
                                           for dt in sorted({p["dtype"] for p in pts})])
    return out


def best_rates(meas: dict) -> dict:
    """Highest measured rates: GEMM TFLOP/s per dtype, stream GB/s, attention TFLOP/s."""
    out: dict = {"gemm_tflops": {}}
    for g in meas.get("gemm", []):
        r = 2.0 * g["m"] * g["n"] * g["k"] * g.get("groups", 1) / g["seconds"] / 1e12
        out["gemm_tflops"][g["dtype"]] = max(out["gemm_tflops"].get(g["dtype"], 0.0), r)
    if meas.get("stream"):
        out["stream_gbps"] = max(p["nbytes"] / p["seconds"] / 1e9 for p in meas["stream"])
    if meas.get("attention"):
        out["attention_tflops"] = max(p["flops"] / p["seconds"] / 1e12 for p in meas["attention"])
    return out


def residual_stats(pred: dict[str, np.ndarray], meas: dict[str, np.ndarray]) -> dict[str, dict]:
    """Per family: median and max |model/measured − 1| in %, and the point count."""
    out = {}
    for fam, p in pred.items():
        e = 100.0 * np.abs(p / meas[fam] - 1.0)
        out[fam] = {"median_abs_pct": round(float(np.median(e)), 2), "max_abs_pct": round(float(e.max()), 2),
                    "points": int(e.size)}
    return out


@dataclass
class ComputeFit:
    rates: ComputeRates
    residuals: dict[str, dict]
    tile_costs: dict[str, float] = field(default_factory=dict)


def fit_compute(hw: HardwareSpec, meas: dict, tiles, attn_dtype: str = "bf16") -> ComputeFit:
    """least_squares on log time over all compute families at once, for each candidate tile;
    the tile with the lowest cost wins (near ties: the earlier one). Families present in `meas` set which rates are free
    (absent ones stay at `hw`'s values). Each family is weighted 1/sqrt(points) so a family
    with many shapes does not drown one with few. Grouped GEMMs (groups > 1) are held out:
    the model prices a grouped kernel like one large GEMM, so they are reported as their own
    families ('grouped_<dtype>') to show how far the runtime's grouped kernel is from that.
    Each GEMM dtype also gets its own extra fixed cost per call (gemm_overhead_us, ≥ 0; values
    under 0.01 us are reported as 0) on top of the overhead every kernel shares."""
    from scipy.optimize import least_squares
    grouped = [g for g in meas.get("gemm", []) if g.get("groups", 1) > 1]
    meas = {**meas, "gemm": [g for g in meas.get("gemm", []) if g.get("groups", 1) == 1]}
    t_meas = measured(meas)
    if not t_meas:
        raise ValueError("no compute measurements to fit")
    best = best_rates(meas)
    dts = sorted(best["gemm_tflops"])
    has_stream, has_attn = "stream" in t_meas, "attention" in t_meas
    # start from the best measured rates (the plateau is near them) and a small overhead
    x0 = [np.log(best["gemm_tflops"][d]) for d in dts]
    if has_stream:
        x0.append(np.log(best["stream_gbps"]))
    x0.append(np.log(max(1e-2, 0.5 * min(float(v.min()) for v in t_meas.values()) * 1e6)))
    if has_attn:
        x0.append(np.log(best["attention_tflops"]))
    n_base = len(x0)
    x0 += [x0[len(dts) + has_stream]] * len(dts)  # each dtype's whole fixed cost per GEMM, us
    # a plateau no higher than the accelerator's peak, or the best measured rate where a spec's
    # peak is lower: left free, a fit whose small shapes cost more than the model's overhead
    # explains lifts the plateau past the silicon (H200, 2026-12-04: 1,170 of 989 TFLOP/s)
    hi = np.full(len(x0), np.inf)
    for j, d in enumerate(dts):
        hi[j] = np.log(max(hw.accelerator.peak_tflops.get(d, np.inf), best["gemm_tflops"][d]))
    if has_attn:
        peak_attn = hw.accelerator.peak_tflops.get(attn_dtype, np.inf)
        hi[len(dts) + has_stream + 1] = np.log(max(peak_attn, best["attention_tflops"]))
    # fixed costs per call under a second: bounded, the search for a plateau under its cap can
    # run them off to exp's overflow on a noisy smoke run
    hi[len(dts) + has_stream] = hi[n_base:] = np.log(1e6)
    weights = {f: 1.0 / np.sqrt(v.size) for f, v in t_meas.items()}
    log_meas = {f: np.log(v) for f, v in t_meas.items()}

    def unpack(x, tile, final: bool = False) -> ComputeRates:
        i = len(dts)
        rates = {d: float(np.exp(x[j])) for j, d in enumerate(dts)}
        bw = float(np.exp(x[i])) if has_stream else hw.accelerator.memory_bandwidth_gbps * hw.efficiency.memory
        i += has_stream
        o = float(np.exp(x[i]))
        pa = float(np.exp(x[i + 1])) if has_attn else None
        # the dtype's fixed cost beyond the shared one (negative while fitting is allowed:
        # the evaluation copy is unvalidated; the result is floored at 0)
        g = {d: float(np.exp(x[n_base + j])) - o for j, d in enumerate(dts)}
        if final:
            g = {d: (round(v, 3) if v >= 0.01 else 0.0) for d, v in g.items()}
        return ComputeRates(rates, bw, o, pa, tuple(tile), g)

    def resid(x, tile):
        spec = rated_spec(hw, unpack(x, tile), attn_dtype)
        p = predict(spec, meas)
        return np.concatenate([weights[f] * (np.log(np.maximum(p[f], 1e-15)) - log_meas[f]) for f in t_meas])

    fits = {}
    for tile in tiles:
        fits[tuple(tile)] = least_squares(resid, np.array(x0, dtype=float), args=(tile,), method="trf",
                                          bounds=(-np.inf, hi), loss="soft_l1", f_scale=0.1, max_nfev=400)
    # on a near tie (within 2% of the best cost) the earlier candidate wins, so measurement
    # noise does not flip the tile between runs; candidates come finest first
    low = min(f.cost for f in fits.values())
    tile = next(t for t in fits if fits[t].cost <= 1.02 * low + 1e-12)
    rates = unpack(fits[tile].x, tile, final=True)
    spec = rated_spec(hw, rates, attn_dtype)
    res = residual_stats(predict(spec, meas), t_meas)
    if grouped:
        held = {"gemm": grouped}
        res.update({f.replace("gemm_", "grouped_"): v for f, v in
                    residual_stats(predict(spec, held), measured(held)).items()})
    return ComputeFit(rates, res, {f"{t[0]}x{t[1]}": round(float(fits[t].cost), 6) for t in fits})


def proposals(hw: HardwareSpec, fit: ComputeFit, meas: dict, tiles) -> dict:
    """Figures for schema fields the model lacks today (reported, not written to the YAML):
    a GEMM fixed cost per dtype (each dtype fitted alone, streaming rate held at the joint
    fit's) and, per dtype, the fraction of the plain-GEMM model a grouped GEMM reaches."""
    spec = rated_spec(hw, fit.rates)
    out: dict = {"gemm_overhead_us": {}, "gemm_residuals_per_dtype_overhead": {}, "grouped_gemm_efficiency": {}}
    plain = [g for g in meas.get("gemm", []) if g.get("groups", 1) == 1]
    for dt in sorted({g["dtype"] for g in plain}):
        f = fit_compute(spec, {"gemm": [g for g in plain if g["dtype"] == dt]}, tiles)
        out["gemm_overhead_us"][dt] = round(f.rates.overhead_us, 3)
        out["gemm_residuals_per_dtype_overhead"].update(f.residuals)
    grouped = [g for g in meas.get("gemm", []) if g.get("groups", 1) > 1]
    for dt in sorted({g["dtype"] for g in grouped}):
        held = {"gemm": [g for g in grouped if g["dtype"] == dt]}
        ratio = predict(spec, held)[f"gemm_{dt}"] / measured(held)[f"gemm_{dt}"]
        out["grouped_gemm_efficiency"][dt] = round(float(np.median(ratio)), 4)
    return out


@dataclass
class CommFit:
    latency_us: float
    bandwidth_gbps: float  # effective: link bandwidth × comm efficiency
    residuals: dict[str, dict]


def predict_comm(meas: list[dict], latency_us: float, bw_gbps: float) -> dict[str, np.ndarray]:
    out = {}
    for kind in COMM_KINDS:
        pts = [p for p in meas if p["kind"] == kind]
        if pts:
            out[f"comm_{kind}"] = comm_time(kind, np.array([p["n"] for p in pts]),
                                            np.array([p["nbytes"] for p in pts]), latency_us, bw_gbps)
    return out


def fit_comm(meas: list[dict]) -> CommFit:
    """least_squares on log time for (α, β) of the α-β model over every collective measured."""
    from scipy.optimize import least_squares
    if not meas:
        raise ValueError("no communication measurements to fit")
    t_meas = {f"comm_{k}": np.array([p["seconds"] for p in meas if p["kind"] == k])
              for k in COMM_KINDS if any(p["kind"] == k for p in meas)}
    weights = {f: 1.0 / np.sqrt(v.size) for f, v in t_meas.items()}
    bw0 = max(float(comm_bandwidth(p["kind"], p["n"], p["nbytes"], p["seconds"])) for p in meas)
    lat0 = max(1e-2, 0.5 * min(p["seconds"] / float(comm_steps(p["kind"], p["n"], p["nbytes"])[0])
                               for p in meas) * 1e6)

    def resid(x):
        p = predict_comm(meas, float(np.exp(x[0])), float(np.exp(x[1])))
        return np.concatenate([weights[f] * (np.log(p[f]) - np.log(t_meas[f])) for f in t_meas])

    r = least_squares(resid, np.log([lat0, bw0]), method="trf", loss="soft_l1", f_scale=0.1, max_nfev=400)
    lat, bw = (float(v) for v in np.exp(r.x))
    return CommFit(lat, bw, residual_stats(predict_comm(meas, lat, bw), t_meas))


# ---- fixed costs the kernel and α-β models do not list ------------------------------------
def fit_stream_cache(rows: list[dict], overhead_us: float) -> tuple[dict, dict]:
    """A two-rate streaming model from the stream points ({nbytes, seconds}): t = overhead +
    min(n, C)/B_c + max(0, n − C)/B_d. B_c is the highest rate measured (a cache-resident
    stream); C (bounded to the measured sizes) and the DRAM rate B_d are fitted by
    least_squares on log time (scipy). Returns ({cache_gbps, cache_mib, dram_gbps}, residual
    stats 'stream_cache'), or ({}, {}) when the points cannot say (fewer than 4, or no rate
    drop of a quarter or more beyond the cache, or a knee at the smallest timed size: a cache
    smaller than any stream the fixed cost does not hide is not seen, and one slow point there
    had fitted a 1e-5 MiB cache)."""
    from scipy.optimize import least_squares
    pts = sorted((float(p["nbytes"]), float(p["seconds"])) for p in rows)
    if len(pts) < 4:
        return {}, {}
    n, t = (np.array(v) for v in zip(*pts))
    o = overhead_us * 1e-6
    timed = t > 2.0 * o  # points the fixed cost dominates say nothing about a rate
    if timed.sum() < 3:
        return {}, {}
    bc = float((n[timed] / (t[timed] - o)).max())
    big = n[n > 0]
    lo, hi = np.log(n[timed].min()), np.log(big.max())

    def model(x):
        c, bd = np.exp(x)
        cached = np.minimum(n, c)
        return o + cached / bc + (n - cached) / bd

    x0 = [0.5 * (lo + hi), np.log(0.5 * bc)]
    fit = least_squares(lambda x: np.log(model(x)) - np.log(t), x0, method="trf",
                        bounds=([lo, -np.inf], [hi, np.log(bc)]))
    c, bd = np.exp(fit.x)
    # no clear drop (noise makes small ones), or the knee on either bound: one rate
    if bd >= 0.75 * bc or c >= 0.99 * big.max() or c <= 1.01 * n[timed].min():
        return {}, {}
    out = {"cache_gbps": bc / 1e9, "cache_mib": c / 2**20, "dram_gbps": bd / 1e9}
    return out, residual_stats({"stream_cache": model(fit.x)}, {"stream_cache": t})


def fit_cast(hw: HardwareSpec, rows: list[dict]) -> tuple[dict, dict]:
    """Efficiency.cast from the weight-cast pairs ({nbytes, seconds}, calibrate_bench._casts):
    the median over the points of (stream_time of the same bytes, two kernels, under `hw`'s
    fitted streaming rates) / measured, capped at 1. Returns ({'cast': f} or {}, residual
    stats 'cast' of the resulting model)."""
    if not rows:
        return {}, {}
    n = np.array([float(r["nbytes"]) for r in rows])
    t = np.array([float(r["seconds"]) for r in rows])
    model = stream_time(hw, n, 2)
    f = float(min(1.0, np.median(model / t)))
    return {"cast": f}, residual_stats({"cast": model / f}, {"cast": t})


def fit_attention_bwd(peak_tflops: float, overhead_us: float, rows: list[dict]) -> tuple[dict, dict]:
    """Efficiency.attention_bwd and attention_bwd_row_us from the attention points' backward
    times: t_bwd = overhead + 2.5·flops / (peak·e_bwd) + rows·row_us (flash_attention_bwd_time),
    linear in (1/(peak·e_bwd), row_us), so non-negative least squares (scipy nnls) on
    relative error (each row divided by its measured time). `peak_tflops`: the spec's peak of
    the attention dtype. Returns ({attention_bwd, attention_bwd_row_us} or {} without backward
    points, residual stats 'attention_bwd')."""
    from scipy.optimize import nnls
    pts = [r for r in rows if r.get("seconds_bwd")]
    if len(pts) < 2:
        return {}, {}
    t = np.array([p["seconds_bwd"] for p in pts])
    a = np.stack([2.5 * np.array([p["flops"] for p in pts]), np.array([p["rows"] for p in pts], dtype=float)], 1)
    y = np.maximum(t - overhead_us * 1e-6, 0.0)
    x, _ = nnls(a / t[:, None], y / t)
    peak = peak_tflops * 1e12
    e_bwd = 1.0 if x[0] <= 0 else min(1.0, 1.0 / (x[0] * peak))
    out = {"attention_bwd": e_bwd, "attention_bwd_row_us": float(x[1] * 1e6)}
    model = a[:, 0] / (peak * e_bwd) + a[:, 1] * x[1] + overhead_us * 1e-6
    return out, residual_stats({"attention_bwd": model}, {"attention_bwd": t})


# bytes per element each optimizer-probe part streams (calibrate_bench._optimizer): eager AdamW's
# passes (cost/reduction.ADAMW_EAGER_BYTES) + the norm's read; clip scale and ÷dp, read + write each;
# flatten into a buffer and copy back, read + write each
OPT_PART_BYTES = {"adamw": ADAMW_EAGER_BYTES + 4.0, "grad": 16.0, "copy": 16.0}


def fit_optimizer_tensor(hw: HardwareSpec, rows: list[dict]) -> tuple[dict[str, float], dict]:
    """Efficiency.optimizer_tensor_us from the eager-optimizer probe ({part, tensors, numel,
    seconds}): per part, (measured − stream_time of the bytes it moves under `hw`) / tensors,
    in us, floored at 0 -- the host cost each parameter tensor adds beyond its bytes.
    Returns ({part: us}, {part: detail})."""
    out, detail = {}, {}
    for r in rows:
        streamed = float(stream_time(hw, OPT_PART_BYTES[r["part"]] * r["numel"], 0))
        out[r["part"]] = round(max(0.0, r["seconds"] - streamed) / r["tensors"] * 1e6, 2)
        detail[r["part"]] = {"measured_ms": round(r["seconds"] * 1e3, 4), "streamed_ms": round(streamed * 1e3, 4),
                             "tensors": r["tensors"]}
    return out, detail


def fit_layer_overhead(hw: HardwareSpec, rows: list[dict]) -> tuple[dict[str, float], dict[str, dict]]:
    """Efficiency.layer_overhead_us from the framework-overhead blocks (calibrate_bench.LAYER_SPEC):
    measured forward + backward time minus the kernel model's price of the same block under
    `hw` (the fitted rates, so only what the kernel list misses remains), floored at 0.
    Returns ({'<kind>_<dtype>': us}, {'<kind>_<dtype>': {'measured_us', 'kernel_model_us'}})."""
    from .calibrate_bench import LAYER_SEQ, LAYER_SPEC
    from .cost.batch import from_layouts
    from .cost.estimate import Routing
    from .cost.layer import _layer_costs
    from .layout import Layout
    from .specs.model import ModelSpec

    spec = ModelSpec(**LAYER_SPEC)
    # price the blocks without any overhead already in `hw` (a calibrated base carries one)
    hw = hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"layer_overhead_us": {}})})
    out, detail = {}, {}
    for r in rows:
        # piper-train's own block: eager modules, autocast over fp32 weights
        lay = from_layouts([Layout(gpus=1, global_batch=1, seq=LAYER_SEQ, dtype=r["dtype"], fused_kernels=False)])
        lc = _layer_costs(spec, hw, lay, Routing(), r["dtype"])
        model = float(lc[r["kind"]].total[0])
        key = f"{r['kind']}_{r['dtype']}"
        out[key] = round(max(0.0, r["seconds"] - model) * 1e6, 2)
        detail[key] = {"measured_us": round(r["seconds"] * 1e6, 2), "kernel_model_us": round(model * 1e6, 2)}
    return out, detail


def fit_pipeline_chunk(hw: HardwareSpec, probes: list, rows: list[dict]) -> tuple[dict[str, float], dict]:
    """Efficiency.pipeline_chunk_us from the pipeline-executor probe (calibrate_bench.PIPE_SPEC):
    for each multi-chunk schedule s, ((T_s − T_1f1b) measured − (T_s − T_1f1b) predicted by
    `hw` without any chunk cost) / (micro-batches × extra chunks a rank), floored at 0. The
    layers, messages and bubbles of both runs are the model's to price; what remains is the
    executor's per-chunk work. Returns ({schedule: us}, {schedule: detail})."""
    from .cost.estimate import evaluate
    from .cost.batch import from_layouts
    from .plan import Plan

    hw = hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"pipeline_chunk_us": {}})})
    plans = {s: Plan.model_validate_json(pj) for s, pj in probes}
    pred = {s: float(evaluate(p.model, hw, from_layouts([p.layout])).step_time_s[0]) for s, p in plans.items()}
    meas = {r["schedule"]: r for r in rows}
    if "1f1b" not in meas:
        return {}, {}
    base = meas["1f1b"]
    out, detail = {}, {}
    for s, r in meas.items():
        if s == "1f1b" or r["vpp"] < 2:
            continue
        extra = (r["seconds"] - base["seconds"]) - (pred[s] - pred["1f1b"])
        out[s] = round(max(0.0, extra) / (r["microbatches"] * (r["vpp"] - 1)) * 1e6, 2)
        detail[s] = {"measured_ms": round(r["seconds"] * 1e3, 3), "predicted_ms": round(pred[s] * 1e3, 3),
                     "measured_1f1b_ms": round(base["seconds"] * 1e3, 3),
                     "predicted_1f1b_ms": round(pred["1f1b"] * 1e3, 3)}
    return out, detail


def fit_collective_overhead(rows: list[dict], latency_us: float, bw_gbps: float) -> tuple[float, float, dict]:
    """Efficiency.collective_overhead_us and collective_step_us from the loaded measurements
    (added time per call while every rank computes between calls): co, the median over the
    one-round calls (p2p, all-to-all) of (added time − their α-β time); co_step, the median
    over the all-reduces of (added time − α-β − co) / their 2(n−1) dependent steps. Both
    floored at 0; the α-β pair is the node level's fit from back-to-back collectives.
    Returns (co us, co_step us, residual stats of the resulting model against the rows)."""
    rows = [r for r in rows if not r.get("skew")]  # the long-burst rows are fit_collective_skew's
    if not rows:
        return 0.0, 0.0, {}
    ab = np.array([float(comm_time(r["kind"], r["n"], r["nbytes"], latency_us, bw_gbps)) for r in rows])
    meas = np.array([r["seconds"] for r in rows])
    ring = np.array([r["kind"] == "allreduce" for r in rows])
    steps = np.array([2.0 * (r["n"] - 1) for r in rows])
    one = ~ring if (~ring).any() else ring
    co = max(0.0, float(np.median((meas - ab)[one])))
    co_step = max(0.0, float(np.median(((meas - ab - co) / steps)[ring]))) if ring.any() else 0.0
    model = ab + co + np.where(ring, steps * co_step, 0.0)
    stats = residual_stats({"comm_loaded": np.maximum(model, 1e-9)}, {"comm_loaded": np.maximum(meas, 1e-9)})
    return co * 1e6, co_step * 1e6, stats


def fit_collective_skew(rows: list[dict]) -> tuple[float, float, dict]:
    """Efficiency.collective_skew_us and collective_skew_base_ms from the loaded all-to-alls
    over every rank: the short-burst row (burst W0, added time e0) and the long-burst rows
    (calibrate_bench skew_bursts): e(W) = e0 + k·(√W − √W0), W in ms, k by least squares
    through the short point, floored at 0. A long row whose call added no time (the bursts alone
    ran slower than bursts and calls: the machine's noise beat the signal; seen on a shared VM,
    −16 ms after 134 ms bursts) measured nothing and is left out. Returns (k us/√ms, W0 ms,
    residual stats)."""
    longs = [r for r in rows if r.get("skew") and r["seconds"] > 0]
    if not longs:
        return 0.0, 0.0, {}
    n = longs[0]["n"]
    short = [r for r in rows if not r.get("skew") and r["kind"] == "alltoall" and r["n"] == n]
    if not short:
        return 0.0, 0.0, {}
    w0, e0 = short[0]["burst_s"] * 1e3, short[0]["seconds"]
    x = np.sqrt([r["burst_s"] * 1e3 for r in longs]) - np.sqrt(w0)
    y = np.array([r["seconds"] for r in longs]) - e0
    k = max(0.0, float((x * y).sum() / max((x * x).sum(), 1e-12)))
    model = e0 + k * x
    stats = residual_stats({"comm_skew": np.maximum(model, 1e-9)}, {"comm_skew": np.maximum(y + e0, 1e-9)})
    return k * 1e6, w0, stats


# ---- rates -> schema fields -------------------------------------------------------------
def split_compute(rates: ComputeRates, best: dict, datasheet: tuple[dict, float] | None,
                  attn_dtype: str = "bf16") -> dict:
    """Turn fitted rates into {peak_tflops, gemm, memory_bandwidth_gbps, memory, attention, ...}.

    datasheet None ("measured" mode, e.g. a CPU rank with no datasheet): each dtype's peak is
    at least the highest rate measured for it, and one shared e_gemm = min_d P_d/max(best_d, P_d),
    so peak_d = P_d/e_gemm ≥ best_d and peak_d·e_gemm reproduces every fitted plateau exactly;
    HBM bandwidth likewise = max(best streamed, fitted) and e_mem = fitted/HBM.
    datasheet (peak_tflops, HBM GB/s) given: those stay and the efficiencies are fitted/datasheet
    (a measured rate above a datasheet figure raises that figure, so efficiencies stay ≤ 1)."""
    P = rates.gemm_tflops
    if datasheet is None:
        gemm = min(1.0, min(P[d] / max(best["gemm_tflops"][d], P[d]) for d in P))
        peaks = {d: P[d] / gemm for d in P}
        hbm = max(best.get("stream_gbps", 0.0), rates.stream_gbps)
    else:
        peaks = dict(datasheet[0])
        ref = attn_dtype if attn_dtype in P else sorted(P)[0]
        peaks[ref] = max(peaks.get(ref, 0.0), P[ref])
        gemm = P[ref] / peaks[ref]
        for d in P:
            if d != ref:
                peaks[d] = max(peaks.get(d, 0.0), P[d] / gemm)
        hbm = max(datasheet[1], rates.stream_gbps)
    out = {"peak_tflops": {d: float(f"{v:.6g}") for d, v in peaks.items()}, "gemm": gemm,
           "gemm_tile": list(rates.tile), "kernel_overhead_us": rates.overhead_us,
           "gemm_overhead_us": dict(rates.gemm_overhead_us),
           "memory_bandwidth_gbps": hbm, "memory": rates.stream_gbps / hbm, "attention_clipped": False}
    if rates.attention_tflops is not None:
        a = rates.attention_tflops / peaks[attn_dtype]
        out["attention_clipped"] = a > 1.0
        out["attention"] = min(1.0, a)
    return out


def split_comm(fit: CommFit, meas: list[dict]) -> dict:
    """Link bandwidth = max(highest per-rank bandwidth measured, fitted β); comm = β / link."""
    best = max(float(comm_bandwidth(p["kind"], p["n"], p["nbytes"], p["seconds"])) for p in meas)
    link = max(best, fit.bandwidth_gbps)
    return {"bandwidth_gbps": link, "latency_us": fit.latency_us, "comm": fit.bandwidth_gbps / link}
