"""The data-parallel side of a step, per pipeline role's rank, vectorised over layouts: the
gradient reduction and ZeRO's gathers (each behind the window the pipeline leaves it), the
optimizer step, and an eager runtime's per-tensor host work. estimate.evaluate prices each
role's rank with these and waits for the slowest."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..specs.hardware import HardwareSpec
from ..specs.model import ModelSpec
from . import comm
from .batch import FP8S, WGRAD_ACCUMS, LayoutBatch
from .kernels import stream_time
from .memory import grad_bytes
from .offload import optimizer_offload_time
from .rank_memory import BUCKET_CAP_BYTES

ADAMW_EAGER_BYTES = 80.0  # per parameter, torch single-tensor AdamW (dp_time)

# parameter tensors an MTP module adds beyond its block: the projection and three norms
MTP_TENSORS = 4


def param_tensors(m: ModelSpec, nd, nm, emb, head):
    """(replicated, expert) parameter tensors of a rank holding nd dense and nm MoE layers, with
    the embedding and the LM head where it holds them (an eager optimizer's per-tensor costs)."""
    nt = m.param_tensors
    rep = (nd * nt["dense_layer"] + nm * nt["moe_replicated"] + emb * nt["embedding"]
           + head * (nt["final_norm"] + 1 - m.tied_embeddings * emb + m.mtp_layers * MTP_TENSORS))
    return rep, nm * nt["moe_experts"]


def owned(lay: LayoutBatch, edp, rep, exp):
    """What a rank's optimizer steps of `rep` replicated and `exp` expert parameters (or
    tensors): all of them, or with ZeRO its share of each replication group's shard."""
    sharded = lay.zero >= 1
    return np.where(sharded, rep / lay.zero_shard(lay.dpcp) + exp / lay.zero_shard(edp), rep + exp)


def tensor_host_time(hw: HardwareSpec, lay: LayoutBatch, edp, rep_t, exp_t, M, rep_p, exp_p):
    """(reduction, optimizer) seconds per step of an eager optimizer's per-tensor host work
    (Efficiency.optimizer_tensor_us) on a rank holding rep_t replicated and exp_t expert
    parameter tensors: AdamW and the norm per owned tensor (its ZeRO share of each group),
    clip scale and ÷dp per held gradient, and a copy out of the flat buffer per tensor of a
    group of two or more, once for the reduction and, with ZeRO, once for the gather; under
    ZeRO-2, piper-train's hooks also pack each such tensor into a flat bucket every micro-batch
    and reduce each bucket (a chunk's tensors of one group and owner: min(group, tensors) of
    them a chunk, more where a chunk's rep_p / exp_p parameters' gradients pass the bucket cap)
    with one collective at the per-call cost (Efficiency.collective_overhead_us;
    runtime/optim.py). Fused layouts (multi-tensor kernels): zero."""
    if not lay.unfused.any():  # a search of fused layouts: nothing to price
        z = np.zeros(np.broadcast(rep_t, lay.zero).shape)
        return z, z
    us = hw.efficiency.optimizer_tensor_us
    edp = np.asarray(edp, float)
    held = rep_t * (lay.dpcp > 1) + exp_t * (edp > 1)  # tensors with a replication group
    copies = held * us.get("copy", 0.0) * 1e-6
    t_opt = (owned(lay, edp, rep_t, exp_t) * us.get("adamw", 0.0) + (rep_t + exp_t) * us.get("grad", 0.0)) * 1e-6
    t_opt = t_opt + np.where(lay.zero >= 1, copies, 0.0)  # the ZeRO gather's copies
    v = lay.vpp.astype(float)
    cap = BUCKET_CAP_BYTES  # a bucket also goes at this size (runtime/optim.py)
    grads = grad_bytes(lay, lay.act_bytes.astype(float))
    rep_b, exp_b = np.ceil(rep_p * grads / v / cap), np.ceil(exp_p * grads / v / cap)
    own_d, own_e = lay.zero_shard(lay.dpcp), lay.zero_shard(edp)  # a shard's owners (hybrid sharding: fewer)
    buckets = v * (np.maximum(np.minimum(own_d, rep_t / v), rep_b) * (lay.dpcp > 1)
                   + np.maximum(np.minimum(own_e, exp_t / v), exp_b) * (edp > 1))
    z2 = M * (buckets * hw.efficiency.collective_overhead_us * 1e-6 + copies)
    return np.where(lay.unfused, copies + np.where(lay.zero == 2, z2, 0.0), 0.0), np.where(lay.unfused, t_opt, 0.0)


@dataclass
class RankParams:
    """One stage's rank's parameters: replicated over dp (rep), expert ones replicated over the
    expert-data-parallel group (exp), and its (replicated, expert) parameter tensors (tensors)."""
    rep: np.ndarray
    exp: np.ndarray
    tensors: tuple


@dataclass
class PipeWindow:
    """What the step overlaps the reduction with: the last micro-batch's forward, backward-input
    and backward-weight seconds (F, B, W), the micro-batches per step (M, for ZeRO-2 and 3), and
    the seconds a micro-batch the rank waits for the busiest stage in the pipeline's steady state
    (slack: 0 on the busiest, the reduction's own window), and the seconds a paired step runs
    one micro-batch's backward beside another's forward beyond B + W (pair: dualpipev's F&B
    chunks, Megatron-Core's EP overlap), both of which ZeRO-2's per-micro-batch reduce-scatters
    also fill."""
    F: np.ndarray
    B: np.ndarray
    W: np.ndarray
    M: np.ndarray
    slack: np.ndarray | float = 0.0
    pair: np.ndarray | float = 0.0


@dataclass
class Collectives:
    """Each role's rank's data-parallel collectives, seconds a step, whatever its ZeRO stage
    (collectives; dp_comm_time picks by the stage): the gradients' reduction as an all-reduce
    (rs_full) and as a reduce-scatter (rs_half, ZeRO >= 1), ZeRO's parameter all-gather (ag), and
    under hybrid sharding (Layout.zero_replicas, hybrid) the all-reduce of the reduced shard across
    its copies (ar_rep; 0 without), the last two over the shard's ranks alone."""
    rs_full: np.ndarray
    rs_half: np.ndarray
    ag: np.ndarray
    ar_rep: np.ndarray | float = 0.0
    tied: np.ndarray | float = 0.0  # the tied embedding's all-reduce between its two stages (collectives)
    # ZeRO-3 gathers, reduce-scatters and (hybrid-sharded) all-reduces across copies a unit at a
    # time, each unit its own call (FSDP2's foreach_all_gather / foreach_reduce per fully_shard
    # unit, Megatron-FSDP's per-module buckets): the units a rank holds (its stage's layers, plus
    # the embedding and head where it holds them; moe_units of them hold experts), and the latency
    # their calls beyond the first add to one gather or reduce-scatter (unit_extra) and to the
    # copies' all-reduce (rep_unit_extra), seconds
    units: np.ndarray | float = 1.0
    moe_units: np.ndarray | float = 0.0
    unit_extra: np.ndarray | float = 0.0
    rep_unit_extra: np.ndarray | float = 0.0
    # the gathers' own (NCCL may run a small one as PAT: _unit_gather_extra); None: unit_extra
    ag_unit_extra: np.ndarray | float | None = None
    # FSDP2's copies on the compute stream (Layout.fsdp2; 0 without), seconds: a gather's
    # copy-out of the flat buffer and a reduction's copy-in to the reduce-scatter's (fsdp2_copies)
    copy_out: np.ndarray | float = 0.0
    copy_in: np.ndarray | float = 0.0

    @property
    def gather_extra(self):
        """Latency the units' calls beyond the first add to one gather, seconds."""
        return self.unit_extra if self.ag_unit_extra is None else self.ag_unit_extra


def collectives(hw: HardwareSpec, lay: LayoutBatch, grp: dict, rep, exp, eb, tied=0.0, tables=0.0,
                units=(1.0, 0.0)) -> Collectives:
    """Collectives of ranks holding `rep` replicated (`tables` of them the embedding and LM head:
    memory.table_params) and `exp` expert parameters over the groups `grp`
    (estimate._group_terms), and `tied` parameters of a word embedding tied to the LM head on
    another stage, whose two copies' gradients are summed between the first and the last stage
    once a step (Megatron-Core finalize_model_grads' _allreduce_word_embedding_grads;
    piper-train's embedding group). None reads the ZeRO stage: a search prices them once per
    layout without it (estimate._zero_free). `units`: (units, MoE units) a ZeRO-3 rank holds
    (Collectives)."""
    gb, wb = grad_bytes(lay, eb), weight_bytes(lay, eb)
    groups = ((lay.dpcp, lay.tp, (grp["dp_bw"], grp["dp_lat"]), lay.gpus),
              (grp["edp"], grp["edp_stride"], (grp["edp_bw"], grp["edp_lat"]), lay.gpus))
    rep_w = gathered_bytes(lay, eb, rep, tables)
    ag = _both(comm.allgather, hw, rep_w, exp * wb, groups)
    rs_half = _both(comm.ring_allreduce, hw, rep * gb, exp * gb, groups, 0.5)
    n_units, n_moe = units
    rs_extra, ag_extra = _unit_extras(hw, lay, exp, rep_w, exp * wb, groups, n_units, n_moe, ag)
    if lay.unfused.any():
        # piper-train's ZeRO moves whole parameters through their owners (runtime/optim.py): ZeRO-2
        # reduces each bucket to its owner and every owner broadcasts its share, one after another,
        # each a rooted collective that moves its whole buffer through the root (comm.rooted): all
        # the gradients, then all the parameters, at the bus rate
        rs_half = np.where(lay.unfused, _both(comm.rooted, hw, rep * gb, exp * gb, groups, True), rs_half)
        ag = np.where(lay.unfused, _both(comm.rooted, hw, rep_w, exp * wb, groups), ag)
    # the first stage's rank and the last's hold the two copies, (pp - 1) stages apart
    t_tied = (comm.ring_allreduce(hw, np.asarray(tied) * gb, 2, None, span=comm.ends_span(hw, lay.gpus))
              if np.any(tied) else 0.0)
    copy_out, copy_in = fsdp2_copies(hw, lay, rep_w + exp * wb, rep + exp, eb, gb, n_units)
    return Collectives(_both(comm.allreduce, hw, rep * gb, exp * gb, groups), rs_half, ag, tied=t_tied,
                       units=n_units, moe_units=n_moe, unit_extra=rs_extra, ag_unit_extra=ag_extra,
                       copy_out=copy_out, copy_in=copy_in)


def fsdp2_copies(hw: HardwareSpec, lay: LayoutBatch, gathered, params, eb, gb, units):
    """(copy-out, copy-in) seconds of torch FSDP2's ZeRO-3 around one gather and one reduction of a
    rank's `params` parameters (`gathered` bytes as gathered). The all-gather lands in a flat buffer
    that wait_for_unshard copies into the unsharded parameters (torch.split_with_sizes_copy: each
    byte read and written); foreach_reduce copies the gradients, made in the compute dtype (`eb` B),
    into the reduce-scatter's input in the reduce dtype (`gb` B; torch._chunk_cat). Both on the
    compute stream, a kernel a unit (`units`), at the device's stream rate
    (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py and _fsdp_param_group.py, torch 2.13).
    Priced for every layout: dp_comm_time charges them where Layout.fsdp2 holds (a search prices
    collectives once for the ZeRO stages of a layout)."""
    return stream_time(hw, 2.0 * gathered, units), stream_time(hw, params * (eb + gb), units)


def _unit_extra(hw: HardwareSpec, exp, groups, units, moe_units) -> np.ndarray:
    """Seconds of latency the calls beyond the first add when `units` units each make one gather
    or reduce-scatter over the dense group of `groups` and the `moe_units` holding experts one
    more over the expert group (comm.call_latency: a ring's bytes cost the same split or not)."""
    (n_d, st_d, span_d, w_d), (n_e, st_e, span_e, w_e) = groups
    more = lambda k: np.maximum(np.asarray(k, dtype=float) - 1.0, 0.0)  # noqa: E731
    return (more(units) * comm.call_latency(hw, n_d, st_d, span_d, w_d)
            + np.where(np.asarray(exp) > 0, more(moe_units) * comm.call_latency(hw, n_e, st_e, span_e, w_e), 0.0))


def _unit_extras(hw: HardwareSpec, lay: LayoutBatch, exp, dense_w, expert_w, groups, units, moe_units, ag):
    """(reduce-scatter's, gather's) latency the units' calls beyond the first add (_unit_extra,
    _unit_gather_extra over `ag`, the fused gather as one call): piper-train's gathers are owner
    broadcasts, which NCCL runs as rings only, so they keep the ring's."""
    rs_extra = _unit_extra(hw, exp, groups, units, moe_units)
    ag_extra = _unit_gather_extra(hw, dense_w, expert_w, groups, units, moe_units, ag, rs_extra)
    return rs_extra, np.where(lay.unfused, rs_extra, ag_extra) if lay.unfused.any() else ag_extra


def _per_unit(op, hw: HardwareSpec, dense_bytes, expert_bytes, groups, units, moe_units):
    """Seconds of a collective `op` (comm.allgather, comm.allreduce) made a call a unit: `units`
    calls over the dense group of `groups`, each 1/units of dense_bytes, and `moe_units` over the
    expert group, each priced as the library picks for its own size."""
    (n_d, st_d, span_d, w_d), (n_e, st_e, span_e, w_e) = groups
    u, mu = np.maximum(np.asarray(units, dtype=float), 1.0), np.maximum(np.asarray(moe_units, dtype=float), 1.0)
    return (u * op(hw, dense_bytes / u, n_d, st_d, span=span_d, world=w_d)
            + mu * op(hw, expert_bytes / mu, n_e, st_e, span=span_e, world=w_e))


def _unit_gather_extra(hw: HardwareSpec, dense_bytes, expert_bytes, groups, units, moe_units, one, ring_extra):
    """Seconds the gather adds when it is made a call a unit (ZeRO-3) over `one`, its price as one
    call: where a group can run NCCL's PAT (one rank a node: comm.pat_latency finite), each of the
    `units` dense and `moe_units` expert calls is priced at its own size as NCCL picks
    (comm.allgather; u calls of b/u never cost less than one of b, ring or PAT); elsewhere the
    ring's `ring_extra` (_unit_extra: the same split, whose bytes cost the same in one call or
    many)."""
    (n_d, st_d, _, _), (n_e, st_e, _, _) = groups
    pat = comm.pat_runs(hw, n_d, st_d) | comm.pat_runs(hw, n_e, st_e)
    if not np.any(pat):
        return ring_extra
    split = _per_unit(comm.allgather, hw, dense_bytes, expert_bytes, groups, units, moe_units)
    return np.where(pat, split - one, ring_extra)


def _unit_allreduce_extra(hw: HardwareSpec, dense_bytes, expert_bytes, groups, units, moe_units, one) -> np.ndarray:
    """Seconds the copies' all-reduce adds when it is made a call a unit (ZeRO-3: FSDP2's
    foreach_reduce per fully_shard unit) over `one`, its price as one call: `units` calls over the dense
    group of `groups`, each 1/units of dense_bytes, and `moe_units` over the expert group, each
    priced as NCCL picks for its own size (comm.allreduce: a ring or the tree). Floored at 0:
    NCCL's tree correction is not monotone in size, so a split could read a hair cheaper."""
    split = _per_unit(comm.allreduce, hw, dense_bytes, expert_bytes, groups, units, moe_units)
    return np.maximum(split - one, 0.0)


def _spanned(hw: HardwareSpec, n, stride, world) -> tuple:
    """A group of n ranks `stride` apart as _both's `groups` hold it, its span found once for the
    several collectives priced over it (comm.group_span)."""
    return n, stride, comm.group_span(hw, n, stride, world), world


def _both(op, hw: HardwareSpec, dense_bytes, expert_bytes, groups, *args):
    """`op` (comm.ring_allreduce with its fraction, or comm.rooted with its reduce flag, in `args`)
    of dense_bytes over the dense data-parallel group plus of expert_bytes over the expert one;
    `groups` is ((ranks, stride, span, world), (ranks, stride, span, world)), a span None where
    comm.group_span gives it."""
    (n_d, st_d, span_d, w_d), (n_e, st_e, span_e, w_e) = groups
    return (op(hw, dense_bytes, n_d, st_d, *args, span=span_d, world=w_d)
            + op(hw, expert_bytes, n_e, st_e, *args, span=span_e, world=w_e))


def reduced_whole(lay: LayoutBatch) -> np.ndarray:
    """piper-train's ZeRO-1 (eager, Layout.fused_kernels false): it all-reduces the gradients over
    the whole group, every rank keeping each one whole until its owner's step (runtime/optim.py
    reduce_grads, as torch's ZeroRedundancyOptimizer behind DDP), so it reduce-scatters nothing and,
    hybrid-sharded, has no shard copies to reconcile."""
    return lay.unfused & (lay.zero == 1)


def weight_bytes(lay: LayoutBatch, eb):
    """Bytes a parameter's ZeRO gather moves: the weight's dtype; piper-train (eager,
    Layout.fused_kernels false) keeps fp32 weights and casts them under autocast, so its owners
    broadcast 4 B a parameter (runtime/optim.py DistOptimizer.step). FP8 weights
    (Layout.fp8_params) under tensor or blockwise scaling gather their 1 B row-wise data and
    derive the rest locally; MXFP8 weights gather in bf16 (Megatron-Core's
    reuse_grad_buf_for_mxfp8_param_ag: the gradient buffer holds the gathered bf16, each rank
    then quantises both MXFP8 copies). The embedding and the LM head stay bf16: gathered_bytes."""
    fp8_gather = lay.fp8_par & ((lay.fp8 == FP8S.index("current")) | (lay.fp8 == FP8S.index("blockwise")))
    return np.where(fp8_gather, 1.0, _dtype_bytes(lay, eb))


def _dtype_bytes(lay: LayoutBatch, eb):
    """Bytes of a parameter in the weights' dtype: piper-train's fp32 (4 B), else `eb`."""
    return np.where(lay.unfused, 4.0, eb)


def gathered_bytes(lay: LayoutBatch, eb, rep, tables=0.0):
    """Bytes the ZeRO gather moves for `rep` replicated parameters of which `tables` are the
    embedding and the LM head: weight_bytes a parameter, but the tables at the weights' dtype
    even with FP8 weights, which cover the layers' linear layers alone (Megatron-Core keeps a
    gather buffer per parameter dtype: the bf16 tables go in their own)."""
    wb = weight_bytes(lay, eb)
    return rep * wb + tables * (_dtype_bytes(lay, eb) - wb)


def hybrid(hw: HardwareSpec, lay: LayoutBatch, edp, rep, exp, eb, coll: Collectives, tables=0.0) -> Collectives:
    """`coll` with the layouts that hybrid-shard (Layout.zero_replicas r > 1) priced as they run:
    a shard's s = group / r neighbouring ranks reduce-scatter the gradients and all-gather the
    parameters among themselves (a dense group's s ranks tp apart, an expert group's s at its
    stride), and the r copies of each shard, s group strides apart, all-reduce their reduced shard
    (1/s of the gradients) once a step. piper-train (eager) moves whole parameters through owners
    drawn from the shard (comm.rooted): its ZeRO-1 keeps the all-reduce over the whole group
    (dp_comm_time), so it has no copies to reconcile; its ZeRO-2 reduces each bucket to its owner
    within the shard and the owners of the same parameters all-reduce their sums across the r
    copies, 1/s of the gradients as above. Rows with r = 1 keep `coll`."""
    on = lay.zrep > 1
    if not on.any():
        return coll
    gb = grad_bytes(lay, eb)
    r = lay.zrep
    edp = np.asarray(edp)
    s_d, s_e = lay.dpcp // r, np.maximum(edp // r, 1)
    st_d, st_e = lay.tp, lay.edp_stride
    shards = (_spanned(hw, s_d, st_d, lay.gpus), _spanned(hw, s_e, st_e, lay.gpus))  # the shard's ranks of each group
    # the copies of a shard: r ranks a shard's span apart, over the dense and the expert group (none
    # where the experts have no data-parallel group)
    copies = (_spanned(hw, r, st_d * s_d, lay.gpus), _spanned(hw, np.where(edp > 1, r, 1), st_e * s_e, lay.gpus))

    # each copy holds 1/s of the reduced gradients
    rep_ar, exp_ar = rep * gb / s_d, exp * gb / s_e
    ar = _both(comm.allreduce, hw, rep_ar, exp_ar, copies)
    wb, rep_w = weight_bytes(lay, eb), gathered_bytes(lay, eb, rep, tables)
    ag = _both(comm.allgather, hw, rep_w, exp * wb, shards)
    rs = _both(comm.ring_allreduce, hw, rep * gb, exp * gb, shards, 0.5)
    n_u, n_m = coll.units, coll.moe_units
    rs_extra, ag_extra = _unit_extras(hw, lay, exp, rep_w, exp * wb, shards, n_u, n_m, ag)
    if lay.unfused.any():  # through the owners, over the shard's ranks
        ag = np.where(lay.unfused, _both(comm.rooted, hw, rep_w, exp * wb, shards), ag)
        rs = np.where(lay.unfused, _both(comm.rooted, hw, rep * gb, exp * gb, shards, True), rs)
        ar = np.where(reduced_whole(lay), 0.0, ar)
    return Collectives(coll.rs_full, np.where(on, rs, coll.rs_half),
                       np.where(on, ag, coll.ag), np.where(on, ar, 0.0), coll.tied, n_u, n_m,
                       np.where(on, rs_extra, coll.unit_extra),
                       np.where(on, _unit_allreduce_extra(hw, rep_ar, exp_ar, copies, n_u, n_m, ar), 0.0),
                       np.where(on, ag_extra, coll.gather_extra), coll.copy_out, coll.copy_in)


def dp_time(hw: HardwareSpec, lay: LayoutBatch, edp, p: RankParams, eb, win: PipeWindow, coll: Collectives):
    """(data-parallel gradient reduction + ZeRO gathers + the adds into held gradients, optimizer step)
    seconds per step."""
    held = held_grad_adds(hw, lay, edp, p, eb, win, coll.units)
    return dp_comm_time(hw, lay, edp, win, coll) + held, optimizer_time(hw, lay, edp, p, eb)


def held_grad_adds(hw: HardwareSpec, lay: LayoutBatch, edp, p: RankParams, eb, win: PipeWindow, units):
    """Seconds a step a rank spends adding each later micro-batch's weight gradients into those it
    holds whole from the earlier ones: ZeRO 0-1, ZeRO-3 under grad_sync step, and any stage whose
    replication group is one rank (dp or edp 1). ZeRO-2's and ZeRO-3's per-micro-batch reductions
    add into a shard, 1/dp of them (FSDP2: foreach_reduce, on its reduce stream): not priced.
    How, Layout.wgrad_accum says. A separate add (add; experts for all but the routed experts)
    reads the new gradient (`eb` B, the compute dtype) and the held one (gb B) and writes it, eb +
    2·gb B a parameter, in each of the M − 1 later micro-batches: autograd's AccumulateGrad in place
    where the two dtypes agree, else FSDP2's unsharded_accumulated_grad += grad, whose first
    gradient is also cast up (to_accumulated_grad_if_needed: eb + gb) and whose reduction copy-in
    reads gb, not fsdp2_copies' eb. A GEMM that adds in its epilogue (experts' routed experts,
    gemm's all) is priced with the GEMM, as Megatron-Core's fusion always was. On the compute
    stream, a kernel a unit at least (`units`; AccumulateGrad runs one a parameter tensor): a
    rank with less work than the busiest one does them while it would wait for it (win.slack),
    the busiest one in its step (torch 2.13: distributed/fsdp/_fully_shard/_fsdp_param.py,
    _fsdp_param_group.py post_backward; csrc/autograd/functions/accumulate_grad.h). Reported with
    the reduction (time dp_comm), as FSDP2's copies are. piper-train in bf16 adds into its fp32
    .grad inside its weight casts (layer._weight_casts); in fp32, here."""
    gb = grad_bytes(lay, eb)
    held = (lay.zero <= 1) | ((lay.zero >= 3) & lay.gstep)
    whole_rep, whole_exp = held | (lay.dpcp <= 1), held | (np.asarray(edp) <= 1)
    params = (np.where(whole_rep, p.rep, 0.0)
              + np.where(whole_exp & (lay.wacc == WGRAD_ACCUMS.index("add")), p.exp, 0.0))
    M = win.M
    cast_in = lay.unfused & (lay.act_bytes == 2)
    on = (lay.wacc != WGRAD_ACCUMS.index("gemm")) & ~cast_in & (M > 1)
    if not np.any(on):  # Megatron-Core's layouts, and every search without torch's autograd
        return np.zeros(np.shape(on))
    each = np.maximum(stream_time(hw, (eb + 2.0 * gb) * params, units) - win.slack, 0.0)
    wide = np.where(lay.fsdp2, stream_time(hw, (gb - eb) * params, 0), 0.0)
    once = np.where(gb != eb, stream_time(hw, (eb + gb) * params, units) + wide, 0.0)
    return np.where(on & (params > 0), (M - 1) * each + once, 0.0)


def dp_comm_time(hw: HardwareSpec, lay: LayoutBatch, edp, win: PipeWindow, coll: Collectives):
    """Gradient reduction, ZeRO gathers and the gradient norm's all-reduce, less what the
    pipeline's last micro-batch hides (Layout.overlap_grad_reduce)."""
    F, B, W, M = win.F, win.B, win.W, win.M
    sharded = lay.zero >= 1  # ZeRO >= 1 reduce-scatters the gradients and gathers the parameters
    # (but piper-train's ZeRO-1 all-reduces them; its ZeRO-2 reduces each bucket to its owner)
    whole = reduced_whole(lay)
    halves = sharded & ~whole
    t_rs = np.where(halves, coll.rs_half, coll.rs_full)
    t_ag = np.where(sharded, coll.ag, 0.0)
    window_b = np.where(lay.overlap, B + W, 0.0)
    window_f = np.where(lay.overlap, F, 0.0)
    # ZeRO-2 keeps only its shard of each gradient between micro-batches (memory.state_coeffs),
    # so it reduce-scatters every micro-batch's gradients, each behind that micro-batch's own
    # backward where overlapped (DeepSpeed's engine: "ZeRO stage >= 2 communicates during non
    # gradient accumulation boundaries as well"), and all but the last also while a stage with
    # less work than the busiest one waits for it (win.slack) or runs a paired step's other half
    # (win.pair: the last backward runs alone); stages 0-1 reduce the accumulated sum once, behind
    # the last backward, unpaired
    per_round = np.maximum(0.0, t_rs - window_b)
    more = np.where(lay.overlap, win.pair, 0.0) + win.slack
    z2 = (M - 1) * np.maximum(0.0, t_rs - window_b - more) + per_round
    t_dp = np.where(lay.zero == 2, z2, per_round) + np.maximum(0.0, t_ag - window_f)
    # ZeRO-3 / FSDP holds parameters sharded: every micro-batch gathers them for its forward and
    # again for its backward, and reduce-scatters its gradients; that is all its traffic. Where
    # overlapped, each layer's gather is prefetched behind the previous layer's compute and each
    # reduce-scatter runs behind the next layer's backward (FSDP2's forward/backward prefetch,
    # Megatron-FSDP; DeepSpeed turns overlap_comm on by default for stage 3), so a phase exposes
    # only the traffic its compute cannot cover. A unit kept gathered from forward to backward
    # (Layout.reshard_after_forward false) is not gathered again for the backward. Each unit's
    # gather and reduce-scatter is its own call, so each pays the call's latency (Collectives)
    # Reducing once a step (Layout.grad_sync step), only the last micro-batch's backward reduce-scatters;
    # a unit kept gathered to its backward then stays gathered to the step's last one, so the step
    # gathers once (fully_shard's idiom: set_reshard_after_backward(is_last_microbatch or
    # reshard_after_forward), torch's _test_grad_acc_with_reduce_dtype; torch.distributed.pipelining's stage)
    z3 = lay.zero >= 3
    t_ag3, t_rs3 = t_ag + coll.gather_extra, t_rs + coll.unit_extra
    t_bg3 = np.where(lay.reshard, t_ag3, 0.0)  # a micro-batch's backward gathers
    t_b3 = t_bg3 + t_rs3  # and reduce-scatters
    if np.any(z3):
        z3_f = np.where(lay.overlap, np.maximum(0.0, t_ag3 - F), t_ag3)
        hide_b = lambda t: np.where(lay.overlap, np.maximum(0.0, t - (B + W)), t)  # noqa: E731
        # FSDP2's copies (Layout.fsdp2) run on the compute stream: nothing hides them
        gathers = np.where(lay.fsdp2, coll.copy_out * (1.0 + lay.reshard), 0.0)
        copies = gathers + np.where(lay.fsdp2, coll.copy_in, 0.0)
        each = M * (z3_f + hide_b(t_b3) + copies)
        again = np.where(lay.reshard, z3_f + hide_b(t_bg3) + gathers, 0.0)  # a micro-batch before the last
        once = (M - 1) * again + z3_f + hide_b(t_b3) + copies
        t_dp = np.where(z3, np.where(lay.gstep, once, each), t_dp)
    # hybrid sharding: the copies of each shard all-reduce it once a step, after the last
    # micro-batch's reduce-scatter and behind what is left of its backward where overlapped
    # (ZeRO-3: a call a unit, as its gathers)
    if np.any(coll.ar_rep):
        last = np.where(z3, t_b3, t_rs)
        ar = coll.ar_rep + np.where(z3, coll.rep_unit_extra, 0.0)
        t_dp = t_dp + (np.maximum(0.0, last + ar - window_b) - np.maximum(0.0, last - window_b))
    t_dp = t_dp + coll.tied  # after the backward, on the step's path in both runtimes
    # the global gradient norm, one fp64 summed over every rank: piper-train (eager) all-reduces it
    # over the world group after the reduction (latency-bound: the ring's 2(n−1) steps, or NCCL's
    # tree); fused runtimes reduce it inside their model-parallel group, priced by the call's
    # fixed cost below
    if lay.unfused.any():  # the world group's span is costly to find for every candidate of a search
        t_dp = t_dp + np.where(lay.unfused, comm.allreduce(hw, 8.0, lay.gpus, 1, world=lay.gpus), 0.0)
    co = hw.efficiency.collective_overhead_us * 1e-6
    if co:  # fixed cost per call: one reduction per replication group, the ZeRO gather as one
        # broadcast per owner (whole-parameter sharding, as torch's ZeroRedundancyOptimizer and
        # piper-train do), and the global gradient norm's all-reduce
        dpn, edpn = lay.dpcp.astype(float), edp.astype(float)
        own_d, own_e = lay.zero_shard(dpn), lay.zero_shard(edpn)  # a shard's owners
        gather = np.where(lay.zero >= 1, np.where(own_d > 1, own_d, 0.0) + np.where(own_e > 1, own_e, 0.0), 0.0)
        # hybrid sharding's all-reduce of each shard (none in piper-train's ZeRO-1: reduced whole)
        copies = ((lay.zrep > 1) & ~whole) * ((dpn > 1) + (edpn > 1))
        t_dp = t_dp + co * ((dpn > 1) + (edpn > 1) + gather + copies + (lay.gpus > 1) + (np.asarray(coll.tied) > 0))
    return t_dp


def optimizer_time(hw: HardwareSpec, lay: LayoutBatch, edp, p: RankParams, eb):
    """The optimizer step: clipping and AdamW over the rank's own parameters, plus an eager
    runtime's flat-buffer copies."""
    rep_pr, exp_pr = p.rep, p.exp
    gb = grad_bytes(lay, eb)
    # optimizer: stream master, m, v (read+write), grad (read), weight (write) per local param
    local = owned(lay, edp, rep_pr, exp_pr)
    # global-norm clipping: read each gradient for its norm, then scale it (read + write);
    # ZeRO-2 ranks hold only their share of the gradients, and a fused stack's ZeRO-1 clips
    # only its shard's main gradients (Megatron-Core DistributedOptimizer:
    # get_main_grads_for_grad_norm; DeepSpeed stage 1: its partition), where piper-train's
    # scales every gradient it holds (optim.clip)
    grads = np.where((lay.zero >= 2) | ((lay.zero == 1) & ~lay.unfused), local, rep_pr + exp_pr)
    # a fused Adam reads p, m, v, g and writes p, m, v (+ the low-precision weight); eager
    # runtimes (piper-train: torch.optim.AdamW(foreach=False), torch/optim/adam.py
    # _single_tensor_adam over fp32 p, g, m, v) run 8 passes: decay p (r+w 8 B), m.lerp_(g) 12,
    # v.mul_ 8, v.addcmul_(g, g) 12, v.sqrt() 8, / bias correction 8, + eps 8, p.addcdiv_ 16
    per_param = np.where(lay.unfused, ADAMW_EAGER_BYTES, 2 * 12.0 + gb + eb)
    # the tensors the rank's optimizer steps, where the spec's cache knee makes them matter
    tensors = owned(lay, edp, *p.tensors) if _cache_knee(hw) else None
    t_cached, cached = eager_adam_in_cache(hw, lay, local, tensors)
    # the host steps Layout.optimizer_offload of the shard (offload.py); the device the rest
    on_device = 1.0 - lay.opt_offload
    opt_bytes = np.where(cached, 0.0, local * per_param * on_device) + 3.0 * gb * grads
    # eager runtimes without contiguous gradient/parameter buffers (piper-train) also copy
    # each reduced gradient into a flat buffer and back and divide it by dp (4 passes of 4 B +
    # 2 for the division), and with ZeRO copy each gathered parameter out of its broadcast
    # buffer (read + write) after the owner packed it (read + write)
    if lay.unfused.any():
        replicated = rep_pr * (lay.dpcp > 1) + exp_pr * (edp > 1)  # params with a replication group
        red = 16.0 * replicated + np.where(lay.dpcp > 1, 8.0 * (rep_pr + exp_pr), 0.0)
        gath = np.where(lay.zero >= 1, 16.0 * replicated, 0.0)
        opt_bytes = opt_bytes + np.where(lay.unfused, red + gath, 0.0)
    return stream_time(hw, opt_bytes, 0) + t_cached * on_device + optimizer_offload_time(hw, lay, local)


def prices_tensors(hw: HardwareSpec, lay: LayoutBatch) -> bool:
    """Whether the optimizer's cost reads its parameter tensors (param_tensors): eager runtimes'
    per-tensor host work (tensor_host_time), and the cache knee (eager_adam_in_cache)."""
    return bool(lay.unfused.any()) or _cache_knee(hw)


def _cache_knee(hw: HardwareSpec) -> bool:
    """Whether the spec streams through a cache faster than from DRAM (a CPU's, calibrated)."""
    return hw.accelerator.cache_mib is not None and hw.efficiency.memory_dram is not None


def eager_adam_in_cache(hw: HardwareSpec, lay: LayoutBatch, local, tensors):
    """Eager single-tensor AdamW runs its 8 passes one tensor at a time: where a tensor's fp32
    p, g, m, v and the two temporaries (sqrt, denominator: 24 B a parameter, for the mean
    owned tensor of local/tensors parameters) fit in the rank's cache share
    (accelerator.cache_mib), only the first reads of p, g, m, v and the write-backs of p, m, v
    (28 B) reach DRAM, and the other 52 of its 80 B stream at the cache rate. Returns
    (seconds where that holds, mask); specs without a cache knee stream all 80 B as one call."""
    acc, eff = hw.accelerator, hw.efficiency
    if not _cache_knee(hw):
        return np.zeros(len(lay)), np.zeros(len(lay), bool)
    fits = lay.unfused & (24.0 * local / np.maximum(tensors, 1.0) <= acc.cache_mib * 2.0**20)
    bw = acc.memory_bandwidth_gbps * 1e9
    t = local * (28.0 / (bw * eff.memory_dram) + (ADAMW_EAGER_BYTES - 28.0) / (bw * eff.memory))
    return np.where(fits, t, 0.0), fits
