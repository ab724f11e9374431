"""Activation memory: the tensors each layer saves for backward, named one by one.

Bytes per micro-batch per rank for one layer (its mbs·seq/cp tokens under context parallelism),
vectorised over layouts. The tensor list
follows Korthikanti et al. 2022 (arXiv 2205.05198 §4: 34·sbh + 5·as²b per GPT layer with
dropout and fused softmax; everything / t with sequence parallelism; selective recompute
drops the as² terms), extended to GQA/MLA, SwiGLU, flash attention and top-k MoE:
per routed token copy a SwiGLU expert keeps its input (d), gate and up outputs (2f) and the
product fed to the down projection (f) — the k·(3f + d) of Piper's equation (brief §2).

Fused runtimes save less than this list in two places. Under an FP8 recipe Transformer Engine
keeps a GEMM's input as the quantised copy it made for the forward (gemm_input_bytes), so the
expert, QKV and MLP inputs cost 1 B an element, and the output projection keeps its own copy
beside the attention output the attention kernel saves. And where the routing probability is
applied inside the experts' activation (Megatron-Core's weighted SwiGLU, Layout.expert_probs),
the combine needs no expert output for the weight gradient.

The attention kernel decides the s² terms: `flash` keeps only the output and the fp32
log-sum-exp; `eager` (Megatron's fused scale-mask-softmax) keeps the softmax output, plus a
1-byte mask and the dropped-out copy under dropout; `naive` (unfused: scores and
probabilities both kept) is the assumption behind Piper's 4·H·b·s² term.

Unfused (eager PyTorch) modules, as in piper-train, keep more: its residual stream and norms
run in fp32 whatever the compute dtype, so a norm's input, its fp32 1/rms per token and the
normalised x (for the weight gradient) are fp32, as is the router's input; the norm output is
cast once for the block's projections (and once more for the shared experts); the rotary
tables are cast per rotation; the [b, h, s, d] -> [b, s, h·d] reshape before the output
projection copies; an unfused SwiGLU keeps silu(gate) besides gate and up; the dispatcher keeps
top-k ids, the rows' (token, choice) positions (int64) and the combine weights. Counted with
saved-tensor hooks in benchmarks/memory_check.py: equal, tensor for tensor, in fp32 and bf16
(tests/test_memory_check.py). The bf16 weight copies autocast saves are priced with the state
(rank_memory.cast_copies). A PyTorch-native eager block (Layout.native_eager: torchtitan's, on bf16
weights) keeps each norm's input in fp32, its 1/rms and the normalised x in bf16, silu(gate), and K
and V repeated to the query heads: equal, byte for byte, to saved-tensor hooks on
benchmarks/native_block.py (tests/test_native_eager.py).
"""
from __future__ import annotations

import numpy as np

from ..specs.model import ModelSpec
from .batch import CP_COMMS, FP8S, OFFLOAD_MODULES, LayoutBatch, offloads, recomputes
from .eager import native_repeats

# scale bytes per element of a saved quantised copy, indexed by LayoutBatch.fp8 (batch.FP8S):
# per-tensor current scaling ~0; MXFP8 one E8M0 byte per 32; blockwise one fp32 per 1x128 tile
SAVED_SCALE_BYTES = np.array([{"mxfp8": 1.0 / 32.0, "blockwise": 4.0 / 128.0}.get(f, 0.0) for f in FP8S])
# Tensors Piper's equation (brief §2) counts: 12bsd + 4Hbs² + 2bsk(3f + d).
PAPER_TERMS = ("attn_norm_in", "qkv_in", "qkv", "scores", "probs", "attn_out",
               "expert_in", "expert_hidden", "expert_act")


def _common(lay: LayoutBatch):
    t = lay.tokens
    tp = lay.tp.astype(float)
    sp_div = np.where(lay.sp, tp, 1.0)
    return t, tp, sp_div, lay.act_bytes.astype(float)


def gemm_input_bytes(lay: LayoutBatch) -> np.ndarray:
    """Bytes per element of a GEMM input saved for its weight gradient. Under an FP8 recipe
    Transformer Engine saves the quantised copy it made for the forward GEMM, column-wise
    data only ("Discard row-wise data since it is not needed in backward pass",
    transformer_engine/pytorch/module/linear.py; grouped_linear.py and layernorm_linear.py
    alike): 1 B plus the recipe's scales (SAVED_SCALE_BYTES); the high-precision input is not
    kept. Otherwise the activation dtype."""
    return np.where(lay.fp8 > 0, 1.0 + SAVED_SCALE_BYTES[lay.fp8], lay.act_bytes.astype(float))


