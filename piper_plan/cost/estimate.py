"""One training step of a model under many layouts at once: memory, time, throughput.

`evaluate(model, hw, batch, routing)` returns an Estimate of numpy arrays (one entry per
layout); `Estimate.row(i)` is what `piper-plan estimate --json` prints. The search and
`estimate` call this same function, so a plan's numbers are reproducible exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import numpy as np

from ..layout import SCHEDULES
from ..specs.hardware import HardwareSpec
from ..specs.model import ModelSpec
from . import comm
from .activations import module_offload_bytes
from .batch import DTYPES, FP8_COMPUTE, FP8S, LayoutBatch, distinct_rows, recomputes, take_rows
from .imbalance import expert_popularity
from .layer import _a2a_off_stream, _dualpipe_overlaps, _per_layer
from .memory import layer_params_per_rank, table_params
from .offload import exposed_copies, offloaded_share, parks_activations, require_host
from .rank_memory import rank_memory, role_activations
from .recompute import full_recompute_share
from .reduction import (PipeWindow, RankParams, collectives, dp_time, hybrid, param_tensors, prices_tensors,
                        tensor_host_time)
from .interleaved import interleaved_pipe, kind_phases
from .schedule import pipeline_time
from .v_orders import pair_hiding, v_pipe
from .stages import at_kinds, chunk_sizes, kind_layers, rank_layers, rank_stages, stage_kind, v_mid_rank


@dataclass
class Routing:
    distribution: str = "uniform"
    zipf_s: float = 1.0
    histogram: list | None = None
    migration: object = None  # plan.Migration when expert migration is on (planner, period, max_moves)


@dataclass
class Estimate:
    step_time_s: np.ndarray
    tokens_per_s: np.ndarray
    tflops_per_gpu: np.ndarray
    hw_tflops_per_gpu: np.ndarray
    mfu: np.ndarray
    peak_memory_gib: np.ndarray
    fits: np.ndarray
    memory: dict[str, dict[str, np.ndarray]]  # rank role -> component -> GiB
    time: dict[str, np.ndarray]               # component -> seconds per step
    stage_of_role: dict[str, np.ndarray]
    chunks: object = None
    imbalance: np.ndarray = None
    layer_time_s: dict[str, np.ndarray] = field(default_factory=dict)
    host_memory_gib: np.ndarray = None  # what the busiest rank offloads to host memory (cost/offload.py)
    v_shape: np.ndarray = None  # bool: a V schedule (zbv, dualpipev), whose rank 0 holds both ends

    def __len__(self):
        return len(self.step_time_s)

    def dominant(self) -> np.ndarray:
        """Name of the largest time component per layout."""
        keys = [k for k in self.time if k != "total"]
        mat = np.stack([self.time[k] for k in keys])
        return np.array(keys)[mat.argmax(0)]

    def row(self, i: int) -> dict:
        f = lambda a: float(np.asarray(a)[i])  # noqa: E731
        mem = []
        seen = set()
        for role, comps in self.memory.items():
            st = int(self.stage_of_role[role][i])
            if st in seen or st < 0:
                continue
            seen.add(st)
            d = {k: round(f(v), 4) for k, v in comps.items()}
            if self.v_shape is not None and self.v_shape[i]:  # rank 0 holds the first and last chunks
                role = V_ROLES.get(role, role)
            d = {"stage": st, "role": role, **d}
            mem.append(d)
        mem.sort(key=lambda d: d["stage"])
        # parts rank_memory reports only where some layout of the batch has them: kept for this
        # layout only where one of its ranks does, so a plan reads the same from search and estimate
        for k in _OPTIONAL_PARTS:
            if all(not d.get(k) for d in mem):
                for d in mem:
                    d.pop(k, None)
        return dict(
            step_time_s=f(self.step_time_s), tokens_per_s=f(self.tokens_per_s),
            tflops_per_gpu=f(self.tflops_per_gpu), hw_tflops_per_gpu=f(self.hw_tflops_per_gpu),
            mfu=f(self.mfu), peak_memory_gib=f(self.peak_memory_gib), fits=bool(self.fits[i]),
            imbalance=f(self.imbalance), memory_gib_per_stage=mem,
            time_breakdown_s={k: f(v) for k, v in self.time.items()},
            a2a_time_s=f(self.time["a2a"]),
        )


_OPTIONAL_PARTS = ("weight_casts", "zero3_units", "recomputed_layer", "host", "cp_buffers")
ROLES = ("first", "mid", "last")  # the pipeline's representative ranks, in _stacked's order
# what those ranks are under a V schedule: rank 0 runs the first and the last chunk (embedding and
# head), rank pp-1 the two middle ones where the V turns
V_ROLES = {"first": "first+last", "last": "turn"}


def _phases(lc: dict, nd, nm, emb, head) -> dict:
    """A rank's forward / backward-input / backward-weight / recompute seconds of one micro-batch
    through its nd dense and nm MoE layers, with the embedding and the LM head where it holds them."""
    v = (_each_phase(nd) * lc["dense_v"] + _each_phase(nm) * lc["moe_v"] + _each_phase(emb) * lc["emb_v"]
         + _each_phase(head) * lc["head_v"])  # [..., f b w r, n]: one operation for the four phases
    return {c: v[..., i, :] for i, c in enumerate("fbwr")}


def _each_phase(x):
    """Layer counts [..., n] against a Phase's [4, n] values."""
    return np.asarray(x)[..., None, :]


def _window(lc: dict, phases: dict, nd, nm, chunk_mb, parked_f, parked_b, p2p, M, hidden, absorbed):
    """(phases, PipeWindow, reduction's PipeWindow) of one role's rank per micro-batch: its compute
    `phases` (_phases, not changed) with the extra chunks' executor work split as layer._layer_overhead's and its exposed
    activation copies; the forward / backward / weight-gradient seconds the pipeline runs, less the
    exchange an off-stream all-to-all runs inside the host's issue gap when no partner hides it
    (`absorbed`: _absorbed_by_host, as in the schedule's unpaired warm-up and cool-down); and
    those the reduction can run behind, less what an overlapping schedule takes off the rank's
    micro-batch (`hidden`: the exchange hidden behind another micro-batch's compute or inside the
    host's gap, net of the slow-down of the units it holds; seconds a micro-batch): hidden, it takes no
    wall time of its own, so it opens no window either. Each given as (all of it, the forward's):
    only the all-to-all hides, so each phase loses what its own exchanges hide (_pipeline); a
    recompute's re-run exchange is the backward's, so more recompute never shrinks the forward and
    widens the backward's window (the reduction's) by more than the micro-batch grows."""
    comp = dict(phases)
    comp["f"], comp["b"] = comp["f"] + chunk_mb / 3 + parked_f, comp["b"] + 2 * chunk_mb / 3 + parked_b
    cm = _each_phase(nd) * lc["dense_comm_v"] + _each_phase(nm) * lc["moe_comm_v"]
    cm = {c: cm[..., i, :] for i, c in enumerate("fbwr") if c != "w"}  # comm has no W
    F = comp["f"] + cm["f"] + p2p[0]
    B = comp["b"] + comp["r"] + cm["b"] + cm["r"] + p2p[1]
    (ab, ab_f), (hid, hid_f) = absorbed, hidden
    return (comp, PipeWindow(F - ab_f, B - (ab - ab_f), comp["w"], M),
            PipeWindow(F - hid_f, B - (hid - hid_f), comp["w"], M))


