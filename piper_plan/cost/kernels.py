"""Time of one kernel from its shape: a roofline with wave quantisation and a fixed cost.

A GEMM C[m×n] = A[m×k]·B[k×n] (`groups` independent ones, as in a grouped expert GEMM):

    t = max(FLOPs / (peak · e_gemm · e_wave),  bytes / (HBM · e_mem)) + overhead + overhead_dtype

- e_gemm: the plateau fraction of peak large GEMMs reach (hardware YAML, from published
  micro-benchmarks; efficiency.gemm_dtype where a dtype's or an FP8 recipe's differs), times
  efficiency.sustained_matmul: those benchmarks time short bursts at boost clock, while a
  training step holds the tensor cores busy long enough for the power limit to pull the clock
  down (the fused attention plateaus take the same factor). `burst(hw)` prices a benchmark's
  short runs instead;
- e_wave: output tiles run in waves of `compute_units`; a partial last wave and tile padding
  waste the rest (NVIDIA, "Matrix Multiplication Background User's Guide", wave and tile
  quantisation). The tile's m side shrinks to the next power of two ≥ 16 when m is small,
  as GEMM libraries pick narrow tiles for skinny problems;
- overhead_dtype: efficiency.gemm_overhead_us[dtype] (0 unless measured): a cost per GEMM, so
  per group of a grouped call, that some dtypes pay on some machines (a CPU's bf16 GEMM
  repacks both operands of every GEMM);
- bytes: A, B and C once each (the minimum traffic), so skinny expert GEMMs become
  memory-bound — the physical reason they run below a large square GEMM;
- streams: how many of the `groups` GEMMs are in flight at once when they launch as separate
  kernels (0: all, one grouped kernel). Separate kernels quantise into waves on their own: a
  batch of `streams` GEMMs shares waves, the batches run one after another, and each batch
  pays a launch (Transformer Engine's per-expert cuBLAS GEMMs on 4 streams; a Python loop: 1).

All arguments broadcast as numpy arrays; times in seconds.
"""
from __future__ import annotations

import numpy as np

from ..specs.hardware import HardwareSpec


def burst(hw: HardwareSpec) -> HardwareSpec:
    """The spec as a short benchmark sees it: kernels at the burst rate its plateaus were measured
    at (efficiency.sustained_matmul = 1), for checks against per-kernel timing tables."""
    if hw.efficiency.sustained_matmul == 1.0:
        return hw
    return hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"sustained_matmul": 1.0})})


def _ceil_div(a, b):
    return np.ceil(np.true_divide(a, b))


def gemm_time(hw: HardwareSpec, m, n, k, *, groups=1, dtype: str = "bf16", elt_bytes=2, streams=0,
              recipe: str | None = None):
    """Seconds for `groups` GEMMs of output m×n and reduction k (arrays broadcast), launched as
    one grouped kernel (streams 0) or as separate kernels, `streams` in flight at once. `dtype`
    names the peak; `recipe` (an FP8 recipe: mxfp8, fp8_blockwise) the plateau where the spec
    measures one apart (block-scaled GEMMs run below per-tensor FP8 on the same tensor cores)."""
    m = np.maximum(np.asarray(m, dtype=float), 0.0)
    n = np.asarray(n, dtype=float)
    k = np.asarray(k, dtype=float)
    g = np.asarray(groups, dtype=float)
    eff = hw.efficiency
    tm0, tn = eff.gemm_tile
    tm = np.clip(2.0 ** np.ceil(np.log2(np.maximum(m, 1.0))), 16.0, tm0)
    per = _ceil_div(np.ceil(m), tm) * _ceil_div(n, tn)  # output tiles of one GEMM
    cu = hw.accelerator.compute_units
    s = np.asarray(streams, dtype=float)
    conc = np.where(s > 0, np.minimum(s, g), g)  # GEMMs sharing waves
    full = np.floor(g / np.maximum(conc, 1.0))   # batches of `conc` GEMMs, then a partial one
    rest = g - full * conc
    waves = np.maximum(full * _ceil_div(conc * per, cu) + _ceil_div(rest * per, cu), 1.0)
    launches = np.where(s > 0, full + (rest > 0), 1.0)
    useful = g * m * n
    e_wave = np.where(useful > 0, useful / (waves * cu * tm * tn), 1.0)
    flops = 2.0 * g * m * n * k
    plateau = eff.gemm_dtype.get(recipe, eff.gemm_dtype.get(dtype, eff.gemm))
    t_flop = flops / (hw.peak_flops(dtype) * plateau * eff.sustained_matmul * np.maximum(e_wave, 1e-9))
    t_mem = g * (m * k + k * n + m * n) * elt_bytes / (hw.accelerator.memory_bandwidth_gbps * 1e9 * eff.memory)
    # fixed cost: one launch per grouped call or per batch of concurrent kernels (their launches
    # overlap), plus the dtype's own per-GEMM cost where measured (a CPU's bf16 GEMM repacks
    # each operand pair, so a grouped call pays it once per group)
    fixed = (launches * eff.kernel_overhead_us + g * eff.gemm_overhead_us.get(dtype, 0.0)) * 1e-6
    t = np.maximum(t_flop, t_mem) + fixed
    return np.where(flops > 0, t, 0.0)


