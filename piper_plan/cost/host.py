"""The host's side of an eager training step: operations issued per layer, and the GPU time
the layer loses when issuing them takes longer than running them.

An eager step (PyTorch + Transformer Engine + Megatron-Core) issues every kernel from Python;
each issue costs the host CPU `efficiency.host_op_us` (module call, autograd bookkeeping,
allocations, launch). A layer pass cannot finish before its operations are issued: where
their host time exceeds the GPU's time for the layer, the GPU idles for the difference (the
"CPU overhead" / host-boundedness of fine-grained MoE, Megatron-Core MoE report, arXiv
2603.07685 §4.3.1, §4.3.6). The dropless dispatcher's host sync in every MoE layer keeps the
host from running ahead into the next layer, so the comparison is made per layer pass; and
since the GPU's queue is empty after it, the forward's expert issue cannot hide behind the
combine and the next layer's attention either (post_sync_ops, host_gap).

Operations per layer forward, from Megatron-Core's modules on Transformer Engine:
- attention: fused norm + QKV projection, RoPE on q and on k, fused attention, output
  projection, residual: 5 + the projections (2; MLA 5, plus its two latent norms); a YaRN
  model's RoPE runs unfused, 6 operations a tensor (compute.UNFUSED_ROPE): 10 more;
- dense MLP: fused norm + fc1, activation, fc2, residual: 4;
- MoE: router and dispatch preprocess, 31 + 1 kernels after router fusion or 17 with the
  DeepEP/HybridEP dispatcher's fused preprocess (Megatron-LM docs/discussions/
  deepseek-v3-gb200-optimization: "from 72 to 31", "to 17"); pre-MLP norm, router GEMM,
  permute, dispatch, sort by expert, activation, unsort, combine, unpermute, residual: 10;
  the expert GEMMs: 2 a local expert where they launch one per expert (Transformer Engine's
  multi-stream GroupedLinear, a Python loop), 2 when grouped; shared experts 4; Dist-MoE
  (Layout.a2a fused) 17 for its router and routing kernels, then its two expert kernels,
  scale_and_sum and the residual (FUSED_AFTER_OPS);
- FP8: the quantisation kernels of each GEMM's input (cost/compute.FP8_QUANT), per expert
  where the GEMMs launch per expert;
- tensor parallelism with sequence parallelism: an all-gather and a reduce-scatter per block;
- context parallelism: 3 more a ring step (send / receive, attention kernel, merge).
A scope captured as a CUDA graph (Layout.cuda_graphs) costs one launch; full_iteration none.
The backward issues twice the forward's operations (a GEMM's dgrad and wgrad; about two
kernels per elementwise backward); full recompute issues the forward again.
These are the fused stack's counts: piper-train's eager modules (Layout.fused_kernels false)
issue more, which only its calibrated CPU specs price (efficiency.layer_overhead_us; their
host_op_us is 0, the host being the device). A native eager block (Layout.native_eager:
torchtitan's, uncompiled) issues its seven projections, SDPA and the 26 or 28 elementwise ops
benchmarks/eager_bytes.py counts (cost/eager.NATIVE_OPS) a forward, with the tp collectives and
context parallelism's steps as above.
"""
from __future__ import annotations

import numpy as np

from ..specs.hardware import HardwareSpec
from ..specs.model import ModelSpec
from .batch import A2AS, CP_COMMS, FP8_COMPUTE, FP8S, LayoutBatch, graphed, per_expert_launch
from .compute import FP8_QUANT, Phase, unfused_rope
from .eager import NATIVE_OPS, native_repeats

ROUTER_OPS = {"flat": 31 + 1, "dedup": 17}  # router + dispatch preprocess, forward (see module docstring)
# Dist-MoE's forward after its routing kernels (Layout.a2a fused): the dispatching fc1 kernel, the
# SwiGLU-fc2-combine kernel and scale_and_sum (dist_moe docs/mxfp8_execution.md, "Follow the staged
# forward"; its MXFP8 quantisation runs inside them), then the residual
FUSED_AFTER_OPS = 3 + 1
# quantisation kernels per quantised GEMM input, indexed by LayoutBatch.fp8 (0 without an FP8 recipe)
QUANT_KERNELS = np.array([FP8_QUANT[FP8_COMPUTE[f]][1] if f in FP8_COMPUTE else 0.0 for f in FP8S])