def _share(part, whole):
    """part / whole, 0 where whole is not positive."""
    return np.divide(part, whole, out=np.zeros(np.broadcast_shapes(np.shape(part), np.shape(whole))),
                     where=np.asarray(whole) > 0)


def _offload_exposed(hw: HardwareSpec, lay: LayoutBatch, lc: dict, roles: dict, has_emb: dict, has_head: dict):
    """({role: forward seconds}, {role: backward seconds}) per micro-batch that each role's
    activation copies to and from the host leave exposed beyond its own compute (offload.py):
    Layout.offload_layers of its layers' saved activations, and of the others what
    Layout.offload_modules park, each way; none where no layout offloads activations (a search's
    common case: nothing priced)."""
    if not parks_activations(lay):
        z = np.zeros(len(lay))
        return dict.fromkeys(roles, z), dict.fromkeys(roles, z)
    fwd, bwd = {}, {}
    for r, (nd, nm) in roles.items():
        c = _phases(lc, nd, nm, has_emb[r], has_head[r])
        share = offloaded_share(lay, nd + nm)
        whole, parts = nd * lc["a_dense"] + nm * lc["a_moe"], nd * lc["o_dense"] + nm * lc["o_moe"]
        nbytes = share * whole + (1.0 - share) * parts
        fwd[r], bwd[r] = exposed_copies(hw, nbytes, c["f"], c["b"] + c["w"] + c["r"])
    return fwd, bwd


def evaluate(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, routing: Routing | None = None,
             headroom_gib: float = 0.0, compute_dtype: str | None = None) -> Estimate:
    """compute_dtype: GEMM precision (default: the layouts' Layout.fp8 recipe, else from the
    layouts' Layout.dtype; 'fp8' (current scaling), 'mxfp8' and 'fp8_blockwise' run GEMMs at the fp8
    peak with bf16 activations). MFU is against the peak of Layout.dtype.
    One batch holds one FP8 recipe (the cost model's dtype is per call)."""
    routing = routing or Routing()
    dtype = DTYPES[int(lay.dtype.max())]  # one dtype a call: a batch mixing them is priced in its last of DTYPES
    mfu_dtype = dtype
    fp8 = int(lay.fp8.max()) if len(lay) else 0
    if len(lay) and int(lay.fp8.min()) != fp8:
        raise ValueError("evaluate: one FP8 recipe per batch (Layout.fp8 differs between layouts)")
    if compute_dtype is None and fp8:
        compute_dtype = FP8_COMPUTE[FP8S[fp8]]
    dtype = compute_dtype or dtype
    n = len(lay)
    eb = lay.act_bytes.astype(float)

    require_host(hw, lay)
    # most of a step does not depend on the ZeRO stage, and a search tries each layout at several:
    # priced once per layout without it (_zero_free), then spread over its stages
    first, inv = _without_zero(lay)
    part = _zero_free(m, hw, lay if first is None else lay.take(first), routing, dtype)
    if first is not None:
        part = take_rows(part, inv)
    edp, t_pipe, share = part.edp, part.t_pipe, part.share
    roles, has_emb, has_head = part.ranks.per_role()

    # ---- data-parallel reduction, ZeRO gathers, optimizer ------------------------------
    # every stage reduces its own gradients and steps its own parameters once its last backward
    # is done, so the step waits for the stage whose reduction and step take longest, which
    # need not be the busiest one: a balanced split gives the stage with the LM head fewer
    # layers, whose parameters the others' outweigh (each stage priced with its own window)
    stage_rep, stage_exp = part.stage_rep, part.stage_exp
    params = RankParams(stage_rep, stage_exp, part.tensors)
    coll = hybrid(hw, lay, edp, stage_rep, stage_exp, eb, part.coll, part.stage_tables)  # hybrid sharding's groups
    dp_r, opt_r = dp_time(hw, lay, edp, params, eb, part.dp_win_r, coll)
    if part.tensors is not None:  # an eager runtime's per-tensor host work
        host_dp, host_opt = tensor_host_time(hw, lay, edp, *part.tensors, part.dp_win_r.M, stage_rep, stage_exp)
        dp_r, opt_r = dp_r + host_dp, opt_r + host_opt
    last = np.argmax(np.where(part.ranks.present, dp_r + opt_r, -np.inf), axis=0)  # the stage the step waits for
    t_dp, t_opt = np.take_along_axis(dp_r, last[None], 0)[0], np.take_along_axis(opt_r, last[None], 0)[0]

    # expert migration: one re-placement every period_steps steps, amortised (cost/migration.py)
    t_mig = np.zeros(n)
    mig = routing.migration
    if mig is not None and m.moe is not None:
        from .migration import migration_step_time

        p_pop = expert_popularity(m.moe.num_experts, routing.distribution, routing.zipf_s, routing.histogram)
        t_mig = migration_step_time(m, hw, lay, mig.period_steps, p_pop, mig.planner, mig.max_moves)
    t_dp = t_dp + part.dp_skew
    step = (t_pipe + t_dp + t_opt + t_mig) * share

    # ---- memory per representative rank ------------------------------------------------
    P_rep, P_exp = dict(zip(ROLES, stage_rep)), dict(zip(ROLES, stage_exp))
    tables = dict(zip(ROLES, part.stage_tables))
    mem, peak, stage_of, host_peak = rank_memory(m, hw, lay, roles, has_emb, has_head, part.acts, P_rep, P_exp,
                                                 tables, edp)
    fits = peak + headroom_gib <= hw.accelerator.memory_gib
    if hw.host is not None:  # what a rank offloads must fit its share of the host's memory
        fits &= host_peak <= hw.host.memory_gib

    # ---- throughput --------------------------------------------------------------------
    gpus = lay.gpus.astype(float)
    tflops = part.model_flops / step / gpus / 1e12
    hw_tflops = part.hw_flops / step / gpus / 1e12
    mfu = tflops * 1e12 / hw.peak_flops(mfu_dtype)
    time = {**part.time, "dp_comm": t_dp * share, "optimizer": t_opt * share, "migration": t_mig * share,
            **part.time_after}
    time["total"] = step
    lc = part.lc
    return Estimate(step_time_s=step, tokens_per_s=part.tokens / step, tflops_per_gpu=tflops,
                    hw_tflops_per_gpu=hw_tflops, mfu=mfu, peak_memory_gib=peak, fits=fits, memory=mem, time=time,
                    stage_of_role=stage_of, chunks=part.ranks.cs, imbalance=lc["imb"],
                    layer_time_s={"dense": lc["dense_layer"], "moe": lc["moe_layer"]}, host_memory_gib=host_peak,
                    v_shape=np.isin(lay.sched, [SCHEDULES.index("zbv"), SCHEDULES.index("dualpipev")]))


@dataclass
class RoleLayers:
    """The pipeline's representative ranks (first, mid, last stage: ROLES), each a row of a
    [roles, n] array: whether it exists, its dense and MoE layers, whether it holds the embedding
    and the LM head; with the chunk sizes they come from. _pipeline finds them; evaluate reads them."""
    cs: object            # stages.ChunkSizes
    present: np.ndarray   # which of the roles' ranks exist (first always, mid, last)
    nd: np.ndarray        # dense layers on each role's rank
    nm: np.ndarray        # MoE layers on it
    emb: np.ndarray       # it holds the embedding
    head: np.ndarray      # it holds the LM head

    def per_role(self) -> tuple[dict, dict, dict]:
        """(role -> (dense, MoE) layers, role -> holds the embedding, role -> holds the LM head)."""
        return ({r: (self.nd[i], self.nm[i]) for i, r in enumerate(ROLES)}, dict(zip(ROLES, self.emb)),
                dict(zip(ROLES, self.head)))


