"""A parallel layout and its global rank -> coordinates map.

Degree conventions are Megatron-Core's, so published layouts type in as they are:
tp · cp · pp · dp = GPUs, dp is the attention data-parallel degree and cp the context-parallel
one (each sequence split over cp ranks); experts are folded over the dp × cp × tp ranks of a
stage (MoE Parallel Folding, arXiv 2504.14960): each expert is split over etp ranks (expert
tensor parallel, 1 by default: whole experts), the experts over ep such groups, so ep · etp
divides dp · cp · tp and the expert-data-parallel degree is dp · cp · tp / (ep · etp).
Megatron-Core before folding coupled the two (etp = tp, ep within dp), which is still its
default when --expert-tensor-parallel-size is unset. The paper's PP × EP mesh is tp = 1, dp = ep.

Rank order (Megatron's default "tp-cp-ep-dp-pp"): tp fastest, pp slowest, so a stage's
dp · cp · tp ranks are consecutive and land on as few nodes as possible; inside a stage the expert
groups order etp fastest, then ep (packed) or edp (spread).
"""
from __future__ import annotations

import math
from typing import Literal, Optional, get_args

from pydantic import BaseModel, ConfigDict, Field

from .errors import LayoutError
from .layout_offload import check_offload, check_offload_modules

Schedule = Literal["gpipe", "1f1b", "interleaved", "zbv", "dualpipev"]
Recompute = Literal["none", "selective", "full"]
Fp8 = Literal["none", "current", "mxfp8", "blockwise"]
# Megatron-Core --recompute-modules (selective recompute): what each re-runs in the backward
RecomputeModule = Literal["core_attn", "layernorm", "mla_up_proj", "mlp", "moe_act", "moe", "shared_experts",
                          "attn_block", "act_fc2", "op_sac"]
ExpertGemm = Literal["grouped", "multistream", "loop"]
AttentionKernel = Literal["flash", "fa2", "eager"]
# Megatron-Core --cp-comm-type: how context parallelism brings a rank the keys its queries attend to
CpComm = Literal["p2p", "all_gather", "a2a", "a2a+p2p"]
ExpertProbs = Literal["combine", "activation"]
A2A = Literal["flat", "halo", "dedup", "fused"]
# Megatron-Core --cuda-graph-scope: the parts of a layer replayed as one CUDA graph
CudaGraphScope = Literal["attn", "mlp", "moe", "moe_router", "moe_preprocess", "full_iteration"]
# Megatron-Core --offload-modules (fine-grained activation offloading): modules whose saved tensors wait
# in host memory between their forward and backward
OffloadModule = Literal["attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act"]
Placement = Literal["packed", "spread"]
PipelineSplit = Literal["balanced", "even", "account"]
# torchtitan's compile.components: what a PyTorch-native stack puts under torch.compile
CompilePart = Literal["model", "loss"]
# how an uncompiled loss runs its cross-entropy (Layout.cross_entropy)
CrossEntropy = Literal["fused", "eager"]
# when ZeRO-3 reduce-scatters its gradients (Layout.grad_sync)
GradSync = Literal["microbatch", "step"]
# how a backward adds its weight gradients into those held from earlier micro-batches (Layout.wgrad_accum)
WgradAccum = Literal["add", "experts", "gemm"]
SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved", "zbv", "dualpipev")
RECOMPUTES: tuple[str, ...] = ("none", "selective", "full")