def stream_time(hw: HardwareSpec, nbytes, kernels=1):
    """Seconds for memory-bound kernels moving `nbytes` through memory in total. Where the
    spec has a cache (accelerator.cache_mib, measured on CPUs by calibrate), the call's bytes
    are its working set: up to the cache they stream at efficiency.memory, beyond it at
    efficiency.memory_dram (a layer's weight casts outgrow a CPU rank's cache share; its
    activations of a small model do not)."""
    nbytes = np.asarray(nbytes, dtype=float)
    acc, eff = hw.accelerator, hw.efficiency
    bw = acc.memory_bandwidth_gbps * 1e9 * eff.memory
    fixed = np.asarray(kernels) * eff.kernel_overhead_us * 1e-6
    if acc.cache_mib is None or eff.memory_dram is None:
        return nbytes / bw + fixed
    cached = np.minimum(nbytes, acc.cache_mib * 2.0**20)
    return cached / bw + (nbytes - cached) / (acc.memory_bandwidth_gbps * 1e9 * eff.memory_dram) + fixed


def attention_plateau(hw: HardwareSpec, kernel: str = "flash") -> tuple[float, float, float]:
    """(forward, backward, softmax share) of the fused attention `kernel` (Layout.attention_kernel):
    flash, the spec's own (efficiency.attention, attention_bwd, attention_softmax_share); fa2,
    FlashAttention-2's (efficiency.attention_fa2; HardwareSpec.require_attention refuses a spec
    without it)."""
    eff = hw.efficiency
    if kernel == "fa2":
        hw.require_attention(kernel)
        fa = eff.attention_fa2
        return fa.forward, fa.backward if fa.backward is not None else fa.forward, fa.softmax_share
    return eff.attention, eff.attention_bwd if eff.attention_bwd is not None else eff.attention, \
        eff.attention_softmax_share


