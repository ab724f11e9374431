"""Regression guard on the accuracy figures of `piper-plan validate` (see validation/README.md)."""
import pytest

from piper_plan.validate import TARGETS, data_path, read_rows, run, summary
from piper_plan.specs import load_hardware


# issue 4's acceptance, written here rather than read from the code it guards: (mean, max |%|)
ISSUE_TARGETS = {"dense": (10.0, 20.0), "memory": (10.0, 10.0), "moe": (20.0, 35.0)}


def test_the_targets_validate_reports_against_are_the_issue_s():
    assert TARGETS == ISSUE_TARGETS


@pytest.fixture(scope="module")
def results():
    return run()


@pytest.fixture(scope="module")
def published():
    """The validation set's rows, read once."""
    return read_rows(data_path())


def test_dense_rows_meet_the_targets(results):
    # the acceptance's dense rows (A100: Narayanan 2021 Table 1, Korthikanti 2022 Table 5)
    k = summary(results)["kinds"]["dense_named_sources"]
    assert k["rows"] == 18 and k["mape"] <= 10.0 and k["max_abs_pct"] <= 20.0
    assert summary(results)["kinds"]["dense"]["rows"] >= 18  # every dense row, the later ones too


def test_memory_rows_each_within_10_percent(results):
    mem = [r for r in results if r.kind == "memory"]
    assert len(mem) == 12 and all(abs(r.error_pct) <= 10 for r in mem)


def test_moe_rows_meet_the_mean_target(results):
    # MAPE <= 20 % over the 166 out-of-sample MoE rows (12.0 % now, the three Megatron-FSDP rows and
    # PR #5289's two Qwen3-235B Blackwell recipes among them; GPT-OSS-20B's #5028 pair is
    # in-sample). The issue's other MoE target, no row worse than 35 %, is NOT met yet (3 rows are
    # worse; issue 4 stays open): this guard fails a change that takes the mean back above its target.
    k = summary(results)["kinds"]["moe"]
    assert k["rows"] == 185 and k["mape"] <= 20.0


def test_the_issue_s_named_moe_sources_are_reported_alone(results):
    # the acceptance names Megatron-Bridge, X-MoE and Piper's Fig. 13 and weak scaling: their 158
    # out-of-sample rows get their own line, held to the mean target (11.8 % now; their max target is
    # not met: 2 rows are worse than 35 %, one a figure its publisher calls a regression, the other
    # a run whose batch is unpublished; issue 4 stays open), and to the 137 rows now within its max
    # (the four Kimi K2 rows, priced on a spec added after every parameter was set, among them).
    from piper_plan.validate import MOE_ACCEPTANCE_GROUPS

    named = [r for r in results if r.group in MOE_ACCEPTANCE_GROUPS and not r.fit]  # out-of-sample
    k = summary(results)["kinds"]["moe_named_sources"]
    assert k["rows"] == len(named) == 158 and all(r.kind == "moe" for r in named)
    assert k["mape"] == pytest.approx(sum(abs(r.error_pct) for r in named) / 158)
    assert k["within_target_max"] == sum(abs(r.error_pct) <= 35.0 for r in named)
    assert k["mape"] <= 20.0
    # the rows the max target misses are named, with their signed errors
    assert k["beyond_target_max"] == {r.id: r.error_pct for r in named if abs(r.error_pct) > 35.0}
    assert len(k["beyond_target_max"]) + k["within_target_max"] == 158
    assert k["within_target_max"] >= 156


def test_dense_ranking_follows_measurement(results):
    g = summary(results)["groups"]["narayanan2021-table1"]
    assert g["kendall_tau"]["hw_tflops_per_gpu"] > 0.5


def test_explain_gives_the_measured_step_and_the_per_layer_gap():
    from piper_plan.validate_explain import explain

    d = explain("kor22-t5-22b-full")  # iteration_time_s: the published value is the step time
    assert d["measured_step_time_s"] == 1.42
    lay = d["layout"]
    passes = lay["global_batch"] // (lay["dp"] * lay["mbs"]) * 48 / lay["pp"]  # gpt-22b: 48 layers
    assert d["missing_ms_per_layer_microbatch"] == pytest.approx(1e3 * (1.42 - d["step_time_s"]) / passes)
    assert sum(v for k, v in d["time_breakdown_s"].items() if k != "total") == pytest.approx(d["step_time_s"])
    tok = explain("mb-dsv3-gb300-bf16")  # tokens/s rows: GBS x seq / (tok/s/GPU x GPUs)
    assert tok["measured_step_time_s"] == pytest.approx(4096 * 4096 / (3848 * 256))


