"""What each pipeline role's rank holds in memory, GiB, vectorised over layouts: the parameter,
gradient and optimizer state (memory.state_coeffs), the activations of its micro-batches in
flight (cost/activations.py per layer, memory.in_flight; a V schedule's two chunks each by
memory.v_in_flight), the layer full recompute rebuilds, the LM head's logits, the all-to-all
buffers, context parallelism's buffers, piper-train's ZeRO-2 gradient buckets and its bf16 weight
copies per micro-batch, the runtime's fixed reserve; and what optimizer and activation offload keep
in host memory instead.
estimate.evaluate composes a step from it."""
from __future__ import annotations

from functools import reduce

import numpy as np

from ..layout import SCHEDULES
from ..specs.hardware import HardwareSpec
from ..specs.model import ModelSpec
from .batch import CP_COMMS, LayoutBatch, distinct_rows
from .compute import cp_tensor_bytes
from .memory import (GIB, fp8_weight_extra, grad_bytes, in_flight, interleaved_states, layer_params_per_rank,
                     state_coeffs, v_in_flight, zero3_gathered_bytes)
from .offload import offloaded_share, uses_host
from .recompute import full_recompute_share

BUCKET_CAP_BYTES = 25 * 2**20  # piper-train's ZeRO-2 bucket cap (runtime/optim.BUCKET_CAP_BYTES)