def attention_terms(m: ModelSpec, lay: LayoutBatch, naive: bool = False) -> dict[str, np.ndarray]:
    """Saved bytes of the attention block (incl. its pre-norm), per layer per micro-batch."""
    t, tp, sp_div, eb = _common(lay)
    qb = gemm_input_bytes(lay)
    d, s = m.hidden_size, lay.seq.astype(float)
    heads = m.num_heads / tp
    drop = lay.dropout.astype(float)
    sel = recomputes(lay, "core_attn")
    eager = lay.eager | naive
    dv = m.mla.v_head_dim if m.mla else m.hd
    sq = t * s * heads  # score elements per rank
    ln, up = recomputes(lay, "layernorm"), recomputes(lay, "mla_up_proj")
    out = {
        "attn_norm_in": eb * t * d / sp_div,
        "qkv_in": np.where(ln, 0.0, qb * t * d / sp_div),  # the norm's output: re-made under layernorm recompute
        "qkv": np.where(up & (m.mla is not None), 0.0, eb * t * m.qkv_dim_per_rank(tp)),  # MLA's up-projected q, k, v
        "scores": np.where(naive & ~sel, eb * sq, 0.0),
        "probs": np.where(eager & ~sel, eb * sq, 0.0),
        "probs_dropout": np.where(eager & ~sel, drop * (1.0 + eb) * sq, 0.0),  # 1-byte mask + the output
        "attn_out": eb * t * heads * dv,
        # FP8: the output projection saves its own quantised copy of the attention output (in
        # bf16 it saves the very tensor the attention kernel keeps)
        "proj_in_fp8": np.where(lay.fp8 > 0, qb * t * heads * dv, 0.0),
        "flash_lse": np.where(eager, 0.0, 4.0 * t * heads),
        # all_gather context parallelism keeps its kernels' own output for the backward beside the one it
        # returns (Transformer Engine's out_per_step); a2a and a2a+p2p save the exchanged output they return
        "cp_out": np.where((lay.cp > 1) & (lay.cpc == CP_COMMS.index("all_gather")) & ~sel, eb * t * heads * dv, 0.0),
        "attn_dropout_mask": drop * t * d / sp_div,
    }
    if m.mla is not None:  # compressed kv latent and q latent are saved too
        a = m.mla
        out["qkv_in"] = out["qkv_in"] + eb * t * (a.kv_lora_rank + (a.q_lora_rank or 0))
    u, n = lay.unfused, lay.native
    # piper-train's residual stream and norms run in fp32 whatever the compute dtype: the norm's
    # input and its normalised x are fp32 (the output is cast once, compute_input, for q, k, v).
    # A native eager block's norm keeps its input cast to fp32, 1/rms and the normalised x cast back
    # (for the weight's gradient), and SDPA its K and V repeated to the query heads (repeat_kv)
    out["attn_norm_in"] = np.where(u | n, 4.0, eb) * t * d / sp_div
    out["attn_norm_unfused"] = np.where(u, (4.0 * t + 4.0 * t * d) / sp_div, 0.0)
    out["attn_norm_native"] = np.where(n & ~ln, (4.0 * t + eb * t * d) / sp_div, 0.0)  # as qkv_in: re-made
    # K and V copied to the query heads (repeat_kv: not with one kv head a rank, whose copies are views)
    copied = native_repeats(heads, m.kv_heads_per_rank(tp), "f") & n & (m.mla is None)
    out["kv_repeat_native"] = np.where(copied, eb * t * (3.0 * heads * m.hd - m.qkv_dim_per_rank(tp)), 0.0)
    out["attn_out_copy"] = np.where(u, eb * t * heads * dv, 0.0)
    # its rotary tables cast to bf16 in each of the two rotations (q, k): [s, rope / 2] cos and sin
    rope = m.mla.qk_rope_head_dim if m.mla else m.hd - m.hd % 2
    out["rope_tables_unfused"] = np.where(u & (eb < 4.0), 2.0 * eb * s * rope, 0.0)
    # torchtitan's per-op policy (op_sac) keeps the block's input, the attention kernel's output and
    # log-sum-exp, and the outputs of the aten.mm it saves: q's and v's projections (compute.attention_phase);
    # the rest is re-made in backward. Counted against torch's own SAC cache (tests/test_op_sac.py)
    op = recomputes(lay, "op_sac")
    if op.any():
        out = {k: np.where(op, 0.0, v) for k, v in out.items()}
        mm = eb * t * (heads + m.kv_heads_per_rank(tp)) * m.hd
        scattered = np.where(lay.sp & (tp > 1), eb * t * d / tp, 0.0)  # wo's reduce-scatter (on the list)
        out["sac_attn"] = np.where(op, eb * t * d / sp_div + eb * t * heads * dv + 4.0 * t * heads + mm + scattered,
                                   0.0)
    # X-MoE's attention-block checkpoint keeps only the layer input
    block = recomputes(lay, "attn_block")
    return {k: v if k == "attn_norm_in" else np.where(block, 0.0, v) for k, v in out.items()}