@dataclass
class ZeroFree:
    """What evaluate reads of a step that the ZeRO stage does not change, per layout."""
    edp: np.ndarray         # expert-data-parallel ranks (_group_terms)
    coll: object            # reduction.Collectives of each role's rank
    lc: dict                # per-layer terms the Estimate reports (imb, dense_layer, moe_layer)
    ranks: RoleLayers       # the pipeline's representative ranks
    stage_rep: np.ndarray   # [roles, n]: its replicated parameters
    stage_exp: np.ndarray   # [roles, n]: its expert parameters
    stage_tables: np.ndarray  # [roles, n]: the embedding and LM-head parameters among stage_rep
    tensors: tuple | None   # ([roles, n] replicated, expert) parameter tensors, where priced (prices_tensors)
    dp_win_r: "PipeWindow"  # each role's window for the reduction
    acts: dict              # rank_memory.role_activations
    t_pipe: np.ndarray      # the pipeline's seconds a step
    share: object           # core_share (1.0 on GPUs)
    dp_skew: np.ndarray     # what the first reduction waits for the rank the pipeline left last
    tokens: np.ndarray      # tokens a step
    model_flops: np.ndarray  # model FLOPs a step
    hw_flops: np.ndarray    # those and recompute's
    time: dict              # the step's breakdown before the reduction (compute ... bubble), seconds
    time_after: dict        # and after the optimizer (offload, where a layout offloads activations)


def _zero_free(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, routing: Routing, dtype: str) -> ZeroFree:
    """The pipeline (_pipeline), each role's parameters, the FLOPs and the step's breakdown but
    for the reduction and the optimizer: none of them reads the ZeRO stage."""
    n = len(lay)
    tp = lay.tp.astype(float)
    d = m.hidden_size
    M = lay.m
    pipe = _pipeline(m, hw, lay, routing, dtype)
    lc, busy, t_pipe = pipe.lc, pipe.busiest, pipe.t_pipe
    ranks = pipe.ranks
    roles, has_emb, has_head = ranks.per_role()
    nd_p, nm_p = busy["nd"], busy["nm"]
    dense_p, moe_rep_p, exp_p = layer_params_per_rank(m, lay)
    tables = {r: table_params(m, lay, has_emb[r], has_head[r]) for r in roles}
    P_rep = {r: roles[r][0] * dense_p + roles[r][1] * moe_rep_p + tables[r]
             + has_head[r] * m.mtp_layers * m.mtp_extra_params / tp for r in roles}
    P_exp = {r: roles[r][1] * exp_p for r in roles}
    tensors = param_tensors(m, ranks.nd, ranks.nm, ranks.emb, ranks.head) if prices_tensors(hw, lay) else None
    st = lambda per_role: _stacked(per_role, ROLES, n)  # noqa: E731

    # 1 on GPUs (a rank a device): a scalar, nothing to spread over the layouts or multiply per layout
    share = core_share(hw, lay) if hw.accelerator.ranks_per_core > 1 else 1.0
    if hw.accelerator.ranks_per_core > 1:  # ranks share cores (Accelerator.ranks_per_core): the
        # critical path runs at the spec's full-load rates, since a woken rank competes with the
        # busy ones for a core even in fill and drain (benchmarks/pipeline_hop.py: pp4 wall = 1.4 x
        # summed CPU / cores), and the step is at least the mean busy time per rank (summed CPU /
        # cores); a layout with at most a rank a core shares nothing
        shared = share * hw.accelerator.ranks_per_core > 1
        t_pipe = np.where(shared, np.maximum(t_pipe, M * pipe.total_sum / lay.pp), t_pipe)
    # the first reduction after the pipeline waits for the rank the whole pipeline left last
    dp_skew = np.where((lay.dpcp > 1) | (pipe.grp["edp"] > 1), comm.skew(hw, t_pipe), 0.0)

    tokens = (lay.gbs * lay.seq).astype(float)
    model_flops, rc_flops, masked_flops = _model_flops(m, lay, tokens)

    a2a_step = M * busy["a2a"]
    p2p_step = M * busy["p2p"]
    cp_step = M * (nd_p + nm_p) * lc["cp_layer"]  # the context-parallel ring's exposed share
    comm_step = M * busy["comm"]
    tp_step = comm_step - a2a_step - p2p_step - cp_step
    tp_step = np.where(tp_step > 1e-9 * comm_step, tp_step, 0.0)  # a residual: rounding, not seconds, below that
    p2p_step = p2p_step - M * busy["p2p_hidden"]  # what stays exposed (the bubble keeps the fill's and drain's)
    a2a_step = a2a_step - M * busy["hidden"]  # what stays exposed: the components add up to the step
    # the GPU's idle time while the host issues the busiest rank's layers (cost/host.py): counted in
    # the layers' phases, reported apart from the kernels' own time
    host_step = M * (nd_p * lc["dense_host"] + nm_p * lc["moe_host"])
    compute_step = M * (pipe.comp_total + busy["slow"]) - host_step - M * pipe.offload_mb
    bubble = np.maximum(t_pipe - M * pipe.peak_role_time, 0.0)
    time = {k: v * share for k, v in (("compute", compute_step), ("host", host_step), ("a2a", a2a_step),
                                      ("tp_comm", tp_step), ("cp_comm", cp_step), ("p2p", p2p_step),
                                      ("bubble", bubble))}
    # reported apart only where activations are offloaded
    time_after = {"offload": M * pipe.offload_mb * share} if parks_activations(lay) else {}
    stage_rep, stage_exp = st(P_rep), st(P_exp)
    # a word embedding tied to the LM head of another stage: those two ranks sum its gradients
    tied = st({r: (has_emb[r] ^ has_head[r]) * (m.vocab_size * d / tp) for r in ROLES}) if m.tied_embeddings else 0.0
    stage_tables = st(tables)
    units = (st({r: roles[r][0] + roles[r][1] + np.maximum(has_emb[r], has_head[r]) for r in roles}),
             st({r: roles[r][1] for r in roles}))  # ZeRO-3's units and those holding experts
    coll = collectives(hw, lay, pipe.grp, stage_rep, stage_exp, lay.act_bytes.astype(float), tied, stage_tables,
                       units)
    return ZeroFree(pipe.grp["edp"], coll, {k: lc[k] for k in ("imb", "dense_layer", "moe_layer")}, ranks,
                    stage_rep, stage_exp, stage_tables, tensors,
                    pipe.dp_win_r, pipe.acts, t_pipe, share, dp_skew, tokens, model_flops,
                    model_flops + rc_flops + masked_flops,
                    time, time_after)


# the per-layer terms (layer._layer_terms) memory, the step's breakdown and the Estimate read after the pipeline
LAYER_TERMS_AFTER = ("imb", "a_dense", "a_moe", "rc_dense", "rc_moe", "rc_dense_sel", "rc_moe_sel", "o_dense", "o_moe",
                     "cp_layer",
                     "dense_host", "moe_host", "dense_layer", "moe_layer")


