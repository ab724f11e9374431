"""Context parallelism (Layout.cp): each sequence split over cp ranks, attention as a ring that passes
each rank's K and V chunk round the group behind the attention kernels (Megatron-Core's
--context-parallel-size, Transformer Engine's AttnFuncWithCPAndKVP2P), gradients reduced over
dp·cp, experts folded over dp·cp·tp."""
import numpy as np
import pytest

from piper_plan.cost import comm
from piper_plan.cost.activations import attention_terms
from piper_plan.cost.batch import from_layouts
from piper_plan.cost.compute import core_attention
from piper_plan.cost.estimate import evaluate
from piper_plan.cost.kernels import block_factor
from piper_plan.cost.layer import _cp_exposed
from piper_plan.errors import LayoutError, PiperError
from piper_plan.layout import Layout, check_layout, rank_coords
from piper_plan.search import SearchSpace, enumerate_layouts, for_runtime
from piper_plan.specs import load_hardware, load_model
from table_support import bundled_rows, write_rows

H100 = load_hardware("dgx-h100")
LLAMA = load_model("llama3-8b")


def _one(**kw):
    base = dict(gpus=8, global_batch=8, seq=32768, recompute="full")
    return from_layouts([Layout(**{**base, **kw})])


def test_each_rank_holds_its_share_of_the_sequence_and_of_the_attention():
    whole, split = _one(dp=8), _one(dp=2, cp=4)
    assert split.tokens[0] == whole.tokens[0] / 4
    a, b = (core_attention(LLAMA, H100, x, "bf16") for x in (whole, split))
    # a quarter of the FLOPs (the load-balanced causal chunks), each of the ring's four kernels a
    # pass over the rank's query blocks (kernels.tile_cost), a few more launches and merges
    passes = block_factor(H100, 32768, cp=4)[0] / block_factor(H100, 32768)[0]
    assert 1.0 < passes < 1.05
    assert passes * a.f[0] / 4 < b.f[0] < 1.08 * passes * a.f[0] / 4
    ta, tb = (attention_terms(LLAMA, x) for x in (whole, split))
    assert tb["qkv"][0] == pytest.approx(ta["qkv"][0] / 4)
    # the step's work is the same: one sequence a GPU either way, so near the same throughput (the
    # split's compute 5.3 % more: the ring's kernels' passes and merges above, on a step that is
    # mostly attention at 32K; the optimizer's clipping of the shard no longer dilutes it)
    ea, eb = (evaluate(LLAMA, H100, x) for x in (whole, split))
    assert eb.tokens_per_s[0] == pytest.approx(ea.tokens_per_s[0], rel=0.06)
    assert eb.peak_memory_gib[0] < ea.peak_memory_gib[0]


def test_the_ring_exposes_only_what_a_step_takes_beyond_its_share_of_the_attention():
    lay = _one(dp=1, cp=8, seq=8192)
    dqk, dv = LLAMA.qk_v_dims
    kv = lay.tokens[0] * LLAMA.kv_heads * (dqk + dv) * 2.0
    step = float(comm.ring_allreduce(H100, np.array([kv * 8]), np.array([8]), 1, 0.5)[0]) / 7
    core = core_attention(LLAMA, H100, lay, "bf16")
    got = _cp_exposed(LLAMA, H100, lay, core)
    assert got.f[0] == pytest.approx(7 * max(step - core.f[0] / 8, 0.0))
    assert got.b[0] == pytest.approx(7 * max(2 * step - core.b[0] / 8, 0.0))
    # long sequences hide the ring entirely; short ones over the NICs do not where every query head
    # has its own keys and values (multi-head attention, as Llama 2 7B: four times GQA's bytes a
    # step for the same work). Under GQA's 8 KV heads even 128 tokens a rank hide it: each step's
    # kernel pays a pass over the rank's query blocks (kernels.tile_cost)
    long = _one(dp=1, cp=8, seq=131072)
    assert _cp_exposed(LLAMA, H100, long, core_attention(LLAMA, H100, long, "bf16")).total[0] == 0.0
    short = from_layouts([Layout(gpus=32, dp=1, cp=32, global_batch=1, seq=4096)])
    mha = LLAMA.model_copy(update={"num_kv_heads": LLAMA.num_heads})
    assert _cp_exposed(mha, H100, short, core_attention(mha, H100, short, "bf16")).total[0] > 0.0
    assert evaluate(mha, H100, short).time["cp_comm"][0] > 0.0
    assert _cp_exposed(LLAMA, H100, short, core_attention(LLAMA, H100, short, "bf16")).total[0] == 0.0


