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


@pytest.mark.parametrize("tp,native", [(1, False), (1, True), (8, False), (8, True)])
def test_the_planner_re_runs_the_block_forward_but_the_kernel_and_the_gemms_the_policy_keeps(tp, native):
    from piper_plan.cost.compute import _attention_shapes, _ffn_shapes, _linears, core_attention

    m = load_model("llama3-8b")
    lay = from_layouts([Layout(gpus=8, tp=tp, dp=8 // tp, global_batch=8, seq=8192, recompute="selective",
                               recompute_modules=("op_sac",), native_eager=native)])
    a, f = attention_phase(m, H100, lay, "bf16"), ffn_phase(m, H100, lay, "bf16")
    core = core_attention(m, H100, lay, "bf16")
    qkv, _ = _linears(H100, "bf16", lay.act_bytes, *_attention_shapes(m, lay))
    up, down = _linears(H100, "bf16", lay.act_bytes, *_ffn_shapes(m, lay))
    kv = max(m.kv_heads / tp, 1.0)
    q_v = qkv.f[0] * (m.num_heads / tp + kv) / (m.num_heads / tp + 2 * kv)  # wq's and wv's share of the GEMM
    kept = core.f[0] + q_v + up.f[0] / 2 + down.f[0]  # the kernel, wq, wv, w1 and w2: their outputs kept
    assert a.r[0] + f.r[0] == pytest.approx(a.f[0] + f.f[0] - kept, rel=1e-12)


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
    # biased linears run as aten.addmm, off the list; materialised scores, piper-train's modules and cp are
    # stacks the policy is not priced on
    with pytest.raises(LayoutError, match="linear biases"):
        check_for(Layout(**base, recompute_modules=("op_sac",)), load_model("gpt-1.7b"), H100)
    for kw in (dict(attention_kernel="eager"), dict(fused_kernels=False), dict(cp=2, dp=4)):
        with pytest.raises(LayoutError, match="op_sac with an SDPA kernel"):
            check_for(Layout(**{**base, **kw}, recompute_modules=("op_sac",)), llama, H100)
    with pytest.raises(LayoutError, match="op_sac with an SDPA kernel"):
        SearchSpace(gpus=8, global_batch=8, seq=8192, cps=(1, 2), selective=(("op_sac",),))
    # a full-recompute or no-recompute space may hold it as an unread choice
    assert np.isfinite(search(llama, H100, SearchSpace(gpus=8, global_batch=8, seq=2048, recomputes=("none",),
                                                       selective=(("op_sac",),)), keep=1).est.step_time_s).all()


def test_torchtitans_per_op_rows_state_its_policy():
    from table_support import bundled_rows

    rows = {r["id"]: r for r in bundled_rows("torchtitan")}
    per_op = {k for k, r in rows.items() if r["recompute_modules"] == "op_sac"}
    # the 2024 A100 runs, uncompiled: torch's eager SAC, whose cache op_sac prices
    eager = {k for k in per_op if rows[k]["kernels"] == "eager"}
    assert eager == {"tt20", "tt24", "tt25"} and all("selective op" in rows[k]["notes"] for k in eager)
    # the 2025 runs compiled their blocks: the partitioner's saves (tests/test_compiled.py)
    compiled = per_op - eager
    assert len(compiled) == 9 and all("model" in rows[k]["compile"] for k in compiled)
    assert all("per-op SAC" in rows[k]["notes"] or "AC=selective(op)" in rows[k]["notes"] for k in compiled)


def test_a_non_gated_ffn_keeps_its_up_projection_alone_and_tp_keeps_both_reduce_scatters():
    m = _spec(80, 5, 5, 16, 152, 224).model_copy(update={"ffn_gated": False})
    lay = from_layouts([Layout(gpus=1, global_batch=1, seq=152, recompute="selective", recompute_modules=("op_sac",))])
    # the 5th aten.mm (fc1) kept, the 6th (fc2) re-made: only fc1's output
    assert float(activations.ffn_terms(m, lay)["sac_ffn"][0]) == 2.0 * 152 * 224
    llama = load_model("llama3-8b")
    tp = from_layouts([Layout(gpus=8, tp=8, global_batch=8, seq=4096, recompute="selective",
                              recompute_modules=("op_sac",), sequence_parallel=sp) for sp in (True, False)])
    att, ffn = activations.attention_terms(llama, tp), activations.ffn_terms(llama, tp)
    t, d = 4096.0, llama.hidden_size
    # sequence-parallel: wo's and w2's reduce-scatter outputs (on the list) beside their partial sums
    assert ffn["sac_ffn"][0] - ffn["sac_ffn"][1] == 2.0 * t * d / 8
    assert att["sac_attn"][0] - att["sac_attn"][1] == pytest.approx(2.0 * t * d / 8 - 2.0 * t * d * 7 / 8)


def test_the_backward_holds_the_block_it_rebuilds_beside_what_the_policy_kept():
    m = load_model("llama3-8b")
    base = dict(gpus=8, dp=8, zero=3, mbs=1, global_batch=8, seq=8192)
    op = estimate_layout(m, H100, Layout(**base, recompute="selective", recompute_modules=("op_sac",)))
    core = estimate_layout(m, H100, Layout(**base, recompute="selective"))
    rebuilt = op.memory["first"]["recomputed_layer"][0]
    assert rebuilt > 0.5 and core.memory["first"].get("recomputed_layer", [0.0])[0] == 0.0


def test_llama2_70b_fits_an_a100_at_one_sequence_and_not_at_two_as_torchtitans_footnote_says(tmp_path):
    """torchtitan's 2024 table: "Since the 70B training with local batch size 2 will cause an OOM error
    when selective activation checkpointing is used, we report the local batch size 1 case instead"."""
    from table_support import bundled_rows, write_rows

    from piper_plan import validate as V

    one = next(r for r in bundled_rows("torchtitan") if r["id"] == "tt25")
    assert one["mbs"] == "1" and one["recompute_modules"] == "op_sac" and "OOM error" in one["notes"]
    two = {**one, "id": "tt25-two", "mbs": "2", "gbs": "128"}
    res = {r.id: r for r in V.run(path=write_rows(tmp_path / "t.csv", [one, two]))}
    assert res["tt25"].peak_memory_gib < 80.0 < res["tt25-two"].peak_memory_gib


def test_the_cli_search_at_8k_tries_op_sac_at_cp_1_where_cp_is_left_to_it(tmp_path):
    """From 8K tokens --cp auto tries 1, 2, 4 and 8, but the per-op policy is priced at cp 1 only:
    a space that lists it is searched at cp 1 rather than refused; asked for, cp 2 is refused."""
    import json

    from click.testing import CliRunner

    from piper_plan.cli import main

    args = ["search", "-m", "llama3-8b", "-H", "dgx-h100", "-n", "8", "--global-batch", "8", "--seq", "8192",
            "--zero", "3", "--fsdp2", "--selective", "op_sac", "--attention", "fa2"]
    out = CliRunner().invoke(main, args + ["-o", str(tmp_path / "plan.json")])
    assert out.exit_code == 0, out.output
    assert json.loads((tmp_path / "plan.json").read_text())["layout"]["cp"] == 1
    asked = CliRunner().invoke(main, args + ["--cp", "1,2"])
    assert asked.exit_code != 0 and "op_sac with an SDPA kernel, bf16 modules and cp 1" in asked.output
