"""A PyTorch-native stack's dense block run without torch.compile (Layout.native_eager: torchtitan's
2024 presets): its eager traffic and saved tensors are torchtitan's block's own, counted on
benchmarks/native_block.py; it is refused where that count does not hold; validation tables state
it in their kernels column."""
import json

import numpy as np
import pytest
from benchmark_support import load_benchmark
from click.testing import CliRunner
from table_support import bundled_rows, write_rows

from piper_plan import validate as V
from piper_plan.cli import main
from piper_plan.cost import activations, eager
from piper_plan.cost.batch import from_layouts
from piper_plan.cost.kernels import stream_time
from piper_plan.errors import LayoutError
from piper_plan.evaluate import estimate_layout
from piper_plan.layout import Layout, check_for
from piper_plan.runtimes import layout_refusal
from piper_plan.search import SearchSpace, search
from piper_plan.specs import load_hardware, load_model
from piper_plan.specs.model import ModelSpec

A100 = load_hardware("dgx-a100-80gb")
# shapes outside benchmarks/eager_bytes.SOLVE_NATIVE: multi-head, grouped (heads·head_dim != d) and one kv head
HELD_OUT = [(80, 5, 5, 16, 152, 224), (112, 8, 2, 24, 176, 288), (96, 6, 1, 16, 168, 200)]


def _spec(d, h, kv, hd, t, f):
    return ModelSpec(name="held-out", num_layers=1, hidden_size=d, num_heads=h, num_kv_heads=kv, head_dim=hd,
                     vocab_size=256, seq_len=t, ffn_size=f)


def _native(t, **kw):
    return from_layouts([Layout(gpus=1, global_batch=1, seq=t, native_eager=True, **kw)])


@pytest.mark.parametrize("shape", HELD_OUT, ids=["mha", "gqa", "mqa"])
def test_the_bytes_per_element_reproduce_torchtitans_block_counted_op_by_op(shape):
    pytest.importorskip("torch")
    counted = load_benchmark("eager_bytes").count_native(*shape)
    fwd = counted["forward_bytes"]["elementwise"]
    m, t = _spec(*shape), shape[4]
    lay = _native(t)
    huge = A100.model_copy(update={"efficiency": A100.efficiency.model_copy(update={"kernel_overhead_us": 0.0})})
    rate = A100.accelerator.memory_bandwidth_gbps * 1e9 * A100.efficiency.memory
    token = eager.token_phase(m, huge, lay)
    ffn = eager.ffn_phase(m, huge, lay, m.ffn_size)
    priced = [(token[i][0] + ffn[i][0]) * rate for i in range(2)]
    assert priced == pytest.approx([fwd, counted["bytes"]["elementwise"] - fwd], rel=0.005)
    # and its ops: two more each way where K and V are repeated (one kv head: forward a view)
    rep_f, rep_b = (eager.native_repeats(shape[1], shape[2], ph) for ph in "fb")
    assert counted["forward_ops"]["elementwise"] == eager.NATIVE_OPS["f"][int(rep_f)]
    assert counted["ops"]["elementwise"] - counted["forward_ops"]["elementwise"] == eager.NATIVE_OPS["b"][int(rep_b)]


@pytest.mark.parametrize("shape", HELD_OUT, ids=["mha", "gqa", "mqa"])
def test_the_saved_activations_are_torchtitans_block_s_byte_for_byte(shape):
    torch = pytest.importorskip("torch")
    load_benchmark("eager_bytes")  # puts benchmarks/ on the path for native_block
    from native_block import TransformerBlock, freqs_cis

    d, h, kv, hd, t, f = shape
    blk = TransformerBlock(d, h, kv, hd, f).to(torch.bfloat16)
    params = {p.data_ptr() for p in blk.parameters()}
    cis = freqs_cis(hd, t)  # one model-wide table, not a layer's
    saved = {}

    def pack(x):
        st = x.untyped_storage()
        if x.data_ptr() not in params and st.data_ptr() != cis.untyped_storage().data_ptr():
            saved[st.data_ptr()] = st.nbytes()
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        blk(torch.randn(1, t, d, dtype=torch.bfloat16, requires_grad=True), cis)
    m, lay = _spec(*shape), _native(t)
    terms = {**activations.attention_terms(m, lay), **activations.ffn_terms(m, lay)}
    assert sum(float(v[0]) for v in terms.values()) == sum(saved.values())


def test_the_eager_block_costs_more_than_the_fused_passes_and_less_than_piper_trains():
    m = load_model("llama3-8b")
    base = dict(gpus=64, dp=64, zero=3, mbs=1, global_batch=64, seq=8192, attention_kernel="fa2")
    fused, native, unfused = (estimate_layout(m, A100, Layout(**base, **kw)).time["compute"][0]
                              for kw in ({}, dict(native_eager=True), dict(fused_kernels=False)))
    assert fused * 1.05 < native < unfused  # piper-train adds fp32 residuals and weight casts
    lay = from_layouts([Layout(**base, native_eager=True), Layout(**base)])
    assert eager.applies(A100, lay).tolist() == [True, False]
    # its saved tensors too: fp32 norm inputs, silu(gate) and repeated K and V beside the fused list
    mem = [estimate_layout(m, A100, Layout(**base, **kw)).peak_memory_gib[0] for kw in ({}, dict(native_eager=True))]
    assert mem[1] > mem[0] + 5.0