def test_explain_of_a_memory_row_shows_the_parts_its_prediction_sums():
    """--explain of a Korthikanti Fig. 1 row had shown step seconds only, none of the GiB it predicts."""
    from piper_plan.validate_explain import explain

    act = explain("kor22-f1-22b-act-sel")
    assert act["predicted"] == pytest.approx(act["memory_first_stage_gib"]["activations"])
    states = explain("kor22-f1-22b-states")
    mem = states["memory_first_stage_gib"]
    assert states["predicted"] < sum(mem[k] for k in ("weights", "grads", "master", "optimizer"))  # less the embedding
    assert states["group"] == "korthikanti2022-fig1" and not states["fit"]


def test_every_row_with_a_measured_step_reports_its_per_layer_gap(results):
    from piper_plan.validate_explain import explain

    by_id = {r.id: r for r in results}
    assert by_id["mb-qwen3-30b-h100-bf16-card"].missing_ms_per_layer_microbatch == pytest.approx(
        explain("mb-qwen3-30b-h100-bf16-card")["missing_ms_per_layer_microbatch"])
    # memory rows and planner's-choice rows fix no step time of a known layout: no gap
    assert by_id["piper-f13-small"].missing_ms_per_layer_microbatch is None
    assert all(r.missing_ms_per_layer_microbatch is None for r in results if r.kind == "memory")
    # TFLOPS under the source's own FLOP count fix the step too (Narayanan's eq. 3 here)
    assert by_id["nar21-t1-7.5b"].missing_ms_per_layer_microbatch is not None
    # a row the model prices too fast misses time; one it prices too slow has a negative gap
    assert all((r.missing_ms_per_layer_microbatch > 0) == (r.error_pct < 0 if r.metric == "iteration_time_s"
                                                             else r.error_pct > 0)
               for r in results if r.missing_ms_per_layer_microbatch is not None)


def test_every_megatron_row_names_the_cuda_graph_scopes_its_recipe_replays(published):
    from piper_plan.cost.batch import GRAPH_SCOPES
    from piper_plan.validate_recipes import MEGATRON_GROUPS

    rows = [r for r in published if r["group"] in MEGATRON_GROUPS]
    assert len(rows) == 210  # 175 MoE, 35 dense
    for r in rows:
        scopes = r["cuda_graphs"].split("+")
        assert scopes == ["none"] or all(s in GRAPH_SCOPES for s in scopes), (r["id"], r["cuda_graphs"])


def test_every_megatron_row_names_its_dispatcher_overlap_expert_gemms_and_recompute(published):
    from piper_plan.cost.batch import RC_MODULES
    from piper_plan.validate import DISPATCHER_A2A
    from piper_plan.validate_recipes import MEGATRON_GROUPS

    rows = published
    megatron = [r for r in rows if r["group"] in MEGATRON_GROUPS and r["experts"]]  # the MoE ones
    for r in megatron:
        assert r["dispatcher"] in DISPATCHER_A2A and r["dispatcher"], (r["id"], r["dispatcher"])
        assert r["a2a_overlap"] in ("yes", "no"), (r["id"], r["a2a_overlap"])
        assert r["expert_gemm"] in ("multistream", "grouped"), (r["id"], r["expert_gemm"])
    # the columns carry what the notes quote of each recipe
    assert all((r["dispatcher"] in r["notes"].lower() or r["dispatcher"] == "alltoall") for r in megatron)
    assert all((r["a2a_overlap"] == "yes") == ("moe_a2a_overlap=True" in r["notes"]) for r in megatron)
    assert all(r["a2a_sms"] in ("", "32", "80") for r in rows)
    assert all((r["a2a_sms"] == "32") == ("32 SMs" in r["notes"]) for r in rows)
    assert all((r["a2a_sms"] == "80") == ("turbo_deepep_num_cu 80" in r["notes"]) for r in rows)  # Primus on MI355X: CUs
    for r in (r for r in rows if r["recompute"] == "per recipe"):
        mods = r["recompute_modules"].split("+")
        assert mods == ["none"] or all(m in RC_MODULES for m in mods), (r["id"], r["recompute_modules"])


