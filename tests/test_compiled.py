"""A PyTorch-native stack under torch.compile (Layout.compiled): Inductor's partitioner saves for the
backward only what the backward reads. Under torchtitan's per-op policy a compiled block keeps
what torch's eager SAC cache keeps but the down projection's output; a compiled loss keeps the
logits in their own dtype and two fp32 figures a token, not fp32 log-probabilities. Both are the
partitioner's own decisions, run on CPU (benchmarks/native_block.partitioned_saves)."""
import numpy as np
import pytest
from benchmark_support import load_benchmark
from table_support import bundled_rows

from piper_plan.cost import activations
from piper_plan.cost.batch import from_layouts
from piper_plan.cost.estimate import evaluate
from piper_plan.errors import LayoutError
from piper_plan.evaluate import estimate_layout
from piper_plan.layout import Layout, check_for
from piper_plan.runtimes import layout_refusal
from piper_plan.search import SearchSpace, search
from piper_plan.specs import load_hardware, load_model
from piper_plan.specs.model import ModelSpec

H100 = load_hardware("dgx-h100")
SHAPES = [(80, 5, 5, 16, 152, 224), (112, 8, 2, 24, 176, 288), (96, 6, 1, 16, 168, 200)]


def _native():
    load_benchmark("eager_bytes")  # puts benchmarks/ on the path
    import native_block

    return native_block


def _op_sac_layout(t, compiled=("model",), **kw):
    return from_layouts([Layout(**{"gpus": 1, **kw}, global_batch=1, seq=t, recompute="selective",
                                recompute_modules=("op_sac",), compiled=compiled)])


def _spec(d, h, kv, hd, t, f, vocab=256):
    return ModelSpec(name="held-out", num_layers=1, hidden_size=d, num_heads=h, num_kv_heads=kv, head_dim=hd,
                     vocab_size=vocab, seq_len=t, ffn_size=f)


def _nbytes(v):
    return v.numel() * v.element_size()


@pytest.mark.parametrize("shape", SHAPES, ids=["mha", "gqa", "mqa"])
def test_a_compiled_op_sac_block_keeps_what_inductors_partitioner_saves(shape):
    torch = pytest.importorskip("torch")
    from torch.utils.checkpoint import checkpoint

    nb = _native()
    d, h, kv, hd, t, f = shape
    torch.manual_seed(0)
    blk = nb.TransformerBlock(d, h, kv, hd, f).to(torch.bfloat16)
    context_fn, _, _ = nb.op_sac_context()
    x = torch.randn(1, t, d, dtype=torch.bfloat16, requires_grad=True)
    saves = nb.partitioned_saves(lambda a, cis: checkpoint(blk, a, cis, use_reentrant=False, context_fn=context_fn),
                                 x, nb.freqs_cis(hd, t))
    # the graph's inputs it keeps are the block input, the rotary table and the weights: only the
    # block input is the layer's activation
    made = sum(_nbytes(v) for v, is_input in saves if not is_input)
    assert any(is_input and tuple(v.shape) == tuple(x.shape) for v, is_input in saves)
    m = _spec(*shape)
    assert _saved_terms(m, _op_sac_layout(t)) == made + _nbytes(x)
    # torch's eager SAC cache keeps the down projection's output besides (tests/test_op_sac.py)
    assert _saved_terms(m, _op_sac_layout(t, ())) - _saved_terms(m, _op_sac_layout(t)) == 2.0 * t * d


TP_CASES = [(True, True), (False, True), (False, False), (True, False)]  # (sequence parallel, gated)


def test_a_compiled_tensor_parallel_block_keeps_what_the_partitioner_saves():
    """At tp 2, with sequence parallelism wo's reduce-scatter output is kept (the backward rebuilds
    the FFN norm's input from it) and nothing downstream of w2; without it, a gated block keeps w2's
    partial sums (its all-reduce, tagged for re-making, pulls them into the saved set)."""
    import json
    import os
    import subprocess
    import sys

    from benchmark_support import BENCHMARKS

    pytest.importorskip("torch")
    shape = (64, 4, 2, 16, 32, 192)
    script = ("import json, sys; sys.path.insert(0, 'benchmarks'); import native_block as nb; "
              f"print(json.dumps([nb.tp_op_sac_saves({shape}, 2, sp, g) for sp, g in {TP_CASES}]))")
    run = subprocess.run([sys.executable, "-c", script], cwd=BENCHMARKS.parent, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})  # a fake process group: alone
    assert run.returncode == 0, run.stderr[-2000:]
    saved = dict(zip(TP_CASES, json.loads(run.stdout.strip().splitlines()[-1])))
    t, d = shape[4], shape[0]
    for (sp, gated), got in saved.items():
        m = _spec(*shape).model_copy(update={"ffn_gated": gated})
        priced = {c: _saved_terms(m, _op_sac_layout(t, c, gpus=2, tp=2, sequence_parallel=sp))
                  for c in ((), ("model",))}
        assert priced[("model",)] == got, (sp, gated)
        # what the eager cache keeps besides: w2's partial sums and reduce-scatter output, where compiled
        # sequence parallelism drops them; a gated block without it keeps the partial sums all the same
        extra = 2.0 * (t * d + t * d / 2) if sp and gated else 2.0 * t * d / 2 if sp else 0.0
        assert priced[()] - priced[("model",)] == extra, (sp, gated)


