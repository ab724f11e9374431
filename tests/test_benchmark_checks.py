"""benchmarks/: a bad option is refused in one line before anything runs (argparse, exit 2), and the
scripts that state an acceptance exit 1 when it fails, naming the check on their last line."""
from __future__ import annotations

import subprocess
import sys

import pytest
from benchmark_support import BENCHMARKS, load_benchmark


def _refused(capsys, main, argv, *words):
    """main(argv) exits 2 and stderr's last line names the option and what it expects."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert all(w in last for w in words), last


@pytest.mark.parametrize("argv, words", [
    (["--nodes", "0"], ("--nodes", ">= 1", "0")),
    (["--nodes", "-4"], ("--nodes", ">= 1")),
    (["--kib", "0"], ("--kib", ">= 1")),
    (["--tokens", "x"], ("--tokens", "integer")),
])
def test_halo_model_refuses_bad_sizes(capsys, argv, words):
    _refused(capsys, load_benchmark("halo_model").main, argv, *words)


def test_permute_refuses_before_timing(capsys):
    main = load_benchmark("permute").main
    _refused(capsys, main, ["--repeats", "1"], "--repeats", ">= 2")
    _refused(capsys, main, ["--topk", "50"], "--topk", "--experts (40)")


def test_eager_bytes_refuses_a_bad_spec_in_one_line(capsys):
    main = load_benchmark("eager_bytes").main
    _refused(capsys, main, ["--seq", "0"], "--seq", ">= 1")
    assert main(["--model", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: nope:"), err
    assert main(["--model", "tiny-dense", "--moe"]) == 2
    assert capsys.readouterr().err.strip() == "error: tiny-dense: --moe: no MoE layer to count"


def test_zero_traffic_refuses_a_layout_before_spawning(capsys):
    parse = load_benchmark("zero_traffic").parse_args
    _refused(capsys, parse, ["--rounds", "0"], "--rounds", ">= 1")
    _refused(capsys, parse, ["--ranks", "3"], "--ranks 3 --replicas 2", "zero_replicas")


def test_pipeline_hop_wants_whole_lanes(capsys):
    main = load_benchmark("pipeline_hop").main
    _refused(capsys, main, ["--ranks", "0"], "--ranks", ">= 4")
    _refused(capsys, main, ["--ranks", "6"], "--ranks", "multiple of 4")


@pytest.mark.parametrize("name, argv", [("search_speed", ["--bogus"]), ("paper_fig13", ["--bogus"]),
                                        ("memory_check", ["--bogus"]), ("float8_sac", ["bogus"]),
                                        ("v_chunks", ["--bogus"]), ("one_f_one_b", ["--bogus"])])
def test_unknown_arguments_are_refused(capsys, name, argv):
    _refused(capsys, load_benchmark(name).main, argv, "bogus")


def test_helper_modules_say_so():
    for helper in ("native_block.py", "_args.py", "netns_topo.py"):
        r = subprocess.run([sys.executable, str(BENCHMARKS / helper)], capture_output=True, text=True)
        assert r.returncode == 2 and "helper module" in r.stderr and len(r.stderr.splitlines()) == 1, r


def test_memory_check_exits_1_beyond_its_10_percent(monkeypatch, capsys):
    """main's verdict, on measured bytes the model misses by 5 % and then by 20 %."""
    mc = load_benchmark("memory_check")
    state = dict(dense_params=1, dense_params_model=1, moe_params=1, moe_params_model=1, state_bytes=1,
                 state_bytes_model=1)
    monkeypatch.setattr(mc, "state_check", lambda m, ep: state)
    for miss, code in ((0.05, 0), (0.20, 1)):
        row = dict(measured=1000, model=1000 * (1 + miss), model_fused=900, casts=0, casts_model=0)
        monkeypatch.setattr(mc, "measure", lambda *a, row=row: {"moe": row})
        assert mc.main([]) == code
        last = capsys.readouterr().out.strip().splitlines()[-1]
        assert last == ("acceptance met" if code == 0 else "FAILED: worst activation error 20.0% > 10%"), last


