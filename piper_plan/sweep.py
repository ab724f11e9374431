"""What-if sweeps: vary numeric hardware fields (dotted paths) and GPU counts, best plan each.

`--vary network.nic_gbps=12.5,25,50` sets that field of the hardware spec; short aliases
cover the common ones (nic_gbps, hbm_gib, peak_bf16, hbm_gbps, host_op_us, host_link_gbps, host_gib).
Every scenario re-runs the full search, so the table shows the best layout under that hardware."""
from __future__ import annotations

import itertools
import math
import re
import types
import typing
from dataclasses import replace

from pydantic import BaseModel

from .errors import SpecError
from .report import layout_str
from .search import SearchSpace, round_batch, search
from .specs.hardware import HardwareSpec
from .specs.registry import parse

ALIASES = {
    "nic_gbps": "network.nic_gbps",
    "hbm_gib": "accelerator.memory_gib",
    "memory_gib": "accelerator.memory_gib",
    "hbm_gbps": "accelerator.memory_bandwidth_gbps",
    "peak_bf16": "accelerator.peak_tflops.bf16",
    "gemm_eff": "efficiency.gemm",
    "sustained": "efficiency.sustained_matmul",  # the same GPU at another power limit (tensor-core rate held)
    "host_op_us": "efficiency.host_op_us",  # a faster (or slower) host CPU issuing an eager step
    "host_link_gbps": "host.link_gbps",  # the GPU-host link offloading copies over (C2C, PCIe)
    "host_gib": "host.memory_gib",       # host memory per GPU for offloaded state and activations
}


# the most searches one sweep runs (GPU counts x every varied field's values): each is a full search
# (0.1-1 s), and every scenario's spec is built before the first (10,000 took 140 MB), so a sweep
# past this runs for hours after holding gigabytes
MAX_SEARCHES = 100_000

# --csv's columns after the scenario's (gpus, then each varied field's dotted path), the same set
# whatever fits: tokens_per_s is the whole job's, mfu a fraction, peak_memory_gib the busiest
# rank's; a scenario where nothing fits leaves step_time_s and peak_memory_gib blank
CSV_COLUMNS = ("global_batch", "fits", "tokens_per_s", "tflops_per_gpu", "mfu", "step_time_s", "peak_memory_gib",
               "layout")


def parse_vary(items: list[str]) -> dict[str, list[float]]:
    out = {}
    for it in items:
        key, eq, vals = it.partition("=")
        if not eq or not vals or not key.strip():
            raise SpecError("--vary", it, "expected FIELD=v1,v2,... (e.g. nic_gbps=12.5,25,50)")
        field = ALIASES.get(key, key)
        if field in out:
            raise SpecError("--vary", key, "given twice: list every value in one --vary FIELD=v1,v2")
        try:
            values = [float(v) for v in vals.split(",")]
        except ValueError:
            values = [math.nan]
        if not all(math.isfinite(v) for v in values):
            raise SpecError("--vary", key, f"values must be finite numbers, got {vals!r}")
        if len(set(values)) != len(values):  # as --gpus: a repeat is a typo, and one scenario priced twice
            raise SpecError("--vary", key, f"values must be distinct, got {vals!r}")
        out[field] = values
    return out


def _numeric(owner, key) -> type | None:
    """int or float where field `key` of `owner` (a model, or a list/dict inside one) holds a
    number or may (an Optional number left at None), else None."""
    if not isinstance(owner, BaseModel) or key not in type(owner).model_fields:
        return None
    ann = type(owner).model_fields[key].annotation
    union = typing.get_origin(ann) in (typing.Union, types.UnionType)  # Optional[float], float | None
    kinds = [a for a in (typing.get_args(ann) if union else (ann,)) if a in (int, float)]
    return float if float in kinds else kinds[0] if kinds else None


def set_field(hw: HardwareSpec, path: str, value: float) -> HardwareSpec:
    """A copy of the spec with one numeric field (dotted path; list items by index) set, a
    field the spec leaves at its default (or unset, None) included."""
    # every field, those a spec's dump leaves out at their default too (specs.base._Optional), as
    # plain JSON data (tuples as lists, as in a YAML spec) so that an item can be set
    data = hw.model_dump(mode="json", context={"defaults": True})
    node, owner, parts = data, hw, path.split(".")
    try:
        for p in parts[:-1]:
            k = _index(p) if isinstance(node, list) else p
            node, owner = node[k], (owner[k] if isinstance(owner, (list, dict)) else getattr(owner, k))
            if node is None:  # an optional section (host) the spec leaves out: its other fields unknown
                raise SpecError(hw.name, path, f"the spec has no {p} section; give the whole section in a "
                                "spec file to vary one of its fields")
        last = parts[-1]
        key = _index(last) if isinstance(node, list) else last
        old = node[key]
    except (KeyError, IndexError, ValueError, TypeError):
        raise SpecError(hw.name, path, "no such field in the hardware spec (expected a dotted path such as "
                        f"network.nic_gbps or topology.0.bandwidth_gbps, or one of {', '.join(ALIASES)})") from None
    kind = type(old) if isinstance(old, (int, float)) and not isinstance(old, bool) else None
    if old is None:
        kind = _numeric(owner, key)
    if kind is None:
        raise SpecError(hw.name, path, f"not a numeric field (holds {type(old).__name__})")
    node[key] = int(value) if kind is int and float(value).is_integer() else value
    try:
        return parse(HardwareSpec, data, f"{hw.name} with {path}={value:g}")
    except SpecError as e:
        if e.field != "<root>":
            raise
        # a rule between fields (a node size no topology level has): the varied field named, and how
        # to change the fields it binds together
        why = e.expected.removeprefix("Value error, ")
        raise SpecError(f"{hw.name} with {path}={value:g}", path, f"{why}; --vary sets this field alone: write a "
                        f"spec (base: {hw.name}) that changes the fields it binds with it") from None


