"""One layer's costs under many layouts at once: the per-micro-batch phases of a dense and a MoE
layer (compute and communication), the embedding and the LM head, a MoE layer's all-to-all, the
routed-load imbalance and the activation bytes, priced once per distinct combination of the
columns they read (_per_layer). estimate._pipeline builds a pipeline's ranks from them.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from ..layout import SCHEDULES
from ..specs.hardware import HardwareSpec
from ..specs.model import ModelSpec
from . import activations as act
from . import comm, host
from .batch import A2AS, CP_COMMS, LayoutBatch, distinct_rows, first_rows, recomputes, take_rows
from .compute import (Phase, attention_phase, column_wgrad, core_attention, cp_tensor_bytes, embedding_phase,
                      expert_gemms, ffn_phase, lm_head_phase, moe_phase, tp_overlappable)
from .imbalance import expert_popularity, imbalance, observed_rows
from .kernels import stream_time
from .memory import layer_params_per_rank
from .recompute import full_recompute_share, with_recompute

if TYPE_CHECKING:  # estimate imports this module
    from .estimate import Routing


def _tp_calls(lay) -> np.ndarray:
    """Collective calls one tensor-parallel all-reduce equivalent makes: a reduce-scatter and an
    all-gather with sequence parallelism, one all-reduce without (none at tp 1)."""
    return np.where(lay.tp > 1, np.where(lay.sp, 2.0, 1.0), 0.0)


def _tp_allreduce(hw, lay, nbytes, fraction=1.0, calls=None):
    """Seconds of a tensor-parallel all-reduce of `nbytes` (`fraction` 0.5: its reduce-scatter or
    all-gather half), with each of its `calls` (default _tp_calls) at the spec's fixed cost a call
    (efficiency.collective_overhead_us: on shared cores a call waits for its peers to be scheduled;
    0 on the GPU specs). Without it piper-train's tp 2 on 2 CPU ranks ran 2.6x its price: 27 calls a
    micro-batch at 1.9 ms of α-β and none of the 0.73 ms each waits for its peer."""
    co = hw.efficiency.collective_overhead_us * 1e-6
    calls = _tp_calls(lay) if calls is None else np.where(lay.tp > 1, calls, 0.0)
    return comm.ring_allreduce(hw, nbytes, lay.tp, 1, fraction, world=lay.gpus) + co * calls


def _rows_half(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch) -> np.ndarray:
    """A reduce-scatter or an all-gather of a layer's rows (t x d) over tp, one call."""
    return _tp_allreduce(hw, lay, lay.tokens * m.hidden_size * lay.act_bytes.astype(float), 0.5, np.ones(len(lay)))


def _router_stats(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch) -> np.ndarray:
    """piper-train's router's all-reduce of its balance statistics over tp (2E + 2 fp32), one call."""
    return _tp_allreduce(hw, lay, (2.0 * m.moe.num_experts + 2.0) * 4.0, 1.0, np.ones(len(lay)))


def _dgrad_beside(lay: LayoutBatch) -> np.ndarray:
    """Layouts whose backward all-reduces a column-parallel layer's input gradient while its
    weight gradient computes (Layout.tp_async_dgrad): fused stacks at tp > 1 without sequence
    parallelism or Transformer Engine's overlap (_tp_exposed)."""
    return (lay.tp_async & ~lay.sp.astype(bool) & ~lay.unfused.astype(bool) & ~lay.tp_overlap.astype(bool)
            & (lay.tp > 1))


def _moe_tp_extra(m: ModelSpec, lay: LayoutBatch, tp_ar, half, stats) -> Phase:
    """A MoE layer's tensor-parallel collectives beyond its attention's, a micro-batch: the shared
    experts' FFN enters and leaves the tensor-parallel region as a dense FFN does (one all-reduce
    equivalent each way; left to the dense FFN's own rules where the stack overlaps or hides
    those, Layout.tp_comm_overlap / tp_async_dgrad, which this does not price), tokens replicated
    over tp (no sequence parallelism) are split before routing and gathered after (an
    all-gather each way, `half`: one of a layer's rows), and piper-train's router sums its
    balance statistics over tp (`stats`: one small all-reduce forward, 2E + 2 fp32 figures)."""
    z = np.zeros(len(lay))
    plain = ~(lay.tp_overlap.astype(bool) | _dgrad_beside(lay))
    shared = np.where(plain & bool(m.moe.shared_experts), tp_ar, 0.0)
    rows = np.where(lay.sp.astype(bool), 0.0, half)
    stats = np.where(lay.unfused.astype(bool), stats, 0.0)
    return Phase(shared + rows + stats, shared + rows, z, z)