@dataclass
class PipelinePart:
    """What _pipeline gives evaluate, per layout (roles: first, mid, last stage's rank)."""
    grp: dict             # _group_terms: process groups' sizes, strides and spans
    lc: dict              # per-layer terms the rest reads (LAYER_TERMS_AFTER)
    ranks: RoleLayers     # the representative ranks
    # the busiest role's (first, else last, else mid) dense and MoE layers (nd, nm) and, per
    # micro-batch, all-to-all seconds (a2a), of those hidden behind another micro-batch's compute
    # (hidden), compute slowed by the hidden exchange's units (slow), communication seconds (comm):
    # picked here, on the distinct layouts, rather than after they are spread over the ZeRO stages
    busiest: dict
    peak_role_time: np.ndarray  # the busiest role's seconds a micro-batch
    total_sum: np.ndarray       # all stages' seconds a micro-batch
    comp_total: np.ndarray      # the busiest role's compute seconds a micro-batch
    offload_mb: np.ndarray      # its exposed activation copies a micro-batch
    dp_win_r: "PipeWindow"      # each role's window for the reduction, stacked (first, mid, last)
    acts: dict                  # rank_memory.role_activations: each role's memory the ZeRO stage leaves alone
    t_pipe: np.ndarray          # the pipeline's seconds a step


