"""The command-line options that say how the training stack runs what a layout lays out (its
kernels, FP8, overlaps, FSDP), shared by estimate, search and sweep: the planner prices each."""
from __future__ import annotations

import click

from .clitypes import POSITIVE

# how the training stack runs its kernels: the planner prices each (estimate and search alike)
STACK_OPTIONS = [
        click.option("--fsdp2/--no-fsdp2", default=False, show_default=True,
                     help="with --zero 3: ZeRO-3 as torch FSDP2 runs it (torchtitan), each gather's parameters "
                     "copied out of its flat buffer and each reduction's gradients copied into the reduce-scatter's, "
                     "on the compute stream, and no sharded bf16 copy of the weights; without: Megatron-FSDP"),
        click.option("--grad-sync", type=click.Choice(["microbatch", "step"]), default="microbatch",
                     show_default=True, help="with --zero 3: reduce-scatter the gradients in every micro-batch's "
                     "backward (torch fully_shard's default, torchtitan), or once a step, the unsharded gradients "
                     "accumulating in --grad-dtype until the last backward (set_requires_gradient_sync(is_last))"),
        click.option("--wgrad-accum", type=click.Choice(["add", "experts", "gemm"]), default=None,
                     help="how a backward adds its weight gradients into those held from earlier micro-batches "
                     "(ZeRO 0-1, and ZeRO-3 under --grad-sync step): add, a separate kernel over each (torch's "
                     "autograd); experts, the routed experts' GEMMs add into theirs (Dist-MoE's inplace_wgrad_accum), "
                     "the rest as add; gemm, every weight-gradient GEMM in its epilogue (Megatron-Core's "
                     "gradient_accumulation_fusion). Default: add on a PyTorch-native stack (--fsdp2, --kernels "
                     "unfused or eager, --compile model), gemm otherwise"),
        click.option("--attention", type=click.Choice(["flash", "fa2", "eager"]), default="flash", show_default=True,
                     help="the attention kernel: flash, the fused kernel the hardware spec's plateau measures "
                     "(Transformer Engine's cuDNN on Hopper and Blackwell); fa2, FlashAttention-2, which PyTorch's "
                     "scaled_dot_product_attention runs on Hopper in torch 2.5.1-2.10 (torchtitan, Hugging Face), "
                     "at the spec's efficiency.attention_fa2; eager, materialised scores (Megatron-LM of 2021-22)"),
        click.option("--kernels", type=click.Choice(["fused", "unfused", "eager"]), default="fused",
                     show_default=True, help="fused norm/SwiGLU/routing kernels (Megatron, TE, torch.compile); "
                     "unfused, piper-train's eager modules; eager, torchtitan's dense block without torch.compile"),
        click.option("--compile", "compiled", default="none", show_default=True,
                     help="what a PyTorch-native stack runs under torch.compile, comma-separated (torchtitan's "
                     "compile.components): model, its blocks (under --recompute-modules op_sac Inductor keeps only "
                     "what the backward reads); loss, the cross-entropy, which keeps the logits in their dtype, not "
                     "fp32 log-probabilities; none: neither (Megatron-Core's stack)"),
        click.option("--cross-entropy", type=click.Choice(["fused", "eager"]), default="fused", show_default=True,
                     help="how an uncompiled loss runs: fused, Megatron-Core's vocab-parallel cross-entropy (one fp32 "
                     "copy, made the gradient in place); eager, torch's F.cross_entropy on an fp32 copy (torchtitan, "
                     "Hugging Face), whose backward holds three fp32 copies of the logits at once"),
        click.option("--expert-gemm", type=click.Choice(["grouped", "multistream", "loop"]), default="grouped",
                     show_default=True, help="local experts' GEMMs as one grouped kernel, one per expert on 4 streams "
                     "(Transformer Engine's default), or one per expert in turn (a Python loop)"),
        click.option("--fp8", type=click.Choice(["none", "current", "mxfp8", "blockwise"]), default="none",
                     show_default=True, help="FP8 GEMMs with bf16 activations (Transformer Engine): per-tensor "
                     "current scaling, MXFP8 block scaling (Blackwell), or DeepSeek-V3's 1x128 / 128x128 blockwise "
                     "scaling; attention, router and LM head stay bf16"),
        click.option("--fp8-params/--no-fp8-params", default=False, show_default=True,
                     help="keep the GEMMs' weights in FP8 under the --fp8 recipe (Megatron --fp8-param-gather): no "
                     "bf16 copy; without it, bf16 weights and Transformer Engine's cached FP8 copy of each"),
        click.option("--expert-probs", type=click.Choice(["combine", "activation"]), default="combine",
                     show_default=True, help="where the routing probability scales a token: at the combine, which "
                     "keeps each expert output for its gradient (DeepSpeed-MoE, piper-train), or inside the experts' "
                     "fused activation (Megatron-Core), which keeps none"),
        click.option("--a2a-overlap/--no-a2a-overlap", default=False, show_default=True,
                     help="hide each MoE all-to-all behind another micro-batch's compute (Megatron-Core "
                     "--overlap-moe-expert-parallel-comm)"),
        click.option("--attention-fp8/--no-attention-fp8", default=False, show_default=True,
                     help="fused attention in FP8 (Transformer Engine's fp8_dot_product_attention), at the hardware "
                     "spec's efficiency.attention_fp8 speed-up"),
        click.option("--tp-comm-overlap/--no-tp-comm-overlap", default=False, show_default=True,
                     help="pipeline the tensor-parallel all-gathers and reduce-scatters with the GEMMs beside them "
                     "(Megatron-Core --tp-comm-overlap, Transformer Engine's userbuffers)"),
        click.option("--p2p-overlap/--no-p2p-overlap", default=True, show_default=True,
                     help="the interleaved schedule receives each stage-boundary message ahead of the compute that "
                     "needs it, so its steady state runs them behind compute (Megatron-Core's overlap_p2p_comm; "
                     "torch's ScheduleInterleaved1F1B); off: each waits (Megatron-LM of 2021-22, "
                     "--no-overlap-p2p-communication). No effect on the other schedules"),
        click.option("--a2a-sms", type=POSITIVE, default=None,
                     help="SMs an overlapped all-to-all holds (Megatron-Core --moe-hybridep-num-sms); default: the "
                     "hardware spec's efficiency.overlap_comm_units"),
        click.option("--cuda-graphs", default="none", show_default=True,
                     help="what the runtime replays as CUDA graphs, comma-separated (Megatron-Core "
                     "--cuda-graph-scope): attn, mlp, moe, moe_router, moe_preprocess, full_iteration; none: eager. "
                     "Priced on specs that give efficiency.host_op_us"),
        click.option("--pipeline-split", type=click.Choice(["balanced", "even", "account"]), default="balanced",
                     show_default=True, help="how layers split into pipeline chunks: by cost (piper), evenly "
                     "(Megatron-Core's default), or with the embedding and loss counted as one layer each "
                     "(Megatron-Core --account-for-embedding/loss-in-pipeline-split); the last two need whole "
                     "layers a chunk, as Megatron-Core does"),
]

GRAD_DTYPE_HELP = ("element type the gradients are reduced in (Megatron-Core --grad-reduce-in-bf16; fp32: "
                   "its default main grads; piper-train reduces fp32)")

OFFLOAD_HELP = {
    "optimizer": "share of each rank's optimizer state (fp32 master weights, Adam moments) kept and stepped in host "
                 "memory (Megatron-Core --optimizer-cpu-offload --optimizer-offload-fraction); needs the hardware "
                 "spec's host section",
    "layers": "layers of each rank whose saved activations wait in host memory between forward and backward "
              "(Megatron-Core --cpu-offloading-num-layers, NeMo activation_offload_layers); needs the hardware spec's "
              "host section",
    "modules": "modules whose saved tensors wait in host memory between every layer's forward and backward, "
               "comma-separated (Megatron-Core --fine-grained-activation-offloading --offload-modules): attn_norm, "
               "qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, moe_act; none: on the device. Needs the "
               "hardware spec's host section",
}