def test_closed_loop_names_each_failed_check():
    cl = load_benchmark("closed_loop")
    good = dict(median_abs_error=0.12, spearman=0.9, top_within_10pct=True, top_over_fastest=1.04)
    bad = dict(median_abs_error=0.31, spearman=float("nan"), top_within_10pct=False, top_over_fastest=1.32)
    assert cl.failed_checks({"tiny-moe": good}) == []
    assert cl.failed_checks({"tiny-moe": good, "small-moe-cpu": bad}) == [
        "small-moe-cpu median |error| 31.0% > 20%", "small-moe-cpu Spearman nan < 0.8",
        "small-moe-cpu top plan measured 1.320x the fastest (not within 10%)"]


def test_migration_names_each_failed_check():
    mig = load_benchmark("migration")
    run = dict(after_over_lb=1.05, share=0.01, predicted=dict(drop_error=0.1))
    drift = dict(mean_max_over_mean=1.4)  # reported, no acceptance
    assert mig.failed_checks({"zipf1.0-lpt": run, "drift-none": drift}) == []
    off = dict(after_over_lb=1.2, share=0.06, predicted=dict(drop_error=float("nan")))
    assert mig.failed_checks({"zipf1.5-swap": off}) == [
        "zipf1.5-swap after/LB 1.200 > 1.1", "zipf1.5-swap overhead 6.00% > 5%",
        "zipf1.5-swap predicted drop off by +nan% (beyond 25%)"]


def test_a_search_reports_the_layouts_it_priced_as_search_speed_counts_them():
    """benchmarks/search_speed.py's priced rate reads SearchResult.priced (and search --json's
    "priced"): the batch the search priced, its evaluated layouts less those the state-memory bound
    discarded unpriced, whether it keeps every layout or the best few."""
    import json

    from click.testing import CliRunner

    from piper_plan.cli import main
    from piper_plan.search import STATE_BOUND, SearchSpace, search
    from piper_plan.specs import load_hardware, load_model

    m, hw = load_model("deepseek-v3"), load_hardware("dgx-h100")
    sp = SearchSpace(gpus=256, global_batch=1024, seq=m.seq_len)
    res = search(m, hw, sp)
    assert res.evaluated > res.priced == len(res.batch) > 0  # the bound discards some on this case
    assert res.evaluated - res.priced == res.rejected[STATE_BOUND]
    kept = search(m, hw, sp, keep=3)
    assert (kept.priced, kept.evaluated) == (res.priced, res.evaluated) and len(kept.batch) < kept.priced
    out = CliRunner().invoke(main, ["search", "-m", "deepseek-v3", "-H", "dgx-h100", "-n", "256",
                                    "--global-batch", "1024", "--json", "--top", "1"])
    assert json.loads(out.stdout)["priced"] == res.priced


def test_v_chunks_gives_the_pp_16_residuals_validation_readme_quotes():
    """validation/README.md (session 77) quotes benchmarks/v_chunks.py: the V schedules' chunk halves
    against torch's order at pp 16, 61 layers near DeepSeek-V3's ends, M 2pp and 8pp; and (session 79)
    the walk the planner prices them by now, which is that order."""
    row = load_benchmark("v_chunks").row
    quoted = {("zbv", 32): -8.2, ("zbv", 128): -2.3, ("dualpipev", 32): +3.5, ("dualpipev", 128): +1.0}
    for (schedule, M), pct in quoted.items():
        ran, walked, closed, _ = row(schedule, 61, 0.1, 2.7, 16, M)
        assert round(100 * (closed / ran - 1), 1) == pct, (schedule, M, closed / ran)
        assert walked == pytest.approx(ran, rel=1e-12)


def test_one_f_one_b_gives_the_figures_the_readme_quotes():
    """README's benchmark table quotes benchmarks/one_f_one_b.py: 48 layers (Qwen3-30B's) on pp 16,
    one stage a layer more than the rest, the closed form +14.7 % over torch's 1F1B order at M 16
    and +2.6 % at M 128, the planner within 0.03 % of it; with the last stage the busiest (126
    layers, Llama 3.1 405B's, pp 8), the closed form is the order's step."""
    row = load_benchmark("one_f_one_b").row
    for M, pct in ((16, 14.7), (128, 2.6)):
        ran, closed, priced = row(48, 0.1, 1.0, 16, M)
        assert round(100 * (closed / ran - 1), 1) == pct, (M, closed / ran)
        assert abs(priced / ran - 1) < 3e-4
    ran, closed, priced = row(126, 0.1, 1.0, 8, 64)
    assert closed == priced == pytest.approx(ran, rel=1e-12)
