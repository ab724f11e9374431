"""README.md's summaries of the side validation tables, held to the model.

"How close the model is" in README.md summarises six tables beside the bundled one
(validation/moe-parallel-folding.csv, context-parallel.csv, nemo-performance.csv,
llama3-405b-meta.csv, torchtitan.csv, primus.csv) in prose: a MAPE here, a signed error there,
a range, a Kendall τ. Those sentences drifted whenever a cost-model change moved the rows and
nobody re-ran the tables. Each test here prices one table as `piper-plan validate --table F`
does (validate.run), computes every figure the README states of it, rounded as the README
writes it, and asserts it stands in the passage that states it. The passage is found by the
phrase it opens with and the phrase that follows it, never by line number, and each of those
phrases must occur once. A figure that moves fails here until README.md is re-run and rewritten
(and validation/README.md with it, where it repeats the figure). Figures the README labels as
history ("when first priced", "when added") are not checked: they are not the model's now.

The same holds for the figures README.md states of the bundled table (`piper-plan validate`'s
targets table, `--residuals`, `--blind`, the handed-over 47-row table), of Granite's plans A and B
as `piper-plan estimate` prices them in "piper-train on one GPU" (measured figures there came from
GPU runs and stay as written), and of the FP8 searches in Conventions: each is computed the way the
command the README quotes computes it.

validation/README.md repeats many of those figures and states more of its own as the model's now
(a row's error "now", the `--blind` and `--residuals` runs, the context-parallel table, the
weak-scaling ratios): those are held the same way, each passage found by its phrases in
validation/README.md (`VREADME`); its session notes and the figures it dates ("at cb3b8cf",
"when added", "then") are history and are not checked.
"""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from scipy.stats import kendalltau

from piper_plan import validate as V
from piper_plan.cli import main
from piper_plan.report import layout_str

README = Path(__file__).parents[1] / "README.md"
VREADME = Path(__file__).parents[1] / "validation" / "README.md"
TABLES = V.data_path().parent


def _prose(doc: Path = README) -> str:
    """README.md (or `doc`) with every run of whitespace (line breaks, list indents) as one space,
    so a figure matches wherever the text happens to wrap."""
    return re.sub(r"\s+", " ", doc.read_text(encoding="utf-8"))


def passage(start: str, end: str, doc: Path = README) -> str:
    """The README text (or `doc`'s) from `start` up to (not including) the first `end` after it;
    each phrase must be in it, and `start` only once, so the passage is the one meant."""
    text, name = _prose(doc), doc.relative_to(README.parent)
    assert text.count(start) == 1, f"{name} should hold {start!r} once, holds it {text.count(start)} times"
    i = text.index(start)
    j = text.find(end, i + len(start))
    assert j > i, f"{name}: no {end!r} after {start!r}"
    return text[i:j]


def _minus(s: str) -> str:
    return s.replace("-", "−")  # the README writes U+2212 minus signs


def pct(x: float, signed: bool = False) -> str:
    """'7.7 %' or, signed, '+12.9 %' / '−13.7 %' (one decimal, the README's rounding)."""
    return _minus(f"{x:+.1f} %" if signed else f"{x:.1f} %")


def signed(x: float) -> str:
    return _minus(f"{x:+.1f}")


def span(errors) -> str:
    """A signed range as the README writes it, whole percents: of one sign, smallest magnitude
    first ('+19 … +89 %', '−18 … −22 %'); of both signs, lowest first ('−7 … +4 %'), so neither
    side is hidden."""
    if min(errors) < 0 < max(errors):
        lo, hi = min(errors), max(errors)
    else:
        lo, hi = min(errors, key=abs), max(errors, key=abs)
    return _minus(f"{lo:+.0f} … {hi:+.0f} %")


def mape(rows) -> float:
    return float(np.mean([abs(r.error_pct) for r in rows]))


def max_abs(rows) -> float:
    return float(max(abs(r.error_pct) for r in rows))


def tau(rows) -> str:
    return f"τ {kendalltau([r.published for r in rows], [r.predicted for r in rows]).statistic:.2f}"


def _csv(name: str) -> dict[str, dict]:
    with open(TABLES / f"{name}.csv", newline="", encoding="utf-8") as f:
        return {r["id"]: r for r in csv.DictReader(f)}


@pytest.fixture(scope="module")
def priced():
    """name -> (results, csv rows by id): each side table priced once for the module, as
    `piper-plan validate --table validation/<name>.csv` prices it."""
    names = ("moe-parallel-folding", "context-parallel", "nemo-performance", "llama3-405b-meta", "torchtitan",
             "primus")
    return {n: (V.run(path=TABLES / f"{n}.csv"), _csv(n)) for n in names}


def assert_stated(start: str, end: str, expected: list[str], table: str, doc: Path = README) -> None:
    """Every figure in `expected` stands in README.md's (or `doc`'s) passage from `start` to `end`
    (passage)."""
    text = passage(start, end, doc)
    missing = [e for e in expected if e not in text]
    assert not missing, f"{doc.relative_to(README.parent)}'s {table} figures: {missing}"


