"""Predicted vs published: every row of validation/published.csv, errors per group.

Rows are compared in the metric they were published in, each metric converted with the
source's own FLOP convention:
- hw_tflops_per_gpu (Narayanan 2021): FLOPs = 96·B·s·l·h²·(1 + s/6h + V/16lh) per step
  (their eq. 3: full recompute, non-causal attention); predicted = that / predicted step time;
- iteration_time_s: predicted step time;
- model_tflops_per_gpu: Piper's model FLOPs (causal attention halved, brief §9) — except X-MoE's
  rows, which count as X-MoE's own throughput calculator does (full s×s attention, no router:
  _xmoe_flops_per_token), and except where
  the row's notes publish tokens/s/GPU (Megatron-Bridge): then throughput is compared in
  tokens/s, which needs no FLOP convention (theirs differs from ours for some models: their
  tables through 26.04.01 count gpt-oss-120b at 27.2 GFLOP/token against our 32.7, its experts
  as ungated two-matrix MLPs (-7.2) and no sliding window (+1.7), Megatron-LM's
  num_floating_point_operations with ffn_expansion_factor 2 unless --swiglu; from 26.06 32.6;
  Qwen3-30B-A3B 118 TFLOPS at 5113 tok/s is 23.1, as ours);
- params_optimizer_gib_per_gpu / activation_gib_per_gpu: the memory model's components on the
  first pipeline stage (Korthikanti 2022 Fig. 1 excludes the embedding from the states).
Software settings follow each source: Megatron 2021/22 ran eager fused-softmax attention with
dropout and no distributed optimizer, its DP all-reduce as each row's csv grad_reduce and
overlap_grad_reduce say (Narayanan's SC21 scripts: fp16, overlapped by torch DDP up to 18B,
after the flush above); Megatron-Bridge runs flash attention, no dropout, distributed optimizer
with overlapped reduction in bf16 (the same columns, per row). Pipelined runs
split layers over chunks as each recipe says (the csv's pipeline_split: Megatron's even default
or its embedding/loss accounting). "planner's choice" rows compare with the best layout our
search finds inside the space the measured system can run: Piper's rows with its PP × EP mesh
(tp 1, ep = dp) and 1F1B — the schedules and TP its runtime lacks would credit Piper with speed it never had;
X-MoE rows without a published layout with our best layout without pipelining (X-MoE has no PP);
X-MoE rows with one run it as its launch script (quoted in the notes) and DeepSpeed's defaults
set it: ZeRO-<n>, fp16, dropout, gradient reduction after the backward (_xmoe_settings).
No row was used to fit any parameter: efficiencies come from hardware micro-benchmarks (Frontier's GEMM
plateau is a fit to Piper's single-MoE-layer rates on that machine, validate_kernels.implied_gemm).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from pydantic import ValidationError
from scipy.stats import kendalltau

from .cost.batch import from_layouts
from .cost.estimate import evaluate
from .errors import LayoutError, PiperError, from_validation
from .layout import (Layout, attention_conflict, check_batch, check_degrees, degrees_label, layer_slots, offload_label,
                     recompute_label, tp_splits_heads)
from .search import SearchSpace, default_global_batch, round_batch, search
from .specs.hardware import HardwareSpec
from .specs.registry import validation_dir
from .validate_recipes import MEGATRON_2021, inherit_layouts, inherit_recipes, stack
from .validate_measured import check_measured
from .validate_rows import (ARCH, DISPATCHER_A2A, FP8_PRECISIONS, RANGE_CELL, built_on, listed, missing_hardware,
                            missing_model, model_name, read_rows, row_hardware, row_model, table_name)

TARGETS = {"dense": (10.0, 20.0), "memory": (10.0, 10.0), "moe": (20.0, 35.0)}  # mean, max |%|
# the MoE sources issue 4's acceptance names (Megatron-Bridge, X-MoE, Piper's Fig. 13 and weak
# scaling): summary() also reports their rows alone, against the MoE targets, beside all MoE rows
MOE_ACCEPTANCE_GROUPS = ("megatron-bridge-moe", "xmoe2025", "piper2026-fig13", "piper2026-weak-scaling")
# and the dense ones (A100: Narayanan 2021 Table 1, Korthikanti 2022 Table 5), reported alone
# beside every dense row
DENSE_ACCEPTANCE_GROUPS = ("narayanan2021-table1", "korthikanti2022-table5")


def data_path() -> Path:
    """The bundled table: validation/published.csv, installed as package data
    (piper_plan.bundled.validation) so a wheel install validates too."""
    return validation_dir() / "published.csv"


@dataclass
class Result:
    id: str
    group: str
    kind: str  # dense | memory | moe
    metric: str
    published: float
    predicted: float
    layout: str
    fit: bool
    # what the model misses per transformer layer and micro-batch on a rank, in ms, where the
    # published figure fixes a step time (tokens/s, iteration time); None otherwise (_step_gap)
    missing_ms_per_layer_microbatch: float | None = None
    # the busiest rank's predicted memory and the device's, GiB, where the row prices the layout
    # its source ran (a throughput row): every such run fitted, so peak > device is a model error
    peak_memory_gib: float | None = None
    device_memory_gib: float | None = None
    # where a table names a model with no bundled spec: what it was built on (validate_rows)
    built_on: str | None = None
    # where a table's row states no recipe (or leaves its layout blank): the bundled row(s) of
    # the same stack it took them from (validate_recipes)
    recipe_from: str | None = None
    # where a table's hardware name is not a spec's own: the bundled system it was read as
    hardware_as: str | None = None

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.predicted - self.published) / self.published

    @property
    def is_time(self) -> bool:
        """The metric is a step time, where a prediction below the published figure means the
        model is too fast (for the throughput metrics, above it)."""
        return self.metric == "iteration_time_s"


def _i(x, default=None):
    """An integer cell; blank, or a range the source gives ("2560-3072": validate_rows lets it
    through), reads as `default`."""
    if x in ("", None) or RANGE_CELL.fullmatch(str(x).strip()):
        return default
    return int(x)


def _kind(row, m=None) -> str:
    """memory, moe or dense: by the row's experts column, or where it is blank by its model."""
    if row["metric"].endswith("gib_per_gpu"):
        return "memory"
    if not row["experts"] and m is not None:
        return "moe" if m.moe is not None else "dense"
    return "moe" if _i(row["experts"], 0) > 0 else "dense"