def ffn_terms(m: ModelSpec, lay: LayoutBatch) -> dict[str, np.ndarray]:
    t, tp, sp_div, eb = _common(lay)
    qb = gemm_input_bytes(lay)
    d, f = m.hidden_size, m.ffn_size
    hid = (2.0 if m.ffn_gated else 1.0) * f
    u, n = lay.unfused, lay.native
    mlp, ln = recomputes(lay, "mlp"), recomputes(lay, "layernorm")
    remade_norm = recomputes(lay, "attn_block") & ~mlp  # X-MoE's attention-block checkpoint runs this norm
    out = {
        # its input is not kept there (one d-wide tensor stays where this block recomputes from its input)
        "ffn_norm_in": np.where(remade_norm, 0.0, np.where(u | n, 4.0, eb) * t * d / sp_div),
        "ffn_in": np.where(ln | mlp, 0.0, qb * t * d / sp_div),
        "ffn_hidden": np.where(mlp, 0.0, eb * t * hid / tp),
        "ffn_act": np.where(mlp | recomputes(lay, "act_fc2"), 0.0, qb * t * f / tp),
        "ffn_dropout_mask": lay.dropout * t * d / sp_div,
        "ffn_norm_unfused": np.where(u, (4.0 * t + 4.0 * t * d) / sp_div, 0.0),  # fp32 (attention_terms)
        # attention_terms' attn_norm_native, re-made where ffn_in / ffn_norm_in are
        "ffn_norm_native": np.where(n & ~ln & ~remade_norm, (4.0 * t + eb * t * d) / sp_div, 0.0),
        # an eager SwiGLU keeps silu(gate) for the product's gradient; mlp recompute keeps none of it
        "ffn_silu_out": np.where((u | n) & m.ffn_gated & ~mlp, eb * t * f / tp, 0.0),
    }
    op = recomputes(lay, "op_sac")
    if not op.any():
        return out
    # torchtitan's per-op policy keeps the 5th and 7th aten.mm's outputs (w1's; the rest is re-made,
    # attention_terms) and what the eager cache keeps downstream of the down projection
    kept = eb * t * f / tp + op_sac_down_bytes(m, lay) - compiled_unsaved(m, lay)
    return {**{k: np.where(op, 0.0, v) for k, v in out.items()}, "sac_ffn": np.where(op, kept, 0.0)}


def op_sac_down_bytes(m: ModelSpec, lay: LayoutBatch) -> np.ndarray:
    """Bytes torch's eager SAC cache keeps, under torchtitan's per-op policy, downstream of a
    layer's FFN down projection: with a gate w2's output, the 7th aten.mm (without one the 6th, the
    down projection, is re-made), and, sequence-parallel, its reduce-scatter's (on the list)."""
    t, tp, _, eb = _common(lay)
    d = m.hidden_size
    return eb * (np.where(m.ffn_gated, t * d, 0.0) + np.where(lay.sp & (tp > 1), t * d / tp, 0.0))


def compiled_unsaved(m: ModelSpec, lay: LayoutBatch) -> np.ndarray:
    """What of op_sac_down_bytes a compiled block (Layout.compiled model) does not save: Inductor's
    partitioner keeps only what the backward reads, and nothing reads the down projection's output,
    but at tp > 1 without sequence parallelism, where w2's all-reduce, tagged for re-making, pulls
    w2's partial sums into the saved set (its copy in the backward is then dropped as dead code,
    the saved tensor is not). Run in tests/test_compiled.py at tp 1 and 2."""
    _, tp, _, _ = _common(lay)
    return np.where(lay.cmodel & (lay.sp | (tp == 1)), op_sac_down_bytes(m, lay), 0.0)


