"""Where the model's errors share a cause: the priced throughput rows' signed errors grouped by one
recipe setting at a time (the model, the machine, the dispatcher, CUDA graphs, ...) and by each
model crossed with one, every group tested for a bias.

- A row's error is ln(predicted / measured throughput) (an iteration time is inverted first), so
  +x % always means the model is x % too optimistic, and ×2 and ×½ weigh alike; it is reported
  back as exp(mean) − 1.
- Rows that repeat one setup (same model, machine, priced layout and prediction: one recipe
  re-published release after release) count once, with their mean error. Six releases of one
  recipe are one observation of the model, not six.
- A level (dispatcher = hybridep, or gpt-oss-120b × hybridep) is tested where it holds at least
  MIN_SETUPS setups: a one-sample t-test of its setups' errors against 0, with the
  Benjamini-Hochberg false-discovery rate over every level tested, since with dozens of levels
  some would pass p < 0.05 by chance. It is called a bias where q < MAX_Q and its mean is beyond
  BIAS_PCT: significant, and large enough to move a plan's ranking.
- Beside the levels, the trends: the Spearman rank correlation of the setups' errors with each
  numeric setting (GPUs, EP, PP, micro-batch, sequence, hidden size, local experts, routed rows an
  expert takes a micro-batch), over the setups that state it, Benjamini-Hochberg-corrected among
  themselves. A trend with the GPU count would say the model drifts with scale.

Nothing here changes a prediction: it says where the model's misses cluster, which is where a
missing term is likely to sit (issue 4: "use what validation teaches"). Pure functions of the
priced results (validate.Result) and the table's rows (validate_rows.read_rows).
"""
from __future__ import annotations

import numpy as np
from scipy.stats import false_discovery_control, spearmanr, ttest_1samp

# the table's recipe columns a level is read from; "model" and "hardware" prefer the spec column
FACTORS = ("model", "hardware", "precision", "dispatcher", "cuda_graphs", "a2a_overlap", "expert_gemm",
           "recompute", "pipeline", "group")
MIN_SETUPS = 3   # fewer distinct setups give a t-test with one or no degree of freedom beyond the mean
MAX_Q = 0.05     # false-discovery rate a reported bias is held to
BIAS_PCT = 10.0  # smaller mean errors are within what one efficiency's source spread moves (validate --sensitivity)


def _num(r: dict, column: str) -> float:
    """A numeric column of a table row; nan where the row leaves it blank (a planner's-choice
    row's degrees, a dense model's experts)."""
    try:
        return float(r.get(column) or "nan")
    except ValueError:
        return float("nan")


def _experts(r: dict) -> float:
    return _num(r, "experts") if _num(r, "experts") > 0 else float("nan")


# numeric settings a trend is sought along, from the table's columns
TRENDS = {
    "gpus": lambda r: _num(r, "gpus"),
    "ep": lambda r: _num(r, "ep"),
    "pp": lambda r: _num(r, "pp"),
    "mbs": lambda r: _num(r, "mbs"),
    "seq": lambda r: _num(r, "seq"),
    "hidden": lambda r: _num(r, "hidden"),
    "local experts": lambda r: _experts(r) / _num(r, "ep"),
    "routed rows an expert (a micro-batch)": lambda r: (_num(r, "mbs") * _num(r, "seq") * _num(r, "topk")
                                                        * _num(r, "ep") / _experts(r)),
}


def _level(row: dict, factor: str) -> str:
    if factor in ("model", "hardware"):
        return row.get(f"{factor}_spec") or row[factor]
    if factor == "pipeline":  # the published layout's; blank pp: the planner chose it
        pp = row.get("pp", "")
        return "planner's choice" if not pp else "pp 1" if pp == "1" else "pp > 1"
    return row.get(factor) or "(unstated)"


def _log_error(r) -> float:
    """ln(predicted / measured throughput) of one Result: an iteration time's ratio inverted."""
    ratio = r.predicted / r.published
    return float(-np.log(ratio) if r.is_time else np.log(ratio))


def setups(results, rows: list[dict]) -> list[dict]:
    """The priced, out-of-sample throughput rows merged by setup: [{key, ids, error (mean ln
    ratio), row (the first row's table fields)}], in table order."""
    by_id = {r["id"]: r for r in rows}
    out: dict[tuple, dict] = {}
    for r in results:
        if r.kind == "memory" or r.fit or not np.isfinite(r.predicted) or r.id not in by_id:
            continue
        row = by_id[r.id]
        key = (_level(row, "model"), _level(row, "hardware"), r.layout, r.metric, round(r.predicted, 9))
        s = out.setdefault(key, {"key": key, "ids": [], "errors": [], "row": row})
        s["ids"].append(r.id)
        s["errors"].append(_log_error(r))
    return [{"key": s["key"], "ids": s["ids"], "error": float(np.mean(s["errors"])), "row": s["row"]}
            for s in out.values()]


