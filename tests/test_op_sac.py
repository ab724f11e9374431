"""torchtitan's per-op selective activation checkpointing (recompute module op_sac): each block
keeps its input, its attention kernel's outputs and every other aten.mm's output, and re-runs the
rest in backward. Its saved bytes and re-run GEMMs are torch's own SAC's, run with torchtitan's
policy on benchmarks/native_block.py; it is refused where that policy is not what is priced."""
import numpy as np
import pytest
from benchmark_support import load_benchmark

from piper_plan.cost import activations
from piper_plan.cost.batch import from_layouts
from piper_plan.cost.compute import attention_phase, ffn_phase
from piper_plan.errors import LayoutError
from piper_plan.evaluate import estimate_layout
from piper_plan.layout import Layout, check_for
from piper_plan.search import SearchSpace, search
from piper_plan.specs import load_hardware, load_model
from piper_plan.specs.model import ModelSpec

H100 = load_hardware("dgx-h100")
SHAPES = [(80, 5, 5, 16, 152, 224), (112, 8, 2, 24, 176, 288), (96, 6, 1, 16, 168, 200)]


def _run(shape):
    """torch's SAC with torchtitan's policy over one native block: (cache bytes + kept input, re-run mm shapes)."""
    torch = pytest.importorskip("torch")
    from torch.utils._pytree import tree_flatten
    from torch.utils.checkpoint import checkpoint

    load_benchmark("eager_bytes")  # puts benchmarks/ on the path
    from native_block import TransformerBlock, freqs_cis, op_sac_context

    d, h, kv, hd, t, f = shape
    blk = TransformerBlock(d, h, kv, hd, f).to(torch.bfloat16)
    x = torch.randn(1, t, d, dtype=torch.bfloat16, requires_grad=True)
    context_fn, made, rerun = op_sac_context()
    y = checkpoint(blk, x, freqs_cis(hd, t), use_reentrant=False, context_fn=context_fn)
    seen, saved = set(), 0
    for per_op in made[0].storage.values():
        for entry in per_op.values():
            for leaf in tree_flatten(entry)[0]:
                val = getattr(leaf, "val", None)
                if isinstance(val, torch.Tensor) and val.untyped_storage().data_ptr() not in seen:
                    seen.add(val.untyped_storage().data_ptr())
                    saved += val.untyped_storage().nbytes()
    y.backward(torch.ones_like(y))
    return saved + x.numel() * x.element_size(), rerun


def _spec(d, h, kv, hd, t, f):
    return ModelSpec(name="held-out", num_layers=1, hidden_size=d, num_heads=h, num_kv_heads=kv, head_dim=hd,
                     vocab_size=256, seq_len=t, ffn_size=f)


@pytest.mark.parametrize("shape", SHAPES, ids=["mha", "gqa", "mqa"])
def test_the_saved_bytes_are_torchs_own_sac_cache_and_the_block_input(shape):
    saved, _ = _run(shape)
    m, t = _spec(*shape), shape[4]
    for native in (True, False):  # the policy re-makes every elementwise op, eager or fused alike
        lay = from_layouts([Layout(gpus=1, global_batch=1, seq=t, recompute="selective", recompute_modules=("op_sac",),
                                   native_eager=native)])
        terms = {**activations.attention_terms(m, lay), **activations.ffn_terms(m, lay)}
        assert sum(float(v[0]) for v in terms.values()) == saved


@pytest.mark.parametrize("shape", SHAPES, ids=["mha", "gqa", "mqa"])
def test_the_backward_re_runs_k_s_the_output_s_and_the_up_projection(shape):
    d, h, kv, hd, t, f = shape
    _, rerun = _run(shape)
    assert rerun == [(t, kv * hd), (t, d), (t, f)]  # wk, wo, w3: the 2nd, 4th and 6th aten.mm
    m, lay = _spec(*shape), from_layouts([Layout(gpus=1, global_batch=1, seq=t, recompute="selective",
                                                 recompute_modules=("op_sac",))])
    # the planner re-runs the block's forward but its attention kernel and q's and v's projections
    from piper_plan.cost.compute import core_attention

    a, core = attention_phase(m, H100, lay, "bf16"), core_attention(m, H100, lay, "bf16")
    assert 0.0 < a.r[0] < a.f[0] - core.f[0]