def _default(row, column: str) -> str:
    """A recipe column as the row gives it, else what the row's software does unless told
    otherwise (a table in the published schema has no recipe columns): Megatron, 2021 or Core,
    splits layers evenly over the pipeline chunks (pipeline_split even); Megatron-Core's experts
    run TE GroupedLinear's per-expert cuBLAS GEMMs on its streams (expert_gemm multistream: the
    TE docs quoted in _settings); Megatron-Bridge's performance recipes reduce gradients in bf16
    (grad_reduce; its 158 bundled rows all do), Narayanan's 2021 runs in fp16. Other groups:
    blank, the planner's defaults."""
    v = row.get(column, "")
    if v:
        return v
    g = row["group"]
    megatron = stack(row) in ("megatron-core", "megatron-lm-2021")
    if column == "pipeline_split" and megatron:
        return "even"
    if column == "expert_gemm" and stack(row) == "megatron-core":
        return "multistream"
    if column == "grad_reduce" and g.startswith("megatron-bridge"):
        return "bf16"
    if column == "grad_reduce" and g.startswith("narayanan"):
        return "fp16"  # Narayanan's SC21 scripts train with --fp16 (all ten bundled rows)
    return ""


# SMs the flex dispatcher's kernels hold unless the recipe sets them (the csv's a2a_sms):
# Megatron-Core's TransformerConfig defaults, moe_hybridep_num_sms = 16 ("In pure NVL scenarios, 16
# SMs can generally achieve good bandwidth") and moe_deepep_num_sms = 20; NCCL's all-to-all keeps
# the spec's overlap_comm_units
DISPATCHER_SMS = {"hybridep": 16, "deepep": 20}


def _settings(row, hw: HardwareSpec) -> dict:
    """What each source's software runs beyond the published layout, from the csv's columns
    (validation/README.md; each row's notes quote the recipe they were read from).
    Megatron-Bridge: Megatron-Core's TEGroupedMLP, whose GroupedLinear launches one cuBLAS GEMM
    per local expert on Transformer Engine's compute streams unless NVTE_USE_CUTLASS_GROUPED_GEMM
    is set (TE docs, "Mixture of Experts": "one cuBLAS GEMM per expert is launched on a pool of
    CUDA streams"; the recipes do not set it): expert_gemm multistream, or grouped where the
    recipe runs TE's fused grouped MLP (NVTE_CUTEDSL_FUSED_GROUPED_MLP=1); a2a_overlap yes where
    the recipe sets moe_a2a_overlap=True (the all-to-all hidden behind another micro-batch's
    compute, Layout.a2a_overlap) and a2a_sms, the SMs its HybridEP kernels hold where the recipe
    sets them (Layout.a2a_sms; blank: Megatron-Core's default for the dispatcher, DISPATCHER_SMS);
    dispatcher (DISPATCHER_A2A); cuda_graphs, the scopes the
    recipe replays as CUDA graphs (Layout.cuda_graphs: the host issues the rest, cost/host.py);
    grad_reduce, the dtype of the gradient buffers and their data-parallel reduction
    (Megatron-Bridge's performance recipes: bf16; Megatron-LM with --bf16: fp32 unless
    --grad-reduce-in-bf16), and overlap_grad_reduce (no: the reduction and the parameter gather
    run after the backward; blank: overlapped, as the Megatron-Core report's recipes are taken to);
    attention_fp8 (yes where the recipe sets fp8_dot_product_attention: Layout.attention_fp8),
    attention_kernel (fa2 where the stack runs FlashAttention-2 where `hw`'s plateau is another
    kernel's; blank: the spec's fused kernel, eager for the 2021-22 rows, or what a PyTorch-native
    stack's torch runs: _sdpa_kernel; FP8 attention beside another kernel is refused),
    kernels (eager where a PyTorch-native stack ran its dense block without torch.compile:
    Layout.native_eager; blank or fused: fused kernels, torch.compile's included),
    fsdp2 (yes where ZeRO-3 ran as torch FSDP2: Layout.fsdp2; blank: _fsdp2), grad_sync (step
    where ZeRO-3 reduced its gradients once a step: Layout.grad_sync; blank: every micro-batch),
    wgrad_accum (how a backward added its weight gradients into the held ones: Layout.wgrad_accum;
    blank: the stack's own),
    compile (what a PyTorch-native stack ran under torch.compile, model and loss joined by "+":
    Layout.compiled; blank: nothing), cross_entropy (fused or eager: Layout.cross_entropy; blank:
    eager for a PyTorch-native stack's row, torch's F.cross_entropy, fused elsewhere),
    fp8_params (yes where it keeps the weights in FP8, fp8_param_gather / --fp8-param-gather:
    Layout.fp8_params; blank: bf16 weights, TE's default),
    tp_comm_overlap (yes where the recipe sets it: Layout.tp_comm_overlap) and zero_stage (3 where
    the recipe runs Megatron-FSDP's optim_grads_params; blank: the distributed optimizer, ZeRO-1).
    Megatron-Core scales each routed token by its probability inside the experts' fused
    activation (experts.py TEGroupedMLP: weighted_bias_swiglu_impl(fc1_output, bias,
    permuted_probs)), so its combine keeps no expert output (expert_probs activation).
    The Megatron-Core MoE report's, its model zoo's and Megatron-LM's rows run the same stack. The 2021-22 dense
    rows run that era's Megatron-LM: eager attention with dropout, no ZeRO, and the csv's
    grad_reduce / overlap_grad_reduce (Narayanan's SC21 scripts: fp16; torch DDP, overlapped with
    the last micro-batch's backward, for 1.7B-18B; local DDP after the backward above; blank: fp32
    after the backward)."""
    if row["group"].startswith(MEGATRON_2021):  # Megatron-LM 2021-22: eager, local or torch DDP
        return dict(attention_kernel=row.get("attention_kernel") or "eager", dropout=True, zero=0,
                    native_eager=row.get("kernels") == "eager",
                    grad_dtype=_grad_dtype(row),
                    overlap_grad_reduce=row.get("overlap_grad_reduce") == "yes")
    # Megatron's distributed optimizer shards the optimizer state (ZeRO-1); Megatron-FSDP's
    # optim_grads_params everything (the csv's zero_stage 3), whose units a reshard_after_forward
    # "no" keeps gathered from forward to backward (torchtitan's fsdp_reshard_after_forward="never")
    kernel = row.get("attention_kernel") or _sdpa_kernel(row, hw) or "flash"
    why = attention_conflict(kernel, row.get("attention_fp8") == "yes")
    if why:
        raise LayoutError("attention_fp8 needs attention flash", why)
    return dict(attention_kernel=kernel, dropout=False, zero=_zero(row), native_eager=row.get("kernels") == "eager",
                compiled=listed(row, "compile"),
                cross_entropy=row.get("cross_entropy") or ("eager" if _pytorch_native(row) else "fused"),
                reshard_after_forward=row.get("reshard_after_forward") != "no", fsdp2=_fsdp2(row),
                grad_sync=row.get("grad_sync") or "microbatch", wgrad_accum=row.get("wgrad_accum") or None,
                tp_comm_overlap=row.get("tp_comm_overlap") == "yes",
                attention_fp8=row.get("attention_fp8") == "yes",
                fp8_params=row.get("fp8_params") == "yes" and row.get("precision") in _FP8,
                grad_dtype=_grad_dtype(row),
                overlap_grad_reduce=row.get("overlap_grad_reduce") != "no",
                expert_gemm=_default(row, "expert_gemm") or "grouped", a2a_overlap=row.get("a2a_overlap") == "yes",
                a2a_sms=_i(row.get("a2a_sms"), DISPATCHER_SMS.get(row.get("dispatcher", ""))),
                a2a=DISPATCHER_A2A[row.get("dispatcher", "")], expert_probs="activation",
                cuda_graphs=listed(row, "cuda_graphs"))


