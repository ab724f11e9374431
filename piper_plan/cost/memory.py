"""Parameter, gradient and optimizer-state memory per rank, and micro-batches in flight.

Bytes per parameter with mixed-precision Adam (Megatron): weight 2 (bf16), main gradient
4 (fp32 accumulation; 2 with bf16 grads), fp32 master 4, Adam m 4 and v 4 — 18 B, or the
16 B of Piper's equation with bf16 gradients (brief §2). ZeRO over the data-parallel group
of each parameter (experts: the expert-data-parallel group, dp·cp·tp/(ep·etp), LayoutBatch.edp):
stage 1 shards master + moments, 2 also gradients (reduced every micro-batch to keep only the
share: reduction.dp_comm_time), 3 also weights. Layout.optimizer_offload keeps that share of
master + moments in host memory instead (cost/offload.py). Stage 3 gathers what it shards one
unit at a time, and those unsharded units are memory too (zero3_gathered_bytes).
"""
from __future__ import annotations

import functools

import numpy as np

from ..layout import SCHEDULES
from ..specs.model import ModelSpec
from .batch import LayoutBatch
from .schedule_sim import interleaved_positions

GIB = float(2**30)


def state_coeffs(group, lay: LayoutBatch, host: bool = False) -> dict[str, np.ndarray]:
    """Bytes per parameter of weights / grads / master / optimizer, ZeRO-sharded over `group`
    (a data-parallel group's size: a shard spans it over Layout.zero_replicas, LayoutBatch.zero_shard),
    in device memory, or with `host` the master and optimizer bytes offloaded to the host."""
    g = lay.zero_shard(group)
    eb = lay.act_bytes
    fp32 = eb == 4
    z = lay.zero
    # Layout.optimizer_offload of the master weights and moments sits in host memory
    share = lay.opt_offload if host else 1.0 - lay.opt_offload
    over = np.where(z >= 1, g, 1.0)  # what ZeRO >= 1 shards the master weights and moments over
    master = {"master": np.where(fp32, 0.0, 4.0) / over * share, "optimizer": 8.0 / over * share}
    if host:
        return master
    # torch FSDP2 (Layout.fsdp2) keeps no sharded bf16 copy: its fp32 shard is the optimizer's parameter
    weights = np.where((z >= 3) & lay.fsdp2 & ~fp32, 0.0, eb / np.where(z >= 3, g, 1.0))
    return {"weights": weights,
            "grads": np.where(fp32, 4.0, lay.grad_bytes) / np.where(z >= 2, g, 1.0), **master}


def fp8_weight_bytes(lay: LayoutBatch, any_layout: bool) -> np.ndarray:
    """Bytes Transformer Engine keeps per GEMM weight in its FP8 form, per layout (0 without an FP8
    recipe): tensor scaling (current) one 1 B copy where FP8 GEMMs take any operand layout
    (Accelerator.fp8_any_layout: Blackwell), else the copy and its transpose (Hopper); MXFP8 a row-
    and a column-wise copy, each with an E8M0 scale per 32 elements; blockwise (128x128 weight
    blocks) both copies, each with an fp32 scale a block. Indexed by LayoutBatch.fp8 (batch.FP8S)."""
    per_recipe = np.array([0.0, 1.0 if any_layout else 2.0, 2.0 + 2.0 / 32.0, 2.0 + 8.0 / 128.0**2])
    return per_recipe[lay.fp8]


def fp8_weight_extra(lay: LayoutBatch, group, any_layout: bool) -> np.ndarray:
    """Bytes per GEMM weight (the layers' linear layers: not the embedding, the LM head, the norms)
    beyond state_coeffs' "weights", per layout. With Layout.fp8_params the FP8 form is the weight,
    with no bf16 copy (fp8_model_init); without, bf16 weights and TE's FP8 copy of each, which
    Megatron's modules cache from the first micro-batch of a step to the last (is_first_microbatch:
    TE's weight workspace). ZeRO-3 shards the weight over `group` (LayoutBatch.zero_shard); the cache
    of a sharded bf16 weight is not priced; torch FSDP2 keeps no low-precision shard (Layout.fsdp2).
    0 without an FP8 recipe."""
    q = fp8_weight_bytes(lay, any_layout)
    eb = lay.act_bytes
    z3 = lay.zero >= 3
    g = np.where(z3, lay.zero_shard(group), 1.0)
    primary = np.where(lay.fp8_par, q, eb) / g
    cache = np.where(lay.fp8_par | z3, 0.0, q)
    # torch FSDP2 (Layout.fsdp2) shards fp32 parameters alone and casts them as it gathers (to FP8 too)
    return np.where(z3 & lay.fsdp2, 0.0, primary + cache - eb / g)


def table_params(m: ModelSpec, lay: LayoutBatch, has_emb, has_head):
    """Parameters of the embedding table and the LM head a rank holds (one table where tied and
    both on it), per layout: the part of its replicated parameters outside its layers."""
    tp = lay.tp.astype(float)
    return has_emb * m.embedding_params / tp + has_head * (
        m.vocab_size * m.hidden_size / tp * (1 - (m.tied_embeddings & has_emb)))