def role_activations(m: ModelSpec, lay: LayoutBatch, roles: dict, has_head: dict, stage_of: dict,
                     chunk_layers: dict, lc: dict, M) -> dict:
    """What each role's rank (`roles`: its dense and MoE layer counts, `stage_of`: its pipeline
    rank, -1 where there is none; `chunk_layers`: (the layouts whose ranks run several chunks,
    [max vpp, those] dense, MoE layers of each chunk the rank runs: estimate._kind_layers at each
    chunk's stages.stage_kind) holds that the ZeRO stage does not change, per layout: its stage
    ("stage_of"), its bf16 weight copies ("casts", cast_copies; none where no layout casts), and
    its activations, logits, all-to-all buffers and the layer full recompute rebuilds in GiB
    ("parts") with the GiB of activations it offloads to the host ("parked"). evaluate prices these
    once per layout without the stage, as the pipeline, and rank_memory adds the state the stage
    shards."""
    t = lay.tokens
    tp = lay.tp.astype(float)
    eb = lay.act_bytes.astype(float)
    d = m.hidden_size
    # micro-batches in flight depend on (pp, vpp, schedule, M, the EP overlap, stage) alone: once per distinct one
    _, first, inv = distinct_rows(lay.pp, lay.vpp, lay.sched, M, lay.ep_overlap, *(stage_of[r] for r in roles))
    stages = np.maximum(np.stack([stage_of[r][first] for r in roles]), 0)
    infl = dict(zip(roles, in_flight(lay.take(first), stages, M[first]).take(inv, axis=1)))
    # per micro-batch on a rank: the LM head's logits, kept for the loss's backward until that
    # micro-batch's backward (a compiled loss's with its two fp32 figures a token), and what the
    # loss's backward adds in the backward of one (logits_bytes; each MTP module computes, and keeps
    # for its loss's backward, another set)
    logits_mb = t * m.vocab_size / tp * (1 + m.mtp_layers)
    kept_b, back_b = logits_bytes(eb, lay.closs, lay.ce_eager)
    kept_b = kept_b + np.where(lay.closs, 8.0 * tp / m.vocab_size, 0.0)
    # and saves its projection's input, [norm(h); norm(emb)], and the two norms' inputs
    mtp_in = m.mtp_layers * 4.0 * d * eb * t / np.where(lay.sp, tp, 1.0)
    # the all-to-all send + receive buffers of a MoE layer (busiest rank: imb x the mean)
    a2a_buf = 2.0 * t / tp * (m.moe.top_k if m.moe else 0) * d * eb * lc["imb"]
    cp_buf = cp_buffers(m, lay)
    offloads = uses_host(lay)
    v = (lay.sched >= SCHEDULES.index("zbv")) & (lay.pp > 1)
    looped = (lay.sched == SCHEDULES.index("interleaved")) & (lay.pp > 1)
    parts, parked, held = {}, {}, {}
    for r, (nd, nm) in roles.items():
        per_layer = (lc["a_dense"], lc["a_moe"])
        # looped: every layer of the rank holds its micro-batches in flight; the head's logits
        # wait for their backward, all M under gpipe, one micro-batch's otherwise
        state = _held(infl[r], infl[r], (nd, nm), (0.0, 0.0), per_layer)
        head_mb = np.where(lay.sched == SCHEDULES.index("gpipe"), infl[r], 1.0)
        mtp_mb = infl[r]  # the MTP module's inputs, as the rank's layers
        if np.any(v):  # a V rank holds its two chunks' micro-batches in different numbers
            (a1, b1), (a2, b2) = v_in_flight(lay, np.maximum(stage_of[r], 0), M)
            rows, cd, cm = chunk_layers[r]
            ad, am = np.zeros(len(lay.pp)), np.zeros(len(lay.pp))
            ad[rows], am[rows] = cd[0], cm[0]
            rest = (nd - ad, nm - am)
            s1, s2 = (_held(a, b, (ad, am), rest, per_layer) for a, b in ((a1, b1), (a2, b2)))
            # the state whose device memory is larger binds (the head's chunk: logits, MTP inputs)
            head = lambda b: has_head[r] * (b * mtp_in + _logits(logits_mb, b, kept_b, back_b))  # noqa: E731
            later = s2["acts"] + head(b2) > s1["acts"] + head(b1)
            pick = {k: np.where(later, s2[k], s1[k]) for k in s1}
            state = {k: np.where(v, pick[k], state[k]) for k in state}
            head_mb = np.where(v, np.where(later, b2, b1), head_mb)
            mtp_mb = np.where(v, head_mb, mtp_mb)
        if np.any(looped):  # an interleaved rank holds its chunks' micro-batches in different numbers too
            each, head_chunk = _interleaved_held(lay, M, np.maximum(stage_of[r], 0), chunk_layers[r], per_layer)
            state = {k: np.where(looped, each[k], state[k]) for k in state}
            mtp_mb = np.where(looped, head_chunk, mtp_mb)
        held[r] = state
        layer_acts = state["acts"] / GIB
        # what waits in host memory (Layout.offload_layers, offload_modules)
        parked[r] = _parked(lay, lc, state["dense"], state["moe"], nd, nm, layer_acts) if offloads else 0.0
        parts[r] = {"activations": layer_acts - parked[r] + mtp_mb * has_head[r] * mtp_in / GIB,
                    "logits": has_head[r] * _logits(logits_mb, head_mb, kept_b, back_b) / GIB,
                    "a2a_buffers": np.where(nm > 0, a2a_buf, 0.0) / GIB, "recomputed_layer": _rebuilt(lay, lc, nd, nm),
                    "cp_buffers": np.where(nd + nm > 0, cp_buf, 0.0) / GIB}
    # piper-train's (unfused) bf16 weight copies: priced only where a layout has them; a rank's
    # micro-batches in flight weighed by its layers (a V rank's two chunks hold different numbers)
    if np.any(lay.unfused & (lay.act_bytes == 2)):
        casts = {r: cast_copies(m, lay, _share(held[r]["dense"] + held[r]["moe"], nd + nm))
                 for r, (nd, nm) in roles.items()}
    else:
        casts = {}
    return {"stage_of": stage_of, "casts": casts, "parts": parts, "parked": parked}