def _vocab_parallel(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, half, head_w=0.0) -> tuple[Phase, Phase]:
    """(embedding, LM head) tensor-parallel collectives a micro-batch, each its forward and backward
    seconds. The vocab-parallel embedding sums its rows over tp (a reduce-scatter into the
    sequence-parallel layout, an all-reduce without; its backward all-gathers the gradient under
    sequence parallelism), the head gathers its input (and reduce-scatters its gradient) where
    the sequence is split, and the vocab-parallel cross-entropy all-reduces three per-token
    figures (the max, the sum of exponentials, the target's logit; Megatron-Core's
    _VocabParallelCrossEntropy, piper-train's tp.vocab_parallel_cross_entropy). Without sequence
    parallelism a fused stack all-reduces the head's input gradient beside its weight-gradient
    GEMM (`head_w` seconds; _dgrad_beside). `half`: a reduce-scatter or an all-gather of a
    layer's rows, one call."""
    z = np.zeros(len(lay))
    one = np.ones(len(lay))
    whole = _tp_allreduce(hw, lay, lay.tokens * m.hidden_size * lay.act_bytes.astype(float), 1.0, one)
    ce = 3.0 * _tp_allreduce(hw, lay, lay.tokens * 4.0, 1.0, one)
    sp = lay.sp.astype(bool)
    emb = Phase(np.where(sp, half, whole), np.where(sp, half, z), z, z)
    back = np.where(_dgrad_beside(lay), np.maximum(whole - head_w, 0.0), whole)
    head = Phase(np.where(sp, half, z) + ce, np.where(sp, half, back), z, z)
    return emb, head


def _a2a(hw, lay, nbytes, m: ModelSpec):
    stride, world = lay.ep_stride, lay.gpus
    flat = comm.a2a_flat(hw, nbytes, lay.ep, stride, world)
    halo = comm.a2a_halo(hw, nbytes, lay.ep, stride, flat=flat, world=world)
    out = np.where(lay.a2a == 1, halo, flat)
    if (lay.a2a == 2).any():  # token-level (DeepEP / HybridEP)
        mo = m.moe
        dedup = comm.a2a_dedup(hw, nbytes, lay.ep, stride, mo.num_experts, mo.top_k, *mo.routing_groups,
                               world=world)
        out = np.where(lay.a2a == 2, dedup, out)
    return out


def _per_layer(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, ep_stride, routing: Routing, dtype: str):
    """(per-layer terms of every layout (_layer_terms; x_first and x_last stay per distinct
    row), each layout's distinct row). Per-layer costs depend on few columns, so each
    distinct combination (~1-3 thousand in a search) is priced once; recompute only changes
    what the backward re-runs and what is saved, so the costs are priced once per combination
    without it (_layer_base) and the recompute variants derived from them (recompute.with_recompute)."""
    # the EP group's stride stands in for dp: nothing per-layer depends on dp otherwise; the world
    # sets where the groups meet domain boundaries (comm.level_counts)
    key = (lay.mbs, lay.seq, lay.tp, lay.cp, lay.cpc, lay.cpa, ep_stride, lay.ep, lay.etp, lay.sp, lay.eager, lay.fa2,
           lay.unfused, lay.native, lay.cmodel, lay.ce_eager, lay.closs, lay.egemm, lay.dropout, lay.act_bytes,
           lay.probs_act, lay.gpus, lay.a2a, lay.placement, lay.rc_mods, lay.graphs, _a2a_off_stream(lay),
           lay.tp_overlap, lay.attn_fp8)
    # codes in the key's order, so grouping (code, recompute...) groups (key..., recompute...) alike
    _, first_key, code = distinct_rows(*key)
    _, first1, inv1 = distinct_rows(code, lay.recompute, lay.rc_layers, lay.pp * lay.vpp)
    inv0 = code.take(first1)  # every key's combination has a row among first1: the same codes
    first0 = first_rows(inv0, len(first_key))
    base = _layer_base(m, hw, lay.take(first1.take(first0)), routing, dtype)
    # what recompute changes, per distinct row (the few columns it reads, not a batch of them all)
    recompute, share = lay.recompute.take(first1), full_recompute_share(m, lay).take(first1)
    # the forward's all-to-all runs again in backward: in the layers full recompute re-runs
    again = np.where(recompute == 2, share, recomputes(lay, "moe").take(first1).astype(float))
    terms = _layer_terms(m, with_recompute({k: v.take(inv0) for k, v in base.items()}, recompute, share), again)
    # the stage partition's inputs stay per distinct row (see estimate._pipeline)
    return {k: v if k in ("x_first", "x_last") else v.take(inv1, axis=-1) for k, v in terms.items()}, inv1