def layer_ops(m: ModelSpec, lay: LayoutBatch) -> tuple[np.ndarray, np.ndarray]:
    """(dense layer, MoE layer) operations the host issues in one layer's forward for one
    micro-batch, per layout."""
    q = QUANT_KERNELS[lay.fp8]
    tp_comm = np.where(lay.tp > 1, 2.0, 0.0)
    gemms = 5.0 if (m.mla is not None and m.mla.q_lora_rank) else 4.0 if m.mla is not None else 2.0
    # a YaRN model's RoPE on the fused stack: Megatron-Core's unfused ops, 6 a tensor for 1 (compute.UNFUSED_ROPE)
    rope = 10.0 if unfused_rope(m) else 0.0
    # context parallelism (Layout.cp_comm), beside the one attention kernel: the ring's further steps
    # each issue their send / receive, kernel and merge of the partial output; all_gather its two
    # gathers and reorders (K, V), a second kernel and the two chunks' output copies; a2a the four
    # exchanges (Q, K, V, the output) and a copy on each side of each; a2a+p2p both of its levels'
    ring = np.where(lay.cpc == CP_COMMS.index("all_gather"), 7.0,
                    3.0 * (lay.cp_ring - 1) + np.where(lay.cp_a2a_group > 1, 12.0, 0.0))
    ring = np.where(lay.cp > 1, ring, 0.0)
    attn_ops = 5.0 + rope + gemms * (1.0 + q) + (2.0 if m.mla is not None else 0.0) + tp_comm + ring
    attn = np.where(graphed(lay, "attn"), 1.0, attn_ops)
    mlp = np.where(graphed(lay, "mlp"), 1.0, 4.0 + 2.0 * q + tp_comm) if m.ffn_size else 0.0
    dense = attn + mlp
    if lay.native.any():  # a native eager block: its seven projections (and their FP8 casts), SDPA, every
        # elementwise op, the tp collectives around attention and the MLP, and context parallelism's steps
        kv = m.kv_heads_per_rank(lay.tp)
        elementwise = np.where(native_repeats(m.num_heads / lay.tp, kv, "f"), *NATIVE_OPS["f"][::-1])
        dense = np.where(lay.native, 7.0 * (1.0 + q) + 1.0 + elementwise + 2.0 * tp_comm + ring, dense)
    moe = np.zeros(len(lay))
    if m.moe is not None:
        before, after = _moe_block_ops(m, lay)
        moe = attn + np.where(graphed(lay, "moe"), 1.0, before + after)
    full = graphed(lay, "full_iteration")
    return np.where(full, 0.0, dense), np.where(full, 0.0, moe)


def post_sync_ops(m: ModelSpec, lay: LayoutBatch) -> np.ndarray:
    """Operations a MoE layer's forward issues after the dropless dispatcher's host sync, per
    layout (0 where nothing syncs: no MoE, the MoE block or the whole iteration captured as a
    CUDA graph, whose shapes are static).

    A dropless layer must know on the host how many rows each expert receives: the all-to-all
    dispatcher copies the counts and synchronises before the expert-parallel all-to-all
    (Megatron-Core token_dispatcher.py, cuda_sync_point "before_ep_alltoall"; "before_finish"
    without EP), DeepEP/HybridEP inside the dispatch once the counts are exchanged, and
    Transformer Engine's GroupedLinear takes the per-expert row counts as a host list. What
    follows the sync is issued with the GPU's queue empty (_moe_block_ops). A fused exchange
    (Layout.a2a fused) routes on the GPU into buffers of fixed shape: nothing syncs."""
    if m.moe is None:
        return np.zeros(len(lay))
    _, after = _moe_block_ops(m, lay)
    synced = ~(graphed(lay, "moe") | graphed(lay, "full_iteration") | (lay.a2a == A2AS.index("fused")))
    return np.where(synced, after, 0.0)