def expected_pad(row_multiple: int) -> float:
    """Mean zero rows added to one expert's rows padded to a multiple of `row_multiple`
    (remainders spread evenly): (r - 1) / 2."""
    return (row_multiple - 1) / 2.0


def moe_terms(m: ModelSpec, lay: LayoutBatch, imb, row_multiple: int = 1) -> dict[str, np.ndarray]:
    """MoE block on the busiest rank (`imb` × the mean routed rows); the experts' own tensors
    hold each local expert's rows padded to `row_multiple` (Accelerator.expert_row_multiple)."""
    assert m.moe is not None
    mo = m.moe
    t, tp, sp_div, eb = _common(lay)
    qb = gemm_input_bytes(lay)
    d, f, k = m.hidden_size, mo.expert_ffn_size, mo.top_k
    tm = t / tp  # tokens entering the MoE block on this rank
    rows = tm * k * imb
    # the experts' rows: their etp group's, all-gathered (Layout.etp), f/etp of each expert's width
    etp = lay.etp.astype(float)
    padded = rows * etp + mo.num_experts / lay.ep * expected_pad(row_multiple)
    f = f / etp
    up = 2.0 if mo.gated else 1.0
    # selective recompute: moe keeps only the block's input, the norm's output (Megatron-Core's
    # MoE checkpoint saves what it is called with), which layernorm recompute discards in turn;
    # moe_act re-makes the activation fed to the down projection; layernorm the norm's output
    # (router and dispatch input)
    # act_fc2 (X-MoE's --checkpoint-intermediate) keeps fc1's output and re-makes fc2's input; X-MoE's
    # attention-block checkpoint runs this block's norm, so the norm's input is not kept (unless
    # the whole block recomputes from it)
    whole, ln = recomputes(lay, "moe"), recomputes(lay, "layernorm")
    u = lay.unfused
    act = recomputes(lay, "moe_act") | recomputes(lay, "act_fc2")
    keep = lambda x, drop=False: np.where(whole | drop, 0.0, x)  # noqa: E731
    out = {
        # the pre-MLP norm and the dropout after the block run on the residual stream: t / tp tokens
        # under sequence parallelism, all t without it (X-MoE splits the sequence inside the block only)
        "moe_norm_in": np.where(recomputes(lay, "attn_block") & ~whole, 0.0, np.where(u, 4.0, eb) * t * d / sp_div),
        # piper-train's router takes the fp32 norm output (attention_terms); the MoE block's input
        "router_in": np.where(ln, 0.0, np.where(u, 4.0, eb) * tm * d),
        "router_probs": keep(4.0 * tm * mo.num_experts),
        "expert_in": keep(qb * padded * d),
        "expert_hidden": keep(eb * padded * up * f),
        "expert_act": keep(qb * padded * f, act),
        # the combine's weight gradient needs each expert output, unless the probability was
        # applied inside the activation (Layout.expert_probs; fused runtimes only)
        "expert_out": keep(np.where(lay.probs_act & ~lay.unfused, 0.0, eb * rows * d)),
        "moe_dropout_mask": lay.dropout * t * d / sp_div,
    }
    fs = mo.shared_experts * mo.shared_ffn
    if mo.shared_experts:
        # fc1's output and the activation fed to fc2; under FP8 also fc1's quantised input (in
        # bf16 fc1 saves the norm output the router keeps)
        fp8_in = np.where(lay.fp8 > 0, qb * tm * d, 0.0)
        out["shared_hidden"] = keep((eb * up + qb) * tm * fs + fp8_in, recomputes(lay, "shared_experts"))
    out["moe_norm_unfused"] = np.where(u, (4.0 * t + 4.0 * t * d) / sp_div, 0.0)
    if mo.shared_experts:  # piper-train's shared experts take a cast of the fp32 norm output
        out["shared_in_unfused"] = keep(np.where(u & (eb < 4.0), eb * tm * d, 0.0), recomputes(lay, "shared_experts"))
    out["expert_silu_out"] = np.where(u & mo.gated, eb * (padded * f + tm * fs), 0.0)
    if row_multiple > 1:  # the padded-row index (int64), kept to scatter and gather back
        out["expert_pad_index"] = 8.0 * rows
    # top-k ids, the rows' (token, choice) positions (int64), combine weights
    out["routing_unfused"] = np.where(u, 8.0 * tm * k + 8.0 * rows + 4.0 * rows + 4.0 * mo.num_experts, 0.0)
    return out