def _exchanges(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, dtype: str, imb, one) -> tuple:
    """(forward, backward) seconds a micro-batch of a MoE layer's dispatch and combine, `one`
    each: both in full, or, fused (Layout.a2a fused: Dist-MoE's distributed grouped GEMMs), what
    the GEMM each runs inside does not cover. The forward's dispatch is loaded by fc1's producer
    warps and its combine stored by fc2's epilogue; the backward's output-gradient dispatch feeds
    fc2's dgrad and its input-gradient combine leaves fc1's (dist_moe docs/mxfp8_kernel_design.md:
    dgrad_dispatch, then dgrad_swiglu_bwd_combine); the wgrad GEMMs run after, beside nothing. A
    kernel that both moves and computes lasts the longer of the two (tile by tile: the rows one
    tile waits for are a ~1/(m/tile) share of the exchange, left out)."""
    fused = lay.a2a == A2AS.index("fused")
    if not fused.any():
        return 2 * one, 2 * one
    up, down = expert_gemms(m, hw, lay, dtype, imb)
    over = lambda gemm: np.maximum(one - gemm, 0.0)  # noqa: E731
    return (np.where(fused, over(up.f) + over(down.f), 2 * one),
            np.where(fused, over(down.b) + over(up.b), 2 * one))


def _dualpipe_overlaps(lay: LayoutBatch) -> np.ndarray:
    """dualpipev layouts whose runtime overlaps a forward chunk with another micro-batch's
    backward chunk: DeepSeek's DualPipe does (fused stacks); piper-train (Layout.fused_kernels
    false) runs torch's ScheduleDualPipeV, whose OVERLAP_F_B actions perform their forward and
    backward sub-actions in turn unless a custom function is registered for them
    (torch/distributed/pipelining/schedules.py, _PipelineScheduleRuntime), and registers none."""
    return (lay.sched == SCHEDULES.index("dualpipev")) & ~lay.unfused


def _a2a_off_stream(lay: LayoutBatch) -> np.ndarray:
    """Whether a layout's all-to-all runs beside another micro-batch's compute rather than in
    its own layer's stream (Layout.a2a_overlap, an overlapping dualpipev): the host floor
    compares the host's issue time with the stream without it (cost/host.py)."""
    return lay.ep_overlap | _dualpipe_overlaps(lay)


def _layer_terms(m: ModelSpec, lc: dict, a2a_again) -> dict:
    """What the step model reads from per-layer costs (_layer_costs), as arrays: phases
    `<dense|moe|emb|head|dense_comm|moe_comm>_v` ([f b w r, n]), their totals
    (Td, Tm, Te, Th, Tdc, Tmc), whole-layer seconds, the embedding and head in
    layer-equivalents (x_first, x_last: the stage partition's input), one MoE layer's
    all-to-all seconds per micro-batch (a2a_layer; the forward's own, a2a_f_layer; what a paired
    schedule hides of them, a2a_hide, and of the forward's, a2a_hide_f), imb and activation bytes."""
    dense, dense_comm, moe, moe_comm, emb, head = (lc[k] for k in ("dense", "dense_comm", "moe", "moe_comm", "emb",
                                                                   "head"))
    dense_layer, moe_layer = (dense + dense_comm).total, (moe + moe_comm).total
    avg_layer = (m.num_dense_layers * dense_layer + m.num_moe_layers * moe_layer) / m.num_layers
    again = np.asarray(a2a_again, dtype=float)
    # MTP: each module's projection (2d -> d) and its pass through the shared head ride on the
    # head's phase, the projection at the head GEMM's rate (2d/V of its FLOPs); its block joins
    # the head's rank as a layer (estimate.evaluate), so the partition counts it with the head
    head = head.scale(1.0 + m.mtp_layers * (1.0 + 2.0 * m.hidden_size / m.vocab_size))
    block = m.mtp_layers * (moe_layer if m.mtp_is_moe else dense_layer)
    Te, Th = emb.total, head.total
    out = dict(dense_layer=dense_layer, moe_layer=moe_layer, x_first=Te / avg_layer, x_last=(Th + block) / avg_layer,
               Td=dense.total, Tm=moe.total, Te=Te, Th=Th, Tdc=dense_comm.total, Tmc=moe_comm.total,
               a2a_layer=lc["a2a_fwd"] * (1 + again) + lc["a2a_bwd"],  # full or moe recompute repeats the forward's
               a2a_f_layer=lc["a2a_fwd"], a2a_bwd_layer=lc["a2a_bwd"],  # the forward's own (a re-run is the backward's)
               imb=lc["imb"], a_dense=lc["a_dense"], a_moe=lc["a_moe"], rc_dense=lc["rc_dense"], rc_moe=lc["rc_moe"],
               rc_dense_sel=lc["rc_dense_sel"], rc_moe_sel=lc["rc_moe_sel"],
               cp_layer=lc["cp_layer"],
               dense_host=lc["dense_host"], moe_host=lc["moe_host"], a2a_hide=lc["a2a_hide"],
               a2a_hide_f=lc["a2a_hide_f"], moe_host_f=lc["moe_host_f"])
    for name, ph in (("dense", dense), ("moe", moe), ("emb", emb), ("head", head), ("dense_comm", dense_comm),
                     ("moe_comm", moe_comm)):
        out[f"{name}_v"] = ph.v
    return out


