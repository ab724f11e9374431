"""One training step of a model under many layouts at once: memory, time, throughput.

`evaluate(model, hw, batch, routing)` returns an Estimate of numpy arrays (one entry per
layout); `Estimate.row(i)` is what `piper-plan estimate --json` prints. The search and
`estimate` call this same function, so a plan's numbers are reproducible exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..specs.hardware import HardwareSpec
from ..specs.model import ModelSpec
from . import activations as act
from . import comm
from .batch import LayoutBatch, distinct_rows
from .compute import Phase, attention_phase, embedding_phase, ffn_phase, lm_head_phase, moe_phase
from .imbalance import expert_popularity, imbalance
from .memory import GIB, in_flight, layer_params_per_rank, state_bytes, state_coeffs
from .schedule import pipeline_time
from .stages import chunk_sizes

DTYPE_NAME = {2: "bf16", 4: "fp32"}


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
            d = {"stage": st, "role": role, **d}
            mem.append(d)
        mem.sort(key=lambda d: d["stage"])
        return dict(
            step_time_s=f(self.step_time_s), tokens_per_s=f(self.tokens_per_s),
            tflops_per_gpu=f(self.tflops_per_gpu), hw_tflops_per_gpu=f(self.hw_tflops_per_gpu),
            mfu=f(self.mfu), peak_memory_gib=f(self.peak_memory_gib), fits=bool(self.fits[i]),
            imbalance=f(self.imbalance), memory_gib_per_stage=mem,
            time_breakdown_s={k: f(v) for k, v in self.time.items()},
            a2a_time_s=f(self.time["a2a"]),
        )


def _tp_allreduce(hw, lay, nbytes):
    return comm.ring_allreduce(hw, nbytes, lay.tp, 1)


def _a2a(hw, lay, nbytes):
    stride = np.where(lay.placement == 0, 1, lay.edp)
    flat = comm.a2a_flat(hw, nbytes, lay.ep, stride)
    halo = comm.a2a_halo(hw, nbytes, lay.ep, stride, flat=flat)
    return np.where(lay.a2a == 1, halo, flat)


def evaluate(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, routing: Routing | None = None,
             headroom_gib: float = 0.0, compute_dtype: str | None = None) -> Estimate:
    """compute_dtype: GEMM precision (default from the activation bytes: fp32 or bf16; 'fp8'
    runs GEMMs at the fp8 peak with bf16 activations). MFU is always against the bf16 peak
    (or fp32 for fp32 runs)."""
    routing = routing or Routing()
    dtype = "fp32" if int(lay.act_bytes.max()) == 4 else "bf16"
    if dtype == "fp32" and "fp32" not in hw.accelerator.peak_tflops:
        dtype = "bf16"
    mfu_dtype = dtype
    dtype = compute_dtype or dtype
    eb = lay.act_bytes.astype(float)
    tp = lay.tp.astype(float)
    t = (lay.mbs * lay.seq).astype(float)
    d = m.hidden_size
    L = m.num_layers
    zero = np.zeros(len(lay))

    # ---- per-layer costs: they depend on few columns, so price each distinct one once ----
    # the EP group's stride stands in for dp: nothing per-layer depends on dp otherwise
    ep_stride = np.where(lay.placement == 0, 1, lay.edp)
    _, first_idx, inv = distinct_rows(lay.mbs, lay.seq, lay.tp, ep_stride, lay.ep, lay.sp, lay.eager, lay.unfused,
                                      lay.dropout, lay.recompute, lay.act_bytes, lay.a2a, lay.placement)
    lc = {k: v.take(inv) for k, v in _layer_costs(m, hw, lay.take(first_idx), routing, dtype).items()}
    dense, dense_comm, moe, moe_comm = lc["dense"], lc["dense_comm"], lc["moe"], lc["moe_comm"]
    imb, emb, head = lc["imb"], lc["emb"], lc["head"]
    # p2p: each chunk boundary sends the activation forward and its gradient back (depends on dp)
    p2p_bytes = t * d * eb / np.where(lay.sp, tp, 1.0)
    co = hw.efficiency.collective_overhead_us * 1e-6
    p2p_one = np.where(lay.pp == 1, 0.0, comm.p2p(hw, p2p_bytes, lay.dp * lay.tp) + co)
    a2a_fwd, a2a_bwd = lc["a2a_fwd"], lc["a2a_bwd"]
    a_dense, a_moe = lc["a_dense"], lc["a_moe"]
    n_moe, n_dense = m.num_moe_layers, m.num_dense_layers
    D = m.dense_layers
    moe_frac = n_moe / max(L - D, 1)

    # ---- chunks and representative ranks ----------------------------------------------
    tot = lambda ph: ph.total  # noqa: E731
    avg_layer = (n_dense * tot(dense + dense_comm) + n_moe * tot(moe + moe_comm)) / L
    chunks = lay.pp * lay.vpp
    cs = chunk_sizes(L, chunks, tot(emb) / avg_layer, tot(head) / avg_layer)
    v_shape = lay.sched >= 3
    vm1 = (lay.vpp - 1).astype(float)
    pp1 = lay.pp == 1
    first_layers = np.where(pp1, L, np.where(v_shape, cs.first + cs.last, cs.first + vm1 * cs.mid_hi))
    last_layers = np.where(pp1, L, np.where(v_shape, 2 * cs.mid_hi, cs.last + vm1 * cs.mid_hi))
    mid_layers = lay.vpp * cs.mid_hi
    has_mid = (lay.pp > 2) | (v_shape & (lay.pp > 1))
    first_dense = np.minimum(D, cs.first).astype(float)

    def split(layers, lead_dense):
        nm = moe_frac * (layers - lead_dense)
        return layers - nm, nm  # (dense, moe) layer counts

    roles = {"first": split(first_layers, first_dense),
             "mid": split(mid_layers, zero), "last": split(last_layers, np.where(pp1, first_dense, 0.0))}
    roles["last"] = (np.where(v_shape & ~pp1, roles["mid"][0], roles["last"][0]),
                     np.where(v_shape & ~pp1, roles["mid"][1], roles["last"][1]))
    has_emb = {"first": np.ones(len(lay), bool), "mid": np.zeros(len(lay), bool), "last": pp1}
    has_head = {"first": pp1 | v_shape, "mid": np.zeros(len(lay), bool), "last": ~v_shape | pp1}

    rank_chunks = lay.vpp.astype(float)

    # per-role totals from per-layer totals (cheap); full phases only for the busiest role
    Td, Tm, Te, Th = tot(dense), tot(moe), tot(emb), tot(head)
    Tdc, Tmc = tot(dense_comm), tot(moe_comm)
    p2p_mb = p2p_one * rank_chunks  # each way, per micro-batch
    full_rc = (lay.recompute == 2).astype(float)
    comp_t, comm_t, a2a_per_mb, totals = {}, {}, {}, {}
    for r, (nd, nm) in roles.items():
        comp_t[r] = nd * Td + nm * Tm + has_emb[r] * Te + has_head[r] * Th
        comm_t[r] = nd * Tdc + nm * Tmc + 2 * p2p_mb
        a2a_per_mb[r] = (a2a_fwd * (1 + full_rc) + a2a_bwd) * nm
        # dualpipev overlaps the all-to-all with the other micro-batch's compute
        hidden_r = np.minimum(a2a_per_mb[r], comp_t[r])
        totals[r] = comp_t[r] + comm_t[r] - np.where(lay.sched == 4, hidden_r, 0.0)
    peak_role_time = np.maximum(np.maximum(totals["first"], totals["last"]), np.where(has_mid, totals["mid"], 0.0))
    mids = np.maximum(lay.pp - 2, 0).astype(float)
    mid_avg_time = np.where(cs.mid_hi > 0, totals["mid"] * (cs.mid_avg * lay.vpp) / np.maximum(mid_layers, 1), 0.0)
    total_sum = np.where(pp1, totals["first"], totals["first"] + totals["last"] + mids * mid_avg_time)
    busiest = np.select([totals["first"] >= peak_role_time, totals["last"] >= peak_role_time], [0, 1], 2)
    pick = lambda get: np.where(busiest == 0, get("first"), np.where(busiest == 1, get("last"), get("mid")))  # noqa: E731
    nd_p, nm_p = pick(lambda r: roles[r][0]), pick(lambda r: roles[r][1])
    comp = (dense.scale(nd_p) + moe.scale(nm_p) + emb.scale(pick(lambda r: has_emb[r]))
            + head.scale(pick(lambda r: has_head[r])))
    cm = dense_comm.scale(nd_p) + moe_comm.scale(nm_p)
    F = comp.f + cm.f + p2p_mb
    B = comp.b + comp.r + cm.b + cm.r + p2p_mb
    W = comp.w
    hidden = np.minimum(pick(lambda r: a2a_per_mb[r]), comp.total)
    M = lay.m
    t_pipe = pipeline_time(lay.sched, lay.pp, M, lay.vpp, F, B, W, peak_role_time, total_sum, hidden)

    # ---- data-parallel reduction, ZeRO gathers, optimizer ------------------------------
    dense_p, moe_rep_p, exp_p = layer_params_per_rank(m, lay)
    P_rep = {r: roles[r][0] * dense_p + roles[r][1] * moe_rep_p
             + has_emb[r] * m.embedding_params / tp
             + has_head[r] * m.vocab_size * d / tp * (1 - (m.tied_embeddings & has_emb[r])) for r in roles}
    P_exp = {r: roles[r][1] * exp_p for r in roles}
    gb = np.where(eb == 4, 4.0, lay.grad_bytes)
    edp_stride = np.where(lay.placement == 0, lay.ep, 1)
    rep_pr, exp_pr = pick(lambda r: P_rep[r]), pick(lambda r: P_exp[r])
    zfrac = np.where(lay.zero >= 1, 0.5, 1.0)
    dp_span, edp_span = comm.group_span(hw, lay.dp, lay.tp), comm.group_span(hw, lay.edp, edp_stride)
    t_rs = (comm.ring_allreduce(hw, rep_pr * gb, lay.dp, lay.tp, zfrac, dp_span)
            + comm.ring_allreduce(hw, exp_pr * gb, lay.edp, edp_stride, zfrac, edp_span))
    t_ag = np.where(lay.zero >= 1, comm.ring_allreduce(hw, rep_pr * eb, lay.dp, lay.tp, 0.5, dp_span)
                    + comm.ring_allreduce(hw, exp_pr * eb, lay.edp, edp_stride, 0.5, edp_span), 0.0)
    z3 = np.where(lay.zero >= 3, M * 3.0 * t_ag, 0.0)  # re-gather for fwd and bwd, reduce-scatter per micro-batch
    window_b = np.where(lay.overlap, B + W, 0.0)
    window_f = np.where(lay.overlap, F, 0.0)
    t_dp = np.maximum(0.0, t_rs - window_b) + np.maximum(0.0, t_ag - window_f) + z3
    if co:  # fixed cost per call: one reduction per replication group, the ZeRO gather as one
        # broadcast per owner (whole-parameter sharding, as torch's ZeroRedundancyOptimizer and
        # piper-train do), and the global gradient norm's all-reduce
        dpn, edpn = lay.dp.astype(float), lay.edp.astype(float)
        gather = np.where(lay.zero >= 1, np.where(dpn > 1, dpn, 0.0) + np.where(edpn > 1, edpn, 0.0), 0.0)
        t_dp = t_dp + co * ((dpn > 1) + (edpn > 1) + gather + (lay.gpus > 1))
    # optimizer: stream master, m, v (read+write), grad (read), weight (write) per local param
    dpg = np.maximum(lay.dp, 1).astype(float)
    local = rep_pr / np.where(lay.zero >= 1, dpg, 1.0) + exp_pr / np.where(lay.zero >= 1, np.maximum(lay.edp, 1), 1.0)
    t_opt = local * (2 * 12.0 + gb + eb) / (hw.accelerator.memory_bandwidth_gbps * 1e9 * hw.efficiency.memory)

    rpc = hw.accelerator.ranks_per_core
    if rpc > 1:  # ranks share cores: one rank's idle time runs the others (Accelerator.ranks_per_core)
        t_pipe = np.maximum(t_pipe / rpc, M * total_sum / lay.pp)
    # expert migration: one re-placement every period_steps steps, amortised (cost/migration.py)
    t_mig = np.zeros(len(lay))
    mig = routing.migration
    if mig is not None and m.moe is not None:
        from .migration import migration_step_time

        p_pop = expert_popularity(m.moe.num_experts, routing.distribution, routing.zipf_s, routing.histogram)
        t_mig = migration_step_time(m, hw, lay, mig.period_steps, p_pop, mig.planner, mig.max_moves)
    step = t_pipe + t_dp + t_opt + t_mig

    # ---- memory per representative rank ------------------------------------------------
    stage_of = {"first": np.zeros(len(lay), int), "mid": np.where(has_mid, 1, -1),
                "last": np.where(pp1, 0, lay.pp - 1)}
    mem = {}
    peak = np.zeros(len(lay))
    c_rep, c_exp = state_coeffs(lay.dp, lay), state_coeffs(lay.edp, lay)
    for r, (nd, nm) in roles.items():
        rep = state_bytes(P_rep[r], lay.dp, lay, c_rep)
        ex = state_bytes(P_exp[r], lay.edp, lay, c_exp)
        comps = {k: (rep[k] + ex[k]) / GIB for k in rep}
        infl = in_flight(lay, np.maximum(stage_of[r], 0))
        comps["activations"] = infl * (nd * a_dense + nm * a_moe) / GIB
        logits = t * m.vocab_size / tp * (4.0 + eb)
        comps["logits"] = has_head[r] * logits / GIB
        a2a_buf = np.where(nm > 0, 2.0 * t / tp * (m.moe.top_k if m.moe else 0) * d * eb * imb, 0.0)
        comps["a2a_buffers"] = a2a_buf / GIB
        comps["overhead"] = np.full(len(lay), hw.memory_overhead_gib)
        comps["total"] = sum(comps.values())
        mem[r] = comps
        valid = stage_of[r] >= 0
        peak = np.maximum(peak, np.where(valid, comps["total"], 0.0))
    fits = peak + headroom_gib <= hw.accelerator.memory_gib

    # ---- throughput --------------------------------------------------------------------
    tokens = (lay.gbs * lay.seq).astype(float)
    seqs = np.unique(lay.seq)
    fpt = np.zeros(len(lay))
    for s in seqs:
        fpt = np.where(lay.seq == s, m.flops_per_token(int(s)), fpt)
    model_flops = fpt * tokens
    core_fwd = np.zeros(len(lay))
    for s in seqs:
        core_fwd = np.where(lay.seq == s, m.num_layers * m.attn_core_flops(int(s)), core_fwd)
    rc_flops = np.select([lay.recompute == 2, lay.recompute == 1], [model_flops / 3.0, core_fwd * tokens], 0.0)
    gpus = lay.gpus.astype(float)
    tflops = model_flops / step / gpus / 1e12
    hw_tflops = (model_flops + rc_flops) / step / gpus / 1e12
    mfu = tflops * 1e12 / hw.peak_flops(mfu_dtype)

    a2a_step = M * pick(lambda r: a2a_per_mb[r])
    p2p_step = M * p2p_one * rank_chunks * 2
    tp_step = M * pick(lambda r: comm_t[r]) - a2a_step - p2p_step
    compute_step = M * comp.total
    bubble = np.maximum(t_pipe - M * peak_role_time, 0.0)
    time = {"compute": compute_step, "a2a": a2a_step, "tp_comm": np.maximum(tp_step, 0.0),
            "p2p": p2p_step, "bubble": bubble, "dp_comm": t_dp, "optimizer": t_opt, "migration": t_mig,
            "total": step}
    return Estimate(step_time_s=step, tokens_per_s=tokens / step, tflops_per_gpu=tflops, hw_tflops_per_gpu=hw_tflops,
                    mfu=mfu, peak_memory_gib=peak, fits=fits, memory=mem, time=time, stage_of_role=stage_of,
                    chunks=cs, imbalance=imb,
                    layer_time_s={"dense": tot(dense + dense_comm), "moe": tot(moe + moe_comm)})


def _layer_overhead(hw: HardwareSpec, kind: str, dtype: str, full_rc) -> Phase:
    """Efficiency.layer_overhead_us of one block as a Phase: a third in forward, two thirds
    in backward (autograd replays about two host operations per forward one); full
    recompute repeats the forward share."""
    s = hw.efficiency.layer_overhead_us.get(f"{kind}_{dtype}", 0.0) * 1e-6
    z = np.zeros_like(full_rc)
    return Phase(z + s / 3, z + 2 * s / 3, z, full_rc * s / 3)


def _layer_costs(m: ModelSpec, hw: HardwareSpec, lay: LayoutBatch, routing: Routing, dtype: str) -> dict:
    """Per-micro-batch phases of one dense and one MoE layer, the embedding and LM head,
    the stage-boundary P2P, and per-layer activation bytes, for each layout of `lay`.
    Values are Phases or arrays (both support .take)."""
    eb = lay.act_bytes.astype(float)
    tp = lay.tp.astype(float)
    t = (lay.mbs * lay.seq).astype(float)
    d = m.hidden_size
    zero = np.zeros(len(lay))
    attn = attention_phase(m, hw, lay, dtype)
    tp_ar = _tp_allreduce(hw, lay, t * d * eb)  # one all-reduce (or RS+AG pair with SP)
    full_rc = (lay.recompute == 2).astype(float)
    dense = attn + (ffn_phase(m, hw, lay, dtype) if m.ffn_size else Phase(zero, zero, zero, zero))
    dense = dense + _layer_overhead(hw, "dense", dtype, full_rc)
    dense_comm = Phase(2 * tp_ar, 2 * tp_ar, zero, 2 * tp_ar * full_rc)
    co = hw.efficiency.collective_overhead_us * 1e-6  # fixed cost per collective call (0 unless measured)
    imb = np.ones(len(lay))
    a2a_fwd = a2a_bwd = zero  # all-to-all seconds of one MoE layer per micro-batch, forward / backward
    if m.moe is not None:
        p = expert_popularity(m.moe.num_experts, routing.distribution, routing.zipf_s, routing.histogram)
        mig = routing.migration
        imb = imbalance(p, lay.ep, t / tp * m.moe.top_k, mig.planner if mig else None, mig.max_moves if mig else None)
        moe = attn + moe_phase(m, hw, lay, dtype, imb) + _layer_overhead(hw, "moe", dtype, full_rc)
        a2a_one = _a2a(hw, lay, t / tp * m.moe.top_k * d * eb) * imb  # the busiest rank receives imb×
        call = co * (lay.ep > 1)
        stride = np.where(lay.placement == 0, 1, lay.edp)
        # one exchange with its per-call floor (HALO: two dependent rounds), comm.a2a_call
        a2a_ex = comm.a2a_call(hw, None, lay.ep, stride, lay.a2a == 1, wire=a2a_one)
        # dispatch + combine each way; forward first exchanges the per-expert row counts
        # (a few bytes: only the call's fixed cost counts)
        a2a_fwd = 2 * a2a_ex + call
        a2a_bwd = 2 * a2a_ex
        moe_comm = Phase(tp_ar + a2a_fwd, tp_ar + a2a_bwd, zero, (tp_ar + a2a_fwd) * full_rc)
    else:
        moe = Phase(zero, zero, zero, zero)
        moe_comm = Phase(zero, zero, zero, zero)
    a_attn = sum(act.attention_terms(m, lay).values())
    a_dense = a_attn + (sum(act.ffn_terms(m, lay).values()) if m.ffn_size else 0.0)
    a_moe = (a_attn + sum(act.moe_terms(m, lay, imb).values())) if m.moe else zero
    a_in = act.layer_input_bytes(m, lay)
    return dict(dense=dense, dense_comm=dense_comm, moe=moe, moe_comm=moe_comm, imb=imb, a2a_fwd=a2a_fwd,
                a2a_bwd=a2a_bwd,
                emb=embedding_phase(m, hw, lay), head=lm_head_phase(m, hw, lay, dtype),
                a_dense=np.where(lay.recompute == 2, a_in, a_dense), a_moe=np.where(lay.recompute == 2, a_in, a_moe))