def test_the_moe_parallel_folding_sentence_states_the_table_as_priced_now(priced):
    res, rows = priced["moe-parallel-folding"]
    assert all(np.isfinite(r.predicted) and not r.fit for r in res)
    seq = [r for r in res if int(rows[r.id]["cp"] or 1) > 1]            # Table 5: context parallelism
    fold = [r for r in res if r not in seq and int(rows[r.id]["etp"] or 1) == 1]
    base = [r for r in res if r not in seq and r not in fold]          # the MCore baseline, ETP = TP
    assert (len(fold), len(base), len(seq), len(res)) == (17, 16, 8, 41)
    expected = [
        f"the {len(fold)} Megatron-Core MoE runs",
        f"read {pct(mape(fold))} MAPE, max {pct(max_abs(fold))}, Kendall {tau(fold)}",
        f"Its {len(base)} baseline runs", f"{pct(mape(base))} (max {pct(max_abs(base))}) now",
        f"its {len(seq)} sequence-scaling runs", f"{pct(mape(seq))} (max {pct(max_abs(seq))})",
        f"all {len(res)} rows {pct(mape(res))}, {tau(res)}",
    ]
    assert_stated("An independent paper, priced once as written", "Published runs with context parallelism",
                  expected, "MoE Parallel Folding")


def test_the_context_parallel_sentence_states_the_table_as_priced_now(priced):
    res, rows = priced["context-parallel"]
    assert len(res) == 30 and all(np.isfinite(r.predicted) and not r.fit for r in res)
    groups = V.summary(res)["groups"]
    mb, nemo = groups["megatron-bridge-cp"], groups["nemo-performance-cp"]
    nemo_rows = [r for r in res if r.group == "nemo-performance-cp"]
    worst = max(nemo_rows, key=lambda r: abs(r.error_pct))
    long_seq = {hw: [r for r in res if r.group == "nemo-long-sequence" and rows[r.id]["hardware"] == hw]
                for hw in ("DGX-B200", "DGX-H100")}
    assert len(long_seq["DGX-B200"]) == len(long_seq["DGX-H100"]) == 6
    expected = [
        f"{len(res)} rows of Megatron-Bridge and NeMo tables",
        f"Llama 3.1 405B CP 2 rows {pct(mb['mape'])} (max {pct(mb['max_abs_pct'])})",
        f"2-8 rows {pct(nemo['mape'])} (max {pct(worst.error_pct, signed=True)}, Mixtral 8x22B on B200)",
        f"long-sequence rows (32K-1M) {pct(mape(long_seq['DGX-B200']))}",
        f"H100 long-sequence rows {span([r.error_pct for r in long_seq['DGX-H100']])}",
    ]
    assert "mixtral8x22b-b200" in worst.id  # the row the sentence names
    assert_stated("Published runs with context parallelism", "The largest published dense runs",
                  expected, "context-parallel")
    # validation/README.md's table "and now" (the bracketed session-64 figures and "first priced" are history)
    b200, h100 = (long_seq[hw] for hw in ("DGX-B200", "DGX-H100"))
    gb200 = next(r for r in nemo_rows if "mixtral8x22b-gb200" in r.id)
    moe = [r for r in res if r.kind == "moe"]
    dense = [r for r in res if r.kind == "dense"]
    assert {worst.id, gb200.id} == {r.id for r in moe}  # "the pair"
    assert max(dense, key=lambda r: abs(r.error_pct)).id == "mb-llama405b-h100-fp8cs-cp2-2511"
    expected = [f"25.11-26.06 | {mb['rows']} | {pct(mb['mape'])} (7.3) | {pct(mb['max_abs_pct'])} (17.1) |",
                f"B200 / GB200 | {nemo['rows']} | {pct(nemo['mape'])} (11.4) | {pct(nemo['max_abs_pct'])} (16.9) |",
                f"| {len(b200)} | {pct(mape(b200))} (16.8) | {pct(max_abs(b200))} (20.7) |",
                f"| {len(h100)} | {pct(mape(h100))} (11.7) | {pct(max_abs(h100))} (16.0) |",
                f"on B200, {pct(worst.error_pct, signed=True)} (+16.9 % at one flat attention",
                f"on GB200 {pct(gb200.error_pct, signed=True)} (+10.3 %): the pair's mean, {pct(mape(moe))}, misses",
                f"with the block costs {signed(min(r.error_pct for r in b200))} … "
                f"{pct(max(r.error_pct for r in b200), signed=True)}.",
                f"the table's dense MAPE is {pct(mape(dense))}, max {pct(max_abs(dense))} "
                "(mb-llama405b-h100-fp8cs-cp2-2511)"]
    assert_stated("**Runs with context parallelism**", "**Runs that offloaded to the host**", expected,
                  "context-parallel", VREADME)


def test_the_nemo_sentence_states_the_table_as_priced_now(priced):
    res, _ = priced["nemo-performance"]
    kinds = V.summary(res)["kinds"]
    assert len(res) == 12 and not any(r.fit for r in res)
    expected = [f"MoE {pct(kinds['moe']['mape'])} ({kinds['moe']['rows']} rows)",
                f"dense {pct(kinds['dense']['mape'])} ({kinds['dense']['rows']} rows;"]
    assert_stated("Twelve NeMo Framework rows the bundled table never read", "An independent paper", expected, "NeMo")
    # validation/README.md: all twelve now, and the 405B GB200 row that offloads 95 layers
    expected = [f"now MoE {pct(kinds['moe']['mape'])}, dense {kinds['dense']['rows']} rows "
                f"{pct(kinds['dense']['mape'])}"]
    assert_stated("All twelve at cb3b8cf", "These nine rows are no longer", expected, "NeMo", VREADME)
    row = next(r for r in res if r.id == "nemo-llama31-405b-gb200-2507")
    assert_stated("The same reading of rows already held", "the Megatron-Core report's two",
                  [f"(+18.2 % then, at 99fdf4a; {pct(row.error_pct, signed=True)} now)"], "NeMo", VREADME)


