"""Compute time of one layer for one micro-batch on one rank, vectorised over layouts.

Per rank: attention and dense FFN see all t = mbs·seq/cp tokens of the micro-batch (its share
of each sequence under context parallelism; attention's queries against the whole sequence),
their weights split over tp (Megatron column/row parallel); the MoE block sees t/tp tokens
(sequence-parallel split; Megatron requires SP for MoE with tp > 1) and runs E/ep local
experts on the tokens routed to them, the straggler rank holding `imb` × the mean; under
expert tensor parallelism (etp > 1) on its etp group's tokens, f/etp of each expert's width.

Backward = dgrad + wgrad GEMMs (each priced by its own shape), flash attention backward
2.5× its forward (FlashAttention-2, arXiv 2307.08691 §3.1: five matmuls against two), and
elementwise backward 2× forward bytes (read grad and saved input, write grad).
Returns seconds: forward, backward-input (B), backward-weight (W, separable for
zero-bubble schedules) and recompute (added to backward under recompute).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..specs.hardware import HardwareSpec
from ..specs.model import ModelSpec
from . import eager as eager_traffic
from .activations import expected_pad
from .batch import CP_COMMS, EXPERT_GEMM_STREAMS, LayoutBatch, per_expert_launch, recomputes
from .kernels import (block_factor, flash_attention_bwd_time, flash_attention_time, gemm_time, has_blocks,
                      stream_time)


class Phase:
    """Seconds per micro-batch: forward, backward-input, backward-weight, recompute — held
    as one [4, N] array so adding and scaling phases is one numpy operation, not four."""

    __slots__ = ("v",)

    def __init__(self, f, b, w, r):
        parts = (f, b, w, r)
        self.v = np.empty((4,) + np.broadcast(*parts).shape)  # np.broadcast: in C, unlike broadcast_shapes
        for i, x in enumerate(parts):
            self.v[i] = x

    @classmethod
    def _of(cls, v: np.ndarray) -> "Phase":
        p = cls.__new__(cls)
        p.v = v
        return p

    f = property(lambda self: self.v[0])
    b = property(lambda self: self.v[1])
    w = property(lambda self: self.v[2])
    r = property(lambda self: self.v[3])

    def __add__(self, o: "Phase") -> "Phase":
        return Phase._of(self.v + o.v)

    def take(self, idx) -> "Phase":
        return Phase._of(self.v.take(idx, axis=1))  # a fancy index on the second axis costs several times more

    def scale(self, x) -> "Phase":
        return Phase._of(self.v * x)

    @property
    def total(self) -> np.ndarray:
        v = self.v
        return v[0] + v[1] + v[2] + v[3]  # cheaper than a strided v.sum(0)

    @property
    def bwd(self):
        return self.b + self.w + self.r


# FP8 recipes (Transformer Engine): bytes moved per quantised element and kernels per quantised
# tensor. Current scaling: an amax pass (read 2 B), then a cast that reads 2 B and writes the
# fp8 copy and its transpose (1 + 1 B; no transpose where FP8 GEMMs take any operand layout,
# Accelerator.fp8_any_layout: TE's quantizers then write one copy). MXFP8: one pass computes
# the 1x32 block scales as it casts, writing row- and column-wise copies (1 + 1 B) and their
# E8M0 scales (2 x 1/32 B).
# Blockwise (DeepSeek-V3 report §3.3.2: 1x128 activation tiles; TE Float8BlockScaling): one pass
# writing row- and column-wise copies (1 + 1 B) and their fp32 scales (2 x 4/128 B).
FP8_QUANT = {"fp8": (6.0, 2.0), "mxfp8": (2.0 + 2.0 + 2.0 / 32.0, 1.0), "fp8_blockwise": (2.0 + 2.0 + 8.0 / 128.0, 1.0)}


def gemm_dtype(dtype: str) -> str:
    """The peak a GEMM of the compute dtype runs at (MXFP8 uses the fp8 tensor cores)."""
    return "fp8" if dtype in FP8_QUANT else dtype


def base_dtype(dtype: str) -> str:
    """Where an FP8 recipe keeps the attention core, router and LM head: bf16."""
    return "bf16" if dtype in FP8_QUANT else dtype


def _linears(hw, dtype, eb, *shapes) -> list[Phase]:
    """Linear layers y[m×n] = x[m×k]·W[k×n], each shape (m, n_out, k_in), (m, n_out, k_in,
    groups) or (m, n_out, k_in, groups, streams) (gemm_time's streams: 0 = one grouped kernel):
    one Phase of forward, dgrad and wgrad per layer, all their GEMMs priced in one vectorised
    gemm_time call (a call per GEMM costs more in numpy overhead than in work)."""
    full = [(*s[:3], s[3] if len(s) > 3 else 1, s[4] if len(s) > 4 else 0) for s in shapes]
    shape = np.broadcast(eb, *(x for s in full for x in s)).shape
    # [m, n, k, groups, streams, element bytes] of every GEMM, each layer's forward (m×n, k),
    # dgrad (m×k, n) and wgrad (k×n, m) in turn (the backward launches as the forward does),
    # filled by broadcasting into one buffer: np.broadcast_arrays and a concatenate per call cost more
    cols = np.empty((6, 3 * len(shapes)) + shape)
    for i, (m, n_out, k_in, groups, st) in enumerate(full):
        for j, mnk in enumerate(((m, n_out, k_in), (m, k_in, n_out), (k_in, n_out, m))):
            for d, x in enumerate(mnk):
                cols[d, 3 * i + j] = x
        cols[3, 3 * i:3 * i + 3] = groups
        cols[4, 3 * i:3 * i + 3] = st
    cols[5] = eb
    m, n, k, g, st, e = (c.reshape((-1,) + shape[1:]) for c in cols)
    t = gemm_time(hw, m, n, k, groups=g, dtype=gemm_dtype(dtype), elt_bytes=e, streams=st,
                  recipe=dtype).reshape(len(shapes), 3, -1)
    v = np.zeros((len(shapes), 4, t.shape[-1]))
    v[:, :3] = t
    if dtype in FP8_QUANT:
        # an FP8 recipe quantises each GEMM's bf16 input in the forward and its output gradient
        # in the backward (FP8_QUANT). Weights are quantised once per step and cached across
        # micro-batches: not counted. Separately launched expert GEMMs quantise each expert's
        # rows apart (GroupedLinear keeps a quantizer per GEMM): kernels per expert, not per call.
        qbytes, qkernels = FP8_QUANT[dtype]
        if dtype == "fp8" and hw.accelerator.fp8_any_layout:
            qbytes -= 1.0  # the cast writes no transpose (FP8_QUANT)
        eff = hw.efficiency
        qbytes *= eff.memory / (eff.quant_memory or eff.memory)  # streamed below the copy rate where measured
        fwd = lambda x: x.reshape(len(shapes), 3, -1)[:, 0]  # noqa: E731  (the forward GEMMs' rows)
        fwd_in, grad_out = fwd(m * k * g), fwd(m * n * g)  # inputs m x k_in; output gradients m x n_out
        kernels = qkernels * fwd(np.where(st > 0, g, 1.0))
        v[:, 0] += stream_time(hw, qbytes * fwd_in, kernels)
        v[:, 1] += stream_time(hw, qbytes * grad_out, kernels)
    return [Phase._of(x) for x in v]


def _sum(phases: list[Phase]) -> Phase:
    """Phases added in order."""
    out = phases[0]
    for p in phases[1:]:
        out = out + p
    return out


def _eager_or(hw: HardwareSpec, lay: LayoutBatch, ew: Phase, eager_fb) -> Phase:
    """`ew` (the fused stack's elementwise passes), or where piper-train's eager traffic is
    priced (cost/eager.py applies) the (forward, backward) seconds `eager_fb()` returns."""
    on = eager_traffic.applies(hw, lay)
    if not on.any():
        return ew
    f, b = eager_fb()
    return Phase._of(np.where(on[None, :], Phase(f, b, 0.0, 0.0).v, ew.v))


def _elementwise(hw, nbytes, kernels) -> Phase:
    """Fused elementwise passes of `nbytes` forward, twice that backward: an approximation. Fused
    kernels measured on H100 (Liger-Kernel benchmark/data/h100_all_benchmark_data.csv, bf16)
    run RMSNorm's backward at 1.74x its forward (hidden 16,384, 2,048 rows) and RoPE's at 1.0x;
    counting each op's bytes instead (a norm's backward reads dy and x and writes dx: 1.5x; a
    residual add, dropout and RoPE 1x; SwiGLU 5/3) moved validate's MoE rows 11.5 -> 12.4 % and
    its dense rows 7.1 -> 7.3 % (branch ew-backward), so the count was not adopted: the measured
    norm's backward runs slower than its bytes."""
    f = stream_time(hw, nbytes, kernels)
    z = np.zeros_like(f)
    return Phase(f, 2.0 * f, z, z)


def _attention_shapes(m: ModelSpec, lay: LayoutBatch) -> list[tuple]:
    """The attention block's linear layers (_linears shapes): q/k/v (MLA: its down and up
    projections) and the output projection, last."""
    t = lay.tokens
    tp = lay.tp.astype(float)
    d, H = m.hidden_size, m.num_heads
    if m.mla is not None:
        a = m.mla
        qk, nope = a.qk_nope_head_dim + a.qk_rope_head_dim, a.qk_nope_head_dim
        shapes = [(t, a.kv_lora_rank + a.qk_rope_head_dim, d),  # kv down: replicated
                  (t, H * (nope + a.v_head_dim) / tp, a.kv_lora_rank)]
        if a.q_lora_rank:
            shapes += [(t, a.q_lora_rank, d), (t, H * qk / tp, a.q_lora_rank)]
        else:
            shapes += [(t, H * qk / tp, d)]
    else:
        shapes = [(t, m.qkv_dim_per_rank(tp), d)]  # a whole kv head a rank where tp exceeds them
    return shapes + [(t, d, m.attn_out_dim / tp)]


def _ffn_shapes(m: ModelSpec, lay: LayoutBatch) -> list[tuple]:
    """The dense FFN's linear layers: up (and gate), down."""
    t = lay.tokens
    tp = lay.tp.astype(float)
    d, f = m.hidden_size, m.ffn_size
    return [(t, (2 if m.ffn_gated else 1) * f / tp, d), (t, d, f / tp)]


def _block_linears(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, dtype: str) -> tuple[list, list]:
    """The attention block's and the dense FFN's linear layers, one Phase each in _attention_shapes'
    and _ffn_shapes' order (the FFN's list empty without one)."""
    attn = _linears(hw, dtype, lay.act_bytes, *_attention_shapes(m, lay))
    return attn, _linears(hw, dtype, lay.act_bytes, *_ffn_shapes(m, lay)) if m.ffn_size else []


def tp_overlappable(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, dtype: str) -> tuple[Phase, Phase]:
    """(attention block, dense FFN) linear-layer seconds per micro-batch: the GEMMs a
    tensor-parallel collective can run behind when the runtime splits it into chunks and
    pipelines them with the GEMM beside it (Layout.tp_comm_overlap)."""
    attn, ffn = _block_linears(m, hw, lay, dtype)
    z = np.zeros(len(lay))
    return _sum(attn), _sum(ffn) if ffn else Phase(z, z, z, z)


def column_wgrad(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(attention block, dense FFN) weight-gradient seconds per micro-batch of the column-parallel
    linear layers, whose input-gradient all-reduce runs beside them (Layout.tp_async_dgrad): every
    attention linear but the row-parallel output projection (q/k/v; MLA's down and up projections)
    and the FFN's up (and gate) projection, not its row-parallel down projection."""
    attn, ffn = _block_linears(m, hw, lay, dtype)
    z = np.zeros(len(lay))
    return _sum(attn[:-1]).w if len(attn) > 1 else z, ffn[0].w if ffn else z


def attention_tiles(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, kernel: str = "flash"):
    """(forward, backward) time per counted FLOP of a layer's fused core attention over the
    plateau's (kernels.block_factor), averaged over the model's layers by their counted FLOPs:
    full layers causal over the sequence, windowed ones (sliding_window) over their window, chunked
    ones (attention_chunk) causal within each chunk, the last, partial one at its own length.
    Context parallelism runs the kernels its cp_comm runs (kernels.tile_cost): p2p's ring passes
    over the rank's query blocks at every step, all_gather's two kernels a rank over its chunks,
    a2a's one kernel over the whole sequence on heads/cp heads (chunked layers run under a2a alone:
    layout.cp_comm_refusal), a2a+p2p's ring over cp/cp_a2a ranks on heads/cp_a2a heads, each rank
    holding its all-to-all group's chunks, two joined ones of s/(2 cp/cp_a2a) tokens. 1 where the
    spec states no block costs for the kernel."""
    if not has_blocks(hw, kernel):
        return 1.0, 1.0
    s = lay.seq.astype(float)
    gathered = lay.cpc == CP_COMMS.index("all_gather")
    # the full layers, and the ring's or the gathered chunks' kernels, only where a layout runs them
    full_f, full_b = block_factor(hw, s, cp=lay.cp_ring, kernel=kernel)
    if gathered.any():
        gf, gb = block_factor(hw, s, cp=lay.cp, kernel=kernel, comm="all_gather")
        full_f, full_b = np.where(gathered, gf, full_f), np.where(gathered, gb, full_b)
    if m.full_layers == m.num_layers:
        return full_f, full_b
    if m.attention_chunk is not None and m.sliding_window is None:  # causal within each chunk (cp 1, or a2a)
        chunk = float(m.attention_chunk)
        whole = np.floor(s / chunk)
        rest = s - whole * chunk  # full chunks, and the last one's tokens
        (cf, cb), (rf, rb) = block_factor(hw, chunk, kernel=kernel), block_factor(hw, rest, kernel=kernel)
        w_whole, w_rest = whole * chunk * chunk, rest * rest  # their counted FLOPs (ModelSpec.attended_keys)
        loc_f, loc_b = ((w_whole * x + w_rest * y) / (w_whole + w_rest) for x, y in ((cf, rf), (cb, rb)))
    else:  # a window's layers: one rank's kernel, or all_gather's (the ring is refused: layout.cp_comm_refusal)
        loc_f, loc_b = block_factor(hw, s, window=m.sliding_window, kernel=kernel)
        if gathered.any():
            gf, gb = block_factor(hw, s, window=m.sliding_window, cp=lay.cp, kernel=kernel, comm="all_gather")
            loc_f, loc_b = np.where(gathered, gf, loc_f), np.where(gathered, gb, loc_b)
    share = m.full_layers / m.num_layers * 0.5 * s / m.attended_keys(s)  # the full layers' share of the FLOPs
    return share * full_f + (1.0 - share) * loc_f, share * full_b + (1.0 - share) * loc_b


def cp_tensor_bytes(m: ModelSpec, lay: LayoutBatch):
    """(Q, K and V together, the output) bytes of one attention layer's micro-batch on a rank, its
    tokens and its tp share of the heads: what context parallelism moves and copies (Layout.cp_comm).
    Kv heads fewer than tp are replicated, one a rank; MLA's K and V have a head per query head."""
    dqk, dv = m.qk_v_dims
    t, eb, tp = lay.tokens, lay.act_bytes, lay.tp.astype(float)
    heads = m.num_heads / tp
    kv_heads = np.maximum((m.num_heads if m.mla is not None else m.kv_heads) / tp, 1.0)
    return t * heads * dqk * eb, t * kv_heads * (dqk + dv) * eb, t * heads * dv * eb


def _cp_kernels(m: ModelSpec, lay: LayoutBatch, hw: HardwareSpec, t, heads):
    """(launch seconds, forward and backward memory passes' seconds) context parallelism adds to a
    rank's core attention beside its first kernel (Layout.cp_comm; Transformer Engine's
    context_parallel.py). p2p: the ring's other cp − 1 kernels, each step's partial output merged
    into the running one (read both, write one) forward, its query gradient accumulated (read,
    write) backward. all_gather: a second kernel; the gathered K and V put in chunk order (read,
    write: index_select) and each chunk's output copied into the rank's (read, write), forward;
    backward the gathered K and V again, each chunk's dQ copied out (read, write), and the
    full-length dK and dV buffers zeroed, accumulated into (read both, write) and put back in order
    before their reduce-scatter (write; read 2, write; read, write). a2a: one kernel; each of Q, K,
    V and the output laid out for the exchange and back (read and write, twice), forward; the
    output and its gradient, then the gradients of Q, K and V, backward. a2a+p2p: a2a's passes and
    the ring's over cp/cp_a2a ranks (the same bytes a rank: cp_a2a times the tokens, 1/cp_a2a the
    heads)."""
    eb = lay.act_bytes
    dqk, dv = m.qk_v_dims
    n = lay.cp_ring.astype(float)  # the ring's ranks: 1 where none runs
    ring = n > 1
    gathered = lay.cpc == CP_COMMS.index("all_gather")
    more = np.where(gathered, 1.0, n - 1.0)
    steps = more * hw.efficiency.kernel_overhead_us * 1e-6
    merge_f = np.where(ring, stream_time(hw, (n - 1.0) * 3.0 * t * heads * dv * eb, n - 1.0), 0.0)
    merge_b = np.where(ring, stream_time(hw, (n - 1.0) * 2.0 * t * heads * dqk * eb, n - 1.0), 0.0)
    if not (lay.cpc != CP_COMMS.index("p2p")).any():
        return steps, merge_f, merge_b
    cp = lay.cp.astype(float)
    q, kv, o = cp_tensor_bytes(m, lay)
    merge_f = merge_f + np.where(gathered, stream_time(hw, 2.0 * cp * kv + 2.0 * o, 4), 0.0)
    merge_b = merge_b + np.where(gathered, stream_time(hw, 8.0 * cp * kv + 2.0 * q, 7), 0.0)
    qkv = q + kv
    a2a = lay.cp_a2a_group > 1
    merge_f = merge_f + np.where(a2a, stream_time(hw, 4.0 * (qkv + o), 8), 0.0)
    merge_b = merge_b + np.where(a2a, stream_time(hw, 4.0 * (2.0 * o + qkv), 10), 0.0)
    return steps, merge_f, merge_b


def core_attention(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, dtype: str) -> Phase:
    """softmax(QK^T)V of one layer for one micro-batch on a rank: its tokens' queries against the
    whole sequence's keys, at the plateau of the fused kernel the layout runs (the spec's own, or
    FlashAttention-2's: Layout.attention_kernel), times the kernel's tiles per counted tile at this
    length and mask (attention_tiles). Fused kernels skip masked blocks (causal half, sliding
    windows); under context parallelism (Layout.cp) a rank runs its load-balanced share of the
    FLOPs in the kernels its cp_comm runs, with their launches and memory passes (_cp_kernels)."""
    t = lay.tokens
    eb = lay.act_bytes
    dqk, dv = m.qk_v_dims
    heads = m.num_heads / lay.tp.astype(float)
    s = lay.seq.astype(float)
    core_flops = 2.0 * t * m.attended_keys(s) * heads * (dqk + dv)
    # attention stays in bf16 under fp8 training (Transformer Engine's default recipe)
    adt = base_dtype(dtype)
    steps, merge_f, merge_b = _cp_kernels(m, lay, hw, t, heads)
    tiles_f, tiles_b = attention_tiles(m, hw, lay)  # the spec's own kernel at this length and mask
    kern_f = flash_attention_time(hw, core_flops * tiles_f, adt, dqk, dv)
    kern_b = flash_attention_bwd_time(hw, core_flops * tiles_b, t * heads, adt, dqk, dv)
    if lay.fa2.any():  # FlashAttention-2 where the stack runs it (Layout.attention_kernel fa2)
        fa_f, fa_b = attention_tiles(m, hw, lay, "fa2")
        kern_f = np.where(lay.fa2, flash_attention_time(hw, core_flops * fa_f, adt, dqk, dv, "fa2"), kern_f)
        kern_b = np.where(lay.fa2, flash_attention_bwd_time(hw, core_flops * fa_b, t * heads, adt, dqk, dv, "fa2"),
                          kern_b)
    flash_f, flash_b = kern_f + steps + merge_f, kern_b + steps + merge_b
    if hw.efficiency.attention_fp8 and lay.attn_fp8.any():  # FP8 attention where measured (Layout.attention_fp8)
        sf, sb = hw.efficiency.attention_fp8
        ovh = hw.efficiency.kernel_overhead_us * 1e-6 + steps  # the launches are not faster in FP8
        flash_f = np.where(lay.attn_fp8, (flash_f - ovh) / sf + ovh, flash_f)
        flash_b = np.where(lay.attn_fp8, (flash_b - ovh) / sb + ovh, flash_b)
    if lay.eager.any():  # materialised scores (cp 1: layout.check_layout)
        batch = lay.mbs * heads
        eager_gemm = (gemm_time(hw, s, s, dqk, groups=batch, dtype=adt, elt_bytes=eb)
                      + gemm_time(hw, s, dv, s, groups=batch, dtype=adt, elt_bytes=eb))
        # fused scale-mask-softmax reads scores, writes probs; dropout on probs adds a pass + mask
        soft_bytes = t * s * heads * eb * (2.0 + np.where(lay.dropout, 2.5, 0.0))
        eager_f = eager_gemm + stream_time(hw, soft_bytes, 1 + lay.dropout)
        core_f = np.where(lay.eager, eager_f, flash_f)
        core_b = np.where(lay.eager, 2.0 * eager_f, flash_b)
    else:  # all fused: skip pricing the eager kernels
        core_f, core_b = flash_f, flash_b
    z = np.zeros_like(core_f)
    return Phase(core_f, core_b, z, z)


def attention_phase(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, dtype: str, core: Phase | None = None) -> Phase:
    """Attention block of one layer (norm, projections, core, residual); `core`: its
    core_attention where the caller has priced it already."""
    t = lay.tokens
    tp = lay.tp.astype(float)
    eb = lay.act_bytes
    d = m.hidden_size
    up_proj = None  # MLA's up-projections (what mla_up_proj recompute re-runs)
    lin = _linears(hw, dtype, eb, *_attention_shapes(m, lay))
    ph = _sum(lin)
    if m.mla is not None:
        up_proj = lin[1] + lin[3] if m.mla.q_lora_rank else lin[1]
    core = core if core is not None else core_attention(m, hw, lay, dtype)

    # elementwise: norm (read+write d), residual add (read 2d, write d), rope on q and k (none
    # with a learned position table: Megatron GPT adds its positions to the embedding once;
    # MLA applies its own), dropout on the block output (read, write, 1-byte mask). SP shards
    # the d-wide ones over tp.
    sp_div = np.where(lay.sp, tp, 1.0)
    rope = 0.0 if m.mla is not None or m.learned_positions else 2.0 * (m.num_heads + m.kv_heads) * m.hd
    elems = (2.0 * d + 3.0 * d + np.where(lay.dropout, 2.5 * d, 0.0)) / sp_div + rope / tp
    ew = _elementwise(hw, t * elems * eb, 4) + _unfused_rope(m, hw, lay, t * eb / tp)
    # piper-train's eager ops on a GPU: the whole block's token-level traffic priced here
    ew = _eager_or(hw, lay, ew, lambda: eager_traffic.token_phase(m, hw, lay))
    # recompute: full re-runs the whole forward; selective what Layout.recompute_modules lists
    total = ph + core + ew
    norm_f = stream_time(hw, 2.0 * t * d * eb / sp_div, 1)  # the pre-attention norm: read and write d
    sel = (np.where(recomputes(lay, "core_attn"), core.f, 0.0) + np.where(recomputes(lay, "layernorm"), norm_f, 0.0)
           + (np.where(recomputes(lay, "mla_up_proj"), up_proj.f, 0.0) if up_proj is not None else 0.0))
    sel = np.where(recomputes(lay, "attn_block"), total.f, sel)  # X-MoE's whole block holds the others
    # torchtitan's per-op policy (op_sac): its _op_sac_save_list keeps the attention kernel's outputs and
    # every other aten.mm's (the 1st, 3rd, ...: q's and v's projections here), so the elementwise ops and
    # k's and the output projections re-run. torchao's float8 linears reach the policy as aten.mm on their
    # tensor subclass (the mode sees the op before the subclass lowers it to _scaled_mm): counted alike
    if m.mla is None:
        kv = m.kv_heads_per_rank(tp)
        wk = lin[0].f * kv / (m.num_heads / tp + 2.0 * kv)  # k's share of the q/k/v projections' GEMM
        sel = np.where(recomputes(lay, "op_sac"), ew.f + wk + lin[-1].f, sel)
    r = np.where(lay.recompute == 2, total.f, np.where(lay.recompute == 1, sel, 0.0))
    return Phase(total.f, total.b, total.w, r)


# Megatron-Core's unfused RoPE (rope_utils._apply_rotary_pos_emb_bshd) on one tensor: forward
# _rotate_half (a negation of half, a cat), t·cos, rotate_half(t)·sin, their sum and the cat
# with the unrotated rest: element accesses (reads + writes, per element of the tensor) and
# kernels; backward, the two products' gradients, the negation's, the chunk's cat and their
# sum. The fused kernel reads and writes once each way (priced in attention_phase's elems).
UNFUSED_ROPE = {"f": (12.0, 6.0), "b": (10.0, 5.0)}


def unfused_rope(m: ModelSpec) -> bool:
    """Whether the fused stack applies the model's RoPE with Megatron-Core's unfused ops: YaRN
    (ModelSpec.rope_scaling) outside MLA, which applies its own."""
    return m.rope_scaling == "yarn" and m.mla is None


def _unfused_rope(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, row_bytes) -> Phase:
    """What a YaRN model's RoPE costs beyond the fused kernel on the fused stack, which fuses
    only plain RoPE (ModelSpec.rope_scaling); `row_bytes`: bytes of one element of q and k over
    all of a rank's tokens. Zero for MLA (its own RoPE) and for the eager stack (priced as
    elementwise passes like its other modules)."""
    z = np.zeros(len(lay))
    if not unfused_rope(m):
        return Phase(z, z, z, z)
    qk = row_bytes * (m.num_heads + m.kv_heads) * m.hd  # one access of q and k
    (af, kf), (ab, kb) = UNFUSED_ROPE["f"], UNFUSED_ROPE["b"]
    fused = ~lay.unfused.astype(bool)
    f = np.where(fused, stream_time(hw, (af - 2.0) * qk, 2.0 * kf - 2.0), 0.0)  # 2: the fused kernel's
    b = np.where(fused, stream_time(hw, (ab - 4.0) * qk, 2.0 * kb - 2.0), 0.0)  # pair, priced already
    return Phase(f, b, z, z)


def ffn_phase(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, dtype: str) -> Phase:
    """Dense FFN block (norm, up/gate, activation, down, residual)."""
    t = lay.tokens
    tp = lay.tp.astype(float)
    eb = lay.act_bytes
    d, f = m.hidden_size, m.ffn_size
    lin = _linears(hw, dtype, eb, *_ffn_shapes(m, lay))
    ph = _sum(lin)
    sp_div = np.where(lay.sp, tp, 1.0)
    act = (3.0 if m.ffn_gated else 2.0) * f / tp
    elems = (2.0 * d + 3.0 * d + np.where(lay.dropout, 2.5 * d, 0.0)) / sp_div + act
    ew = _elementwise(hw, t * elems * eb, 4)
    # eager: the activation only (the norm and residual are in attention_phase's token-level count)
    ew = _eager_or(hw, lay, ew, lambda: eager_traffic.ffn_phase(m, hw, lay, f / tp))
    total = ph + ew
    norm_f = stream_time(hw, 2.0 * t * d * eb / sp_div, 1)  # the pre-MLP norm
    act_fc2 = stream_time(hw, t * act * eb, 1) + lin[1].f  # X-MoE's --checkpoint-intermediate
    mlp = recomputes(lay, "mlp")
    sel = (np.where(mlp, total.f - norm_f, 0.0) + _norm_again(lay, norm_f)
           + np.where(recomputes(lay, "act_fc2") & ~mlp, act_fc2, 0.0))
    # torchtitan's per-op policy (attention_phase): the block's 6th aten.mm is the up projection (w3; the
    # gate, w1, runs first), without a gate the down projection, which a compiled block does not re-run
    # (nothing in its backward reads it); the elementwise ops all re-run
    sixth = lin[0].f / 2.0 if m.ffn_gated else np.where(lay.cmodel, 0.0, lin[1].f)
    sel = np.where(recomputes(lay, "op_sac"), ew.f + sixth, sel)
    r = np.where(lay.recompute == 2, total.f, np.where(lay.recompute == 1, sel, 0.0))
    return Phase(total.f, total.b, total.w, r)


def _norm_again(lay: LayoutBatch, norm_f):
    """The pre-MLP norm's forward where selective recompute re-runs it: layernorm, or X-MoE's
    attention-block checkpoint, which ends with that norm."""
    return np.where(recomputes(lay, "layernorm") | recomputes(lay, "attn_block"), norm_f, 0.0)


def moe_phase(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, dtype: str, imb) -> Phase:
    """MoE block on the straggler rank: router, permute, grouped expert GEMMs on
    `imb` × the mean tokens (plus the runtime's row padding, Accelerator.expert_row_multiple),
    shared experts, unpermute and weighted combine."""
    assert m.moe is not None
    mo = m.moe
    t = lay.tokens / lay.tp
    eb = lay.act_bytes
    d, E, k = m.hidden_size, mo.num_experts, mo.top_k
    etp = lay.etp.astype(float)
    ex = _expert_shapes(m, hw, lay, imb)
    m_e, fw, local, pad, shapes = ex.rows, ex.width, ex.local, ex.pad, list(ex.gemms)
    if mo.shared_experts:
        fs = mo.shared_experts * mo.shared_ffn
        shapes += [(t, (2 if mo.gated else 1) * fs, d), (t, d, fs)]
    router, = _linears(hw, base_dtype(dtype), eb, (t, E, d))  # the router stays out of FP8 recipes
    lin = _linears(hw, dtype, eb, *shapes)
    ph = _sum(lin) + router
    rows = t * k * imb
    # the experts' own rows on this rank: its etp group's, gathered, and padded (as the GEMMs take them)
    own = rows * etp + local * pad
    act = (3.0 if mo.gated else 2.0) * fw * own
    if mo.shared_experts:  # the shared experts' activation, as a dense FFN of their width (ffn_phase)
        act = act + (3.0 if mo.gated else 2.0) * fs * t
    # norm + residual on t tokens; router softmax/top-k on E logits (fp32);
    # permute (read+write d per copy), unpermute + weighted sum (read k·d, write d)
    elems = t * (5.0 * d) + t * 3.0 * E * 2 + 2.0 * rows * d + rows * d + t * d + act
    extra, clamp_f = _expert_extras(m, hw, lay, own, eb)
    ew = _elementwise(hw, elems * eb, 8)

    def moe_eager():  # router, dispatch, expert activations, combine; the shared experts' activation
        f, b = eager_traffic.moe_phase(m, hw, lay, own, fw)
        if mo.shared_experts:  # as a dense FFN of their width (norm, residual: attention_phase)
            sf, sb = eager_traffic.ffn_phase(m, hw, lay, mo.shared_experts * mo.shared_ffn / lay.tp)
            f, b = f + sf, b + sb
        return f, b
    ew = _eager_or(hw, lay, ew, moe_eager)
    total = ph + ew + extra + _dglu_dbias(m, hw, lay, m_e, local)
    norm_f = stream_time(hw, 2.0 * t * d * eb, 1)  # the pre-MLP norm
    act_f = stream_time(hw, act * eb, 1) + clamp_f  # what moe_act recompute re-runs
    whole, fc2 = recomputes(lay, "moe"), recomputes(lay, "act_fc2")  # act_fc2: X-MoE's --checkpoint-intermediate
    sel = (np.where(whole, total.f - norm_f, 0.0)
           + np.where((recomputes(lay, "moe_act") | fc2) & ~whole, act_f, 0.0)
           + np.where(fc2 & ~whole, lin[1].f, 0.0)
           + _norm_again(lay, norm_f))
    if mo.shared_experts:
        sel = sel + np.where(recomputes(lay, "shared_experts") & ~recomputes(lay, "moe"), (lin[2] + lin[3]).f, 0.0)
    r = np.where(lay.recompute == 2, total.f, np.where(lay.recompute == 1, sel, 0.0))
    return Phase(total.f, total.b, total.w, r)


class ExpertShapes(NamedTuple):
    """The routed experts' GEMMs on the busiest rank (_expert_shapes)."""
    rows: np.ndarray   # rows a local expert: `imb` x the mean, plus the runtime's row padding
    width: np.ndarray  # fc1's width a rank holds, f / etp
    local: np.ndarray  # experts a rank holds, E / ep
    pad: float         # the padding's expected rows an expert (expected_pad)
    gemms: tuple       # (m, n, k, groups, streams) of the up and down GEMMs (_linears)


def _expert_shapes(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, imb) -> ExpertShapes:
    """The routed experts' GEMM shapes on the busiest rank: expert tensor parallelism all-gathers
    its etp ranks' rows (Megatron-Core's AllGather-V over the ETP group), each rank holding f/etp
    columns of fc1 and rows of fc2; `imb` x the mean rows, plus the runtime's row padding."""
    mo = m.moe
    t = lay.tokens / lay.tp
    etp = lay.etp.astype(float)
    pad = expected_pad(hw.accelerator.expert_row_multiple)
    m_e = t * mo.top_k * lay.ep * etp / mo.num_experts * imb + pad
    fw = mo.expert_ffn_size / etp
    local, up = mo.num_experts / lay.ep, 2 if mo.gated else 1
    streams = EXPERT_GEMM_STREAMS[lay.egemm]  # how the runtime launches the local experts' GEMMs
    return ExpertShapes(m_e, fw, local, pad, ((m_e, up * fw, m.hidden_size, local, streams),
                                              (m_e, m.hidden_size, fw, local, streams)))


def expert_gemms(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, dtype: str, imb) -> tuple[Phase, Phase]:
    """(up, down): seconds a micro-batch of the routed experts' fc1 (gate and up) and fc2 GEMMs on
    the busiest rank, forward, dgrad and wgrad, each with its FP8 input casts, as moe_phase prices
    them: what a fused exchange (Layout.a2a fused) runs beside."""
    up, down = _linears(hw, dtype, lay.act_bytes, *_expert_shapes(m, hw, lay, imb).gemms)
    return up, down


def _dglu_dbias(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, m_e, local) -> Phase:
    """Seconds a micro-batch's backward (input gradients) spends in the fused grouped-MLP backward
    kernel beyond fc2's dgrad GEMM, per layout: efficiency.dglu_dbias_ps x the elements of the GLU
    input gradient its epilogue writes and reduces into fc1's bias gradient (m_e rows an expert,
    `local` experts, 2f/etp wide), where the experts launch as one grouped kernel and are gated
    with biases (cuDNN frontend's grouped_gemm_dglu, GPT-OSS's dGeGLU). The regression this
    prices sat in that epilogue's reduction loop (cudnn-frontend PR #322: "excessive local
    memory/stack usage for the dbias reduction path"), a cost per element it reduces, not per
    FLOP of the GEMM. Zero on specs that leave it at 0."""
    z = np.zeros(len(lay))
    ps = hw.efficiency.dglu_dbias_ps
    mo = m.moe
    if ps == 0.0 or not (mo.gated and mo.expert_bias):
        return Phase(z, z, z, z)
    elems = m_e * local * 2.0 * mo.expert_ffn_size / lay.etp
    return Phase(z, np.where(EXPERT_GEMM_STREAMS[lay.egemm] == 0, ps * 1e-12 * elems, 0.0), z, z)


def _expert_extras(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, n, eb) -> tuple[Phase, np.ndarray]:
    """(Phase, clamp forward seconds) of what GPT-OSS-style experts add to the `n` rows a rank's
    experts run (its etp group's, gathered; f / etp wide) where their GEMMs launch per expert
    (Megatron-Core's TEGroupedMLP on TE GroupedLinear; a fused grouped MLP kernel is taken to absorb
    both):
    - glu_clamp: fused_bias_geglu.weighted_bias_quick_geglu_impl clamps the two halves of the
      2f-wide input with separate kernels and concatenates them (read 2f, write 2f, then read
      and write 2f again); backward, each clamp reads its gradient and saved input and writes a
      gradient, and the chunk's backward concatenates them: 8f and 10f elements a row;
    - expert_bias: fc2's bias is added outside the GEMM, one expert at a time, scaled by the
      fp32 routing probability (TEGroupedMLP._apply_bias: `t + b * p` per expert, then cat
      and cast back): b·p written in fp32, the sum read (t, b·p) and written in fp32, the cat
      read and written, the cast read and written, d·(24 + 2·eb) bytes a row; backward, the
      casts back, bias and probability gradients (a product and a reduction each) and the split's
      cat, d·(32 + 4·eb); 2 kernels an expert forward, 6 backward. fc1's bias rides the GEMM
      epilogue (cuBLASLt bias / bgrad): free."""
    mo = m.moe
    z = np.zeros(len(lay))
    if not (mo.glu_clamp or mo.expert_bias):
        return Phase(z, z, z, z), z
    f, d = mo.expert_ffn_size / lay.etp, m.hidden_size  # each rank holds f / etp of an expert's width
    per_expert = per_expert_launch(lay)
    local = mo.num_experts / lay.ep
    cf, cb = (8.0 * f * n * eb, 10.0 * f * n * eb) if mo.glu_clamp else (z, z)
    bf, bb = (d * (24.0 + 2.0 * eb) * n, d * (32.0 + 4.0 * eb) * n) if mo.expert_bias else (z, z)
    kf = (3.0 if mo.glu_clamp else 0.0) + (2.0 * local + 2.0 if mo.expert_bias else 0.0)
    kb = (4.0 if mo.glu_clamp else 0.0) + (6.0 * local + 2.0 if mo.expert_bias else 0.0)
    fwd = np.where(per_expert, stream_time(hw, cf + bf, kf), 0.0)
    bwd = np.where(per_expert, stream_time(hw, cb + bb, kb), 0.0)
    clamp_f = np.where(per_expert & bool(mo.glu_clamp), stream_time(hw, cf, 3.0), 0.0)
    return Phase(fwd, bwd, z, z), clamp_f


# torch's F.cross_entropy on an fp32 copy of the logits (Layout.cross_entropy eager): the bytes its ops
# read and write a logit and its ops, forward (the copy, log_softmax, nll_loss) and backward (nll_loss's
# and log_softmax's backwards, their sum into the copy's gradient and its cast), counted op by op with
# benchmarks/eager_bytes.py's counter (tests/test_cross_entropy.py)
EAGER_CE_BYTES = (18.0, 26.0)
EAGER_CE_OPS = (3, 4)


def lm_head_phase(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, dtype: str) -> Phase:
    """Final norm, vocab-parallel LM head and fp32 cross-entropy (last stage)."""
    t = lay.tokens
    tp = lay.tp.astype(float)
    V, d = m.vocab_size, m.hidden_size
    ph, = _linears(hw, base_dtype(dtype), lay.act_bytes, (t, V / tp, d))  # FP8 recipes keep the head in bf16
    # cross-entropy over fp32 logits: read, exp/normalise, write grad (3 passes of 4 B)
    ce = _elementwise(hw, t * V / tp * 4.0 * 3.0 + t * 2.0 * d * lay.act_bytes, 3)
    eager = lay.ce_eager & ~lay.closs
    if eager.any():  # torch's, op by op, beside the same norm
        n, z = t * V / tp, np.zeros(len(lay))
        torch_ce = (Phase(stream_time(hw, EAGER_CE_BYTES[0] * n, EAGER_CE_OPS[0]),
                          stream_time(hw, EAGER_CE_BYTES[1] * n, EAGER_CE_OPS[1]), z, z)
                    + _elementwise(hw, t * 2.0 * d * lay.act_bytes, 1))
        ce = Phase._of(np.where(eager, torch_ce.v, ce.v))
    return ph + ce


def embedding_phase(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch) -> Phase:
    """Embedding gather (first stage) and its scatter-add gradient."""
    t = lay.tokens
    return _elementwise(hw, t * m.hidden_size * lay.act_bytes * 2.0, 1)