def test_tensor_parallel_ranks_each_price_their_heads_and_at_least_one_kv_head():
    m = load_model("llama3-8b")  # 8 kv heads: tp 16 leaves each rank one, which repeat_kv does not copy
    lay = from_layouts([Layout(gpus=16, tp=tp, dp=16 // tp, global_batch=16, seq=4096, native_eager=True)
                        for tp in (8, 16)])
    assert eager.native_repeats(32 / lay.tp, np.maximum(8 / lay.tp, 1), "f").tolist() == [False, False]
    assert eager.native_repeats(32 / lay.tp, np.maximum(8 / lay.tp, 1), "b").tolist() == [True, True]
    f, b = eager.token_phase(m, A100, lay)
    t = lay.tokens.astype(float)
    want = stream_time(A100, sum(c * n for c, n in zip(eager.NATIVE["f"], [
        t * 4096 / 16, t * 4096 / 16, t * 128, t / 16, t * 128, 0.0])), eager.NATIVE_OPS["f"][0])
    assert f[1] == pytest.approx(float(want[1]))


def test_it_is_refused_where_the_count_does_not_hold():
    llama = load_model("llama3-8b")
    with pytest.raises(LayoutError, match="native_eager with fused_kernels true"):
        check_for(Layout(gpus=8, dp=8, global_batch=8, seq=2048, native_eager=True, fused_kernels=False), llama, A100)
    with pytest.raises(LayoutError, match="native_eager in bf16 or fp16"):
        check_for(Layout(gpus=8, dp=8, global_batch=8, seq=2048, native_eager=True, dtype="fp32"), llama, A100)
    with pytest.raises(LayoutError, match="native_eager in bf16 or fp16"):
        SearchSpace(gpus=8, global_batch=8, seq=2048, native_eager=True, dtype="fp32")
    lay = Layout(gpus=8, dp=8, ep=8, global_batch=8, seq=2048, native_eager=True)
    for name, what in (("qwen3-30b-a3b", "MoE layers"), ("deepseek-v2", "MoE layers")):
        with pytest.raises(LayoutError, match=what):
            check_for(lay, load_model(name), A100)
    mla = load_model("deepseek-v2").model_copy(update={"moe": None, "ffn_size": 1024})
    with pytest.raises(LayoutError, match="multi-latent attention"):
        check_for(lay.model_copy(update={"ep": 1}), mla, A100)
    sp = SearchSpace(gpus=8, global_batch=8, seq=2048, native_eager=True)
    with pytest.raises(LayoutError, match="native_eager needs a Llama-style dense model"):
        search(load_model("qwen3-30b-a3b"), A100, sp)
    # Megatron's GPT: LayerNorm, a GELU FFN and biases, none of which the block counted has
    with pytest.raises(LayoutError, match="has LayerNorm, a GELU FFN, linear biases, learned positions;"):
        check_for(lay.model_copy(update={"ep": 1}), load_model("gpt-1.7b"), A100)
    with pytest.raises(LayoutError, match="without Megatron-Core's cuda_graphs"):
        check_for(Layout(gpus=8, dp=8, global_batch=8, seq=2048, native_eager=True, cuda_graphs=("attn",)), llama,
                  A100)
    dense = Layout(gpus=8, dp=8, global_batch=8, seq=2048, native_eager=True, fused_kernels=True)
    assert "layout.native_eager = true" in layout_refusal(dense, load_model("llama3-8b"))


def test_the_search_prices_every_layout_with_the_eager_block():
    m = load_model("llama3-8b")
    kw = dict(gpus=16, global_batch=32, seq=4096, schedules=("1f1b",))
    plain, eager_ = (search(m, A100, SearchSpace(**kw, native_eager=n), keep=1) for n in (False, True))
    assert plain.batch.native.sum() == 0 and eager_.batch.native.all()
    assert eager_.est.step_time_s[0] > plain.est.step_time_s[0]


def test_the_cli_prices_kernels_eager_and_refuses_it_one_line_where_it_does_not_hold():
    args = ["estimate", "-m", "llama3-8b", "-H", "dgx-a100-80gb", "-n", "8", "--zero", "3", "--seq", "4096",
            "--global-batch", "8"]
    runs = {k: CliRunner().invoke(main, args + ["--kernels", k, "--json"]) for k in ("fused", "eager")}
    assert all(r.exit_code == 0 for r in runs.values()), runs["eager"].output
    got = {k: json.loads(r.output) for k, r in runs.items()}
    assert got["eager"]["layout"]["native_eager"] and not got["fused"]["layout"]["native_eager"]
    assert got["eager"]["step_time_s"] > got["fused"]["step_time_s"]
    for bad, word in ((["--kernels", "eager", "--dtype", "fp32"], "native_eager in bf16 or fp16"),
                      (["--kernels", "eager", "--runtime", "piper-train", "--zero", "1"], "layout.native_eager")):
        out = CliRunner().invoke(main, args + bad)
        assert out.exit_code != 0 and word in out.output, out.output
    s = CliRunner().invoke(main, ["search", "-m", "llama3-8b", "-H", "dgx-a100-80gb", "-n", "8", "--seq", "4096",
                                  "--global-batch", "8", "--kernels", "eager", "--runtime", "piper-train"])
    assert s.exit_code != 0 and "it cannot run --kernels eager (piper-train runs its own eager modules" in s.output
    moe = CliRunner().invoke(main, ["estimate", "-m", "qwen3-30b-a3b", "-H", "dgx-a100-80gb", "-n", "8", "--ep", "8",
                                    "--seq", "4096", "--global-batch", "8", "--kernels", "eager"])
    assert moe.exit_code != 0 and "native_eager needs a Llama-style dense model" in moe.output
    assert len(moe.output.strip().splitlines()) == 1


def test_torchtitans_2024_rows_state_eager_kernels_and_are_priced_with_them(tmp_path):
    rows = bundled_rows("torchtitan")
    stated = {r["id"] for r in rows if r.get("kernels") == "eager"}
    assert stated == {f"tt{i}" for i in range(19, 27)}  # the 64-A100 presets: compile false, rmsnorm
    path = V.data_path().parent / "torchtitan.csv"
    blank = write_rows(tmp_path / "fused.csv", [dict(r, kernels="") for r in rows])
    got = {r.id: r.predicted for r in V.run(path=path)}
    fused = {r.id: r.predicted for r in V.run(path=blank)}
    for rid in stated:
        assert got[rid] < 0.95 * fused[rid]
    assert all(got[k] == fused[k] for k in got if k not in stated)
    bad = write_rows(tmp_path / "bad.csv", [dict(r, kernels="eagr" if r["id"] == "tt22" else r["kernels"])
                                            for r in rows])
    out = CliRunner().invoke(main, ["validate", "--table", str(bad)])
    assert out.exit_code != 0 and "kernels" in out.output and "tt22" in out.output
    assert len(out.output.strip().splitlines()) == 1


def test_the_host_issues_every_op_of_the_eager_block():
    from piper_plan.cost.host import layer_ops

    m = load_model("llama3-8b")  # 32 heads, 8 kv heads: repeat_kv copies at tp 1, not at tp 8 (one a rank)
    lay = from_layouts([Layout(gpus=8, tp=tp, dp=8 // tp, global_batch=8, seq=4096, native_eager=n)
                        for tp, n in ((1, False), (1, True), (8, True))])
    dense, _ = layer_ops(m, lay)
    fused8, _ = layer_ops(m, from_layouts([Layout(gpus=8, tp=8, global_batch=8, seq=4096)]))
    # fused: norm+QKV, RoPE x2, attention, projection, residual, two GEMMs; MLP 4 (cost/host.py)
    assert dense[0] == 11.0 and dense[1] == 7 + 1 + eager.NATIVE_OPS["f"][1]  # 7 projections, SDPA, elementwise
    # tp 8: the fused block's four collectives (an all-gather and a reduce-scatter around attention and the MLP)
    assert dense[2] - (7 + 1 + eager.NATIVE_OPS["f"][0]) == fused8[0] - dense[0] == 4.0


def test_a_batch_mixing_eager_and_fused_layouts_prices_each_as_it_would_alone():
    from piper_plan.cost.estimate import evaluate

    m = load_model("llama3-8b")
    base = dict(gpus=64, dp=64, zero=3, mbs=1, global_batch=64, seq=8192, attention_kernel="fa2")
    plain, native = Layout(**base), Layout(**base, native_eager=True)
    alone = [estimate_layout(m, A100, x) for x in (plain, native)]
    for order in ((plain, native), (native, plain)):
        both = evaluate(m, A100, from_layouts(list(order)))
        for i, x in enumerate(order):
            ref = alone[0] if x is plain else alone[1]
            assert both.step_time_s[i] == pytest.approx(ref.step_time_s[0])
            assert both.peak_memory_gib[i] == pytest.approx(ref.peak_memory_gib[0])


def test_without_sequence_parallelism_every_tp_rank_runs_the_norms_on_every_token():
    m = load_model("llama3-8b")
    lay = from_layouts([Layout(gpus=8, tp=8, global_batch=8, seq=4096, native_eager=True, sequence_parallel=sp)
                        for sp in (True, False)])
    f, b = eager.token_phase(m, A100, lay)
    t = float(lay.tokens[0])
    rate = A100.accelerator.memory_bandwidth_gbps * 1e9 * A100.efficiency.memory
    # the t·d and t terms, seven eighths of the tokens more on each rank
    extra = (eager.NATIVE["f"][0] * m.hidden_size + eager.NATIVE["f"][3]) * t * 7 / 8
    assert f[1] - f[0] == pytest.approx(extra / rate)
    assert b[1] > b[0]