def test_the_meta_llama3_405b_sentence_states_the_rows_as_priced_now(priced):
    res, _ = priced["llama3-405b-meta"]
    by = {r.id: r for r in res}
    errs = [by[i].error_pct for i in ("meta-l3-405b-8k", "meta-l3-405b-16k", "meta-l3-405b-16k-cp16")]
    expected = [f"{signed(errs[0])}, {signed(errs[1])} and {pct(errs[2], signed=True)} now",
                f"(MAPE {pct(V.summary(res)['kinds']['dense']['mape'])};"]
    assert_stated("Meta's Llama 3 405B pre-training on 8,192", "Another software stack", expected, "Meta Llama 3 405B")


def test_the_torchtitan_sentence_states_the_table_as_priced_now(priced):
    res, rows = priced["torchtitan"]
    dense = [r.error_pct for r in res if r.kind == "dense"]
    moe = [r.error_pct for r in res if r.kind == "moe"]
    a100 = [r.error_pct for r in res if rows[r.id]["hardware"].startswith("A100") and rows[r.id]["gpus"] == "64"]
    assert len(a100) == 8
    expected = [f"{len(res)} published torchtitan runs", f"read {span(dense)} on the dense ones",
                f"and {span(moe)} on DeepSeek-V3", f"the 64-A100 rows +19 … +31 → {span(a100)}"]
    assert_stated("Another software stack:", "AMD's own MI355X runs", expected, "torchtitan")
    # validation/README.md: the report's first six DeepSeek-V3 runs (tt53-tt58) and its final version's six
    by = {r.id: r.error_pct for r in res}
    first = [signed(by[f"tt{i}"]) for i in range(53, 59)]
    final = [signed(by[f"tt{i}"]) for i in range(59, 65)]
    expected = [f"The six now read {first[0]} / {first[1]} % (PP 1), {first[2]} / {first[3]} % and "
                f"{first[4]} / {first[5]} % (PP 2, without and with MTP)"]
    assert_stated("The six now read", "Their memory reads below", expected, "torchtitan", VREADME)
    expected = [f"read {final[0]} / {final[1]} and {final[2]} / {final[3]} %; the PP 2 pair at 120 micro-batches "
                f"{final[4]} / {final[5]} %"]
    assert_stated("**The report's final version**", "The six now read", expected, "torchtitan", VREADME)


def test_the_primus_sentence_states_the_table_as_priced_now(priced):
    res, rows = priced["primus"]
    qwen = {}  # (precision, fit) -> signed errors, shipped config then tuned, as the csv lists them
    for r in res:
        if rows[r.id]["model"] == "qwen3-30b-a3b":
            qwen.setdefault((rows[r.id]["precision"], r.fit), []).append(r.error_pct)
    dsv3 = sorted((r for r in res if rows[r.id]["model"] == "deepseek-v3"), key=lambda r: int(rows[r.id]["gpus"]))
    assert len(qwen["bf16", False]) == len(qwen["fp8", True]) == len(dsv3) == 2 and not any(r.fit for r in dsv3)
    b, f = qwen["bf16", False], qwen["fp8", True]
    expected = [f"BF16 {signed(b[0])} / {pct(b[1], signed=True)} out of sample",
                f"FP8 {signed(f[0])} / {pct(f[1], signed=True)} (marked fit",
                f"iteration time {signed(dsv3[0].error_pct)} / {pct(dsv3[1].error_pct, signed=True)} ("]
    assert_stated("AMD's own MI355X runs", "The rows beyond the targets", expected, "Primus")


def test_the_offload_passage_states_the_searches_as_priced_now():
    # README's DeepSeek-V3 MXFP8 on GB200 offload example: the searches and sweep rows it quotes
    from piper_plan.search import SearchSpace, search
    from piper_plan.specs import load_hardware, load_model
    from piper_plan.sweep import set_field
    m, hw = load_model("deepseek-v3"), load_hardware("gb200-nvl72")
    modules = ((), ("expert_fc1", "moe_act"))

    def best(n, link=None, **kw):
        h = hw if link is None else set_field(hw, "host.link_gbps", link)
        r = search(m, h, SearchSpace(gpus=n, global_batch=1024, seq=m.seq_len, fp8="mxfp8", fp8_params=True, **kw))
        return float(r.est.tokens_per_s[r.best])

    plain, mods = best(144), best(144, offload_modules=modules)
    every = dict(optimizer_offload=(0.0, 1.0), offload_layers=(0, 20, 40), offload_modules=modules)
    assert best(144, **every) == mods
    at112 = best(112)
    assert best(112, offload_modules=modules) == at112
    expected = [f"({plain:,.0f} tokens/s, {plain / 144:,.0f} a GPU)", f"({mods:,.0f}, {mods / 144:,.0f} a GPU;",
                f"({at112:,.0f} tokens/s either way", f"instead ({best(112, **every):,.0f})",
                f"recomputes instead: {best(144, 50, offload_modules=modules):,.0f} against {mods:,.0f}",
                f"already offloads, {best(144, 100, offload_modules=modules):,.0f})"]
    assert_stated("tries each value (each module set) as a choice", "- Attention backward", expected, "offload")