def _saved_terms(m, lay) -> float:
    return sum(float(v[0]) for v in {**activations.attention_terms(m, lay), **activations.ffn_terms(m, lay)}.values())


def test_a_compiled_loss_keeps_the_logits_in_their_dtype_and_two_fp32_figures_a_token():
    torch = pytest.importorskip("torch")
    nb = _native()
    t, vocab = 100, 500
    pred = torch.randn(1, t, vocab, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (1, t))
    saves = nb.partitioned_saves(nb.cross_entropy_loss, pred, labels)
    kept_inputs = sorted(tuple(v.shape) for v, is_input in saves if is_input)
    assert kept_inputs == [(1, t), (1, t, vocab)]  # the labels and the bf16 logits, not an fp32 copy
    made = [v for v, is_input in saves if not is_input]
    assert sorted(tuple(v.shape) for v in made if v.numel() > 1) == [(t, 1), (t, 1)]  # max, log-sum-exp
    assert all(v.dtype == torch.float32 for v in made)
    # the planner's logits at one micro-batch in flight: what it keeps plus the gradient (bf16)
    m = _spec(64, 4, 4, 16, t, 128, vocab=vocab)
    base = dict(gpus=1, global_batch=1, seq=t)
    compiled, plain = (evaluate(m, H100, from_layouts([Layout(**base, compiled=c)])).memory
                       for c in (("loss",), ()))
    role = next(iter(compiled))
    gib = 2.0**30
    assert compiled[role]["logits"][0] * gib == pytest.approx(_nbytes(pred) + 8.0 * t + 2.0 * t * vocab, rel=1e-12)
    assert plain[role]["logits"][0] * gib == pytest.approx(4.0 * t * vocab + 2.0 * t * vocab, rel=1e-12)


def test_compiling_changes_memory_and_only_the_re_runs_nothing_reads():
    m = load_model("llama3-8b")
    base = dict(gpus=8, dp=8, zero=3, fsdp2=True, mbs=1, global_batch=8, seq=8192)
    lays = {c: Layout(**base, recompute="selective", recompute_modules=("op_sac",), compiled=c)
            for c in ((), ("model",), ("model", "loss"))}
    est = {c: estimate_layout(m, H100, lay) for c, lay in lays.items()}
    # the same kernels and recompute at tp 1: the step takes as long
    assert len({float(e.step_time_s[0]) for e in est.values()}) == 1
    peaks = [float(est[c].peak_memory_gib[0]) for c in lays]
    assert peaks[0] > peaks[1] > peaks[2]
    # what the compiled block drops it does not rebuild in its backward either
    rebuilt = [float(est[c].memory["first"]["recomputed_layer"][0]) for c in lays]
    assert rebuilt[0] == rebuilt[1] > 0
    # at tp 2 without sequence parallelism the compiled backward does not re-run w2's all-reduce
    tp2 = dict(base, tp=2, dp=4, sequence_parallel=False)
    t_eager, t_comp = (estimate_layout(m, H100, Layout(**tp2, recompute="selective", recompute_modules=("op_sac",),
                                                       compiled=c)).step_time_s[0] for c in ((), ("model",)))
    assert t_comp < t_eager
    # under full recompute a compiled model's block keeps what the fused stack keeps (its input)
    plain = [estimate_layout(m, H100, Layout(**base, recompute="full", compiled=c)).peak_memory_gib[0]
             for c in ((), ("model",))]
    assert plain[0] == plain[1]


def test_the_search_bounds_the_micro_batch_by_the_logits_the_compiled_loss_keeps():
    m, hw = load_model("llama3-8b"), load_hardware("dgx-a100-80gb")
    kw = dict(gpus=8, global_batch=128, seq=8192, tps=(1,), pps=(1,), recomputes=("full",), zeros=(3,), mbs=(16,))
    # 16 sequences' fp32 logits (4 B) and their gradient (2 B) outweigh an A100's 80 GiB (94 GiB);
    # kept in bf16 they do not (63 GiB)
    from piper_plan.search import LOGITS_BOUND

    eager = search(m, hw, SearchSpace(**kw))
    assert eager.rejected.get(LOGITS_BOUND, 0) > 0 and eager.evaluated == 0
    compiled = search(m, hw, SearchSpace(**kw, compiled=("loss",)))
    assert LOGITS_BOUND not in compiled.rejected and compiled.evaluated > 0