def state_bytes(params, group, lay: LayoutBatch, coeffs: dict | None = None) -> dict[str, np.ndarray]:
    """Weights / grads / master / optimizer bytes for `params` sharded by ZeRO over `group`
    (pass `coeffs` = state_coeffs(group, lay) to reuse them across calls)."""
    params = np.asarray(params, dtype=float)
    c = coeffs if coeffs is not None else state_coeffs(group, lay)
    return {k: params * v for k, v in c.items()}


def layer_params_per_rank(m: ModelSpec, lay: LayoutBatch):
    """(dense layer, MoE-layer replicated part, MoE-layer expert part) parameters per rank: the
    tp-split weights / tp and the attention's whole-held ones, and the rank's E / ep local
    experts, each split over etp ranks."""
    tp = lay.tp.astype(float)
    norms = 2 * m.norm_params
    attn = m.attn_params_per_rank(tp)  # with what every tp rank holds whole (ModelSpec.attn_params_whole)
    ffn = (m.dense_ffn_params - m.dense_ffn_whole) / tp + m.dense_ffn_whole if m.ffn_size else 0.0
    dense = attn + ffn + norms
    if m.moe is None:
        return dense, np.zeros_like(dense), np.zeros_like(dense)
    moe_rep = attn + m.shared_params / tp + norms + m.router_params
    experts = m.moe.num_experts / lay.ep * m.expert_params / lay.etp
    return dense, moe_rep, experts.astype(float)


def in_flight(lay: LayoutBatch, stage, M=None) -> np.ndarray:
    """Micro-batches whose activations a pipeline rank holds at its peak, in units of one
    micro-batch through all of the rank's layers. `stage` broadcasts against the layouts
    (e.g. [roles, layouts]); M: micro-batches per step (lay.m, if the caller has it).

    gpipe: all M. 1f1b: pp - i (Narayanan 2021). interleaved (v chunks): Megatron's warm-up
    ((pp-i-1)·2 + (v-1)·pp + 1) chunk-micro-batches, / v — rank 0 gives pp + (pp-1)/v
    (Korthikanti 2022 §4.2.3): the rank's peak where its chunks are equal (interleaved_states has
    each chunk's count, which rank_memory weighs by its layers). Megatron-Core's EP overlap
    (Layout.a2a_overlap) runs one more warm-up forward over a pipeline
    (schedules.get_pp_rank_microbatches), so its ranks hold one more chunk-micro-batch (at most:
    its paired steps free the backward's layers as the forward's fill); without pipelining it adds
    no warm-up, and the runs published at pp 1 with the overlap
    (Megatron-Bridge's Qwen3 GB200 / GB300 rows) fit their devices only with one in flight.
    zbv, dualpipev: the mean over a rank's two chunks where they are equal, pp and pp + 1/2
    (v_in_flight has each chunk's count, which rank_memory weighs by its layers). Never more
    than the M of a step."""
    pp, v = lay.pp.astype(float), lay.vpp.astype(float)
    M = (lay.m if M is None else np.asarray(M)).astype(float)
    i = np.asarray(stage, dtype=float)
    s = lay.sched
    extra = lay.ep_overlap.astype(float)
    warm = np.where(s == 1, pp - i + extra, np.where(s == 2, ((pp - i - 1) * 2 + (v - 1) * pp + 1 + extra) / v,
                                                     np.where(s == 3, pp, pp + 0.5)))
    out = np.where(s == 0, M, np.minimum(warm, M))
    return np.where(pp == 1, 1.0, out)


def v_in_flight(lay: LayoutBatch, rank, M=None) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """The peak states of a V schedule's rank (zbv, dualpipev: rank r runs chunks r and 2pp-1-r):
    ((micro-batches of chunk r, of chunk 2pp-1-r) in flight, ...), one state or the other binding
    as the chunks' sizes go. torch's ScheduleZBVZeroBubble holds (2pp-1-r, r+1) and, later,
    (2pp-r, r); ScheduleDualPipeV (DeepSeek's dualpipev order) (2pp-r, r+1), given twice; a
    micro-batch counts from its forward to its weight gradient (tests/test_v_schedule_memory.py
    runs torch's own order). Never more than the step's M."""
    pp = lay.pp.astype(float)
    M = (lay.m if M is None else np.asarray(M)).astype(float)
    r = np.asarray(rank, dtype=float)
    dual = lay.sched == SCHEDULES.index("dualpipev")
    first = (np.minimum(2 * pp - 1 - r + dual, M), np.minimum(r + 1, M))
    later = (np.minimum(2 * pp - r, M), np.minimum(np.where(dual, r + 1, r), M))
    return first, later