def cli_json(*args, exit_code: int = 0) -> dict:
    """`piper-plan ARGS --json`'s document, as the README's command prints it (a search where
    nothing fits exits 1)."""
    r = CliRunner().invoke(main, [*args, "--json"])
    assert r.exit_code == exit_code, r.output
    return json.loads(r.stdout)


def times(x: float) -> str:
    return f"×{x:.2f}"


@pytest.fixture(scope="module")
def bundled():
    """(results, table rows) of the bundled table, priced once as `piper-plan validate` prices it."""
    return V.run_with_rows(None, None)


def test_the_count_of_published_measurements_is_the_bundled_table_s(bundled):
    res, _ = bundled
    text = README.read_text()
    assert f"{len(res)} published measurements, each with its source" in text
    beyond = [r for r in res if r.kind == "moe" and not r.fit and abs(r.error_pct) > V.TARGETS["moe"][1]]
    words = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}
    assert f"of the {words.get(len(beyond), len(beyond))} MoE ones" in text


def test_the_targets_table_states_the_bundled_table_as_priced_now(bundled):
    res, _ = bundled
    s = V.summary(res)
    kinds = s["kinds"]
    mb = [r for r in res if r.group == "megatron-bridge-dense" and not r.fit]
    assert len(mb) == s["groups"]["megatron-bridge-dense"]["rows"] and all(np.isfinite(r.predicted) for r in mb)
    mb_within = sum(abs(r.error_pct) <= V.TARGETS["dense"][1] for r in mb)

    def row(label, n, mape_, max_, within, target):
        return f"| {label} | {n} | {pct(mape_)} | {pct(max_)} | {within} of {n} ({target:g} %) |"

    def kind_row(label, name):
        k = kinds[name]
        return row(label, k["rows"], k["mape"], k["max_abs_pct"], k["within_target_max"], k["target_max"])

    g = s["groups"]["megatron-bridge-dense"]
    expected = [
        kind_row("dense, A100 (Narayanan 2021 Table 1, Korthikanti 2022 Table 5)", "dense_named_sources"),
        row("dense, Hopper/Blackwell (Megatron-Bridge Llama 3 8B / 70B / 405B)", g["rows"], g["mape"],
            g["max_abs_pct"], mb_within, V.TARGETS["dense"][1]),
        kind_row("memory (Korthikanti 2022 Fig. 1)", "memory"),
        kind_row("MoE (Megatron-Bridge, X-MoE, Piper Fig. 13 and weak scaling)", "moe_named_sources"),
        kind_row("MoE, all (the above, Megatron-LM's rows, the Megatron-Core report and its model zoo)", "moe"),
    ]
    assert_stated("| rows | n | MAPE |", "Whether the misses share a cause", expected, "validate targets table")


