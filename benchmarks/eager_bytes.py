"""Bytes piper-train's eager layer moves outside its GEMMs and attention, against what the
planner prices for a fused stack's elementwise passes (compute.attention_phase / ffn_phase).

    python benchmarks/eager_bytes.py [--model llama3-8b] [--seq 512]
    python benchmarks/eager_bytes.py --moe --model tests/data/hf/granite-3.0-3b-a800m-instruct.json \
        --seq 2048 --mbs 4 --hardware dgx-h200

With --moe the block is the model's first MoE layer (router, dispatch, grouped experts,
combine) and the bytes are printed with the time they take at a hardware spec's HBM rate
(accelerator.memory_bandwidth_gbps x efficiency.memory), the floor of what those kernels cost
on that GPU; the planner prices no eager MoE traffic either, so no ratio is printed for it.

Counts, op by op, every tensor each aten op of one dense block's forward and backward reads and
writes (a TorchDispatchMode on CPU: the same op sequence autograd dispatches on a GPU), under
piper-train's bf16 autocast over fp32 weights. GEMMs and the attention kernel are left out (the
planner prices them as such), views move nothing, and the weight casts to bf16 and the fp32
gradient accumulation are reported apart (the planner prices those, estimate._weight_casts).
The ratio printed is eager elementwise bytes / the planner's fused elementwise bytes for the same
layer: what the eager modules cost on a GPU beyond the priced passes, where HBM bandwidth bounds
them. Measured, not priced: the planner adds none of it for GPU specs (validation/README.md).
It is CPU dispatch: a composite op torch runs as several kernels here (rms_norm: pow, mean,
rsqrt, mul) may be one fused kernel on a GPU, so on a GPU the eager excess is at most this."""
from __future__ import annotations

import argparse
import os
import sys
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

GEMMS = {"mm", "addmm", "bmm", "baddbmm", "linear", "matmul", "_scaled_dot_product_flash_attention",
         "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_efficient_attention",
         "_scaled_dot_product_efficient_attention_backward", "_scaled_dot_product_flash_attention_for_cpu",
         "_scaled_dot_product_flash_attention_for_cpu_backward", "_scaled_dot_product_cudnn_attention",
         "_scaled_dot_product_cudnn_attention_backward"}


def count_block(spec_name: str, seq: int, moe: bool = False, mbs: int = 1) -> dict:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from piper_plan.specs import load_model
    from piper_runtime.model import Block, BuildCtx

    spec = load_model(spec_name)
    layer = next((i for i in range(spec.num_layers) if spec.layer_is_moe(i) == moe), None)
    if layer is None:
        raise SystemExit(f"{spec_name}: no {'MoE' if moe else 'dense'} layer to count")
    torch.manual_seed(0)
    blk = Block(spec, layer, BuildCtx(seq=seq, dtype="bf16"))
    if moe:  # routed rows depend on the weights: draw them as training starts, not as allocated
        with torch.no_grad():
            for p in blk.parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, 0.02)
    shapes = {tuple(p.shape) for p in blk.parameters() if p.dim() >= 2}  # weight-sized (experts stacked: 3-d)
    x = torch.randn(mbs, seq, spec.hidden_size, requires_grad=True)

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.bytes, self.ops = Counter(), Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if func.is_view or name in ("detach", "alias", "lift_fresh", "t", "_unsafe_view"):
                return out
            tensors = [a for a in tree_flatten((args, kwargs))[0] + tree_flatten(out)[0] if isinstance(a, torch.Tensor)]
            n = sum(a.numel() * a.element_size() for a in tensors)
            if name in GEMMS or name == "_grouped_mm":
                kind = "gemm_attention"
            elif any(tuple(a.shape) in shapes for a in tensors):
                kind = "weight_casts"  # a weight cast to bf16, or its gradient cast back and accumulated
            else:
                kind = "elementwise"
            self.bytes[kind] += n
            self.ops[kind] += 1
            return out

    mode = Count()
    with mode, torch.autocast("cpu", dtype=torch.bfloat16):
        y = blk(x)
    with mode:
        y.float().sum().backward()
    return {"spec": spec, "bytes": dict(mode.bytes), "ops": dict(mode.ops)}


def priced_fused(spec, seq: int) -> float:
    """The planner's fused elementwise bytes for one dense layer, forward and backward (attention
    and FFN blocks: compute._elementwise prices the backward at twice the forward)."""
    from piper_plan.cost.batch import from_layouts
    from piper_plan.layout import Layout

    lay = from_layouts([Layout(gpus=1, global_batch=1, seq=seq)])
    t, eb, d = float(lay.tokens[0]), 2.0, spec.hidden_size
    rope = 2.0 * (spec.num_heads + spec.kv_heads) * spec.hd
    attn = 5.0 * d + rope
    ffn = 5.0 * d + (3.0 if spec.ffn_gated else 2.0) * spec.ffn_size
    return 3.0 * t * eb * (attn + ffn)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--mbs", type=int, default=1, help="sequences in the micro-batch")
    ap.add_argument("--moe", action="store_true", help="count the first MoE block instead of a dense one")
    ap.add_argument("--hardware", default="dgx-h200", help="spec whose HBM rate prices the MoE block's bytes")
    a = ap.parse_args()
    r = count_block(a.model, a.seq, a.moe, a.mbs)
    b, ops = r["bytes"], r["ops"]
    print(f"{a.model}, one {'MoE' if a.moe else 'dense'} block, {a.mbs} x {a.seq} tokens, bf16 autocast over "
          f"fp32 weights (forward + backward)")
    for k in ("elementwise", "weight_casts", "gemm_attention"):
        print(f"  {k:15s} {b.get(k, 0) / 2**20:10.1f} MiB in {ops.get(k, 0):4d} ops")
    if a.moe:
        from piper_plan.specs import load_hardware

        hw = load_hardware(a.hardware)
        rate = hw.accelerator.memory_bandwidth_gbps * hw.efficiency.memory * 1e9
        moved = b.get("elementwise", 0) + b.get("weight_casts", 0)
        print(f"elementwise + weight casts at {hw.name}'s HBM rate ({rate / 1e12:.2f} TB/s): {moved / rate * 1e3:.2f} ms")
        return
    fused = priced_fused(r["spec"], a.mbs * a.seq)
    print(f"  planner's fused elementwise passes: {fused / 2**20:10.1f} MiB")
    print(f"eager / priced elementwise bytes: {b.get('elementwise', 0) / fused:.2f}x")


if __name__ == "__main__":
    main()
