"""Many layouts as columns of numpy arrays, so the cost model runs once over all of them."""
from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass, replace
from typing import get_args

import numpy as np

from ..layout import SCHEDULES, RECOMPUTES, CpComm, Layout, WgradAccum

A2AS = ("flat", "halo", "dedup", "fused")
PLACEMENTS = ("packed", "spread")
CP_COMMS: tuple[str, ...] = get_args(CpComm)  # Layout.cp_comm, as LayoutBatch.cpc's index
WGRAD_ACCUMS: tuple[str, ...] = get_args(WgradAccum)  # Layout.wgrad_accum, as LayoutBatch.wacc's index
EXPERT_GEMMS = ("grouped", "multistream", "loop")
FP8S = ("none", "current", "mxfp8", "blockwise")
SPLITS = ("balanced", "even", "account")  # Layout.pipeline_split
# Layout.recompute_modules as a bitmask column (LayoutBatch.rc_mods)
RC_MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe_act", "moe", "shared_experts", "attn_block",
              "act_fc2", "op_sac")
# Layout.offload_modules as a bitmask column (LayoutBatch.off_mods)
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act")
# Layout.cuda_graphs as a bitmask column (LayoutBatch.graphs)
GRAPH_SCOPES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "full_iteration")
# Layout.fp8 -> cost model compute dtype
FP8_COMPUTE = {"current": "fp8", "mxfp8": "mxfp8", "blockwise": "fp8_blockwise"}
# local-expert GEMMs in flight at once per EXPERT_GEMMS entry (0: all, one grouped kernel);
# multistream: Transformer Engine's pool of compute streams (transformer_engine/common/util/
# multi_stream.cpp, num_compute_streams = 4)
EXPERT_GEMM_STREAMS = np.array([0, 4, 1])
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
DTYPES = tuple(DTYPE_BYTES)  # Layout.dtype, as LayoutBatch.dtype's index
_BYTES_OF = np.array([DTYPE_BYTES[d] for d in DTYPES])


def torch_stack(fsdp2, unfused, native, cmodel):
    """Whether layouts run on PyTorch's own autograd rather than Megatron-Core's modules, from their
    LayoutBatch columns of those names (bools or arrays): torch FSDP2, piper-train's eager modules, a
    PyTorch-native eager block or compiled model (torchtitan)."""
    return np.logical_or(np.logical_or(fsdp2, unfused), np.logical_or(native, cmodel))


def wgrad_accum_codes(value, torch) -> np.ndarray:
    """Layout.wgrad_accum as LayoutBatch.wacc's codes for layouts whose stack is PyTorch's own
    autograd where `torch` holds (a bool or an array: torch_stack): None is the stack's own, add
    there (AccumulateGrad), gemm under Megatron-Core (gradient_accumulation_fusion)."""
    if value is not None:
        return np.full(np.shape(torch), WGRAD_ACCUMS.index(value))
    return np.where(torch, WGRAD_ACCUMS.index("add"), WGRAD_ACCUMS.index("gemm"))


def rc_bits(modules) -> int:
    return sum(1 << RC_MODULES.index(x) for x in set(modules))


def off_bits(modules) -> int:
    return sum(1 << OFFLOAD_MODULES.index(x) for x in set(modules))


def offloads(lay: "LayoutBatch", module: str) -> np.ndarray:
    """Whether each layout sends `module`'s saved tensors to the host (Layout.offload_modules)."""
    return ((lay.off_mods >> OFFLOAD_MODULES.index(module)) & 1).astype(bool)


def per_expert_launch(lay: "LayoutBatch") -> np.ndarray:
    """Whether each layout launches its local experts' GEMMs one kernel per expert (Transformer
    Engine's multi-stream GroupedLinear, a Python loop) rather than as one grouped kernel."""
    return EXPERT_GEMM_STREAMS[lay.egemm] > 0


def graph_bits(scopes) -> int:
    return sum(1 << GRAPH_SCOPES.index(x) for x in set(scopes))


