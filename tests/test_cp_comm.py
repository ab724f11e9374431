"""How context parallelism moves keys (Layout.cp_comm, Megatron-Core's --cp-comm-type): Transformer
Engine's p2p ring behind the kernels, its all_gather of K and V before two kernels a rank (Llama 3's),
its a2a (Ulysses) exchange of Q, K, V and the output around one kernel on heads/cp heads, and a2a+p2p,
the exchange inside groups of cp_a2a ranks and the ring between them (Layout.cp_a2a)."""
import numpy as np
import pytest

from piper_plan.cost import comm
from piper_plan.cost.batch import from_layouts
from piper_plan.cost.compute import _cp_kernels, core_attention
from piper_plan.cost.estimate import evaluate
from piper_plan.cost.kernels import stream_time, tile_cost
from piper_plan.cost.layer import _cp_exposed
from piper_plan.errors import LayoutError, PiperError
from piper_plan.layout import Layout, check_for, check_layout
from piper_plan.search import SearchSpace, enumerate_layouts
from piper_plan.specs import load_hardware, load_model
from table_support import bundled_rows, write_rows

H100 = load_hardware("dgx-h100")
LLAMA = load_model("llama3-8b")  # 32 query heads, 8 kv heads


def _one(cp_comm="p2p", **kw):
    base = dict(gpus=8, dp=1, cp=8, global_batch=8, seq=32768, recompute="full", cp_comm=cp_comm)
    return from_layouts([Layout(**{**base, **kw})])


