"""Enumerate every layout for N GPUs, evaluate them, rank, explain rejections.

Candidates are built as numpy columns (a cartesian product filtered by the layout rules),
then `cost.estimate.evaluate` prices them in vectorised calls (all at once, or, where the caller
keeps only the best, built slice by slice and priced in chunks) — no Python loop per candidate.
Rejections are counted by the rule that removed them."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Iterable, Iterator, Optional

import numpy as np

from .cost import comm
from .cost.batch import (DTYPE_BYTES, EXPERT_GEMMS, FP8S, SPLITS, WGRAD_ACCUMS, LayoutBatch, concat, graph_bits,
                         off_bits, rc_bits, replace_cols, torch_stack, wgrad_accum_codes)
from .cost.estimate import Estimate, Routing, evaluate
from .cost.memory import GIB, state_lower_bound_gib
from .cost.offload import check_host
from .cost.rank_memory import logits_bytes
from .errors import LayoutError
from .layout import (absent_module_refusal, check_a2a_sms, check_cuda_graphs, check_fp8_params, check_fsdp2,
                     check_grad_sync, check_stack, fp8_hw_refusal, fused_a2a_refusal, fused_hw_refusal, layer_slots,
                     native_eager_refusal, op_sac_refusal, op_sac_stack_refusal, recompute_layers_limit,
                     split_refused, wgrad_accum_refusal)
from .layout_offload import check_offload_modules, offload_limit
from .runtimes import WEIGHT_SPLIT
from .specs.hardware import HardwareSpec
from .specs.model import ModelSpec

DEFAULT_BATCH_TOKENS = 4 * 2**20  # a 4M-token global batch when the user gives none


def default_global_batch(seq: int) -> int:
    """Sequences in a DEFAULT_BATCH_TOKENS global batch."""
    return max(1, DEFAULT_BATCH_TOKENS // seq)


def mbs_choices(global_batch: int) -> tuple[int, ...]:
    """Micro-batch sizes (sequences) the search tries by default: every divisor of the global
    batch, since only those split it whole over some dp (a batch of 48 on 8 ranks splits as 6;
    short sequences on a small model run fastest at 64 or more); the memory model refuses those
    whose activations do not fit."""
    return tuple(_divisors(global_batch))


def round_batch(global_batch: int, gpus: int) -> int:
    """The global batch rounded down to a multiple of `gpus` (at least `gpus` sequences)."""
    return max(global_batch, gpus) // gpus * gpus
VPP_INTERLEAVED = (2, 3, 4, 5, 6, 8)  # Megatron-Bridge recipes run 3, 5, 6 and 8 too
OBJECTIVES = ("throughput", "mfu", "memory")
STATE_BOUND = "parameter + optimizer state alone exceed device memory (bound)"
LOGITS_BOUND = "a micro-batch's LM-head logits alone exceed device memory (bound)"


ALL_ZEROS = (0, 1, 2, 3)  # the ZeRO stages a search tries unless asked for fewer


@dataclass
class SearchSpace:
    gpus: int
    global_batch: int
    seq: int
    dtype: str = "bf16"
    schedules: tuple[str, ...] = ("gpipe", "1f1b", "interleaved", "zbv", "dualpipev")
    recomputes: tuple[str, ...] = ("none", "selective", "full")
    # the module sets "selective" tries (Layout.recompute_modules), each a choice of its own
    selective: tuple[tuple[str, ...], ...] = (("core_attn",),)
    zeros: tuple[int, ...] = ALL_ZEROS
    # also try each ZeRO stage >= 1 sharded inside the scale-up domain and replicated across it
    # (Layout.zero_replicas, hsdp_replicas)
    hsdp: bool = False
    a2as: tuple[str, ...] = ("flat", "halo")
    placements: tuple[str, ...] = ("packed", "spread")
    # micro-batch sizes tried; None: every divisor of the global batch (mbs_choices)
    mbs: tuple[int, ...] | None = None
    tps: tuple[int, ...] | None = None
    pps: tuple[int, ...] | None = None
    eps: tuple[int, ...] | None = None
    etps: tuple[int, ...] = (1,)  # expert-tensor-parallel degrees tried (Layout.etp); 1: whole experts
    cps: tuple[int, ...] = (1,)   # context-parallel degrees tried (Layout.cp); 1: whole sequences
    # how context parallelism moves keys, each a choice where cp > 1 (Layout.cp_comm; cp 1 runs p2p alone);
    # a2a+p2p once for each all-to-all group size between 1 and cp that divides it (Layout.cp_a2a)
    cp_comms: tuple[str, ...] = ("p2p", "all_gather", "a2a", "a2a+p2p")
    ep_in_domain: str | None = None  # name of a topology level the EP group must stay inside
    paper_mesh: bool = False  # Piper's PP × EP mesh: tp = 1 and ep = dp (expert-data parallel)
    attention_kernel: str = "flash"
    fused_kernels: bool = True
    native_eager: bool = False     # Layout.native_eager: a PyTorch-native stack's eager block (torchtitan's)
    fsdp2: bool = False            # Layout.fsdp2: ZeRO-3 layouts run as torch FSDP2 (copies, state)
    grad_sync: str = "microbatch"  # Layout.grad_sync: when ZeRO-3 layouts reduce-scatter (step: once)
    wgrad_accum: str | None = None  # Layout.wgrad_accum (None: each layout's stack's own, batch.wgrad_accum_codes)
    compiled: tuple[str, ...] = ()  # Layout.compiled: what a PyTorch-native stack runs under torch.compile
    cross_entropy: str = "fused"    # Layout.cross_entropy: how an uncompiled loss runs
    expert_gemm: str = "grouped"  # Layout.expert_gemm: how the runtime launches the local experts' GEMMs
    a2a_overlap: bool = False     # Layout.a2a_overlap (a runtime feature: Megatron-Core's EP overlap)
    a2a_sms: int | None = None    # Layout.a2a_sms (None: the hardware spec's overlap_comm_units)
    tp_comm_overlap: bool = False  # Layout.tp_comm_overlap (a runtime feature: TE's userbuffers)
    p2p_overlap: bool = True       # Layout.p2p_overlap: the interleaved schedule's messages behind compute
    attention_fp8: bool = False    # Layout.attention_fp8 (TE's fp8_dot_product_attention)
    fp8: str = "none"             # Layout.fp8: FP8 GEMMs (Transformer Engine recipes)
    fp8_params: bool = False      # Layout.fp8_params: the GEMMs' weights kept in FP8
    expert_probs: str = "combine"  # Layout.expert_probs: where the routing probability scales a token
    cuda_graphs: tuple[str, ...] = ()  # Layout.cuda_graphs: what the runtime replays as CUDA graphs
    pipeline_split: str = "balanced"  # Layout.pipeline_split: how the runtime splits layers into chunks
    overlap_grad_reduce: bool = True  # Layout.overlap_grad_reduce
    grad_dtype: str = "fp32"          # Layout.grad_dtype: the element type gradients are reduced in
    # layers of each chunk full recompute re-runs, each a choice (Layout.recompute_layers; 0: all)
    recompute_layers: tuple[int, ...] = (0,)
    # host offloading, each value a choice (Layout.optimizer_offload: share of the optimizer state on the
    # host; Layout.offload_layers: a rank's layers whose activations wait there)
    optimizer_offload: tuple[float, ...] = (0.0,)
    offload_layers: tuple[int, ...] = (0,)
    # Layout.offload_modules: sets of modules whose saved tensors wait on the host, each set a choice
    offload_modules: tuple[tuple[str, ...], ...] = ((),)
    runtime: str = "any"  # "piper-train": only what it runs (for_runtime); adds its ZeRO-2 schedule rule

    def __post_init__(self):
        # the rules check_layout applies to one layout
        check_stack(self.expert_probs, self.fused_kernels, self.native_eager, self.dtype,
                    bool(self.cuda_graphs or any(self.offload_modules)), self.compiled)
        for mods in self.selective if "selective" in self.recomputes else ():
            why = op_sac_stack_refusal(mods, self.attention_kernel, self.fused_kernels, max(self.cps))
            if why:
                raise LayoutError(*why)
        check_fsdp2(self.fsdp2, self.zeros)
        check_grad_sync(self.grad_sync, self.zeros)
        if self.wgrad_accum not in (None, *WGRAD_ACCUMS):
            raise LayoutError(f"wgrad_accum one of {', '.join(WGRAD_ACCUMS)}", f"got {self.wgrad_accum!r}")
        # the settings one space holds for all its layouts (its dualpipev layouts and etp > 1: rules)
        why = fused_a2a_refusal("fused" if "fused" in self.a2as else "flat", self.a2a_overlap, 1, fp8=self.fp8,
                                expert_gemm=self.expert_gemm)
        if why:
            raise LayoutError(*why)
        if self.cross_entropy not in ("fused", "eager"):
            raise LayoutError("cross_entropy fused or eager", f"got {self.cross_entropy!r}")
        check_fp8_params(self.fp8_params, self.fp8, self.attention_fp8)
        for mods in self.offload_modules:
            check_offload_modules(mods, self.cuda_graphs, self.fused_kernels)
        check_cuda_graphs(self.cuda_graphs)


RUNTIMES = ("any", "piper-train")
LONG_SEQ = 8192  # tokens from which the CLI's --cp auto tries context parallelism


def auto_cps(seq: int) -> tuple[int, ...]:
    """Context-parallel degrees worth trying for `seq`-token sequences: 1 alone below LONG_SEQ
    (the published runs split sequences from 8K on: Megatron-Bridge's Llama 3.1 405B at CP 2,
    validation/context-parallel.csv), else 1, 2, 4 and 8 (the search drops those that do not
    split seq into 2·cp chunks)."""
    return (1,) if seq < LONG_SEQ else (1, 2, 4, 8)


def for_runtime(sp: SearchSpace, runtime: str, model: Optional[ModelSpec] = None) -> SearchSpace:
    """`sp` cut to what `runtime` executes and priced as it executes it. "piper-train" (the
    bundled runtime; what it runs is the table runtimes.PIPER_TRAIN, which its launch check reads
    too): eager modules (fused_kernels False), gradients reduced after the pipeline (no overlap),
    the ZeRO stages it implements (ZeRO-2 not with zbv / dualpipev, a search rule), and none of
    the other stacks' features. A value the caller asked for that it cannot run raises
    PiperError naming the option, unless no layout of the space would run it (Support.searched_when:
    --no-p2p-overlap without the interleaved schedule); the ZeRO stages, where the space enumerates
    all of them by itself (ALL_ZEROS), are cut instead; so does a `model` it cannot train
    (runtimes.model_refusal). "any" returns `sp` unchanged."""
    from dataclasses import replace

    from .errors import PiperError
    from .runtimes import PIPER_TRAIN, model_refusal, runs, shown

    if runtime == "any":
        return sp
    if runtime != "piper-train":
        raise PiperError(f"--runtime: {runtime!r}: expected one of {', '.join(RUNTIMES)}")
    refusal = model_refusal(model)[1] if model is not None else ""
    if refusal:
        raise PiperError(f"--runtime piper-train: {refusal}")
    # fields the space tries sets of
    several = {"zero": "zeros", "a2a": "a2as", "recompute_modules": "selective", "etp": "etps", "cp": "cps",
               "recompute_layers": "recompute_layers", "optimizer_offload": "optimizer_offload",
               "offload_layers": "offload_layers", "offload_modules": "offload_modules"}
    cut = {}
    for s in PIPER_TRAIN:
        attr = several.get(s.field, s.field)
        if not hasattr(sp, attr) or (s.searched_when is not None and not s.searched_when(sp)):
            continue
        plural = attr in several.values()
        asked = getattr(sp, attr) if plural else (getattr(sp, attr),)
        bad = [v for v in asked if not runs(s, v)]
        if bad and not (attr == "zeros" and asked == ALL_ZEROS):
            asked_for = s.option if bad[0] is True else f"{s.option} {shown(bad[0])}"  # a switch: its flag alone
            raise PiperError(f"--runtime piper-train: it cannot run {asked_for} ({s.does})")
        if plural:
            cut[attr] = tuple(v for v in asked if runs(s, v))
    return replace(sp, fused_kernels=False, overlap_grad_reduce=False, runtime=runtime, **cut)


@dataclass
class SearchResult:
    """With search's `keep`, batch and est hold only the layouts kept (_price_kept, in enumeration
    order) and order the kept fitting ones: the best `keep`, then the leanest fitting where it ranks lower."""
    batch: LayoutBatch
    est: Estimate
    order: np.ndarray           # indices of fitting candidates, best first
    rejected: dict[str, int] = field(default_factory=dict)
    evaluated: int = 0
    cpu_s: float = 0.0  # CPU seconds spent enumerating and evaluating (robust to a loaded machine)
    n_fit: int | None = None  # fitting layouts, where order lists only some (search's keep)
    priced: int = 0  # layouts priced: `evaluated` less those the state-memory bound discarded unpriced

    @property
    def best(self) -> int | None:
        return int(self.order[0]) if len(self.order) else None

    @property
    def fitting(self) -> int:
        return len(self.order) if self.n_fit is None else self.n_fit


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def enumerate_layouts(m: ModelSpec, hw: HardwareSpec, sp: SearchSpace,
                      headroom_gib: float | None = None) -> tuple[LayoutBatch, dict[str, int]]:
    """All candidate layouts as columns, and how many were dropped by each rule. With
    `headroom_gib`, also drop those whose parameter and optimizer state alone (a lower
    bound on the worst stage) overflow device memory less that headroom (rule STATE_BOUND)."""
    rejected: dict[str, int] = {}
    parts = list(enumerate_slices(m, hw, sp, rejected, headroom_gib))  # one slice: every tuple at once
    return (parts[0][0] if parts else None), _counted(rejected)


# grid cells (tuple x schedule x micro-batch x recompute x ZeRO x a2a x placement x offload choice) one slice
# of a kept search crosses: a slice's layouts and rule masks stay near 100 MB (the 19.8M layouts of a wide
# DeepSeek-V3 space on GB200 built at once took 5.2 GB)
ENUM_CELLS = 1 << 18


def enumerate_slices(m: ModelSpec, hw: HardwareSpec, sp: SearchSpace, rejected: dict[str, int],
                     headroom_gib: float | None = None, cells: int | None = None) -> Iterator[tuple]:
    """enumerate_layouts' layouts a slice at a time: (layouts, their enumeration keys) for each run of the
    (tp, cp, pp, dp, ep, etp, cp_comm, cp_a2a) tuples, in order, that crosses at most `cells` grid cells (one
    tuple at least; None: every tuple in one run). A key sorts as its layout's place in enumerate_layouts' batch. `rejected`
    gains each rule's count as the slices are built, zeros too, so that it lists the rules in the order they
    apply whichever slice a rule first removes layouts from (_counted drops the zeros). Nothing is yielded
    where no tuple is left."""
    g = _grid(m, hw, sp, headroom_gib, rejected)
    if g is None:
        return
    step = len(g.tri) if cells is None else max(1, cells // g.cells)
    base = 0  # layouts of the slices before, each offload choice counted once (_with_offload's keys)
    for s in range(0, len(g.tri), step):
        batch = _slice(m, hw, sp, g, g.tri[s:s + step], headroom_gib, rejected)
        yield _with_offload(m, sp, batch, rejected, base)
        base += len(batch)


def _counted(rejected: dict[str, int]) -> dict[str, int]:
    """`rejected` less the rules that removed nothing."""
    return {k: v for k, v in rejected.items() if v}


@dataclass
class _Grid:
    """The choices enumerate_slices crosses each (tp, cp, pp, dp, ep, etp, cp_comm, cp_a2a) tuple with, once the rules
    that read the whole space have run."""
    tri: np.ndarray      # [tuple, (tp, cp, pp, dp, ep, etp, CP_COMMS index, cp_a2a)]
    sched: np.ndarray    # [variant, (SCHEDULES index, vpp)]
    rc: np.ndarray       # recompute choices: RECOMPUTES index, module bits, layers a chunk re-runs
    rc_mod: np.ndarray
    rc_n: np.ndarray
    zs: np.ndarray       # ZeRO stages, the hybrid-sharded ones (zh) after the whole-group ones
    zh: np.ndarray
    a2: np.ndarray
    pl: np.ndarray
    mb: np.ndarray       # micro-batch sizes the logits bound leaves
    per_seq: float       # bytes of a sequence's fp32 logits and their gradient
    avail: float         # device bytes less the headroom
    n_off: int           # host-offloading choices (_offload_combos)

    @property
    def cells(self) -> int:
        """Grid cells one tuple makes."""
        return len(self.sched) * len(self.mb) * len(self.rc) * len(self.zs) * len(self.a2) * len(self.pl) * self.n_off


def _grid(m: ModelSpec, hw: HardwareSpec, sp: SearchSpace, headroom_gib: float | None,
          rejected: dict[str, int]) -> _Grid | None:
    """The space's tuples and choices, less what the rules on tp alone and the logits bound remove from every
    layout (counted in `rejected`); None where no layout is left."""
    from .cost.batch import A2AS, CP_COMMS, PLACEMENTS
    from .layout import RECOMPUTES, SCHEDULES, cp_comm_refusal, tp_splits_heads

    N = sp.gpus
    E = m.moe.num_experts if m.moe else 1
    # tp inside the scale-up domain a job fills (a node; 64 GPUs of an NVL72 rack), not the tray of 4:
    # a divisor of it, so no tp group straddles two domains. The other degrees are enumerated and
    # refused, counted, before the grid is built, as are those that do not split the heads
    domain = N if sp.tps else min(N, hw.job_blocks[hw.scaleup_level])
    tps = [t for t in (sp.tps or _divisors(N)) if N % t == 0]
    # (tp, cp, pp, dp, ep, etp, cp_comm, cp_a2a) tuples
    tri = []
    eps = sp.eps or _divisors(E)
    etps = sp.etps if m.moe is not None else (1,)
    width = m.moe.expert_ffn_size if m.moe is not None else 1
    # context parallelism splits each sequence into 2·cp causal chunks over fused attention
    cps = [c for c in sp.cps if c == 1 or (sp.seq % (2 * c) == 0 and sp.attention_kernel != "eager")]
    cpcs = [CP_COMMS.index(c) for c in sp.cp_comms]
    hier = CP_COMMS.index("a2a+p2p")
    for tp in tps:
        for cp in cps:
            if N % (tp * cp):
                continue
            for pp in (sp.pps or _divisors(N // (tp * cp))):
                if (N // (tp * cp)) % pp or pp > m.num_layers:
                    continue
                dp = N // (tp * cp * pp)
                for ep in eps:
                    for etp in etps:
                        if E % ep or (dp * cp * tp) % (ep * etp) or width % etp or (m.moe is None and ep > 1):
                            continue
                        for cpc in (cpcs if cp > 1 else (0,)):
                            # a cp with no group size between 1 and itself keeps one, refused and counted below
                            for a in ((_divisors(cp)[1:-1] or [cp]) if cpc == hier else (1,)):
                                tri.append((tp, cp, pp, dp, ep, etp, cpc, a))
    if not tri:
        rejected["no (tp, cp, pp, ep, etp) satisfies tp*cp*pp*dp == gpus, ep | experts, ep*etp | dp*cp*tp, "
                 "etp | expert width, 2*cp | seq, pp <= layers"] = 1
        return None
    tri = np.array(tri)
    # schedule variants: (sched index, vpp)
    sched = []
    for s in sp.schedules:
        i = SCHEDULES.index(s)
        if s in ("gpipe", "1f1b"):
            sched.append((i, 1))
        elif s == "interleaved":
            sched += [(i, v) for v in VPP_INTERLEAVED]
        else:
            sched.append((i, 2))
    sched = np.array(sched)
    # recompute choices: (RECOMPUTES index, module bits, layers a chunk re-runs); selective once per
    # module set, full once per recompute_layers count (0: every layer)
    choices = [(RECOMPUTES.index(r), rc_bits(mods), n) for r in sp.recomputes
               for mods in (sp.selective if r == "selective" else (("core_attn",),))
               for n in (sp.recompute_layers if r == "full" else (0,))]
    rc, rc_mod, rc_n = (np.array(x) for x in zip(*choices))
    # the ZeRO axis: each stage over the whole group, then with sp.hsdp the stages >= 1 hybrid-sharded
    z_hsdp = [z for z in sp.zeros if z >= 1] if sp.hsdp else []
    zs = np.array([*sp.zeros, *z_hsdp])
    zh = np.arange(len(zs)) >= len(sp.zeros)
    a2 = np.array([A2AS.index(a) for a in sp.a2as]) if m.moe else np.array([0])
    pl = np.array([PLACEMENTS.index(p) for p in sp.placements]) if m.moe else np.array([0])
    mb = np.array(sp.mbs or mbs_choices(sp.global_batch))
    # rules on the degrees alone and a memory bound on the micro-batch, before the grid is built
    # (each counted as the layouts it would have made): its tp rules are on tp alone, and the rank
    # with the LM head keeps at least one micro-batch's logits (fp32; a compiled loss's in their dtype)
    # and their gradient (rank_memory._logits), so a micro-batch whose logits alone overflow the device fits on no
    # layout; sizes over it for every (tp, cp) left are not crossed at all
    per_tri = len(sched) * len(rc) * len(zs) * len(a2) * len(pl) * len(_offload_combos(sp))  # layouts a tuple makes
    for name, bad in ((f"tp not a divisor of the scale-up domain ({domain} GPUs): a tp group's collectives on "
                       "every layer would cross the NICs", lambda t: t > domain or domain % t != 0),
                      ("tp does not divide the query heads, or neither divides nor is a multiple of the kv heads",
                       lambda t: not tp_splits_heads(m.num_heads, m.kv_heads, t))):
        drop = np.array([bad(int(t)) for t in tri[:, 0]])
        if drop.any():
            rejected[name] = int(drop.sum()) * len(mb) * per_tri
            tri = tri[~drop]
    # what Transformer Engine's context parallelism refuses to run (layout.cp_comm_refusal), each rule counted
    refusal = {key: cp_comm_refusal(m, key[0], key[1], CP_COMMS[key[2]], sp.attention_fp8, key[3])
               for key in set(map(tuple, tri[:, [0, 1, 6, 7]].tolist()))}
    why = [refusal[key] for key in map(tuple, tri[:, [0, 1, 6, 7]].tolist())]
    for name in dict.fromkeys(w[0] for w in why if w):
        drop = np.array([w is not None and w[0] == name for w in why])
        rejected[name] = int(drop.sum()) * len(mb) * per_tri
    tri = tri[np.array([w is None for w in why], bool)] if any(why) else tri
    if not len(tri):
        return None
    avail = (hw.accelerator.memory_gib - (headroom_gib or 0.0)) * GIB
    kept, back = logits_bytes(DTYPE_BYTES[sp.dtype], "loss" in sp.compiled, sp.cross_entropy == "eager")
    per_seq = sp.seq * m.vocab_size * (1 + m.mtp_layers) * float(kept + back)
    widest = int((tri[:, 0] * tri[:, 1]).max())  # the most a sequence's logits are split
    over_all = mb * per_seq / widest > avail
    n_over = int(np.count_nonzero(over_all)) * len(tri) * per_tri
    mb = mb[~over_all]
    if n_over:
        rejected[LOGITS_BOUND] = n_over
    if not len(mb):
        return None
    return _Grid(tri, sched, rc, rc_mod, rc_n, zs, zh, a2, pl, mb, per_seq, avail, len(_offload_combos(sp)))


def _slice(m: ModelSpec, hw: HardwareSpec, sp: SearchSpace, g: _Grid, tri: np.ndarray, headroom_gib: float | None,
           rejected: dict[str, int]) -> LayoutBatch:
    """The layouts of tuples `tri` crossed with `g`'s choices, less those the rules remove (counted in `rejected`,
    zeros too), before the host-offloading choices."""
    from .cost.batch import A2AS, DTYPES
    from .layout import SCHEDULES

    N, sched, rc, rc_mod, rc_n, zs, zh, a2, pl, mb = (sp.gpus, g.sched, g.rc, g.rc_mod, g.rc_n, g.zs, g.zh, g.a2,
                                                      g.pl, g.mb)
    per_seq, avail = g.per_seq, g.avail
    # Stage 1 crosses (tp, pp, ep) × schedule × micro-batch size and applies the rules that
    # depend on those alone; stage 2 crosses the survivors with recompute × ZeRO × a2a ×
    # placement. Stage-1 rejections count once per stage-2 combination, as in a full product.
    # the grid [degrees, schedule, micro-batch size] flattened, each column built contiguous by
    # repeating (indexing rows of `tri` would give strided views, slower in every rule below)
    n_t, n_s, n_b = len(tri), len(sched), len(mb)
    per_combo = len(rc) * len(zs) * len(a2) * len(pl)
    tp, cp, pp, dp, ep, etp, cpc, cpa = (np.repeat(c, n_s * n_b) for c in tri.T)
    s_idx, vpp = (np.tile(np.repeat(c, n_b), n_t) for c in sched.T)
    mbs = np.tile(mb, n_t * n_s)
    keep = np.ones(n_t * n_s * n_b, bool)
    # every count is of layouts x host-offloading choices (_with_offload), as `evaluated` is
    n_off = g.n_off
    weight = per_combo * n_off

    def rule(name, bad):
        nonlocal keep
        rejected[name] = rejected.get(name, 0) + int(np.count_nonzero(keep & bad)) * weight
        keep &= ~bad

    rule(LOGITS_BOUND, mbs * per_seq / (tp * cp) > avail)
    gbs = sp.global_batch
    rule("global batch not divisible by dp*mbs", gbs % (dp * mbs) != 0)
    M = np.where(keep, gbs // np.maximum(dp * mbs, 1), 0)
    pipelined = pp > 1
    # with one stage the schedule, vpp and placement-free choices collapse to one
    # (kept once: as the first schedule listed, run as 1f1b, whatever --schedules holds)
    first_variant = (s_idx == sched[0, 0]) & (vpp == sched[0, 1])
    rule("duplicate (pp=1 needs no pipeline schedule)", ~pipelined & ~first_variant)
    s_idx, vpp = np.where(pipelined, s_idx, 1), np.where(pipelined, vpp, 1)
    # a chunk holds at least one layer slot: the account split counts the embedding and the loss
    # as a slot each (Meta's 126-layer Llama 3 405B over pp 16 x vpp 8 = 128 chunks)
    slots = "(layers+2)" if sp.pipeline_split == "account" else "layers"
    rule(f"pp*vpp > {slots}", pp * vpp > layer_slots(m.num_layers, sp.pipeline_split))
    # Megatron-Core's even splits need whole layers a chunk (layout.check_layout's rule)
    rule(f"pipeline_split {sp.pipeline_split} needs {slots} % (pp*vpp) == 0",
         split_refused(sp.pipeline_split, m.num_layers, pp * vpp))
    # the search runs sequence parallelism wherever tp > 1 (_batch), and Megatron-Core and piper-train
    # split each rank's sequence over tp
    rule("sequence parallelism needs (seq/cp) % tp == 0", (tp > 1) & ((sp.seq // cp) % tp != 0))
    if not sp.p2p_overlap:  # Megatron-LM: "pipeline-model-parallel size should be greater than 2 with
        # interleaved schedule" unless --overlap-p2p-communication (a layout stated so is still priced)
        rule("interleaved without p2p overlap needs pp > 2", (s_idx == 2) & (pp == 2))
    rule("micro-batches < pp", pipelined & (s_idx >= 1) & (M < pp))
    rule("interleaved needs micro-batches % pp == 0", pipelined & (s_idx == 2) & (M % np.maximum(pp, 1) != 0))
    rule("dualpipev needs micro-batches >= 2*pp", pipelined & (s_idx == 4) & (M < 2 * pp))
    rule("zbv needs micro-batches >= 2*pp-1", pipelined & (s_idx == 3) & (M < 2 * pp - 1))
    if sp.a2a_overlap:  # Megatron-Core's EP overlap runs in its interleaved 1F1B alone
        rule("a2a_overlap with pp > 1 needs the interleaved schedule", pipelined & (s_idx != 2))
    k1 = np.nonzero(keep)[0]
    tp, cp, pp, dp, ep, etp, cpc, cpa, s_idx, vpp, mbs = (x.take(k1) for x in (tp, cp, pp, dp, ep, etp, cpc, cpa,
                                                                               s_idx, vpp, mbs))
    # stage 2's rules broadcast from the few axes each reads over the grid [recompute, ZeRO,
    # a2a, placement, stage-1 survivor] (survivors innermost, so numpy's inner loops are long);
    # the layouts come out in [survivor, recompute, ZeRO, a2a, placement] order
    shape = (len(rc), len(zs), len(a2), len(pl), len(k1))
    on = lambda x, axis: np.reshape(x, [-1 if i == axis else 1 for i in range(5)])  # noqa: E731
    per_pl = lambda x: x.T.reshape(1, 1, 1, len(pl), len(k1))  # noqa: E731  [survivor, placement] terms
    keep = np.ones(shape, bool)
    weight = n_off
    rule("zero 3 with pp > 1", on(zs == 3, 1) & on(pp > 1, 4))
    reps = hsdp_replicas(hw, tp, dp * cp, N) if zh.any() else np.ones(len(k1), int)  # a survivor's hybrid replicas
    if zh.any():
        rule("hsdp: the data-parallel group fits the scale-up domain (whole-group ZeRO)", on(zh, 1) & on(reps < 2, 4))
        rule("hsdp: a shard inside the scale-up domain would hold one rank", on(zh, 1) & on(dp * cp // reps < 2, 4))
        rule("hsdp: replicas do not divide the expert-data-parallel group",
             on(zh, 1) & on((dp * cp * tp // (ep * etp)) % np.maximum(reps, 1) != 0, 4))
    # no data-parallel group to shard over (dp·cp = 1, and for experts ep·etp = tp: expert-data
    # parallel 1): every ZeRO stage runs the same step (ZeRO-3 adds its gather buffers), so the
    # lowest stage asked for stays
    alone = (dp * cp == 1) & ((m.moe is None) | (ep * etp == tp))
    rule("duplicate (ZeRO stage without a data-parallel group)", on(zs != zs.min(), 1) & on(alone, 4))
    rc_most = recompute_layers_limit(m.num_layers, pp * vpp, sp.pipeline_split)
    rule("recompute_layers <= the layers of a chunk",  # layout.check_layout's bound
         (rc_n[:, None] > rc_most).reshape(len(rc), 1, 1, 1, len(k1)))
    rule("duplicate (recompute_layers covering a whole chunk equals every layer)", _rc_layer_duplicates(m, rc, rc_n, pp * vpp))
    moe_ep = (m.moe is not None) & (ep > 1)
    # without expert parallelism every a2a choice prices alike: the first one listed stays
    rule("duplicate (a2a choice without expert parallelism)", on(~moe_ep, 4) & on(a2 != a2[0], 2))
    rule("duplicate (placement choice when ep*etp == dp*cp*tp or ep == 1)",
         on((ep * etp == dp * cp * tp) | (ep == 1), 4) & on(pl != 0, 3))
    # HALO only differs from flat when the EP group spans scale-up domains (nodes; an NVL72 rack,
    # where comm._node_split cuts it) with several members in each, as its busiest rank finds them
    # (comm.level_counts: a group of 64 in a world of 576 racks filled 72 each leaves 8 in some); an EP group's
    # members are etp ranks apart packed, edp·etp spread (layout.rank_coords). Only a duplicate
    # where flat is searched
    stride = np.where(pl[None, :] == 0, etp[:, None], (dp * cp * tp // np.maximum(ep, 1))[:, None])  # [survivor, pl]
    inside = comm.level_counts(hw, ep[:, None], stride, N)  # [level, survivor, pl] EP members in a domain
    per_node = inside[hw.scaleup_level]
    halo = on((a2 == 1) & (a2 == 0).any(), 2)
    rule("duplicate (halo inside one node equals flat)", halo & per_pl(per_node >= ep[:, None]))
    rule("duplicate (halo with one EP member per node equals flat)", halo & per_pl(per_node <= 1))
    if (a2 == A2AS.index("fused")).any():  # layout.check_for's and fused_a2a_refusal's rules
        fused = on(a2 == A2AS.index("fused"), 2)
        rule("a2a fused needs the expert-parallel group inside one scale-up domain",
             fused & per_pl(per_node < ep[:, None]))
        rule("a2a fused needs etp 1", fused & on(etp > 1, 4))
        rule("a2a fused without a2a_overlap or dualpipev", fused & on(s_idx == SCHEDULES.index("dualpipev"), 4))
    if sp.runtime == "piper-train":  # its ZeRO-2 reduces in autograd hooks: no weight-split schedule
        weight_split = np.isin(np.array(SCHEDULES), WEIGHT_SPLIT)[s_idx]
        rule("piper-train: ZeRO-2 with zbv or dualpipev", on(zs == 2, 1) & on(weight_split, 4))
    if sp.paper_mesh:
        rule("not the paper's PP x EP mesh (tp=1, ep=dp)", on((tp != 1) | (ep != dp), 4))
    if sp.ep_in_domain:
        level = [lv.name for lv in hw.topology].index(sp.ep_in_domain)
        rule(f"EP group leaves the {sp.ep_in_domain} domain", per_pl(inside[level] < ep[:, None]))
    cols = dict(gpus=N, tp=tp, cp=cp, cpc=cpc, cpa=cpa, pp=pp, dp=dp, ep=ep, etp=etp, vpp=vpp, mbs=mbs, gbs=gbs,
                seq=sp.seq, sched=s_idx,
                eager=sp.attention_kernel == "eager", fa2=sp.attention_kernel == "fa2", unfused=not sp.fused_kernels,
                native=sp.native_eager, cmodel="model" in sp.compiled, closs="loss" in sp.compiled,
                ce_eager=sp.cross_entropy == "eager", dropout=False,
                egemm=EXPERT_GEMMS.index(sp.expert_gemm), a2a_overlap=sp.a2a_overlap, a2a_sms=sp.a2a_sms or 0,
                tp_overlap=sp.tp_comm_overlap, attn_fp8=sp.attention_fp8, p2p_sg=False, tp_async=True,
                p2p_ovl=sp.p2p_overlap,
                fp8=FP8S.index(sp.fp8), fp8_par=sp.fp8_params, probs_act=sp.expert_probs == "activation",
                graphs=graph_bits(sp.cuda_graphs), overlap=sp.overlap_grad_reduce, reshard=True,
                fsdp2=sp.fsdp2, gstep=sp.grad_sync == "step", wacc=sp.wgrad_accum,
                split=SPLITS.index(sp.pipeline_split),
                dtype=DTYPES.index(sp.dtype), grad_bytes=4 if sp.grad_dtype == "fp32" else 2,
                # the state bound below holds for every offload choice at the largest share offloaded
                opt_offload=float(max(sp.optimizer_offload)), offload_layers=0, off_mods=0)
    if headroom_gib is not None:
        # the state-memory bound reads (tp, pp, dp, ep, ZeRO, dtypes) only: price it per ZeRO x survivor
        zi, j = (g.ravel() for g in np.meshgrid(np.arange(len(zs)), np.arange(len(k1)), indexing="ij"))
        first = np.zeros(len(j), int)
        lb = state_lower_bound_gib(m, _batch(cols, j, zs[zi], np.where(zh[zi], reps[j], 1), rc[first], a2[first],
                                             pl[first], rc_mod[first], rc_n[first]),
                                   hw.memory_overhead_gib, hw.accelerator.fp8_any_layout)
        rule(STATE_BOUND, (lb + headroom_gib > hw.accelerator.memory_gib).reshape(1, len(zs), 1, 1, len(k1)))
    j, ri, zi, ai, pi = np.unravel_index(np.flatnonzero(keep.transpose(4, 0, 1, 2, 3)), (len(k1),) + shape[:4])
    batch = _batch(cols, j, zs[zi], np.where(zh[zi], reps[j], 1), rc[ri], a2[ai], pl[pi], rc_mod[ri], rc_n[ri])
    return batch


def _rc_layer_duplicates(m: ModelSpec, rc: np.ndarray, rc_n: np.ndarray, chunks: np.ndarray) -> np.ndarray:
    """[recompute choice, 1, 1, 1, survivor] mask of the full-recompute layer counts that price as an
    earlier choice: a count covering a chunk's mean layers re-runs every layer, as 0 does
    (recompute.full_recompute_share), so of the counts that come to the same layers only the first stays."""
    every = (rc_n[:, None] > 0) & (rc_n[:, None] >= (m.num_layers + m.mtp_layers) / chunks[None, :])
    eff = np.where(every, 0, rc_n[:, None])  # [choice, survivor]
    dup = np.zeros(eff.shape, bool)
    for i in range(1, len(rc)):
        for j in range(i):
            if rc[j] == rc[i] and rc_n[i] != rc_n[j]:
                dup[i] |= eff[j] == eff[i]
    return dup.reshape(len(rc), 1, 1, 1, -1)


_CHOICE_SHIFT = 40  # an enumeration key's offload choice sits above its row (2**40 rows: far past any search)


def _with_offload(m: ModelSpec, sp: SearchSpace, batch: LayoutBatch, rejected: dict,
                  base: int = 0) -> tuple[LayoutBatch, np.ndarray]:
    """`batch` once per host-offloading choice (SearchSpace.optimizer_offload x offload_layers x
    offload_modules), less the layouts whose ranks hold too few layers to offload that many
    (layout_offload.check_offload), counted in `rejected`; and each layout's enumeration key: its offload
    choice, then `base` + its row of `batch` (the choices are crossed outermost)."""
    combos = _offload_combos(sp)
    rows = base + np.arange(len(batch))
    if combos == [(0.0, 0, 0)]:
        return batch, rows
    most = offload_limit(m.num_layers, batch.pp)
    parts, keys = [], []
    for c, (f, n, b) in enumerate(combos):
        fits = n <= most
        name = "offload_layers >= layers on a rank (layout_offload.check_offload)"
        rejected[name] = rejected.get(name, 0) + int(np.sum(~fits))
        # Megatron-Core's layer offloading runs without pipeline, recompute, graphs or module offloading
        runs = fits & ((n == 0) | ((batch.pp == 1) & (batch.recompute == 0) & (not sp.cuda_graphs) & (b == 0)))
        name = "offload_layers with pp 1, no recompute, cuda_graphs or offload_modules (layout_offload.offload_refusal)"
        if np.any(fits & ~runs):
            rejected[name] = rejected.get(name, 0) + int(np.sum(fits & ~runs))
        ok = np.flatnonzero(runs)
        parts.append(replace_cols(batch, opt_offload=f, offload_layers=n, off_mods=b).take(ok))
        keys.append((c << _CHOICE_SHIFT) + rows.take(ok))
    return concat(parts), np.concatenate(keys)


def _offload_combos(sp: SearchSpace) -> list[tuple]:
    """(optimizer share, activation layers, module bits) host-offloading choices the search crosses
    every layout with: [(0.0, 0, 0)] where it tries none."""
    sets = dict.fromkeys(off_bits(mods) for mods in sp.offload_modules)
    return [(f, n, b) for f in sp.optimizer_offload for n in sp.offload_layers for b in sets]


def hsdp_replicas(hw: HardwareSpec, tp, dpcp, world=None) -> np.ndarray:
    """Layout.zero_replicas that keeps each ZeRO shard inside the scale-up domain (the largest
    topology level not reached through the NICs: a node, an NVL72 rack): a data-parallel group of
    dpcp ranks `tp` apart is cut into shards of the most of its members that divide it and that one
    domain holds whole wherever a shard falls among the `world` ranks (comm.level_counts, a domain
    holding its level's job_block of ranks; None: the one group). NVL72 racks filled 64 a job each
    hold shards of 64 of a group of 256; filled 72 each, 72 for a group of 576 but 8 for one of 256
    (shards of 64 would leave 8 ranks of the second in the first rack). 1 where the group fits one
    domain."""
    level = hw.scaleup_level
    dpcp, tp = np.broadcast_arrays(np.asarray(dpcp), np.asarray(tp))
    w = np.broadcast_to(dpcp * tp if world is None else np.asarray(world), dpcp.shape)
    keys, inv = np.unique(np.stack([dpcp, tp, w]).reshape(3, -1), axis=1, return_inverse=True)

    def whole(d, t, n):  # a shard of d ranks t apart sits inside one domain wherever it falls
        return comm.level_counts(hw, d, t, n)[level] == d

    # a few distinct (group, tp, world) in a search: each one's largest divisor held whole
    shard = np.array([max(d for d in range(1, g + 1) if g % d == 0 and whole(d, t, n)) for g, t, n in keys.T],
                     dtype=int)
    return (dpcp // shard[inv.reshape(-1)].reshape(dpcp.shape)).astype(int)


def _batch(cols: dict, j, zero, zrep, recompute, a2a, placement, rc_mods, rc_layers) -> LayoutBatch:
    """Layouts from stage-1 survivors `j` (per-survivor arrays in `cols`, or scalars shared
    by all) and the stage-2 choices."""
    n = len(j)
    col = lambda k: cols[k].take(j) if isinstance(cols[k], np.ndarray) else np.full(n, cols[k])  # noqa: E731
    given = {k: col(k) for k in cols if k != "wacc"}  # wacc: a Layout.wgrad_accum word, resolved below
    # a space of torch FSDP2 (or another PyTorch-native stack) adds its gradients in autograd at every ZeRO stage
    torch = torch_stack(given["fsdp2"], given["unfused"], given["native"], given["cmodel"])
    given["wacc"] = wgrad_accum_codes(cols["wacc"], torch)
    given["fsdp2"] = given["fsdp2"] & (np.asarray(zero) == 3)  # FSDP2's copies surround ZeRO-3's collectives only
    given["gstep"] = given["gstep"] & (np.asarray(zero) == 3)  # the other stages reduce as they always do
    return LayoutBatch(**given, sp=col("tp") > 1, zero=zero, zrep=zrep, recompute=recompute,
                       a2a=a2a, placement=placement, rc_mods=rc_mods, rc_layers=rc_layers)


# layouts one evaluate call prices where search keeps only the best: its Estimate and working arrays
# stay a few hundred MB (the 4.7M layouts of a wide DeepSeek-V3 space priced at once took 6.9 GB)
PRICE_CHUNK = 1 << 16


def check_space(m: ModelSpec, hw: HardwareSpec, sp: SearchSpace) -> None:
    """Raise LayoutError (SpecError for the host) where an option the whole space shares cannot run
    on `m` or `hw`: refused before anything is priced (a sweep asks it of every scenario's spec
    before its first search)."""
    check_a2a_sms(sp.a2a_sms, hw)
    why = native_eager_refusal(m) if sp.native_eager else None
    for mods in sp.selective if "selective" in sp.recomputes else ():
        why = why or op_sac_refusal(m, mods) or absent_module_refusal(m, mods)
    why = why or (fused_hw_refusal(m, hw) if "fused" in sp.a2as and m.moe else None) or fp8_hw_refusal(sp.fp8, hw)
    why = why or wgrad_accum_refusal(sp.wgrad_accum, m.moe.num_experts if m.moe else 0, m.name)
    if why:
        raise LayoutError(*why)
    check_host(hw, any(f > 0 or n > 0 or b for f, n, b in _offload_combos(sp)))


def search(m: ModelSpec, hw: HardwareSpec, sp: SearchSpace, routing: Routing | None = None,
           objective: str = "throughput", headroom_gib: float = 0.0, keep: int | None = None) -> SearchResult:
    """The space's layouts priced and ranked. keep None: the result holds every priced layout and its
    Estimate; a count: they are enumerated ENUM_CELLS grid cells and priced PRICE_CHUNK layouts at a time,
    and only the best `keep` fitting, the leanest fitting and the leanest of all are kept (SearchResult),
    so memory stays bounded."""
    import time

    t0 = time.process_time()
    check_space(m, hw, sp)
    counts = np.zeros(3, int)  # layouts over device memory, over the host's, priced non-finite
    # two stages: a cheap state-memory bound drops layouts that cannot fit, the rest are priced
    if keep is None:
        batch, rejected = enumerate_layouts(m, hw, sp, headroom_gib)
        n_priced = 0 if batch is None else len(batch)
    else:  # each slice priced as it is built: the space is never held whole
        rejected = {}
        slices = enumerate_slices(m, hw, sp, rejected, headroom_gib, ENUM_CELLS)
        batch, est, order, n_fit, n_priced = _price_kept(m, hw, slices, routing, objective, headroom_gib, keep, counts)
        rejected = _counted(rejected)
    n_all = 0 if batch is None else n_priced + rejected.get(STATE_BOUND, 0)
    for bound in (STATE_BOUND, LOGITS_BOUND):  # the bounds are against the memory less the headroom
        if headroom_gib and bound in rejected:
            rejected[bound.replace(" (bound)", _less_headroom(hw, headroom_gib) + " (bound)")] = rejected.pop(bound)
    if n_all == 0:
        return SearchResult(batch, None, np.array([], int), rejected, 0)
    if n_priced == 0:
        return SearchResult(batch, None, np.array([], int), rejected, n_all, time.process_time() - t0)
    if keep is None:
        est = evaluate(m, hw, batch, routing, headroom_gib)
        cpu_s = time.process_time() - t0
        ok = np.flatnonzero(_fitting(hw, est, headroom_gib, counts))
        _count_refusals(rejected, hw, headroom_gib, counts)
        # deterministic: the sort is stable, so ties keep the order enumerate_layouts builds
        order = ok[np.lexsort(_rank_keys(batch, est, objective, ok))]
        return SearchResult(batch, est, order, rejected, n_all, cpu_s, priced=n_priced)
    _count_refusals(rejected, hw, headroom_gib, counts)
    return SearchResult(batch, est, order, rejected, n_all, time.process_time() - t0, n_fit, n_priced)


def _price_chunks(parts: Iterable[tuple]) -> Iterator[tuple]:
    """`parts` ((layouts, enumeration keys)) regrouped PRICE_CHUNK layouts at a time, the last fewer (or none,
    where they hold none), so that evaluate's calls stay full however many layouts a slice holds."""
    held, n = [], 0
    for part in parts:
        held.append(part)
        n += len(part[0])
        if n < PRICE_CHUNK:
            continue
        lay, key = _joined(held)
        end = n - n % PRICE_CHUNK
        for s in range(0, end, PRICE_CHUNK):
            yield _rows(lay, s, s + PRICE_CHUNK), key[s:s + PRICE_CHUNK]
        held, n = [(_rows(lay, end, n), key[end:])], n - end
    if held:
        yield _joined(held)


def _joined(parts: list[tuple]) -> tuple:
    """(layouts, keys) of `parts` one after another."""
    return parts[0] if len(parts) == 1 else (concat([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def _rows(lay: LayoutBatch, start: int, end: int) -> LayoutBatch:
    """Rows start..end of `lay` as views (no copy: they are only read)."""
    return LayoutBatch(**{f.name: getattr(lay, f.name)[start:end] for f in fields(LayoutBatch)})


def _price_kept(m: ModelSpec, hw: HardwareSpec, parts: Iterable[tuple], routing: Routing | None, objective: str,
                headroom_gib: float, keep: int, counts: np.ndarray) -> tuple:
    """(layouts kept, their Estimate, the fitting ones' indices among them best first, fitting layouts, layouts
    priced) of `parts` ((layouts, enumeration keys) as enumerate_slices yields them) priced PRICE_CHUNK at a
    time, kept as search's `keep` says, in enumeration order; `counts` as _fitting's. Where none is priced: no
    Estimate, and an empty batch (None where `parts` holds no slice)."""
    top = None  # the best `keep` fitting so far: (layouts, enumeration keys, rank keys)
    lean_fit = lean_all = park = seen = None
    rows = {}  # enumeration key -> the layout, of the leanest and the first that parks activations
    n_fit = n = 0

    def leaner(cur, peak, idx, seen, key):  # _leaner, holding on to the row of a new leanest among `seen`
        new = _leaner(cur, peak, idx)
        if new is not cur:
            rows[new[1]] = seen.take(np.flatnonzero(key == new[1]))
        return new

    for seen, key in _price_chunks(parts):
        if not len(seen):
            continue
        n += len(seen)
        est = evaluate(m, hw, seen, routing, headroom_gib)
        ok = np.flatnonzero(_fitting(hw, est, headroom_gib, counts))
        n_fit += len(ok)
        lean_all = leaner(lean_all, est.peak_memory_gib, key, seen, key)
        parks = np.flatnonzero((seen.offload_layers > 0) | (seen.off_mods != 0))
        if len(parks) and (park is None or key[parks].min() < park):
            i = parks[np.argmin(key[parks])]
            park, rows[int(key[i])] = int(key[i]), seen.take([i])
        if len(ok):
            lean_fit = leaner(lean_fit, est.peak_memory_gib[ok], key[ok], seen, key)
            ranks = _rank_keys(seen, est, objective, ok)
            # the enumeration key breaks ties, as the stable sort over all layouts at once does
            o = np.lexsort((key[ok], *ranks))[:keep]
            cand = (seen.take(ok[o]), key[ok[o]], [k[o] for k in ranks])
            if top is not None:
                cand = (concat([top[0], cand[0]]), np.concatenate([top[1], cand[1]]),
                        [np.concatenate(k) for k in zip(top[2], cand[2])])
                best = np.lexsort((cand[1], *cand[2]))[:keep]
                cand = (cand[0].take(best), cand[1][best], [k[best] for k in cand[2]])
            top = cand
    if lean_all is None:
        return seen, None, np.array([], int), 0, 0
    for i, k in enumerate(top[1] if top is not None else ()):
        rows[int(k)] = top[0].take([i])
    # a layout ranked below the best keeps its place after them: the leanest fitting (the memory note)
    ranked = [] if top is None else [int(k) for k in top[1]]
    ranked += [] if lean_fit is None or lean_fit[1] in ranked else [lean_fit[1]]
    kept = sorted({*ranked, lean_all[1]})  # and the leanest of all (diagnose, where none fits)
    # the few kept re-priced: a layout's figures do not depend on the others priced beside it, but a step's
    # breakdown has "offload" only where one of them parks activations: one does where one of the batch did
    sub = concat([rows[k] for k in kept])
    if park is not None and not ((sub.offload_layers > 0) | (sub.off_mods != 0)).any():
        kept = sorted([*kept, park])
        sub = concat([rows[k] for k in kept])
    return sub, evaluate(m, hw, sub, routing, headroom_gib), np.searchsorted(kept, ranked), n_fit, n


def _fitting(hw: HardwareSpec, est: Estimate, headroom_gib: float, counts: np.ndarray) -> np.ndarray:
    """Which of est's layouts fit and are priced finite; `counts` gains those over the device's memory,
    over the host's, and priced non-finite (a spec figure past any physical range, 1e308 us, overflows)."""
    device_ok = est.peak_memory_gib + headroom_gib <= hw.accelerator.memory_gib
    priced = np.isfinite(est.step_time_s) & np.isfinite(est.peak_memory_gib)
    counts += [np.count_nonzero(~device_ok), np.count_nonzero(device_ok & ~est.fits), np.count_nonzero(~priced)]
    return est.fits & priced


def _count_refusals(rejected: dict, hw: HardwareSpec, headroom_gib: float, counts: np.ndarray) -> None:
    """_fitting's counts as rejections."""
    n_mem, n_host, n_inf = (int(c) for c in counts)
    if n_mem:
        rejected["worst stage exceeds device memory" + _less_headroom(hw, headroom_gib)] = n_mem
    if n_host:
        rejected["offloaded state and activations exceed the host memory per GPU"] = n_host
    if n_inf:
        rejected["priced at a non-finite time or memory (a spec figure out of range)"] = n_inf


def _rank_keys(batch: LayoutBatch, est: Estimate, objective: str, rows: np.ndarray) -> tuple:
    """np.lexsort keys of layouts `rows`, the last first: the objective, then throughput, lower peak
    memory (the same step with more room to spare), fewer pipeline stages, smaller tp."""
    tok, mem = est.tokens_per_s[rows], est.peak_memory_gib[rows]
    key = {"throughput": -tok, "mfu": -est.mfu[rows], "memory": mem}[objective]
    tp, pp = batch.tp[rows], batch.pp[rows]
    return (tp, pp, mem, -tok, key) if objective != "throughput" else (tp, pp, mem, key)


def _leaner(cur: tuple | None, peak: np.ndarray, idx: np.ndarray) -> tuple:
    """(peak, enumeration key) of the leaner of `cur` and layouts `idx` at `peak`, as np.argmin picks over
    all of them in enumeration order whatever order they come in: the first NaN, else the first lowest."""
    nan = np.isnan(peak)
    pool = np.flatnonzero(nan if nan.any() else peak == peak.min())
    i = pool[np.argmin(idx[pool])]
    new = float(peak[i]), int(idx[i])
    if cur is None:
        return new
    return min(cur, new, key=lambda c: (not np.isnan(c[0]), 0.0 if np.isnan(c[0]) else c[0], c[1]))


def _less_headroom(hw: HardwareSpec, headroom_gib: float) -> str:
    """What a memory refusal is against where --headroom-gib keeps part of the device free."""
    if not headroom_gib:
        return ""
    return f" less the {headroom_gib:g} GiB headroom ({hw.accelerator.memory_gib - headroom_gib:.1f} GiB)"