def graphed(lay: "LayoutBatch", scope: str) -> np.ndarray:
    """Whether each layout captures `scope` (Layout.cuda_graphs) as a CUDA graph."""
    return ((lay.graphs >> GRAPH_SCOPES.index(scope)) & 1).astype(bool)


def recomputes(lay: "LayoutBatch", module: str) -> np.ndarray:
    """Whether each layout's backward re-runs `module` (selective recompute with it listed)."""
    return (lay.recompute == 1) & ((lay.rc_mods >> RC_MODULES.index(module)) & 1).astype(bool)


@dataclass
class LayoutBatch:
    """Column arrays, one entry per candidate layout (int64 unless noted).

    sched: index into layout.SCHEDULES; recompute: index into RECOMPUTES (0 none, 1 selective,
    2 full); a2a: 0 flat, 1 halo, 2 dedup; placement: 0 packed, 1 spread; sp, eager, fa2, dropout: bool."""

    gpus: np.ndarray
    tp: np.ndarray
    cp: np.ndarray          # context parallel (Layout.cp)
    pp: np.ndarray
    dp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray         # expert tensor parallel (Layout.etp)
    vpp: np.ndarray
    mbs: np.ndarray
    gbs: np.ndarray
    seq: np.ndarray
    sched: np.ndarray
    recompute: np.ndarray
    rc_mods: np.ndarray     # Layout.recompute_modules as bits of RC_MODULES (read when recompute is selective)
    sp: np.ndarray
    zero: np.ndarray
    zrep: np.ndarray        # copies of each ZeRO shard (Layout.zero_replicas; 1: ZeRO over the whole group)
    reshard: np.ndarray     # bool: ZeRO-3 frees a unit's gathered parameters after forward (Layout.reshard_after_forward)
    fsdp2: np.ndarray       # bool: ZeRO-3 as torch FSDP2 runs it (Layout.fsdp2: its copies, no bf16 shard)
    gstep: np.ndarray       # bool: ZeRO-3 reduce-scatters once a step (Layout.grad_sync step)
    wacc: np.ndarray        # index into WGRAD_ACCUMS (Layout.wgrad_accum, its None resolved: wgrad_accum_codes)
    a2a: np.ndarray
    placement: np.ndarray
    cpc: np.ndarray         # index into CP_COMMS (Layout.cp_comm: how context parallelism moves keys)
    cpa: np.ndarray         # ranks of a2a+p2p's all-to-all groups (Layout.cp_a2a; 1 otherwise)
    eager: np.ndarray
    fa2: np.ndarray         # bool: FlashAttention-2 in place of the spec's fused kernel (Layout.attention_kernel fa2)
    unfused: np.ndarray     # bool: eager PyTorch modules instead of fused kernels (Layout.fused_kernels false)
    native: np.ndarray      # bool: a PyTorch-native stack's eager block in bf16 (Layout.native_eager)
    cmodel: np.ndarray      # bool: a PyTorch-native stack's blocks under torch.compile (Layout.compiled model)
    closs: np.ndarray       # bool: its cross-entropy under torch.compile (Layout.compiled loss)
    ce_eager: np.ndarray    # bool: an uncompiled loss as torch's F.cross_entropy on fp32 (Layout.cross_entropy eager)
    dropout: np.ndarray
    egemm: np.ndarray       # index into EXPERT_GEMMS (how the local experts' GEMMs launch)
    fp8: np.ndarray          # index into FP8S (Layout.fp8)
    fp8_par: np.ndarray      # bool: the GEMMs' weights kept in FP8 (Layout.fp8_params)
    probs_act: np.ndarray    # bool: routing probabilities applied in the experts' activation (Layout.expert_probs)
    a2a_overlap: np.ndarray  # bool: all-to-all hidden behind another micro-batch's compute (Layout.a2a_overlap)
    a2a_sms: np.ndarray      # compute units an overlapped all-to-all holds (Layout.a2a_sms; 0: the spec's)
    tp_overlap: np.ndarray   # bool: tensor-parallel collectives pipelined with the GEMMs (Layout.tp_comm_overlap)
    p2p_sg: np.ndarray       # bool: boundary messages scattered over tp, then gathered (Layout.p2p_scatter_gather)
    p2p_ovl: np.ndarray      # bool: an interleaved schedule's steady-state messages behind compute (Layout.p2p_overlap)
    tp_async: np.ndarray     # bool: backward tp all-reduces behind the weight-gradient GEMMs (Layout.tp_async_dgrad)
    attn_fp8: np.ndarray     # bool: fused attention in FP8 (Layout.attention_fp8)
    graphs: np.ndarray      # Layout.cuda_graphs as bits of GRAPH_SCOPES
    split: np.ndarray       # index into SPLITS (Layout.pipeline_split)
    overlap: np.ndarray     # bool: DP gradient reduction overlapped with backward
    dtype: np.ndarray       # index into DTYPES (Layout.dtype; fp16 and bf16 move the same bytes, not at the same peak)
    grad_bytes: np.ndarray  # bytes per gradient element
    opt_offload: np.ndarray    # float: share of the optimizer state on the host (Layout.optimizer_offload)
    rc_layers: np.ndarray      # layers of each chunk full recompute re-runs (Layout.recompute_layers; 0: all)
    offload_layers: np.ndarray  # a rank's layers whose activations go to the host (Layout.offload_layers)
    off_mods: np.ndarray    # Layout.offload_modules as bits of OFFLOAD_MODULES

    def __len__(self) -> int:
        return len(self.gpus)

    @property
    def act_bytes(self) -> np.ndarray:
        """Bytes per activation element (the dtype's)."""
        return _BYTES_OF[self.dtype]

    @property
    def m(self) -> np.ndarray:
        """Micro-batches per step."""
        return self.gbs // (self.dp * self.mbs)

    @property
    def cp_ring(self) -> np.ndarray:
        """Ranks a context-parallel ring passes K and V round (Layout.cp_comm): cp under p2p,
        cp/cp_a2a under a2a+p2p, 1 where no ring runs (all_gather, a2a, cp 1)."""
        ring, hier = CP_COMMS.index("p2p"), CP_COMMS.index("a2a+p2p")
        return np.where(self.cpc == ring, self.cp, np.where(self.cpc == hier, self.cp // self.cpa, 1))

    @property
    def cp_a2a_group(self) -> np.ndarray:
        """Ranks a context-parallel all-to-all exchanges heads over (Layout.cp_comm): cp under a2a,
        cp_a2a under a2a+p2p, 1 where none runs."""
        a2a, hier = CP_COMMS.index("a2a"), CP_COMMS.index("a2a+p2p")
        return np.where(self.cpc == a2a, self.cp, np.where(self.cpc == hier, self.cpa, 1))

    @property
    def edp(self) -> np.ndarray:
        return self.dp * self.cp * self.tp // (self.ep * self.etp)

    @property
    def dpcp(self) -> np.ndarray:
        """Ranks a dense gradient is reduced over (Layout.dpcp): dp·cp."""
        return self.dp * self.cp

    def zero_shard(self, group) -> np.ndarray:
        """Ranks a ZeRO shard spans in a data-parallel `group` of that many ranks (dp·cp or edp):
        the group over its Layout.zero_replicas copies, at least 1 (edp is 0 without experts)."""
        return np.maximum(np.asarray(group, dtype=float) / self.zrep, 1.0)

    @property
    def ep_overlap(self) -> np.ndarray:
        """a2a_overlap where there is an expert-parallel all-to-all to overlap (ep > 1): without
        one, Megatron-Core's EP overlap pairs nothing and adds no warm-up forward."""
        return self.a2a_overlap & (self.ep > 1)

    @property
    def tokens(self) -> np.ndarray:
        """Tokens of one micro-batch on a rank before tensor parallelism's split: mbs·seq/cp."""
        return (self.mbs * self.seq).astype(float) / self.cp

    @property
    def ep_stride(self) -> np.ndarray:
        """Ranks between an EP group's members (layout.rank_coords): etp packed, edp·etp spread."""
        return np.where(self.placement == 0, self.etp, self.edp * self.etp)

    @property
    def edp_stride(self) -> np.ndarray:
        """Ranks between an expert-data-parallel group's members: ep·etp packed, etp spread."""
        return np.where(self.placement == 0, self.ep * self.etp, self.etp)

    def take(self, idx) -> "LayoutBatch":
        """The layouts at row indices (or a boolean mask) `idx`."""
        idx = np.asarray(idx)
        if idx.dtype == bool:
            idx = np.flatnonzero(idx)
        # ndarray.take: a third cheaper than fancy indexing, on every column of every candidate
        return LayoutBatch(**{k: getattr(self, k).take(idx) for k in _COLUMNS})

    def layout(self, i: int) -> Layout:
        """The i-th candidate as a Layout."""
        g = lambda k: int(getattr(self, k)[i])  # noqa: E731
        return Layout(gpus=g("gpus"), tp=g("tp"), cp=g("cp"), pp=g("pp"), dp=g("dp"), ep=g("ep"), etp=g("etp"),
                      vpp=g("vpp"), mbs=g("mbs"), global_batch=g("gbs"), seq=g("seq"), schedule=SCHEDULES[g("sched")],
                      recompute=RECOMPUTES[g("recompute")],
                      recompute_modules=tuple(x for i, x in enumerate(RC_MODULES) if g("rc_mods") >> i & 1),
                      sequence_parallel=bool(self.sp[i]), zero=g("zero"), zero_replicas=g("zrep"),
                      reshard_after_forward=bool(self.reshard[i]), fsdp2=bool(self.fsdp2[i]),
                      grad_sync="step" if self.gstep[i] else "microbatch", wgrad_accum=self._wgrad_accum(i),
                      a2a=A2AS[g("a2a")], placement=PLACEMENTS[g("placement")], dtype=DTYPES[g("dtype")],
                      cp_comm=CP_COMMS[g("cpc")], cp_a2a=g("cpa"),
                      attention_kernel="eager" if self.eager[i] else "fa2" if self.fa2[i] else "flash",
                      dropout=bool(self.dropout[i]),
                      fused_kernels=not bool(self.unfused[i]), native_eager=bool(self.native[i]),
                      compiled=(("model",) if self.cmodel[i] else ()) + (("loss",) if self.closs[i] else ()),
                      cross_entropy="eager" if self.ce_eager[i] else "fused",
                      expert_gemm=EXPERT_GEMMS[g("egemm")],
                      a2a_overlap=bool(self.a2a_overlap[i]), a2a_sms=g("a2a_sms") or None, fp8=FP8S[g("fp8")],
                      fp8_params=bool(self.fp8_par[i]),
                      tp_comm_overlap=bool(self.tp_overlap[i]), attention_fp8=bool(self.attn_fp8[i]),
                      p2p_scatter_gather=bool(self.p2p_sg[i]), tp_async_dgrad=bool(self.tp_async[i]),
                      p2p_overlap=bool(self.p2p_ovl[i]),
                      expert_probs="activation" if self.probs_act[i] else "combine",
                      cuda_graphs=tuple(x for i, x in enumerate(GRAPH_SCOPES) if g("graphs") >> i & 1),
                      pipeline_split=SPLITS[g("split")],
                      grad_dtype="fp32" if g("grad_bytes") == 4 else "bf16", overlap_grad_reduce=bool(self.overlap[i]),
                      optimizer_offload=float(self.opt_offload[i]), offload_layers=g("offload_layers"),
                      offload_modules=tuple(x for i, x in enumerate(OFFLOAD_MODULES) if g("off_mods") >> i & 1),
                      recompute_layers=g("rc_layers"))

    def _wgrad_accum(self, i: int):
        """The i-th candidate's Layout.wgrad_accum: None where it is the layout's stack's own
        (wgrad_accum_codes), as a Layout built without one reads it, so an estimate's plan of a
        layout a search found prices as the search did."""
        own = int(wgrad_accum_codes(None, torch_stack(self.fsdp2[i], self.unfused[i], self.native[i], self.cmodel[i])))
        return None if self.wacc[i] == own else WGRAD_ACCUMS[int(self.wacc[i])]


_COLUMNS = tuple(f.name for f in fields(LayoutBatch))


def from_layouts(layouts: list[Layout]) -> LayoutBatch:
    col = lambda f: np.array([f(x) for x in layouts])  # noqa: E731
    return LayoutBatch(
        gpus=col(lambda x: x.gpus), tp=col(lambda x: x.tp), cp=col(lambda x: x.cp), pp=col(lambda x: x.pp),
        dp=col(lambda x: x.dp), ep=col(lambda x: x.ep), etp=col(lambda x: x.etp), vpp=col(lambda x: x.vpp),
        mbs=col(lambda x: x.mbs),
        gbs=col(lambda x: x.global_batch), seq=col(lambda x: x.seq),
        sched=col(lambda x: SCHEDULES.index(x.schedule)), recompute=col(lambda x: RECOMPUTES.index(x.recompute)),
        rc_mods=col(lambda x: rc_bits(x.recompute_modules)),
        sp=col(lambda x: x.sp), zero=col(lambda x: x.zero), zrep=col(lambda x: x.zero_replicas),
        reshard=col(lambda x: x.reshard_after_forward), fsdp2=col(lambda x: x.fsdp2),
        gstep=col(lambda x: x.grad_sync == "step"),
        wacc=col(lambda x: int(wgrad_accum_codes(x.wgrad_accum, torch_stack(x.fsdp2, not x.fused_kernels,
                                                                             x.native_eager, "model" in x.compiled)))),
        a2a=col(lambda x: A2AS.index(x.a2a)),
        placement=col(lambda x: PLACEMENTS.index(x.placement)), cpc=col(lambda x: CP_COMMS.index(x.cp_comm)),
        cpa=col(lambda x: x.cp_a2a),
        eager=col(lambda x: x.attention_kernel == "eager"),
        fa2=col(lambda x: x.attention_kernel == "fa2"),
        unfused=col(lambda x: not x.fused_kernels), native=col(lambda x: x.native_eager),
        cmodel=col(lambda x: "model" in x.compiled), closs=col(lambda x: "loss" in x.compiled),
        ce_eager=col(lambda x: x.cross_entropy == "eager"),
        dropout=col(lambda x: x.dropout), egemm=col(lambda x: EXPERT_GEMMS.index(x.expert_gemm)),
        a2a_overlap=col(lambda x: x.a2a_overlap), a2a_sms=col(lambda x: x.a2a_sms or 0),
        tp_overlap=col(lambda x: x.tp_comm_overlap), attn_fp8=col(lambda x: x.attention_fp8),
        p2p_sg=col(lambda x: x.p2p_scatter_gather), tp_async=col(lambda x: x.tp_async_dgrad),
        p2p_ovl=col(lambda x: x.p2p_overlap),
        fp8=col(lambda x: FP8S.index(x.fp8)), fp8_par=col(lambda x: x.fp8_params),
        probs_act=col(lambda x: x.expert_probs == "activation"),
        graphs=col(lambda x: graph_bits(x.cuda_graphs)), split=col(lambda x: SPLITS.index(x.pipeline_split)),
        overlap=col(lambda x: x.overlap_grad_reduce), dtype=col(lambda x: DTYPES.index(x.dtype)),
        grad_bytes=col(lambda x: 4 if x.grad_dtype == "fp32" else 2),
        opt_offload=col(lambda x: float(x.optimizer_offload)), offload_layers=col(lambda x: x.offload_layers),
        off_mods=col(lambda x: off_bits(x.offload_modules)),
        rc_layers=col(lambda x: x.recompute_layers),
    )


def replace_cols(lay: LayoutBatch, **scalars) -> LayoutBatch:
    """`lay` with the named columns set to one value each."""
    return replace(lay, **{k: np.full(len(lay), v, dtype=getattr(lay, k).dtype) for k, v in scalars.items()})


def concat(parts: list[LayoutBatch]) -> LayoutBatch:
    """The layouts of `parts`, one after another."""
    return LayoutBatch(**{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(LayoutBatch)})


# a lookup table of this many entries is cheaper than sorting the column(s) it replaces
_TABLE_MAX = 1 << 20


def _codes(c: np.ndarray, span: int):
    """A non-negative integer column of values below `span` as codes 0..k-1 in value order:
    (codes, k). Through a table of `span` entries (O(n + span), no sort) when that is small."""
    if span > _TABLE_MAX:
        vals, inv = np.unique(c, return_inverse=True)
        return inv, len(vals)
    seen = np.zeros(span, bool)
    seen[c] = True
    vals = np.flatnonzero(seen)
    code = np.empty(span, np.intp)  # only the entries at `vals` are ever read
    code[vals] = np.arange(len(vals))
    return code[c], len(vals)


def distinct_rows(*cols):
    """Distinct rows of the given integer (or bool) columns: (their codes, the index of one
    row with each, inverse), like np.unique(axis=0) with return_index and return_inverse.
    The columns are folded into one integer code through lookup tables rather than sorts:
    the search calls this on every candidate, and np.unique's sort cost more there than the
    arithmetic it saves. A constant column adds nothing to the code."""
    n = len(np.asarray(cols[0]))
    if n == 0:
        e = np.zeros(0, np.intp)
        return e, e, e
    key, K = np.zeros(n, np.intp), 1
    for c in cols:
        c = np.asarray(c)
        lo, hi = int(c.min()), int(c.max())
        if lo == hi:
            continue
        c = np.subtract(c, lo, dtype=np.intp)
        span = hi - lo + 1
        if span > 64:  # few distinct values over a wide range (dp, EP strides): compact them
            c, span = _codes(c, span)
        if K * span > _TABLE_MAX:  # keep the folded code small enough for a table
            key, K = _codes(key, K)
        key = key * span + c
        K *= span
    inv, k = _codes(key, K)
    return np.arange(k), first_rows(inv, k), inv


def distinct_keys(key: np.ndarray) -> tuple:
    """(one, back) of the rows of `key` ([n, k], any dtype), each compared as its bytes: a row of
    each distinct one and each row's index among them, as np.unique's return_index and
    return_inverse. For keys of many or float columns, which distinct_rows' lookup tables do
    not fold (the walks' per-stage figures: schedule.interleaved_step, v_orders.v_step)."""
    key = np.ascontiguousarray(key)
    _, one, back = np.unique(key.view(np.dtype((np.void, key.shape[1] * key.itemsize))).ravel(), return_index=True,
                             return_inverse=True)
    return one, back.reshape(-1)


def row_groups(*cols) -> list:
    """The rows that share the columns' values (distinct_rows' rows), a group at a time: (a row
    of the group, its rows in order). The walks price each group's columns with one graph."""
    _, heads, which = distinct_rows(*cols)
    order = np.argsort(which, kind="stable")
    bounds = np.searchsorted(which[order], np.arange(len(heads) + 1))
    return [(f, order[bounds[h]:bounds[h + 1]]) for h, f in enumerate(heads)]


def first_rows(inv: np.ndarray, k: int) -> np.ndarray:
    """The first row with each code 0..k-1 of `inv` (every code present)."""
    first = np.empty(k, np.intp)
    first[inv[::-1]] = np.arange(len(inv) - 1, -1, -1)  # the last write, the first row, wins
    return first


def take_rows(x, idx):
    """`x` at layouts `idx`: arrays over layouts (on their last axis), in dicts, tuples and dataclasses."""
    if isinstance(x, np.ndarray) and x.ndim:
        return x.take(idx, axis=-1)
    if isinstance(x, dict):
        return {k: take_rows(v, idx) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(take_rows(v, idx) for v in x)
    if is_dataclass(x):
        return replace(x, **{f.name: take_rows(getattr(x, f.name), idx) for f in fields(x)})
    return x