def _moe_block_ops(m: ModelSpec, lay: LayoutBatch) -> tuple[np.ndarray, np.ndarray]:
    """(before, after the dispatcher's host sync; Dist-MoE's has none) operations of an eager MoE
    block's forward:
    - before: the router and dispatch preprocess (31 + 1, or 17 with DeepEP/HybridEP; one launch
      each where moe_router is graphed), the pre-MLP norm, the router GEMM and the permute;
    - after: dispatch, sort, activation, unsort, combine, unpermute and residual (7); the
      experts' GEMMs, 2 a local expert where they launch one per expert (Transformer Engine's
      multi-stream GroupedLinear, a Python loop), 2 when grouped, each with its quantisation
      kernels; shared experts 4; GPT-OSS-style extras on per-expert GEMMs
      (cost.compute._expert_extras: the clamp's 3 kernels, fc2's bias 2 an expert plus the
      splits, cat and cast); an all-gather and a reduce-scatter under TP, and another pair over
      the expert-tensor-parallel group (etp > 1)."""
    mo = m.moe
    q = QUANT_KERNELS[lay.fp8]
    per_expert = per_expert_launch(lay)
    launches = np.where(per_expert, mo.num_experts / lay.ep, 1.0)
    # Dist-MoE (fused) publishes, routes and plans in a few kernels after the router, as DeepEP's fused
    # preprocess does: counted as that
    fused = lay.a2a == A2AS.index("fused")
    router_all = np.where((lay.a2a == A2AS.index("dedup")) | fused, ROUTER_OPS["dedup"], ROUTER_OPS["flat"])
    # moe_router replays the router (all but the preprocess's one kernel), moe_preprocess the rest
    router = np.where(graphed(lay, "moe_router"), 1.0, router_all - 1.0)
    before = router + 1.0 + 3.0
    shared = (4.0 + 2.0 * q) if mo.shared_experts else 0.0
    extras = (3.0 if mo.glu_clamp else 0.0) + (2.0 * launches + 4.0 if mo.expert_bias else 0.0)
    tp_comm = np.where(lay.tp > 1, 2.0, 0.0) + np.where(lay.etp > 1, 2.0, 0.0)
    after = 7.0 + 2.0 * launches * (1.0 + q) + shared + tp_comm + np.where(per_expert, extras, 0.0)
    return before, np.where(fused, FUSED_AFTER_OPS + shared + tp_comm, after)


def host_time(hw: HardwareSpec, ops) -> Phase:
    """Host seconds of a layer issuing `ops` forward operations: forward, backward (twice the
    forward's, an assumption: a linear's backward issues two GEMMs, dgrad and wgrad, an
    elementwise op one kernel, and autograd adds its own per-node work; no published count;
    full recompute's re-issue is added by the caller)."""
    s = np.asarray(ops, dtype=float) * hw.efficiency.host_op_us * 1e-6
    z = np.zeros_like(s)
    return Phase(s, 2.0 * s, z, z)


def host_gap(host: Phase, gpu: Phase, comm: Phase, after_sync=0.0, before_sync=0.0) -> Phase:
    """The GPU's idle seconds per micro-batch while the host issues a layer: the host time
    beyond the layer's GPU time (compute and its communication), forward and backward apart.

    A forward with a host sync (post_sync_ops) is a two-stage flow shop between consecutive
    syncs: the host issues the `after_sync` seconds of this layer's operations, then the next
    layer's; the GPU cannot start the next layer's work before it is issued, and that work up to
    the next sync (`before_sync` GPU seconds: the attention block) cannot overlap this layer's
    issue. So the forward lasts at least after_sync + before_sync, beside the host's and the GPU's
    totals. The backward has no sync (its all-to-all splits and GEMM row counts are already on
    the host), so the host runs ahead and only the totals bound it."""
    busy = gpu.f + comm.f
    f = np.maximum(np.maximum(host.f, after_sync + before_sync) - busy, 0.0)
    b = np.maximum(host.b - (gpu.b + gpu.w + comm.b), 0.0)
    z = np.zeros_like(f)
    return Phase(f, b, z, z)
