"""`piper-plan calibrate --check SPEC`: is this machine still the one SPEC was measured on?

A spec written by `piper-plan calibrate -o PATH` keeps its measurements in PATH's sibling
`<stem>.calibration.json`. The check re-runs a sample of those same probes (GEMMs of each
dtype, streams, piper-train's framework-overhead blocks, collectives and its 1F1B step) on the
same number of ranks and compares the times now with the times then, probe by probe and per
family (geometric mean of now / then). A spec priced on another machine mispredicts every plan
made with it: this repository's cpu-local was measured on a host whose CPU has bf16
instructions, and on a 2-core AVX2 host of the same name its 512³ bf16 GEMM takes ~180× as long
(fp32 ~1×). The same host drifts 10-30 % over minutes (benchmarks/closed_loop.py), so only a
family beyond TOLERANCE either way counts as a different machine. torch loads lazily (inside
the ranks).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from .calibrate_bench import BenchPlan, run_benchmarks
from .errors import PiperError
from .files import read_text
from .specs.registry import _resolve

TOLERANCE = 1.5    # now/then beyond ×1.5 (or below ÷1.5) in a family: not the calibrated machine
FAMILIES = ("gemm", "stream", "layers", "comm", "pipelines")


def record_for(spec_ref: str) -> tuple[Path, dict]:
    """(path, parsed record) of the calibration record beside a spec (bundled name or YAML path)."""
    path = _resolve(spec_ref, "hardware")
    rec_path = path.with_name(path.stem + ".calibration.json")
    if not os.path.isfile(rec_path):  # (its name may pass NAME_MAX where the spec's does not: no record)
        raise PiperError(f"{path}: no {rec_path.name} beside it: only a spec written by "
                         "`piper-plan calibrate -o PATH` carries the measurements a check repeats")
    try:
        rec = json.loads(read_text(rec_path))
        rec["plan"], rec["measurements"], rec["ranks"]  # noqa: B018 - the fields a check needs
    except (ValueError, RecursionError, KeyError, TypeError) as e:  # read_text's own errors are one line already
        raise PiperError(f"{rec_path}: not a calibration record ({type(e).__name__}: {e})") from None
    kinds = {"plan": dict, "measurements": dict, "ranks": int}
    for key, kind in kinds.items():  # the shapes a check reads, before it reads them
        if not isinstance(rec[key], kind) or isinstance(rec[key], bool):
            raise PiperError(f"{rec_path}: not a calibration record ({key}: expected a {kind.__name__}, got "
                             f"{type(rec[key]).__name__})")
    if rec["ranks"] < 1:
        raise PiperError(f"{rec_path}: not a calibration record (ranks: expected >= 1, got {rec['ranks']})")
    return rec_path, rec


def _spread(items: list, key, top: bool = True) -> list:
    """The smallest, middle and (top) largest of items by key, else the smallest and the
    thirds (fewer when there are fewer)."""
    s, n = sorted(items, key=key), len(items)
    at = {0, n // 2, n - 1} if top else {0, n // 3, 2 * n // 3}
    return [s[i] for i in sorted(at)] if s else []


def sample_plan(rec: dict) -> BenchPlan:
    """A few of the record's own probes: per dtype three single GEMMs at the bottom and the
    thirds of its FLOP range (not the largest: on a host without the dtype's instructions
    one call of it can take many seconds), its largest and a middle stream, every
    framework-overhead block, each collective kind at a middle and the largest size, and
    piper-train's own 1F1B step on the pipeline probe (the last two cover the network and
    the runtime, which the kernel probes do not; about 10 s more on 2 cores)."""
    p = rec["plan"]
    gemms = [tuple(g) for g in p.get("gemm", []) if g[4] == 1]
    gemm = [g for dt in sorted({g[0] for g in gemms})
            for g in _spread([g for g in gemms if g[0] == dt], key=lambda g: g[1] * g[2] * g[3], top=False)]
    stream = sorted(set(_spread(list(p.get("stream", [])), key=lambda n: n)[1:]))
    sizes = sorted(set(_spread(list(p.get("comm_sizes", [])), key=lambda n: n)[1:]))
    pipes = [tuple(x) for x in p.get("pipelines", []) if x[0] == "1f1b"][:1]
    return BenchPlan(gemm=gemm, stream=stream, attention=[], comm_sizes=sizes,
                     comm_kinds=tuple(p.get("comm_kinds", ())) if sizes else (),
                     comm_window_s=float(p.get("comm_window_s", 0.1)),
                     layers=tuple(p.get("layers", ())), window_s=float(p.get("window_s", 0.3)),
                     pipelines=pipes, pipeline_steps=int(p.get("pipeline_steps", 16)),
                     gemm_probe=p.get("gemm_probe", "matmul"))  # time GEMMs as the record did


def _key(family: str, r: dict) -> tuple:
    if family == "comm":  # (comm, kind, group size, bytes): the family is the kind
        return (family, r["kind"], r["n"], r["nbytes"])
    if family == "pipelines":
        return ("pipeline", r["schedule"], r["microbatches"])
    return (family,) + tuple(r[k] for k in ("dtype", "m", "n", "k", "groups", "kind", "nbytes", "tokens") if k in r)


def _label(key: tuple) -> str:
    fam, *rest = key
    return f"{fam} " + " ".join(str(x) for x in rest)


def _family(key: tuple) -> str:
    """gemm_<dtype>, layers_<dtype>, comm_<kind>, pipeline_<schedule> or stream: the groups a
    verdict is given for."""
    return key[0] if key[0] == "stream" else f"{key[0]}_{key[1]}"


def compare(then: dict, now: dict) -> dict:
    """Probe rows (label, then s, now s, now/then) and per-family geometric means of now/then."""
    old = {_key(f, r): r["seconds"] for f in FAMILIES for r in then.get(f, [])}
    rows, logs = [], {}
    for f in FAMILIES:
        for r in now.get(f, []):
            k = _key(f, r)
            if k in old and old[k] > 0 and r["seconds"] > 0:
                ratio = r["seconds"] / old[k]
                rows.append((_label(k), old[k], r["seconds"], ratio))
                logs.setdefault(_family(k), []).append(math.log(ratio))
    fams = {k: math.exp(sum(v) / len(v)) for k, v in logs.items()}
    return {"rows": rows, "families": fams,
            "ok": bool(fams) and all(1 / TOLERANCE <= v <= TOLERANCE for v in fams.values())}


def check(spec_ref: str, *, timeout: float = 60.0, device_now: dict | None = None) -> dict:
    """Re-run the sample on the record's rank count; {'record', 'device_then', 'device_now',
    'rows', 'families', 'ok'}. Raises PiperError (no record, a rank failed)."""
    rec_path, rec = record_for(spec_ref)
    plan = sample_plan(rec)
    kind = rec.get("device", {}).get("kind", "cpu")
    if device_now is None:
        from .calibrate import _device
        device_now = _device(kind)
    now = run_benchmarks(plan, int(rec["ranks"]), kind, timeout_s=timeout)
    return {"record": str(rec_path), "timestamp": rec.get("timestamp"), "device_then": rec.get("device", {}),
            "device_now": device_now, **compare(rec["measurements"], now)}


def _machine(d: dict) -> str:
    isa = d.get("cpu_capability") or "ISA not recorded"
    return f"{d.get('name', '?')}, {d.get('cores', '?')} cores, {isa}, torch {d.get('torch', '?')}"


def report(r: dict) -> None:
    """The check as a table on stderr and a one-line verdict."""
    from rich.console import Console
    from rich.table import Table

    c = Console(stderr=True, markup=False)
    c.print(f"calibrated {r['timestamp']} on: {_machine(r['device_then'])}", highlight=False)
    c.print(f"this machine:  {_machine(r['device_now'])}", highlight=False)
    t = Table(title=f"the record's probes again ({Path(r['record']).name}), time now / then")
    for col in ("probe", "then ms", "now ms", "now / then"):
        t.add_column(col, justify="left" if col == "probe" else "right")
    for lbl, a, b, ratio in r["rows"]:
        t.add_row(lbl, f"{a * 1e3:.3f}", f"{b * 1e3:.3f}", f"{ratio:.2f}")
    c.print(t)
    fams = "  ".join(f"{k} ×{v:.2f}" for k, v in sorted(r["families"].items()))
    if r["ok"]:
        c.print(f"matches (every family within ×{TOLERANCE} of the record): {fams}", highlight=False)
    else:
        off = ", ".join(k for k, v in sorted(r["families"].items()) if not 1 / TOLERANCE <= v <= TOLERANCE)
        c.print(f"differs: {off} beyond ×{TOLERANCE} ({fams}); plans priced with this spec will not hold here: "
                "recalibrate (`piper-plan calibrate --quick -o hardware/<name>.yaml`) and plan on the new spec",
                highlight=False)