def test_the_residuals_sentence_states_the_track_record_as_priced_now(bundled):
    from piper_plan.validate_residuals import TRENDS, residuals, setups

    d = residuals(*bundled)
    gpus = [TRENDS["gpus"](u["row"]) for u in setups(*bundled)]
    rho = next(x for x in d["trends"] if x["setting"] == "gpus")
    level = {(s["factor"], s["level"]): s for s in d["levels"]}
    oss, hybridep = level["model", "gpt-oss-120b"], level["model x dispatcher", "gpt-oss-120b x hybridep"]
    graphs = [level["model x cuda_graphs", f"{m} x full_iteration"] for m in ("qwen3-235b-a22b", "deepseek-v3-mtp")]
    # "no dispatcher, CUDA-graph scope, expert-GEMM form or overlap setting is biased; one model is, ...,
    # five of its crossings with a setting are flagged with it, and two other levels are"
    assert not any(s["bias"] for s in d["levels"] if s["factor"] in ("dispatcher", "cuda_graphs", "expert_gemm",
                                                                        "a2a_overlap"))
    flagged = [(s["factor"], s["level"]) for s in d["levels"] if s["bias"]]
    assert [lv for f, lv in flagged if f == "model"] == ["gpt-oss-120b"]
    crossings = {(f, lv) for f, lv in flagged if f.startswith("model x ") and lv.startswith("gpt-oss-120b x ")}
    assert crossings == {("model x pipeline", "gpt-oss-120b x pp 1"), ("model x dispatcher", "gpt-oss-120b x hybridep"),
                         ("model x a2a_overlap", "gpt-oss-120b x yes"),
                         ("model x expert_gemm", "gpt-oss-120b x multistream"),
                         ("model x precision", "gpt-oss-120b x bf16")}  # validation/README.md names these six
    h100, qwen_bf16 = level["hardware", "dgx-h100"], level["model x precision", "qwen3-30b-a3b x bf16"]
    assert set(flagged) - crossings - {("model", "gpt-oss-120b")} == {("hardware", "dgx-h100"),
                                                                      ("model x precision", "qwen3-30b-a3b x bf16")}
    assert not rho["trend"] and oss["bias"] and hybridep["bias"] and not any(s["bias"] for s in graphs)
    slow = sorted(-s["mean_pct"] for s in graphs)
    gpu_rho = _minus(f"{rho['rho']:+.2f}")

    def other(s):
        return f"{pct(s['mean_pct'], signed=True)} over {s['setups']} setups (q {s['q']:.3f})"
    words = {5: "five", 6: "six", 8: "eight"}
    expected = [f"Over {d['setups']} setups the mean is {pct(d['overall_pct'], signed=True)};",
                f"(ρ {gpu_rho}, {min(gpus):,.0f} to {max(gpus):,.0f} GPUs)",
                f"GPT-OSS-120B, {pct(oss['mean_pct'], signed=True)} over {oss['setups']} setups "
                f"({pct(hybridep['mean_pct'], signed=True)} where HybridEP dispatches; "
                f"{words[len(crossings)]} of its crossings with a setting are flagged with it)",
                f"DGX-H100, {other(h100)}, and Qwen3-30B-A3B in BF16, {other(qwen_bf16)}.",
                f"read {slow[0]:.0f}-{slow[1]:.0f} % slow and are no longer flagged"]
    assert_stated("Whether the misses share a cause", "`piper-plan estimate` and `search` end with", expected,
                  "validate --residuals")
    # validation/README.md: the run now, after its session notes, and the trends now
    trend = {x["setting"]: _minus(f"{x['rho']:+.2f}") for x in d["trends"]}

    def named(s):
        return f"{pct(s['mean_pct'], signed=True)} ({s['setups']} setups, q {s['q']:.3f})"
    expected = [f"Now (`piper-plan validate --residuals`): {d['setups']} setups ({d['rows']} rows), mean "
                f"{pct(d['overall_pct'], signed=True)}; {words[len(flagged)]} levels are biases, GPT-OSS-120B's "
                f"{words[len(crossings) + 1]} (the model, × PP 1, × HybridEP, × all-to-all overlap, × multistream "
                f"expert GEMMs, × BF16), DGX-H100 {named(h100)} and Qwen3-30B-A3B × BF16 {named(qwen_bf16)};",
                f"the full-iteration levels read {pct(graphs[0]['mean_pct'], signed=True)} (Qwen3-235B) and "
                f"{pct(graphs[1]['mean_pct'], signed=True)} (DeepSeek-V3 with MTP), under ±10 %.",
                f"now ρ {trend['gpus']} against the GPU count, MBS {trend['mbs']}, hidden {trend['hidden']}, "
                f"sequence {trend['seq']})"]
    assert all(abs(s["mean_pct"]) < 10 for s in graphs)
    assert_stated("Session 52 (the three Megatron-FSDP rows", "`piper-plan estimate` and `search` print these",
                  expected, "validate --residuals", VREADME)


def test_the_regressed_kernel_sentences_state_the_gpt_oss_rows_as_priced_now(bundled):
    # NeMo 26.06.01's two GPT-OSS-120B rows on the container's machine, unpriced on its base spec, and
    # their 26.06 twins (README.md and validation/README.md)
    res, rows = bundled
    by = {r.id: r.error_pct for r in res}
    ids = [f"mb-gptoss120b-{hw}-mxfp8-260601" for hw in ("gb300", "gb200")]
    regressed = [r for r in rows if r["id"] in ids]
    assert [r["hardware_spec"] for r in regressed] == ["gb300-nvl72-nemo260601", "gb200-nvl72-nemo260601"]
    base = {r.id: r.error_pct for r in V.price_rows(
        [{**r, "hardware_spec": r["hardware_spec"].removesuffix("-nemo260601")} for r in regressed], V.data_path(), {})}
    now, unpriced = [by[i] for i in ids], [base[i] for i in ids]
    twins = [by[i.removesuffix("01")] for i in ids]
    expected = [f"from {signed(unpriced[0])} / {pct(unpriced[1], signed=True)} (priced on gb300-nvl72 / gb200-nvl72) "
                f"to {signed(now[0])} / {pct(now[1], signed=True)} (their 26.06 twins read {signed(twins[0])} / "
                f"{pct(twins[1], signed=True)})."]
    assert_stated("The rows beyond the targets are named", "## Benchmarks", expected, "26.06.01 GPT-OSS")
    expected = [f"now (`piper-plan validate`) {signed(now[0])} / {pct(now[1], signed=True)} "
                f"(twins {signed(twins[0])} / {pct(twins[1], signed=True)}; unpriced, on gb300-nvl72 / gb200-nvl72, "
                f"{signed(unpriced[0])} / "
                f"{pct(unpriced[1], signed=True)})."]
    assert_stated("**The regressed kernel, priced", "Why the developers' ratio fell short", expected,
                  "26.06.01 GPT-OSS", VREADME)