def test_what_compile_cannot_run_beside_is_refused():
    llama = load_model("llama3-8b")
    base = dict(gpus=8, dp=8, global_batch=8, seq=2048)
    with pytest.raises(LayoutError, match="compiled model without native_eager"):
        check_for(Layout(**base, native_eager=True, compiled=("model",)), llama, H100)
    check_for(Layout(**base, native_eager=True, compiled=("loss",)), llama, H100)  # the loss alone may be
    for kw in (dict(fused_kernels=False), dict(cuda_graphs=("attn",))):
        with pytest.raises(LayoutError, match="compiled with fused_kernels true"):
            check_for(Layout(**base, **kw, compiled=("loss",)), llama, H100)
    with pytest.raises(LayoutError, match="compiled with fused_kernels true"):
        SearchSpace(gpus=8, global_batch=8, seq=2048, fused_kernels=False, compiled=("model",))
    assert layout_refusal(Layout(**base, compiled=("loss",)), llama).startswith("layout.compiled = ")
    with pytest.raises(LayoutError, match="model and loss, each once"):
        check_for(Layout(**base, compiled=("model", "model")), llama, H100)
    with pytest.raises(LayoutError, match="model and loss, each once"):
        SearchSpace(gpus=8, global_batch=8, seq=2048, compiled=("graph",))


@pytest.mark.parametrize("cells,why", [({"compile": "model+model"}, "model and loss each once"),
                                       ({"compile": "model", "kernels": "eager"}, "no model beside kernels eager"),
                                       ({"compile": "loss", "cuda_graphs": "attn"}, "blank beside Megatron-Core"),
                                       ({"compile": "graph"}, "expected none or model, loss")])
def test_a_table_s_compile_cell_is_refused_in_one_line_where_it_cannot_be_priced(tmp_path, cells, why):
    from click.testing import CliRunner
    from table_support import write_rows

    from piper_plan.cli import main

    row = {**next(r for r in bundled_rows("torchtitan") if r["id"] == "tt20"), **cells}
    out = CliRunner().invoke(main, ["validate", "--table", str(write_rows(tmp_path / "t.csv", [row]))])
    assert out.exit_code != 0 and "row tt20: compile: " in out.output and why in out.output
    assert "Traceback" not in out.output and len(out.output.strip().splitlines()) == 1


def test_the_cli_reads_compile_and_refuses_a_word_it_does_not_know():
    from click.testing import CliRunner

    from piper_plan.cli import main

    args = ["estimate", "-m", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "8", "--global-batch", "8",
            "--seq", "8192", "--zero", "3", "--fsdp2", "--recompute", "selective", "--recompute-modules", "op_sac"]
    runs = {c: CliRunner().invoke(main, args + ["--compile", c, "--json"]) for c in ("none", "model,loss")}
    assert all(r.exit_code == 0 for r in runs.values())
    import json

    peak = {c: json.loads(r.output)["peak_memory_gib"] for c, r in runs.items()}
    assert peak["model,loss"] < peak["none"]
    bad = CliRunner().invoke(main, args + ["--compile", "graph"])
    assert bad.exit_code != 0 and "--compile" in bad.output and "model, loss" in bad.output
    assert "Traceback" not in bad.output


def test_torchtitans_compiled_per_op_rows_state_what_their_versions_compiled():
    rows = {r["id"]: r for r in bundled_rows("torchtitan")}
    compiled = {k: r["compile"] for k, r in rows.items() if r.get("compile")}
    # torch.compile on every per-op row of 2025; the loss with it from torchtitan #1033 (April 2025) on:
    # the June 2025 H200 runs and the August 2025 MI300X runs, not the torchtitan 0.0.2 H100 runs
    assert compiled == {**{k: "model+loss" for k in ("tt27", "tt28", "tt38", "tt39", "tt40", "tt41")},
                        **{k: "model" for k in ("tt35", "tt36", "tt37")}}
    assert all(rows[k]["recompute_modules"] == "op_sac" and "compile=on" in rows[k]["notes"] for k in compiled)
    assert all("torchtitan version: 0.0.2" in rows[k]["notes"] for k in ("tt35", "tt36", "tt37"))


def test_torchtitans_compiled_runs_are_met_from_below_by_the_reserved_peak_they_publish():
    """The nine compiled runs publish torchtitan's logged memory, the caching allocator's reserved
    peak, which holds more than the tensors live at any moment: the model's peak sits below each
    (within 7.3 % since the eager loss of the three H100 runs is priced: Layout.cross_entropy; the
    bound here is looser, a guard)."""
    import re

    from piper_plan import validate as V

    table = V.data_path().parent / "torchtitan.csv"
    res = {r.id: r for r in V.run(path=table)}
    rows = {r["id"]: r for r in bundled_rows("torchtitan") if r.get("compile")}
    for rid, row in rows.items():
        cells = [c.strip() for c in re.search(r"Row quote: '([^']*)'", row["notes"]).group(1).strip("|").split("|")]
        published = float(cells[2])  # (NUM_NODES|TPS/GPU|Memory GiB), (model|recipe|memory|tps|speed-up)
        assert 0.85 * published <= res[rid].peak_memory_gib <= published, rid
    assert len(rows) == 9 and np.isfinite([res[k].peak_memory_gib for k in rows]).all()