def test_the_planner_re_runs_those_gemms_and_every_elementwise_forward():
    m = load_model("llama3-8b")
    mk = lambda **kw: from_layouts([Layout(gpus=8, dp=8, global_batch=8, seq=8192, **kw)])  # noqa: E731
    op = mk(recompute="selective", recompute_modules=("op_sac",))
    none = mk()
    a_op, a_none = attention_phase(m, H100, op, "bf16"), attention_phase(m, H100, none, "bf16")
    f_op, f_none = ffn_phase(m, H100, op, "bf16"), ffn_phase(m, H100, none, "bf16")
    # re-run: more than the fused elementwise passes, less than the forward without its attention kernel
    kv, heads, d, f = m.kv_heads * m.hd, m.num_heads * m.hd, m.hidden_size, m.ffn_size
    gemm_share = (d * kv + d * heads + d * f) / (d * (heads + 2 * kv) + d * heads + 3 * d * f)
    assert 0.30 < gemm_share < 0.40  # wk, wo, w3 of Llama 3 8B's seven projections' FLOPs
    assert a_none.r[0] == f_none.r[0] == 0.0
    assert 0.0 < a_op.r[0] + f_op.r[0] < a_op.f[0] + f_op.f[0]
    assert f_op.r[0] < f_op.f[0] / 2  # the MLP's three GEMMs: one re-run (as the mlp module re-runs all)


def test_against_mlp_recompute_it_re_runs_less_and_keeps_more():
    m = load_model("llama3-8b")
    base = dict(gpus=8, dp=8, zero=3, mbs=1, global_batch=8, seq=8192, recompute="selective")
    op, mlp = (estimate_layout(m, H100, Layout(**base, recompute_modules=(x,))) for x in ("op_sac", "mlp"))
    assert op.step_time_s[0] < mlp.step_time_s[0]  # 37 % of the forward GEMMs where mlp re-runs 81 %
    # it keeps the MLP's gate output and down projection's, where mlp recompute keeps none of the MLP's
    assert op.peak_memory_gib[0] > mlp.peak_memory_gib[0]


def test_it_is_refused_beside_other_modules_and_on_blocks_it_is_not_priced_for():
    llama = load_model("llama3-8b")
    base = dict(gpus=8, dp=8, global_batch=8, seq=2048, recompute="selective")
    with pytest.raises(LayoutError, match="recompute_modules op_sac alone"):
        check_for(Layout(**base, recompute_modules=("op_sac", "mlp")), llama, H100)
    with pytest.raises(LayoutError, match="op_sac needs a dense model"):
        check_for(Layout(**base, ep=8, recompute_modules=("op_sac",)), load_model("qwen3-30b-a3b"), H100)
    with pytest.raises(LayoutError, match="recompute_modules op_sac alone"):
        SearchSpace(gpus=8, global_batch=8, seq=2048, selective=(("op_sac", "core_attn"),))
    with pytest.raises(LayoutError, match="op_sac needs a dense model"):
        search(load_model("deepseek-v2"), H100, SearchSpace(gpus=8, global_batch=8, seq=2048,
                                                            selective=(("op_sac",),)))
    # a full-recompute or no-recompute space may hold it as an unread choice
    assert np.isfinite(search(llama, H100, SearchSpace(gpus=8, global_batch=8, seq=2048, recomputes=("none",),
                                                       selective=(("op_sac",),)), keep=1).est.step_time_s).all()


def test_torchtitans_eager_per_op_rows_state_its_policy():
    from table_support import bundled_rows

    rows = {r["id"]: r for r in bundled_rows("torchtitan")}
    per_op = {k for k, r in rows.items() if r["recompute_modules"] == "op_sac"}
    # the 2024 A100 runs, uncompiled: torch's eager SAC, whose cache op_sac prices
    assert per_op == {"tt20", "tt24", "tt25"} and all(rows[k]["kernels"] == "eager" for k in per_op)
    assert all("selective op" in rows[k]["notes"] for k in per_op)