def cp_buffers(m: ModelSpec, lay: LayoutBatch) -> np.ndarray:
    """Bytes one attention layer's context parallelism holds beyond its saved activations while it
    runs (Layout.cp_comm; Transformer Engine's context_parallel.py), the rank's K and V being kv
    bytes, at least: p2p, the chunk each ring step receives, kept to the forward's end
    (p2p_comm_buffers: cp of them), or the backward's two buffers of K, V and their gradients
    (4·kv); all_gather, the gathered K and V and, in the backward, the full-length dK and dV
    (2·cp·kv); a2a, each of Q, K and V laid out for the exchange and received (2·(q + kv));
    a2a+p2p, the larger of its two levels' (its ring over cp/cp_a2a ranks), which hold theirs one
    after the other. 0 at cp 1."""
    cp = lay.cp.astype(float)
    q, kv, _ = cp_tensor_bytes(m, lay)
    n = lay.cp_ring.astype(float)
    out = np.maximum(np.where(n > 1, np.maximum(n, 4.0) * kv, 0.0), np.where(lay.cp_a2a_group > 1, 2.0 * (q + kv), 0.0))
    out = np.where(lay.cpc == CP_COMMS.index("all_gather"), 2.0 * cp * kv, out)
    return np.where(cp > 1, out, 0.0)


def logits_bytes(eb, compiled_loss, eager):
    """(kept, added): bytes an element of the LM head's logits keeps for its loss's backward, and
    what that backward adds at its peak, by how the loss runs (`eb`: the logits' dtype):
    - Megatron-Core's vocab-parallel cross-entropy (Layout.cross_entropy fused): one fp32 copy made
      the softmax and kept (4), made the gradient in place and cast (eb);
    - torch's F.cross_entropy on an fp32 copy (`eager`): log_softmax's fp32 output kept (4), and
      nll_loss's and log_softmax's fp32 gradients beside it (8);
    - under torch.compile (`compiled_loss`): Inductor's partitioner keeps the logits themselves and
      two fp32 figures a token, the max and the log-sum-exp (added by the caller), re-makes the
      softmax in the backward and writes the gradient in the logits' dtype (eb, eb).
    Counted op by op on CPU: tests/test_cross_entropy.py and tests/test_compiled.py."""
    return np.where(compiled_loss, eb, 4.0), np.where(compiled_loss, eb, np.where(eager, 8.0, eb))


def _logits(per_mb, n, kept_b, back_b):
    """Bytes of the LM head's logits with `n` micro-batches of its chunk in flight (`per_mb`
    logits each): `kept_b` an element kept for each one's loss backward, and `back_b` an element
    that the backward of the one in it adds (logits_bytes)."""
    return per_mb * (kept_b * n + back_b * np.minimum(n, 1.0))


def _interleaved_held(lay: LayoutBatch, M, rank, chunk_layers: tuple, per_layer) -> tuple[dict, np.ndarray]:
    """_held's figures for an interleaved rank, per layout, and the micro-batches its last chunk
    holds then: of the Pareto-maximal states of its order (memory.interleaved_states: each chunk's
    micro-batches in flight), the one whose activations, each chunk's count times its layers'
    bytes, are largest. Layouts not interleaved get zeros (and one micro-batch), which the caller
    does not read."""
    rows, dense, moe = chunk_layers
    a_d, a_m = (np.broadcast_to(np.asarray(x, float), lay.pp.shape) for x in per_layer)
    out = {k: np.zeros(len(lay.pp)) for k in ("acts", "dense", "moe")}
    head = np.ones(len(lay.pp))
    il = np.flatnonzero((lay.sched == SCHEDULES.index("interleaved")) & (lay.pp > 1))
    if not il.size:
        return out, head
    M = np.asarray(M)
    key = (lay.pp[il], lay.vpp[il], np.minimum(M[il], 2 * lay.pp[il]), np.asarray(rank)[il], lay.ep_overlap[il])
    _, first, inv = distinct_rows(*key)
    at = np.searchsorted(rows, il)  # the layouts' columns among those run in several chunks
    d, mo = dense[:, at], moe[:, at]
    w = d * a_d[il] + mo * a_m[il]  # [max vpp, layouts]: bytes a micro-batch in flight holds of each chunk
    # per order, on its layouts (contiguous once sorted by order): the state whose activations are largest
    order = np.argsort(inv, kind="stable")
    bounds = np.searchsorted(inv[order], np.arange(len(first) + 1))
    pick = np.zeros((len(il), len(w)))  # [layouts, max vpp]: each one's binding state
    for g, f in enumerate(first):
        states = interleaved_states(*(int(k[f]) for k in key))  # [K, vpp]
        cols = order[bounds[g]:bounds[g + 1]]
        pick[cols, :states.shape[1]] = states[np.argmax(states @ w[:states.shape[1], cols], axis=0)]
    out["acts"][il] = np.einsum("nv,vn->n", pick, w)
    out["dense"][il] = np.einsum("nv,vn->n", pick, d)
    out["moe"][il] = np.einsum("nv,vn->n", pick, mo)
    head[il] = pick[np.arange(len(il)), lay.vpp[il] - 1]
    return out, head