def _pipeline(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, routing: Routing, dtype: str) -> PipelinePart:
    """The pipeline's part of a step, per layout: per-layer costs (_per_layer), the chunks and the
    three representative ranks (first, mid, last stage) with their layers, each role's
    micro-batch time and windows, the busiest role and the pipeline's time (schedule.pipeline_time).
    None of it reads the ZeRO stage; evaluate prices the reduction, the optimizer and memory,
    which do, from what this returns."""
    n = len(lay)
    d = m.hidden_size
    L = m.num_layers
    zero = np.zeros(n)
    M = lay.m
    grp = _group_terms(hw, lay, d)
    lc, layer_row = _per_layer(m, hw, lay, grp["ep_stride"], routing, dtype)
    # what Layout.offload_modules park on the host a layer and micro-batch (zeros where none does)
    lc["o_dense"], lc["o_moe"] = module_offload_bytes(m, lay, lc["imb"], hw.accelerator.expert_row_multiple)
    p2p_one = np.where(lay.pp == 1, 0.0, grp["p2p"])
    n_moe = m.num_moe_layers
    D = m.dense_layers
    moe_frac = n_moe / max(L - D, 1)

    # ---- chunks and representative ranks ----------------------------------------------
    chunks = lay.pp * lay.vpp
    # the partition reads only the chunk count and per-layer costs: compute it once per distinct pair
    v_shape = _v_shape(lay)
    _, first, inv = distinct_rows(layer_row, chunks, lay.split, v_shape)
    row = layer_row[first]
    x_first, x_last = _split_extras(lay.split[first], lc["x_first"][row], lc["x_last"][row])
    cs = chunk_sizes(L, chunks[first], x_first, x_last, minimise=lay.split[first] == 0, v_shape=v_shape[first]).take(inv)
    pp1 = lay.pp == 1
    first_layers, mid_layers, last_layers = (x.astype(float) for x in rank_layers(L, cs, lay.pp, lay.vpp, v_shape))
    has_mid = lay.pp > 2  # at pp 2 the V's turn rank is the last one (1 message each way), not a middle one
    first_dense = np.minimum(D, cs.first).astype(float)

    def split(layers, lead_dense):
        nm = moe_frac * (layers - lead_dense)
        return layers - nm, nm  # (dense, moe) layer counts

    roles = {"first": split(first_layers, first_dense),
             "mid": split(mid_layers, zero), "last": split(last_layers, np.where(pp1, first_dense, 0.0))}
    # each role a real rank (rank_memory labels its row so): rank 0, a middle one, pp - 1
    v_mid = v_mid_rank(cs.n_hi, lay.pp)
    stage_of = {"first": np.zeros(n, int), "mid": np.where(has_mid, np.where(v_shape, v_mid, 1), -1),
                "last": np.where(pp1, 0, lay.pp - 1)}
    has_emb = {"first": np.ones(n, bool), "mid": np.zeros(n, bool), "last": pp1}
    has_head = {"first": pp1 | v_shape, "mid": np.zeros(n, bool), "last": ~v_shape | pp1}
    # multi-token prediction: its blocks run beside the LM head (Megatron-Core places them on the
    # last pipeline stage), priced as layers of the last layer's kind; its projection and the
    # head's second pass are in the head's phase (layer._layer_terms)
    mtp = m.mtp_layers * np.asarray(m.mtp_is_moe, float)
    roles = {r: (nd + has_head[r] * (m.mtp_layers - mtp), nm + has_head[r] * mtp) for r, (nd, nm) in roles.items()}
    # where a rank runs several chunks: each kind of virtual stage's layers (the interleaved walk prices
    # each), and those of each chunk a role's rank runs, whose micro-batches it holds in different
    # numbers (memory.v_in_flight, memory.interleaved_states)
    multi = np.flatnonzero((lay.vpp > 1) & ~pp1)
    # the orders walked stage by stage (interleaved, 1f1b: its vpp-1 case, zbv and dualpipev) read each
    # kind's layers too
    walked = np.flatnonzero(((lay.vpp > 1) | (lay.sched == SCHEDULES.index("1f1b")) | v_shape) & ~pp1)
    kind_d, kind_m = _kind_layers(m, cs.take(walked), first_dense[walked], split)
    cs_multi = cs.take(multi)
    in_multi = np.searchsorted(walked, multi)  # multi is among them
    multi_d, multi_m = kind_d[:, in_multi], kind_m[:, in_multi]
    chunk_layers = {}
    for r in roles:
        at = rank_stages(lay.pp[multi], lay.vpp[multi], np.maximum(stage_of[r], 1 if r == "mid" else 0)[multi],
                         v_shape[multi])
        kinds = stage_kind(at, lay.pp[multi] * lay.vpp[multi], cs_multi.n_hi)
        chunk_layers[r] = (multi, *(at_kinds(x, kinds, lay.vpp[multi]) for x in (multi_d, multi_m)))
    n_dense_of = {r: nd for r, (nd, _) in roles.items()}
    n_moe_of = {r: nm for r, (_, nm) in roles.items()}

    # per-role totals from per-layer totals (cheap); phases only for the busiest role
    Td, Tm, Te, Th, Tdc, Tmc = (lc[k] for k in ("Td", "Tm", "Te", "Th", "Tdc", "Tmc"))
    chunk_mb = _chunk_overhead(hw, lay)  # a multi-chunk schedule's executor work per micro-batch
    dualpipe_hides = _dualpipe_overlaps(lay)
    # dualpipev, and Megatron-Core's EP overlap (Layout.a2a_overlap: a micro-batch's forward runs
    # beside another's backward), hide the all-to-all behind the other micro-batch's compute;
    # while a hidden all-to-all runs, its kernels hold some compute units (DeepEP: 20 SMs): the
    # compute beside it runs on the rest, which costs `held` of its speed for that long
    held = np.where(lay.a2a_sms > 0, lay.a2a_sms, hw.efficiency.overlap_comm_units) / hw.accelerator.compute_units
    # every role's rank at once, stacked on a leading axis (first, mid, last): the busiest one
    # runs the pipeline, and each one's window hides its own reduction (evaluate)
    rs = list(roles)
    st = lambda per_role: _stacked(per_role, rs, n)  # noqa: E731
    nd_r, nm_r, emb_r, head_r = st(n_dense_of), st(n_moe_of), st(has_emb), st(has_head)
    # messages a micro-batch each way a role's rank sends (_p2p_sends), seconds
    sends = _p2p_sends(lay)
    p2p_f, p2p_b = (st({r: c[i] * p2p_one for r, c in sends.items()}) for i in (0, 1))
    # the share matters only where an exchange hides; priced on those layouts alone
    hides = np.flatnonzero(dualpipe_hides | lay.ep_overlap)
    paired_share = np.zeros((len(rs), n))
    if hides.size:
        paired_share[:, hides] = _stacked(_paired_share(lay.take(hides)), rs, hides.size)
    parked_f, parked_b = _offload_exposed(hw, lay, lc, roles, has_emb, has_head)
    parked_f, parked_b = st(parked_f), st(parked_b)
    comp_t = nd_r * Td + nm_r * Tm + emb_r * Te + head_r * Th + chunk_mb + parked_f + parked_b
    comm_t = nd_r * Tdc + nm_r * Tmc + p2p_f + p2p_b
    a2a_per_mb = lc["a2a_layer"] * nm_r
    phases = _phases(lc, nd_r, nm_r, emb_r, head_r)
    a2a_f = lc["a2a_f_layer"] * nm_r
    # dualpipev hides each chunk's exchange behind the other chunk's compute (v_orders.pair_hiding);
    # Megatron-Core's EP overlap pairs each exchange with one compute node of the other
    # micro-batch (layer._layer_base: a2a_hide); both in their steady state's paired steps only
    # (_paired_share)
    crossed = pair_hiding(a2a_f, a2a_per_mb - a2a_f, phases["f"], phases["b"] + phases["w"] + phases["r"])
    paired = np.minimum(a2a_per_mb, nm_r * lc["a2a_hide"])
    per_pair = np.where(dualpipe_hides, crossed, np.where(lay.ep_overlap, np.minimum(paired, comp_t), 0.0))
    hidden_of = paired_share * per_pair
    slow_of = held * hidden_of
    # an off-stream exchange's host gap: what it absorbs in the steady state (beside the partner's
    # hiding) and in the unpaired micro-batches (all of the exchange exposed)
    gap = nm_r * lc["moe_host"]
    alone = _absorbed_by_host(lay, gap, a2a_per_mb)
    # a paired micro-batch's partner lasted its compute, then the gap: what its hiding took of the gap is gone
    free = np.maximum(gap - np.maximum(per_pair - (comp_t - gap), 0.0), 0.0)
    exposed = a2a_per_mb - (1.0 - held) * per_pair
    absorbed_paired = _absorbed_by_host(lay, free, exposed)
    absorbed = paired_share * absorbed_paired + (1.0 - paired_share) * alone
    # the forward's part of each (_window): its own exchanges (not a recompute's re-run) and what
    # they hide, behind the partner (Megatron-Core's overlap pairs each exchange with one node,
    # layer._layer_base: a2a_hide_f) or behind the chunk pair (dualpipev); the units' slow-down
    # and the host gap's absorption go with the exchange they come of
    a2a_once = (lc["a2a_f_layer"] + lc["a2a_bwd_layer"]) * nm_r  # without a re-run
    # what it hides is priced without the recompute: a re-run's compute, in the backward, lets the
    # partner hide more, and that is the backward's
    once = np.minimum(np.where(dualpipe_hides, a2a_once, np.minimum(a2a_once, nm_r * lc["a2a_hide"])),
                      np.maximum(comp_t - phases["r"], 0.0))
    f_pair = np.minimum(per_pair, once * np.where(dualpipe_hides, _share(a2a_f, a2a_once),
                                                  _share(lc["a2a_hide_f"], lc["a2a_hide"])))
    f_pair = np.where(dualpipe_hides | lay.ep_overlap, f_pair, 0.0)
    # the host gap absorbs the forward's exchange inside the forward's gap
    alone_f = np.minimum(_absorbed_by_host(lay, nm_r * lc["moe_host_f"], a2a_f), alone)
    absorbed_f = (paired_share * np.minimum(_absorbed_by_host(lay, nm_r * lc["moe_host_f"], a2a_f - (1.0 - held) * f_pair),
                                            absorbed_paired)
                  + (1.0 - paired_share) * alone_f)
    hidden_f = (1.0 - held) * paired_share * f_pair + absorbed_f
    # an interleaved schedule's steady state runs its messages behind the other micro-batch's compute
    # (Layout.p2p_overlap); the warm-up's and the cool-down's wait (_p2p_steady_share)
    p2p_hid_f, p2p_hid_b = p2p_hidden_parts(st(_p2p_steady_share(lay)), p2p_f, p2p_b, phases["f"],
                                            phases["b"] + phases["w"] + phases["r"])
    p2p_hidden = p2p_hid_f + p2p_hid_b
    totals = comp_t + comm_t - hidden_of + slow_of - absorbed - p2p_hidden
    t_first, t_mid, t_last = totals
    peak_role_time = np.maximum(np.maximum(t_first, t_last), np.where(has_mid, t_mid, 0.0))
    mids = np.maximum(lay.pp - 2, 0).astype(float)
    # the middle ranks' mean time: the representative one's scaled by the mean layers a middle rank holds
    mid_scale = np.where(cs.mid_hi > 0, (cs.mid_avg * lay.vpp) / np.maximum(mid_layers, 1), 0.0)
    total_sum = np.where(pp1, t_first, t_first + t_last + mids * mid_scale * t_mid)
    is_first = t_first >= peak_role_time  # the busiest role: first, else last, else mid
    is_last = ~is_first & (t_last >= peak_role_time)
    pick = lambda stacked: _busiest(dict(zip(rs, stacked)), is_first, is_last)  # noqa: E731
    # the reduction's windows lose the messages that run behind compute too: hidden, they take no
    # wall time, so a faster link that shortens them must not shorten the window
    comp_r, win_r, dp_win_r = _window(lc, phases, nd_r, nm_r, chunk_mb, parked_f, parked_b, (p2p_f, p2p_b), M,
                                      (hidden_of - slow_of + absorbed + p2p_hidden, hidden_f + p2p_hid_f),
                                      (alone, alone_f))
    # a paired step (dualpipev's F&B chunks, Megatron-Core's EP overlap) runs one micro-batch's
    # backward beside another's forward for the pair's whole wall time: that micro-batch's
    # reduction runs behind all of it. Read from its parts instead, the backward's window shrank
    # where faster compute moved the exposed exchange to the forward's side
    paired = dualpipe_hides | lay.ep_overlap
    if paired.any():  # ZeRO-2's per-micro-batch rounds only: ZeRO-0/1 reduce behind the last, lone backward
        pair_b = np.maximum(totals - dp_win_r.W - dp_win_r.B, 0.0) * paired_share
        dp_win_r = replace(dp_win_r, pair=np.where(paired, pair_b, 0.0))
    # in the steady state a rank with less work a micro-batch than the busiest one waits the
    # difference each period: a forward and a backward (1F1B and the other interleaving
    # schedules), a backward (gpipe runs the backwards back to back)
    present = st({"first": np.ones(n, bool), "mid": has_mid, "last": ~pp1})
    bwd = win_r.B + win_r.W
    wait_bwd = np.max(np.where(present, bwd, 0.0), axis=0) - bwd
    wait_all = peak_role_time - totals
    gpipe = lay.sched == SCHEDULES.index("gpipe")
    dp_win_r = replace(dp_win_r, slack=np.maximum(np.where(gpipe, wait_bwd, wait_all), 0.0))
    # the busiest rank's forward / backward-input / backward-weight / recompute seconds
    comp = {c: pick(v) for c, v in comp_r.items()}
    offload_mb = pick(parked_f) + pick(parked_b)
    comp_total = comp["f"] + comp["b"] + comp["w"] + comp["r"]
    # the closed forms; the interleaved order, 1F1B's where its last rank is not the busiest, and the
    # V orders are walked below
    t_pipe = pipeline_time(lay.sched, lay.pp, M, lay.vpp, pick(win_r.F), pick(win_r.B), pick(win_r.W),
                           peak_role_time, total_sum)
    # the fill and the drain wait on every hop's message: each other rank's chunk in the bubble
    # keeps the messages its steady state hides
    h_first, h_mid, h_last = p2p_hidden
    hidden_sum = np.where(pp1, h_first, h_first + h_last + mids * mid_scale * h_mid)  # as total_sum adds them
    t_pipe = t_pipe + (hidden_sum - pick(p2p_hidden)) / lay.vpp
    layer_phases = lambda idx: {k: lc[k][:, idx] for k in ("dense_v", "moe_v", "emb_v", "head_v")}  # noqa: E731
    # 1F1B's closed form is its order's step where the last rank is the busiest (tests/test_schedule_sim.py):
    # walked elsewhere, where the ranks after the busiest one absorb part of the fill and the drain
    one_f = (lay.sched == SCHEDULES.index("1f1b")) & (t_last < peak_role_time)
    il = np.flatnonzero(((lay.sched == SCHEDULES.index("interleaved")) | one_f) & ~pp1)
    if il.size:  # the order's own critical path: exact where chunks or ranks differ, as the closed form is not
        at = np.searchsorted(walked, il)  # il is among them
        kind_f, kind_b = kind_phases(kind_d[:, at], kind_m[:, at], layer_phases(il))
        on = lambda x: x[:, il]  # noqa: E731
        # each rank's stages at its steady state's pace (its hidden messages off); the fill and the drain
        # keep each other rank's hidden messages, as the closed form adds them
        t_pipe[il] = interleaved_pipe(lay.pp[il], lay.vpp[il], M[il], cs.n_hi[il], kind_f, kind_b, on(win_r.F),
                                      on(win_r.B + win_r.W), on(totals))
        t_pipe[il] += ((hidden_sum - pick(p2p_hidden)) / lay.vpp)[il]
    # zbv's and dualpipev's orders walked stage by stage, every rank at its role's pace: the closed forms
    # read a rank's two chunks as halves, every rank alike, and missed by -8 ... +8 % where the chunks
    # differ (benchmarks/v_chunks.py). Each role's windows (an unpaired micro-batch: the host's gap
    # absorbing what no partner hides) and what a dualpipev pair saves against them, so that a rank
    # whose share of paired chunks is paired_share runs `totals` a micro-batch
    zb = np.flatnonzero((lay.sched >= SCHEDULES.index("zbv")) & ~pp1)
    if zb.size:
        at = np.searchsorted(walked, zb)  # zb is among them
        kinds = kind_phases(kind_d[:, at], kind_m[:, at], layer_phases(zb), weight_apart=True)
        on = lambda x: x.take(zb, axis=-1)  # noqa: E731
        saves = np.where(dualpipe_hides[zb], on((1.0 - held) * per_pair + absorbed_paired - alone), 0.0)
        t_pipe[zb] = v_pipe(lay.sched[zb], lay.pp[zb], M[zb], cs.n_hi[zb], kinds, (on(win_r.F), on(win_r.B),
                                                                                  on(win_r.W)), saves)
    lc = {k: lc[k] for k in LAYER_TERMS_AFTER}
    # reported apart: what the host's gap absorbs as hidden exchange, then as the units' slow-down
    absorbed_a2a = np.minimum(absorbed, a2a_per_mb - hidden_of)
    busiest = dict(nd=pick(nd_r), nm=pick(nm_r), a2a=pick(a2a_per_mb), hidden=pick(hidden_of + absorbed_a2a),
                   slow=pick(slow_of - (absorbed - absorbed_a2a)),
                   comm=pick(comm_t), p2p=pick(p2p_f + p2p_b), p2p_hidden=pick(p2p_hidden))
    acts = role_activations(m, lay, roles, has_head, stage_of, chunk_layers, lc, M)
    ranks = RoleLayers(cs, present, nd_r, nm_r, emb_r, head_r)
    return PipelinePart(grp, lc, ranks, busiest, peak_role_time, total_sum, comp_total, offload_mb, dp_win_r,
                        acts, t_pipe)