def interleaved_states(pp: int, vpp: int, M: int, rank: int, extra: int = 0) -> np.ndarray:
    """[K, vpp] micro-batches in flight of each of the rank's chunks (column j: virtual stage
    j·pp + rank) at the Pareto-maximal states of torch's ScheduleInterleaved1F1B order
    (schedule_sim.interleaved_positions; `extra` more warm-up forwards, Megatron-Core's EP
    overlap), a micro-batch counting from its forward to its backward. The busiest state depends on the
    chunks' sizes: the warm-up's end holds 2pp - 1 micro-batches of rank 0's first chunk and pp
    of each other, but later states hold 2pp of its first two chunks, and each chunk's count
    runs up to 2pp while the backward drains the last: with equal chunks every state holds
    the same total (in_flight's), with the early chunks larger (the balanced split's rule,
    stages.materialise) the later states hold more (tests/test_interleaved_memory.py runs torch's
    own order). The states are the same for every M >= 2pp (M a multiple of pp, as interleaved
    needs): the order is walked at min(M, 2pp)."""
    return _interleaved_states(pp, vpp, min(M, 2 * pp), rank, extra)


@functools.lru_cache(maxsize=4096)
def _interleaved_states(pp: int, vpp: int, M: int, rank: int, extra: int) -> np.ndarray:
    (f_pos, f_stage, _), (b_pos, b_stage, _) = interleaved_positions(pp, vpp, M, extra)
    n = M * vpp
    step = np.zeros((2 * n, vpp))  # what each op of the rank's order adds to each chunk's count
    step[f_pos[rank], f_stage[rank] // pp] = 1.0
    step[b_pos[rank], b_stage[rank] // pp] = -1.0
    states = np.unique(np.cumsum(step, axis=0), axis=0)
    # keep the states no other state holds at least as many of every chunk as
    ge = np.all(states[:, None, :] >= states[None, :, :], axis=2)  # [a, b]: a holds at least b's
    dominated = (ge & ~np.eye(len(states), dtype=bool)).any(axis=0)
    return states[~dominated]


def state_lower_bound_gib(m: ModelSpec, lay: LayoutBatch, overhead_gib: float, fp8_any_layout: bool = False):
    """A lower bound on the busiest rank's memory, GiB, per layout: the mean rank's parameter,
    gradient and optimizer state (the busiest rank holds at least the mean), FP8 weights as
    fp8_weight_extra prices them (`fp8_any_layout`: the spec's Accelerator.fp8_any_layout), plus
    the fixed reserve. Cheap, so the search can drop layouts whose states alone overflow before
    pricing time."""
    dense, moe_rep, experts = layer_params_per_rank(m, lay)
    pp = lay.pp.astype(float)
    tp = lay.tp.astype(float)
    layers = (m.num_dense_layers * dense + m.num_moe_layers * moe_rep) / pp
    rep = layers + (m.embedding_params + m.lm_head_params) / tp / pp
    exp = m.num_moe_layers * experts / pp
    c_rep, c_exp = state_coeffs(lay.dpcp, lay), state_coeffs(lay.edp, lay)
    tot = rep * sum(c_rep.values()) + exp * sum(c_exp.values())
    if np.any(lay.fp8):
        tot = tot + layers * fp8_weight_extra(lay, lay.dpcp, fp8_any_layout) + exp * fp8_weight_extra(
            lay, lay.edp, fp8_any_layout)
    return tot / GIB + overhead_gib


def grad_bytes(lay: LayoutBatch, eb):
    """Bytes per gradient element: fp32 runs keep fp32 gradients, others Layout.grad_dtype."""
    return np.where(eb == 4, 4.0, lay.grad_bytes)


def zero3_gathered_bytes(lay: LayoutBatch, eb, unit, held):
    """Bytes a ZeRO-3 rank holds unsharded at its peak, per layout (0 below stage 3), from the
    parameters of its largest sharding unit (`unit`) and of all its units (`held`). FSDP2 (torch
    fully_shard, one unit per transformer block): in backward a unit computes with its gathered
    parameters while the next unit's all-gather is prefetched, and its gradients accumulate
    unsharded: 2 parameter copies + the gradient; after it, the unit is resharded and its
    gradients are copied into the reduce-scatter input in the reduce dtype while the prefetched
    unit stays gathered: a parameter copy + the gradient + its reduce-dtype copy (torch
    BackwardPrefetch: "at the peak, it holds the current set of parameters, next set of
    parameters, and current set of gradients"; _fsdp_collectives.foreach_reduce allocates the
    reduce_scatter_input in reduce_dtype and copies the unsharded gradients into it). Forward holds
    at most the current unit and the prefetched next one, which backward exceeds. So unit x
    (eb·2 + max(eb, reduce bytes)): 6 B a parameter with bf16 reduction, 8 with fp32. A rank that
    keeps its units gathered from forward to backward (Layout.reshard_after_forward false) starts
    its backward with every unit gathered: held x eb + unit x max(eb, reduce bytes). Reducing once a
    step (Layout.grad_sync step), every unit's gradients stay unsharded, accumulated in the reduce
    dtype, until the last backward copies each into the reduce-scatter's input: held x reduce bytes
    + unit x reduce bytes beside the parameters."""
    params = np.where(lay.reshard, 2.0 * np.asarray(unit, float), held) * eb
    gb = grad_bytes(lay, eb)
    grads = np.where(lay.gstep, gb * (np.asarray(held, float) + unit), np.maximum(eb, gb) * unit)
    return np.where(lay.zero >= 3, params + grads, 0.0)