def _layer_overhead(hw: HardwareSpec, kind: str, dtype: str, n: int) -> Phase:
    """Efficiency.layer_overhead_us of one block as a Phase for n layouts: a third in forward,
    two thirds in backward (autograd replays about two host operations per forward one);
    recompute repeats the forward share (recompute.with_recompute)."""
    s = hw.efficiency.layer_overhead_us.get(f"{kind}_{dtype}", 0.0) * 1e-6
    z = np.zeros(n)
    return Phase(z + s / 3, z + 2 * s / 3, z, z)


def _weight_casts(hw: HardwareSpec, lay: LayoutBatch, params) -> Phase:
    """Eager bf16 under autocast over fp32 weights (piper-train: Layout.fused_kernels false):
    every micro-batch casts each local weight to bf16 (read 4 B, write 2 B) and, in backward,
    casts its bf16 gradient back (read 2, write 4) and adds it into the fp32 .grad (read 4 + 4,
    write 4): 6 and 18 bytes per parameter. Fused-kernel runtimes keep bf16 weights: none."""
    on = lay.unfused & (lay.act_bytes == 2)
    p = np.where(on, params, 0.0)
    z = np.zeros(len(lay))
    c = hw.efficiency.cast or 1.0  # a CPU's conversion kernel runs below its streaming rate (calibrate)
    cast = stream_time(hw, 6.0 * p, 0) / c
    return Phase(cast, cast + stream_time(hw, 12.0 * p, 0), z, z)


def _layer_costs(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, routing: Routing, dtype: str) -> dict:
    """Per-micro-batch phases of one dense and one MoE layer (compute and communication),
    the embedding and LM head, a MoE layer's all-to-all seconds, the routed-load imbalance
    and per-layer activation bytes, for each layout of `lay` (its recompute included).
    Values are Phases or arrays (both support .take)."""
    return with_recompute(_layer_base(m, hw, lay, routing, dtype), lay.recompute, full_recompute_share(m, lay))


