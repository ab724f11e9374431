"""Does torchtitan's per-op checkpointing keep the same tensors when the block's linears are torchao
float8 (Float8Linear), eager and under torch.compile? The planner prices the FP8 per-op rows so
(recompute module op_sac; validation/torchtitan.csv tt27/28, tt36/37, tt39-41), reading that the
policy meets aten.mm on torchao's tensor subclass (a dispatch mode runs before the subclass). This
runs it on CPU: the block of native_block.py in bf16 and converted to float8 (a recipe name,
default tensorwise), under op_sac_context's policy, eager and through compile's partitioner
(native_block.partitioned_saves). It prints the ops the policy met and, compiled, the activations
saved besides the scaling factors, and exits 1 where float8's differ from bf16's.

    pip install torchao   # not a dependency of the project; 0.18 was run on torch 2.13 CPU
    python benchmarks/float8_sac.py [tensorwise|rowwise]
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import native_block as nb  # noqa: E402

SHAPE = (128, 4, 2, 32, 64, 256)  # dim, heads, kv heads, head dim, tokens, ffn
# torchao's Float8LinearRecipeName values; checked before the bf16 run, not by torchao after it
RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")


def _policy_counts(context_fn):
    """A context_fn that also counts the ops the policy met in the forward."""
    seen = Counter()

    def counted():
        fwd, rec = context_fn()
        policy = fwd.policy_fn

        def spy(ctx, func, *args, **kwargs):
            if not ctx.is_recompute:
                seen[str(func)] += 1
            return policy(ctx, func, *args, **kwargs)

        fwd.policy_fn = rec.policy_fn = spy
        return fwd, rec

    return counted, seen


def run(recipe: str | None) -> tuple[Counter, list, list]:
    """(ops the eager policy met, activations compile saved, per-token figures it saved: (shape,
    dtype) of each; those of at most heads figures a token apart) for the block with bf16 linears
    (recipe None) or torchao float8 ones."""
    from torch.utils.checkpoint import checkpoint

    d, h, kv, hd, t, f = SHAPE
    torch.manual_seed(0)
    blk = nb.TransformerBlock(d, h, kv, hd, f).to(torch.bfloat16)
    if recipe:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        convert_to_float8_training(blk, config=Float8LinearConfig.from_recipe_name(recipe))
    cis = nb.freqs_cis(hd, t)
    context_fn, seen = _policy_counts(nb.op_sac_context()[0])
    x = torch.randn(1, t, d, dtype=torch.bfloat16, requires_grad=True)
    checkpoint(blk, x, cis, use_reentrant=False, context_fn=context_fn).float().sum().backward()
    met = Counter({k: v for k, v in seen.items() if k in ("aten.mm.default", "aten.max.default",
                                                          "aten._scaled_mm.default")})
    compiled_fn = nb.op_sac_context()[0]  # made outside the traced function
    saves = nb.partitioned_saves(lambda a, c: checkpoint(blk, a, c, use_reentrant=False, context_fn=compiled_fn),
                                 x, cis)
    # a per-token figure (rowwise's scales, the attention's log-sum-exp) is apart from the activations
    made = [v for v, is_input in saves if not is_input and v.numel() > 1]
    return met, sorted((tuple(v.shape), str(v.dtype)) for v in made if v.numel() > t * 4), \
        sorted((tuple(v.shape), str(v.dtype)) for v in made if v.numel() <= t * 4)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe", nargs="?", default="tensorwise", choices=RECIPES, help="torchao float8 recipe")
    recipe = ap.parse_args(argv).recipe
    from importlib.util import find_spec

    if find_spec("torchao") is None:
        print("torchao is not installed: pip install torchao")
        return 2
    base_met, base_saved, base_small = run(None)
    met, saved, small = run(recipe)
    print(f"policy met, bf16: {dict(base_met)}; float8 {recipe}: {dict(met)}")
    print(f"compiled saves, bf16:  {base_saved}\ncompiled saves, float8: {saved}")
    print(f"per-token figures saved, bf16: {base_small}; float8: {small}")
    same = met["aten.mm.default"] == base_met["aten.mm.default"] and saved == base_saved
    print("float8 keeps what bf16 keeps" if same else "float8 keeps other tensors than bf16")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