def _gathered_brute(c, s, cp, b, window=None, causal=True):
    """all_gather's tiles by enumeration: rank r runs chunk j = r and j = 2cp-1-r, L = s/2cp queries
    each, against keys [0, (j+1)L) causal (every key unmasked), padded to b x b tiles; a pass a
    query block. The slowest rank's tiles + c x passes, times cp, over the counted tiles."""
    L = s // (2 * cp)
    worst = 0.0
    for r in range(cp):
        total = 0.0
        for j in (r, 2 * cp - 1 - r):
            for qt in range(j * L, (j + 1) * L, b):
                rows = np.arange(qt, min(qt + b, (j + 1) * L))
                keys = np.arange(s if not causal else (j + 1) * L)
                seen = (keys[None, :] <= rows[:, None]) if causal else np.ones((len(rows), len(keys)), bool)
                if window is not None:
                    seen &= keys[None, :] > rows[:, None] - window
                total += len(np.unique(keys[seen.any(0)] // b)) + c
        worst = max(worst, total)
    counted = (s * s / 2.0 if window is None else s * window - window * window / 2.0) / b ** 2
    return cp * worst / (counted if causal else (s / b) ** 2)


@pytest.mark.parametrize("s, cp, window, causal", [(512, 2, None, True), (480, 4, None, True), (200, 2, None, True),
                                                   (512, 4, None, False), (360, 3, None, False),
                                                   (512, 4, 32, True), (1024, 2, 100, True)])
def test_all_gather_prices_the_tiles_and_passes_of_its_two_kernels_a_rank(s, cp, window, causal):
    assert tile_cost(1.5, s, window, cp, causal, 16, "all_gather") == pytest.approx(
        _gathered_brute(1.5, s, cp, 16, window, causal))


def test_a2a_runs_one_ranks_kernel_and_all_gather_one_pass_where_the_ring_makes_cp():
    s = 32768
    one = tile_cost(3.0, s)
    assert tile_cost(3.0, s, cp=8, comm="a2a") == one
    gathered, ring = tile_cost(3.0, s, cp=8, comm="all_gather"), tile_cost(3.0, s, cp=8)
    assert gathered == pytest.approx(one, rel=1e-3)  # the same query blocks in one pass, chunks on block edges
    assert ring > gathered + 6 * 3.0 * (s / 128) / ((s / 128) ** 2 / 2)  # 7 passes more over the rank's blocks


def test_each_way_adds_its_own_kernels_and_memory_passes():
    lay = from_layouts([Layout(gpus=8, dp=1, cp=8, global_batch=8, seq=32768, cp_comm=c)
                        for c in ("p2p", "all_gather", "a2a")])
    launch = H100.efficiency.kernel_overhead_us * 1e-6
    steps, merge_f, merge_b = _cp_kernels(LLAMA, lay, H100, lay.tokens, LLAMA.num_heads / lay.tp)
    assert steps == pytest.approx([7 * launch, launch, 0.0])
    t = lay.tokens[0]
    dqk, dv = LLAMA.qk_v_dims
    kv, q, o = t * LLAMA.kv_heads * (dqk + dv) * 2, t * LLAMA.num_heads * dqk * 2, t * LLAMA.num_heads * dv * 2
    # the ring merges each step's output (read 2, write 1) and accumulates dQ (read, write)
    assert merge_f[0] == pytest.approx(stream_time(H100, 7 * 3 * o, 7))
    assert merge_b[0] == pytest.approx(stream_time(H100, 7 * 2 * q, 7))
    # the gather puts cp ranks' K and V in chunk order and copies each chunk's output forward; backward
    # the K and V again (2), dQ copied out, the full-length dK and dV zeroed (1), accumulated (3), reordered (2)
    assert merge_f[1] == pytest.approx(stream_time(H100, 2 * 8 * kv + 2 * o, 4))
    assert merge_b[1] == pytest.approx(stream_time(H100, 8 * 8 * kv + 2 * q, 7))
    # Ulysses lays out each of Q, K, V and O for the exchange and back
    assert merge_f[2] == pytest.approx(stream_time(H100, 4 * (q + kv + o), 8))
    assert merge_b[2] == pytest.approx(stream_time(H100, 4 * (2 * o + q + kv), 10))


def test_all_gather_and_a2a_expose_their_collectives_where_the_ring_hides_behind_long_kernels():
    dqk, dv = LLAMA.qk_v_dims
    lays = {c: _one(c, seq=131072) for c in ("p2p", "all_gather", "a2a")}
    got = {c: _cp_exposed(LLAMA, H100, x, core_attention(LLAMA, H100, x, "bf16")) for c, x in lays.items()}
    assert got["p2p"].total[0] == 0.0
    t = lays["p2p"].tokens
    kv = t * LLAMA.kv_heads * (dqk + dv) * 2.0
    one, eight = np.array([8]), np.array([1])  # cp 8 ranks, tp 1 apart
    lat = comm.call_latency(H100, one, eight)
    gather = comm.allgather(H100, kv * 8, one, eight) + lat
    scatter = comm.ring_allreduce(H100, kv * 8, one, eight, 0.5) + lat
    assert got["all_gather"].f[0] == pytest.approx(gather[0])
    assert got["all_gather"].b[0] == pytest.approx(gather[0] + scatter[0])

    def a2a(width):  # one all_to_all_single of the rank's share of a tensor
        return comm.a2a_call(H100, t * width * 2.0, one, eight, False, world=np.array([8]))[0]
    q, k, v, o = (a2a(LLAMA.num_heads * dqk), a2a(LLAMA.kv_heads * dqk), a2a(LLAMA.kv_heads * dv),
                  a2a(LLAMA.num_heads * dv))
    assert got["a2a"].f[0] == pytest.approx(q + k + v + o)
    assert got["a2a"].b[0] == pytest.approx(2 * o + q + k + v)
    assert evaluate(LLAMA, H100, lays["all_gather"]).time["cp_comm"][0] > 0.0


def test_context_parallelism_transformer_engine_cannot_run_is_refused_with_the_rule_named():
    base = dict(gpus=8, dp=1, cp=8, global_batch=8, seq=32768)
    with pytest.raises(LayoutError, match="cp_comm needs cp > 1"):
        check_layout(Layout(gpus=8, dp=8, global_batch=8, seq=8192, cp_comm="a2a"), 32)
    window = load_model("gpt-oss-120b")
    with pytest.raises(LayoutError, match="local attention under cp > 1 needs cp_comm all_gather or a2a"):
        check_for(Layout(**base, ep=8), window, H100)
    check_for(Layout(**base, ep=8, cp_comm="all_gather"), window, H100)
    mla = load_model("deepseek-v3")
    for c in ("all_gather", "a2a"):
        with pytest.raises(LayoutError, match="need cp_comm p2p"):
            check_for(Layout(gpus=8, dp=1, cp=8, ep=8, global_batch=8, seq=32768, cp_comm=c), mla, H100)
    # a2a: 32 / 4 = 8 query heads but 8 / 4 = 2 kv heads a tp rank over cp 8
    with pytest.raises(LayoutError, match="cp_comm a2a needs heads a tp rank divisible by cp"):
        check_for(Layout(gpus=32, tp=4, cp=8, dp=1, global_batch=8, seq=32768, cp_comm="a2a"), LLAMA, H100)
    check_for(Layout(**base, cp_comm="a2a"), LLAMA, H100)


def test_the_search_tries_each_way_where_cp_splits_sequences_and_prices_each_as_alone():
    sp = SearchSpace(gpus=32, global_batch=32, seq=32768, cps=(1, 2, 8), schedules=("1f1b",))
    batch, rejected = enumerate_layouts(LLAMA, H100, sp)
    ways = {(int(c), int(w), int(a)) for c, w, a in zip(batch.cp, batch.cpc, batch.cpa)}
    # a2a+p2p (3) once for each all-to-all group between 1 and cp dividing it: none at cp 2
    assert ways == {(1, 0, 1), (2, 0, 1), (2, 1, 1), (2, 2, 1), (8, 0, 1), (8, 1, 1), (8, 2, 1), (8, 3, 2), (8, 3, 4)}
    assert rejected["cp_comm a2a needs heads a tp rank divisible by cp"] > 0  # tp 2 and 4 under cp 8
    assert rejected["cp_comm a2a+p2p needs heads a tp rank divisible by cp_a2a"] > 0  # tp 4, groups of 4
    est = evaluate(LLAMA, H100, batch)
    rng = np.random.default_rng(2)
    for w in (1, 2, 3):
        for i in rng.choice(np.flatnonzero(batch.cpc == w), 6, replace=False):
            one = evaluate(LLAMA, H100, from_layouts([batch.layout(int(i))]))
            assert one.step_time_s[0] == pytest.approx(est.step_time_s[i], rel=1e-12)
    only, _ = enumerate_layouts(LLAMA, H100, SearchSpace(gpus=32, global_batch=32, seq=32768, cps=(1, 8),
                                                         schedules=("1f1b",), cp_comms=("a2a",)))
    assert set(np.unique(only.cpc[only.cp > 1])) == {2} and (only.cpc[only.cp == 1] == 0).all()
    window, _ = enumerate_layouts(load_model("gpt-oss-20b"), H100, SearchSpace(gpus=8, global_batch=8, seq=32768,
                                                                              cps=(2,), schedules=("1f1b",)))
    assert 0 not in set(np.unique(window.cpc))  # the ring cannot run its windows


def test_the_cli_takes_the_way_and_names_it_in_the_layout():
    from click.testing import CliRunner

    from piper_plan.cli import main

    args = ["estimate", "-m", "llama3-8b", "-H", "dgx-h100", "-n", "8", "--cp", "8", "--seq", "32768",
            "--global-batch", "8", "--recompute", "full"]
    r = CliRunner().invoke(main, args + ["--cp-comm", "all_gather"])
    assert r.exit_code == 0, r.output
    assert "cp8(all_gather)" in r.output
    for bad, word in ((["--cp-comm", "ring"], "--cp-comm"),
                      (["--cp", "1", "--cp-comm", "a2a"], "cp_comm needs cp > 1")):
        out = CliRunner().invoke(main, args + bad)
        assert out.exit_code != 0 and word in out.output, out.output
    s = ["search", "-m", "llama3-8b", "-H", "dgx-h100", "-n", "16", "--global-batch", "16", "--seq", "65536",
         "--schedules", "1f1b", "--cp", "8", "--top", "500"]
    r = CliRunner().invoke(main, s + ["--cp-comm", "a2a"])
    assert r.exit_code == 0, r.output
    assert "cp8(a2a)" in r.output and "cp8 " not in r.output and "all_gather" not in r.output
    bad = CliRunner().invoke(main, s + ["--cp-comm", "a2a,a2a"])
    assert bad.exit_code != 0 and "--cp-comm" in bad.output and len(bad.output.strip().splitlines()) == 1


def test_metas_128k_row_runs_the_all_gather_its_paper_states(tmp_path):
    from piper_plan import validate as V

    path = V.data_path().parent / "llama3-405b-meta.csv"
    rows = bundled_rows("llama3-405b-meta")
    assert next(r for r in rows if r["id"] == "meta-l3-405b-16k-cp16")["cp_comm"] == "all_gather"
    # the row read as Megatron-Core's default, the ring
    ring = write_rows(tmp_path / "llama3-405b-meta.csv", ({**r, "cp_comm": ""} for r in rows))
    got, as_ring = ({r.id: r for r in V.run(path=p)}["meta-l3-405b-16k-cp16"] for p in (path, ring))
    assert "cp16(all_gather)" in got.layout and "cp16 " in as_ring.layout
    # the gather's one pass a rank outweighs its exposed collectives: nearer the 380 TFLOPs published
    assert 0.0 < got.error_pct < as_ring.error_pct < 10.0


@pytest.mark.parametrize("change, match", [(dict(cp_comm="ring"), "cp_comm.*expected one of p2p, all_gather, a2a"),
                                           (dict(cp="1", cp_comm="a2a"), "cp_comm.*needs a cp column above 1")])
def test_a_row_stating_a_way_context_parallelism_cannot_take_is_refused_with_the_column_named(tmp_path, change,
                                                                                             match):
    from piper_plan import validate as V

    bad = write_rows(tmp_path / "bad.csv", [{**bundled_rows("llama3-405b-meta")[2], **change}])
    with pytest.raises(PiperError, match=match):
        V.run(path=bad)


def test_readme_states_the_ways_the_search_weighs_as_it_prices_them():
    import re
    from pathlib import Path

    from piper_plan.report import layout_str

    from test_docs_figures import cli_json

    top = cli_json("search", "-m", "llama3-70b", "-H", "dgx-h100", "-n", "64", "--seq", "32768", "--global-batch",
                   "64", "--top", "10")["top"]
    rate = {}
    for x in top:  # each layout's best variant (ZeRO stage, recompute): the first listed
        rate.setdefault(layout_str(x["layout"]).split(" mbs")[0], x["tokens_per_s"])
    ahead = lambda a, b: f"{(rate[a] / rate[b] - 1) * 100:.1f} %"  # noqa: E731
    gather8, ring4 = ahead("tp2 cp8(all_gather) pp1 dp4 ep1", "tp2 cp8 pp1 dp4 ep1"), \
        ahead("tp4 cp4 pp1 dp4 ep1", "tp4 cp4(all_gather) pp1 dp4 ep1")
    best = layout_str(top[0]["layout"]).split(" pp1")[0]
    hier = ahead(best + " pp1 dp4 ep1", "tp2 cp8 pp1 dp4 ep1")
    text = re.sub(r"\s+", " ", (Path(__file__).parents[1] / "README.md").read_text())
    assert (f"`tp2 cp8(all_gather)` {gather8} ahead of `tp2 cp8`, `tp4 cp4` {ring4} ahead of `tp4 cp4(all_gather)`"
            in text)
    assert f"the same search's best, `{best}`, {hier} ahead of `tp2 cp8`" in text


def test_each_way_holds_its_buffers_while_a_layer_runs_and_cp_1_holds_none():
    # Llama 3 8B, cp 8 at 32K: 4,096 tokens a rank, 8 kv heads of 128 + 128 channels in bf16
    lays = {c: _one(c) for c in ("p2p", "all_gather", "a2a")}
    kv = 4096 * 8 * 256 * 2 / 2**30
    q = 4096 * 32 * 128 * 2 / 2**30
    got = {c: evaluate(LLAMA, H100, x).memory["first"]["cp_buffers"][0] for c, x in lays.items()}
    assert got == pytest.approx({"p2p": 8 * kv, "all_gather": 2 * 8 * kv, "a2a": 2 * (q + kv)})
    whole = evaluate(LLAMA, H100, from_layouts([Layout(gpus=8, dp=8, global_batch=8, seq=4096)]))
    assert whole.memory["first"]["cp_buffers"][0] == 0.0
    assert "cp_buffers" not in whole.row(0)["memory_gib_per_stage"][0]  # plans without cp dump as before
    est = evaluate(LLAMA, H100, lays["all_gather"])
    stage = est.row(0)["memory_gib_per_stage"][0]
    assert stage["cp_buffers"] == pytest.approx(2 * 8 * kv)
    assert stage["total"] == pytest.approx(sum(v for k, v in stage.items() if k not in ("stage", "role", "total")),
                                           abs=1e-3)  # the row's parts are rounded


def test_fp8_attention_and_chunked_attention_take_only_the_ways_transformer_engine_runs_them():
    base = dict(gpus=8, dp=1, cp=8, global_batch=8, seq=32768, fp8="current")  # FP8 attention: an FP8 recipe's
    with pytest.raises(LayoutError, match="attention_fp8 needs cp_comm other than all_gather"):
        check_for(Layout(**base, cp_comm="all_gather", attention_fp8=True), LLAMA, H100)
    check_for(Layout(**base, cp_comm="a2a", attention_fp8=True), LLAMA, H100)
    batch, rejected = enumerate_layouts(LLAMA, H100, SearchSpace(gpus=8, global_batch=8, seq=32768, cps=(8,),
                                                                 schedules=("1f1b",), attention_fp8=True,
                                                                 fp8="current"))
    assert 1 not in set(np.unique(batch.cpc)) and rejected["attention_fp8 needs cp_comm other than all_gather"] > 0
    scout = load_model("llama4-scout")  # chunked local attention: only a2a's one kernel runs its mask
    for way in ("p2p", "all_gather"):
        with pytest.raises(LayoutError, match="chunked attention under cp > 1 needs cp_comm a2a"):
            check_for(Layout(**base, ep=8, cp_comm=way), scout, H100)
    check_for(Layout(**base, ep=8, cp_comm="a2a"), scout, H100)


def test_a_plan_written_before_the_way_was_stated_reads_as_it_was_priced(tmp_path):
    import json

    from click.testing import CliRunner

    from piper_plan.cli import main
    from piper_plan.plan import read_plan

    def written(model, way):
        out = tmp_path / f"{model}-{way}.json"
        r = CliRunner().invoke(main, ["estimate", "-m", model, "-H", "dgx-h100", "-n", "16", "--cp", "2",
                                      "--ep", "8", "--seq", "16384", "--global-batch", "16", "--recompute", "full",
                                      "--cp-comm", way, "-o", str(out)])
        assert r.exit_code == 0, r.output
        doc = json.loads(out.read_text())
        del doc["layout"]["cp_comm"]  # as plans were written before the field
        out.write_text(json.dumps(doc))
        return read_plan(out).layout.cp_comm

    assert written("gpt-oss-20b", "all_gather") == "all_gather"  # a window: priced at one pass a rank then
    assert written("llama4-scout", "a2a") == "a2a"  # chunks: only a2a runs them
    assert written("mixtral-8x7b", "all_gather") == "p2p"  # full attention: the ring it ran then


def test_recompute_of_the_core_attention_repeats_the_gather():
    lay = {rc: _one("all_gather", seq=131072, recompute=rc) for rc in ("none", "selective")}
    t = {rc: evaluate(LLAMA, H100, x).time["cp_comm"][0] for rc, x in lay.items()}
    one, eight = np.array([8]), np.array([1])
    kv = lay["none"].tokens * LLAMA.kv_heads * 256 * 2.0
    lat = comm.call_latency(H100, one, eight)
    g = (comm.allgather(H100, kv * 8, one, eight) + lat)[0]
    s = (comm.ring_allreduce(H100, kv * 8, one, eight, 0.5) + lat)[0]
    assert t["selective"] / t["none"] == pytest.approx((3 * g + s) / (2 * g + s))


def test_each_way_issues_its_own_host_operations():
    from piper_plan.cost.host import layer_ops

    lays = from_layouts([Layout(gpus=8, dp=8, global_batch=8, seq=32768)]
                        + [Layout(gpus=8, dp=1, cp=8, global_batch=8, seq=32768, cp_comm=c)
                           for c in ("p2p", "all_gather", "a2a")])
    dense, _ = layer_ops(LLAMA, lays)
    # the ring's 7 further steps (send / receive, kernel, merge); the gather's 2 gathers and reorders, a
    # second kernel, 2 output copies; Ulysses' 4 exchanges with a copy each side
    assert list(dense - dense[0]) == [0.0, 21.0, 7.0, 12.0]


def test_the_gather_keeps_a_second_attention_output_unless_recomputed():
    # Transformer Engine's all_gather saves its chunks' out_per_step beside the output it returns; a2a saves
    # the exchanged output it returns
    from piper_plan.cost.activations import attention_terms

    lays = from_layouts([Layout(gpus=8, dp=1, cp=8, global_batch=8, seq=32768, cp_comm=c, recompute=rc)
                         for c in ("p2p", "all_gather", "a2a") for rc in ("none", "selective")])
    out = 4096 * LLAMA.num_heads * LLAMA.qk_v_dims[1] * 2.0
    assert list(attention_terms(LLAMA, lays)["cp_out"]) == [0.0, 0.0, out, 0.0, 0.0, 0.0]


def test_the_hierarchy_exchanges_heads_inside_its_groups_and_runs_the_ring_between_them():
    from piper_plan.cost.compute import attention_tiles
    from piper_plan.cost.host import layer_ops

    b200 = load_hardware("dgx-b200")  # block costs: the ring's passes show
    hier, ring4 = _one("a2a+p2p", cp_a2a=2), _one("p2p", gpus=4, cp=4)
    # each rank holds its group's chunks, two joined ones of s/8 tokens: the kernels of a 4-rank ring
    assert attention_tiles(LLAMA, b200, hier) == attention_tiles(LLAMA, b200, ring4)
    ops = layer_ops(LLAMA, from_layouts([Layout(gpus=8, dp=8, global_batch=8, seq=32768), hier.layout(0)]))[0]
    assert ops[1] - ops[0] == 3 * 3 + 12  # the ring's 3 further steps and the exchanges
    # two nodes, tp 2: groups of 4 ranks 2 apart inside a node, the ring of 2 groups 8 apart across the NICs;
    # multi-head attention at 8K, whose ring step outlasts its kernel's share
    mha = LLAMA.model_copy(update={"num_kv_heads": LLAMA.num_heads})
    lay = _one("a2a+p2p", gpus=16, tp=2, cp_a2a=4, seq=8192)
    core = core_attention(mha, H100, lay, "bf16")
    got = _cp_exposed(mha, H100, lay, core)
    t, dqk, dv = lay.tokens, *mha.qk_v_dims
    world = np.array([16])

    def a2a(width):  # one all_to_all_single over the 4 neighbouring ranks
        return comm.a2a_call(H100, t * width * 2.0, np.array([4]), np.array([2]), False, world=world)[0]
    q, k, v, o = (a2a(mha.num_heads / 2 * dqk), a2a(mha.kv_heads / 2 * dqk), a2a(mha.kv_heads / 2 * dv),
                  a2a(mha.num_heads / 2 * dv))
    kv = t * mha.kv_heads / 2 * (dqk + dv) * 2.0  # a step passes the rank's bytes: 4x the tokens, 1/4 the heads
    step = comm.ring_allreduce(H100, kv * 2, np.array([2]), np.array([8]), 0.5, world=world)[0]
    assert step > core.f[0] / 2 and step > 3 * comm.ring_allreduce(H100, kv * 2, np.array([2]), np.array([2]), 0.5,
                                                                  world=world)[0]
    assert got.f[0] == pytest.approx(q + k + v + o + step - core.f[0] / 2)
    assert got.b[0] == pytest.approx(2 * o + q + k + v + max(2 * step - core.b[0] / 2, 0.0))
    # the levels hold their buffers one after the other: the ring's four of K and V, or the exchange's
    kvg, qg = kv[0] / 2**30, t[0] * mha.num_heads / 2 * dqk * 2.0 / 2**30
    assert evaluate(mha, H100, lay).memory["first"]["cp_buffers"][0] == pytest.approx(max(4 * kvg, 2 * (qg + kvg)))


@pytest.mark.parametrize("kw, rule", [
    (dict(cp_comm="a2a+p2p"), "cp_comm a2a\\+p2p needs 1 < cp_a2a < cp"),
    (dict(cp_comm="a2a+p2p", cp_a2a=8), "cp_comm a2a\\+p2p needs 1 < cp_a2a < cp"),
    (dict(cp_comm="a2a+p2p", cp_a2a=3), "cp_comm a2a\\+p2p needs 1 < cp_a2a < cp"),
    (dict(cp_comm="p2p", cp_a2a=2), "cp_comm a2a\\+p2p needs 1 < cp_a2a < cp"),
    (dict(cp_comm="a2a+p2p", cp_a2a=4, tp=4, gpus=32), "cp_comm a2a\\+p2p needs heads a tp rank divisible by cp_a2a")])
def test_the_hierarchy_needs_two_levels_of_more_than_one_rank_and_heads_for_its_groups(kw, rule):
    with pytest.raises(LayoutError, match=rule):
        check_for(Layout(**{**dict(gpus=8, dp=1, cp=8, global_batch=8, seq=32768), **kw}), LLAMA, H100)


def test_the_search_counts_the_cps_no_hierarchy_splits():
    _, rejected = enumerate_layouts(LLAMA, H100, SearchSpace(gpus=8, global_batch=8, seq=32768, cps=(2, 4),
                                                             schedules=("1f1b",), cp_comms=("a2a+p2p",)))
    assert rejected["cp_comm a2a+p2p needs 1 < cp_a2a < cp, dividing cp"] > 0  # cp 2: no group between 1 and 2


def test_the_hierarchy_runs_multi_latent_attention_but_no_window():
    base = dict(gpus=8, dp=1, cp=8, ep=8, global_batch=8, seq=32768, cp_comm="a2a+p2p", cp_a2a=2)
    check_for(Layout(**base), load_model("deepseek-v3"), H100)
    with pytest.raises(LayoutError, match="needs cp_comm all_gather or a2a"):
        check_for(Layout(**base), load_model("gpt-oss-20b"), H100)


def test_the_cli_and_a_table_state_the_hierarchy_with_its_group_size(tmp_path):
    from click.testing import CliRunner

    from piper_plan import validate as V
    from piper_plan.cli import main

    args = ["estimate", "-m", "llama3-8b", "-H", "dgx-h100", "-n", "8", "--cp", "8", "--seq", "32768",
            "--global-batch", "8", "--recompute", "full", "--cp-comm", "a2a+p2p"]
    r = CliRunner().invoke(main, args + ["--cp-a2a", "4"])
    assert r.exit_code == 0 and "cp8(a2a4+p2p2)" in r.output, r.output
    bad = CliRunner().invoke(main, args)
    assert bad.exit_code != 0 and "cp_a2a" in bad.output and len(bad.output.strip().splitlines()) == 1
    row = bundled_rows("llama3-405b-meta")[2]
    for change in (dict(cp_comm="a2a+p2p"), dict(cp_a2a="2")):
        table = write_rows(tmp_path / "t.csv", [{**row, "cp_a2a": "", **change}])
        with pytest.raises(PiperError, match="cp_a2a.*expected the all-to-all group size of cp_comm a2a\\+p2p"):
            V.run(path=table)