def _levels(units: list[dict]) -> list[tuple[str, str, list[int]]]:
    """(factor, level, indices of its setups) for every level with MIN_SETUPS setups: each factor
    alone, then each model crossed with another factor; a crossed level holding exactly the
    setups of one already listed is left out (it tests nothing new)."""
    found, seen = [], set()

    def add(factor, level, idx):
        if len(idx) >= MIN_SETUPS and frozenset(idx) not in seen:
            seen.add(frozenset(idx))
            found.append((factor, level, idx))

    def grouped(key_of) -> dict:  # key -> indices of the setups whose row gives it
        groups: dict = {}
        for i, u in enumerate(units):
            groups.setdefault(key_of(u["row"]), []).append(i)
        return groups

    for f in FACTORS:
        for level, idx in grouped(lambda r: _level(r, f)).items():
            add(f, level, idx)
    for f in FACTORS:
        if f in ("model", "group"):
            continue
        for (model, level), idx in grouped(lambda r: (_level(r, "model"), _level(r, f))).items():
            add(f"model x {f}", f"{model} x {level}", idx)
    return found


def residuals(results, rows: list[dict]) -> dict:
    """Every tested level's bias statistics, most significant first, and the setups they are
    drawn from: {"setups", "rows", "overall_pct", "thresholds", "levels": [{factor, level,
    setups, rows, mean_pct, sd_pct, p, q, bias}], "trends": [{setting, setups, rho, p, q,
    trend}]}. mean_pct = 100·(exp(mean ln ratio) − 1); sd_pct the setups' spread in the same
    units (one standard deviation of ln ratio, as %); thresholds the MIN_SETUPS, MAX_Q and
    BIAS_PCT the verdicts were drawn with, so a reader of the stored answer need not restate them;
    memory: how full the published runs' devices are predicted (memory_checked)."""
    thresholds = {"min_setups": MIN_SETUPS, "max_q": MAX_Q, "bias_pct": BIAS_PCT}
    units = setups(results, rows)
    if not units:
        return {"setups": 0, "rows": 0, "overall_pct": None, "thresholds": thresholds, "levels": [], "trends": [],
                "memory": memory_checked(results)}
    err = np.array([u["error"] for u in units])
    levels = _levels(units)
    stats = []
    for factor, level, idx in levels:
        e = err[idx]
        p = float(ttest_1samp(e, 0.0).pvalue) if np.ptp(e) > 0 else (0.0 if e[0] != 0 else 1.0)
        stats.append({"factor": factor, "level": level, "setups": len(idx),
                      "rows": sum(len(units[i]["ids"]) for i in idx),
                      "mean_pct": 100.0 * float(np.expm1(e.mean())), "sd_pct": 100.0 * float(np.expm1(e.std(ddof=1))),
                      "p": p, "ids": [units[i]["ids"][0] for i in idx]})
    if stats:
        q = false_discovery_control(np.array([s["p"] for s in stats]), method="bh")
        for s, qi in zip(stats, q):
            s["q"] = float(qi)
            s["bias"] = bool(qi < MAX_Q and abs(s["mean_pct"]) > BIAS_PCT)
    stats.sort(key=lambda s: (s["q"], -abs(s["mean_pct"])))
    return {"setups": len(units), "rows": sum(len(u["ids"]) for u in units),
            "overall_pct": 100.0 * float(np.expm1(err.mean())), "thresholds": thresholds, "levels": stats,
            "trends": _trends(units, err), "memory": memory_checked(results)}


def memory_checked(results) -> dict:
    """How full the memory model puts the devices of the published runs it predicts to fit (each
    of them ran; validate.memory_of_runs): {"runs", "max_share", "at"}, as track_record reads it."""
    from .validate import memory_of_runs

    m = memory_of_runs(results)
    return {"runs": m["rows"] - len(m["over"]), "max_share": m["max_fit_share"], "at": m["max_fit_at"]}


def _trends(units: list[dict], err: np.ndarray) -> list[dict]:
    """Spearman's rho of the setups' errors against each TRENDS setting, where at least
    MIN_SETUPS + 2 setups state it and it varies; q: Benjamini-Hochberg over these."""
    out = []
    for name, of in TRENDS.items():
        x = np.array([of(u["row"]) for u in units])
        ok = np.isfinite(x)
        if ok.sum() < MIN_SETUPS + 2 or np.ptp(x[ok]) == 0:
            continue
        rho, p = spearmanr(x[ok], err[ok])
        out.append({"setting": name, "setups": int(ok.sum()), "rho": float(rho), "p": float(p)})
    if out:
        for t, q in zip(out, false_discovery_control(np.array([t["p"] for t in out]), method="bh")):
            t["q"] = float(q)
            t["trend"] = bool(q < MAX_Q)
    return out