def _zero(row) -> int:
    """The ZeRO stage a Megatron row runs: the csv's zero_stage, else 3 where NeMo's performance
    tables' FSDP column says FSDP ("FSDP = 1: use FSDP"; Megatron-FSDP shards parameters,
    gradients and optimizer state), else the distributed optimizer's 1."""
    if row.get("zero_stage"):
        return int(row["zero_stage"])
    return 3 if _i(row.get("fsdp"), 0) >= 1 else 1


def _grad_dtype(row) -> str:
    """The csv's grad_reduce as Layout.grad_dtype: the planner prices a reduction by its element
    size, so fp16 (2021 Megatron-LM runs with --fp16) reduces as bf16 does; blank: fp32."""
    g = _default(row, "grad_reduce") or "fp32"
    return "bf16" if g == "fp16" else g


def _split(row) -> str:
    """How the run split layers over pipeline chunks (validation/README.md): Megatron's default
    even split, or its embedding/loss accounting; a hand-written layout string is priced by cost."""
    split = _default(row, "pipeline_split")
    return split if split in ("even", "account") else "balanced"


# a context-parallel degree a row's notes state ("CP 2", "CP=4", "context parallel 8")
_NOTES_CP = re.compile(r"\b(?:CP|[Cc]ontext[- ]parallel(?:ism)?(?: size)?)\s*[=:]?\s*(\d+)\b")


def _cp(row, gpus: int, tp: int, pp: int) -> int:
    """The row's context-parallel degree: its cp column; else, in a table without one (the handed-over
    schema has none), the factor its tp, pp and dp leave of its GPUs where the notes state that CP,
    else 1 (a product that still misses is named by check_degrees)."""
    if row.get("cp", ""):
        return int(row["cp"])
    dp = _i(row["dp"])
    if not dp or gpus % (tp * pp * dp):
        return 1
    rest = gpus // (tp * pp * dp)
    said = {int(x) for x in _NOTES_CP.findall(row.get("notes", ""))}
    return rest if rest > 1 and rest in said else 1


_NOTES_ETP = re.compile(r"\bETP\s*[=:]?\s*(\d+)\b")


def _etp(row) -> int:
    """The row's expert-tensor-parallel degree: its etp column; else, in a table without one, the
    one degree its notes state ("ETP 2"); else 1."""
    if row.get("etp", ""):
        return int(row["etp"])
    said = {int(x) for x in _NOTES_ETP.findall(row.get("notes", ""))}
    return said.pop() if len(said) == 1 else 1


def _p2p_overlap(row, hw: HardwareSpec, tp: int, cp: int) -> bool:
    """Whether the row's interleaved schedule ran its pipeline messages behind compute
    (Layout.p2p_overlap). The Megatron-LM of 2021-22 waited on each (p2p_communication._communicate:
    batch_isend_irecv, every request waited, then torch.cuda.synchronize(); overlap_p2p_comm came in
    2023). Megatron-Core overlaps them (overlap_p2p_comm: the training arguments' default, and
    Megatron-Bridge's and NeMo's CommOverlapConfig for vpp > 1) on streams of their own, which run
    beside compute only where the GPU takes work from more than one hardware queue. Before Blackwell
    (compute capability < 10), tensor or context parallelism without the EP overlap (Layout.a2a_overlap)
    or Megatron-FSDP has Megatron run one (CUDA_DEVICE_MAX_CONNECTIONS=1: megatron/training/arguments.py
    validate_args asserts it there, "requirement no longer exists since the Blackwell architecture", and
    only warns beside those two; Megatron-Bridge's performance scripts, perf_plugins.py
    _set_num_cuda_device_max_connections, set 1 there and 32 otherwise, "to avoid serialization of
    streams"), where "having multiple back-to-back communications will prevent the overlap of
    communication kernels with computation kernels" (megatron/core/distributed/param_and_grad_buffer.py,
    partition_buckets): the messages queue with the compute, priced waited. Other stacks keep the
    Layout's default (torch's ScheduleInterleaved1F1B posts each receive ahead)."""
    if row["group"].startswith(MEGATRON_2021):
        return False
    cc = hw.accelerator.compute_capability
    pre_blackwell = cc is not None and cc < 10
    parallel = tp > 1 or cp > 1
    single_queue = pre_blackwell and parallel and row.get("a2a_overlap") != "yes" and _zero(row) != 3
    return not (stack(row) == "megatron-core" and single_queue)


# PyTorch-native stacks, whose attention is torch's scaled_dot_product_attention
_SDPA_STACK = re.compile(r"torchtitan|torchao")
# a torch version a row's notes state ("pytorch version: 2.7.0a0", "torch==2.11.0", "torch>=2.11",
# "torch v2.10", "torch/2.11.0", "torch.__version__ 2.11.0", "PyTorch release 2.11", "PyTorch nightly
# (2.11.0.dev...)"): the word, separators and one of those words, major.minor[.patch]
_TORCH_VERSION = re.compile(r"(?:pytorch|torch)[\s:=_'\"(v/<>-]*(?:\.?__version__|version|release|ver\.?|nightly)?"
                            r"[\s:=_'\"(v/<>-]*(\d+)\.(\d+)(?:\.(\d+))?", re.IGNORECASE)


def _torch_version(notes: str) -> tuple[int, int, int] | None:
    """The first torch version `notes` state, None if none; an NGC container's tag read after the
    word ("nvcr.io/nvidia/pytorch:25.01-py3", "PyTorch 24.12 container": a year and a month, no
    torch release has a major past 2) is passed over for the next."""
    for said in _TORCH_VERSION.finditer(notes):
        version = tuple(int(x or 0) for x in said.groups())
        if version[0] <= 2:
            return version
    return None