def _cp_exposed(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, core: Phase) -> Phase:
    """Context parallelism's communication in one attention layer for one micro-batch that a rank
    waits for beside that layer's `core` attention (compute.core_attention), over its cp ranks (tp
    apart), as its Layout.cp_comm moves keys (Transformer Engine's context_parallel.py;
    Megatron-Core's cp_comm_type, default p2p):
    - p2p (AttnFuncWithCPAndKVP2P): the rank's K and V chunk passes round the ring, cp − 1 steps,
      each behind the attention kernel of a chunk already held; the backward passes K, V and their
      gradients, twice the bytes. A step exposes what its transfer takes beyond its kernel's share
      of the core attention. MLA passes its full-width K and V heads.
    - all_gather (AttnFuncWithCPAndKVAllGather, "exposed"): K and V all-gathered before the
      kernels, one call each; the backward gathers them again and reduce-scatters dK and dV.
    - a2a (AttnFuncWithCPAndQKVOA2A, Ulysses): Q, K and V each exchanged all-to-all before the
      kernel and the output after it; the backward exchanges the output and its gradient, then the
      gradients of Q, K and V: seven calls, each rank sending (cp − 1)/cp of its share of each,
      none behind compute.
    - a2a+p2p (AttnFuncWithCPAndKVP2P over two groups): a2a's exchanges over cp_a2a neighbouring
      ranks (tp apart), and between them the ring over cp/cp_a2a of those groups (tp·cp_a2a
      apart), passing the same bytes a step as p2p's (cp_a2a times the tokens, 1/cp_a2a the heads)."""
    z = np.zeros(len(lay))
    if not (lay.cp > 1).any():
        return Phase(z, z, z, z)
    dqk, dv = m.qk_v_dims
    q_bytes, kv, o_bytes = cp_tensor_bytes(m, lay)
    # the ring (p2p, a2a+p2p's outer level), one step: one of a ring all-gather's n - 1 steps over the levels
    # the group spans
    n, apart = lay.cp_ring, lay.tp * lay.cpa
    more = n - 1.0
    span = comm.group_span(hw, n, apart, lay.gpus)
    step = comm.ring_allreduce(hw, kv * n, n, apart, 0.5, span=span, world=lay.gpus) / np.maximum(more, 1.0)
    f = more * np.maximum(step - core.f / n, 0.0)
    b = more * np.maximum(2.0 * step - core.b / n, 0.0)
    if (lay.cpc == CP_COMMS.index("p2p")).all():
        return Phase(f, b, z, z)
    gathered = lay.cpc == CP_COMMS.index("all_gather")
    if gathered.any():
        span = comm.group_span(hw, lay.cp, lay.tp, lay.gpus)
        lat = comm.call_latency(hw, lay.cp, lay.tp, span=span)  # the second of two calls (K and V; dK and dV)
        gather = comm.allgather(hw, kv * lay.cp, lay.cp, lay.tp, span=span, world=lay.gpus) + lat
        scatter = comm.ring_allreduce(hw, kv * lay.cp, lay.cp, lay.tp, 0.5, span=span, world=lay.gpus) + lat
        f, b = np.where(gathered, gather, f), np.where(gathered, gather + scatter, b)
    group = lay.cp_a2a_group
    if (group > 1).any():  # a2a, and a2a+p2p's inner level beside its ring
        per = lambda nbytes: comm.a2a_call(hw, nbytes, group, lay.tp, False, world=lay.gpus)  # noqa: E731
        k_share = dqk / (dqk + dv)  # K's part of the K and V bytes, each its own call
        q, k, v, o = per(q_bytes), per(kv * k_share), per(kv * (1.0 - k_share)), per(o_bytes)
        f, b = f + np.where(group > 1, q + k + v + o, 0.0), b + np.where(group > 1, 2.0 * o + q + k + v, 0.0)
    cp1 = lay.cp == 1
    return Phase(np.where(cp1, 0.0, f), np.where(cp1, 0.0, b), z, z)


def _tp_exposed(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, dtype: str, tp_ar) -> tuple[Phase, Phase]:
    """(dense layer, MoE layer) tensor-parallel collective seconds a micro-batch's forward and
    backward expose: a dense layer's two all-reduce equivalents (an all-gather and a
    reduce-scatter each with sequence parallelism), a MoE layer's attention one. Under
    Layout.tp_comm_overlap each collective is split into chunks pipelined with the GEMM beside
    it (Transformer Engine's userbuffers: the all-gathers before QKV and fc1 and the
    reduce-scatters after the projections by ring exchange or a pipelined GEMM, the backward's by
    bulk overlap with the dgrad and wgrad GEMMs, Megatron-Bridge's TransformerLayerTPOverlapCfg),
    so only what the block's linear layers cannot cover stays exposed. The SMs some of those
    methods hold (1-24 of a GPU's in the published configs) are not priced. Without either and
    without sequence parallelism, a fused runtime's backward all-reduces the input gradient of
    each column-parallel layer (q/k/v, the FFN's up projection) while that layer computes its
    weight gradient (Layout.tp_async_dgrad), so each exposes only what the GEMM leaves; with
    sequence parallelism the backward's all-gathers and reduce-scatters stay priced exposed, as
    Korthikanti et al. 2022 measure them (their Table 4: a layer's backward 11.8 ms with it,
    11.9 without; §6.2: a reduce-scatter and an all-gather run slower than the all-reduce they
    replace; validation/layer_korthikanti_table4.csv)."""
    z = np.zeros(len(lay))
    dense, moe = Phase(2 * tp_ar, 2 * tp_ar, z, z), Phase(tp_ar, tp_ar, z, z)
    on = lay.tp_overlap & (lay.tp > 1)
    beside = _dgrad_beside(lay)
    if beside.any():
        w_attn, w_ffn = column_wgrad(m, hw, lay, dtype)
        left_attn = np.maximum(tp_ar - w_attn, 0.0)
        dense = Phase(dense.f, np.where(beside, left_attn + np.maximum(tp_ar - w_ffn, 0.0), dense.b), z, z)
        moe = Phase(moe.f, np.where(beside, left_attn, moe.b), z, z)
    if not on.any():
        return dense, moe
    lin_a, lin_f = tp_overlappable(m, hw, lay, dtype)

    def hide(comm: Phase, gemm: Phase) -> Phase:
        return Phase(np.where(on, np.maximum(comm.f - gemm.f, 0.0), comm.f),
                     np.where(on, np.maximum(comm.b - gemm.b - gemm.w, 0.0), comm.b), z, z)

    return hide(dense, lin_a + lin_f), hide(moe, lin_a)


