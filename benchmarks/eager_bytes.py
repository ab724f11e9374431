"""Bytes piper-train's eager layer moves outside its GEMMs and attention, against what the
planner prices for a fused stack's elementwise passes (compute.attention_phase / ffn_phase).

    python benchmarks/eager_bytes.py [--model llama3-8b] [--seq 512]
    python benchmarks/eager_bytes.py --moe --model tests/data/hf/granite-3.0-3b-a800m-instruct.json \
        --seq 2048 --mbs 4 --hardware dgx-h200
    python benchmarks/eager_bytes.py --solve    # cost/eager.py's bytes per element, re-derived
    python benchmarks/eager_bytes.py --solve-native    # its NATIVE: torchtitan's eager bf16 block

With --moe the block is the model's first MoE layer (router, dispatch, grouped experts,
combine) and the bytes are printed with the time they take at a hardware spec's HBM rate
(accelerator.memory_bandwidth_gbps x efficiency.memory), the floor of what those kernels cost
on that GPU; the planner prices no eager MoE traffic either, so no ratio is printed for it.

Counts, op by op, every tensor each aten op of one dense block's forward and backward reads and
writes (a TorchDispatchMode on CPU: the same op sequence autograd dispatches on a GPU, the MoE
token sums taken by slot as a GPU takes them, runtime/moe/permute.py), under
piper-train's bf16 autocast over fp32 weights. GEMMs and the attention kernel are left out (the
planner prices them as such), views move nothing, and the weight casts to bf16 and the fp32
gradient accumulation are reported apart (the planner prices those, layer._weight_casts).
The ratio printed is eager elementwise bytes / the planner's fused elementwise bytes for the same
layer: what the eager modules cost on a GPU beyond the priced passes, where HBM bandwidth bounds
them. The planner prices it on GPU specs through cost/eager.py, whose bytes per element
`--solve` derives from these counts.
It is CPU dispatch: a composite op torch runs as several kernels here (rms_norm: pow, mean,
rsqrt, mul) may be one fused kernel on a GPU, so on a GPU the eager excess is at most this."""
from __future__ import annotations

import argparse
import os
import sys
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))  # native_block, _args
from _args import int_at_least  # noqa: E402

GEMMS = {"mm", "addmm", "bmm", "baddbmm", "linear", "matmul", "_scaled_dot_product_flash_attention",
         "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_efficient_attention",
         "_scaled_dot_product_efficient_attention_backward", "_scaled_dot_product_flash_attention_for_cpu",
         "_scaled_dot_product_flash_attention_for_cpu_backward", "_scaled_dot_product_cudnn_attention",
         "_scaled_dot_product_cudnn_attention_backward"}


def count_block(spec_name, seq: int, moe: bool = False, mbs: int = 1, dtype: str = "bf16") -> dict:
    """Bytes and ops of one block's forward + backward by kind (elementwise, weight_casts,
    gemm_attention), and of the forward alone (`forward_bytes`); `spec_name` a bundled name or
    a ModelSpec, `dtype` piper-train's compute dtype (bf16: autocast over fp32 weights)."""
    import torch

    from piper_plan.specs import load_model
    from piper_plan.specs.model import ModelSpec
    from piper_runtime.model import Block, BuildCtx
    from piper_runtime.moe.permute import sums_by_slot

    spec = spec_name if isinstance(spec_name, ModelSpec) else load_model(spec_name)
    layer = next((i for i in range(spec.num_layers) if spec.layer_is_moe(i) == moe), None)
    if layer is None:
        raise SystemExit(f"{spec_name}: no {'MoE' if moe else 'dense'} layer to count")
    torch.manual_seed(0)
    blk = Block(spec, layer, BuildCtx(seq=seq, dtype=dtype))
    if moe:  # routed rows depend on the weights: draw them as training starts, not as allocated
        with torch.no_grad():
            for p in blk.parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, 0.02)
    shapes = {tuple(p.shape) for p in blk.parameters() if p.dim() >= 2}  # weight-sized (experts stacked: 3-d)
    x = torch.randn(mbs, seq, spec.hidden_size, requires_grad=True)

    mode = _counter(shapes)
    if spec.mla is not None:
        _opaque_core(blk.attn, mode)
    with sums_by_slot(), mode, torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
        y = blk(x)
    forward, forward_ops = dict(mode.bytes), dict(mode.ops)
    with sums_by_slot(), mode:
        y.float().sum().backward()
    return {"spec": spec, "bytes": dict(mode.bytes), "ops": dict(mode.ops), "forward_bytes": forward,
            "forward_ops": forward_ops}