def test_gradients_and_optimizer_state_shard_over_dp_times_cp():
    a, b = (evaluate(LLAMA, H100, _one(**kw)) for kw in (dict(dp=8), dict(dp=2, cp=4)))
    for part in ("master", "optimizer"):
        assert b.memory["first"][part][0] == pytest.approx(a.memory["first"][part][0])


def test_ranks_order_tp_then_cp_then_dp():
    lay = Layout(gpus=16, tp=2, cp=4, dp=2, global_batch=8, seq=8192)
    by = {c.rank: c for c in rank_coords(lay, 8)}
    assert [(by[r].tp, by[r].cp, by[r].dp) for r in (0, 1, 2, 7, 8)] == [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 3, 0),
                                                                         (0, 0, 1)]


@pytest.mark.parametrize("kw, rule", [(dict(cp=3, dp=1, gpus=3, seq=8192), "seq divisible by 2\\*cp"),
                                      (dict(cp=2, dp=4, attention_kernel="eager"), "cp > 1 needs fused attention"),
                                      (dict(cp=2, dp=8), "tp\\*cp\\*pp\\*dp == gpus")])
def test_layouts_context_parallelism_cannot_run_are_refused_with_the_rule_named(kw, rule):
    with pytest.raises(LayoutError, match=rule):
        check_layout(Layout(**{**dict(gpus=8, global_batch=8, seq=8192), **kw}), 32)


def test_experts_fold_over_the_context_parallel_ranks_too():
    m = load_model("mixtral-8x22b")
    lay = Layout(gpus=64, tp=2, cp=4, pp=8, dp=1, ep=8, global_batch=8, seq=16384)  # ep 8 = dp·cp·tp
    check_layout(lay, m.num_layers, m.moe.num_experts)
    assert lay.edp == 1 and from_layouts([lay]).edp[0] == 1


def test_the_search_tries_the_context_parallel_degrees_asked_for():
    sp = SearchSpace(gpus=32, global_batch=32, seq=32768, cps=(1, 2, 4), schedules=("1f1b",))
    batch, _ = enumerate_layouts(LLAMA, H100, sp)
    assert set(np.unique(batch.cp)) == {1, 2, 4}
    assert (batch.tp * batch.cp * batch.pp * batch.dp == 32).all()
    default, _ = enumerate_layouts(LLAMA, H100, SearchSpace(gpus=32, global_batch=32, seq=32768, schedules=("1f1b",)))
    assert set(np.unique(default.cp)) == {1}
    # the vectorised model prices each context-parallel layout as it prices it alone
    est = evaluate(LLAMA, H100, batch)
    for i in np.random.default_rng(1).choice(len(batch), 16, replace=False):
        one = evaluate(LLAMA, H100, from_layouts([batch.layout(int(i))]))
        assert one.step_time_s[0] == pytest.approx(est.step_time_s[i], rel=1e-12)
    with pytest.raises(PiperError, match="--cp 2"):
        for_runtime(sp, "piper-train")