def _layer_base(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, routing: Routing, dtype: str) -> dict:
    """_layer_costs without recompute, whatever `lay` says, except that the dense and MoE
    phases' r is selective recompute's (the core attention forward) and activations come
    both ways (a_<dense|moe>_<sel|none>, plus the layer input a_in): recompute.with_recompute
    derives each layout's recompute from these."""
    sel = replace(lay, recompute=np.ones(len(lay), int))  # attention_phase prices r = core.f
    eb = lay.act_bytes.astype(float)
    tp = lay.tp.astype(float)
    t = lay.tokens
    d = m.hidden_size
    zero = np.zeros(len(lay))
    # the attention and the dense FFN read a few of the columns: priced once per distinct combination
    _, first, inv = distinct_rows(*_dense_key(lay))
    blk = _dense_block(m, hw, lay if len(first) == len(lay) else lay.take(first), dtype)
    if len(first) < len(lay):
        blk = {k: v.take(inv) if isinstance(v, Phase) else take_rows(v, inv) for k, v in blk.items()}
    attn, tp_ar, dense, tp_moe, cpx, dense_comm = (blk[k] for k in ("attn", "tp_ar", "dense", "tp_moe", "cpx",
                                                                    "dense_comm"))
    _, moe_rep_p, exp_p = layer_params_per_rank(m, lay)
    host_dense, host_moe = host.layer_ops(m, lay) if hw.efficiency.host_op_us > 0 else (zero, zero)
    dense_host = host.host_gap(host.host_time(hw, host_dense), dense, dense_comm)
    dense = dense + dense_host
    imb = np.ones(len(lay))
    a2a_fwd = a2a_bwd = zero  # all-to-all seconds of one MoE layer per micro-batch, forward / backward
    if m.moe is not None:
        p = expert_popularity(m.moe.num_experts, routing.distribution, routing.zipf_s, routing.histogram)
        mig = routing.migration
        # an EP rank's routed rows: its etp group's, pooled by the all-gather (Layout.etp)
        imb = imbalance(p, lay.ep, t / tp * m.moe.top_k * lay.etp, mig.planner if mig else None,
                        mig.max_moves if mig else None, observed_rows(routing.histogram, routing.distribution))
        experts = moe_phase(m, hw, sel, dtype, imb)
        ovh = _layer_overhead(hw, "moe", dtype, len(lay))
        moe = attn + experts + ovh + _weight_casts(hw, lay, moe_rep_p + exp_p)
        a2a_bytes = t / tp * m.moe.top_k * d * eb
        # the busiest rank receives imb x the bytes from the same peers: its set-ups stay as many
        a2a_one = _a2a(hw, lay, a2a_bytes * imb, m)
        stride = lay.ep_stride
        # one exchange with its per-call floor (HALO: floor, then its dependent rounds), comm.a2a_call;
        # under expert tensor parallelism the dispatch all-gathers the etp group's rows after it and
        # the combine reduce-scatters them before it (AllGather-V / ReduceScatter-V, arXiv
        # 2504.14960 §3.3; the backward mirrors them): an all-reduce's traffic each way
        etp_ex = np.where(lay.etp > 1, comm.ring_allreduce(hw, a2a_bytes * imb * lay.etp, lay.etp, 1,
                                                           world=lay.gpus), 0.0)
        a2a_ex = comm.a2a_call(hw, a2a_bytes * imb, lay.ep, stride, (lay.a2a == 1) | (lay.a2a == 2), wire=a2a_one,
                               world=lay.gpus)
        # dispatch + combine each way; forward first exchanges the per-expert row counts (an int64
        # an expert: a flat exchange of a few bytes a peer, so its floor and a set-up per peer)
        counts = 8.0 * m.moe.num_experts
        call = np.where(lay.ep > 1, comm.a2a_call(hw, counts, lay.ep, stride, False, world=lay.gpus,
                                                  wire=comm.a2a_flat(hw, counts, lay.ep, stride, lay.gpus)), 0.0)
        # arrival skew (comm.skew): the forward's count exchange follows the attention, its combine
        # the experts; the backward's exchanges follow the layer above's and the experts' backward
        # (the host overhead split between the two stretches)
        on = lay.ep > 1
        ex_f, ex_b = _exchanges(m, hw, sel, dtype, imb, a2a_ex)
        a2a_fwd = (ex_f + etp_ex + call
                   + on * (comm.skew(hw, attn.f + ovh.f / 2) + comm.skew(hw, experts.f + ovh.f / 2)))
        a2a_bwd = ex_b + etp_ex + on * (comm.skew(hw, attn.b + attn.w + ovh.b / 2)
                                        + comm.skew(hw, experts.b + experts.w + ovh.b / 2))
        moe_comm = Phase(tp_moe.f + a2a_fwd, tp_moe.b + a2a_bwd, zero, zero)
        ovl = _a2a_off_stream(lay)
        stream = Phase(tp_moe.f + np.where(ovl, 0.0, a2a_fwd), tp_moe.b + np.where(ovl, 0.0, a2a_bwd), zero, zero)
        # the dropless dispatcher's host sync: the GPU work after the layer's last expert issue
        # up to the next sync (the combine, unless overlapped, and the next layer's attention)
        # waits for that issue (host.host_gap)
        after = host.post_sync_ops(m, lay) * hw.efficiency.host_op_us * 1e-6
        tail = attn.f + np.where(ovl, 0.0, a2a_ex)
        moe_host = host.host_gap(host.host_time(hw, host_moe), moe, stream, after, tail)
        moe = moe + moe_host
        # Megatron-Core's 1F1B EP overlap (combined_1f1b schedule_layer_1f1b) runs one layer's
        # forward beside another micro-batch's backward as four pairs: the backward combine with
        # the forward attention, the forward dispatch with the backward experts, the backward
        # dispatch with the forward experts, the forward combine with the backward attention.
        # Each exchange hides only behind its partner node, which lasts its compute or, where the
        # host issues slower, its share of the issue time (recompute, re-run inside a backward
        # node, is left out of the partner: conservative)
        e_f, e_b = a2a_fwd / 2, a2a_bwd / 2
        f_attn, f_moe = (x.f + (ovh.f + moe_host.f) / 2 for x in (attn, experts))
        b_attn, b_moe = (x.b + x.w + (ovh.b + moe_host.b) / 2 for x in (attn, experts))
        a2a_hide_f = np.minimum(e_f, b_moe) + np.minimum(e_f, b_attn)  # the forward's exchanges' share
        a2a_hide = np.minimum(e_b, f_attn) + np.minimum(e_b, f_moe) + a2a_hide_f
    else:
        moe = Phase(zero, zero, zero, zero)
        moe_comm = Phase(zero, zero, zero, zero)
        moe_host = moe
        a2a_hide = a2a_hide_f = zero
    # X-MoE's attention-block checkpoint re-runs the block's tensor-parallel collective too; a
    # re-run core attention its context-parallel ring; a re-run MoE block its forward's exchanges
    # (dispatch, combine, the row counts: a2a_fwd). Read off `sel`, as the phases' r: a row stands
    # here for every recompute of its key (_per_layer), and with_recompute keeps these for the
    # selective layouts alone
    cp_r = np.where(recomputes(sel, "attn_block") | recomputes(sel, "core_attn"), cpx.f, 0.0)
    attn_comm_r = np.where(recomputes(sel, "attn_block"), tp_ar, 0.0) + cp_r
    moe_comm_r = attn_comm_r + np.where(recomputes(sel, "moe"), a2a_fwd, 0.0)
    # torchtitan's per-op policy (op_sac, dense blocks at cp 1) re-runs the block's tensor-parallel
    # collectives but the reduce-scatters it keeps (_op_sac_save_list): the all-gathers, half, with
    # sequence parallelism; without it the all-reduces, all
    # compiled, w2's all-reduce is not re-run (nothing in the backward reads the block's output): half too
    tp_f = dense_comm.f - cpx.f
    halved = sel.sp | sel.cmodel
    dense_comm_r = attn_comm_r + np.where(recomputes(sel, "op_sac"), np.where(halved, 0.5, 1.0) * tp_f, 0.0)
    out = dict(dense=dense, dense_comm=dense_comm, moe=moe, moe_comm=moe_comm, imb=imb, a2a_fwd=a2a_fwd,
               dense_comm_r=dense_comm_r, moe_comm_r=moe_comm_r, cp_f=cpx.f, cp_b=cpx.b, cp_r=cp_r,
               dense_host=dense_host.total, moe_host=moe_host.total, dense_host_f=dense_host.f, moe_host_f=moe_host.f,
               a2a_bwd=a2a_bwd, a2a_hide=a2a_hide, a2a_hide_f=a2a_hide_f, emb=blk["emb"], head=blk["head"],
               a_in=blk["a_in"], a_unsaved=blk["a_unsaved"])
    for rc, variant in _recompute_variants(lay, sel):
        out[f"a_dense_{rc}"] = blk[f"a_dense_{rc}"]
        out[f"a_moe_{rc}"] = (blk[f"a_attn_{rc}"] + sum(act.moe_terms(m, variant, imb,
                                                                      hw.accelerator.expert_row_multiple).values())
                              if m.moe else zero)
    return out