def test_validation_readme_states_the_bundled_rows_as_priced_now(bundled):
    res, _ = bundled
    s = V.summary(res)
    by = {r.id: r.error_pct for r in res}
    # "Where the MoE error is": the targets table's two MoE counts, and with the in-sample rows
    moe, named = s["kinds"]["moe"]["rows"], s["kinds"]["moe_named_sources"]["rows"]
    every = [r for r in res if r.kind == "moe"]
    every_named = [r for r in every if r.group in V.MOE_ACCEPTANCE_GROUPS]
    assert [r.group for r in every if r.fit and r.group not in V.MOE_ACCEPTANCE_GROUPS] == ["primus-mi355x"]
    expected = [f"over all {moe} out-of-sample MoE rows, and over the {named} rows of the sources",
                f"since the other {moe - named} (", f"(with the three in-sample rows, {len(every)}, {len(every_named)} "
                f"and {len(every) - len(every_named)})"]
    assert sum(r.fit for r in every) == 3
    assert_stated("## Where the MoE error is", "They read 11.7 % and 11.2 %", expected, "MoE counts", VREADME)
    # the Megatron-Core report's rows: its two GB200 rows that offload the optimizer, and the group
    gb200 = [by[f"mcore-dsv3mtp-gb200-{p}"] for p in ("mxfp8", "bf16")]
    report = s["groups"]["mcore2026-moe-report"]
    assert_stated("The same reading of rows already held", "Megatron-Bridge's own measurement of",
                  [f"read {pct(gb200[0], signed=True)} and {pct(gb200[1], signed=True)} now "
                   "(mcore-dsv3mtp-gb200-mxfp8"],
                  "Megatron-Core report", VREADME)
    expected = [f"both fit, and read {signed(gb200[0])} / {pct(gb200[1], signed=True)} now)",
                f"mb-dsv3mtp-h100-fp8-2509 ({pct(by['mb-dsv3mtp-h100-fp8-2509'], signed=True)} now) fast",
                f"Group MAPE {pct(report['mape'])} over its {report['rows']} rows (`piper-plan validate`;"]
    assert_stated("moments are about 30 (now priced", "- Group mlm-docs", expected, "Megatron-Core report", VREADME)


def test_the_frontier_plateau_sentences_state_what_the_single_layer_rates_imply_now():
    from piper_plan.specs import load_hardware
    from piper_plan.validate_kernels import implied_gemm

    spec, now = load_hardware("frontier").efficiency.gemm, f"{implied_gemm():.3f}"
    assert_stated("## Conventions", "- FP8 attention (`--attention-fp8`",
                  [f"against frontier.yaml's {spec:g}, set from Piper's own runs on the machine (their single-layer "
                   f"rates imply {now} now: `piper-plan validate`)"], "Frontier's GEMM plateau")
    assert_stated("**Frontier's two GEMM sources.**", "- validation/full_models_piper_frontier.csv",
                  [f"geometric mean was {spec:g} when the plateau was set (`implied_gemm`, scipy's brentq; {now} now,"],
                  "Frontier's GEMM plateau", VREADME)


def test_the_job_block_bullet_states_its_counterfactual_as_priced_now(bundled):
    # Conventions: the NVL72 specs' job_block 64 against racks filled 72 a rack, every row repriced
    from piper_plan.sweep import set_field

    def filled(hw):
        levels = [i for i, lv in enumerate(hw.topology) if lv.job_block == 64]
        return set_field(hw, f"topology.{levels[0]}.job_block", 72) if levels else hw
    now = {r.id: r for r in bundled[0]}
    res = V.run(hw_edit=filled)
    moved = [(now[r.id].predicted, r.predicted) for r in res if r.predicted != now[r.id].predicted]
    fall = [100 * (1 - b / a) for a, b in moved if b < a]
    rise = [100 * (b / a - 1) for a, b in moved if b > a]
    words = {3: "three", 4: "four", 5: "five"}
    before, after = (pct(V.summary(x)["kinds"]["moe"]["mape"]) for x in (bundled[0], res))
    expected = [f"and {len(moved)} GB200/GB300 rows of `piper-plan validate` move ({len(fall)} fall by up to "
                f"{max(fall):.1f} %, {words[len(rise)]} rise by up to {max(rise):.0f} %; MoE MAPE {before} to {after})"]
    assert_stated("## Conventions", "- FP8 attention (`--attention-fp8`", expected, "job_block")


def test_the_weak_scaling_ratios_are_the_batch_scan_s():
    from piper_plan.validate_batch import batch_scan

    rows = {r["id"]: r for r in batch_scan(group="piper2026-weak-scaling")}
    one = [100 * (r["scan"][0]["predicted"] / r["published"] - 1) for r in rows.values()]
    rel = {i: rows[i]["relative"] for i in ("piper-ws-862b", "piper-ws-1.7t")}
    errs = {i: [100 * (p / x["published"] - 1) for p in x["predicted"]] for i, x in rel.items()}

    def line(i, label):
        x, e = rel[i], errs[i]
        return (f"| {i} ({label} GCDs) | {x['published']:.3f} | {' / '.join(f'{p:.3f}' for p in x['predicted'])} "
                f"({_minus(f'{e[0]:+.0f}')} … {_minus(f'{e[-1]:+.0f}')} %) |")
    worst = max(abs(e) for v in errs.values() for e in v)
    expected = [line("piper-ws-862b", "512"), line("piper-ws-1.7t", "1,024"),
                f"within {int(np.ceil(worst))} % of what Piper measured at every batch",
                f"within {int(np.ceil(max(abs(e) for e in one)))} % ({' / '.join(_minus(f'{e:+.0f}') for e in one)} %: "
                f"two within 10 %, the 862B row at {pct(one[1], signed=True)};"]
    assert sum(abs(e) <= 10 for e in one) == 2
    assert_stated("`piper-plan validate --batch-scan` measures that", "**Dense rows on Hopper and Blackwell",
                  expected, "--batch-scan weak scaling", VREADME)