def test_published_tokens_per_second_and_zero_stages_are_columns_that_agree_with_the_notes(published):
    import re

    from piper_plan import validate as V

    rows = published
    with_tok = [r for r in rows if r["tokens_per_s_per_gpu"]]
    # the Megatron-Bridge tables and the Megatron-Core report publish tokens/s beside TFLOP/s
    tables = [r for r in rows if r["group"] in ("megatron-bridge-moe", "mcore2026-moe-report", "megatron-bridge-dense")
              and r["metric"] == "model_tflops_per_gpu"]
    assert with_tok == tables and len(tables) == 173
    for r in with_tok:
        quoted = re.search(r"([\d.]+) tok/s/GPU", r["notes"])  # the notes quote the row's own figure first
        assert quoted and float(quoted.group(1)) == float(r["tokens_per_s_per_gpu"]), r["id"]
        assert V._compared(r) == ("tokens_per_s_per_gpu", float(r["tokens_per_s_per_gpu"]))
    # a note that quotes another table's figure after its own does not change what is compared
    twin = next(r for r in rows if r["id"] == "mb-qwen3-235b-b300-mxfp8-2604")
    assert "5,984" in twin["notes"] or "5984" in twin["notes"]
    assert V._tokens_per_gpu(twin) == 4865.0
    xmoe = [r for r in rows if r["group"] == "xmoe2025" and r["tp"]]
    assert xmoe and all(r["zero_stage"] in ("1", "2", "3") for r in xmoe)
    assert all(f"ZeRO-{r['zero_stage']}" in r["notes"] for r in xmoe)
    assert V._xmoe_settings(next(r for r in xmoe if r["id"] == "xmoe-f13-super"))["zero"] == 2
    # elsewhere only Megatron-FSDP (optim_grads_params) sets it, to 3
    fsdp = [r for r in rows if r["zero_stage"] and r["group"] != "xmoe2025"]
    assert [r["id"] for r in fsdp] == ["mb-llama8b-h100-fp8-2511", "mcore-zoo-qwen3-235b-h100-deepep-fsdp",
                                       "mlm-fsdp-qwen3-30b-gb200-bf16-v1", "mlm-fsdp-qwen3-30b-gb200-bf16-v2",
                                       "mlm-fsdp-qwen3-30b-gb200-mxfp8-v2"]
    assert all(r["zero_stage"] == "3" and "optim_grads_params" in r["notes"] for r in fsdp)
    assert V._settings(fsdp[0], load_hardware("dgx-h100"))["zero"] == 3
    # FP8 weights: every FP8 row says whether its recipe kept them, and the notes quote where
    fp8 = [r for r in rows if r["precision"] in ("fp8", "mxfp8", "fp8-blockwise")]
    assert fp8 and all(r["fp8_params"] in ("yes", "no") for r in fp8)
    assert all((r["fp8_params"] == "yes") == ("FP8 weights: fp8_param_gather=True" in r["notes"]) for r in fp8)
    assert all(r["fp8_params"] == "" for r in rows if r not in fp8)
    # tensor-parallel communication overlap and FP8 attention: the columns carry what the notes quote
    assert all((r["tp_comm_overlap"] == "yes") == ("tp_comm_overlap=True" in r["notes"]) for r in rows)
    fp8_attn = [r for r in rows if r["attention_fp8"] == "yes"]
    assert len(fp8_attn) == 37 and all("fp8_dot_product_attention" in r["notes"] for r in fp8_attn)
    assert all(V._settings(r, V.row_specs(r, {})[1])["attention_fp8"] for r in fp8_attn)


def test_every_pipelined_megatron_row_says_how_its_layers_were_split(published):
    from piper_plan.validate_recipes import MEGATRON_GROUPS

    rows = [r for r in published if r["pp"] not in ("", "1")]
    assert rows and all(r["pipeline_split"] in ("even", "account", "layout") for r in rows
                        if r["group"] in MEGATRON_GROUPS or r["group"].startswith(("narayanan", "korthikanti")))


