"""Full recompute of part of each pipeline chunk (Layout.recompute_layers: Megatron-Core
--recompute-method block --recompute-num-layers N): N layers re-run their forward and keep only
their input, the others keep everything."""
import pytest
from click.testing import CliRunner

from piper_plan.cli import main
from piper_plan.cost.batch import from_layouts
from piper_plan.cost.estimate import evaluate
from piper_plan.errors import LayoutError
from piper_plan.layout import Layout, check_layout
from piper_plan.search import SearchSpace, search
from piper_plan.specs import load_hardware, load_model

H100 = load_hardware("dgx-h100")
LLAMA70 = load_model("llama3-70b")


def _est(**kw):
    base = dict(gpus=64, tp=8, pp=1, dp=8, mbs=1, global_batch=64, seq=8192, zero=1)
    e = evaluate(LLAMA70, H100, from_layouts([Layout(**{**base, **kw})]))
    return float(e.step_time_s[0]), float(e.memory["first"]["activations"][0])


def _parts(**kw):
    base = dict(gpus=64, tp=8, pp=1, dp=8, mbs=1, global_batch=64, seq=8192, zero=1)
    e = evaluate(LLAMA70, H100, from_layouts([Layout(**{**base, **kw})]))
    return {k: float(v[0]) for k, v in e.time.items()}


def test_re_running_every_layer_of_a_chunk_is_full_recompute():
    assert _est(recompute="full", recompute_layers=80) == _est(recompute="full")
    assert _est(recompute="full", recompute_layers=200) == _est(recompute="full")  # at most all
    # two chunks of 40 layers a rank (interleaved): 40 a chunk is every layer
    il = dict(pp=2, dp=4, schedule="interleaved", vpp=2)
    assert _est(recompute="full", recompute_layers=20, **il) == _est(recompute="full", **il)


def test_the_re_run_and_the_activations_scale_with_the_layers_that_re_run():
    t_none, a_none = _est(recompute="none")
    t_full, a_full = _est(recompute="full")
    p_none, p_full = _parts(recompute="none"), _parts(recompute="full")
    last = t_none
    for n in (10, 20, 40):
        t, a = _est(recompute="full", recompute_layers=n)
        share = n / 80
        assert a == pytest.approx(a_none + share * (a_full - a_none), rel=1e-9)
        p = _parts(recompute="full", recompute_layers=n)
        for k in ("compute", "tp_comm"):  # the re-run forward and its tensor-parallel collectives
            assert p[k] == pytest.approx(p_none[k] + share * (p_full[k] - p_none[k]), rel=1e-9)
        assert last < t < t_full  # the step (its gradient reduction hides behind more backward)
        last = t


def test_recompute_layers_needs_full_recompute():
    lay = Layout(gpus=8, tp=8, mbs=1, global_batch=8, seq=4096, recompute="selective", recompute_layers=4)
    with pytest.raises(LayoutError, match="recompute_layers with recompute full"):
        check_layout(lay, LLAMA70.num_layers)


def test_the_search_finds_the_partial_recompute_that_memory_allows():
    sp = SearchSpace(gpus=64, global_batch=64, seq=8192, recomputes=("full",))
    every = search(LLAMA70, H100, sp)
    part = search(LLAMA70, H100, SearchSpace(gpus=64, global_batch=64, seq=8192, recomputes=("full",),
                                             recompute_layers=(0, 10, 20, 40)))
    best = part.batch.layout(part.best)
    assert best.recompute_layers > 0
    assert part.est.tokens_per_s[part.best] > 1.05 * every.est.tokens_per_s[every.best]


def test_the_cli_reads_recompute_layers_and_names_a_bad_list():
    args = ["search", "-m", "llama3-70b", "-H", "dgx-h100", "-n", "64", "--global-batch", "64", "--seq", "8192",
            "--top", "1"]
    ok = CliRunner().invoke(main, args + ["--recompute-layers", "0,20,40"])
    assert ok.exit_code == 0, ok.output
    bad = CliRunner().invoke(main, args + ["--recompute-layers", "-1"])
    assert bad.exit_code != 0 and "--recompute-layers" in bad.output and len(bad.output.strip().splitlines()) == 1


def test_a_table_s_recompute_num_layers_column_prices_the_partial_recompute(tmp_path):
    from piper_plan import validate as V

    head = "id,group,model,hardware,gpus,tp,pp,dp,mbs,gbs,seq,recompute,recompute_num_layers,metric,value\n"
    rows = "".join(f"r{n},mine,llama3-70b,dgx-h100,64,8,1,8,1,64,8192,full,{n},tokens_per_s_per_gpu,1000\n"
                   for n in ("", "20"))
    path = tmp_path / "mine.csv"
    path.write_text(head + rows)
    every, part = V.run(path=path)
    assert part.predicted / every.predicted == pytest.approx(_est(recompute="full")[0]
                                                             / _est(recompute="full", recompute_layers=20)[0], rel=1e-6)


def test_the_search_prices_a_count_covering_a_whole_chunk_once():
    # 80 layers of Llama 3 70B: 80 re-run layers cover every chunk of every layout, so they add nothing
    sp = dict(gpus=64, global_batch=64, seq=8192, recomputes=("full",))
    every = search(LLAMA70, H100, SearchSpace(**sp))
    both = search(LLAMA70, H100, SearchSpace(**sp, recompute_layers=(0, 80)))
    assert len(both.est.step_time_s) == len(every.est.step_time_s)
    assert both.rejected["duplicate (recompute_layers covering a whole chunk equals every layer)"] > 0
    # 20 and 40 both cover the chunks of pp * vpp >= 4 (20 layers or fewer): those are priced once
    one = search(LLAMA70, H100, SearchSpace(**sp, recompute_layers=(20,)))
    two = search(LLAMA70, H100, SearchSpace(**sp, recompute_layers=(20, 40)))
    extra = [two.batch.layout(i) for i in range(len(two.est.step_time_s)) if two.batch.layout(i).recompute_layers == 40]
    assert extra and all(lay.pp * lay.vpp < 4 for lay in extra)
    assert len(two.est.step_time_s) == len(one.est.step_time_s) + len(extra)