def _pytorch_native(row) -> bool:
    """Whether the row's stack is PyTorch-native: its group torchtitan or torchao, or, for a row of
    no Megatron stack, its source."""
    return bool(_SDPA_STACK.search(row["group"].lower()) or (
        stack(row) not in MEGATRON_STACKS and _SDPA_STACK.search(row.get("source", "").lower())))


def _fsdp2(row) -> bool:
    """The csv's fsdp2 (yes / no); blank: yes where a PyTorch-native stack runs ZeRO-3 (its
    FSDP is torch's fully_shard), no elsewhere (Megatron-FSDP gathers in place)."""
    said = row.get("fsdp2", "")
    return said == "yes" if said else _pytorch_native(row) and _zero(row) == 3


def _sdpa_kernel(row, hw: HardwareSpec) -> str | None:
    """The attention kernel of a row whose attention_kernel column is blank and whose stack is
    PyTorch-native (its group torchtitan or torchao, or, for a row of no Megatron stack, its
    source: their attention is torch's scaled_dot_product_attention), on a spec that states
    FlashAttention-2's plateau (efficiency.attention_fa2): fa2 where the torch its notes state
    (the first one named; none: one of that era) runs its flash backend first on Hopper: before
    2.5.0, and from 2.5.1 (cuDNN's kernel made opt-in, pytorch#138522) until the builds that prefer
    cuDNN's on sm90/sm100 (2.11 on, whose cuDNN is past 9.15); None for 2.5.0 (cuDNN's first on
    H100) and 2.11 on, for FP8 attention (Transformer Engine's), for Megatron's stacks and on other
    specs: the spec's fused kernel stands."""
    if hw.efficiency.attention_fa2 is None or row.get("attention_fp8") == "yes" or not _pytorch_native(row):
        return None
    version = _torch_version(row.get("notes", ""))
    return None if version is not None and (version >= (2, 11) or version[:2] == (2, 5) and version < (2, 5, 1)) \
        else "fa2"


