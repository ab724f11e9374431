"""What the bundled runtime (piper-train) executes, as data: one table that the planner's
`search --runtime piper-train` (search.for_runtime) and the runtime's launch check
(runtime/launch.check_supported) both read, so the two cannot drift apart. Torch-free: the
planner imports it.

Each entry names a Layout field, the values piper-train runs, the search option that asks for
another value, and what piper-train does instead. Features of other stacks that the planner
can price (FP8, overlapped all-to-all or TP collectives, CUDA graphs, ...) are refused rather
than run without them: the comparison of a run with its prediction would not hold."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

WEIGHT_SPLIT = ("zbv", "dualpipev")  # schedules whose backward-weight pass sums gradients by hand
# (torch/distributed/pipelining/_backward.py stage_backward_weight: weight.grad += dw), outside
# the autograd hooks piper-train's ZeRO-2 reduces in


@dataclass(frozen=True)
class Support:
    field: str       # Layout field
    allowed: tuple   # the values piper-train runs
    option: str      # the search CLI option that asks for another value
    does: str        # what piper-train does instead, for the error
    read_when: Callable[[object], bool] | None = None  # the layouts whose runs read the field (None: all)
    # the search spaces whose layouts may read it (None: all); a space none of whose layouts
    # read_when holds for may ask for any value (the search cannot place it in a run)
    searched_when: Callable[[object], bool] | None = None


PIPER_TRAIN: tuple[Support, ...] = (
    # fields that mean something only beside another come first (fsdp2 needs zero 3), so a plan reads them
    Support("fsdp2", (False,), "--fsdp2", "piper-train implements ZeRO stages 0-2, not torch FSDP2's ZeRO-3"),
    Support("grad_sync", ("microbatch",), "--grad-sync", "piper-train runs no ZeRO-3, whose reduction --grad-sync "
            "times (its ZeRO-0 and 1 reduce once a step, its ZeRO-2 every micro-batch)"),
    Support("wgrad_accum", (None, "add"), "--wgrad-accum", "piper-train adds each micro-batch's gradients into "
            "its fp32 .grad in autograd, not in its GEMMs"),
    Support("dtype", ("bf16", "fp32"), "--dtype", "fp16 needs loss scaling, which piper-train does not do"),
    Support("zero", (0, 1, 2), "--zero", "piper-train implements ZeRO stages 0, 1 and 2"),
    Support("grad_dtype", ("fp32",), "--grad-dtype", "piper-train reduces fp32 gradients"),
    Support("attention_fp8", (False,), "--attention-fp8", "piper-train runs its attention in the layout's dtype, "
            "not FP8"),
    Support("fp8_params", (False,), "--fp8-params", "piper-train keeps its weights in the layout's dtype"),
    Support("fp8", ("none",), "--fp8", "piper-train runs its GEMMs in the layout's dtype, not FP8"),
    Support("a2a", ("flat", "halo"), "--a2a", "piper-train runs the flat or HALO all-to-all, not DeepEP / "
            "HybridEP's 'dedup' nor Dist-MoE's 'fused'"),
    Support("cp", (1,), "--cp", "piper-train keeps each sequence on one rank (no context parallelism)"),
    Support("etp", (1,), "--etp", "piper-train keeps each expert whole on one rank (no expert tensor "
            "parallelism)"),
    Support("expert_gemm", ("grouped",), "--expert-gemm", "piper-train runs the local experts as one batched "
            "matmul"),
    Support("expert_probs", ("combine",), "--expert-probs", "piper-train scales the expert outputs by their "
            "routing weights at the combine, not in the activation"),
    Support("a2a_overlap", (False,), "--a2a-overlap", "piper-train does not overlap the all-to-all with "
            "another micro-batch's compute"),
    Support("tp_comm_overlap", (False,), "--tp-comm-overlap", "piper-train runs its tensor-parallel "
            "collectives after the GEMMs, not pipelined with them"),
    Support("p2p_overlap", (True,), "--p2p-overlap", "piper-train's interleaved schedule (torch's "
            "ScheduleInterleaved1F1B) posts each receive ahead of the compute that needs it",
            read_when=lambda lay: lay.schedule == "interleaved",
            searched_when=lambda sp: "interleaved" in sp.schedules),
    Support("attention_kernel", ("flash", "eager"), "--attention", "piper-train's attention is torch's "
            "scaled_dot_product_attention, whose kernel the installed torch picks (cuDNN's on Hopper and Blackwell "
            "from torch 2.11, as README's 2.13; FlashAttention-2 in 2.5.1-2.10): a plan cannot say which, so it "
            "is priced at the spec's kernel"),
    Support("cuda_graphs", ((),), "--cuda-graphs", "piper-train runs eagerly and captures no CUDA graphs"),
    Support("recompute_modules", (("core_attn",),), "--selective", "piper-train's selective recompute "
            "re-runs the attention core only", read_when=lambda lay: lay.recompute == "selective",
            searched_when=lambda sp: "selective" in sp.recomputes),
    Support("dropout", (False,), "--dropout", "dropout is not implemented by piper-train"),
    Support("p2p_scatter_gather", (False,), "--p2p-scatter-gather", "piper-train sends a stage boundary's "
            "activation whole from every tensor-parallel rank"),
    Support("optimizer_offload", (0.0,), "--optimizer-offload", "piper-train keeps and steps its optimizer "
            "state on the device"),
    Support("offload_layers", (0,), "--offload-layers", "piper-train keeps saved activations on the device"),
    Support("offload_modules", ((),), "--offload-modules", "piper-train keeps saved activations on the device"),
    Support("recompute_layers", (0,), "--recompute-layers", "piper-train's full recompute re-runs every layer"),
    Support("native_eager", (False,), "--kernels eager", "piper-train runs its own eager modules (autocast over "
            "fp32 weights: --kernels unfused), not a PyTorch-native stack's bf16 block"),
    Support("compiled", ((),), "--compile", "piper-train runs its modules and loss eagerly, with no torch.compile"),
)


def model_refusal(model) -> tuple[str, str]:
    """(the model field, why) piper-train cannot train `model` (("", "") when it can): its modules
    build none of these, and a run without them would not be the model the plan priced."""
    mo = model.moe
    lacks = [("mtp_layers", model.mtp_layers, "multi-token-prediction module",
              "mtp_layers 0 (num_nextn_predict_layers 0 in a config.json)"),
             ("sliding_window", model.sliding_window, "sliding-window attention (it attends causally to the whole "
              "sequence)", "no sliding_window"),
             ("attention_chunk", model.attention_chunk, "chunked local attention (it attends causally to the whole "
              "sequence)", "no attention_chunk"),
             ("rope_scaling", model.rope_scaling, "YaRN-scaled rotary positions (it rotates by plain RoPE)",
              "no rope_scaling"),
             ("learned_positions", model.learned_positions, "learned position table (it uses rotary positions)",
              "learned_positions false"),
             ("moe.expert_bias", mo is not None and mo.expert_bias, "expert biases", "moe.expert_bias false"),
             ("moe.glu_clamp", mo is not None and mo.glu_clamp, "clamped SwiGLU", "no moe.glu_clamp"),
             ("moe.route_groups", mo is not None and mo.route_groups, "group-limited routing",
              "no moe.route_groups")]
    for field, has, what, instead in lacks:
        if has:
            return field, (f"piper-train trains no {what} ({field} {has!r} in {model.name}); plan a spec with "
                           f"{instead}")
    return "", ""


def runs(s: Support, value) -> bool:
    """Whether piper-train runs `value` of s.field (lists compare as tuples)."""
    return (tuple(value) if isinstance(value, (list, tuple)) else value) in s.allowed


def shown(value) -> str:
    """A value as the YAML / CLI spells it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