def _counter(shapes: set):
    """A TorchDispatchMode that books each aten op's bytes (every tensor it reads and writes) and
    op count to gemm_attention (GEMMs, attention kernels), weight_casts (a tensor of a weight's
    shape in `shapes`) or elementwise; views move nothing."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.bytes, self.ops = Counter(), Counter()
            self.in_core = False  # inside the attention kernel (_opaque_core)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if func.is_view or name in ("detach", "alias", "lift_fresh", "t", "_unsafe_view"):
                return out
            tensors = [a for a in tree_flatten((args, kwargs))[0] + tree_flatten(out)[0] if isinstance(a, torch.Tensor)]
            n = sum(a.numel() * a.element_size() for a in tensors)
            if self.in_core or name in GEMMS or name == "_grouped_mm":
                kind = "gemm_attention"
            elif any(tuple(a.shape) in shapes for a in tensors):
                kind = "weight_casts"  # a weight cast to bf16, or its gradient cast back and accumulated
            else:
                kind = "elementwise"
            self.bytes[kind] += n
            self.ops[kind] += 1
            return out


    return Count()


def _opaque_core(attn, mode) -> None:
    """Count MLA's attention core as the one kernel it is on a GPU. Its value heads are narrower
    than its query/key heads, which torch's CPU flash kernel does not take, so on the CPU SDPA
    decomposes into the math path (S x S scores, softmax, dropout mask: elementwise ops that
    would be counted as the block's), where cuDNN's and the memory-efficient kernels take the
    shapes whole on a GPU. Forward and backward run with their ops booked to the kernel."""
    import torch

    core = attn.core

    class Core(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.save_for_backward(q, k, v)
            mode.in_core = True
            try:
                return core(q, k, v)
            finally:
                mode.in_core = False

        @staticmethod
        def backward(ctx, g):
            mode.in_core = True
            try:
                with torch.enable_grad():
                    qkv = [a.detach().requires_grad_() for a in ctx.saved_tensors]
                    return torch.autograd.grad(core(*qkv), qkv, g)
            finally:
                mode.in_core = False

    attn.core = Core.apply


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


# the shapes cost/eager.py's bytes per element were solved on: (d, heads, kv heads, tokens) x
# (three dense FFN widths | five expert layouts (E, k, f)); token counts avoid every weight
# dimension, so no activation is taken for a weight cast by its shape
SOLVE_ATTN = [(64, 4, 4, 136), (128, 8, 2, 136), (64, 4, 2, 264), (128, 4, 4, 264), (96, 6, 3, 200),
              (160, 8, 8, 72), (64, 2, 2, 328), (192, 12, 4, 104)]


def solve(dtype: str) -> dict:
    """cost/eager.py's coefficients for `dtype`: piper-train's block counted at the SOLVE_ATTN
    shapes, bytes per element by scipy's nnls, forward and backward, with the largest relative
    miss; and under ("ops", kind, phase) the range of elementwise ops a pass (kind "token": the
    dense block's; "moe": the MoE block's excess over the dense block of the same attention)."""
    from piper_plan.specs.model import ModelSpec

    out, ops = {}, {}
    for moe in (False, True):
        X, Y = [], {"f": [], "b": []}
        for d, h, kv, t in SOLVE_ATTN:
            layers = ([dict(moe=dict(num_experts=E, top_k=k, expert_ffn_size=f, router="softmax"), ffn_size=0)
                       for E, k, f in ((8, 2, 2 * d), (16, 4, d), (12, 3, 64), (32, 8, 48), (6, 1, 160))]
                      if moe else [dict(ffn_size=w) for w in (2 * d, 5 * d, 96)])
            for extra in layers:
                spec = ModelSpec(name="solve", num_layers=1, hidden_size=d, num_heads=h, num_kv_heads=kv,
                                 vocab_size=256, seq_len=t, **extra)
                r = count_block(spec, t, moe=moe, dtype=dtype)
                f_ops = r["forward_ops"].get("elementwise", 0)
                per = (f_ops, r["ops"]["elementwise"] - f_ops)
                if moe:
                    per = tuple(a - b for a, b in zip(per, ops[(d, h, kv, t)]))
                else:
                    ops[(d, h, kv, t)] = per  # a dense block's ops do not depend on its FFN width
                for ph, n in zip(("f", "b"), per):
                    out.setdefault(("ops", "moe" if moe else "token", ph), set()).add(n)
                fwd = r["forward_bytes"].get("elementwise", 0)
                Y["f"].append(fwd)
                Y["b"].append(r["bytes"]["elementwise"] - fwd)
                row = [t * d, t * kv * (d // h), t]
                if moe:
                    rows, mo = t * spec.moe.top_k, spec.moe
                    row += [rows * d, rows * mo.expert_ffn_size, t * mo.num_experts, rows]
                else:
                    row += [t * spec.ffn_size]
                X.append(row)
        out.update(_fit("moe" if moe else "dense", X, Y))
    out.update(solve_mla(dtype))
    return out


def _fit(kind: str, X: list, Y: dict) -> dict:
    """{(kind, phase): (bytes per element by scipy's nnls, rounded; the largest relative miss)}
    of the counts Y[phase] on the element counts X, forward and backward."""
    import numpy as np
    from scipy.optimize import nnls

    A, out = np.array(X, float), {}
    for ph in ("f", "b"):
        y = np.array(Y[ph], float)
        c, _ = nnls(A, y)
        out[(kind, ph)] = (np.round(c, 2).tolist(), float(np.max(np.abs(A @ c / y - 1))))
    return out


def count_native(d: int, heads: int, kv_heads: int, head_dim: int, t: int, ffn: int) -> dict:
    """count_block's figures for torchtitan's eager dense block in bf16 (benchmarks/native_block.py)
    on one sequence of t tokens: hidden size d, heads / kv_heads of head_dim, SwiGLU width ffn.
    The backward is seeded with a bf16 gradient, as the next block hands it back."""
    import torch

    from native_block import TransformerBlock, freqs_cis

    torch.manual_seed(0)
    blk = TransformerBlock(d, heads, kv_heads, head_dim, ffn).to(torch.bfloat16)
    shapes = {tuple(p.shape) for p in blk.parameters() if p.dim() >= 2}
    x = torch.randn(1, t, d, dtype=torch.bfloat16, requires_grad=True)
    cis, seed = freqs_cis(head_dim, t), torch.randn(1, t, d, dtype=torch.bfloat16)
    mode = _counter(shapes)
    with mode:
        y = blk(x, cis)
    forward, forward_ops = dict(mode.bytes), dict(mode.ops)
    with mode:
        torch.autograd.backward(y, seed)
    return {"bytes": dict(mode.bytes), "ops": dict(mode.ops), "forward_bytes": forward, "forward_ops": forward_ops}


# the shapes cost/eager.py's NATIVE was solved on: (d, heads, kv heads, head dim, tokens), SOLVE_ATTN's
# and four whose heads' width is not d (Qwen3's, Gemma's), each with three SwiGLU widths
SOLVE_NATIVE = [(d, h, kv, d // h, t) for d, h, kv, t in SOLVE_ATTN] + [
    (64, 8, 2, 16, 136), (96, 4, 4, 40, 200), (128, 16, 4, 16, 104), (160, 2, 1, 48, 264)]


def repeats(heads: int, kv_heads: int, phase: str) -> bool:
    """Whether torchtitan's repeat_kv moves K and V in `phase` ("f" or "b"): its forward copies them
    between one kv head (the expand then reshape stays a view) and as many as the query heads
    (returned as they are); its backward sums the copies' gradients wherever kv_heads < heads."""
    return kv_heads < heads and (phase == "b" or kv_heads > 1)


def solve_native() -> dict:
    """cost/eager.py's NATIVE: torchtitan's block counted at the SOLVE_NATIVE shapes, bytes per
    element on (t·d, t·heads·head_dim, t·kv_heads·head_dim, t, t·head_dim (the rotary table),
    t·heads·head_dim where K and V are repeated in that phase (repeats), t·ffn) by scipy's nnls,
    forward and backward, with the largest relative miss; ("ops", "native", phase, repeats):
    elementwise ops a pass."""
    import numpy as np
    from scipy.optimize import nnls

    out, X, Y = {}, {"f": [], "b": []}, {"f": [], "b": []}
    for d, h, kv, hd, t in SOLVE_NATIVE:
        for w in (2 * d, 5 * d, 96):
            r = count_native(d, h, kv, hd, t, w)
            fwd, f_ops = r["forward_bytes"].get("elementwise", 0), r["forward_ops"].get("elementwise", 0)
            back = r["bytes"]["elementwise"] - fwd
            for ph, n, nb in (("f", f_ops, fwd), ("b", r["ops"]["elementwise"] - f_ops, back)):
                rep = repeats(h, kv, ph)
                out.setdefault(("ops", "native", ph, rep), set()).add(n)
                X[ph].append([t * d, t * h * hd, t * kv * hd, t, t * hd, t * h * hd * rep, t * w])
                Y[ph].append(nb)
    for ph in ("f", "b"):
        A, y = np.array(X[ph], float), np.array(Y[ph], float)
        c, _ = nnls(A, y)
        out[("native", ph)] = (np.round(c, 2).tolist(), float(np.max(np.abs(A @ c / y - 1))))
    return out


# MLA shapes (d, heads, qk_nope, qk_rope, v head dim, kv_lora_rank, q_lora_rank (0: none), tokens)
SOLVE_MLA = [(64, 4, 32, 16, 32, 48, 0, 136), (128, 8, 16, 8, 16, 32, 48, 136), (96, 6, 24, 8, 24, 64, 0, 200),
             (160, 4, 48, 16, 32, 40, 80, 72), (64, 2, 40, 24, 40, 56, 0, 264), (192, 12, 16, 16, 24, 72, 96, 104),
             (128, 4, 64, 32, 64, 96, 0, 152), (96, 8, 24, 12, 16, 36, 40, 232)]


def solve_mla(dtype: str) -> dict:
    """cost/eager.py's MLA_TOKEN for `dtype` (its FFN coefficient, last, is FFN's again) and
    under ("ops", "mla" | "mla_q", phase) the elementwise ops of an MLA block's pass."""
    from piper_plan.specs.model import ModelSpec

    out, X, Y = {}, [], {"f": [], "b": []}
    for d, h, nope, rope, vd, kvr, ql, t in SOLVE_MLA:
        for w in (2 * d, 5 * d, 96):
            mla = dict(q_lora_rank=ql or None, kv_lora_rank=kvr, qk_nope_head_dim=nope, qk_rope_head_dim=rope,
                       v_head_dim=vd)
            spec = ModelSpec(name="solve", num_layers=1, hidden_size=d, num_heads=h, vocab_size=256, seq_len=t,
                             ffn_size=w, mla=mla)
            r = count_block(spec, t, dtype=dtype)
            fwd, f_ops = r["forward_bytes"].get("elementwise", 0), r["forward_ops"].get("elementwise", 0)
            for ph, n in zip(("f", "b"), (f_ops, r["ops"]["elementwise"] - f_ops)):
                out.setdefault(("ops", "mla_q" if ql else "mla", ph), set()).add(n)
            Y["f"].append(fwd)
            Y["b"].append(r["bytes"]["elementwise"] - fwd)
            X.append([t * d, t * h * (nope + rope), t * h * vd, t * (kvr + rope), t * ql, t, t * w])
    out.update(_fit("mla", X, Y))
    return out


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama3-8b", help="bundled model name or a spec/config file")
    ap.add_argument("--seq", type=int_at_least(1), default=512)
    ap.add_argument("--mbs", type=int_at_least(1), default=1, help="sequences in the micro-batch")
    ap.add_argument("--moe", action="store_true", help="count the first MoE block instead of a dense one")
    ap.add_argument("--hardware", default="dgx-h200", help="spec whose HBM rate prices the MoE block's bytes")
    ap.add_argument("--solve", action="store_true", help="re-derive cost/eager.py's bytes per element")
    ap.add_argument("--solve-native", action="store_true", help="re-derive cost/eager.py's NATIVE (torchtitan's "
                    "eager bf16 block, benchmarks/native_block.py) and NATIVE_OPS")
    return ap.parse_args(argv)


def load_specs(a: argparse.Namespace):
    """(model, hardware or None) the count needs, loaded before anything is counted; a bad name or
    file raises piper_plan's PiperError, a model without the block asked for SpecError."""
    from piper_plan.errors import SpecError
    from piper_plan.specs import load_hardware, load_model

    spec = load_model(a.model)
    if not any(spec.layer_is_moe(i) == a.moe for i in range(spec.num_layers)):
        raise SpecError(a.model, "--moe" if a.moe else "--model", f"no {'MoE' if a.moe else 'dense'} layer to count")
    return spec, (load_hardware(a.hardware) if a.moe else None)


def print_solve_native() -> None:
    for key, val in solve_native().items():
        if key[0] == "ops":
            print(f"native ops a pass, {'forward' if key[2] == 'f' else 'backward'}, K and V "
                  f"{'repeated' if key[3] else 'not repeated'}: {sorted(val)}")
        else:
            print(f"native {'forward' if key[1] == 'f' else 'backward'} {val[0]}  (largest miss {val[1]:.2%})")


def print_solve() -> None:
    for dt in ("bf16", "fp32"):
        solved = solve(dt)
        for key, val in solved.items():
            phase = "forward" if key[-1] == "f" else "backward"
            if key[0] == "ops":
                print(f"{dt} ops a pass, {key[1]:5s} {phase:8s} {min(val)}-{max(val)}")
                continue
            print(f"{dt} {key[0]:5s} {phase:8s} {val[0]}  (largest miss {val[1]:.1%})")
            if key[0] == "moe":  # cost/eager.py's MOE: the row terms, then the t·d excess
                excess = round(val[0][0] - solved[("dense", key[1])][0][0], 2)
                print(f"{dt} MOE   {phase:8s} {val[0][3:] + [excess]}")


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.solve_native or a.solve:
        print_solve_native() if a.solve_native else print_solve()
        return 0
    from piper_plan.errors import PiperError

    try:
        spec, hw = load_specs(a)
    except PiperError as e:  # a bad --model / --hardware: one line, as the CLI says it
        print(f"error: {e}", file=sys.stderr)
        return 2
    return report(a, spec, hw)


def report(a: argparse.Namespace, spec, hw) -> int:
    """Count one block of `spec` and print its bytes against the planner's (or, --moe, their time
    at `hw`'s HBM rate)."""
    r = count_block(spec, a.seq, a.moe, a.mbs)
    b, ops = r["bytes"], r["ops"]
    print(f"{a.model}, one {'MoE' if a.moe else 'dense'} block, {a.mbs} x {a.seq} tokens, bf16 autocast over "
          f"fp32 weights (forward + backward)")
    for k in ("elementwise", "weight_casts", "gemm_attention"):
        print(f"  {k:15s} {b.get(k, 0) / 2**20:10.1f} MiB in {ops.get(k, 0):4d} ops")
    if a.moe:
        rate = hw.accelerator.memory_bandwidth_gbps * hw.efficiency.memory * 1e9
        moved = b.get("elementwise", 0) + b.get("weight_casts", 0)
        print(f"elementwise + weight casts at {hw.name}'s HBM rate ({rate / 1e12:.2f} TB/s): {moved / rate * 1e3:.2f} ms")
        return 0
    fused = priced_fused(r["spec"], a.mbs * a.seq)
    print(f"  planner's fused elementwise passes: {fused / 2**20:10.1f} MiB")
    print(f"eager / priced elementwise bytes: {b.get('elementwise', 0) / fused:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