def _layout(row, hw: HardwareSpec) -> Layout:
    gpus, tp, pp = _i(row["gpus"]), _i(row["tp"], 1), _i(row["pp"], 1)
    cp = _cp(row, gpus, tp, pp)
    vpp = _i(row["vpp"], 1)
    dp = _i(row["dp"], gpus // (tp * cp * pp))
    rc = row["recompute"]
    recompute = "full" if rc == "full" else "selective" if rc.startswith("selective") else "none"
    modules = ("core_attn",)
    if rc == "per recipe":  # the recipe's Megatron-Core --recompute-modules (the csv's recompute_modules)
        modules = listed(row, "recompute_modules")
        recompute = "selective" if modules else "none"
    megatron_lm = row["group"].startswith(("narayanan", "korthikanti"))  # Megatron-LM of 2021-22
    sp = "seqpar" in rc or not megatron_lm
    sched = "interleaved" if vpp > 1 else "1f1b"
    mbs = _i(row["mbs"], 1)
    # a batch left blank: the planner's default (4M tokens) in whole steps of dp x mbs, not one
    # micro-batch a step (a pipeline all bubble, a 1F1B stage holding one micro-batch's activations)
    gbs = _i(row["gbs"]) or round_batch(default_global_batch(_i(row["seq"])), dp * mbs)
    return Layout(gpus=gpus, tp=tp, cp=cp, cp_comm=row.get("cp_comm") or "p2p", cp_a2a=_i(row.get("cp_a2a"), 1),
                  pp=pp, dp=dp, ep=_i(row["ep"], 1), etp=_etp(row), vpp=vpp, mbs=mbs,
                  global_batch=gbs, seq=_i(row["seq"]), schedule=sched, recompute=recompute,
                  recompute_layers=_i(row.get("recompute_layers"), 0) if recompute == "full" else 0,
                  recompute_modules=modules or ("core_attn",),
                  sequence_parallel=sp, pipeline_split=_split(row),
                  # its p2p scattered each stage boundary's activation over tp and all-gathered it
                  # (--scatter-gather-tensors-in-pipeline, default on; Narayanan 2021 §4.1, §5.1:
                  # "with the scatter/gather optimization enabled")
                  p2p_scatter_gather=megatron_lm and tp > 1,
                  # the backward's async all-reduce beside the weight gradient is Korthikanti 2022's
                  # (§6.2: "an optimization in the backward pass"); Narayanan 2021's code waited
                  tp_async_dgrad=not row["group"].startswith("narayanan"),
                  p2p_overlap=_p2p_overlap(row, hw, tp, cp),
                  fp8=_FP8.get(row["precision"], "none"),
                  optimizer_offload=float(row.get("optimizer_offload") or 0.0),
                  offload_layers=_i(row.get("offload_layers"), 0),
                  offload_modules=listed(row, "offload_modules"),
                  **_settings(row, hw))


_NOTES_TOKENS = re.compile(r"(?:^|;)\s*(\d[\d,]*(?:\.\d+)?)\s*tok/s/GPU")
# how far a TFLOPS figure's FLOPs per token (TFLOPS / tokens/s) may sit from the model's own
# count and still be the same run: FLOP conventions differ by up to ~20 % (Megatron-Bridge's
# tables through 26.04.01 count GPT-OSS-120B at 27.2 GFLOP a token, the planner 32.7); a factor of 2 is a
# transcription slip (the published table's Qwen3-30B note once held half the figure)
_CONVENTION = (0.75, 1.0 / 0.75)


def _tokens_per_gpu(row, m=None) -> float | None:
    """tokens/s/GPU the source publishes beside the row's metric: the csv's
    tokens_per_s_per_gpu, else a "N tok/s/GPU" clause of the notes (the published table's
    schema has no such column); beside a TFLOPS value, either only where the two agree up to a
    FLOP convention (_CONVENTION, against model m); None otherwise."""
    col = row.get("tokens_per_s_per_gpu", "")
    if m is None or not row["metric"].endswith("tflops_per_gpu"):  # no TFLOPS to check the figure against
        return float(col) if col else None
    hit = None if col else _NOTES_TOKENS.search(row.get("notes", ""))
    if not (col or hit):
        return None
    tok = float(col) if col else float(hit.group(1).replace(",", ""))
    ratio = float(row["value"]) * 1e12 / tok / _flops_per_token(row, m, _i(row["seq"]))
    return tok if _CONVENTION[0] <= ratio <= _CONVENTION[1] else None


def _flops_per_token(row, m, seq: int) -> float:
    """Model FLOPs per token as the row's source counts them: the planner's causal count, or every
    query against every key where the row says so (attention_flops full)."""
    return m.flops_per_token(seq, causal=row.get("attention_flops", "") != "full")


def _narayanan_convention(m, lay: Layout) -> bool:
    """Whether Narayanan et al.'s eq. 3 counts a layout's hardware FLOPs: a dense GPT (no experts,
    a 2-matrix FFN) under full recompute, as their Table 1 runs were. Any other row's hardware
    TFLOPS are compared with the planner's own count (Estimate.hw_tflops_per_gpu)."""
    return m.moe is None and not m.ffn_gated and lay.recompute == "full"


def _narayanan_flops(row, m, lay: Layout) -> float:
    """Narayanan et al.'s FLOPs per step (their eq. 3, with recompute) of the layout's batch,
    from the row's architecture columns, or where a table leaves them blank from the model."""
    B, s = lay.global_batch, lay.seq
    l, h, V = (_i(row[k]) or v for k, v in (("layers", m.num_layers), ("hidden", m.hidden_size),
                                            ("vocab", m.vocab_size)))
    return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def _xmoe_settings(row) -> dict:
    """What X-MoE's launch scripts (quoted in the notes) and their defaults run, beyond the
    published layout: no pipeline; ZeRO stage from the script's --zero-stage (the csv's
    zero_stage); DeepSpeed's ZeRO-1/2 reduce gradients after the backward, not overlapped (the
    scripts' ds_config sets only "stage", and DeepSpeed's DeepSpeedZeroConfig defaults
    overlap_comm to stage == 3);
    fp16 (--fp16) with 16-bit gradients reduced as they are (DeepSpeed's fp16 ZeRO
    optimizer); dropout on (no --hidden-dropout / --attention-dropout flag: Megatron's
    arguments.py defaults both to 0.1); no Megatron --sequence-parallel flag (X-MoE shards the
    sequence only inside the MoE block, which the cost model does for every tp > 1); the local
    experts' GEMMs one after another (deepspeed/moe/experts.py Experts.forward: `for expert in
    self.deepspeed_experts: out = expert(chunk)` on the uneven-token path --use-pft takes); the
    gate weights scale the expert outputs at the combine (DeepSpeed-MoE's combine einsum); the
    backward's tensor-parallel all-reduces one after another (the fork's megatron/arguments.py:
    "currently DeepSpeed seems to be incompatible with async_tensor_model_parallel_allreduce thus
    temporarily disabling it", `if args.deepspeed`)."""
    return dict(zero=_i(row.get("zero_stage"), 1), pp=1, overlap_grad_reduce=False, dtype="fp16",
                grad_dtype="bf16", dropout=True, sequence_parallel=False,
                expert_gemm="loop", expert_probs="combine", tp_async_dgrad=False)


def _xmoe_flops_per_token(m, seq: int) -> float:
    """FLOPs per token as X-MoE counts them (Megatron-DeepSpeed-X-MoE megatron/utils.py
    throughput_calculator, which prints the TFLOPS its paper reports): per layer 4·d² (QKV and
    output projections, no GQA), 2·d·s for the score and value matmuls over the FULL s×s
    matrix (not halved for causal masking, unlike brief §9), 2·f·d·k for the routed experts (3 with --swiglu; X-MoE's scripts do not pass it),
    plus V·d for the LM head; multiply-accumulates × 2 FLOPs × 3 (forward + backward);
    router and recompute not counted."""
    d, L = m.hidden_size, m.num_layers
    mo = m.moe
    macs = L * (4 * d * d + 2 * d * seq + (3 if mo.gated else 2) * mo.expert_ffn_size * d * mo.top_k) + m.vocab_size * d
    return 6.0 * macs


def piper_space(gpus: int, seq: int) -> SearchSpace:
    """What Piper's runtime can run on `gpus` GPUs: its PP × EP mesh (tp 1, ep = dp) under 1F1B
    (brief §1, §2), at the default batch (4M tokens, rounded to the GPUs)."""
    gbs = round_batch(default_global_batch(seq), gpus)
    return SearchSpace(gpus=gpus, global_batch=gbs, seq=seq, paper_mesh=True, schedules=("1f1b",))


MEGATRON_STACKS = ("megatron-core", "megatron-lm-2021")  # Megatron's schedules: 1F1B, interleaved


def searched_space(row, hw: HardwareSpec, global_batch: int | None = None) -> SearchSpace:
    """The space a searched row's best plan is sought in: Piper's mesh for the planner's choice,
    for X-MoE (the DeepSpeed-MoE lineage) no pipeline, for another row that states no layout the
    planner's own space under the row's recipe (its precision, dispatcher, graphs, overlap, ZeRO
    stage; Megatron's schedules where it runs Megatron); at `global_batch` sequences, by default
    the row's batch or the default batch (4M tokens) rounded to the GPUs; `hw`, the spec it runs on
    (_settings)."""
    seq, gpus = _i(row["seq"]), _i(row["gpus"])
    gbs = global_batch or _i(row["gbs"]) or round_batch(default_global_batch(seq), gpus)
    if row["group"] == "xmoe2025":  # X-MoE's stack, as _xmoe_settings runs its published layouts
        x = _xmoe_settings(row)
        return SearchSpace(gpus=gpus, global_batch=gbs, seq=seq, pps=(1,), dtype=x["dtype"], a2as=("flat",),
                           expert_gemm=x["expert_gemm"], expert_probs=x["expert_probs"],
                           overlap_grad_reduce=x["overlap_grad_reduce"])
    if row["recompute"] != "planner's choice":
        x = _settings(row, hw)
        kept = ("attention_kernel", "expert_gemm", "a2a_overlap", "a2a_sms", "tp_comm_overlap", "attention_fp8",
                "fp8_params", "expert_probs", "cuda_graphs", "overlap_grad_reduce", "grad_dtype", "native_eager",
                "fsdp2", "compiled", "cross_entropy", "grad_sync", "wgrad_accum")
        # the 2021-22 Megatron-LM settings have no MoE recipe (no dispatcher, expert GEMM, graphs):
        # the space's defaults stand for those
        return SearchSpace(gpus=gpus, global_batch=gbs, seq=seq, fp8=_FP8.get(row["precision"], "none"),
                           a2as=(x.get("a2a", "flat"),), zeros=(x["zero"],), **{k: x[k] for k in kept if k in x},
                           pipeline_split=_split(row),
                           **({"schedules": ("1f1b", "interleaved")} if stack(row) in MEGATRON_STACKS else {}))
    space = piper_space(gpus, seq)
    return space if global_batch is None else replace(space, global_batch=global_batch)


# the csv's precision -> Layout.fp8
_FP8 = dict(zip(FP8_PRECISIONS, ("current", "mxfp8", "blockwise")))
# the layout degrees a row may state; a row that states none of them (and is not X-MoE's) is searched
_DEGREES = ("tp", "cp", "pp", "vpp", "ep", "etp", "dp")


def is_searched(row) -> bool:
    """Whether a row compares the best layout the search finds (planner's choice; X-MoE rows
    without a published layout; any other throughput row that states no layout degree) rather
    than a published layout."""
    if row["recompute"] == "planner's choice" or (row["group"] == "xmoe2025" and not row["tp"]):
        return True
    return not any(row.get(c) for c in _DEGREES)


def _compared(row, m=None) -> tuple[str, float]:
    """(metric, published value) a row is compared in: a TFLOPS row whose notes also publish
    tokens/s/GPU is compared in tokens/s (no FLOP convention needed); others as published."""
    tok = _tokens_per_gpu(row, m)
    if row["metric"] == "model_tflops_per_gpu" and tok and not is_searched(row):
        return "tokens_per_s_per_gpu", tok
    return row["metric"], float(row["value"])


def _row_estimate(row, m, hw):
    """(layout, Estimate, index) a row is predicted under: the published layout run as its
    source's software runs it, or for "planner's choice" rows the best plan the search finds
    (layout None when nothing fits)."""
    if is_searched(row):
        if row["metric"].endswith("gib_per_gpu"):
            raise PiperError("metric: a memory figure needs the layout it was measured under (tp, pp, ep, "
                             f"dp), not a searched one (recompute {row['recompute']!r}, no degree stated)")
        res = search(m, hw, searched_space(row, hw))
        if res.best is None:
            return None, res.est, -1
        return res.batch.layout(res.best), res.est, res.best
    lay = _layout(row, hw)
    if row["group"] == "xmoe2025":  # X-MoE recipe with a published layout (ZeRO, no PP)
        lay = lay.model_copy(update=_xmoe_settings(row))
    # the degrees, the batch and the heads tp splits, not layout.check_layout's planner rules:
    # published runs hold layouts those refuse (a Megatron pipeline layout with more chunks than layers)
    check_degrees(lay, m.moe.num_experts if m.moe else 0, m.moe.expert_ffn_size if m.moe else 0)
    check_batch(lay)
    # but no run holds more chunks than layers and Megatron's two accounted slots, nor chunks without a pipeline
    if lay.stages > layer_slots(m.num_layers, "account"):
        raise LayoutError("pp*vpp <= layers + 2", f"{lay.stages} pipeline chunks (pp {lay.pp} x vpp {lay.vpp}) "
                          f"for {m.num_layers} layers")
    if lay.pp == 1 and lay.vpp > 1:
        raise LayoutError("pp=1 runs no pipeline schedule", f"vpp={lay.vpp} with one stage: state vpp 1")
    if not tp_splits_heads(m.num_heads, m.kv_heads, lay.tp):  # no run splits 24 heads 16 ways
        raise LayoutError("tp divides the attention heads", f"tp={lay.tp} for {m.num_heads} query heads and "
                          f"{m.kv_heads} kv heads")
    return lay, evaluate(m, hw, from_layouts([lay])), 0


def row_layout(row, path: Path | None = None) -> Layout:
    """The published layout of a row as its source's software ran it (_layout), on the hardware
    spec the row names (row_specs; `path` the table holding it, default the bundled one)."""
    return _layout(row, row_specs(row, {}, path)[1])


def row_specs(row, specs: dict, path: Path | None = None):
    """(model, hardware) a row is priced on (validate_rows.row_model / row_hardware), read once
    per `specs` memo: rows share a few dozen specs, and parsing their YAML again for every row
    was most of a pass's time."""
    path = path or data_path()
    hk = ("hardware", row["hardware_spec"] or row["hardware"])
    if hk not in specs:
        specs[hk] = row_hardware(path, row)
    return _row_model(row, specs, path), specs[hk]


def _row_model(row, specs: dict, path: Path):
    """The row's model spec alone, memoised in `specs` as row_specs does."""
    mk = ("model", row["model_spec"] or (row["model"], *(row[c] for c in ARCH)))
    if mk not in specs:
        specs[mk] = row_model(path, row)
    return specs[mk]


def spec_names(specs: dict, path: Path):
    """(model spec name, hardware spec name, MoE or not) a row is priced on, for matching rows
    across tables (validate_recipes): a model built on a family's spec goes by that spec's name;
    specs memoised in `specs` (row_specs)."""
    def names(row) -> tuple[str, str, bool]:
        key = ("names", row["model_spec"], row["model"], *(row[c] for c in ARCH), row["hardware_spec"], row["hardware"])
        if key not in specs:  # rows are matched pairwise: each row's names once
            specs[key] = _names(row)
        return specs[key]

    def _names(row) -> tuple[str, str, bool]:
        if missing_model(row):  # not priced: matched by its table names only
            return model_name(row), table_name(row["hardware"]), _i(row["experts"], 0) > 0
        m = _row_model(row, specs, path)
        # a machine with no spec (missing_hardware) goes by its table name: its row is not priced
        hw = table_name(row["hardware"]) if missing_hardware(row) else row_specs(row, specs, path)[1].name
        return row.get("model_spec") or built_on(m) or m.name, row.get("hardware_spec") or hw, m.moe is not None
    return names


def _priced(row, hw_edit=None, specs: dict | None = None, path: Path | None = None):
    """(model, layout, Estimate, index) a row is priced under (_row_estimate) on its specs
    (row_specs); hw_edit, if given, maps the hardware spec first (validate_sensitivity)."""
    m, hw = row_specs(row, {} if specs is None else specs, path)
    if hw_edit is not None:
        hw = hw_edit(hw)
    try:
        return (m, *_row_estimate(row, m, hw))
    except PiperError as e:  # an impossible layout: name the table and the row
        raise PiperError(f"{path or data_path()}: row {row['id']}: {e}") from None
    except ValidationError as e:  # a value read_rows passed that the layout still refuses: its field
        raise from_validation(f"{path or data_path()}: row {row['id']}: layout", e) from None


def predict_row(row) -> tuple[float, str]:
    m, *priced = _priced(row)
    return _row_value(row, m, *priced)


def _measured_step(row, m, lay: Layout) -> float | None:
    """The step time (s) a published figure fixes: tokens/s/GPU in the notes, an iteration
    time, or a TFLOPS figure under its source's own FLOP count (Narayanan's eq. 3, X-MoE's
    calculator, Megatron's, which is ours for the models it publishes); None for memory rows and
    the Piper paper's TFLOPS (planner's choice)."""
    tok = _tokens_per_gpu(row, m)
    value, metric = float(row["value"]), row["metric"]
    tokens = lay.global_batch * lay.seq
    if tok:
        return tokens / (tok * lay.gpus)
    if metric == "iteration_time_s":
        return value
    if metric == "tokens_per_s_per_gpu":
        return tokens / (value * lay.gpus)
    if metric == "hw_tflops_per_gpu" and _narayanan_convention(m, lay):
        return _narayanan_flops(row, m, lay) / (value * 1e12 * lay.gpus)
    if metric == "model_tflops_per_gpu" and row["group"] == "xmoe2025":
        return _xmoe_flops_per_token(m, lay.seq) * tokens / (value * 1e12 * lay.gpus)
    if metric == "model_tflops_per_gpu" and stack(row) == "megatron-core":
        # Megatron's model FLOPs per token equal ours for these models: the tables' TFLOPS over
        # tokens/s give 23.08 GFLOP (Qwen3-30B-A3B), 148.0 (Qwen3-235B-A22B), 32.63 (GPT-OSS-120B,
        # 2026 card) against our 23.08, 148.3, 32.71 (validation/README.md)
        return m.flops_per_token(lay.seq) * tokens / (value * 1e12 * lay.gpus)
    return None


def _step_gap(row, m, lay, est, i) -> dict:
    """Where the published figure fixes a step time (_measured_step): the measured step (s),
    and the predicted and missing (measured − predicted) ms per transformer layer and
    micro-batch on a rank — the unit in which a
    per-layer cost the model lacks (host launches, a kernel it does not price) shows up
    whatever the batch. Planner's-choice rows compare a searched layout: no gap."""
    if lay is None or is_searched(row):
        return {}
    step = float(est.step_time_s[i])
    per = lay.microbatches * m.num_layers / lay.pp  # layer passes a rank runs per step
    out = {"predicted_ms_per_layer_microbatch": 1e3 * step / per}
    measured = _measured_step(row, m, lay)
    if measured:
        out["measured_step_time_s"] = measured
        out["missing_ms_per_layer_microbatch"] = 1e3 * (measured - step) / per
    return out


def searched_figure(est, i, lay: Layout, metric: str, tflops=None) -> float:
    """A searched plan's own figure in a row's throughput `metric` (model or hardware TFLOPS per
    GPU, tokens/s per GPU, the step's seconds); `tflops` where the row counts model FLOPs its own
    way (_row_value), else the estimate's."""
    own = {"model_tflops_per_gpu": est.tflops_per_gpu[i] if tflops is None else tflops,
           "hw_tflops_per_gpu": est.hw_tflops_per_gpu[i], "iteration_time_s": est.step_time_s[i],
           "tokens_per_s_per_gpu": est.tokens_per_s[i] / lay.gpus}
    return float(own[metric])


def nothing_fits(row) -> str:
    """Why a searched row has no plan: the space it was searched in fits nothing on its device.
    The planner's choice is Piper's mesh, which leaves a dense model one pipeline over every GPU."""
    if row["recompute"] == "planner's choice":
        return "nothing fits in Piper's PP x EP mesh (tp 1, ep = dp, 1F1B; a dense model's pipeline spans every GPU)"
    return "nothing fits: no layout of the searched space fits the device"


def _row_value(row, m, lay, est, i) -> tuple[float, str]:
    """The row's metric from the estimate it is priced under (_row_estimate), and the layout."""
    metric = row["metric"]
    if lay is None:
        return float("nan"), nothing_fits(row)
    step = float(est.step_time_s[i])
    tflops = est.tflops_per_gpu[i]
    if row.get("attention_flops", "") == "full":  # the source's count: every query against every key
        tflops = est.tokens_per_s[i] / lay.gpus * _flops_per_token(row, m, lay.seq) / 1e12
    if is_searched(row):  # the searched plan's own figures (its global batch is the search's)
        return searched_figure(est, i, lay, metric, tflops), _desc(lay)
    if metric == "hw_tflops_per_gpu":
        if _narayanan_convention(m, lay):
            return _narayanan_flops(row, m, lay) / step / lay.gpus / 1e12, _desc(lay)
        return float(est.hw_tflops_per_gpu[i]), _desc(lay)
    if metric == "iteration_time_s":
        return step, _desc(lay)
    if metric == "tokens_per_s_per_gpu":
        return float(est.tokens_per_s[i]) / lay.gpus, _desc(lay)
    if metric == "model_tflops_per_gpu":
        if _tokens_per_gpu(row, m):
            return float(est.tokens_per_s[i]) / lay.gpus, _desc(lay)
        if row["group"] == "xmoe2025":  # X-MoE's own FLOP count (_xmoe_flops_per_token)
            tokens = lay.global_batch * lay.seq
            return _xmoe_flops_per_token(m, lay.seq) * tokens / step / lay.gpus / 1e12, _desc(lay)
        return float(tflops), _desc(lay)
    first = est.memory["first"]
    if metric == "params_optimizer_gib_per_gpu":
        emb = m.embedding_params / lay.tp * 18 / 2**30
        return float(sum(first[k][i] for k in ("weights", "grads", "master", "optimizer")) - emb), _desc(lay)
    if metric == "activation_gib_per_gpu":
        return float(first["activations"][i]), _desc(lay)
    raise ValueError(f"unknown metric {metric}")


def _desc(lay: Layout) -> str:
    return (f"{degrees_label(lay)} mbs{lay.mbs} {lay.schedule}"
            + (f" v{lay.vpp}" if lay.vpp > 1 else "") + f" rc={recompute_label(lay.recompute, lay.recompute_modules, lay.recompute_layers)}"
            + offload_label(lay) + (" attn=fa2" if lay.attention_kernel == "fa2" else ""))


def check_group(group: str, path: Path | None = None) -> None:
    """Raise PiperError (naming the table, the field and the groups it has) unless some row of
    the table is in `group`: a mistyped --group is an error, not an empty report."""
    path = path or data_path()
    groups = sorted({r["group"] for r in read_rows(path)})
    if group not in groups:
        raise PiperError(f"{path}: group: no row in group {group!r}; the table's groups: {', '.join(groups)}")


def run(group: str | None = None, path: Path | None = None, hw_edit=None) -> list[Result]:
    """Every row (or one group's) predicted; hw_edit, if given, maps each row's hardware spec
    to the one it is priced on (validate_sensitivity scales efficiencies with it). A table other
    than the bundled one has its rows' blank recipes inferred (validate_recipes)."""
    return run_with_rows(group, path, hw_edit)[0]


def run_with_rows(group: str | None = None, path: Path | None = None,
                  hw_edit=None) -> tuple[list[Result], list[dict]]:
    """run's results and the table's rows they were priced from, read once (validate_residuals
    reads the rows' recipe columns beside the results)."""
    path = path or data_path()
    rows, specs = read_rows(path), {}
    return price_rows(rows, path, specs, group, hw_edit, _inherit(rows, path, specs)), rows


def _inherit(rows: list[dict], path: Path, specs: dict) -> dict[str, str]:
    """What the rows of a table other than the bundled one leave blank, from the bundled rows
    (validate_recipes): their source's layout, then their recipe. {row id: reference id(s)}."""
    if path == data_path():
        return {}
    ref, names = read_rows(data_path()), spec_names(specs, path)
    lays, recs = inherit_layouts(rows, ref, names), inherit_recipes(rows, ref, names)
    return {i: " + ".join(dict.fromkeys(x for x in (lays.get(i), recs.get(i)) if x)) for i in {**lays, **recs}}


def price_rows(rows: list[dict], path: Path, specs: dict, group: str | None = None, hw_edit=None,
               inherited: dict | None = None) -> list[Result]:
    """`rows` of the table at `path` (named in errors) predicted, their specs memoised in
    `specs`; `inherited`: {row id: the reference row its recipe came from}."""
    inherited = inherited or {}
    out = []
    for row in rows:
        if group and row["group"] != group:
            continue
        no_model = missing_model(row)
        why = no_model or missing_hardware(row)
        if why:  # there is no model or machine to price it on
            m = None if no_model else _row_model(row, specs, path)
            out.append(Result(row["id"], row["group"], _kind(row, m), row["metric"], float(row["value"]),
                              float("nan"), why, row.get("fit", "no") == "yes"))
            continue
        check_measured(path, row, *row_specs(row, specs, path))
        m, *priced = _priced(row, hw_edit, specs, path)
        pred, desc = _row_value(row, m, *priced)
        metric, pub = _compared(row, m)
        gap = _step_gap(row, m, *priced).get("missing_ms_per_layer_microbatch")
        lay, est, i = priced
        kind = _kind(row, m)
        ran = lay is not None and kind != "memory" and not is_searched(row)
        peak = float(est.peak_memory_gib[i]) if ran else None
        hw = row_specs(row, specs, path)[1]
        dev = hw.accelerator.memory_gib if ran else None
        alias = None if row.get("hardware_spec") or hw.name == table_name(row["hardware"]) else hw.name
        out.append(Result(row["id"], row["group"], kind, metric, pub, pred, desc, row.get("fit", "no") == "yes",
                          gap, peak, dev, built_on(m), inherited.get(row["id"]), alias))
    return out


def memory_of_runs(results: list[Result]) -> dict:
    """The memory model against the runs themselves: each published throughput row ran its
    layout, so the model should find that layout fits the device. Returns the rows checked,
    those predicted over the device's memory (id, peak GiB, device GiB), and of those predicted to
    fit the fullest: its share of the device (busiest rank's peak over the device's memory) and
    id; a plan fuller than that is where no published run has checked the model (search says so)."""
    ran = [r for r in results if r.peak_memory_gib is not None]
    over = [{"id": r.id, "peak_gib": r.peak_memory_gib, "device_gib": r.device_memory_gib}
            for r in ran if r.peak_memory_gib > r.device_memory_gib]
    fit = [(r.peak_memory_gib / r.device_memory_gib, r.id) for r in ran if r.peak_memory_gib <= r.device_memory_gib]
    share, at = max(fit) if fit else (None, None)
    return {"rows": len(ran), "over": over, "max_fit_share": share, "max_fit_at": at}


def _priced_ok(r: Result) -> bool:
    return bool(np.isfinite(r.predicted))


def _errors(rs: list[Result]) -> tuple[np.ndarray, dict]:
    """(|error| % of the priced rows, {rows, mape, max_abs_pct, unpriced}) of `rs`. A row the
    model could not price (a planner's-choice row for which nothing fits, though the source ran
    something, or one whose model or machine has no spec: its layout says which) counts in rows
    and against the max target (not within it) and stays out of the mean, which it has no error
    for."""
    errs = np.array([abs(r.error_pct) for r in rs if _priced_ok(r)])
    return errs, {"rows": len(rs), "mape": float(errs.mean()) if len(errs) else None,
                  "max_abs_pct": float(errs.max()) if len(errs) else None,
                  "unpriced": [r.id for r in rs if not _priced_ok(r)]}


def summary(results: list[Result]) -> dict:
    """MAPE per group and per kind (out-of-sample rows only; "moe_named_sources" and
    "dense_named_sources" are the rows of MOE_ / DENSE_ACCEPTANCE_GROUPS alone) with the rows beyond each kind's max target (id: signed
    error, %), Kendall τ where a group has several rows of one metric, and the Piper/X-MoE
    ratios of Fig. 13."""
    groups = {}
    for g in sorted({r.group for r in results}):
        rs = [r for r in results if r.group == g and not r.fit]
        d = _errors(rs)[1]
        by_metric = {}
        for r in filter(_priced_ok, rs):
            by_metric.setdefault(r.metric, []).append(r)
        taus = {k: float(kendalltau([r.published for r in v], [r.predicted for r in v]).statistic)
                for k, v in by_metric.items() if len(v) >= 3}
        # every value tied on one side gives no ranking to compare (NaN, which JSON has not)
        taus = {k: t for k, t in taus.items() if np.isfinite(t)}
        if taus:
            d["kendall_tau"] = taus
        groups[g] = d
    kinds = {}
    every = lambda r: True  # noqa: E731
    subsets = {"dense": ("dense", every),
               "dense_named_sources": ("dense", lambda r: r.group in DENSE_ACCEPTANCE_GROUPS),
               "memory": ("memory", every), "moe": ("moe", every),
               "moe_named_sources": ("moe", lambda r: r.group in MOE_ACCEPTANCE_GROUPS)}
    for name, (k, keep) in subsets.items():
        rs = [r for r in results if r.kind == k and not r.fit and keep(r)]
        if rs:
            errs, d = _errors(rs)
            kinds[name] = {**d, "within_target_max": int((errs <= TARGETS[k][1]).sum()),
                           "beyond_target_max": {r.id: r.error_pct for r in rs
                                                 if _priced_ok(r) and abs(r.error_pct) > TARGETS[k][1]},
                           "target_mape": TARGETS[k][0], "target_max": TARGETS[k][1]}
    ratios = {}
    by_id = {r.id: r for r in results}
    for size, paper in (("small", 2.06), ("medium", 2.39), ("large", 1.95), ("super", 3.62)):
        a, b = by_id.get(f"piper-f13-{size}"), by_id.get(f"xmoe-f13-{size}")
        if a and b:
            ratios[size] = {"predicted": a.predicted / b.predicted, "paper": paper}
    return {"groups": groups, "kinds": kinds, "fig13_ratio": ratios, "fitted_rows": [r.id for r in results if r.fit],
            "published_runs_memory": memory_of_runs(results)}