def tile_cost(c, seq, window=None, cp=1, causal: bool = True, block: int = 128, comm: str = "p2p"):
    """Tiles of work a fused attention kernel spends per counted tile (a block x block square of
    the (query, key) pairs ModelSpec.attended_keys counts), c tiles of fixed cost a query block's
    pass (Efficiency.attention_blocks). The kernel pads its queries and keys to whole tiles,
    computes every tile its mask touches whole and makes a pass a query block: causal over s
    tokens, Q = ceil(s/b) query blocks touch Q(Q+1)/2 tiles against the s²/2 counted, so for
    long sequences (n + 1 + 2c) / n tiles a counted one (n = s/b); unmasked, Q² against s²; a
    causal window of w tokens touches ceil((w−1)/b) + 1 key blocks a query block (fewer at the
    sequence's start) against the s·w − w²/2 counted.
    Under context parallelism over cp ranks (Layout.cp_comm, Transformer Engine's
    context_parallel.py) a rank holds two chunks of L = s/2cp tokens, one from each end, and the
    layer waits for its slowest rank; that rank's time times cp, over the counted tiles, is what
    this returns:
    - p2p (AttnFuncWithCPAndKVP2P, the ring): cp kernels over the rank's chunks joined end to end:
      its own 2L tokens causal (Q0 = ceil(2L/b) query blocks), then at each step i either all 2L
      queries against the first of the arriving pair's chunks (i <= rank; m = ceil(L/b) key
      blocks) or its second chunk's queries against both. The last rank takes the first branch at
      every step: Q0(Q0+1)/2 + (cp−1)·Q0·m tiles and cp passes of Q0 query blocks. No window
      (Transformer Engine runs local attention under all_gather or a2a only): cp must be 1 with one.
    - all_gather (AttnFuncWithCPAndKVAllGather): two kernels a rank, chunk j's L queries
      (q = ceil(L/b) blocks) against keys [0, (j+1)L) bottom-right causal: (q−1)·ceil(jL/b) +
      q(q−1)/2 + ceil((j+1)L/b) tiles, j = r and 2cp−1−r; one pass over each chunk's query
      blocks. A window reaches the same ceil((w−1)/b) key blocks back from each query block,
      chunks taken as starting on a block's edge.
    - a2a (AttnFuncWithCPAndQKVOA2A, Ulysses): one kernel over the whole sequence on heads/cp
      heads, priced as cp 1's. a2a+p2p is priced as p2p over cp/cp_a2a ranks (compute.attention_tiles:
      after the all-to-all a rank holds its group's chunks as the two of a ring that size).
    All arguments but `causal`, `block` and `comm` broadcast."""
    s = np.maximum(np.asarray(seq, dtype=float), 1.0)
    cp = np.asarray(cp, dtype=float)
    if comm == "a2a":
        cp = np.ones_like(cp)
    elif comm == "all_gather":
        return _gathered_tiles(c, s, window, cp, causal, block)
    if window is not None and (np.any(cp > 1) or not causal):
        raise ValueError("tile_cost: a window is causal and runs no context-parallel ring (cp 1)")
    q0 = np.ceil(s / (cp * block))          # a rank's query blocks, its two chunks joined
    m = np.ceil(s / (2.0 * cp * block))     # one chunk's key blocks
    fixed = c * cp * cp * q0                # cp passes of q0 on the last rank, times cp
    if not causal:                          # every step all queries against all the sender's keys
        return (cp * cp * q0 * q0 + fixed) / (s / block) ** 2
    if window is None:
        return (cp * (q0 * (q0 + 1.0) / 2.0 + (cp - 1.0) * q0 * m) + fixed) / ((s / block) ** 2 / 2.0)
    w = np.minimum(np.asarray(window, dtype=float), s)
    k = np.minimum(np.ceil((w - 1.0) / block), q0)  # earlier key blocks a query block reaches
    touched = k * (k + 1.0) / 2.0 + (q0 - k) * (k + 1.0)
    return (touched + fixed) / ((s * w - w * w / 2.0) / block ** 2)


def _gathered_tiles(c, s, window, cp, causal: bool, block: int):
    """tile_cost under all_gather context parallelism (its docstring): the slowest rank's two
    chunk kernels, times cp, over the counted tiles."""
    L = s / (2.0 * cp)
    q = np.ceil(L / block)
    counted = (s / block) ** 2 / 2.0 if window is None else None
    if not causal:  # both chunks' queries against every key
        return cp * (2.0 * q * np.ceil(s / block) + c * 2.0 * q) / (s / block) ** 2
    if window is not None:
        w = np.minimum(np.asarray(window, dtype=float), s)
        k = np.ceil((w - 1.0) / block)
        counted = (s * w - w * w / 2.0) / block ** 2

        def before(n):  # sum over query blocks g < n of the earlier key blocks each reaches, min(k, g)
            n = np.maximum(n, 0.0)
            return np.where(n <= k + 1.0, n * (n - 1.0) / 2.0, k * (k + 1.0) / 2.0 + (n - k - 1.0) * k)

        def chunk(j):
            g0 = np.floor(j * L / block)
            return q + before(g0 + q) - before(g0)
    else:
        def chunk(j):
            return (q - 1.0) * np.ceil(j * L / block) + q * (q - 1.0) / 2.0 + np.ceil((j + 1.0) * L / block)
    worst = np.zeros(np.broadcast(s, cp).shape)
    for r in range(int(np.max(cp))):  # each rank's pair of chunks, r and 2cp-1-r, where it exists
        worst = np.where(r < cp, np.maximum(worst, chunk(r) + chunk(2.0 * cp - 1.0 - r)), worst)
    return cp * (worst + c * 2.0 * q) / counted