def test_the_handed_over_table_sentence_states_it_as_priced_now():
    k = V.summary(V.run(path=Path(__file__).parent / "data" / "published-schema.csv"))["kinds"]
    expected = [f"read dense {pct(k['dense']['mape'])}, memory {pct(k['memory']['mape'])}, "
                f"MoE {pct(k['moe']['mape'])} MAPE that way"]
    assert_stated("The 47 rows of the published table as handed", "A row that states no recipe", expected,
                  "published-schema.csv")


def test_the_blind_sentence_states_the_blind_run_as_priced_now(bundled):
    from piper_plan.validate_blind import blind_run

    blind = blind_run()[0]
    inferred = V.summary(blind)["kinds"]
    bare = V.summary(blind_run(infer=False)[0])["kinds"]
    moe, none = inferred["moe"], bare["moe"]
    expected = [f"reads MoE {pct(moe['mape'])} MAPE, {moe['within_target_max']} of {moe['rows']} within "
                f"{moe['target_max']:g} % (with no recipe at all, {pct(none['mape'])} and {none['within_target_max']}),"
                f" dense {pct(inferred['dense']['mape'])} (A100 {pct(inferred['dense_named_sources']['mape'])})"]
    assert_stated("What that is worth on runs the bundled", "Twelve NeMo Framework rows", expected, "validate --blind")
    # validation/README.md: the same run by kind, and the rows beyond 35 % blind (as `--blind` lists them)

    def both(kind):
        a, b = inferred[kind], bare[kind]
        return (f"{a['rows']}: {pct(a['mape'])} / {a['within_target_max']}, {pct(b['mape'])} / "
                f"{b['within_target_max']}")
    expected = [f"MoE, all {both('moe')}; MoE, named sources {both('moe_named_sources')}; dense, all {both('dense')}; "
                f"dense, A100 {both('dense_named_sources')} (at cb3b8cf:"]
    assert_stated("overlap: below.) Now (`piper-plan validate --blind`)", "The order of the ranking", expected,
                  "validate --blind", VREADME)
    beyond = [r for r in blind if r.kind == "moe" and not r.fit and abs(r.error_pct) > V.TARGETS["moe"][1]]
    beyond.sort(key=lambda r: -abs(r.error_pct))
    as_bundled = {r.id: r.error_pct for r in bundled[0]}
    words = {7: "seven", 8: "eight", 9: "nine", 10: "ten", 11: "eleven"}
    text = passage("beyond 35 % blind are now", "When blind pricing was added", VREADME)
    assert text.startswith(f"beyond 35 % blind are now {words[len(beyond)]}: ")
    at = [text.find(f"{r.id} ({pct(r.error_pct, signed=True)}") for r in beyond]
    assert -1 not in at and at == sorted(at), [r.id for r, i in zip(beyond, at) if i < 0]  # each, in that order
    for r, i in zip(beyond, at):  # where the sentence gives the row's bundled error, it is the bundled run's
        if text.startswith(f"{r.id} ({pct(r.error_pct, signed=True)}; ", i):
            stated = text[i:].split("; ", 1)[1]
            assert stated.startswith(f"{pct(as_bundled[r.id], signed=True)} as bundled"), r.id
        elif text.startswith(f"{r.id} ({pct(r.error_pct, signed=True)}, as bundled", i):
            assert f"{as_bundled[r.id]:.1f}" == f"{r.error_pct:.1f}", r.id


GRANITE = ["-m", "tests/data/hf/granite-3.0-3b-a800m-instruct.json", "-H", "dgx-h200", "-n", "1", "--global-batch",
           "8", "--seq", "2048", "--zero", "0", "--a2a", "flat", "--kernels", "unfused", "--no-sequence-parallel",
           "--no-overlap-grad-reduce"]
GRANITE_PLANS = {"A": ["--mbs", "8", "--recompute", "full"], "B": ["--mbs", "4"]}
# measured on a lent H200 (README's table: median step of steps 9-16 in ms, device memory peak in GiB);
# GPU runs, not the model: they stand as written
GRANITE_MEASURED = {"A": (763.2, 65.9), "B": (666.3, 100.6)}