def _held(a, b, chunk_a, chunk_b, per_layer) -> dict:
    """Bytes of saved activations ("acts") and layer-micro-batches of dense and MoE layers
    ("dense", "moe") a rank holds with `a` micro-batches in flight in the layers `chunk_a`
    (dense, MoE) and `b` in `chunk_b`; per_layer: (dense, MoE) bytes a layer and micro-batch."""
    dense = a * chunk_a[0] + b * chunk_b[0]
    moe = a * chunk_a[1] + b * chunk_b[1]
    return {"acts": dense * per_layer[0] + moe * per_layer[1], "dense": dense, "moe": moe}


def _share(part, whole):
    """part / whole, 0 where whole is not positive."""
    whole = np.asarray(whole, float)
    return np.divide(part, whole, out=np.zeros(np.broadcast_shapes(np.shape(part), whole.shape)), where=whole > 0)


def _rebuilt(lay: LayoutBatch, lc: dict, nd, nm) -> np.ndarray:
    """GiB of the one layer recompute rebuilds at a time in the backward, beside the layer inputs
    it keeps: under full recompute what the largest kind of layer on the rank saves without
    recompute, less its input, which the rank holds already (recompute.with_recompute's
    rc_<dense|moe>); under selective recompute (Megatron's modules, torchtitan's per-op policy) what
    the largest kind of layer saves without recompute less what the selection kept
    (rc_<dense|moe>_sel): the re-run modules' internals exist one layer and one micro-batch at a
    time beside everything kept, as full recompute's layer does. 0 otherwise. Reported apart from
    "activations", which stay what Korthikanti 2022 counts."""
    has_d, has_m = np.asarray(nd) > 0, np.asarray(nm) > 0
    full = np.maximum(np.where(has_d, lc["rc_dense"], 0.0), np.where(has_m, lc["rc_moe"], 0.0))
    sel = np.maximum(np.where(has_d, lc["rc_dense_sel"], 0.0), np.where(has_m, lc["rc_moe_sel"], 0.0))
    return np.where(lay.recompute == 2, full, np.where(lay.recompute == 1, sel, 0.0)) / GIB


def _parked(lay: LayoutBatch, lc: dict, dense, moe, nd, nm, layer_acts):
    """GiB of a rank's activations in host memory: Layout.offload_layers' share of its layers
    (`layer_acts` GiB in all, `dense` and `moe` layer-micro-batches of its nd dense and nm MoE
    layers in flight), and what Layout.offload_modules park of the others, but one layer's:
    Megatron-Core keeps the last group of each module on the device, whose backward runs first,
    so its reload never blocks (PipelineOffloadManager.post_warmup_callback, the offload margin)."""
    share = offloaded_share(lay, nd + nm)
    kept = np.maximum(np.where(nm > 0, lc["o_moe"], 0.0), np.where(nd > 0, lc["o_dense"], 0.0))
    modules = np.maximum(dense * lc["o_dense"] + moe * lc["o_moe"] - kept, 0.0) / GIB
    return share * layer_acts + (1.0 - share) * modules


