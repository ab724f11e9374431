"""Bad input to either command is a one-line error naming the file or option, the field and what
was expected, with a non-zero exit: never a traceback, never nonsense accepted. Each case here is
one a fuzzing pass over the CLIs found giving a traceback or exit 0 (session 33). Outputs that
cannot be written, or would lose a file, are test_bad_output.py's."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from bad_input_support import EST, REPO, SEARCH, SWEEP, _run, one_line, refused


def _spec(tmp_path, name, edit, kind="hardware"):
    p = tmp_path / f"{name}.yaml"
    text = (REPO / kind / f"{name}.yaml").read_text()
    p.write_text(edit(text))
    return str(p)


# ---- files that cannot be read ----------------------------------------------------------
@pytest.mark.parametrize("flag", ["-m", "-H"])
def test_a_binary_spec_is_one_line(tmp_path, flag):
    p = tmp_path / "garbage.yaml"
    p.write_bytes(bytes(range(128, 256)) * 3)
    args = ["estimate", "-m", "tiny-moe", "-H", "cpu-local", "-n", "4"]
    args[args.index(flag) + 1] = str(p)
    one_line(args, str(p), "UTF-8")


def test_a_binary_plan_and_hf_config_are_one_line(tmp_path):
    for name in ("plan.json", "config.json"):
        (tmp_path / name).write_bytes(b"\xff\xfe\x00garbage")
    one_line(["show", str(tmp_path / "plan.json")], "plan.json", "UTF-8")
    one_line(["estimate", "-m", str(tmp_path / "config.json"), "-H", "cpu-local", "-n", "4"], "config.json", "UTF-8")


# ---- option values ---------------------------------------------------------------------
@pytest.mark.parametrize("opt,val", [("-n", "0"), ("-n", "-4"), ("--tp", "0"), ("--pp", "0"), ("--dp", "0"),
                                     ("--mbs", "-1"), ("--global-batch", "0"), ("--seq", "0"), ("--vpp", "0"),
                                     ("--optimizer-offload", "nan"), ("--migration-threshold", "nan")])
def test_estimate_refuses_a_degree_or_size_below_one(opt, val):
    args = list(EST)
    if opt in args:
        args[args.index(opt) + 1] = val
    else:
        args += [opt, val]
    refused(args, opt)


@pytest.mark.parametrize("extra,needle", [(["--schedules", ""], "--schedules"), (["--top", "0"], "--top"),
                                          (["--headroom-gib", "-5"], "--headroom-gib"),
                                          (["--headroom-gib", "nan"], "--headroom-gib"),
                                          (["--etp", "1,,2"], "--etp"), (["--routing", "zipf:nan"], "zipf"),
                                          (["--routing", "zipf:-1"], "zipf")])
def test_search_refuses_empty_or_meaningless_options(extra, needle):
    refused([*SEARCH, *extra], needle)


@pytest.mark.parametrize("gpus", ["0", "-4", "", "4,", "4,4"])
def test_sweep_refuses_bad_gpu_lists(gpus):
    refused(["sweep", "-m", "tiny-moe", "-H", "cpu-local", "--gpus", gpus], "--gpus")


@pytest.mark.parametrize("vary,needle", [(["nic_gbps=inf"], "finite"), (["hbm_gib=nan"], "finite"),
                                         (["nic_gbps=1", "nic_gbps=2"], "twice")])
def test_sweep_refuses_non_finite_or_repeated_what_ifs(vary, needle):
    args = ["sweep", "-m", "tiny-moe", "-H", "cpu-local", "--gpus", "4", "--global-batch", "8"]
    for v in vary:
        args += ["--vary", v]
    one_line(args, "--vary", needle)


@pytest.mark.parametrize("vary,needle", [(["nic_gbps=1,1"], "distinct"), (["=1"], "expected FIELD=v1,v2"),
                                         (["nic=1"], "one of nic_gbps, hbm_gib")])
def test_sweep_refuses_repeated_values_and_nameless_or_unknown_fields_saying_what_it_takes(vary, needle):
    # a repeat had priced one scenario twice; "=1" read "cpu-local: : no such field"
    args = list(SWEEP)
    for v in vary:
        args += ["--vary", v]
    one_line(args, needle)


def test_sweep_refuses_a_value_the_spec_refuses_before_it_searches_any_scenario(monkeypatch):
    # the last value had been checked only after every scenario before it was searched
    import piper_plan.sweep

    def searched(*a, **k):
        raise AssertionError("a scenario was searched before every value was checked")

    monkeypatch.setattr(piper_plan.sweep, "search", searched)
    one_line([*SWEEP, "--vary", "nic_gbps=12.5,-1"], "network.nic_gbps", "greater than or equal to 0.001")


def test_sweep_says_when_a_gpu_count_is_beyond_the_machine():
    code, out, _ = _run(["sweep", "-m", "tiny-moe", "-H", "cpu-local", "--gpus", "4,16", "--global-batch", "16"])
    assert code == 0 and "warning: cpu-local: max_gpus: the machine has 8 GPUs; -n 16" in out


def test_more_gpus_than_the_machine_is_said_not_silent():
    code, out, _ = _run(["estimate", "-m", "tiny-moe", "-H", "cpu-local", "-n", "16", "--global-batch", "16"])
    assert code == 0 and "warning: cpu-local: max_gpus: the machine has 8 GPUs" in out


@pytest.mark.parametrize("args,needle", [
    (["search", "-m", "tiny-moe", "-H", "cpu-local", "-n", "0"], " search: Invalid value for '--gpus'"),
    (["list", "foo"], " list: Invalid value"),
    (["bogus"], "No such command 'bogus'"),
    (["search", "-m", "tiny-moe", "-H", "cpu-local", "-n", "4", "--bogus"], "No such option '--bogus'"),
    (["estimate", "-m", "tiny-moe"], "Missing option"),
])
def test_clicks_own_usage_errors_are_one_line_too(args, needle):
    one_line(args, needle)


def test_piper_train_usage_errors_are_one_line():
    pytest.importorskip("torch")
    from piper_runtime.launch import main as train

    one_line(["--plan"], "--plan", cmd=train)
    one_line(["--plan", "x.json", "--bogus"], "No such option '--bogus'", cmd=train)


def test_the_more_gpus_hint_prices_the_batch_asked_for():
    """Nothing of Mixtral 8x7B fits 8 H100s; the hint prices 16 at the same global batch of 1
    sequence (it priced 16 sequences, unsaid: 101,486 tokens/s where 16 GPUs at 1 give 17,386)."""
    from piper_plan.search import SearchSpace, search
    from piper_plan.specs import load_hardware, load_model

    m, hw = load_model("mixtral-8x7b"), load_hardware("dgx-h100")
    r = search(m, hw, SearchSpace(gpus=16, global_batch=1, seq=m.seq_len))
    code, out, _ = _run(["search", "-m", "mixtral-8x7b", "-H", "dgx-h100", "-n", "8", "--global-batch", "1"])
    assert code == 1 and f"fits with 16 GPUs (8 more), best {r.est.tokens_per_s[r.best]:,.0f} tokens/s\n" in out, out


# ---- spec contents ---------------------------------------------------------------------
@pytest.mark.parametrize("name,edit,field", [
    ("cpu-local", lambda t: t.replace("max_gpus: 8", 'max_gpus: "8"'), "max_gpus"),          # a string
    ("cpu-local", lambda t: t.replace("max_gpus: 8", "max_gpus: 8.0"), "max_gpus"),          # not whole
    ("cpu-local", lambda t: t.replace("max_gpus: 8", "max_gpus: true"), "max_gpus"),         # a bool
    ("cpu-local", lambda t: t.replace("    bf16: 181.823", "    bf16: .nan"), "gemm_overhead_us.bf16"),  # NaN
    ("cpu-local", lambda t: t.replace("max_gpus: 8", "max_gpus: 8\nmax_gpus: 9"), "appears twice"),  # last wins
    ("cpu-local", lambda t: t.replace("    zbv: ", "    zbvv: "), "pipeline_chunk_us"),      # a misspelt key
    ("cpu-local", lambda t: t.replace("    moe_bf16: ", "    moe_bf61: "), "layer_overhead_us"),
    ("frontier", lambda t: t.replace("memory_gib: 64", "memory_gib: .inf"), "memory_gib"),
    ("frontier", lambda t: t.replace("nic_gbps: 25", "nic_gbps: .inf"), "nic_gbps"),
    ("frontier", lambda t: t.replace("nic_gbps: 25", "nic_gbps: 1e-300"), "nic_gbps"),   # overflows the step to inf
    ("dgx-h100", lambda t: t.replace("max_gpus: 32768", "max_gpus: 12"), "max_gpus 12 must be whole nodes"),
    ("dgx-h100", lambda t: t.replace("max_gpus: 32768", "max_gpus: 65536"), "at most the top topology level"),
    ("dgx-h100", lambda t: t.replace("kernel_overhead_us: 3.0 ", "kernel_overhead_us: 1e300 "), "kernel_overhead_us"),
    ("frontier", lambda t: t.replace("gemm_tile: [256, 128]", "gemm_tile: [0, 0]"), "gemm_tile"),
    ("dgx-h100", lambda t: t.replace("kernel_overhead_us: 3.0 ", "gemm_overhead_us: {bfloat16: 5}\n  "
                                     "kernel_overhead_us: 3.0 "), "gemm_overhead_us"),          # a misspelt dtype
    ("dgx-h100", lambda t: t.replace("overlap_comm_units: 20 ", "overlap_comm_units: 500 "), "overlap_comm_units"),
    ("frontier", lambda t: t.replace("gfx_arch: gfx90a", "gfx_arch: MI250X"), "gfx_arch"),  # not a gfx target
    ("frontier", lambda t: t.replace("gfx_arch: gfx90a", "gfx_arch: gfx90a\n  compute_capability: 9.0"),
     "cannot both be set"),                                                                # AMD and NVIDIA at once
])
def test_a_mistyped_or_impossible_hardware_figure_is_refused(tmp_path, name, edit, field):
    p = _spec(tmp_path, name, edit)
    assert Path(p).read_text() != (REPO / "hardware" / f"{name}.yaml").read_text(), "the edit must apply"
    one_line(["show-spec", p], p, field)


@pytest.mark.parametrize("edit,field", [
    (lambda t: t.replace("hidden_size: 64", 'hidden_size: "64"'), "hidden_size"),
    (lambda t: t.replace("num_layers: 4", "num_layers: 1000000000"), "num_layers"),
    (lambda t: t.replace("vocab_size: ", "vocab_size: 100000000000000000000  # "), "vocab_size"),
    (lambda t: t.replace("moe:\n", "moe:\n  every: 100\n"), "no layer is an MoE layer"),
])
def test_a_mistyped_or_impossible_model_is_refused(tmp_path, edit, field):
    p = _spec(tmp_path, "tiny-moe", edit, kind="models")
    assert Path(p).read_text() != (REPO / "models" / "tiny-moe.yaml").read_text(), "the edit must apply"
    one_line(["show-spec", p], p, field)


def _hf(tmp_path, **over):
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_hidden_layers": 4,
           "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "vocab_size": 128, "intermediate_size": 128, "moe_intermediate_size": 32, "num_experts": 8,
           "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [],
           "max_position_embeddings": 256}
    cfg.update(over)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return str(p)


def test_an_hf_config_that_reads_fine_is_accepted(tmp_path):
    code, out, _ = _run(["show-spec", _hf(tmp_path)])
    assert code == 0, out


@pytest.mark.parametrize("over,field", [({"mlp_only_layers": [0, 500]}, "mlp_only_layers"),
                                        ({"mlp_only_layers": [-3]}, "mlp_only_layers"),
                                        ({"num_hidden_layers": 10**9}, "num_hidden_layers")])
def test_an_hf_layer_index_past_the_model_is_refused(tmp_path, over, field):
    p = _hf(tmp_path, **over)
    one_line(["show-spec", p], p, field)


def test_a_repeated_hf_key_is_refused(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(Path(_hf(tmp_path)).read_text().replace('"hidden_size": 64', '"hidden_size": 64, "hidden_size": 128'))
    one_line(["show-spec", str(p)], "hidden_size", "twice")


def test_a_snapshot_folder_s_config_json_is_read_as_json_never_as_yaml(tmp_path):
    # a tab-indented config.json is valid JSON but no YAML (a tab cannot indent YAML)
    snap = tmp_path / "snapshot"
    snap.mkdir()
    cfg = json.loads(Path(_hf(tmp_path)).read_text())
    (snap / "config.json").write_text(json.dumps(cfg, indent="\t"))
    code, out, _ = _run(["show-spec", str(snap)])
    assert code == 0 and "snapshot" in out, out
    # a repeated key is JSON's refusal, not YAML's
    twice = json.dumps(cfg).replace('"hidden_size": 64', '"hidden_size": 64, "hidden_size": 8')
    (snap / "config.json").write_text(twice)
    line = one_line(["show-spec", str(snap)], str(snap / "config.json"), "hidden_size", "twice in one JSON object")
    assert "YAML" not in line


@pytest.mark.parametrize("name", ["LLAMA.JSON", "Config.Json"])
def test_an_hf_config_of_any_suffix_case_is_imported(tmp_path, name):
    p = tmp_path / name
    p.write_text(json.dumps(json.loads(Path(_hf(tmp_path)).read_text()), indent="\t"))
    code, out, _ = _run(["show-spec", str(p)])
    assert code == 0 and "(qwen3_moe)" in out, out  # the importer's family tag in the title
    code, out, _ = _run(["estimate", "-m", str(p), "-H", "cpu-local", "-n", "4", "--global-batch", "8"])
    assert code == 0, out


def test_a_file_without_a_suffix_is_read_as_what_it_holds(tmp_path):
    # a JSON object with model_type or architectures is a Hugging Face config (a Piper spec has neither)
    p = tmp_path / "config"
    p.write_text(Path(_hf(tmp_path)).read_text())
    code, out, _ = _run(["show-spec", str(p)])
    assert code == 0 and "(qwen3_moe)" in out, out
    # anything else is a spec YAML, model or hardware
    for kind, name, needle in (("models", "tiny-moe", "routed experts"), ("hardware", "cpu-local", "topology")):
        p = tmp_path / name
        p.write_text((REPO / kind / f"{name}.yaml").read_text())
        code, out, _ = _run(["show-spec", str(p)])
        assert code == 0 and needle in out, out


# ---- routing histograms ------------------------------------------------------------------
@pytest.mark.parametrize("counts,needle", [([1, 2, 3], "expected 8 counts"), (["a"] * 8, "finite, non-negative"),
                                           ([None] * 8, "finite, non-negative"), ([0] * 8, "routes no tokens")])
def test_a_bad_routing_histogram_is_one_line(tmp_path, counts, needle):
    """The second step record of a metrics file disagrees with the first, or holds no counts."""
    first = [0] * 8 if needle == "routes no tokens" else list(range(1, 9))
    p = tmp_path / "m.jsonl"  # tiny-moe's three MoE layers, layer 3 disagreeing in the second record
    p.write_text("".join(json.dumps({"step": s, "tokens_per_expert": {"1": first, "2": first, "3": c}}) + "\n"
                         for s, c in ((1, first), (2, counts))))
    one_line([*EST, "--ep", "4", "--routing", str(p)], needle)


def test_a_histogram_for_another_model_is_one_line(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text(json.dumps({"step": 1, "tokens_per_expert": {"1": [1, 2, 3]}}) + "\n")
    one_line([*EST, "--ep", "4", "--routing", str(p)], "the histogram has 3 experts; the model has 8")


def test_migration_with_nothing_to_migrate_is_refused_not_written():
    one_line([*EST, "--ep", "1", "--migration"], "--migration: ep: with ep 1 every rank holds every expert")
    one_line(["estimate", "-m", "tiny-dense", "-H", "cpu-local", "-n", "4", "--global-batch", "8", "--migration"],
             "--migration: tiny-dense has no routed experts")


DENSE = ["-m", "tiny-dense", "-H", "cpu-local", "--global-batch", "8"]


@pytest.mark.parametrize("cmd,extra", [
    ("estimate", ["--a2a", "halo"]), ("estimate", ["--routing", "zipf:2"]), ("estimate", ["--placement", "spread"]),
    ("estimate", ["--expert-gemm", "loop"]), ("estimate", ["--a2a-overlap"]), ("estimate", ["--expert-probs",
                                                                                          "activation"]),
    ("search", ["--etp", "1,2"]), ("search", ["--ep-in-domain", "node"]), ("search", ["--migration"]),
    ("search", ["--a2a-sms", "8"]), ("sweep", ["--a2a", "dedup"]), ("estimate", ["--migration-period", "5"])])
def test_an_option_of_the_routed_experts_on_a_dense_model_is_one_line(cmd, extra):
    """As --ep 4 is refused on a model without experts, so is every option that prices only them:
    accepted, it would be written into the plan and change nothing."""
    gpus = ["--gpus", "4"] if cmd == "sweep" else ["-n", "4"]
    one_line([cmd, *DENSE, *gpus, *extra], f"{extra[0]}", "tiny-dense has no routed experts")


def test_the_defaults_of_those_options_stay_accepted_on_a_dense_model():
    for cmd in ("estimate", "search"):
        code, out, _ = _run([cmd, *DENSE, "-n", "4", "--routing", "uniform", "--etp", "1", "--json"])
        assert code == 0, out


def test_a_searched_plan_whose_best_layout_has_ep_1_is_written_with_migration_off(tmp_path):
    p = tmp_path / "plan.json"
    code, out, _ = _run(["search", "-m", "tiny-moe", "-H", "cpu-local", "-n", "1", "--global-batch", "8",
                         "--migration", "-o", str(p)])
    assert code == 0, out
    assert json.loads(p.read_text())["layout"]["ep"] == 1
    assert json.loads(p.read_text())["migration"]["enabled"] is False
    assert f"warning: {p}: migration.enabled: written false" in out


# ---- plan.json a hand edit broke (the plan_doc fixture: conftest.py) -----------------------
def _swap_in_a_group(doc, own, by):
    """Swap the `own` coordinate of the first two ranks that share `by` (one group's members):
    every coordinate stays in range and unique, only their order against the global rank breaks."""
    rm = doc["rank_map"]
    a, b = next((x, y) for x in rm for y in rm if x["rank"] < y["rank"] and all(x[k] == y[k] for k in by))
    a[own], b[own] = b[own], a[own]


@pytest.mark.parametrize("edit,needle", [
    (lambda d: d["layout"].update(dp=3), "tp*pp*dp == gpus"),
    (lambda d: d["layout"].update(dp="4"), "layout.dp"),                 # a string for a degree
    (lambda d: d["layout"].update(pp=1.0), "layout.pp"),
    (lambda d: d["layout"].update(ep=3), "ep divides"),
    (lambda d: d["layout"].update(global_batch=7), "global_batch divisible"),
    (lambda d: d["rank_map"][1].update(rank=0), "rank_map[1].rank"),
    (lambda d: d["rank_map"][1].update(dp=7), "rank_map[1].dp"),
    (lambda d: d["rank_map"][1].update(node=5), "rank_map[1].node"),
    (lambda d: d["rank_map"][1].update(dp=0), "rank 0's too"),
    (lambda d: d.update(partition=[[0, 1, 2, 9]]), "partition"),
    (lambda d: d.update(partition=[[]]), "partition"),
    (lambda d: d["predicted"].update(step_time_s=-1), "predicted.step_time_s"),
    (lambda d: d["routing"].update(distribution="histogram", histogram=None), "routing"),
    (lambda d: d["routing"].update(distribution="histogram", histogram=[[1, -2, 3, 4, 5, 6, 7, 8]]), "routing"),
    (lambda d: d["routing"].update(distribution="histogram", histogram=[[1, 2, 3]]), "routing.histogram"),
    (lambda d: d["predicted"].update(mfu=float("nan")), "predicted.mfu"),
    (lambda d: d["predicted"].update(mfu=5.0), "predicted.mfu: expected tflops_per_gpu / bf16 peak"),
    (lambda d: d["predicted"].update(tokens_per_s=-1), "predicted.tokens_per_s"),
    (lambda d: d["predicted"].update(tokens_per_s=d["predicted"]["tokens_per_s"] * 2),
     "predicted.tokens_per_s: expected global_batch*seq/step_time_s"),
    (lambda d: d["predicted"].update(hw_tflops_per_gpu=d["predicted"]["tflops_per_gpu"] / 2),
     "predicted.hw_tflops_per_gpu: expected at least tflops_per_gpu"),
    (lambda d: d["predicted"].update(memory_gib_per_stage=[{"x": 1}]), "predicted.memory_gib_per_stage[0]"),
    (lambda d: d["layout"].update(recompute="full", recompute_layers=99), "recompute_layers <= the layers of a chunk"),
    (lambda d: _swap_in_a_group(d, "edp", ("pp", "ep")), "coordinates to rise with the global rank"),
    (lambda d: _swap_in_a_group(d, "dp", ("pp", "tp")), "coordinates to rise with the global rank"),
    (lambda d: (d["layout"].update(ep=1), d["migration"].update(enabled=True)),
     "migration.enabled: expected false: with ep 1 every rank holds every expert"),
    (lambda d: _tb(d).update(total=0), "time_breakdown_s.total: expected step_time_s"),  # show divided by it
    (lambda d: _tb(d).pop("total"), "time_breakdown_s.total: required field is missing"),
    (lambda d: _tb(d).update(total=_tb(d)["total"] * 2), "time_breakdown_s.total: expected step_time_s"),
    (lambda d: _tb(d).update(compute=-1), "time_breakdown_s.compute: expected finite seconds >= 0"),
    (lambda d: _tb(d).update(comput=0.1), "time_breakdown_s.comput: unknown part of the step"),
    (lambda d: d["predicted"]["memory_gib_per_stage"][0].update(weights=-1), "memory_gib_per_stage[0]"),
    # figures that contradict one another (show had raised a KeyError on a stage without a part)
    (lambda d: _stages(d).append({**{k: v for k, v in _stages(d)[0].items() if k != "weights"}, "stage": 1}),
     "memory_gib_per_stage[1].weights: expected the parts stage 0's figures have"),
    (lambda d: _stages(d)[0].update(total=_stages(d)[0]["total"] + 1),
     "memory_gib_per_stage[0].total: expected the sum"),
    (lambda d: d["predicted"].update(peak_memory_gib=d["predicted"]["peak_memory_gib"] / 2),
     "predicted.peak_memory_gib: expected the largest stage total"),
    (lambda d: _tb(d).update(compute=_tb(d)["compute"] / 2), "time_breakdown_s: expected parts that add up to total"),
    (lambda d: _over_the_device(d), "predicted.fits: expected false: the peak"),
])
def test_a_plan_broken_by_hand_is_refused_before_any_rank_starts(tmp_path, plan_doc, edit, needle):
    doc = json.loads(json.dumps(plan_doc))
    edit(doc)
    p = tmp_path / "x.json"
    p.write_text(json.dumps(doc))
    one_line(["show", str(p)], str(p), needle)


def test_piper_train_refuses_bad_run_options_before_spawning(tmp_path, plan_doc):
    pytest.importorskip("torch")
    from piper_runtime.launch import main as train

    p = tmp_path / "plan.json"
    p.write_text(json.dumps(plan_doc))
    (tmp_path / "afile").write_text("")
    for opt, val in [("--lr", "nan"), ("--lr", "-1"), ("--lr", "1e300"), ("--seed", "99999999999999999999999"),
                     ("--threads", "0"), ("--threads", "100000"), ("--timeout", "0"),
                     ("--timeout", "nan"), ("--clip", "-1"), ("--capacity-factor", "0"), ("--log-every", "-1")]:
        refused(["--plan", str(p), "--steps", "1", opt, val], opt, cmd=train)
    one_line(["--plan", str(p), "--steps", "1", "--metrics", str(tmp_path / "afile" / "m.jsonl")], "--metrics",
             cmd=train)
    one_line(["--plan", str(p), "--steps", "1", "--checkpoint", str(tmp_path / "afile")], "--checkpoint", cmd=train)
    one_line(["--plan", str(p), "--steps", "1", "--checkpoint", str(tmp_path / "afile" / "ck")], "--checkpoint",
             cmd=train)
    # permission bits do not stop root where the file system refuses: a file is written to find out
    if Path("/proc/self").exists():
        one_line(["--plan", str(p), "--steps", "1", "--checkpoint", "/proc/piper-ckpt"], "--checkpoint", cmd=train)


@pytest.mark.parametrize("extra,needle", [
    (["-n", "6", "--tp", "3", "--global-batch", "12"], "tp divides the attention heads"),  # tiny-moe: 4 heads
    (["--pp", "2", "--recompute", "full", "--recompute-layers", "100"], "recompute_layers <= the layers of a chunk"),
])
def test_estimate_refuses_a_layout_the_model_cannot_be_split_into(extra, needle):
    """What the search never enumerates, `estimate` and a written plan refuse too (an audit found
    estimate pricing 32 heads over tp 3 and writing a plan piper-train then rejected)."""
    args = ["estimate", "-m", "tiny-moe", "-H", "cpu-local", "-n", "4", "--global-batch", "8"]
    for i in range(0, len(extra), 2):
        if extra[i] in args:
            args[args.index(extra[i]) + 1] = extra[i + 1]
        else:
            args += extra[i:i + 2]
    one_line(args, needle)


def test_an_overlapped_all_to_all_must_leave_the_device_compute_units():
    args = ["estimate", "-m", "deepseek-v3", "-H", "dgx-h100", "-n", "256", "--pp", "8", "--ep", "32",
            "--schedule", "interleaved", "--vpp", "2", "--a2a-overlap", "--global-batch", "512", "--recompute", "full"]
    one_line([*args, "--a2a-sms", "132"], "a2a_sms=132 of the 132")  # an H100 has 132 SMs
    code, out, _ = _run([*args, "--a2a-sms", "24"])
    assert code == 0, out


def test_piper_train_refuses_a_plan_the_planner_says_does_not_fit(tmp_path, plan_doc):
    pytest.importorskip("torch")
    from piper_runtime.launch import main as train

    p = tmp_path / "plan.json"
    p.write_text(json.dumps({**plan_doc, "predicted": {**plan_doc["predicted"], "fits": False}}))
    one_line(["--plan", str(p), "--steps", "1"], f"{p}: predicted.fits = false", cmd=train)


def test_piper_train_names_the_plan_file_for_a_layout_it_cannot_run(tmp_path, plan_doc):
    """A plan the planner could price but piper-train cannot run: the file and the field."""
    pytest.importorskip("torch")
    from piper_runtime.launch import main as train

    p = tmp_path / "plan.json"
    p.write_text(json.dumps({**plan_doc, "layout": {**plan_doc["layout"], "dropout": True}}))
    one_line(["--plan", str(p), "--steps", "1"], f"{p}: layout.dropout = true", cmd=train)


def test_a_column_outside_the_schema_is_named_not_dropped_silently(tmp_path):
    """A spreadsheet's own columns (a date, a comment) are fine; a misspelt one must not vanish unsaid."""
    src = (REPO / "validation" / "published.csv").read_text(encoding="utf-8").splitlines()
    p = tmp_path / "mine.csv"
    p.write_text("\n".join([src[0].replace(",mbs,", ",mbz,"), src[1]]) + "\n")
    code, out, _ = _run(["validate", "--table", str(p)])
    assert code == 0 and f"warning: {p}: column(s) mbz not in the schema, ignored" in out, out


def test_an_empty_name_is_refused(tmp_path):
    p = _spec(tmp_path, "tiny-moe", lambda t: t.replace("name: tiny-moe", 'name: ""'), kind="models")
    one_line(["show-spec", p], p, "name")


@pytest.mark.parametrize("value", ["inf", "nan", "-1"])
def test_a_table_figure_must_be_a_finite_positive_number(tmp_path, value):
    src = (REPO / "validation" / "published.csv").read_text(encoding="utf-8").splitlines()
    assert ",hw_tflops_per_gpu,137," in src[1]
    p = tmp_path / "mine.csv"
    p.write_text("\n".join([src[0], src[1].replace(",hw_tflops_per_gpu,137,", f",hw_tflops_per_gpu,{value},")]) + "\n")
    one_line(["validate", "--table", str(p)], "value", "a positive number")


def test_yaml_anchors_and_merge_keys_still_load(tmp_path):
    """Refusing a repeated key must not refuse a merge key, nor a key that overrides a merged one."""
    from piper_plan.specs.registry import read_yaml

    p = tmp_path / "a.yaml"
    p.write_text("base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  y: 3\n")
    assert read_yaml(p) == {"base": {"x": 1, "y": 2}, "other": {"x": 1, "y": 3}}


def test_yaml_numbers_with_an_exponent_are_numbers(tmp_path):
    """PyYAML's YAML 1.1 reads 3.35e3 as a string; strict fields would then refuse a fine spec."""
    p = tmp_path / "h.yaml"
    p.write_text("base: dgx-h100\nname: x\naccelerator: {memory_bandwidth_gbps: 3.35e3, peak_tflops: {bf16: 9.89e2}}\n")
    code, out, _ = _run(["estimate", "-m", "tiny-moe", "-H", str(p), "-n", "8", "--global-batch", "8", "--json"])
    assert code == 0, out


def test_show_spec_knows_a_hardware_variant_from_its_base(tmp_path):
    p = tmp_path / "v.yaml"
    p.write_text("base: dgx-h100\nname: my-h100\nefficiency: {kernel_overhead_us: 3.0}\n")
    for ref, name in ((str(p), "my-h100"), (str(REPO / "hardware" / "meta-h100-roce.yaml"), "meta-h100-roce")):
        code, out, _ = _run(["show-spec", ref])
        assert code == 0 and name in out and "H100" in out, out


@pytest.mark.parametrize("tpe,needle", [
    ([[1] * 8, [1] * 4, [1] * 8], "expected 8 counts"),                       # a ragged list of layers
    ({"x": [1] * 8, "1": [1] * 8}, "a layer index"),                          # a key that is no layer
    ("many", "tokens_per_expert"),
])
def test_a_malformed_metrics_record_is_one_line(tmp_path, tpe, needle):
    p = tmp_path / "m.jsonl"
    p.write_text(json.dumps({"step": 1, "tokens_per_expert": tpe}) + "\n")
    one_line([*EST, "--ep", "4", "--routing", str(p)], needle)


@pytest.mark.parametrize("extra,needle", [(["--cuda-graphs", "attn,,mlp"], "--cuda-graphs"),
                                          (["--routing", "zipf:"], "zipf"),
                                          (["--recompute", "selective", "--recompute-modules", "core_attn,"],
                                           "--recompute-modules")])
def test_an_empty_list_item_is_a_typo(extra, needle):
    refused([*EST, *extra], needle)


def test_selective_recompute_of_a_part_the_model_lacks_is_refused():
    one_line([*EST, "--recompute", "selective", "--recompute-modules", "mla_up_proj"], "mla_up_proj", "tiny-moe")
    dense = ["estimate", "-m", "tiny-dense", "-H", "cpu-local", "-n", "4", "--global-batch", "8"]
    one_line([*dense, "--recompute", "selective", "--recompute-modules", "moe_act"], "moe_act")


def test_a_histogram_from_a_model_with_other_layers_is_said(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text(json.dumps({"step": 1, "tokens_per_expert": {"1": list(range(1, 9))}}) + "\n")
    code, out, _ = _run([*EST, "--ep", "4", "--routing", str(p)])
    assert code == 0 and "1 MoE layer(s) measured, tiny-moe has 3" in out, out


def test_a_histogram_from_another_model_of_the_same_shape_is_said(tmp_path):
    from piper_plan.plan import spec_hash
    from piper_plan.specs import load_model

    tiny = load_model("tiny-moe")
    loads = {str(i): list(range(1, 9)) for i in range(tiny.num_moe_layers)}  # tiny-moe's own shape
    other, own = tmp_path / "other.jsonl", tmp_path / "own.jsonl"
    for path, name, h in ((other, "tiny-moe-wider", "0123456789abcdef"), (own, "tiny-moe", spec_hash(tiny))):
        path.write_text(json.dumps({"step": 0, "tokens_per_expert": loads}) + "\n"
                        + json.dumps({"summary": True, "model": name, "model_hash": h}) + "\n")
    code, out, _ = _run([*EST, "--ep", "4", "--routing", str(other)])
    assert code == 0 and "the run trained tiny-moe-wider" in out and "another model's" in out, out
    code, out, _ = _run([*EST, "--ep", "4", "--routing", str(own)])
    assert code == 0 and "warning" not in out, out


def test_plain_zipf_means_s_1():
    code, out, _ = _run([*EST, "--ep", "4", "--routing", "zipf", "--json"])
    assert code == 0 and json.loads(out[out.index("{"):])["imbalance"] > 1.0, out


def test_fsdp_options_that_mean_nothing_for_the_layout_are_refused():
    # keeping units gathered is ZeRO-3's choice; below it no weight is sharded
    one_line([*EST, "--no-reshard-after-forward"], "reshard_after_forward", "zero 1")
    # a pipelined FSDP stage gathers once and reduces once a step: the message says to state zero 1
    one_line([*EST, "--zero", "3", "--pp", "2"], "zero 3 with pp == 1", "state zero 1")


@pytest.mark.parametrize("column", ["a2a_overlap", "overlap_grad_reduce", "reshard_after_forward"])
def test_a_yes_no_column_takes_yes_or_no_only(tmp_path, column):
    # "maybe" had read as whichever side the column's default was; true / false are yes / no
    import csv

    from piper_plan.validate_rows import read_rows

    rows = list(csv.DictReader(open(REPO / "validation" / "torchtitan.csv", newline="")))[:1]
    p = tmp_path / "mine.csv"
    for word, read in (("maybe", None), ("TRUE", "yes"), ("off", "no")):
        rows[0][column] = word
        with open(p, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        if read is None:
            one_line(["validate", "--table", str(p)], "mine.csv", column, "yes or no", "'maybe'")
        else:
            assert read_rows(p)[0][column] == read


@pytest.mark.parametrize("column, value, needle", [
    ("dispatcher", "abc", "alltoall, hybridep, deepep"),        # had been "error: abc" (a KeyError's text)
    ("recompute_modules", "moe_act+abc", "joined by '+'"),       # the next four had been pydantic tracebacks
    ("cuda_graphs", "attn+full", "full_iteration"),
    ("expert_gemm", "cutlass", "grouped, multistream, loop"),
    ("grad_reduce", "fp8", "fp32, bf16, fp16"),
    ("zero_stage", "9", "0, 1, 2 or 3"),
])
def test_a_recipe_word_outside_its_vocabulary_is_one_line(tmp_path, column, value, needle):
    import csv

    rows = [r for r in csv.DictReader(open(REPO / "validation" / "published.csv", newline="", encoding="utf-8-sig"))
            if r["id"] == "mb-dsv3-gb300-bf16"]
    rows[0][column] = value
    p = tmp_path / "mine.csv"
    with open(p, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    one_line(["validate", "--table", str(p)], "mine.csv", "mb-dsv3-gb300-bf16", column, needle, repr(value.split("+")[-1]))


def test_the_dispatchers_a_table_may_name_are_priced_as_exchanges_the_layout_has():
    from typing import get_args

    from piper_plan.layout import A2A
    from piper_plan.validate import DISPATCHER_A2A
    from piper_plan.validate_rows import RECIPE_WORDS

    assert set(RECIPE_WORDS["dispatcher"]) == set(DISPATCHER_A2A) - {""}
    assert set(DISPATCHER_A2A.values()) <= set(get_args(A2A))


@pytest.mark.parametrize("option,dtype", [(["--fp8", "current"], "fp8"), (["--dtype", "fp32"], "fp32")])
def test_a_precision_the_hardware_has_no_peak_for_is_one_line_naming_the_file(tmp_path, option, dtype):
    """An FP8 recipe on a spec without an fp8 peak, or fp32 math without an fp32 one: the
    spec's file, the peak table and the dtype, from every command that prices layouts. fp32 had
    been priced at the bf16 peak (15x the H100's fp32 rate) and an fp8 recipe had failed with
    the hardware's name alone (session 40)."""
    h = _spec(tmp_path, "dgx-h100", lambda t: t.replace("fp8: 1979, ", "").replace(", fp32: 67", "")
              .replace("gemm_dtype: {fp8: 0.709}", "gemm_dtype: {}"))
    base = ["-m", "mixtral-8x7b", "-H", h]
    for args in (["estimate", *base, "-n", "64", "--ep", "8"], ["search", *base, "-n", "64"],
                 ["sweep", *base, "--gpus", "64"]):
        one_line([*args, *option], h, "accelerator.peak_tflops", f"entry for {dtype}")


@pytest.mark.parametrize("line", ["source: 2024-13-45", "num_layers: !!int abc", "source: !!timestamp 2024-02-30"])
def test_a_yaml_value_its_tag_cannot_hold_is_one_line(tmp_path, line):
    p = tmp_path / "m.yaml"
    p.write_text(f"base: tiny-moe\n{line}\n")
    one_line(["search", "-m", str(p), "-H", "cpu-local", "-n", "4", "--global-batch", "8"], str(p), "YAML")


def test_a_spec_nested_past_reason_is_one_line(tmp_path):
    p = tmp_path / "deep.yaml"
    p.write_text("a: " + "[" * 2000 + "]" * 2000 + "\n")
    one_line(["search", "-m", str(p), "-H", "cpu-local", "-n", "4"], str(p), "nested too deep")


def test_a_folder_is_not_taken_for_a_missing_file_nor_hides_a_bundled_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny-moe").mkdir()  # a folder named like a bundled spec
    code, out, _ = _run(["show-spec", "tiny-moe"])
    assert code == 0 and "tiny-moe" in out
    (tmp_path / "x.yaml").mkdir()
    one_line(["show-spec", "x.yaml"], "x.yaml", "is a folder")
    snap = tmp_path / "snapshot"  # a Hugging Face snapshot's folder: its config.json
    snap.mkdir()
    (snap / "config.json").write_text((REPO / "tests" / "data" / "hf" / "qwen3-30b-a3b.json").read_text())
    code, out, _ = _run(["show-spec", str(snap)])
    assert code == 0 and "qwen3" in out.lower(), out


@pytest.mark.parametrize("edit,needle", [
    ("  - {name: rack, size: 64, via_nic: true, bandwidth_gbps: 5, latency_us: 5}",
     "bandwidth_gbps=5 would be ignored"),
    ("  - {name: rack, size: 64, bandwidth_gbps: 50, taper: 0.5, latency_us: 5}", "taper=0.5 applies to NIC"),
    ("  - {name: rack, size: 18446744073709551616, via_nic: true, latency_us: 5}", "size"),
])
def test_a_topology_figure_a_level_never_reads_or_cannot_hold_is_refused(tmp_path, edit, needle):
    p = tmp_path / "hw.yaml"
    p.write_text("base: cpu-local\nname: hw-test\ntopology:\n"
                 "  - {name: node, size: 8, bandwidth_gbps: 0.37, latency_us: 900}\n" + edit + "\n")
    one_line(["search", "-m", "tiny-moe", "-H", str(p), "-n", "4", "--global-batch", "8"], str(p), needle)


def test_brackets_in_a_specs_name_or_source_are_printed_as_written(tmp_path):
    # rich read them as markup: "[cs.LG]" vanished and "[/]" raised MarkupError
    p = tmp_path / "m.yaml"
    p.write_text('base: tiny-moe\nname: "moe [/] v2"\nsource: "arXiv 2401.04088 [cs.LG]"\n')
    code, out, _ = _run(["show-spec", str(p)])
    assert code == 0 and "arXiv 2401.04088 [cs.LG]" in out and "moe [/] v2" in out, out
    code, out, _ = _run(["estimate", "-m", str(p), "-H", "cpu-local", "-n", "4", "--global-batch", "8"])
    assert code == 0 and "moe [/] v2" in out, out


def test_a_search_space_that_outgrows_the_host_s_memory_is_one_line(monkeypatch):
    import piper_plan.search as S

    def full(*a, **k):
        raise MemoryError("Unable to allocate 58.3 MiB")
    monkeypatch.setattr(S, "enumerate_slices", full)  # what search and enumerate_layouts build the layouts with
    code, out, _ = _run(["search", "-m", "tiny-moe", "-H", "cpu-local", "-n", "4"])
    lines = out.strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: out of memory: the layouts asked for"), out


@pytest.mark.parametrize("text,needle", [
    ('{"schema_version": 1, "x": ' + "9" * 5000 + "}", "a number of more than 4,300 digits"),
    ("[" * 100000, "nested too deep"),
])
def test_json_past_pythons_limits_is_one_line(tmp_path, text, needle):
    for name, cmd in (("plan.json", ["show"]), ("config.json", ["show-spec"])):
        p = tmp_path / name
        p.write_text(text)
        one_line([*cmd, str(p)], str(p), needle)


def test_an_option_that_would_do_nothing_is_refused_not_kept():
    one_line([*EST, "--recompute-modules", "mlp"], "--recompute-modules", "--recompute is 'none'")
    one_line(["estimate", "-m", "mixtral-8x7b", "-H", "dgx-a100-80gb", "-n", "16", "--ep", "8", "--attention-fp8"],
             "peak_tflops: expected an entry for fp8")


def test_a_plan_saved_with_a_byte_order_mark_reads_as_without(tmp_path, plan_doc):
    p = tmp_path / "plan.json"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps(plan_doc).encode())
    code, out, _ = _run(["show", str(p)])
    assert code == 0 and "plan: tiny-moe" in out, out


def _tb(d):
    return d["predicted"]["time_breakdown_s"]


def _stages(d):
    return d["predicted"]["memory_gib_per_stage"]


def _over_the_device(d):
    """Figures that add up to more than the device holds, still marked as fitting."""
    st = _stages(d)[0]
    st.update(weights=st["weights"] + 100.0, total=st["total"] + 100.0)
    d["predicted"].update(peak_memory_gib=st["total"], fits=True)


def test_every_part_of_the_step_the_estimator_reports_and_none_reads_back(tmp_path):
    """plan.TIME_PARTS holds what cost.estimate writes, offloading included: a plan it writes reads back;
    one with no breakdown at all shows too (show read its total unconditionally: KeyError)."""
    p = tmp_path / "p.json"
    code, out, _ = _run(["estimate", "-m", "llama3-70b", "-H", "gb200-nvl72", "-n", "64", "--tp", "2",
                         "--offload-layers", "40", "-o", str(p)])
    assert code == 0, out
    assert "offload" in json.loads(p.read_text())["predicted"]["time_breakdown_s"]
    code, out, _ = _run(["show", str(p)])
    assert code == 0, out
    doc = json.loads(p.read_text())
    _tb(doc).clear()  # a plan without the breakdown (the field's default) shows, without its shares
    p.write_text(json.dumps(doc))
    code, out, _ = _run(["show", str(p)])
    assert code == 0, out


@pytest.mark.parametrize("option,value", [
    ("--offload-layers", "99999999999999999999999"),  # numpy's int64 overflowed
    ("--recompute-layers", "99999999999999999999999"),  # an object array isfinite could not take
    ("--offload-layers", "4097"),                       # past MAX_LAYERS: no model has that many layers
    ("--cp", "99999999999999999999999"),
    ("--cp", "2\u00b2"),                                # str.isdigit() takes a superscript, int() does not
])
def test_a_search_list_item_past_its_bound_is_one_line(option, value):
    one_line([*SEARCH, option, value], option, "up to")


@pytest.mark.parametrize("extra,needle", [
    (["--cp", "2,2"], "--cp: got '2,2': 2 is listed twice"),
    (["--etp", "1,1"], "--etp"),
    (["--schedules", "1f1b,1f1b"], "--schedules: got '1f1b,1f1b': '1f1b' is listed twice"),
    (["--selective", "core_attn,core_attn"], "--selective"),
    (["--selective", "core_attn,mlp", "--selective", "mlp,core_attn"], "'core_attn,mlp' is listed twice"),
    (["--recompute-layers", "0,0"], "--recompute-layers"),
    (["--offload-layers", "0,00"], "--offload-layers"),
    (["--optimizer-offload", "0,0"], "--optimizer-offload"),
    (["--offload-modules", "none", "--offload-modules", "none"], "--offload-modules"),
    (["--cuda-graphs", "attn,attn"], "--cuda-graphs"),
])
def test_a_search_list_with_a_repeated_item_is_refused_as_gpus_and_vary_are(extra, needle):
    one_line([*SEARCH, *extra], needle, "listed twice")


@pytest.mark.parametrize("char", ["\x00", "\x07"])
def test_a_yaml_spec_with_a_control_character_is_one_line(tmp_path, char):
    """yaml's ReaderError prints its place on a second line; the error names the line instead."""
    p = tmp_path / "x.yaml"
    p.write_text(f"base: cpu-local\nname: x{char}\n")
    one_line(["show-spec", str(p)], str(p), "line 2: malformed YAML", "control characters")


@pytest.mark.parametrize("value", ["1e300", "10.5", "inf"])
def test_a_zipf_exponent_past_any_router_is_refused(value):
    """At s = 10 one expert already takes 99.9 % of the tokens; 1e300 overflowed numpy (RuntimeWarnings)."""
    one_line([*EST, "--ep", "2", "--routing", f"zipf:{value}"], "--routing: zipf", "from 0 to 10")


def test_a_plan_with_a_zipf_exponent_past_any_router_is_refused(tmp_path, plan_doc):
    doc = json.loads(json.dumps(plan_doc))
    doc["routing"].update(distribution="zipf", zipf_s=1e300)
    p = tmp_path / "x.json"
    p.write_text(json.dumps(doc))
    one_line(["show", str(p)], str(p), "routing.zipf_s")


@pytest.mark.parametrize("figure,needle", [
    ("efficiency:\n  gemm: 1.0e-300", "efficiency.gemm: Input should be greater than or equal to 0.001"),
    ("efficiency:\n  attention: 1.0e-300", "efficiency.attention"),
    ("efficiency:\n  attention_bwd: 1.0e-300", "efficiency.attention_bwd"),
    ("efficiency:\n  memory: 1.0e-300", "efficiency.memory"),
    ("efficiency:\n  comm: 1.0e-300", "efficiency.comm"),
    ("efficiency:\n  sustained_matmul: 1.0e-300", "efficiency.sustained_matmul"),
    ("efficiency:\n  gemm_dtype: {fp8: 1.0e-300}", "gemm_dtype.fp8 must be in [0.001, 1]"),
    ("efficiency:\n  attention_fp8: [1.0e300, 1.0]", "efficiency.attention_fp8"),
    ("efficiency:\n  attention_bwd_row_us: 1.0e300", "efficiency.attention_bwd_row_us"),
    ("efficiency:\n  dglu_dbias_ps: 1.0e300", "efficiency.dglu_dbias_ps"),
    ("efficiency:\n  attention_softmax_share: 2", "efficiency.attention_softmax_share"),  # a share
    ("efficiency:\n  collective_skew_base_ms: 1.0e300", "efficiency.collective_skew_base_ms"),
    ("memory_overhead_gib: 1.0e300", "memory_overhead_gib"),
    ("accelerator:\n  cache_mib: 1.0e300", "accelerator.cache_mib"),
    ("network:\n  cross_rail_taper: 1.0e-300", "network.cross_rail_taper"),
])
def test_a_hardware_figure_out_of_its_physical_range_is_one_line(tmp_path, figure, needle):
    p = tmp_path / "x.yaml"
    p.write_text(f"base: dgx-h100\nname: x\n{figure}\n")
    one_line(["show-spec", str(p)], str(p), needle)


def test_a_topology_fraction_of_1e_300_is_refused(tmp_path):
    for old, new, field in (("taper: 1.0,", "taper: 1.0e-300,", "topology.1.taper"),
                            ("latency_us: 3,", "comm: 1.0e-300, latency_us: 3,", "topology.0.comm")):
        p = _spec(tmp_path, "dgx-h100", lambda t: t.replace(old, new, 1))
        one_line(["show-spec", p], p, field, "greater than or equal to 0.001")


def test_hardware_figures_at_their_bounds_price_without_a_numpy_warning(tmp_path):
    """Every bound is one the cost model prices finite and quietly: numpy's RuntimeWarnings (overflow,
    divide by zero) leaked to stderr at 1e-300 and at zipf:1e300."""
    import warnings

    p = tmp_path / "edge.yaml"
    p.write_text("base: dgx-h100\nname: edge\nefficiency:\n" + "".join(
        f"  {k}: 1.0e-3\n" for k in ("gemm", "attention", "attention_bwd", "memory", "comm", "sustained_matmul")) +
        "  attention_softmax_share: 1\n  attention_bwd_row_us: 1.0e7\n  collective_skew_base_ms: 1.0e4\n"
        "  collective_skew_us: 1.0e7\nmemory_overhead_gib: 1048576\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for args in (["-m", "deepseek-v3", "-H", str(p), "-n", "256", "--pp", "8", "--ep", "32"],
                     ["-m", "tiny-moe", "-H", "cpu-local", "-n", "4", "--global-batch", "8", "--ep", "2"]):
            code, out, r = _run(["estimate", *args, "--routing", "zipf:10", "--json"])
            assert code == 0 and r.exception is None and "Warning" not in out, out


@pytest.mark.parametrize("record,needle", [
    ('{"tokens_per_expert": {"0": ' + json.dumps(["5"] * 8) + "}}",
     'tokens_per_expert[0]: expected a list of finite, non-negative token counts, got "5"'),
    ('{"tokens_per_expert": {"0": ' + json.dumps([True] * 8) + "}}",
     "tokens_per_expert[0]: expected a list of finite, non-negative token counts, got true"),
    ('{"tokens_per_expert": [' + json.dumps([1] * 7 + ["1"]) + "]}", "tokens_per_expert[0]: expected a list of finite"),
    ('{"tokens_per_expert": {"0": [1,1,1,1,1,1,1,1], "0": [2,2,2,2,2,2,2,2]}}', "line 1: 0: appears twice"),
    ('{"step": 1, "step": 2, "tokens_per_expert": {"0": [1,1,1,1,1,1,1,1]}}', "line 1: step: appears twice"),
])
def test_routing_counts_that_are_no_numbers_or_a_repeated_key_are_refused(tmp_path, record, needle):
    """numpy read "5" and true as 5.0 and 1.0, and JSON let a repeated key's last value win (a config.json's
    repeat is refused: the same hook)."""
    p = tmp_path / "m.jsonl"
    p.write_text(record + "\n")
    one_line([*EST, "--ep", "4", "--routing", str(p)], str(p), needle)


# ---- errors that name the cause (an audit of the CLIs, session 72) ----------------------------
def test_a_config_json_saved_as_yaml_is_told_to_keep_its_json_name(tmp_path):
    p = tmp_path / "q3.yaml"
    p.write_text((REPO / "tests" / "data" / "hf" / "qwen3-30b-a3b.json").read_text())
    for cmd in (["show-spec", str(p)], ["estimate", "-m", str(p), "-H", "cpu-local", "-n", "4"]):
        one_line(cmd, "model_type: this is a Hugging Face config.json", "a .json suffix")


def test_a_hardware_spec_without_its_accelerator_says_that_field_is_missing(tmp_path):
    import yaml

    spec = yaml.safe_load((REPO / "hardware" / "dgx-h100.yaml").read_text())
    del spec["accelerator"]
    p = tmp_path / "no-accelerator.yaml"
    p.write_text(yaml.safe_dump(spec))
    one_line(["show-spec", str(p)], "accelerator: required field is missing")


def test_a_device_is_no_spec_file():
    one_line(["show-spec", "/dev/null"], "/dev/null", "not a regular file")


def test_a_missing_choice_is_one_line_with_its_choices():
    one_line(["list"], "Choose from: models, hardware")


def test_a_varied_field_that_breaks_a_rule_between_fields_names_it():
    one_line(["sweep", "-m", "mixtral-8x7b", "-H", "dgx-h100", "--gpus", "64", "--vary", "gpus_per_node=4"],
             "gpus_per_node: one topology level must be the node (size 4)", "base: dgx-h100")


@pytest.mark.parametrize("cmd", [EST, SEARCH])
def test_a_migration_setting_without_migration_on_is_one_line(cmd):
    one_line([*cmd, "--ep", "4", "--migration-period", "10"] if cmd is EST else [*cmd, "--migration-planner", "swap"],
             "it sets expert migration, which is off; add --migration")
    code, out, _ = _run([*EST, "--ep", "4", "--migration", "--migration-period", "10"])
    assert code == 0, out