def test_the_granite_section_states_plans_a_and_b_as_estimate_prices_them_now():
    root = Path(__file__).parents[1]
    args = [str(root / a) if a.endswith(".json") else a for a in GRANITE]
    est = {k: cli_json("estimate", *args, *extra) for k, extra in GRANITE_PLANS.items()}
    s = {k: e["step_time_s"] for k, e in est.items()}
    gib = {k: e["peak_memory_gib"] for k, e in est.items()}
    ms = {k: GRANITE_MEASURED[k][0] for k in est}
    mem = {k: GRANITE_MEASURED[k][1] for k in est}
    expected = [f"| {ms[k]:.1f} ms | {1000 * s[k]:.1f} ms ({times(ms[k] / (1000 * s[k]))}) | "
                f"{mem[k]:.1f} / {gib[k]:.1f} GiB ({times(mem[k] / gib[k])}) |" for k in "AB"]
    expected += [
        f"plan B is priced at {s['B']:.3f} s and {gib['B']:.1f} GiB (the table's prediction)",
        f"`piper-plan estimate {' '.join(GRANITE)} {' '.join(GRANITE_PLANS['B'])} -o plan_b.json`; "
        f"plan A: `{' '.join(GRANITE_PLANS['A'])}`)",
        f"plan B {s['B']:.3f} s against {ms['B'] / 1000:.3f} measured ({times(ms['B'] / (1000 * s['B']))}; "
        f"memory {mem['B']:.1f} / {gib['B']:.1f} GiB, {times(mem['B'] / gib['B'])})",
        f"plan A (MBS 8, full recompute) {s['A']:.3f} s against {ms['A'] / 1000:.3f} measured "
        f"({times(ms['A'] / (1000 * s['A']))}; {mem['A']:.1f} / {gib['A']:.1f} GiB, {times(mem['A'] / gib['A'])})",
    ]
    assert_stated("## piper-train on one GPU", "## Conventions", expected, "Granite plans A and B")


def test_the_fp8_bullet_states_the_llama3_405b_and_qwen3_235b_searches_as_priced_now():
    def best(model, n, *flags, exit_code=0):
        return cli_json("search", "-m", model, "-H", "gb200-nvl72", "-n", str(n), *flags, exit_code=exit_code)

    cur, cur_p, mx_all, mx_p_all = (best("llama3.1-405b", 256, *f, "--top", "60")["top"] for f in (
        ("--fp8", "current"), ("--fp8", "current", "--fp8-params"), ("--fp8", "mxfp8"),
        ("--fp8", "mxfp8", "--fp8-params")))
    cur, cur_p, mx, mx_p = cur[0], cur_p[0], mx_all[0], mx_p_all[0]
    assert (cur_p["layout"]["pp"], cur_p["layout"]["zero"]) == (1, 3)  # "no pipeline, ZeRO-3 over DP ..."
    z3 = layout_str(cur_p["layout"])
    # "the ZeRO-3 plan reads ... with either weights": MXFP8 weights are gathered in bf16, so FP8 ones gain it nothing
    mx_z3 = [x["tokens_per_s"] for x in mx_all if layout_str(x["layout"]) == z3]
    assert len(mx_z3) == 1 and mx_z3 == [x["tokens_per_s"] for x in mx_p_all if layout_str(x["layout"]) == z3]
    # "and a pipeline leads it ...; with FP8 weights, which leave room for 16 stages, ..."
    assert mx["layout"]["pp"] == 32 and mx_p["layout"]["pp"] == 16
    assert mx_p["tokens_per_s"] > mx["tokens_per_s"] > mx_z3[0]
    assert layout_str(mx_p["layout"]) not in [layout_str(x["layout"]) for x in mx_all]  # it does not fit bf16 weights
    assert cur["layout"]["zero"] < 3 and cur["layout"]["pp"] > 1           # bf16 weights: a pipeline
    assert mx["tokens_per_s"] < cur["tokens_per_s"] < cur_p["tokens_per_s"]
    # "each plan gathers its two halves of a sequence's keys"
    assert all(x["layout"]["cp"] == 2 and x["layout"]["cp_comm"] == "all_gather" for x in (cur, cur_p, mx, mx_p))
    qwen = ("qwen3-235b-a22b", 24, "--global-batch", "1024", "--fp8", "mxfp8")
    nothing = best(*qwen, exit_code=1)
    fp8_params = best(*qwen, "--fp8-params")["top"][0]["tokens_per_s"]
    host_optimizer = best(*qwen, "--optimizer-offload", "1")["top"][0]["tokens_per_s"]
    assert nothing["top"] == [] and any("--fp8-params" in w and f"best {fp8_params:,.0f} tokens/s" in w
                                        for w in nothing["infeasible"])
    assert any("--optimizer-offload 1" in w and f"best {host_optimizer:,.0f} tokens/s" in w
               for w in nothing["infeasible"])
    expected = [
        f"--fp8 current`): {cur['tokens_per_s']:,.0f} tokens/s with bf16 weights (`{layout_str(cur['layout'])}`) "
        f"and {cur_p['tokens_per_s']:,.0f} with FP8 ones (`--fp8-params`: `{layout_str(cur_p['layout'])}`, no "
        f"pipeline, ZeRO-3 over DP {cur_p['layout']['dp']},",
        f"under `--fp8 mxfp8` the ZeRO-3 plan reads {mx_z3[0]:,.0f} with either weights,",
        f"(`{layout_str(mx['layout'])}`, {mx['tokens_per_s']:,.0f}; with FP8 weights, which leave room for 16 stages, "
        f"`{layout_str(mx_p['layout'])}`, {mx_p['tokens_per_s']:,.0f});",
        f"mxfp8`: {fp8_params:,.0f} tokens/s, what `--fp8-params` finds; the optimizer state on the host: "
        f"{host_optimizer:,.0f})",
    ]
    assert_stated("in FP8 on 256 GB200 (`piper-plan search -m llama3.1-405b", "`--expert-probs activation`",
                  expected, "FP8 searches")