def test_the_cli_takes_context_parallel_degrees_and_names_them_in_its_layouts():
    from click.testing import CliRunner

    from piper_plan.cli import main

    est = CliRunner().invoke(main, ["estimate", "-m", "llama3-8b", "-H", "dgx-h100", "-n", "8", "--cp", "4",
                                    "--seq", "32768", "--global-batch", "8", "--recompute", "full", "--json"])
    assert est.exit_code == 0, est.output
    assert '"cp": 4' in est.output and '"cp_comm"' in est.output
    args = ["search", "-m", "llama3-8b", "-H", "dgx-h100", "-n", "16", "--global-batch", "16", "--seq", "65536",
            "--schedules", "1f1b", "--top", "500"]
    r = CliRunner().invoke(main, args + ["--cp", "1,4"])
    assert r.exit_code == 0, r.output
    assert " cp4 " in r.output.replace("\n", "")
    bad = CliRunner().invoke(main, args + ["--cp", "two"])
    assert bad.exit_code != 0 and "--cp" in bad.output and len(bad.output.strip().splitlines()) == 1


def test_published_runs_with_context_parallelism_price_within_the_targets_where_their_kernels_are_current(tmp_path):
    # validation/context-parallel.csv: runs with CP > 1 the bundled tables had left out, added
    # before they were priced, as a newcomer's table (recipes inferred from the bundled rows)
    from piper_plan import validate as V
    from piper_plan.validate_rows import read_rows

    path = V.data_path().parent / "context-parallel.csv"
    res = V.run(path=path)
    by_group = {}
    for r in res:
        assert r.predicted > 0, r.id
        by_group.setdefault(r.group, []).append(r)
    err = lambda rs: [abs(x.predicted / x.published - 1) * 100 for x in rs]  # noqa: E731
    # Llama 3.1 405B, Llama 3 70B, Mixtral 8x22B at CP 2-8, each kind against the targets for it
    # (dense: mean 10 %, none beyond 20; MoE: mean 20 %, none beyond 35). The dense rows meet them; the
    # Mixtral 8x22B pair at 64K, CP 8, misses the MoE mean, too fast: +27.3 / +19.4 % (+16.9 / +10.3 % at
    # one flat attention rate, before the kernel's block costs priced its long sequence faster)
    cp_runs = by_group["megatron-bridge-cp"] + by_group["nemo-performance-cp"]
    dense = err([r for r in cp_runs if r.kind == "dense"])
    assert len(dense) >= 2 and np.mean(dense) <= V.TARGETS["dense"][0] and max(dense) <= V.TARGETS["dense"][1]
    moe = {r.id: round(r.error_pct, 1) for r in cp_runs if r.kind == "moe"}
    assert moe == {"nemo-mixtral8x22b-b200-fp8-cp8-2502": 27.3, "nemo-mixtral8x22b-gb200-fp8-cp8-2504": 19.4}
    assert np.mean(list(moe.values())) > V.TARGETS["moe"][0] and max(moe.values()) <= V.TARGETS["moe"][1]
    long = by_group["nemo-long-sequence"]
    # the long-sequence tables count attention's whole square: the H100 rows' TFLOPS over their
    # tokens/s is the model's FLOPs per token with every query against every key, to 0.5 %
    m = load_model("llama3-8b").model_copy(update=dict(num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=32,
                                                       ffn_size=11008, vocab_size=32000))
    h100 = [row for row in read_rows(path) if "llama2-7b" in row["id"]]
    for row in h100:
        per_token = float(row["value"]) * 1e12 / float(row["tokens_per_s_per_gpu"])
        assert per_token == pytest.approx(m.flops_per_token(int(row["seq"]), causal=False), rel=0.005)
        assert row["attention_flops"] == "full"
    # Llama 3 8B on B200, 32K-1M, TFLOPS only: priced in that count. B200's attention plateau is its
    # own cuDNN rate at 4K (0.507 of peak), and the kernel runs faster per FLOP with length, as
    # cuDNN's sweeps do (Efficiency.attention_blocks): every row within 8 %. At one flat rate they
    # read -10.8 ... -20.7 %, slower the longer the sequence (validation/README.md)
    seq = {row["id"]: int(row["seq"]) for row in read_rows(path)}
    b200 = sorted((x for x in long if "b200" in x.id), key=lambda x: seq[x.id])
    assert len(b200) == 6 and np.mean(err(b200)) <= 6.0 and max(err(b200)) <= 8.0, [x.error_pct for x in b200]
    flat = V.run(path=path, hw_edit=lambda hw: hw.model_copy(update={"efficiency": hw.efficiency.model_copy(
        update={"attention_blocks": None})}))
    slow = [x.error_pct for x in sorted((x for x in flat if x.id in {y.id for y in b200}), key=lambda x: seq[x.id])]
    assert all(e < -10.0 for e in slow) and slow[-1] < slow[0] - 5, slow
    # NeMo 24.03's H100 runs ran FlashAttention-2 (their launcher exported NVTE_FUSED_ATTN=0): priced so,
    # at its own block costs, they read within 10 % at every length; at cuDNN's rate, the spec's own
    # kernel, whose per-FLOP cost falls faster with length, 40-70 % too fast
    h100_runs = [x for x in long if "h100" in x.id]
    assert len(h100_runs) == 6 and all(row["attention_kernel"] == "fa2" for row in h100)
    assert all(abs(x.error_pct) <= 10.0 for x in h100_runs)
    blank = write_rows(tmp_path / "context-parallel.csv", ({**r, "attention_kernel": ""} for r in
                                                          bundled_rows("context-parallel")))
    at_cudnn = [x for x in V.run(path=blank) if x.group == "nemo-long-sequence" and "h100" in x.id]
    assert len(at_cudnn) == 6 and all(40.0 <= x.error_pct <= 70.0 for x in at_cudnn)