def _blocks(hw: HardwareSpec, kernel: str):
    """The fused `kernel`'s block costs on `hw` (None: one rate): the spec's own kernel's
    (Efficiency.attention_blocks), or FlashAttention-2's (attention_fa2.blocks)."""
    eff = hw.efficiency
    if kernel == "fa2":
        return eff.attention_fa2.blocks if eff.attention_fa2 is not None else None
    return eff.attention_blocks if kernel == "flash" else None


def block_factor(hw: HardwareSpec, seq, window=None, cp=1, causal: bool = True, kernel: str = "flash",
                 comm: str = "p2p"):
    """(forward, backward) time per counted FLOP of the fused `kernel` with this mask, under
    context parallelism of cp ranks moving keys by `comm` (Layout.cp_comm), over its time where
    the spec measured its plateau (causal at blocks.seq tokens, one rank): tile_cost at each
    pass's fixed cost. 1 where the spec states no block costs for the kernel."""
    bl = _blocks(hw, kernel)
    if bl is None:
        return 1.0, 1.0
    out = []
    for c in (bl.forward, bl.backward if bl.backward is not None else bl.forward):
        out.append(tile_cost(c, seq, window, cp, causal, bl.block, comm) / tile_cost(c, bl.seq, block=bl.block))
    return out[0], out[1]


def has_blocks(hw: HardwareSpec, kernel: str = "flash") -> bool:
    """Whether the spec prices `kernel`'s rate by its mask (block_factor is not 1)."""
    return _blocks(hw, kernel) is not None


def head_dim_slowdown(hw: HardwareSpec, dqk=None, dv=None, kernel: str = "flash"):
    """How much slower than its plateau a fused attention kernel runs per FLOP with heads of
    query-key width dqk and value width dv, below the head dimension the spec measured its
    plateau at (efficiency.attention_head_dim): each score element costs its softmax work
    whatever the head, and 2·(dqk + dv) matmul FLOPs, so the softmax's share of the time grows as
    heads narrow: 1 + share·(2·ref / (dqk + dv) − 1) (the kernel's share: attention_plateau). Wider
    heads than measured are not credited (kernels change tiles there)."""
    eff = hw.efficiency
    if dqk is None or eff.attention_head_dim is None:
        return 1.0
    width = (np.asarray(dqk, dtype=float) + np.asarray(dv if dv is not None else dqk, dtype=float)) / 2.0
    share = attention_plateau(hw, kernel)[2]
    return 1.0 + share * np.maximum(eff.attention_head_dim / width - 1.0, 0.0)


def flash_attention_time(hw: HardwareSpec, flops, dtype: str = "bf16", dqk=None, dv=None, kernel: str = "flash"):
    """Fused attention forward: FLOPs at the `kernel`'s plateau (attention_plateau) held under the
    power limit (efficiency.sustained_matmul; one kernel), slower for narrow heads (head_dim_slowdown)."""
    flops = np.asarray(flops, dtype=float)
    eff = hw.efficiency
    fwd = attention_plateau(hw, kernel)[0]
    return (flops * head_dim_slowdown(hw, dqk, dv, kernel) / (hw.peak_flops(dtype) * fwd * eff.sustained_matmul)
            + eff.kernel_overhead_us * 1e-6)


def flash_attention_bwd_time(hw: HardwareSpec, flops, rows, dtype: str = "bf16", dqk=None, dv=None,
                             kernel: str = "flash"):
    """Fused attention backward for a forward of `flops` over `rows` query rows × heads:
    2.5× the forward's FLOPs (FlashAttention-2 runs five GEMMs to the forward's two) at the
    `kernel`'s backward plateau (attention_plateau; flash: efficiency.attention_bwd, default the
    forward's) held under the power limit, plus
    efficiency.attention_bwd_row_us per query row per head — a fixed cost that a CPU's
    backward kernel pays whatever the sequence length (measured by calibrate: the bundled
    hardware/cpu-local.yaml, calibrated 2026-12-02 with 8 ranks sharing 2 cores, holds 12.76 µs
    per row per head).
    Narrow heads slow it as they slow the forward (head_dim_slowdown)."""
    eff = hw.efficiency
    e = attention_plateau(hw, kernel)[1] * eff.sustained_matmul
    flops = np.asarray(flops, dtype=float)
    return (2.5 * flops * head_dim_slowdown(hw, dqk, dv, kernel) / (hw.peak_flops(dtype) * e)
            + np.asarray(rows, dtype=float) * eff.attention_bwd_row_us * 1e-6
            + eff.kernel_overhead_us * 1e-6)