def choices(s: Support) -> str:
    """The values piper-train runs, as an error suggests them: "0, 1 or 2"."""
    v = [shown(x) for x in s.allowed if x is not None]  # None: the field left unset, no value to type
    return v[0] if len(v) == 1 else f"{', '.join(v[:-1])} or {v[-1]}"


# how piper-train runs every plan, which a plan priced another way would misstate (a tiny-moe plan
# priced fused and overlapped reads 66.7 ms a step, as piper-train runs it 88.4 ms): the layout
# field, what a plan with it set is priced for, what piper-train does instead, and the estimate
# option that prices it as piper-train runs
PRICED_AS = (("fused_kernels", "fused kernels", "piper-train runs eager modules", "--kernels unfused"),
             ("overlap_grad_reduce", "a gradient reduction overlapped with the backward",
              "piper-train reduces after the pipeline", "--no-overlap-grad-reduce"))


# the runtime's vocabulary rows (runtime/model.py): a multiple that keeps bf16 rows 16-byte aligned
# with room for the GEMM tiles, and that every power-of-two tp up to 64 divides, so the padded
# (logical) shape does not depend on the layout
VOCAB_MULTIPLE = 64


def padded_vocab(vocab_size: int) -> int:
    """Rows of the runtime's embedding and LM head: the vocabulary rounded up to VOCAB_MULTIPLE."""
    return -(-vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def tp_refusal(lay, m) -> str:
    """Why piper-train's tensor parallelism cannot split layout `lay` of model `m` evenly, as
    "<field>: <why>" (runtime/tp.py; "" where it can). tp is the fastest rank dimension; heads
    and kv heads are the planner's own rules."""
    tp = lay.tp
    if tp == 1:
        return ""
    need = [("model.num_heads", m.num_heads), ("model.vocab_size (padded)", padded_vocab(m.vocab_size))]
    if not all(m.layer_is_moe(i) for i in range(m.num_layers)):
        need.append(("model.ffn_size", m.ffn_size))
    if m.moe is not None and m.moe.shared_experts:
        need.append(("model.moe shared expert width", m.moe.shared_experts * m.moe.shared_ffn))
    if lay.sp:
        need.append(("layout.seq (sequence parallelism)", lay.seq))
    elif m.moe is not None:
        need.append(("layout.mbs*seq (tokens split over tp before routing)", lay.mbs * lay.seq))
    for what, n in need:
        if n % tp:
            return f"{what}: {n} is not divisible by tp={tp}"
    kv = m.kv_heads
    if m.mla is None and kv % tp and tp % kv:
        return f"model.num_kv_heads: tp={tp} must divide the {kv} kv heads or be a multiple of them"
    return ""


def layout_refusal(lay, model) -> str:
    """Why piper-train cannot run layout `lay` of `model` as priced, as "<field> ...: <why and
    what to use>" ("" where it can): the PIPER_TRAIN table, ZeRO-2 under a schedule that sums
    weight gradients outside autograd, a model it cannot train, and a plan priced for fused
    kernels or an overlapped reduction; the even tensor-parallel splits (tp_refusal) are checked
    first, apart. Read by piper-train's launch check and by `estimate --runtime piper-train`
    alike."""
    for s in PIPER_TRAIN:
        if s.read_when is not None and not s.read_when(lay):
            continue  # a setting this layout's run never reads (recompute modules without selective recompute)
        value = getattr(lay, s.field)
        if not runs(s, value):
            return f"layout.{s.field} = {shown(value)}: {s.does}; use {s.field} {choices(s)}"
    if lay.zero == 2 and lay.schedule in WEIGHT_SPLIT:
        return (f"layout.zero: ZeRO-2 reduces each micro-batch's gradients as autograd accumulates them, and torch's "
                f"{lay.schedule} schedule accumulates its weight gradients outside autograd; use zero 1, or schedule "
                "gpipe, 1f1b or interleaved")
    field, refusal = model_refusal(model)
    if refusal:
        return f"model.{field}: {refusal}"
    for field, what, instead, option in PRICED_AS:
        if getattr(lay, field):
            return (f"layout.{field} = true: the plan is priced for {what} ({instead}), so its prediction would not "
                    f"hold; plan it with `piper-plan search --runtime piper-train`, or `estimate {option}`")
    return ""