def rank_memory(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, roles: dict, has_emb: dict, has_head: dict,
                acts: dict, P_rep: dict, P_exp: dict, tables: dict, edp):
    """GiB per component on each role's rank (first, mid, last stage: `roles` gives their
    dense and MoE layer counts, has_emb / has_head whether it holds the embedding / LM head,
    `acts` what it holds whatever the ZeRO stage (role_activations), P_rep / P_exp its
    replicated and expert parameters, `tables` the embedding and LM-head parameters among
    P_rep: memory.table_params), the worst rank's total, each role's
    stage (-1: no such rank) and the largest GiB a rank keeps in host memory
    (Layout.optimizer_offload, offload_layers; 0 where nothing is offloaded)."""
    n = len(lay)
    stage_of = acts["stage_of"]
    # bytes per parameter, in GiB (dividing by a power of two first changes no bit of the result)
    c_rep = {k: v / GIB for k, v in state_coeffs(lay.dpcp, lay).items()}
    c_exp = {k: v / GIB for k, v in state_coeffs(edp, lay).items()}
    mem = {}
    peak = np.zeros(n)
    host_peak = np.zeros(n)
    offloads = uses_host(lay)
    if offloads:  # what the host holds: nothing, and not worth pricing, where no layout offloads
        h_rep = sum(state_coeffs(lay.dpcp, lay, host=True).values()) / GIB
        h_exp = sum(state_coeffs(edp, lay, host=True).values()) / GIB
    # piper-train's (unfused) bf16 weight copies and ZeRO-2 buckets: priced only where a layout has them
    casts = acts["casts"]
    with_casts = any(np.any(v > 0) for v in casts.values())
    with_buckets = bool(np.any((lay.zero == 2) & lay.unfused))
    if with_buckets:  # GiB of gradient per parameter of one chunk
        gb = grad_bytes(lay, lay.act_bytes.astype(float)) / lay.vpp.astype(float) / GIB
    # ZeRO-3's gathered units, priced on the layouts that shard their weights only
    z3 = np.flatnonzero(lay.zero >= 3)
    with_z3 = z3.size > 0
    if with_z3:
        lz = lay.take(z3)
        eb_z3 = lz.act_bytes.astype(float)
        blocks = layer_params_per_rank(m, lz)  # (dense, MoE replicated, experts) a layer
        sub = lambda x: np.broadcast_to(x, (n,))[z3]  # noqa: E731
    overhead = np.full(n, hw.memory_overhead_gib)  # the runtime's reserve, every rank's (shared, read only)
    with_fp8 = bool(np.any(lay.fp8))
    if with_fp8:  # FP8 weights or TE's FP8 copies of the layers' GEMM weights, GiB a parameter
        any_layout = hw.accelerator.fp8_any_layout
        x_rep, x_exp = fp8_weight_extra(lay, lay.dpcp, any_layout) / GIB, fp8_weight_extra(lay, edp, any_layout) / GIB
    for r, (nd, nm) in roles.items():
        comps = {k: P_rep[r] * c_rep[k] + P_exp[r] * c_exp[k] for k in c_rep}  # weights, grads, master, optimizer
        if with_fp8:  # the layers' linear layers: not the embedding or the LM head, which stay in the dtype
            comps["weights"] = comps["weights"] + (P_rep[r] - tables[r]) * x_rep + P_exp[r] * x_exp
        if with_casts:  # reported apart only where a layout holds more than one copy
            # an embedding table no LM head on the rank reads is looked up, never cast (cast_copies)
            uncast = has_emb[r] * m.embedding_params / lay.tp.astype(float) * (1 - (m.tied_embeddings & has_head[r]))
            comps["weight_casts"] = (comps["weights"] - uncast * c_rep["weights"]) * casts[r]
        comps.update(acts["parts"][r])  # activations, logits, all-to-all buffers
        comps["grad_buckets"] = bucket_gib(lay, edp, P_rep[r] * gb, P_exp[r] * gb) if with_buckets else np.zeros(n)
        if with_z3:  # reported apart only where a layout shards its weights (ZeRO-3)
            unit = largest_unit(m, lz, blocks, sub(nd), sub(nm), sub(has_emb[r]), sub(has_head[r]))
            comps["zero3_units"] = np.zeros(n)
            comps["zero3_units"][z3] = zero3_gathered_bytes(lz, eb_z3, unit, sub(P_rep[r] + P_exp[r])) / GIB
        comps["overhead"] = overhead
        comps["total"] = sum(comps.values())
        if offloads:  # offloaded: not in the device total
            comps["host"] = on_host = P_rep[r] * h_rep + P_exp[r] * h_exp + acts["parked"][r]
            host_peak = np.maximum(host_peak, np.where(stage_of[r] >= 0, on_host, 0.0))
        mem[r] = comps
        peak = np.maximum(peak, np.where(stage_of[r] >= 0, comps["total"], 0.0))
    return mem, peak, stage_of, host_peak