def _recompute_variants(lay: LayoutBatch, sel: LayoutBatch):
    """(("sel", lay under selective recompute), ("none", lay without recompute)): the saved
    activations both ways, since the rows a per-layer row stands for differ in recompute
    (_per_layer prices each key once; recompute.with_recompute picks per row)."""
    return (("sel", sel), ("none", replace(lay, recompute=np.zeros(len(lay), int))))


def _dense_key(lay: LayoutBatch) -> tuple:
    """The columns _dense_block reads."""
    return (lay.mbs, lay.seq, lay.cp, lay.cpc, lay.cpa, lay.tp, lay.sp, lay.dtype, lay.fp8, lay.attn_fp8, lay.dropout,
            lay.eager, lay.fa2, lay.unfused, lay.native, lay.cmodel, lay.ce_eager, lay.closs, lay.recompute,
            lay.rc_mods, lay.tp_overlap, lay.tp_async, lay.gpus)


def _dense_block(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, dtype: str) -> dict:
    """_layer_base's parts that read neither the experts nor the host's issue: the attention
    (attn; its core's context-parallel ring, cpx; one tensor-parallel all-reduce, tp_ar), a dense
    layer without its host gap (dense; its exposed collectives, dense_comm; a MoE layer's,
    tp_moe), the embedding and LM head phases, the layer input's bytes and the saved
    activations of the attention (a_attn_<sel|none>) and of a dense layer (a_dense_<sel|none>)."""
    sel = replace(lay, recompute=np.ones(len(lay), int))  # attention_phase prices r = core.f
    eb = lay.act_bytes.astype(float)
    zero = np.zeros(len(lay))
    core = core_attention(m, hw, lay, dtype)  # recompute changes what re-runs, not the core's cost
    attn = attention_phase(m, hw, sel, dtype, core)
    tp_ar = _tp_allreduce(hw, lay, lay.tokens * m.hidden_size * eb)  # one all-reduce (or RS+AG pair with SP)
    dense = attn + (ffn_phase(m, hw, sel, dtype) if m.ffn_size else Phase(zero, zero, zero, zero))
    dense_p = layer_params_per_rank(m, lay)[0]
    dense = dense + _layer_overhead(hw, "dense", dtype, len(lay)) + _weight_casts(hw, lay, dense_p)
    tp_dense, tp_moe = _tp_exposed(m, hw, lay, dtype, tp_ar)
    half = _rows_half(m, hw, lay)
    if m.moe is not None:
        tp_moe = tp_moe + _moe_tp_extra(m, lay, tp_ar, half, _router_stats(m, hw, lay))
    cpx = _cp_exposed(m, hw, lay, core)
    tp_dense, tp_moe = tp_dense + cpx, tp_moe + cpx  # the attention's collectives, either layer's
    head = lm_head_phase(m, hw, lay, dtype)
    vocab = _vocab_parallel(m, hw, lay, half, head.w)
    out = dict(attn=attn, tp_ar=tp_ar, dense=dense, tp_moe=tp_moe, cpx=cpx,
               dense_comm=Phase(tp_dense.f, tp_dense.b, zero, zero),
               emb=embedding_phase(m, hw, lay) + vocab[0], head=head + vocab[1],
               a_in=act.layer_input_bytes(m, lay),
               # what a compiled op_sac block neither keeps nor rebuilds (recompute.with_recompute's rc_dense_sel)
               a_unsaved=act.compiled_unsaved(m, lay) if m.ffn_size else np.zeros(len(lay)))
    # both ways: rows of one key differ in recompute, and what the FFN saves depends on it too
    for rc, variant in _recompute_variants(lay, sel):
        out[f"a_attn_{rc}"] = a_attn = sum(act.attention_terms(m, variant).values())
        out[f"a_dense_{rc}"] = a_attn + (sum(act.ffn_terms(m, variant).values()) if m.ffn_size else 0.0)
    return out