def _kind_layers(m: ModelSpec, cs, lead_dense, split) -> tuple:
    """([4, n] dense, [4, n] MoE) layers of each kind of virtual stage (stages.kind_layers: first,
    larger middle, smaller middle, last), the leading dense layers on the first and the MTP modules
    on the last, as the roles count them (dense and MoE mixed as `split` spreads them)."""
    first = np.arange(4)[:, None] == 0
    nd, nm = split(kind_layers(cs).astype(float), np.where(first, lead_dense, 0.0))
    mtp = m.mtp_layers * float(m.mtp_is_moe)
    last = np.arange(4)[:, None] == 3
    return nd + last * (m.mtp_layers - mtp), nm + last * mtp


def _absorbed_by_host(lay: LayoutBatch, gap, exposed):
    """Seconds a micro-batch of an off-stream all-to-all's `exposed` work (Layout.a2a_overlap, an
    overlapping dualpipev: layer._a2a_off_stream) that run inside the host's issue gap, per role's
    rank. Off the stream, a MoE layer's host gap (`gap`: the GPU's idle seconds while the host
    issues, layer._layer_base) is priced against the compute alone, the exchange taken out; but
    the exchange's part no partner hides, and the slow-down of the units the hidden part holds,
    run on the GPU while it waits for the host all the same, so the gap absorbs up to that much
    of them (a host-bound layer lasts max(host, GPU work), the exchange's exposure within the GPU
    work). Without it a host-bound layer priced slower with the overlap on than off. A paired
    micro-batch passes only the gap its partner's hiding left free (the partner lasts its
    compute, then the gap), so no gap second hides two exchanges and a micro-batch never lasts
    less than its exchanges on the communication stream."""
    return np.where(_a2a_off_stream(lay), np.clip(np.minimum(gap, exposed), 0.0, None), 0.0)


def _busiest(per_role: dict, is_first, is_last):
    """The busiest role's value per layout: the first stage's, else the last's, else a middle one's."""
    return np.where(is_first, per_role["first"], np.where(is_last, per_role["last"], per_role["mid"]))


def _stacked(per_role: dict, roles, n: int) -> np.ndarray:
    """[roles, n]: each role's value over the n layouts, in the order of `roles`. Filled row by
    row (a scalar broadcasts): np.stack of broadcast views costs more in overhead."""
    vals = [per_role[r] for r in roles]
    out = np.empty((len(vals), n), np.result_type(*vals))
    for i, v in enumerate(vals):
        out[i] = v
    return out


