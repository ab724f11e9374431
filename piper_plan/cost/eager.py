"""What eager modules move through memory outside their GEMMs and attention, on a GPU: bytes and
kernels per block pass, priced at the device's stream rate. piper-train's (below), and a
PyTorch-native stack's dense block run without torch.compile (NATIVE: torchtitan's).

A fused stack's norm, activation, RoPE, permutation and combine are a few kernels each
(compute.attention_phase / ffn_phase / moe_phase price those passes). piper-train
(Layout.fused_kernels false) runs them as PyTorch ops under bf16 autocast over fp32 weights:
the RMSNorm in fp32 (pow, mean, rsqrt, two products), the casts autocast inserts, SwiGLU as
three ops, the router's fp32 softmax and top-k, the dispatch's cast and index_select, and the
combine's copy of each routed row to its (token, choice) slot, fp32 product and sum over the k
choices (runtime/moe/permute.py's GPU path), with their backward ops.

The counts are piper-train's own: every aten op of one block's forward and backward, counted
by a TorchDispatchMode (benchmarks/eager_bytes.py's method; the op sequence autograd dispatches
is the same on a GPU), at 16 shapes per block kind and dtype (d 64-192, GQA and MHA, t 72-328,
dense FFN 96-5d, 1-8 of 6-32 experts, expert widths 48-384); the bytes are linear in the
tensors' element counts, and scipy's nnls on those counts gives the bytes per element below,
within 2 % of every count solved on; at held-out shapes (tests/test_eager_traffic.py recounts
them) within 3 % in bf16 and 8 % in fp32 (a MoE forward). Ops per block pass were the same at
every shape but the MoE forward's (56-64 in bf16, by the router's top-k path: the most is taken).

Where it applies: unfused layouts on a spec without a calibrated per-block overhead
(efficiency.layer_overhead_us): calibrate fits that overhead on CPUs, where the host is the
device and the eager cost is the host's; on a GPU spec the bytes are HBM traffic.
Granite-3.0-3B-A800M's MoE block at 4 x 2,048 tokens counts 13.1 GiB (12.0 elementwise, 1.1
weight casts), 3.45 ms at the dgx-h200 stream rate. A lent H200 ran the whole step at 1.23x its
price with the counts of the runtime it ran (5fa6972: 14.2 GiB, 3.7 ms a block); the runtime
since casts each block's input once (README)."""
from __future__ import annotations

import numpy as np

from ..specs.hardware import HardwareSpec
from ..specs.model import ModelSpec
from .batch import LayoutBatch
from .kernels import stream_time

# bytes per element, forward and backward, of one block pass's eager traffic, by dtype:
# the block's token-level part (both norms and residuals, the attention's projections'
# surroundings and RoPE) on t·d, t·kv_heads·head_dim and t; a dense FFN's on t·ffn;
# a MoE layer's on its routed rows r = t·k: r·d, r·f, t·E, r, and on t·d its token-level
# excess over the dense block's (its residual add in fp32, the router's fp32 input, the cast
# for the experts; the t and t·kv·head_dim coefficients agree within 1 %)
TOKEN = {"bf16": {"f": (107.54, 22.23, 471.56), "b": (293.16, 33.65, 237.01)},
         "fp32": {"f": (122.05, 39.38, 386.30), "b": (318.14, 67.35, 407.55)}}
FFN = {"bf16": {"f": (10.0,), "b": (18.0,)}, "fp32": {"f": (20.0,), "b": (36.0,)}}
MOE = {"bf16": {"f": (22.02, 10.0, 12.05, 152.18, 8.01), "b": (42.0, 18.0, 24.0, 40.0, 6.0)},
       "fp32": {"f": (36.02, 20.0, 11.62, 153.57, 7.99), "b": (60.0, 36.0, 24.0, 40.0, 12.0)}}
# MLA attention's block (DeepSeek-V2/V3) in TOKEN's place, on t·d, t·heads·qk head dim (q, and k
# after the shared rotary key joins it), t·heads·v head dim, t·(kv_lora_rank + qk_rope_head_dim)
# (the latent and rotary key), t·q_lora_rank and t; solved on 8 MLA shapes x 3 FFN widths (d
# 64-192, 2-12 heads, head dims 16-64, latents 32-96, with and without a query latent), within
# 1.5 % of every count in bf16, 2.8 % in fp32 (benchmarks/eager_bytes.py --solve)
MLA_TOKEN = {"bf16": {"f": (68.99, 9.86, 13.93, 48.82, 65.78, 347.22),
                      "b": (241.03, 15.79, 27.8, 88.75, 125.52, 725.11)},
             "fp32": {"f": (38.41, 20.69, 24.8, 59.85, 85.14, 505.8),
                      "b": (199.23, 35.92, 42.12, 118.08, 155.65, 842.32)}}
# ops (kernels) per pass: the dense block's to the token-level part, the MoE block's excess to it;
# an MLA block's to its token-level part, without and with the query latent ("mla_q": its norm)
OPS = {"bf16": {"token": (37, 64), "moe": (27, 10), "mla": (47, 83), "mla_q": (55, 99)},
       "fp32": {"token": (31, 60), "moe": (27, 11), "mla": (39, 77), "mla_q": (45, 91)}}