def cast_copies(m: ModelSpec, lay: LayoutBatch, infl) -> np.ndarray:
    """bf16 copies of a rank's weights held beyond the state's one ("weights"), per layout.
    piper-train (unfused modules) keeps fp32 weights and autocast casts them to bf16 in each
    micro-batch's forward; the copies stay saved for that micro-batch's backward (its matmuls'
    inputs), so a rank holds one per micro-batch in flight, except in the layers full recompute
    re-runs, which save only their input and cast again in the backward. Measured on the CPU
    (tests/test_weight_casts.py): each micro-batch in flight holds its own copy of every matrix
    of a block. The copies are of the weights a rank casts: all but an embedding table that no
    LM head on the rank reads (rank_memory's `uncast`; norms and routers, which stay fp32, are
    counted: a few per mille). 0 for fused stacks (bf16 weights kept once) and fp32 training."""
    kept = np.where(lay.recompute == 2, 1.0 - full_recompute_share(m, lay), 1.0)
    return np.where(lay.unfused & (lay.act_bytes == 2), np.maximum(np.asarray(infl, float) - 1.0, 0.0) * kept, 0.0)


def bucket_gib(lay: LayoutBatch, edp, rep_gib, exp_gib):
    """GiB of full gradients a ZeRO-2 rank holds at its peak while one chunk's backward fills
    the reduction buckets (rep_gib / exp_gib: that chunk's replicated and expert gradients).
    Gradients wait in a bucket per owner and replication group until it is full or holds
    BUCKET_CAP_BYTES; owners interleave along the backward (whole parameters balanced by size),
    so every owner's bucket fills side by side: min(a group's gradients, owners x cap) per
    group, plus the flat copy one bucket is reduced from, one owner's share at most
    (runtime/optim.py, piper-train's ZeRO-2; torch DDP's 25 MiB bucket_cap_mb). 0 for other
    stages (their full gradients are state: memory.state_coeffs) and for the fused stacks,
    whose buckets are their own configuration (DeepSpeed's reduce_bucket_size). Measured on 2
    CPU ranks (tests/test_runtime_zero2.py): the runtime peaks at 0.76 of this bound."""
    cap = BUCKET_CAP_BYTES / GIB
    dp, edp = lay.zero_shard(lay.dpcp), lay.zero_shard(edp)  # the owners a bucket's group has
    rep = np.where(dp > 1, rep_gib, 0.0)  # gradients reduced in buckets: groups of two or more
    exp = np.where(edp > 1, exp_gib, 0.0)
    held = np.minimum(rep, dp * cap) + np.minimum(exp, edp * cap)
    # a bucket is one owner's share of its group (parameters balanced by size over the owners)
    flat = np.minimum(np.maximum(rep / dp, exp / edp), cap)
    return np.where((lay.zero == 2) & lay.unfused, held + flat, 0.0)


def largest_unit(m: ModelSpec, lay: LayoutBatch, blocks, nd, nm, has_emb, has_head):
    """Parameters of the largest ZeRO-3 sharding unit on a rank holding nd dense and nm MoE
    layers, per layout: its TP / EP share of one transformer block (`blocks`: the dense, MoE
    replicated and expert parameters of a layer, memory.layer_params_per_rank), the embedding
    table or the LM head (vocab x hidden, tied or not). FSDP2 wraps each block, and the
    embedding and the head, as units of their own (torchtitan's fully_shard plan)."""
    dense_p, moe_rep_p, exp_p = blocks
    tp = lay.tp.astype(float)
    units = [np.where(np.asarray(nd) > 0, dense_p, 0.0), np.where(np.asarray(nm) > 0, moe_rep_p + exp_p, 0.0),
             has_emb * m.embedding_params / tp, has_head * float(m.vocab_size * m.hidden_size) / tp]
    return reduce(np.maximum, units)