class Layout(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus: int = Field(..., ge=1)
    tp: int = Field(1, ge=1)
    cp: int = Field(1, ge=1, description="context parallel: ranks each sequence is split over (Megatron-Core "
                    "--context-parallel-size: 2·cp load-balanced causal chunks; cp_comm: how keys move)")
    cp_comm: CpComm = Field(
        "p2p", description="how context parallelism moves keys (Megatron-Core --cp-comm-type, Transformer Engine's "
        "context_parallel.py): p2p, a ring passing each rank's K and V chunk on behind the attention kernels, cp "
        "kernels a rank (the default); all_gather, K and V gathered before the attention and their gradients "
        "reduce-scattered after it, both exposed, two kernels a rank (Llama 3's, arXiv 2407.21783 §3.3.2); a2a, "
        "Ulysses: Q, K and V exchanged for the whole sequence on heads/cp heads, one kernel, the output back, "
        "all exposed (heads and kv heads a tp rank divisible by cp); a2a+p2p, hierarchical: a2a over groups of "
        "cp_a2a neighbouring ranks, then the ring over cp/cp_a2a of them. Sliding windows run under all_gather or a2a "
        "only, multi-latent attention under p2p or a2a+p2p only")
    cp_a2a: int = Field(1, ge=1, description="with cp_comm a2a+p2p: ranks of each all-to-all group, tp apart "
                        "(Megatron-Core --hierarchical-context-parallel-sizes' first; the ring runs over cp/cp_a2a "
                        "such groups); 1 otherwise")
    pp: int = Field(1, ge=1)
    dp: int = Field(1, ge=1, description="attention data-parallel degree")
    ep: int = Field(1, ge=1, description="expert-parallel degree, folded over dp·cp·tp")
    etp: int = Field(1, ge=1, description="expert tensor parallel: ranks each expert's weights are split over "
                     "(Megatron-Core --expert-tensor-parallel-size; 1: whole experts, the fold's choice)")
    vpp: int = Field(1, ge=1, description="model chunks per rank (interleaved: v; zbv/dualpipev: 2)")
    mbs: int = Field(1, ge=1, description="micro-batch size, sequences")
    global_batch: int = Field(..., ge=1, description="sequences per optimizer step")
    seq: int = Field(..., ge=1, description="sequence length, tokens")
    schedule: Schedule = "1f1b"
    recompute: Recompute = "none"
    recompute_modules: tuple[RecomputeModule, ...] = Field(
        ("core_attn",), description="what selective recompute re-runs in the backward (Megatron-Core "
        "--recompute-modules): core_attn (softmax(QK^T)V), layernorm (the pre-attention and pre-MLP norms), "
        "mla_up_proj (MLA's q/kv up-projections), mlp (a dense MLP), moe_act (the experts' activation), "
        "moe (the whole MoE block, its all-to-all included), shared_experts; and X-MoE's (Megatron-DeepSpeed) "
        "attn_block (--checkpoint-attention with --checkpoint-layernorm: both norms, the projections, the core "
        "and the residual, only the layer input kept) and act_fc2 (--checkpoint-intermediate: every MLP's, dense "
        "or expert, activation and down projection, only fc1's output kept); and torchtitan's per-op policy "
        "op_sac (selective_ac_option 'op', alone: each block re-runs its forward in backward but for the outputs "
        "of its attention kernel and of every other aten.mm, the first, third, ...; dense standard-attention "
        "models); read only when recompute is selective")
    recompute_layers: int = Field(
        0, ge=0, description="with recompute full, the layers of each pipeline chunk that re-run their forward, the "
        "first N (Megatron-Core --recompute-method block --recompute-num-layers N; NeMo's recompute_layers); the "
        "others keep their activations. 0: every layer")
    sequence_parallel: bool = True
    zero: int = Field(1, ge=0, le=3)
    zero_replicas: int = Field(
        1, ge=1, description="copies of each ZeRO shard (hybrid sharding): ZeRO shards a parameter's state over "
        "dp·cp / zero_replicas neighbouring ranks of its data-parallel group (an expert's over edp / "
        "zero_replicas), and the copies all-reduce their reduced shard once a step (torch fully_shard on a 2-D "
        "mesh, HSDP, with set_requires_all_reduce off until the last micro-batch; Megatron-Core "
        "--num-distributed-optimizer-instances). 1: ZeRO over the whole group")
    reshard_after_forward: bool = Field(
        True, description="with zero 3, whether a sharding unit frees its gathered parameters after a micro-batch's "
        "forward and gathers them again for its backward (torch fully_shard's reshard_after_forward); false keeps "
        "them from forward to backward: one all-gather a micro-batch instead of two, and the rank's whole share "
        "of the parameters gathered when its backward starts (FSDP's SHARD_GRAD_OP; torchtitan's "
        "fsdp_reshard_after_forward='never'). Never chosen by the search: ZeRO-2 holds no more and gathers once a "
        "step")
    grad_sync: GradSync = Field(
        "microbatch", description="with zero 3, when gradients are reduce-scattered: microbatch, in every "
        "micro-batch's backward, each rank keeping only its shard (torch fully_shard's default; torchtitan's "
        "train_step); step, once, in the last micro-batch's backward, the unsharded gradients accumulating "
        "through the step in the gradient dtype (fully_shard's set_requires_gradient_sync(is_last_microbatch), "
        "FSDP1's no_sync; FSDP2 accumulates in its reduce dtype: to_accumulated_grad_if_needed); with "
        "reshard_after_forward false the units also stay gathered from one micro-batch to the next, one "
        "all-gather a step (set_reshard_after_backward(is_last_microbatch), as torch's own gradient-accumulation "
        "test and torch.distributed.pipelining's stage pair them)")
    wgrad_accum: WgradAccum | None = Field(
        None, description="how a backward adds its weight gradients into the ones held from earlier micro-batches "
        "(ZeRO 0-1, ZeRO-3 with grad_sync step, any stage whose replication group is one rank; ZeRO-2 and "
        "ZeRO-3's per-micro-batch reduction hold only a shard): add, a separate elementwise kernel over every "
        "held gradient (autograd's AccumulateGrad; FSDP2's accumulate_unsharded_grad_if_needed), each later "
        "micro-batch reading both and writing one; experts, the routed experts' weight-gradient GEMMs add into "
        "their held gradients (Dist-MoE's inplace_wgrad_accum) and the rest as add; gemm, every weight-gradient "
        "GEMM adds in its epilogue (Megatron-Core's gradient_accumulation_fusion, torchtitan GraphTrainer's WGrad "
        "accumulation fusion), nothing apart. None: "
        "the stack's own, add on PyTorch's autograd (fsdp2, piper-train's unfused modules, native_eager, a compiled "
        "model: batch.torch_stack), gemm otherwise (Megatron-Core)")
    fsdp2: bool = Field(
        False, description="with zero 3, ZeRO-3 as torch FSDP2 (fully_shard, torchtitan's FSDP) runs it: each "
        "unit's gathered parameters copied out of the all-gather's flat buffer into the unsharded ones "
        "(split_with_sizes_copy) every gather, and its gradients copied into the reduce-scatter's buffer in the "
        "reduce dtype (_chunk_cat) every reduction, both on the compute stream (_fsdp_param_group.wait_for_unshard, "
        "foreach_reduce); and the sharded fp32 parameters are the optimizer's, with no sharded bf16 copy (mixed "
        "precision casts them as they are gathered). False: Megatron-FSDP, which gathers into and reduces from "
        "the buffers its parameters and gradients live in and keeps a sharded bf16 copy beside the fp32 master")
    a2a: A2A = Field("flat", description="flat all-to-all; halo (piper-train's hierarchical exchange); dedup "
                     "(DeepEP / HybridEP: each token crosses to a remote node once, then is forwarded to that "
                     "node's experts over the scale-up links); fused (Dist-MoE, torchtitan's DistMoE backend): "
                     "every routed row exchanged as flat does, but inside the expert GEMM kernels, whose producer "
                     "warps load the rows from the peers' symmetric memory and whose epilogue stores the outputs "
                     "into the peers' combine buffers, so each exchange runs beside the GEMM it feeds or drains "
                     "and shows only what that GEMM does not cover; routed on the GPU, so no host sync; needs "
                     "the expert-parallel group inside one scale-up (NVLink) domain")
    placement: Placement = "packed"
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    attention_kernel: AttentionKernel = Field(
        "flash", description="flash: the fused kernel the hardware spec's attention plateau measures (Transformer "
        "Engine's cuDNN kernel on Hopper and Blackwell, FlashAttention-2 on A100, CK on MI300X); fa2: "
        "FlashAttention-2, PyTorch SDPA's flash backend, which torch 2.5.1-2.10 run on Hopper (cuDNN's is opt-in "
        "there: pytorch#138522; later releases prefer it on sm90/sm100 with cuDNN > 9.15): torchtitan's and "
        "Hugging Face's runs, at the spec's efficiency.attention_fa2; eager: materialised scores (Megatron 2021/22)")
    fused_kernels: bool = Field(True, description="fused norm / SwiGLU / routing kernels (Megatron, TE); false "
                                "for eager PyTorch modules (piper-train), which save extra tensors")
    native_eager: bool = Field(
        False, description="a PyTorch-native stack's dense block run eagerly, without torch.compile (torchtitan's "
        "2024 presets for 64 A100s: norm_type rmsnorm, compile false): its RMSNorm, RoPE, repeated KV heads, SwiGLU "
        "and residual adds as separate ops on bf16 weights, priced by the bytes torchtitan's block moves "
        "(cost/eager.py NATIVE) in place of the fused passes. A dense model with standard attention in bf16 or fp16 "
        "only (the block counted), and not with fused_kernels false (piper-train's own eager modules)")
    compiled: tuple[CompilePart, ...] = Field(
        (), description="what a PyTorch-native stack runs under torch.compile (torchtitan's compile.components): "
        "model, its blocks (fused kernels, as fused_kernels prices them; under recompute module op_sac, Inductor's "
        "partitioner saves only the policy's outputs the backward reads, so the FFN's down projection's output is "
        "not kept but at tp > 1 without sequence parallelism: activations.compiled_unsaved); loss, the "
        "cross-entropy, which then keeps the LM head's logits in their own dtype and two fp32 figures a token (the "
        "max and the log-sum-exp) in place of fp32 log-probabilities, and makes their gradient in that dtype "
        "(rank_memory.logits_bytes). Not with native_eager's uncompiled block (loss alone "
        "may be), fused_kernels false (piper-train's modules) or Megatron-Core's graphs and offloading")
    cross_entropy: CrossEntropy = Field(
        "fused", description="how an uncompiled loss runs its cross-entropy over the LM head's logits: fused, "
        "Megatron-Core's vocab-parallel cross-entropy, on one fp32 copy turned into the softmax and then into the "
        "gradient in place (4 B an element kept, the gradient's dtype added in the backward); eager, torch's "
        "F.cross_entropy on an fp32 copy (torchtitan's and Hugging Face's loss uncompiled): log_softmax keeps fp32 "
        "log-probabilities, and its backward holds them beside nll_loss's and its own fp32 gradients (4 B kept, 8 "
        "added: rank_memory.logits_bytes, counted op by op in tests/test_cross_entropy.py). A compiled loss "
        "(Layout.compiled) is Inductor's whatever this says")
    expert_gemm: ExpertGemm = Field(
        "grouped", description="how the local experts' GEMMs launch: one grouped kernel (piper-train's batched "
        "matmul, CUTLASS grouped GEMM); multistream, one GEMM per expert on Transformer Engine's 4 compute streams "
        "(TE GroupedLinear's default cuBLAS path); loop, one GEMM per expert in turn (a Python loop, X-MoE)")
    fp8: Fp8 = Field(
        "none", description="GEMMs in FP8 with bf16 activations (Transformer Engine): 'current' per-tensor "
        "current scaling (Hopper and later), 'mxfp8' 1x32 block scaling (Blackwell), 'blockwise' 1x128 "
        "activation / 128x128 weight blocks (DeepSeek-V3's recipe; Hopper and later); attention, router and LM "
        "head stay in `dtype`")
    fp8_params: bool = Field(
        False, description="the GEMMs' weights kept in FP8 (Megatron's fp8_param_gather / --fp8-param-gather, "
        "Transformer Engine's fp8_model_init): no bf16 copy beside the fp32 masters, and the ZeRO gather of a "
        "tensor-scaled or blockwise weight moves 1 B; false: bf16 weights, whose FP8 copy TE caches across "
        "micro-batches (cost/memory.fp8_weight_bytes)")
    expert_probs: ExpertProbs = Field(
        "combine", description="where the routing probability scales a routed token: combine, at the combine "
        "(GShard, DeepSpeed-MoE, X-MoE, piper-train), whose weight gradient keeps each expert output; activation, "
        "inside the experts' fused activation (Megatron-Core's weighted SwiGLU/GEGLU: the combine keeps nothing)")
    cuda_graphs: tuple[CudaGraphScope, ...] = Field(
        (), description="what the runtime captures as CUDA graphs (Megatron-Core --cuda-graph-scope): attn, mlp "
        "(a dense MLP), moe (a whole MoE layer; token-dropping runs only), moe_router, moe_preprocess, "
        "full_iteration; a captured scope costs the host one launch instead of one issue per operation "
        "(cost/host.py); empty: eager")
    pipeline_split: PipelineSplit = Field(
        "balanced", description="how layers split into the pipeline's chunks: balanced, the embedding and the LM "
        "head and loss counted at their cost in layers (piper's rule); even, layers / chunks each, as Megatron-Core "
        "splits by default (the last chunk also runs the LM head and loss); account, Megatron-Core's "
        "account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split: each counts as one layer; "
        "even and account need the layers (+ 2 under account) a multiple of pp*vpp, as Megatron-Core asserts")
    a2a_overlap: bool = Field(
        False, description="each MoE all-to-all hidden behind another micro-batch's compute, forward of one "
        "paired with backward of another (Megatron-Core --overlap-moe-expert-parallel-comm; dualpipev always "
        "overlaps)")
    attention_fp8: bool = Field(
        False, description="fused attention in FP8 (Transformer Engine's fp8_dot_product_attention), at the "
        "hardware spec's efficiency.attention_fp8 speed-up over bf16 where it gives one")
    tp_comm_overlap: bool = Field(
        False, description="tensor-parallel all-gathers and reduce-scatters split into chunks and pipelined with "
        "the GEMM beside each (Megatron-Core --tp-comm-overlap: Transformer Engine's userbuffers), so they hide "
        "behind the layer's linear layers")
    a2a_sms: Optional[int] = Field(
        None, ge=1, description="compute units (SMs) an overlapped all-to-all's kernels hold while the compute "
        "beside them runs on the rest (Megatron-Core --moe-hybridep-num-sms; DeepEP's num_sms); None: the "
        "hardware spec's efficiency.overlap_comm_units")
    tp_async_dgrad: bool = Field(
        True, description="without sequence parallelism, each column-parallel linear layer's input-gradient "
        "all-reduce runs while the layer computes its weight gradient (Megatron's "
        "--async-tensor-model-parallel-allreduce, on by default since 2022 in Megatron-LM, Megatron-Core and "
        "Megatron-DeepSpeed: LinearWithGradAccumulationAndAsyncCommunication; Korthikanti et al. 2022 §6.2), "
        "so a backward all-reduce exposes only what that GEMM does not cover. False: each waits in turn (the "
        "Megatron-LM of 2021). Fused runtimes only: piper-train's tensor-parallel collectives are synchronous")
    p2p_scatter_gather: bool = Field(
        False, description="without sequence parallelism, each tensor-parallel rank sends 1/tp of a stage "
        "boundary's activation (and of its gradient) and the receiving stage all-gathers it over its "
        "tensor-parallel group, so the slower inter-node link carries 1/tp of the bytes (Megatron-LM "
        "--scatter-gather-tensors-in-pipeline, on by default before Megatron-Core; Narayanan et al. 2021 §4.1). "
        "With sequence parallelism the activation is already split; false: every tensor-parallel rank sends it "
        "whole (Megatron-Core, piper-train)")
    p2p_overlap: bool = Field(
        True, description="the interleaved schedule posts each stage-boundary receive ahead of the compute that "
        "needs it, so in its steady state the pipeline's messages run behind the other micro-batch's forward or "
        "backward and only the warm-up's and cool-down's wait (Megatron-Core's overlap_p2p_comm, on for "
        "interleaved schedules by default in Megatron-LM, Megatron-Bridge and NeMo; torch's "
        "ScheduleInterleaved1F1B, which piper-train runs). False: every message waits (the Megatron-LM of "
        "2021-22; --no-overlap-p2p-communication). The other schedules are priced waiting on each message whatever "
        "this says (Megatron-Core's non-interleaved schedule turns it off; torch's Schedule1F1B and ScheduleGPipe "
        "wait; zbv and dualpipev keep their messages in their own windows)")
    dropout: bool = Field(False, description="dropout on (adds masks to memory and elementwise time)")
    overlap_grad_reduce: bool = Field(True, description="data-parallel gradient reduction overlapped with "
                                      "the last micro-batch's backward (Megatron-Core --overlap-grad-reduce)")
    grad_dtype: Literal["fp32", "bf16"] = Field(
        "fp32", description="gradient accumulation dtype (Megatron main_grad fp32: 18 B/param with Adam)")
    optimizer_offload: float = Field(
        0.0, ge=0, le=1, description="fraction of a rank's optimizer state (fp32 master weights, Adam moments) "
        "kept in host memory and stepped there by the CPU (Megatron-Core --optimizer-cpu-offload, "
        "--optimizer-offload-fraction): every step copies those gradients to the host in fp32 and the updated "
        "weights back (cost/offload.py; the hardware spec's host section)")
    offload_layers: int = Field(
        0, ge=0, description="layers of a rank whose saved activations go to host memory in the forward and come "
        "back for the backward, behind the next layer's compute (Transformer Engine CPU offloading: Megatron-Core "
        "--cpu-offloading-num-layers, NeMo's activation_offload_layers; cost/offload.py)")
    offload_modules: tuple[OffloadModule, ...] = Field(
        (), description="modules whose saved tensors go to host memory in every layer's forward and come back "
        "before its backward (Megatron-Core --fine-grained-activation-offloading --offload-modules): attn_norm, "
        "qkv_linear, core_attn, attn_proj (with core_attn), mlp_norm, expert_fc1, moe_act "
        "(cost/activations.OFFLOAD_TERMS; cost/offload.py)")

    @property
    def edp(self) -> int:
        return self.dp * self.cp * self.tp // (self.ep * self.etp)

    @property
    def dpcp(self) -> int:
        """Ranks a dense parameter is replicated over, its gradient reduced over: dp·cp
        (Megatron-Core's data-parallel group with context parallelism)."""
        return self.dp * self.cp

    @property
    def microbatches(self) -> int:
        return self.global_batch // (self.dp * self.mbs)

    @property
    def stages(self) -> int:
        """Model chunks in the pipeline (pp · vpp)."""
        return self.pp * self.vpp

    @property
    def sp(self) -> bool:
        return self.sequence_parallel and self.tp > 1


def degrees_label(lay) -> str:
    """A layout's degrees (a Layout or its dict) as layout strings print them: "tp2 pp8 dp8 ep4",
    " cp4" after tp where sequences are split (" cp4(a2a)" where not by the p2p ring), " etp2" where
    experts are tensor-parallel."""
    g = (lambda k: lay.get(k, 1)) if isinstance(lay, dict) else (lambda k: getattr(lay, k))  # noqa: E731
    cp, etp = g("cp"), g("etp")
    how = lay.get("cp_comm", "p2p") if isinstance(lay, dict) else lay.cp_comm
    if how == "a2a+p2p":  # the hierarchy's two degrees
        a = g("cp_a2a")
        how = f"a2a{a}+p2p{cp // a}"
    cp_text = f" cp{cp}" + (f"({how})" if how != "p2p" else "") if cp > 1 else ""
    return (f"tp{g('tp')}" + cp_text + f" pp{g('pp')} dp{g('dp')} ep{g('ep')}"
            + (f" etp{etp}" if etp > 1 else ""))


def offload_label(lay) -> str:
    """What a layout (a Layout or its dict) offloads to the host, as layout strings print it:
    " offload(opt 1, 40 layers, expert_fc1+moe_act)", or "" where it offloads nothing."""
    g = (lambda k: lay.get(k, 0)) if isinstance(lay, dict) else (lambda k: getattr(lay, k))  # noqa: E731
    mods = g("offload_modules") or ()
    parts = ([f"opt {g('optimizer_offload'):g}"] if g("optimizer_offload") else []) + \
        ([f"{g('offload_layers')} layers"] if g("offload_layers") else []) + (["+".join(mods)] if mods else [])
    return f" offload({', '.join(parts)})" if parts else ""


def recompute_label(recompute: str, modules, layers: int = 0) -> str:
    """A recompute choice as layout strings print it: the mode, with the module set where it is
    selective and not the default, or the layers a chunk re-runs where full recompute re-runs
    some of them (parentheses: rich tables read brackets as markup)."""
    mods = tuple(modules or ("core_attn",))
    if recompute == "full" and layers:
        return f"full({layers} layers)"
    return recompute + (f"({','.join(mods)})" if recompute == "selective" and mods != ("core_attn",) else "")


def check_stack(expert_probs: str, fused_kernels: bool, native_eager: bool = False, dtype: str = "bf16",
                megatron_features: bool = False, compiled=()) -> None:
    """Raise LayoutError for a runtime pairing that does not exist: probabilities applied in the
    experts' activation are a fused stack's (Megatron-Core); eager modules scale at the combine;
    a PyTorch-native stack's eager block (native_eager) is another stack than piper-train's
    (fused_kernels false), counted in bf16, with none of Megatron-Core's CUDA-graph scopes or
    module offloading (`megatron_features`: any asked for); what it compiles (`compiled`:
    Layout.compiled) is neither piper-train's (which compiles nothing) nor beside those features,
    and its compiled model is not the eager block."""
    if len(set(compiled)) < len(compiled) or not set(compiled) <= set(get_args(CompilePart)):
        raise LayoutError("compiled: model and loss, each once", f"got {', '.join(compiled)}")
    if compiled and (not fused_kernels or megatron_features):
        raise LayoutError("compiled with fused_kernels true and no cuda_graphs or offload_modules",
                          f"compiled {'+'.join(compiled)} is a PyTorch-native stack's torch.compile; fused_kernels "
                          "false is piper-train's eager modules, and Megatron-Core's graph scopes and module "
                          "offloading are not that stack's")
    if "model" in compiled and native_eager:
        raise LayoutError("compiled model without native_eager", "native_eager is the block run without "
                          "torch.compile; a compiled model runs Inductor's fused kernels (compiled loss alone may "
                          "sit beside the eager block)")
    if expert_probs == "activation" and not fused_kernels:
        raise LayoutError("expert_probs activation needs fused kernels", "eager modules (fused_kernels false, "
                          "piper-train) scale the expert outputs at the combine; use expert_probs combine")
    if native_eager and not fused_kernels:
        raise LayoutError("native_eager with fused_kernels true", "native_eager is a PyTorch-native stack's eager "
                          "block (torchtitan's); fused_kernels false is piper-train's own eager modules, priced as "
                          "such: state one of them")
    if native_eager and dtype == "fp32":
        raise LayoutError("native_eager in bf16 or fp16", "the native eager block's bytes were counted on bf16 "
                          "weights (FSDP2's param_dtype), where its norm and RoPE cast to fp32 and back")
    if native_eager and megatron_features:
        raise LayoutError("native_eager without Megatron-Core's cuda_graphs and offload_modules", "a PyTorch-native "
                          "stack's eager block captures no Megatron-Core graph scopes and offloads no modules")


def check_fsdp2(fsdp2: bool, zeros) -> None:
    """Raise LayoutError where torch FSDP2's ZeRO-3 is asked of no ZeRO-3 stage (`zeros`: a layout's
    stage, or the stages a search tries)."""
    if fsdp2 and 3 not in zeros:
        raise LayoutError("fsdp2 with zero 3", f"zero {', '.join(map(str, zeros))} gathers no sharded parameters a "
                          "micro-batch; fsdp2 prices torch FSDP2's ZeRO-3 (its copies around the gathers and "
                          "reductions)")


def check_grad_sync(grad_sync: str, zeros) -> None:
    """Raise LayoutError where Layout.grad_sync is no GradSync, or reducing once a step is asked of no
    ZeRO-3 stage (`zeros`: a layout's stage, or the stages a search tries): the others reduce as they
    always do, ZeRO-2 every micro-batch's gradients into its shard, ZeRO-0 and 1 once a step already."""
    if grad_sync not in get_args(GradSync):
        raise LayoutError("grad_sync microbatch or step", f"got {grad_sync!r}")
    if grad_sync == "step" and 3 not in zeros:
        raise LayoutError("grad_sync step with zero 3", f"zero {', '.join(map(str, zeros))} reduces as it always "
                          "does (ZeRO-2 every micro-batch's gradients into its shard, keeping no whole gradients; "
                          "ZeRO-0 and 1 once a step already)")


def absent_module_refusal(model, modules) -> tuple[str, str] | None:
    """(rule, detail) where selective recompute names a part `model` does not have (so it would
    re-run nothing): mla_up_proj without MLA, moe and moe_act without MoE layers, shared_experts
    without shared experts, mlp without a dense FFN layer (Megatron-Core's mlp is the dense MLP;
    a MoE layer's is moe). None where every part is there."""
    has = {"mla_up_proj": model.mla is not None, "moe": model.moe is not None, "moe_act": model.moe is not None,
           "shared_experts": bool(model.moe and model.moe.shared_experts),
           "mlp": model.num_dense_layers > 0 and model.ffn_size > 0}
    absent = [x for x in modules if not has.get(x, True)]
    if absent:
        return "recompute_modules", f"{absent[0]} names a part {model.name} does not have"
    return None


def op_sac_refusal(model, modules) -> tuple[str, str] | None:
    """(rule, detail) where torchtitan's per-op policy (recompute module op_sac) cannot be priced as
    asked: beside other modules (it is a whole block's policy), or on a model whose block's matmuls
    it counts otherwise (MoE layers: a router and grouped expert GEMMs; MLA's projections). None
    where it can."""
    if "op_sac" not in modules:
        return None
    if len(modules) > 1:
        return ("recompute_modules op_sac alone", f"got {', '.join(modules)}: torchtitan's per-op policy decides "
                "every op of the block; it takes no other module")
    if model is not None and (model.moe is not None or model.mla is not None or model.linear_bias):
        what = ("MoE layers" if model.moe is not None else "multi-latent attention" if model.mla is not None
                else "linear biases (its linears run as aten.addmm, which the list does not keep)")
        return ("recompute_modules op_sac needs a dense model with standard attention", f"{model.name} has {what}, "
                "whose matmuls the policy's every-other count is not priced for")
    return None


def op_sac_stack_refusal(modules, attention_kernel: str, fused_kernels: bool, cp: int) -> tuple[str, str] | None:
    """(rule, detail) where torchtitan's per-op policy is asked beside other modules (op_sac_refusal)
    or runs on a stack it is not priced for: materialised attention scores (no SDPA kernel on the
    list), piper-train's fp32-residual modules, or context parallelism (whose exchange the policy's
    replay is not priced for). None where it can."""
    if "op_sac" not in modules:
        return None
    alone = op_sac_refusal(None, modules)
    if alone:
        return alone
    if attention_kernel == "eager" or not fused_kernels or cp > 1:
        return ("recompute_modules op_sac with an SDPA kernel, bf16 modules and cp 1", "torchtitan's per-op policy is "
                f"priced on its SDPA attention and block at cp 1 (attention {attention_kernel}, fused_kernels "
                f"{str(fused_kernels).lower()}, cp {cp})")
    return None


def wgrad_accum_refusal(wgrad_accum: str | None, num_experts: int, name: str) -> tuple[str, str] | None:
    """(rule, detail) where wgrad_accum experts is asked of a model with no routed experts, whose
    weight gradients it would leave all to the separate add (priced as add): a setting that
    changes nothing is refused rather than accepted. None where it means something."""
    if wgrad_accum == "experts" and not num_experts:
        return ("wgrad_accum experts needs routed experts", f"{name} has none; every weight gradient there is "
                "added by a separate kernel (add) or in its GEMM (gemm)")
    return None


def native_eager_refusal(model) -> tuple[str, str] | None:
    """(rule, detail) where `model` has a block the native eager count does not hold (None where it
    has none): benchmarks/native_block.py is torchtitan's dense Llama block, so MoE layers,
    multi-latent attention, LayerNorm, a GELU FFN, biases, YaRN or windowed attention and learned
    positions are not it."""
    lacks = [("MoE layers", model.moe is not None), ("multi-latent attention", model.mla is not None),
             ("LayerNorm", model.norm != "rmsnorm"), ("a GELU FFN", not model.ffn_gated),
             ("linear biases", model.linear_bias), ("YaRN RoPE", model.rope_scaling is not None),
             ("windowed or chunked attention", bool(model.sliding_window or model.attention_chunk)),
             ("learned positions", model.learned_positions)]
    has = [what for what, present in lacks if present]
    if not has:
        return None
    return ("native_eager needs a Llama-style dense model", f"{model.name} has {', '.join(has)}; the native eager "
            "block counted (torchtitan's dense Llama block: RMSNorm, RoPE, SwiGLU, no biases; "
            "benchmarks/native_block.py) has none of them")


def check_fp8_params(fp8_params: bool, fp8: str, attention_fp8: bool = False) -> None:
    """Raise LayoutError for FP8 weights, or FP8 attention, without an FP8 recipe: both are parts of
    the recipe (Transformer Engine's fp8_dpa is a recipe field, which Megatron-Core's
    --fp8-dot-product-attention sets only when it builds a recipe for --fp8-format)."""
    if fp8_params and fp8 == "none":
        raise LayoutError("fp8_params with an fp8 recipe", "FP8 weights are quantised by the layout's FP8 recipe "
                          "(fp8 current, mxfp8 or blockwise); with fp8 none the weights stay in the dtype")
    if attention_fp8 and fp8 == "none":
        raise LayoutError("attention_fp8 with an fp8 recipe", "FP8 attention runs inside the layout's FP8 recipe "
                          "(fp8 current, mxfp8 or blockwise); with fp8 none it runs in the dtype")


def check_cuda_graphs(cuda_graphs) -> None:
    """Raise LayoutError for a graph scope the planner's dropless MoE cannot run: Megatron-Core
    captures a whole MoE layer only where its shapes are fixed ("moe cuda graph is only supported
    with drop-padding MoE", arguments.py; its sync-free HybridEP alternative runs a rank capacity
    too), and the planner prices every routed row (no capacity factor)."""
    if "moe" in cuda_graphs:
        raise LayoutError("cuda_graphs without moe", "a whole MoE layer is captured only under token dropping "
                          "(drop-padding to a capacity), which the planner does not price; moe_router and "
                          "moe_preprocess capture a dropless layer's router")



def check_degrees(lay: Layout, num_experts: int = 0, expert_ffn: int = 0) -> None:
    """Raise LayoutError where the degrees cannot be one run: tp·cp·pp·dp GPUs, ep·etp dividing
    dp·cp·tp, ep the experts, etp the expert width. check_layout's first rules; validate holds published runs to these alone,
    since some hold layouts the planner's other rules refuse."""
    named = {"tp": lay.tp, "cp": lay.cp, "pp": lay.pp, "dp": lay.dp}
    if lay.cp == 1:  # named where it is used
        del named["cp"]
    if math.prod(named.values()) != lay.gpus:
        raise LayoutError(f"{'*'.join(named)} == gpus", f"{'*'.join(map(str, named.values()))} = "
                          f"{math.prod(named.values())}, not {lay.gpus}")
    why = cp_groups_refusal(lay.cp, lay.cp_comm, lay.cp_a2a)
    if why:
        raise LayoutError(*why)
    stage = lay.dp * lay.cp * lay.tp
    group = "dp*tp" if lay.cp == 1 else "dp*cp*tp"
    if stage % (lay.ep * lay.etp):
        if lay.etp == 1:
            raise LayoutError(f"ep divides {group}", f"ep={lay.ep} does not divide {group}={stage}")
        raise LayoutError(f"ep*etp divides {group}", f"ep*etp={lay.ep * lay.etp} does not divide {group}={stage}")
    if num_experts and num_experts % lay.ep:
        raise LayoutError("ep divides experts", f"ep={lay.ep} does not divide {num_experts} experts")
    if not num_experts and lay.ep > 1:
        raise LayoutError("ep divides experts", f"ep={lay.ep} but the model has no experts")
    if not num_experts and lay.etp > 1:
        raise LayoutError("etp == 1 without experts", f"etp={lay.etp} but the model has no experts")
    why = wgrad_accum_refusal(lay.wgrad_accum, num_experts, "the model")
    if why:
        raise LayoutError(*why)
    if expert_ffn and expert_ffn % lay.etp:
        raise LayoutError("etp divides the expert width", f"etp={lay.etp} does not divide expert_ffn_size={expert_ffn}")


def check_replicas(lay: Layout) -> None:
    """Raise LayoutError where Layout.zero_replicas cannot split the data-parallel groups: it
    needs a ZeRO stage to replicate, must divide dp·cp and the expert-data-parallel group, and
    must leave a shard of two ranks or more (a shard of one rank is zero 0)."""
    r = lay.zero_replicas
    if r == 1:
        return
    group = "dp" if lay.cp == 1 else "dp*cp"
    if lay.zero == 0:
        raise LayoutError("zero_replicas == 1 with zero 0", f"zero_replicas={r} copies ZeRO shards, and zero 0 shards "
                          "nothing; use zero 1, 2 or 3")
    if lay.dpcp % r or lay.dpcp // r < 2:
        raise LayoutError(f"zero_replicas divides {group} into shards of 2 ranks or more",
                          f"zero_replicas={r} for {group}={lay.dpcp}")
    if lay.edp % r:
        raise LayoutError("zero_replicas divides the expert-data-parallel group",
                          f"zero_replicas={r} does not divide edp={lay.edp} (dp*cp*tp / (ep*etp))")


def check_batch(lay: Layout) -> None:
    """Raise LayoutError unless the global batch is whole micro-batches on every replica."""
    if lay.global_batch % (lay.dp * lay.mbs):
        raise LayoutError("global_batch divisible by dp*mbs",
                          f"global batch {lay.global_batch} is not a multiple of dp*mbs = {lay.dp * lay.mbs}")


def attention_conflict(kernel: str, fp8: bool) -> str:
    """Why FP8 attention cannot run beside the attention `kernel` ("" where it can): FP8 attention
    is Transformer Engine's fused kernel (fp8_dot_product_attention), the spec's flash one."""
    return f"FP8 attention is Transformer Engine's fused kernel (fp8_dot_product_attention), not attention " \
        f"{kernel}" if fp8 and kernel != "flash" else ""


def check_layout(lay: Layout, num_layers: int, num_experts: int = 0, gpus_per_node: Optional[int] = None,
                 expert_ffn: int = 0) -> None:
    """Raise LayoutError naming the first broken constraint."""
    check_degrees(lay, num_experts, expert_ffn)
    slots = layer_slots(num_layers, lay.pipeline_split)
    extra = slots - num_layers
    if lay.stages > slots:
        raise LayoutError("pp*vpp <= layers" + f" + {extra}" * bool(extra),
                          f"{lay.stages} pipeline chunks for {num_layers} layers" + f" and {extra} slots" * bool(extra))
    if split_refused(lay.pipeline_split, num_layers, lay.stages):
        raise LayoutError(f"pipeline_split {lay.pipeline_split} needs whole layers a chunk",
                          f"{slots} layer slots do not split into pp={lay.pp} x vpp={lay.vpp} equal chunks "
                          "(Megatron-Core asserts num_layers % pp == 0 and its layers a stage % vpp == 0); "
                          "--pipeline-split balanced takes any count")
    check_batch(lay)
    if lay.cp > 1 and lay.seq % (2 * lay.cp):
        raise LayoutError("seq divisible by 2*cp", f"seq {lay.seq} does not split into {2 * lay.cp} chunks "
                          "(context parallelism balances causal attention over 2·cp chunks)")
    if lay.cp == 1 and lay.cp_comm != "p2p":
        raise LayoutError("cp_comm needs cp > 1", f"cp_comm {lay.cp_comm} with whole sequences (cp=1) moves nothing; "
                          "state cp > 1, or leave cp_comm at p2p")
    if lay.cp > 1 and lay.attention_kernel == "eager":
        raise LayoutError("cp > 1 needs fused attention", "context parallelism runs fused attention kernels over "
                          "its chunks (Transformer Engine); use attention flash or fa2")
    why = attention_conflict(lay.attention_kernel, lay.attention_fp8)
    if why:
        raise LayoutError("attention_fp8 needs attention flash", why)
    m = lay.microbatches
    if lay.pp == 1 and (lay.schedule != "1f1b" or lay.vpp != 1):
        raise LayoutError("pp=1 runs no pipeline schedule", f"schedule {lay.schedule} vpp={lay.vpp} with one stage: "
                          "state 1f1b (vpp 1); Megatron-Core's overlap of one micro-batch's all-to-all with "
                          "another's compute without pipelining is a2a_overlap")
    if lay.schedule in ("zbv", "dualpipev") and lay.vpp != 2:
        raise LayoutError(f"{lay.schedule} needs vpp=2", f"got vpp={lay.vpp} (V placement: two chunks per rank)")
    if lay.schedule in ("gpipe", "1f1b") and lay.vpp != 1:
        raise LayoutError(f"{lay.schedule} needs vpp=1", f"got vpp={lay.vpp}")
    if lay.schedule == "interleaved" and lay.vpp < 2:
        raise LayoutError("interleaved needs vpp>=2", f"got vpp={lay.vpp}")
    if lay.schedule in ("1f1b", "interleaved", "zbv", "dualpipev") and lay.pp > 1 and m < lay.pp:
        raise LayoutError(f"microbatches >= pp for {lay.schedule}", f"{m} micro-batches for {lay.pp} stages")
    if lay.schedule == "interleaved" and m % lay.pp:
        raise LayoutError("interleaved needs microbatches % pp == 0", f"{m} micro-batches, pp={lay.pp}")
    if lay.schedule == "dualpipev" and m < 2 * lay.pp:
        raise LayoutError("dualpipev needs microbatches >= 2*pp", f"{m} micro-batches, pp={lay.pp}")
    if lay.schedule == "zbv" and m < 2 * lay.pp - 1:
        raise LayoutError("zbv needs microbatches >= 2*pp-1", f"{m} micro-batches, pp={lay.pp}: rank 0 waits "
                          "for the first micro-batch to pass all 2*pp-1 chunks before ZB-V's steady state, and its "
                          "closed form (arXiv 2401.10241 Table 3) prices none of that wait")
    if lay.a2a_overlap and lay.pp > 1 and lay.schedule != "interleaved":
        raise LayoutError("a2a_overlap with pp > 1 needs the interleaved schedule",
                          f"schedule {lay.schedule}: Megatron-Core's EP overlap pairs one micro-batch's forward with "
                          "another's backward in its interleaved 1F1B only (virtual_pipeline_model_parallel_size "
                          "must be set when pipeline_model_parallel_size > 1)")
    why = fused_a2a_refusal(lay.a2a, lay.a2a_overlap, lay.etp, lay.schedule, lay.fp8, lay.expert_gemm)
    if why:
        raise LayoutError(*why)
    if lay.zero == 3 and lay.pp > 1:
        raise LayoutError("zero 3 with pp == 1", "a pipeline stage under FSDP keeps its parameters gathered across "
                          "its micro-batches and reduces its gradients once a step (torch.distributed.pipelining's "
                          "stage turns resharding and gradient sync off until the last backward): that is zero 1's "
                          "traffic and memory, so state zero 1")
    check_replicas(lay)
    check_fsdp2(lay.fsdp2, (lay.zero,))
    check_grad_sync(lay.grad_sync, (lay.zero,))
    if not lay.reshard_after_forward and lay.zero != 3:
        raise LayoutError("reshard_after_forward false with zero 3",
                          f"zero {lay.zero} keeps no sharded parameters to gather; reshard_after_forward is ZeRO-3's")
    check_offload(lay, num_layers)
    if lay.recompute_layers and lay.recompute != "full":
        raise LayoutError("recompute_layers with recompute full", f"recompute_layers={lay.recompute_layers} chooses "
                          f"the layers full recompute re-runs; recompute is {lay.recompute!r}")
    most = recompute_layers_limit(num_layers, lay.stages, lay.pipeline_split)
    if lay.recompute_layers > most:
        raise LayoutError("recompute_layers <= the layers of a chunk", f"recompute_layers={lay.recompute_layers}, "
                          f"but no chunk of {num_layers} layers over {lay.stages} chunks holds more than {most}")
    check_stack(lay.expert_probs, lay.fused_kernels, lay.native_eager, lay.dtype,
                bool(lay.cuda_graphs or lay.offload_modules), lay.compiled)
    why = (op_sac_stack_refusal(lay.recompute_modules, lay.attention_kernel, lay.fused_kernels, lay.cp)
           if lay.recompute == "selective" else None)
    if why:
        raise LayoutError(*why)
    check_offload_modules(lay.offload_modules, lay.cuda_graphs, lay.fused_kernels)
    check_cuda_graphs(lay.cuda_graphs)
    check_fp8_params(lay.fp8_params, lay.fp8, lay.attention_fp8)


def layer_slots(num_layers: int, split: str) -> int:
    """The slots a pipeline split fills with layers: each layer, and under "account" the embedding
    and the loss one each (Megatron-Core's account_for_embedding_in_pipeline_split and
    account_for_loss_in_pipeline_split)."""
    return num_layers + 2 * (split == "account")


def split_refused(split: str, num_layers: int, chunks):
    """Where Megatron-Core refuses an even split (split "even", or "account", which counts the
    embedding and the loss as a layer each): its layer slots must fill pp·vpp chunks equally
    (transformer_block.get_num_layers_to_build asserts slots % pp == 0 and slots / pp % vpp == 0).
    chunks: pp·vpp, an int or an array of them."""
    return (split in ("even", "account")) & (layer_slots(num_layers, split) % chunks != 0)


def tp_splits_heads(num_heads: int, kv_heads: int, tp: int) -> bool:
    """Whether tensor parallelism of degree tp splits the query heads evenly and the kv heads
    evenly or replicates them (tp a multiple of them): the search enumerates only these."""
    return num_heads % tp == 0 and (kv_heads % tp == 0 or tp % kv_heads == 0)


def check_for(lay: Layout, model, hw) -> None:
    """check_layout with `model`'s layers and experts, plus the rules that read the model's
    heads, blocks and the device `hw`: tp splits the heads (tp_splits_heads), the way context
    parallelism moves keys suits its attention (cp_comm_refusal), a native eager block is one
    counted (native_eager_refusal), and an overlapped all-to-all holds fewer compute units than
    the device has (Layout.a2a_sms)."""
    moe = model.moe
    check_layout(lay, model.num_layers, moe.num_experts if moe else 0, expert_ffn=moe.expert_ffn_size if moe else 0)
    kv = model.kv_heads
    if not tp_splits_heads(model.num_heads, kv, lay.tp):
        raise LayoutError("tp divides the attention heads", f"tp={lay.tp} for {model.num_heads} query heads and {kv} "
                          "kv heads: tp must divide the query heads, and divide the kv heads or be a multiple of them")
    if lay.sp and (lay.seq // lay.cp) % lay.tp:  # Megatron-Core and piper-train split it over tp
        raise LayoutError("sequence parallelism needs (seq/cp) % tp == 0",
                          f"seq {lay.seq} over cp={lay.cp} does not split into tp={lay.tp} equal parts")
    why = cp_comm_refusal(model, lay.tp, lay.cp, lay.cp_comm, lay.attention_fp8, lay.cp_a2a)
    if why:
        raise LayoutError(*why)
    why = native_eager_refusal(model) if lay.native_eager else None
    why = why or (op_sac_refusal(model, lay.recompute_modules) if lay.recompute == "selective" else None)
    if why:
        raise LayoutError(*why)
    check_a2a_sms(lay.a2a_sms, hw)
    if why := fp8_hw_refusal(lay.fp8, hw):
        raise LayoutError(*why)
    if lay.a2a == "fused" and lay.ep > 1:
        why = fused_hw_refusal(model, hw)
        if why:
            raise LayoutError(*why)
        from .cost.comm import in_scaleup  # the domains a group's ranks fall in are the cost model's
        if not in_scaleup(hw, lay.ep, lay.etp if lay.placement == "packed" else lay.edp * lay.etp, lay.gpus):
            raise LayoutError("a2a fused needs the expert-parallel group inside one scale-up domain",
                              f"ep={lay.ep} ({lay.placement}) on {hw.name} reaches ranks beyond the "
                              f"{hw.topology[hw.scaleup_level].name} domain: a fused exchange loads and stores "
                              "its peers' memory directly (Dist-MoE's symmetric buffers), which only the "
                              "scale-up links reach; use flat, halo or dedup")


def fused_a2a_refusal(a2a: str, a2a_overlap: bool, etp: int, schedule: str = "1f1b", fp8: str = "none",
                      expert_gemm: str = "grouped") -> tuple[str, str] | None:
    """Why a fused exchange (Layout.a2a fused: Dist-MoE) cannot run beside these settings, or None:
    its kernels already overlap it with the experts' own GEMMs (Megatron-Core's EP overlap and
    DualPipeV pair micro-batches around separate exchanges); they exchange whole rows for whole
    experts (no expert tensor parallelism's all-gather after the dispatch); they compute in bf16
    or MXFP8 (dist_moe README, "Supported modes"), each as one grouped kernel."""
    if a2a != "fused":
        return None
    if a2a_overlap or schedule == "dualpipev":
        return ("a2a fused without a2a_overlap or dualpipev", "a fused exchange already runs beside its own "
                "layer's expert GEMMs; Megatron-Core's EP overlap and DualPipeV pair separate all-to-alls with "
                "another micro-batch")
    if etp > 1:
        return ("a2a fused needs etp 1", f"etp={etp}: the fused kernels run whole experts on each rank "
                "(Dist-MoE's W13 and W2 are [local experts, ...]); no expert tensor parallelism")
    if fp8 not in ("none", "mxfp8"):
        return ("a2a fused with fp8 none or mxfp8", f"fp8 {fp8}: Dist-MoE trains its experts in bf16 or MXFP8")
    if expert_gemm != "grouped":
        return ("a2a fused with expert_gemm grouped", f"expert_gemm {expert_gemm}: Dist-MoE runs a rank's "
                "experts as one distributed grouped GEMM")
    return None


def fp8_hw_refusal(fp8: str, hw) -> tuple[str, str] | None:
    """Why `hw` cannot run the FP8 recipe, or None: MXFP8's block-scaled GEMMs need NVIDIA compute
    capability 10 or later (Transformer Engine check_mxfp8_support: "Device compute capability 10.0
    or higher required for MXFP8 execution"), or AMD gfx950 or later (ROCm Transformer Engine's
    check_mxfp8_support: "Device compute capability gfx950 or higher required for MXFP8 execution").
    A device that states neither is not judged."""
    if fp8 != "mxfp8":
        return None
    acc = hw.accelerator
    cc, gfx = acc.compute_capability, acc.gfx_arch
    if cc is not None and cc < 10:
        return ("fp8 mxfp8 needs compute capability 10 or later", f"{hw.name}'s {acc.name} is compute "
                f"capability {cc:g}: Transformer Engine runs MXFP8 on Blackwell and later; use fp8 current or "
                "blockwise")
    if gfx is not None and int(gfx[3:], 16) < 0x950:  # gfx90a < gfx942 < gfx950, read as hexadecimal
        return ("fp8 mxfp8 needs gfx950 or later", f"{hw.name}'s {acc.name} is {gfx}: ROCm's Transformer "
                "Engine runs MXFP8 from gfx950 (MI355X); use fp8 current or blockwise")
    return None


def fused_hw_refusal(model, hw) -> tuple[str, str] | None:
    """Why Dist-MoE's kernels (Layout.a2a fused) cannot run on `hw` or `model`'s experts, or None: they
    are CuTe DSL kernels for NVIDIA compute capability 10 and later ("NVIDIA SM100 or newer", dist_moe
    README; tcgen05 MMAs into tensor memory), over SwiGLU experts without biases (its W13 is gate and
    up, its fused activation SwiGLU or its clamped form)."""
    cc = hw.accelerator.compute_capability
    if cc is None or cc < 10:
        return ("a2a fused needs compute capability 10 or later", f"{hw.name}'s {hw.accelerator.name} "
                + (f"is compute capability {cc:g}" if cc is not None else "is no NVIDIA GPU")
                + ": Dist-MoE's kernels run on NVIDIA SM100 and newer only")
    moe = model.moe
    if moe is not None and (not moe.gated or moe.expert_bias):
        return ("a2a fused needs gated experts without biases", f"{model.name}'s experts are "
                + ("not gated" if not moe.gated else "biased") + ": Dist-MoE runs SwiGLU experts, no biases")
    return None


def cp_groups_refusal(cp: int, cp_comm: str, cp_a2a: int) -> tuple[str, str] | None:
    """(rule, detail) where cp_a2a does not make a2a+p2p's two levels (None where it does, or is 1
    under another way): all-to-all groups of cp_a2a ranks and a ring of cp/cp_a2a groups, each more
    than one. Transformer Engine runs [1, cp] as p2p and [cp, 1] as a2a: stated so, they are."""
    if (cp_comm == "a2a+p2p") == (cp_a2a > 1) and not cp % cp_a2a and not cp_a2a == cp > 1:
        return None
    return ("cp_comm a2a+p2p needs 1 < cp_a2a < cp, dividing cp", f"cp={cp} cp_comm {cp_comm} cp_a2a={cp_a2a}: the "
            "hierarchy's all-to-all groups hold cp_a2a ranks and its ring cp/cp_a2a groups, each more than one (at "
            "either end it is a2a or p2p)")


def cp_comm_refusal(model, tp: int, cp: int, cp_comm: str, attention_fp8: bool = False,
                    cp_a2a: int = 1) -> tuple[str, str] | None:
    """(rule, detail) where Transformer Engine's context parallelism cannot run `cp_comm` over
    cp ranks for `model` at tensor-parallel degree tp (None where it can; context_parallel.py):
    a sliding window only under all_gather or a2a (its dispatcher: "The context parallel running
    configs cannot support sliding window attention"), and chunked local attention (Llama 4's) only
    under a2a, whose one kernel runs the layer's own mask over the whole sequence (the ring and the
    gather build causal masks, the gather with an optional window, for their chunks); query-key
    heads wider than the value heads (multi-latent attention) only under p2p ("MLA CP currently
    only support KV P2P", a2a+p2p's ring included); a2a hands each rank heads/cp of its tp share of
    the query heads and of the kv heads (one where tp replicates them): "The number of attention
    heads needs to be divisible by CP size", and a2a+p2p heads/cp_a2a; FP8 attention
    (`attention_fp8`) not under all_gather, whose kernels take no FP8 arguments."""
    if cp <= 1:
        return None
    if why := cp_groups_refusal(cp, cp_comm, cp_a2a):
        return why
    if model.sliding_window is not None and cp_comm in ("p2p", "a2a+p2p"):
        return ("local attention under cp > 1 needs cp_comm all_gather or a2a",
                f"sliding_window layers over cp={cp}: Transformer Engine runs sliding windows under all_gather or "
                f"a2a context parallelism only, not under {cp_comm}")
    if model.attention_chunk is not None and cp_comm != "a2a":
        return ("chunked attention under cp > 1 needs cp_comm a2a",
                f"attention_chunk layers over cp={cp} under cp_comm {cp_comm}: Transformer Engine's ring and gather "
                "build causal (or windowed) masks for their chunks; a2a runs the layer's own mask over the whole "
                "sequence")
    dqk, dv = model.qk_v_dims
    if dqk != dv and cp_comm not in ("p2p", "a2a+p2p"):
        return ("query-key heads wider than value heads need cp_comm p2p or a2a+p2p",
                f"heads of {dqk} query-key and {dv} value channels (multi-latent attention) under cp_comm {cp_comm}: "
                "Transformer Engine runs them under the p2p ring (or a2a+p2p) only")
    if attention_fp8 and cp_comm == "all_gather":
        return ("attention_fp8 needs cp_comm other than all_gather", "Transformer Engine's all-gather context "
                "parallelism (AttnFuncWithCPAndKVAllGather) runs its kernels in bf16: no FP8 attention")
    if cp_comm in ("a2a", "a2a+p2p"):
        q = model.num_heads // tp
        kv = q if dqk != dv else max(model.kv_heads // tp, 1)  # MLA exchanges a K and V head per query head
        n, name = (cp, "cp") if cp_comm == "a2a" else (cp_a2a, "cp_a2a")
        if q % n or kv % n:
            return (f"cp_comm {cp_comm} needs heads a tp rank divisible by {name}",
                    f"{q} query and {kv} kv heads a tp rank (tp={tp}) do not split over {name}={n}: use "
                    + ("all_gather or p2p" if cp_comm == "a2a" else "a smaller cp_a2a, or p2p"))
    return None


def check_a2a_sms(a2a_sms: Optional[int], hw) -> None:
    """Raise LayoutError where an overlapped all-to-all would hold every compute unit of `hw`."""
    units = hw.accelerator.compute_units
    if a2a_sms is not None and a2a_sms >= units:
        raise LayoutError("a2a_sms < the device's compute units", f"a2a_sms={a2a_sms} of the {units} the device "
                          "has would leave no compute beside the hidden all-to-all")


def recompute_layers_limit(num_layers: int, chunks, split: str = "balanced"):
    """The most layers full recompute can re-run in each pipeline chunk (ints or arrays): the
    largest chunk `chunks` chunks of `num_layers` layers can hold, the others one layer slot each
    (layer_slots: under `split` account the embedding and the loss fill a slot each, so two chunks
    may hold no layer; no chunk holds more layers than the model has)."""
    most = layer_slots(num_layers, split) - chunks + 1
    return (most + num_layers - abs(most - num_layers)) // 2  # min(most, num_layers), for ints and arrays


class RankCoord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    rank: int
    node: int
    local: int
    pp: int
    dp: int
    tp: int
    ep: int
    edp: int
    etp: int = 0
    cp: int = 0


def rank_indices(lay: Layout) -> dict:
    """Every global rank's coordinates as arrays indexed by rank (pp, dp, tp, cp, ep, edp, etp), and
    `ep_group`, one id per EP group (a stage's expert-dp and etp index): the one place the rank order
    is written. Megatron's "tp-cp-ep-dp-pp" order: tp fastest, then cp, then dp. An expert's etp
    shards are consecutive ranks; packed: an EP group is ep consecutive such groups of the stage
    (fastest levels first); spread: an EP group strides across the stage (one etp group per edp
    block)."""
    import numpy as np

    r = np.arange(lay.gpus)
    stage, w = np.divmod(r, lay.dp * lay.cp * lay.tp)
    g, etp_i = np.divmod(w, lay.etp)
    if lay.placement == "packed":
        edp_i, ep_i = np.divmod(g, lay.ep)
    else:
        ep_i, edp_i = np.divmod(g, lay.edp)
    return dict(pp=stage, dp=w // (lay.tp * lay.cp), tp=w % lay.tp, cp=w // lay.tp % lay.cp, ep=ep_i, edp=edp_i,
                etp=etp_i, ep_group=(stage * lay.edp + edp_i) * lay.etp + etp_i)


def rank_coords(lay: Layout, gpus_per_node: int) -> list[RankCoord]:
    """Global rank -> (node, local index, pp, dp, tp, ep, edp, etp, cp), in rank_indices' order."""
    ix = {k: v.tolist() for k, v in rank_indices(lay).items() if k != "ep_group"}
    return [RankCoord(rank=r, node=r // gpus_per_node, local=r % gpus_per_node, **{k: v[r] for k, v in ix.items()})
            for r in range(lay.gpus)]