# A PyTorch-native stack's dense block run eagerly in bf16 (Layout.native_eager): torchtitan's Llama
# block as its 2024 presets ran it (benchmarks/native_block.py: FSDP2's bf16 weights, no autocast, the
# RMSNorm and RoPE in fp32 inside, K and V repeated to the query heads), counted as piper-train's is.
# Bytes per element on t·d (both norms and residuals), t·heads·head_dim (the query's RoPE), t·kv_heads·
# head_dim (the key's), t, t·head_dim (the complex rotary table, read per rotation) and t·heads·head_dim
# again where repeat_kv moves K and V in that pass (native_repeats); its SwiGLU's are FFN's bf16 row (the
# same three ops). Solved on 12 shapes x 3 FFN widths, four with heads·head_dim != d and one with a
# single kv head (benchmarks/eager_bytes.py --solve-native), within 0.02 % of every count.
NATIVE = {"f": (84.02, 20.03, 19.98, 48.78, 7.91, 7.98), "b": (222.06, 16.07, 23.94, 71.85, 23.89, 7.96)}
# its elementwise ops a pass, forward and backward, without and with repeat_kv's work in that pass
NATIVE_OPS = {"f": (26, 28), "b": (48, 50)}


def native_repeats(heads, kv_heads, phase: str):
    """Whether repeat_kv moves K and V in `phase` ("f" or "b"), per tp rank's heads: its forward
    copies them between one kv head (the expand then reshape stays a view) and as many as the
    query heads (returned as they are); its backward sums the copies' gradients wherever
    kv_heads < heads."""
    heads, kv_heads = np.asarray(heads, float), np.asarray(kv_heads, float)
    return (kv_heads < heads) & ((phase == "b") | (kv_heads > 1))


def applies(hw: HardwareSpec, lay: LayoutBatch) -> np.ndarray:
    """Layouts whose eager traffic is priced here: unfused modules on a spec with no calibrated
    per-block overhead (which holds that cost where it was measured), and native eager blocks
    (nothing calibrates them)."""
    return (lay.unfused.astype(bool) & (not hw.efficiency.layer_overhead_us)) | lay.native.astype(bool)


def _traffic(hw: HardwareSpec, lay: LayoutBatch, table: dict, terms: list, ops: str | None):
    """(forward, backward) seconds of Σ bytes-per-element x element count over `terms` (the
    order of `table`'s coefficients), with the kernels OPS[dtype][ops] a pass (none: 0)."""
    dt = np.where(lay.act_bytes == 2, 0, 1)  # index into (bf16, fp32)
    out = []
    for j, ph in enumerate(("f", "b")):
        nbytes = sum(np.choose(dt, [table[d][ph][i] for d in ("bf16", "fp32")]) * n for i, n in enumerate(terms))
        kernels = 0 if ops is None else np.choose(dt, [OPS[d][ops][j] for d in ("bf16", "fp32")])
        out.append(stream_time(hw, nbytes, kernels))
    return tuple(out)


def token_phase(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch):
    """(forward, backward) seconds of a block pass's token-level eager traffic per rank: t/tp
    tokens' share (sequence-parallel shards and the heads each tp rank holds); MLA's latents
    on every token, since each tp rank projects them whole (runtime/layers.MLAttention)."""
    t = lay.tokens / lay.tp
    if m.mla is None:
        f, b = _traffic(hw, lay, TOKEN, [t * m.hidden_size, t * m.kv_heads * m.hd, t], "token")
        if not lay.native.any():
            return f, b
        nf, nb = _native_token(m, hw, lay, t)
        return np.where(lay.native, nf, f), np.where(lay.native, nb, b)
    a, (qk, v) = m.mla, m.qk_v_dims
    terms = [t * m.hidden_size, t * m.num_heads * qk, t * m.num_heads * v,
             lay.tokens * (a.kv_lora_rank + a.qk_rope_head_dim), lay.tokens * (a.q_lora_rank or 0), t]
    return _traffic(hw, lay, MLA_TOKEN, terms, "mla_q" if a.q_lora_rank else "mla")


def _native_token(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, t):
    """(forward, backward) seconds of the native eager block's token-level traffic a tp rank, `t`
    its tokens / tp (layout.native_eager_refusal keeps other blocks away): torchtitan shards the
    heads over tp, each rank its kv_heads / tp (at least one), and its norms and residual adds over
    the sequence where sequence parallelism splits it (every token on every rank where not)."""
    tp = lay.tp.astype(float)
    heads, kv = m.num_heads / tp, m.kv_heads_per_rank(tp)
    rows = lay.tokens / np.where(lay.sp, tp, 1.0)  # the tokens a rank's norms and residual adds see
    out = []
    for j, ph in enumerate("fb"):
        rep = native_repeats(heads, kv, ph)
        terms = [rows * m.hidden_size, t * m.num_heads * m.hd, lay.tokens * kv * m.hd, rows, lay.tokens * m.hd,
                 np.where(rep, t * m.num_heads * m.hd, 0.0)]
        nbytes = sum(c * n for c, n in zip(NATIVE[ph], terms))
        out.append(stream_time(hw, nbytes, np.where(rep, NATIVE_OPS[ph][1], NATIVE_OPS[ph][0])))
    return tuple(out)


def ffn_phase(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, width):
    """(forward, backward) seconds of a dense FFN's eager activation traffic, `width` its
    per-rank hidden width (gated or not: the count is SwiGLU's)."""
    return _traffic(hw, lay, FFN, [lay.tokens * width], None)


def moe_phase(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, rows, width):
    """(forward, backward) seconds of a MoE layer's eager routing traffic on the straggler
    rank: `rows` its routed rows, `width` the expert width it computes."""
    t = lay.tokens / lay.tp
    d = m.hidden_size
    return _traffic(hw, lay, MOE, [rows * d, rows * width, t * m.moe.num_experts, rows, t * d], "moe")
