"""validate --plot: the priced rows as a picture. Left, predicted against published on log axes
(each row in its own metric, so the diagonal is exact agreement and the bands are the issue's
±20 % and ±35 % targets); right, the throughput rows' signed errors (+: the model too fast, an
error's sign flipped for an iteration time, its size validate's own), dense and MoE apart; rows
a hardware figure was set from (in-sample) drawn apart and left out of the errors."""
from __future__ import annotations

import io

import numpy as np

KIND_COLOURS = {"dense": "tab:blue", "moe": "tab:orange", "memory": "tab:green"}


def plot(results, path: str, title: str = "piper-plan validate") -> None:
    """Write the figure of `results` (validate.Result) to `path` as a PNG, atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .files import atomic_write_bytes, image_format

    priced = [r for r in results if np.isfinite(r.predicted) and r.published > 0 and r.predicted > 0]
    fig, (ax, hx) = plt.subplots(1, 2, figsize=(12, 5))
    if priced:
        lo = min(min(r.published, r.predicted) for r in priced) / 1.5
        hi = max(max(r.published, r.predicted) for r in priced) * 1.5
        x = np.geomspace(lo, hi, 50)
        ax.plot(x, x, color="black", lw=0.8)
        for band, alpha in ((0.20, 0.18), (0.35, 0.08)):
            ax.fill_between(x, x * (1 - band), x * (1 + band), color="grey", alpha=alpha, lw=0,
                            label=f"±{100 * band:.0f} %")
        for kind, colour in KIND_COLOURS.items():
            rs = [r for r in priced if r.kind == kind and not r.fit]
            if rs:
                ax.scatter([r.published for r in rs], [r.predicted for r in rs], s=14, color=colour,
                           label=f"{kind} ({len(rs)})", edgecolors="none")
        fitted = [r for r in priced if r.fit]
        if fitted:
            ax.scatter([r.published for r in fitted], [r.predicted for r in fitted], s=30, marker="x",
                       color="black", label=f"in-sample ({len(fitted)})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    ax.set_xlabel("published (each row's own metric)")
    ax.set_ylabel("predicted")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    bins = np.arange(-60, 65, 5)
    for kind in ("dense", "moe"):
        e = [_signed(r) for r in priced if r.kind == kind and not r.fit]
        if e:
            hx.hist(np.clip(e, bins[0], bins[-1]), bins=bins, alpha=0.6, color=KIND_COLOURS[kind],
                    label=f"{kind}: {len(e)} rows, MAPE {np.mean(np.abs(e)):.1f} %")
    for v in (-35, -20, 20, 35):
        hx.axvline(v, color="grey", lw=0.8, ls="--")
    hx.set_xlabel("signed throughput error, % (+: the model too fast; ends clipped)")
    hx.set_ylabel("rows")
    hx.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format=image_format(path), dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue(), "--plot")


def _signed(r) -> float:
    """validate's error of a row, signed so that + is the model too fast (an iteration time's flipped)."""
    return -r.error_pct if r.is_time else r.error_pct

