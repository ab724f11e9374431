"""Bytes each decoder block of piper-train saves for backward, and parameter / optimizer bytes
per rank, against the planner's model (piper_plan.cost.activations, cost.memory.state_bytes).

One command:  python benchmarks/memory_check.py

Runtime side: saved_tensors_hooks around one block's forward (piper_runtime.metrics.
saved_tensor_bytes: each storage once, parameters and buffers left out), one rank, experts
local (ep 1), torch SDPA (the CPU flash kernel: output + fp32 log-sum-exp), in fp32 and under
bf16 autocast, the MoE token sums as a GPU takes them (runtime/moe/permute.sums_by_slot), so the
matching model setting is attention_kernel='flash', fused_kernels=False: the eager runtime saves
the unfused-kernel tensors the model lists (cost/activations.py). Under bf16 the per-micro-batch
bf16 copies of the block's weights are counted apart and compared with the weights' bf16 bytes
(the model prices them with the state and rank_memory.cast_copies). The fused-kernel figure
(Megatron) is printed beside it for reference."""
from __future__ import annotations

import argparse
import sys

import torch

from piper_plan.cost import activations as act
from piper_plan.cost.batch import from_layouts
from piper_plan.cost.memory import layer_params_per_rank, state_bytes
from piper_plan.layout import Layout
from piper_plan.specs.model import ModelSpec
from piper_plan.specs.registry import load_model