def _index(p: str) -> int:
    """A list item's index in a dotted path: 0, 1, ... as written so (a negative one counting from
    the end, 00 or +0, would name the same level two ways, past --vary's "given twice" check)."""
    if not re.fullmatch("0|[1-9][0-9]*", p):  # 00, +0, -1: one level named two ways (the later one won)
        raise ValueError(p)
    return int(p)


def fmt(v) -> str:
    """A scenario's value as the table prints it: an integer whole, a float to 10 digits (12.5 and
    12.5000001 apart)."""
    return str(v) if isinstance(v, int) else f"{v:.10g}"


def scenarios(hw: HardwareSpec, vary: dict[str, list[float]]) -> dict[tuple, HardwareSpec]:
    """The hardware spec of each combination of the varied values, in sweep order: a value the
    spec refuses (a negative bandwidth, zero memory) is an error before any search runs, not
    after the scenarios before it."""
    out = {}
    for vals in itertools.product(*vary.values()):
        h = hw
        for k, v in zip(vary, vals):
            h = set_field(h, k, v)
        out[vals] = h
    return out


def run_sweep(model, hw: HardwareSpec, gpus: list[int], vary: dict[str, list[float]], space: SearchSpace,
              routing=None, progress=None, headroom_gib: float = 0.0, batch_given: bool = False,
              specs: dict[tuple, HardwareSpec] | None = None) -> list[dict]:
    """One row per (gpus × varied values) scenario with the best plan found, `headroom_gib` kept free,
    at the space's global batch (the row's global_batch): as given where `batch_given`, else the
    default batch rounded to a multiple of each GPU count (a size, not a layout). `specs`:
    scenarios(hw, vary) where the caller has them already."""
    keys = list(vary)
    specs = specs or scenarios(hw, vary)  # every value checked before the first search
    rows = []
    for n, vals in itertools.product(gpus, specs):
        h = specs[vals]
        gbs = space.global_batch if batch_given else round_batch(space.global_batch, n)
        res = search(model, h, replace(space, gpus=n, global_batch=gbs), routing, headroom_gib=headroom_gib, keep=1)
        row = {"gpus": n, **dict(zip(keys, vals)), "global_batch": gbs}
        if res.best is None:
            row.update(fits=False, tokens_per_s=0.0, mfu=0.0, tflops_per_gpu=0.0, step_time_s=None,
                       peak_memory_gib=None, layout="nothing fits")
        else:
            i = res.best
            lay = res.batch.layout(i)
            row.update(fits=True, tokens_per_s=float(res.est.tokens_per_s[i]), mfu=float(res.est.mfu[i]),
                       tflops_per_gpu=float(res.est.tflops_per_gpu[i]), step_time_s=float(res.est.step_time_s[i]),
                       peak_memory_gib=float(res.est.peak_memory_gib[i]),
                       layout=layout_str(lay.model_dump()))
        del res  # one scenario's priced space at a time: the next search's would sit beside it
        rows.append(row)
        if progress:
            progress()
    return rows


def plot_lines(rows: list[dict], keys: list[str]) -> tuple[str, list[str], dict[tuple, list[dict]]]:
    """(the x axis, the other keys, {their values: the line's rows in x order}): on x the first
    varied field that takes more than one value, else the GPU counts; a scenario where nothing
    fits has no throughput to draw, so its point is left out, not drawn at zero."""
    moving = [k for k in keys if len({r[k] for r in rows}) > 1]
    x_key = moving[0] if moving else "gpus"
    others = [k for k in (["gpus"] + keys) if k != x_key]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["fits"]:
            groups.setdefault(tuple(r[k] for k in others), []).append(r)
    return x_key, others, {g: sorted(rs, key=lambda r: r[x_key]) for g, rs in groups.items()}


def plot(rows: list[dict], keys: list[str], path: str) -> None:
    """Throughput and MFU against the varied parameter(s), one line per GPU count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x_key, others, groups = plot_lines(rows, keys)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for g, rs in groups.items():
        label = ", ".join(f"{k}={fmt(v)}" for k, v in zip(others, g)) or None
        axes[0].plot([r[x_key] for r in rs], [r["tokens_per_s"] for r in rs], marker="o", label=label)
        axes[1].plot([r[x_key] for r in rs], [100 * r["mfu"] for r in rs], marker="o", label=label)
    axes[0].set_ylabel("tokens / s (best plan)")
    axes[1].set_ylabel("MFU %")
    for ax in axes:
        ax.set_xlabel(x_key)
        ax.grid(alpha=0.3)
    if groups and others:  # one line too says which GPU count (or value) it is: another may fit nothing
        axes[1].legend(fontsize=7)
    fig.tight_layout()
    from .files import atomic_write_bytes, image_format

    import io

    buf = io.BytesIO()
    fig.savefig(buf, format=image_format(path), dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue(), "--plot")