def test_a_row_naming_another_attention_count_is_refused_with_the_column_named(tmp_path):
    from piper_plan import validate as V

    bad = write_rows(tmp_path / "bad.csv", [{**bundled_rows("context-parallel")[0], "attention_flops": "half"}])
    with pytest.raises(PiperError, match="attention_flops.*expected causal"):
        V.run(path=bad)


def test_the_cli_tries_context_parallelism_by_itself_for_long_sequences_only():
    from click.testing import CliRunner

    from piper_plan.cli import main

    def cps(*extra):
        r = CliRunner().invoke(main, ["search", "-m", "llama3-8b", "-H", "dgx-h100", "-n", "16", "--global-batch", "16",
                                      "--schedules", "1f1b", "--top", "3000", *extra])
        assert r.exit_code == 0, r.output
        return {int(w[2:]) for w in r.output.replace("\n", " ").split() if w.startswith("cp") and w[2:].isdigit()}

    assert cps("--seq", "32768") >= {2, 4}
    assert cps("--seq", "4096") == set()  # whole sequences below 8K tokens
    assert cps("--seq", "32768", "--runtime", "piper-train") == set()  # piper-train keeps sequences whole


def test_a_handed_over_schema_row_is_read_with_the_context_parallelism_its_notes_state(tmp_path):
    # the handed-over schema (../shared/validation) has no cp column: a row whose tp·pp·dp leaves
    # a factor of its GPUs that its notes call CP is priced with it; one whose notes do not is an
    # error naming the product, as before
    import csv

    from piper_plan import validate as V

    src = next(r for r in csv.DictReader(open(V.data_path())) if r["id"] == "mb-dsv3-gb300-bf16")
    cols = [c for c in src if c not in ("cp", "etp")]
    said = {**src, "id": "said", "dp": str(int(src["dp"]) // 2), "notes": "TP1 PP2 CP 2 EP32"}
    path = tmp_path / "t.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerow(said)
    (res,) = V.run(path=path)
    assert "cp2" in res.layout and res.predicted > 0
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerow({**said, "notes": "TP1 PP2 EP32"})
    with pytest.raises(PiperError, match=r"tp\*pp\*dp == gpus"):
        V.run(path=path)