def test_narayanan_rows_reduce_gradients_as_the_sc21_scripts_ran_them(published):
    # Megatron-LM examples/sc21: CONFIG.sh passes --fp16 without --accumulate-allreduce-grads-in-fp32;
    # run_table_1.sh runs torch DDP (reduction during the last micro-batch's backward) up to 18B
    # and local DDP (after the backward) from 39B
    from piper_plan import validate as V

    rows = [r for r in published if r["group"] == "narayanan2021-table1"]
    assert len(rows) == 10
    for r in rows:
        torch_ddp = float(r["id"].split("-")[-1].rstrip("b")) <= 18.4
        assert r["grad_reduce"] == "fp16" and r["overlap_grad_reduce"] == ("yes" if torch_ddp else "no"), r["id"]
        assert ("DDP=torch" if torch_ddp else "DDP=local") in r["notes"]
        s = V._settings(r, load_hardware("dgx-a100-80gb"))
        assert s["grad_dtype"] == "bf16" and s["overlap_grad_reduce"] == torch_ddp  # a 2-byte reduction
    # Korthikanti's Table 5 runs no data parallelism: no reduction to describe
    kor = [r for r in published if r["group"] == "korthikanti2022-table5"]
    assert kor and all(r["dp"] in ("", "1") and not r["grad_reduce"] for r in kor)


def test_the_memory_model_lets_the_published_runs_fit(results):
    # every throughput row ran its layout, so the predicted peak of the busiest rank must not pass
    # the device's memory. The one row that still does, documented (validation/README.md): the
    # 26.02.01 GB300 Llama 3 70B MXFP8 row, whose table layout no stored recipe has (376 of 277.5
    # GiB). The two 25.11 GPT-OSS rows that did are priced under their release's recipe. The
    # report's two DeepSeek-V3 GB200 rows fit once their optimizer states sit in host memory, as
    # their runs kept them (its Table 18: optimizer_offload 1; 180 and 190 GiB on the device without),
    # and its Qwen3-235B GB200 MXFP8 row once its experts' fc1 inputs and activation inputs do, as its
    # reproduction script offloads them (--offload-modules expert_fc1 moe_act; 202 GiB without); the
    # six Llama 3.1 405B FP8 GB200 rows once their weights are FP8, as their recipe keeps them
    # (fp8_param_gather: 1 B a weight on Blackwell; 176 GiB when counted in bf16)
    mem = summary(results)["published_runs_memory"]
    over = {o["id"] for o in mem["over"]}
    assert mem["rows"] == 234
    assert over <= {"mb-llama70b-gb300-mxfp8-260201"}
    offloaded = {r.id: r for r in results
                 if r.id in ("mcore-dsv3mtp-gb200-mxfp8", "mcore-dsv3mtp-gb200-bf16", "mcore-qwen3-235b-gb200-mxfp8")}
    assert len(offloaded) == 3 and all(r.peak_memory_gib < r.device_memory_gib for r in offloaded.values())


def test_the_25_11_gpt_oss_rows_run_their_release_s_recipe(published):
    # The 25.11 table's B200 and H100 GPT-OSS rows repeat each other's GBS/MBS/EP/GA, and the H100
    # row's GA 2 cannot hold with its own PP 4: they are priced under the 25.11-era base config
    # (B200 EP64 MBS4 with layernorm/moe_act recompute; H100 PP4 EP8 MBS1), not the table's columns.
    from piper_plan import validate as V

    rows = {r["id"]: r for r in published}
    b200, h100 = rows["mb-gptoss120b-b200-bf16-2511"], rows["mb-gptoss120b-h100-bf16-2511"]
    assert (b200["ep"], b200["mbs"], b200["gbs"], b200["recompute_modules"], b200["cuda_graphs"]) == \
        ("64", "4", "512", "layernorm+moe_act", "none")
    assert (h100["pp"], h100["ep"], h100["mbs"], h100["gbs"]) == ("4", "8", "1", "512")
    assert all("26286882719" in r["notes"] and "copied" in r["notes"] for r in (b200, h100))

    def accumulation(r):
        lay = V.row_layout(r)
        return lay.global_batch // (lay.dp * lay.mbs)

    assert accumulation(b200) == 2 and accumulation(h100) == 32  # the table's GA 2 holds for B200 only