def measure(m: ModelSpec, seq: int, mbs: int, row_multiple: int = 1, dtype: str = "fp32") -> dict[str, dict]:
    """Per block kind: measured saved bytes (bf16 weight copies apart: `casts`, against the
    block's matrices at 2 B: `casts_model`), the model's (unfused) terms, the fused-kernel total;
    row_multiple: the experts' row padding (Accelerator.expert_row_multiple; cpu-local: 16)."""
    from piper_runtime.metrics import saved_tensor_bytes
    from piper_runtime.model import Block, BuildCtx
    from piper_runtime.moe.permute import sums_by_slot

    torch.manual_seed(0)
    ctx = BuildCtx(seq=seq, dtype=dtype, row_multiple=row_multiple)
    # piper-train runs eager PyTorch modules: the model's unfused-kernel terms apply
    lay = from_layouts([Layout(gpus=1, global_batch=mbs, mbs=mbs, seq=seq, dtype=dtype, attention_kernel="flash",
                               fused_kernels=False)])
    fused = from_layouts([Layout(gpus=1, global_batch=mbs, mbs=mbs, seq=seq, dtype=dtype, attention_kernel="flash")])
    out = {}
    for layer in (0, m.dense_layers):
        kind = "moe" if m.layer_is_moe(layer) else "dense"
        blk = Block(m, layer, ctx)
        with torch.no_grad():
            for p in blk.parameters():
                p.normal_(0.0, 0.02)
        x = torch.randn(mbs, seq, m.hidden_size, requires_grad=True)

        def fwd():
            with sums_by_slot(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
                return blk(x)

        fwd().sum().backward()  # warm-up: one-time probes (grouped GEMM support) run outside the count
        state = list(blk.parameters()) + list(blk.buffers())
        _, got, items = saved_tensor_bytes(fwd, exclude=state)
        # a bf16 storage of a matrix's shape (or its transpose: a linear saves its weight so) is a
        # weight copy; the shapes used here match no activation
        mats = [p for p in blk.parameters() if p.dim() >= 2]
        shapes = {tuple(p.shape) for p in mats} | {tuple(p.shape[::-1]) for p in mats if p.dim() == 2}
        casts = sum(b for shape, dt, b, _ in items if shape in shapes and dt == "bfloat16")
        router = blk.moe.router.gate.weight if kind == "moe" else None  # fp32: not cast
        casts_model = sum(2 * p.numel() for p in mats if p is not router) if dtype == "bf16" else 0
        got -= casts
        def terms_of(b):
            t = act.attention_terms(m, b)
            t.update(act.moe_terms(m, b, 1.0, row_multiple) if kind == "moe" else act.ffn_terms(m, b))
            return {k: float(v[0]) for k, v in t.items() if float(v[0])}

        model, model_fused = terms_of(lay), terms_of(fused)
        out[kind] = dict(measured=got, model=sum(model.values()), model_fused=sum(model_fused.values()),
                         terms=model, items=items, casts=casts, casts_model=casts_model)
    return out


def state_check(m: ModelSpec, ep: int) -> dict[str, float]:
    """Parameters of one dense and one MoE block of a rank with `ep` expert ranks: the runtime's
    count against layer_params_per_rank, and the AdamW state bytes piper-train keeps (fp32
    weight, fp32 grad, exp_avg, exp_avg_sq) against state_bytes for an fp32 layout."""
    from piper_runtime.model import Block, BuildCtx

    ctx = BuildCtx(seq=16, ep=ep, dtype="fp32", exchange=object())  # no forward at ep > 1: any exchange
    lay = from_layouts([Layout(gpus=ep, dp=ep, ep=ep, global_batch=ep, seq=16, dtype="fp32", zero=0)])
    dense_p, moe_rep, experts = (float(v[0]) for v in layer_params_per_rank(m, lay))
    blk_d, blk_m = Block(m, 0, ctx), Block(m, m.dense_layers, ctx)
    n_d = sum(p.numel() for p in blk_d.parameters())
    n_m = sum(p.numel() for p in blk_m.parameters())
    model_state = sum(float(v[0]) for v in state_bytes(dense_p + moe_rep + experts, 1, lay).values())
    # the bytes AdamW really allocates: gradients and one step's state on the blocks' parameters
    params = list(blk_d.parameters()) + list(blk_m.parameters())
    for p in params:
        p.grad = torch.zeros_like(p)
    opt = torch.optim.AdamW(params, foreach=False)
    opt.step()
    real = sum(p.numel() * p.element_size() + p.grad.numel() * p.grad.element_size() for p in params)
    real += sum(v.numel() * v.element_size() for st in opt.state.values() for k, v in st.items() if k != "step")
    return dict(dense_params=n_d, dense_params_model=dense_p, moe_params=n_m, moe_params_model=moe_rep + experts,
                state_bytes=real, state_bytes_model=model_state)


MAX_ACTIVATION_ERROR = 0.10  # the acceptance: the model's saved bytes within 10% of the measured, per block


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)  # no options: refuse any
    torch.set_num_threads(1)
    sys.path.insert(0, "benchmarks")
    from runtime_throughput import SMALL

    worst = 0.0
    print("== saved-for-backward bytes per block (SDPA flash, ep 1, the GPU's token sums) vs piper_plan.cost.activations")
    for m, seq, mbs in ((load_model("tiny-moe"), 72, 2), (ModelSpec(**SMALL), 136, 1)):
        for dtype in ("fp32", "bf16"):
            for rm in (1, 16):  # expert rows unpadded, and padded to 16 as piper-train does on CPU ranks
                for kind, r in measure(m, seq, mbs, rm, dtype).items():
                    if rm > 1 and kind != "moe":
                        continue
                    err = r["model"] / r["measured"] - 1
                    worst = max(worst, abs(err))
                    casts = f"; bf16 weight copies {r['casts']:,} B (2 B a weight: {r['casts_model']:,})" if r["casts"] else ""
                    print(f"{m.name:<14} {dtype} {kind:<5} rows×{rm:<2} measured {r['measured']:>9,d} B  model (unfused "
                          f"kernels) {r['model']:>11,.0f}  error {100 * err:+5.1f}%  (fused-kernel model "
                          f"{100 * (r['model_fused'] / r['measured'] - 1):+5.1f}%){casts}")
        for ep in (1, 2):
            s = state_check(m, ep)
            print(f"{m.name:<14} ep{ep}: params dense {s['dense_params']:,} (model {s['dense_params_model']:,.0f}), "
                  f"moe {s['moe_params']:,} (model {s['moe_params_model']:,.0f}); weight+grad+AdamW bytes "
                  f"{s['state_bytes']:,} (model {s['state_bytes_model']:,.0f})")
    ok = worst <= MAX_ACTIVATION_ERROR
    print(f"worst activation error {100 * worst:.1f}% (acceptance {100 * MAX_ACTIVATION_ERROR:.0f}%)")
    print("acceptance met" if ok else f"FAILED: worst activation error {100 * worst:.1f}% > "
          f"{100 * MAX_ACTIVATION_ERROR:.0f}%")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
