"""Why a search found nothing that fits, and what would make it fit: the leanest layout's
largest parts, then the nearest changes that do fit (the optimizer state on the host, FP8
weights, more GPUs, shorter sequences), each a search of its own. Apart from search.py, which
enumerates and prices; this module only reads its results and asks it again."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from . import search as S
from .layout import degrees_label
from .cost.estimate import Routing
from .search import SearchResult, SearchSpace
from .specs.hardware import HardwareSpec
from .specs.model import ModelSpec


def diagnose(m: ModelSpec, hw: HardwareSpec, sp: SearchSpace, res: SearchResult, routing: Routing | None = None,
             headroom_gib: float = 0.0) -> list[str]:
    """Why nothing fits, and what would make it fit — each line computed from the model."""
    lines = []
    if res.est is None:
        # every layout was dropped by the state-memory bound: price them all, slice by slice
        every = S.enumerate_slices(m, hw, sp, {}, None, S.ENUM_CELLS)
        sub, est, _, _, _ = S._price_kept(m, hw, every, routing, "throughput", headroom_gib, 1, np.zeros(3, int))
        if est is not None:
            res = S.SearchResult(sub, est, np.array([], int), res.rejected)  # the leanest, below
    if res.est is None:
        top = sorted(res.rejected.items(), key=lambda kv: -kv[1])
        lines.append(f"no layout of {sp.gpus} GPUs satisfies the layout rules; removed by: "
                     + "; ".join(f"{k} ({v})" for k, v in top))
        if any("global batch" in k for k in res.rejected):
            ok = [d for d in S._divisors(sp.gpus) if sp.global_batch % d == 0]
            lines.append(f"global batch {sp.global_batch} splits over dp in {ok} only; use a multiple of "
                         f"{sp.gpus} sequences for full data parallelism")
        return lines
    est = res.est
    avail = hw.accelerator.memory_gib - headroom_gib
    if hw.memory_overhead_gib >= avail:  # (a what-if scenario may shrink the device so far: a spec may not say so)
        lines.append(f"nothing fits on any number of GPUs: the spec's reserve (memory_overhead_gib "
                     f"{hw.memory_overhead_gib:g} GiB) fills the {avail:g} GiB available on each")
        return lines
    piper_train = sp.runtime == "piper-train"  # (hints name only options the runtime runs)
    i = int(np.argmin(est.peak_memory_gib))
    lay = res.batch.layout(i)
    row = est.row(i)
    worst = max(row["memory_gib_per_stage"], key=lambda d: d["total"])
    comps = sorted(((k, v) for k, v in worst.items() if k not in ("stage", "role", "total", "host")),
                   key=lambda kv: -kv[1])
    lines.append(f"nothing fits: the leanest layout ({degrees_label(lay)} mbs{lay.mbs} "
                 f"{lay.schedule} recompute={lay.recompute} zero{lay.zero}) needs {row['peak_memory_gib']:.1f} GiB on "
                 f"stage {worst['stage']}, {avail:.1f} GiB available; largest parts: "
                 + ", ".join(f"{k} {v:.1f}" for k, v in comps[:3]))
    states = sum(worst[k] for k in ("weights", "grads", "master", "optimizer"))
    if states > avail:
        lines.append(f"parameter + optimizer state alone is {states:.1f} GiB per GPU: only more GPUs "
                     "(more pipeline/expert sharding)" + (" or the host's memory" if hw.host is not None and
                                                           not piper_train else "")
                     + " can fix that")
    if hw.host is not None and max(sp.optimizer_offload) < 1.0 and not piper_train:  # where the spec gives a host
        r1 = S.search(m, hw, replace(sp, optimizer_offload=(1.0,)), routing, "throughput", headroom_gib, keep=1)
        if r1.best is not None:
            lines.append(f"fits with the optimizer state in host memory (--optimizer-offload 1): best "
                         f"{r1.est.tokens_per_s[r1.best]:,.0f} tokens/s")
    if sp.fp8 != "none" and not sp.fp8_params and not piper_train:  # bf16 weights beside their FP8 copies
        r_f = S.search(m, hw, replace(sp, fp8_params=True), routing, "throughput", headroom_gib, keep=1)
        if r_f.best is not None:
            lines.append(f"fits with the weights kept in FP8 (--fp8-params, Megatron's --fp8-param-gather): best "
                         f"{r_f.est.tokens_per_s[r_f.best]:,.0f} tokens/s")
    for f in (2, 4, 8, 16, 32, 64):
        n2 = sp.gpus * f
        if hw.max_gpus and n2 > hw.max_gpus:
            lines.append(f"no fit up to the machine's {hw.max_gpus} GPUs (max_gpus)" if f > 2 or sp.gpus < hw.max_gpus
                         else f"no more GPUs on this machine (max_gpus {hw.max_gpus})")
            break
        # the batch asked for first; a larger one only where that batch cannot occupy the GPUs, and said
        gb2 = sp.global_batch
        r2 = S.search(m, hw, replace(sp, gpus=n2), routing, "throughput", headroom_gib, keep=1)
        if r2.best is None and gb2 < n2:
            gb2 = n2
            r2 = S.search(m, hw, replace(sp, gpus=n2, global_batch=n2), routing, "throughput", headroom_gib, keep=1)
        if r2.best is not None:
            if gb2 == sp.global_batch:  # the fewest whole nodes past the last count that did not fit
                n2, r2 = _fewest(m, hw, sp, routing, headroom_gib, n2 // 2, n2, r2)
            lines.append(f"fits with {n2} GPUs ({n2 - sp.gpus} more), best {r2.est.tokens_per_s[r2.best]:,.0f} tokens/s"
                         + (f" at a global batch of {gb2} sequences" if gb2 != sp.global_batch else ""))
            break
    else:
        lines.append(f"no fit up to {sp.gpus * 64} GPUs")
    if states <= avail:
        for div in (2, 4, 8):
            if sp.seq // div < 128:
                break
            r3 = S.search(m, hw, replace(sp, seq=sp.seq // div, global_batch=sp.global_batch * div), routing,
                        "throughput", headroom_gib, keep=1)
            if r3.best is not None:
                lines.append(f"fits with sequence length {sp.seq // div} (same tokens per step): activations "
                             "shrink with fewer tokens per micro-batch")
                break
    return lines


def _fewest(m: ModelSpec, hw: HardwareSpec, sp: SearchSpace, routing, headroom_gib: float, lo: int, hi: int, found):
    """(GPUs, SearchResult): the fewest whole nodes' worth of GPUs above `lo` (where nothing fit)
    at which a plan fits, bisected up to `hi` (where `found` fits); fitting need not be monotone
    in the count (the batch must split over dp), so it is a count found to fit, not a bound."""
    g = hw.gpus_per_node
    while True:
        mid = (lo + hi) // 2 // g * g
        if mid <= lo:
            mid = lo + g - lo % g if lo % g else lo + g
        if mid >= hi:
            return hi, found
        r = S.search(m, hw, replace(sp, gpus=mid), routing, "throughput", headroom_gib, keep=1)
        if r.best is not None:
            hi, found = mid, r
        else:
            lo = mid