def test_validate_names_the_rows_beyond_the_max(results):
    # a reader of `piper-plan validate` sees which rows miss the max target without scanning 131
    from click.testing import CliRunner

    from piper_plan.cli import main

    out = CliRunner().invoke(main, ["validate"], terminal_width=400).output
    lines = {ln.rsplit(": ", 1)[0]: ln for ln in out.splitlines() if ln.startswith("beyond the ")}
    named = summary(results)["kinds"]["moe_named_sources"]["beyond_target_max"]
    line = lines["beyond the 35% max, moe: Megatron-Bridge, X-MoE, Piper"]
    assert named and all(f"{i} {e:+.1f}%" in line for i, e in named.items())
    assert "beyond the 20% max, dense: Narayanan, Korthikanti (A100)" not in lines  # the A100 rows all meet theirs
    assert list(lines["beyond the 20% max, dense (all rows)"].split(": ", 1)[1].split(", ")) == \
        ["mb-llama70b-gb300-mxfp8-260201 -30.4%"]


def test_each_deepseek_v3_row_is_priced_on_the_spec_its_flop_count_shows(published):
    # Megatron-Bridge's tables label only some DeepSeek-V3 rows with or without MTP; their TFLOPS
    # over tokens/s tell: 259.6-260.6 GFLOP a token with the module, 249.1-249.7 without, 4 % apart
    # (ModelSpec.flops_per_token: 260.6 and 250.5). Each row names the spec with that count.
    from piper_plan.specs import load_model

    # (those with a published tokens/s: mlm-dsv3-gb200-mxfp8-970 gives TFLOPS alone, its launch script no MTP)
    rows = [r for r in published if r["model_spec"].startswith("deepseek-v3") and r["tokens_per_s_per_gpu"]]
    assert sum(r["model_spec"] == "deepseek-v3-mtp" for r in rows) == 32
    for r in rows:
        table = float(r["value"]) * 1e12 / float(r["tokens_per_s_per_gpu"])
        spec = load_model(r["model_spec"]).flops_per_token(int(r["seq"]))
        assert table == pytest.approx(spec, rel=0.01), (r["id"], table / 1e9, spec / 1e9)


def test_the_megatron_bridge_dense_rows_stay_near_their_measurements(results):
    # Llama 3 8B / 70B / 3.1 405B on H100, B200, GB200 and GB300 (Megatron-Bridge 25.11-26.06, the
    # rows with context parallelism 1, FP8 or MXFP8 and no CPU offloading): 7.6 % now, one row beyond
    # 20 % (the 26.02.01 GB300 70B MXFP8 row, whose layout no stored recipe has)
    g = summary(results)["groups"]["megatron-bridge-dense"]
    assert g["rows"] == 35 and g["mape"] <= 10.0
    far = [r.id for r in results if r.group == "megatron-bridge-dense" and abs(r.error_pct) > 20]
    assert far == ["mb-llama70b-gb300-mxfp8-260201"]


def test_kimi_k2_priced_on_a_spec_added_after_every_parameter_lands_within_10_percent(results):
    # models/kimi-k2.yaml came after the efficiencies were set and its four GB300 rows were added
    # before they were priced (validation/README.md): an out-of-sample model, each row within 10 %
    kimi = {r.id: r for r in results if r.id.startswith("mb-kimik2-")}
    assert set(kimi) == {f"mb-kimik2-gb300-mxfp8-{x}" for x in ("260201", "2604", "260401", "2606")}
    assert all(r.built_on is None and abs(r.error_pct) <= 10 for r in kimi.values()), kimi


def test_megatron_fsdp_s_eager_ep4_steps_on_grace_are_host_bound_and_mxfp8_the_slower(results):
    # Megatron-LM's Megatron-FSDP case study (Qwen3-30B-A3B, 8 GB200, ZeRO-3, EP4: 32 local experts
    # a rank, no CUDA graphs), added before it was priced: Grace's host cost per operation, derived
    # from x86's and never fitted to these rows, puts each within 20 % (+19.5 / +11.2 / +5.1 % now;
    # at x86's cost they read +76 ... +90 %), and MXFP8, whose casts add host operations, is the
    # slower precision there, as measured (219.7 against 300.85 / 323.45 TFLOP/s)
    fsdp = {r.id.removeprefix("mlm-fsdp-qwen3-30b-gb200-"): r for r in results if r.group == "mlm-fsdp"}
    assert set(fsdp) == {"bf16-v1", "bf16-v2", "mxfp8-v2"}
    assert all(not r.fit and abs(r.error_pct) <= 20 for r in fsdp.values()), fsdp
    assert fsdp["mxfp8-v2"].predicted < fsdp["bf16-v2"].predicted == fsdp["bf16-v1"].predicted