# the columns a search varies with the ZeRO stage (search._batch): priced after the pipeline
ZERO_COLUMNS = ("zero", "zrep", "fsdp2", "gstep", "wacc")


def _without_zero(lay: LayoutBatch):
    """(first, inverse) of the layouts' distinct rows (batch.distinct_rows) over every column but
    ZERO_COLUMNS: the ZeRO stage, its replicas, FSDP2's copies, when ZeRO-3 reduces and how the held
    gradients are added (whose default reads fsdp2); Nones where no two layouts differ in those alone."""
    if len(lay) == 0 or all(getattr(lay, k).min() == getattr(lay, k).max() for k in ZERO_COLUMNS):
        return None, None
    cols = []
    for f in fields(lay):
        c = getattr(lay, f.name)
        if f.name in ZERO_COLUMNS:  # ZeRO-3's alone (search._batch), charged after
            continue
        if c.dtype.kind == "f":  # a share (Layout.optimizer_offload): its distinct values as codes
            c = np.unique(c, return_inverse=True)[1] if c.min() != c.max() else np.zeros(len(c), np.intp)
        cols.append(c)
    _, first, inv = distinct_rows(*cols)
    return (None, None) if len(first) == len(lay) else (first, inv)


def core_share(hw: HardwareSpec, lay: LayoutBatch) -> np.ndarray:
    """Time factor for a CPU spec measured with ranks sharing cores (Accelerator.ranks_per_core
    > 1: its rates are per rank with gpus_per_node ranks busy on gpus_per_node / ranks_per_core
    cores) on a layout with fewer ranks a node: under time-sharing each rank's CPU-bound work
    runs ranks-per-core times slower, so a layout with r local ranks runs at
    max(r / cores, 1) / ranks_per_core of the spec's times (a one-thread rank cannot use more
    than a core). 1 for GPUs and for full nodes. Measured: tiny-moe on 4 of a 2-core host's
    ranks (spec calibrated with 8) ran 0.5-0.6 of the unscaled prediction."""
    rpc = hw.accelerator.ranks_per_core
    if rpc <= 1:
        return np.ones(len(lay))
    cores = hw.gpus_per_node / rpc
    local = np.minimum(lay.gpus, hw.gpus_per_node).astype(float)
    return np.maximum(local / cores, 1.0) / rpc


def _split_extras(split, x_first, x_last):
    """What the partition counts the embedding and the LM head as, in layers (Layout.pipeline_split):
    their cost (balanced), nothing (even: Megatron-Core's default), one layer each (account)."""
    fixed = np.where(split == 2, 1.0, 0.0)
    return np.where(split == 0, x_first, fixed), np.where(split == 0, x_last, fixed)


def _model_flops(m: ModelSpec, lay: LayoutBatch, tokens):
    """(model FLOPs per step, FLOPs recompute adds, FLOPs an eager attention kernel adds) per
    layout. The last: materialised scores are whole s x s GEMMs (compute.core_attention prices
    them so) where the model count takes the causal or windowed keys only; executed, so counted
    in the hardware FLOPs (Narayanan 2021 eq. 3 counts attention whole), not in the model's."""
    seq, layers = lay.seq, m.num_layers + m.mtp_layers
    fpt, core_fwd, masked_fwd = np.zeros(len(lay)), np.zeros(len(lay)), np.zeros(len(lay))
    for s in np.unique(seq):  # one length in a search, a few in validate
        at = seq == s
        fpt = np.where(at, m.flops_per_token(int(s)), fpt)
        core_fwd = np.where(at, layers * m.attn_core_flops(int(s)), core_fwd)
        masked_fwd = np.where(at, layers * m.attn_core_flops(int(s), causal=False), masked_fwd)
    masked_fwd = masked_fwd - core_fwd
    model_flops = fpt * tokens
    rc = lay.recompute
    # hardware FLOPs of recompute: full re-runs the forward; selective counts the core attention
    # (its other modules, norms and activations, are memory-bound passes; MLA up-projection and
    # MLP / MoE GEMMs re-run under those modules are left out of this count)
    # (full recompute of the first N layers of each chunk re-runs that share of the forward;
    # the layers' forward only: the LM head, and each MTP module's pass through it, do not re-run)
    share = full_recompute_share(m, lay)
    head_fwd = 2.0 * m.vocab_size * m.hidden_size * (1 + m.mtp_layers) * tokens
    core_rc = np.where(rc == 2, share, recomputes(lay, "core_attn"))  # forwards of the core re-run
    rc_flops = np.where(rc == 2, share * (model_flops / 3.0 - head_fwd),
                        np.where(recomputes(lay, "core_attn"), core_fwd * tokens, 0.0))
    masked = np.where(lay.eager, masked_fwd * tokens * (3.0 + core_rc), 0.0)
    return model_flops, rc_flops, masked


def _group_terms(hw: HardwareSpec, lay: LayoutBatch, d: int) -> dict:
    """What a layout's process groups (tp, dp, ep, placement) and its stage-boundary message
    (mbs, seq, dtype, sp) fix, per layout: expert-DP size and strides, the DP groups' spans,
    one P2P message's seconds. A search has a few hundred distinct combinations, so each is
    priced once (comm's level counts are costly on every candidate)."""
    # a looped interleaved schedule's chunk rounds and wraps (p2p); a V's arms cross the boundaries alike
    rounds = np.where(_v_shape(lay), 1, lay.vpp)
    _, first, inv = distinct_rows(lay.tp, lay.cp, lay.dp, lay.ep, lay.etp, lay.placement, lay.mbs, lay.seq,
                                  lay.act_bytes, lay.sp, lay.p2p_sg, lay.unfused, lay.gpus, rounds)
    g = lay.take(first)
    edp = g.edp
    tp = g.tp.astype(float)
    # p2p: each chunk boundary sends the activation forward and its gradient back; each tp rank
    # sends its 1/tp where sequence parallelism splits it, or where the message is scattered over
    # tp and the receiver all-gathers it (Layout.p2p_scatter_gather; Megatron-LM p2p_communication:
    # tensor_chunk_shape = numel // tp, then gather_split_1d_tensor over the tp group)
    # piper-train (unfused) keeps its residual stream in fp32 under autocast and sends it so
    # (runtime/model.py: a chunk returns x.float()); the fused stacks send the layout's dtype
    whole = g.tokens * d * np.where(g.unfused, 4.0, g.act_bytes.astype(float))
    scattered = g.p2p_sg & ~g.sp & (g.tp > 1)
    p2p_bytes = whole / np.where(g.sp | scattered, tp, 1.0)
    gather = np.where(scattered, comm.ring_allreduce(hw, whole, g.tp, 1, 0.5, world=g.gpus), 0.0)
    co = hw.efficiency.collective_overhead_us * 1e-6
    edp_stride = g.edp_stride
    dp_bw, dp_lat = comm.group_span(hw, g.dpcp, g.tp, g.gpus)
    edp_bw, edp_lat = comm.group_span(hw, edp, edp_stride, g.gpus)
    out = dict(edp=edp, ep_stride=g.ep_stride, edp_stride=edp_stride,
               p2p=comm.p2p(hw, p2p_bytes, g.dpcp * g.tp, g.gpus, rounds[first]) + co + gather,
               dp_bw=dp_bw, dp_lat=dp_lat, edp_bw=edp_bw, edp_lat=edp_lat)
    return {k: np.asarray(v).take(inv) for k, v in out.items()}