def layer_activation_bytes(terms: dict[str, np.ndarray], lay: LayoutBatch, input_bytes) -> np.ndarray:
    """Sum of the terms, or only the layer input under full recompute."""
    total = sum(terms.values())
    return np.where(lay.recompute == 2, input_bytes, total)


def layer_input_bytes(m: ModelSpec, lay: LayoutBatch) -> np.ndarray:
    t, tp, sp_div, eb = _common(lay)
    return eb * t * m.hidden_size / sp_div


# Megatron-Core's fine-grained activation offloading (Layout.offload_modules) parks the tensors a
# module's forward saves (its saved_tensors_hooks group), named here by this file's terms. A norm
# is its own module only where layernorm recompute splits it out (attention_terms' assumption);
# otherwise Transformer Engine fuses it into the next linear layer, the norm module is an
# IdentityOp that offloads nothing ("Skipped if using IdentityOp") and the linear saves its input.
OFFLOAD_TERMS = {"attn_norm": ("attn_norm_in",), "qkv_linear": ("qkv_in",),
                 "core_attn": ("qkv", "scores", "probs", "probs_dropout", "flash_lse", "cp_out"),
                 "attn_proj": ("attn_out", "proj_in_fp8"), "mlp_norm": ("ffn_norm_in", "moe_norm_in"),
                 "expert_fc1": ("expert_in",), "moe_act": ("expert_hidden",)}
assert set(OFFLOAD_TERMS) == set(OFFLOAD_MODULES)
MIN_OFFLOADED_ELEMENTS = 1024 * 1024  # Megatron-Core --min-offloaded-tensor-size: smaller tensors stay


def module_offload_bytes(m: ModelSpec, lay: LayoutBatch, imb, row_multiple: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(dense layer, MoE layer) bytes per micro-batch that Layout.offload_modules send to the host
    and back, per layout: each listed module's saved tensors (OFFLOAD_TERMS) of at least
    MIN_OFFLOADED_ELEMENTS elements. None under full recompute, which saves only a layer's input."""
    n = len(lay)
    if not np.any(lay.off_mods):
        return np.zeros(n), np.zeros(n)
    separate = recomputes(lay, "layernorm")  # the norms as modules of their own
    listed = {mod: offloads(lay, mod) for mod in OFFLOAD_MODULES}
    whose = {t: listed[mod] for mod, names in OFFLOAD_TERMS.items() for t in names}
    # fused, the QKV linear saves the norm's input and a dense layer's MLP norm is no module; a MoE
    # layer's pre-MLP norm always is (the router reads its output)
    whose["attn_norm_in"] = np.where(separate, listed["attn_norm"], listed["qkv_linear"])
    whose["ffn_norm_in"] = separate & listed["mlp_norm"]
    qb, eb = gemm_input_bytes(lay), lay.act_bytes.astype(float)
    elem = {"flash_lse": 4.0, "qkv_in": qb, "proj_in_fp8": qb, "expert_in": qb}

    def parked(terms: dict) -> np.ndarray:
        total = sum(_big(v, elem.get(k, eb)) * whose[k] for k, v in terms.items() if k in whose)
        return np.where(lay.recompute == 2, 0.0, total)

    attn = attention_terms(m, lay)
    dense = parked({**attn, **(ffn_terms(m, lay) if m.ffn_size else {})})
    moe = parked({**attn, **moe_terms(m, lay, imb, row_multiple)}) if m.moe is not None else np.zeros(n)
    return dense, moe


def _big(nbytes, elem_bytes) -> np.ndarray:
    """`nbytes` where the tensor holds at least MIN_OFFLOADED_ELEMENTS elements of `elem_bytes`, else 0."""
    nbytes = np.asarray(nbytes, dtype=float)
    return np.where(nbytes >= MIN_OFFLOADED_ELEMENTS * np.asarray(elem_bytes, dtype=float), nbytes, 0.0)