def _role_ranks(lay: LayoutBatch):
    """(role, pipeline rank) of the three representative ranks: first, mid, last."""
    pp = lay.pp.astype(float)
    return (("first", 0.0), ("mid", np.floor((pp - 1) / 2)), ("last", pp - 1))


def _past_warm_up(lay: LayoutBatch, rank) -> np.ndarray:
    """Share of pipeline rank `rank`'s M·vpp chunks in Megatron-Core's steady state, between its
    W = 2(pp - rank - 1) + (vpp - 1)·pp warm-up forwards (one more under the EP overlap,
    Layout.a2a_overlap: schedules.get_pp_rank_microbatches; microbatch_group_size_per_vp_stage at
    its default, pp) and as many cool-down backwards: (M·vpp - W) / (M·vpp). Without pipelining
    the first forward and the last backward stand apart (combined_1f1b_schedule_for_no_pipelining:
    "executed alone, no a2a overlapping"): W = 1."""
    mv = lay.m.astype(float) * lay.vpp
    pp = lay.pp.astype(float)
    warm = np.where(lay.pp == 1, 1.0, 2.0 * (pp - rank - 1) + (lay.vpp - 1) * pp + lay.ep_overlap)
    return np.clip(mv - warm, 0.0, None) / np.maximum(mv, 1.0)


def _paired_share(lay: LayoutBatch) -> dict:
    """Share of a rank's micro-batch chunks whose all-to-all can hide behind another
    micro-batch's compute, per role (first, mid, last pipeline rank): both overlapping
    schedules pair a forward with a backward only in their steady state.
    - Megatron-Core's EP overlap (Layout.a2a_overlap): its warm-up forwards and cool-down
      backwards run alone (_past_warm_up). GPipe over a pipeline pairs none: all its forwards
      run before its backwards.
    - dualpipev: of a rank's 2M chunk forwards, DualPipeV's main step pairs
      2(M - 2pp + rank + 1) with a backward and its step 5 another pp - rank - 1; the last rank
      leaves its main step's first pair apart (deepseek-ai/DualPipe dualpipev.py, steps 1-8)."""
    M = lay.m.astype(float)
    pp = lay.pp.astype(float)
    dualpipe = lay.sched == SCHEDULES.index("dualpipev")
    # GPipe runs every forward before any backward: no forward has a backward beside it
    apart = (lay.sched == SCHEDULES.index("gpipe")) & (lay.pp > 1)
    share = {}
    for role, rank in _role_ranks(lay):
        megatron = _past_warm_up(lay, rank)  # read only where the EP overlap is on (else dualpipev's)
        pairs = 2.0 * M - 3.0 * pp + rank + 1.0 - (rank == pp - 1)
        share[role] = np.where(apart, 0.0, np.where(dualpipe, np.clip(pairs, 0.0, None) / np.maximum(2.0 * M, 1.0),
                                                      megatron))
    return share


def p2p_hidden_parts(share, fwd_msgs, bwd_msgs, fwd, bwd):
    """(forward messages', backward messages') seconds a micro-batch of a rank's pipeline
    messages that run behind compute, given the `share` of its chunks in the steady state
    (_p2p_steady_share) and, per micro-batch, the seconds of its forward messages (activations
    on, `fwd_msgs`) and backward ones (gradients back, `bwd_msgs`), its forward (`fwd`) and
    backward (`bwd`) compute: a forward's send and next receive run beside the backward that
    follows, a backward's beside the next forward (Megatron-Core's overlap_p2p_comm; torch's
    runtime receives one action ahead), so each direction hides only what that phase lasts."""
    return share * np.minimum(fwd_msgs, bwd), share * np.minimum(bwd_msgs, fwd)


def p2p_hidden_mb(share, fwd_msgs, bwd_msgs, fwd, bwd):
    """Seconds a micro-batch of a rank's pipeline messages that run behind compute, both
    directions (p2p_hidden_parts)."""
    return sum(p2p_hidden_parts(share, fwd_msgs, bwd_msgs, fwd, bwd))


def _v_shape(lay: LayoutBatch) -> np.ndarray:
    """zbv, dualpipev: chunks placed in a V, rank 0 running the first and the last chunk."""
    return lay.sched >= SCHEDULES.index("zbv")


def _p2p_sends(lay: LayoutBatch) -> dict:
    """{role: (forward, backward) stage-boundary messages its rank sends a micro-batch}. Every
    chunk sends its output to the next chunk and its input's gradient to the one before, except
    at the pipeline's ends (the last chunk sends nothing on, the first nothing back) and where
    two consecutive chunks share a rank (the V's turn on the last rank). Looped (gpipe, 1F1B,
    interleaved): the first rank sends vpp on and vpp - 1 back, the last vpp - 1 and vpp, the
    others vpp each way; a V (zbv, dualpipev: 2 chunks a rank) 1 each way on the first and last
    rank, 2 on the others. The end ranks' one message fewer matters at pp 2, where both ranks
    are ends (the closed form then matches the schedule run action by action exactly:
    tests/test_schedule_sim.py); none at pp 1."""
    v, v_shape = lay.vpp.astype(float), _v_shape(lay)
    one = (lay.pp > 1).astype(float)
    end_f = np.where(v_shape, 1.0, v) * one  # the first rank's sends on, the last rank's back
    end_b = np.where(v_shape, 1.0, v - 1.0) * one
    return {"first": (end_f, end_b), "mid": (v * one, v * one), "last": (end_b, end_f)}


def _p2p_steady_share(lay: LayoutBatch) -> dict:
    """Share of a rank's chunk messages an interleaved schedule runs behind compute, per role (first,
    mid, last pipeline rank), where Layout.p2p_overlap (0 elsewhere). Megatron-Core's interleaved
    schedule with overlap_p2p_comm posts each steady-state forward's send and next receive beside
    the backward that follows, and the backward's beside the next forward, while its W = 2(pp - rank
    - 1) + (vpp - 1)·pp warm-up forwards (one more under Layout.a2a_overlap) and as many cool-down
    backwards wait on theirs (schedules.py forward_backward_pipelining_with_interleaving; its
    overlap_p2p_comm_warmup_flush, off by default, would hide those too; Megatron-Bridge
    docs/performance-guide.md: "the PP communications in pipeline fill and flush stages are still
    exposed"): _past_warm_up. torch's ScheduleInterleaved1F1B (piper-train) places each
    receive ahead of the compute before the one that needs it (_add_send_recv), the same steady
    state. The other schedules wait on each message (Megatron-Core's non-interleaved one sends and
    receives as one blocking batch; torch's Schedule1F1B waits likewise)."""
    on = lay.p2p_ovl & (lay.sched == SCHEDULES.index("interleaved")) & (lay.pp > 1)
    return {role: np.where(on, _past_warm_up(lay, rank), 0.0) for role, rank in _role_ranks(lay)}


def _chunk_overhead(hw: HardwareSpec, lay: LayoutBatch) -> np.ndarray:
    """Seconds per micro-batch a rank's extra chunks cost under a multi-chunk schedule:
    (vpp − 1) × efficiency.pipeline_chunk_us[schedule] (0 where not measured)."""
    out = np.zeros(len(lay))
    for name, us in hw.efficiency.pipeline_chunk_us.items():
        if name in SCHEDULES:
            out = np.where(lay.sched == SCHEDULES.index(name), (lay.vpp - 1) * us * 1e-6, out)
    return out


