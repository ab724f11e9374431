"""piper-plan's commands: one-line errors, estimate/search agreement, infeasibility reasons."""
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from piper_plan.cli import main
from piper_plan.errors import SpecError


def run(*args):
    r = CliRunner().invoke(main, list(args))
    return r.exit_code, r.output, (r.stderr if hasattr(r, "stderr") else "")


def err_line(code, out):
    assert code == 2, out
    lines = [l for l in out.strip().splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), out
    assert "Traceback" not in out
    return lines[0]


@pytest.mark.parametrize("text,field", [
    ("name: x\nnum_layers: [1, 2\n", "line"),                      # malformed YAML
    ("name: x\nnum_layers: 2\nhidden_size: 8\nnum_heads: 2\nvocab_size: 8\nffn_size: 8\nbogus: 1\n", "bogus"),
    ("name: x\nnum_layers: two\nhidden_size: 8\nnum_heads: 2\nvocab_size: 8\nffn_size: 8\n", "num_layers"),
])
def test_bad_model_yaml_is_one_line_naming_file_and_field(tmp_path, text, field):
    p = tmp_path / "m.yaml"
    p.write_text(text)
    line = err_line(*run("estimate", "-m", str(p), "-H", "frontier", "-n", "8")[:2])
    assert str(p) in line and field in line


def test_bad_hardware_field(tmp_path):
    p = tmp_path / "h.yaml"
    p.write_text(open("hardware/frontier.yaml").read().replace("memory_gib: 64", "memory_gib: -1"))
    line = err_line(*run("estimate", "-m", "mixtral-8x7b", "-H", str(p), "-n", "8")[:2])
    assert "accelerator.memory_gib" in line


def test_a_variant_spec_is_its_base_with_only_its_own_fields_changed():
    from piper_plan.specs import load_hardware

    base, variant = load_hardware("frontier").model_dump(), load_hardware("frontier-rocm57").model_dump()
    assert variant["efficiency"]["gemm"] == 0.60 != base["efficiency"]["gemm"]
    # every other efficiency, the accelerator, network and topology are the base's
    for key in set(base) - {"name", "source", "efficiency"}:
        assert variant[key] == base[key], key
    assert {k for k in base["efficiency"] if variant["efficiency"][k] != base["efficiency"][k]} == {"gemm", "source"}


@pytest.mark.parametrize("text,field,says", [
    ("base: no-such-machine\nname: v\n", "base", "neither a YAML beside this file nor a bundled hardware"),
    ("base: [frontier]\nname: v\n", "base", "expected the name or path"),
    ("base: h.yaml\nname: v\n", "base", "cycle"),
    ("base: frontier\nname: v\nefficiency: {gemm: 2.5}\n", "efficiency.gemm", ""),
])
def test_bad_variant_spec_is_one_line(tmp_path, text, field, says):
    p = tmp_path / "h.yaml"
    p.write_text(text)
    line = err_line(*run("estimate", "-m", "mixtral-8x7b", "-H", str(p), "-n", "8")[:2])
    assert str(p) in line and field in line and says in line


@pytest.mark.parametrize("args,constraint", [
    (["-n", "8", "--tp", "3"], "tp*pp*dp == gpus"),
    (["-n", "24", "--ep", "3", "--dp", "24"], "ep divides experts"),
    (["-n", "64", "--pp", "64"], "pp*vpp <= layers"),
    (["-n", "16", "--pp", "8", "--global-batch", "8", "--schedule", "1f1b"], "microbatches >= pp"),
])
def test_impossible_layouts_name_the_constraint(args, constraint):
    line = err_line(*run("estimate", "-m", "mixtral-8x7b", "-H", "frontier", *args)[:2])
    assert constraint in line


def test_a_searched_fp16_plan_is_fp16_and_priced_at_the_fp16_peak(tmp_path):
    """--dtype fp16 reaches plan.json as fp16 (it had come back from the search as bf16), and an
    fp16 layout runs at the spec's fp16 peak: where that is twice the bf16 one, the GEMMs, and
    so the step, take less time."""
    from piper_plan.evaluate import estimate_layout
    from piper_plan.layout import Layout
    from piper_plan.specs import load_hardware, load_model

    out = tmp_path / "plan.json"
    code, text, _ = run("search", "-m", "mixtral-8x7b", "-H", "dgx-h100", "-n", "64", "--dtype", "fp16", "-o", str(out))
    assert code == 0, text
    assert json.loads(out.read_text())["layout"]["dtype"] == "fp16"
    m, hw = load_model("mixtral-8x7b"), load_hardware("dgx-h100")
    fast = hw.model_copy(update={"accelerator": hw.accelerator.model_copy(
        update={"peak_tflops": {**hw.accelerator.peak_tflops, "fp16": 2 * 989}})})
    lay = Layout(gpus=64, dp=64, ep=8, global_batch=512, seq=4096, dtype="fp16")
    assert estimate_layout(m, fast, lay).step_time_s[0] < 0.8 * estimate_layout(m, hw, lay).step_time_s[0]


def test_fp32_is_priced_at_the_fp32_peak():
    """An fp32 layout runs its GEMMs at the spec's fp32 peak, far below the bf16 one (H100: 67
    against 989 TFLOP/s), so the step takes several times longer than the bf16 step."""
    from piper_plan.evaluate import estimate_layout
    from piper_plan.layout import Layout
    from piper_plan.specs import load_hardware, load_model

    m, hw = load_model("mixtral-8x7b"), load_hardware("dgx-h100")
    lay = Layout(gpus=64, dp=64, ep=8, global_batch=512, seq=4096)
    bf16 = estimate_layout(m, hw, lay).step_time_s[0]
    fp32 = estimate_layout(m, hw, lay.model_copy(update={"dtype": "fp32"})).step_time_s[0]
    assert fp32 > 5 * bf16


def test_search_plan_reproduces_under_estimate(tmp_path):
    out = tmp_path / "plan.json"
    code, text, _ = run("search", "-m", "mixtral-8x7b", "-H", "frontier", "-n", "64", "--json", "-o", str(out))
    assert code == 0, text
    best = json.loads(text)["top"][0]
    plan = json.loads(out.read_text())
    lay = plan["layout"]
    assert plan["predicted"]["fits"] and plan["predicted"]["peak_memory_gib"] <= 64
    args = ["estimate", "-m", "mixtral-8x7b", "-H", "frontier", "-n", str(lay["gpus"]), "--tp", str(lay["tp"]),
            "--pp", str(lay["pp"]), "--dp", str(lay["dp"]), "--ep", str(lay["ep"]), "--mbs", str(lay["mbs"]),
            "--global-batch", str(lay["global_batch"]), "--seq", str(lay["seq"]), "--schedule", lay["schedule"],
            "--vpp", str(lay["vpp"]), "--recompute", lay["recompute"], "--zero", str(lay["zero"]),
            "--a2a", lay["a2a"], "--placement", lay["placement"], "--json"]
    code, text, _ = run(*args)
    assert code == 0, text
    est = json.loads(text)
    for k in ("step_time_s", "tokens_per_s", "mfu", "peak_memory_gib"):
        assert est[k] == pytest.approx(best[k], rel=1e-12) == plan["predicted"][k]


def test_a_plan_written_by_search_and_by_estimate_reads_the_same(tmp_path):
    """Parts the batch reports only where some layout has them (piper-train's weight copies, ZeRO-3's
    gathered units) are not written as 0.0 for a layout without them: the two plans agree key for key,
    and so do their layouts (sequence_parallel is written false at tp 1, where it does nothing)."""
    s, e = tmp_path / "s.json", tmp_path / "e.json"
    base = ["-m", "tiny-moe", "-H", "cpu-local", "-n", "4", "--global-batch", "8"]
    code, text, _ = run("search", *base, "--runtime", "piper-train", "-o", str(s))
    assert code == 0, text
    lay = json.loads(s.read_text())["layout"]
    code, text, _ = run("estimate", *base, "--tp", str(lay["tp"]), "--pp", str(lay["pp"]), "--ep", str(lay["ep"]),
                        "--mbs", str(lay["mbs"]), "--schedule", lay["schedule"], "--recompute", lay["recompute"],
                        "--zero", str(lay["zero"]), "--a2a", lay["a2a"], "--kernels", "unfused",
                        "--no-overlap-grad-reduce", "-o", str(e))
    assert code == 0, text
    searched, estimated = (json.loads(p.read_text())["predicted"]["memory_gib_per_stage"] for p in (s, e))
    assert searched == estimated and all("weight_casts" not in d and "zero3_units" not in d for d in searched)
    assert lay["tp"] == 1 and json.loads(e.read_text())["layout"] == lay


def test_deepseek_v3_on_8_gpus_says_states_do_not_fit():
    code, text, _ = run("search", "-m", "deepseek-v3", "-H", "dgx-h100", "-n", "8", "--json")
    assert code == 1
    why = " ".join(json.loads(text)["infeasible"])
    assert "nothing fits" in why and "parameter + optimizer state alone" in why
    assert "more)" in why  # a computed GPU count that fits


def test_the_nothing_fits_hint_names_the_fewest_whole_nodes_it_found_to_fit():
    # it had tried doublings only: 256 GPUs for DeepSeek-V3 on 64 H100s, where 21 nodes fit
    code, text, _ = run("search", "-m", "deepseek-v3", "-H", "dgx-h100", "-n", "64", "--json")
    assert code == 1 and "fits with 168 GPUs (104 more)" in " ".join(json.loads(text)["infeasible"])
    for n, fits in ((160, False), (168, True)):  # the asked batch (1,024 sequences) on one node fewer, and on 21
        code, text, _ = run("search", "-m", "deepseek-v3", "-H", "dgx-h100", "-n", str(n), "--global-batch", "1024",
                            "--json")
        assert (code == 0) == fits, text


def test_a_search_where_nothing_fits_prints_no_empty_table_and_exits_1():
    code, text, _ = run("search", "-m", "deepseek-v3", "-H", "dgx-h100", "-n", "8")
    assert code == 1 and "0 fit" in text and "nothing fits" in text
    assert "TFLOP/s/GPU" not in text  # the ranked table's header


def test_the_default_batch_is_rounded_to_the_gpus_as_sweep_rounds_it():
    # 4M tokens of 3,000 is 1,398 sequences (2 x 699): only dp 1 or 2 would split it on 4 GPUs
    code, text, _ = run("search", "-m", "tiny-moe", "-H", "cpu-local", "-n", "4", "--seq", "3000", "--top", "1",
                        "--json")
    assert code == 0, text
    lay = json.loads(text)["top"][0]["layout"]
    assert lay["global_batch"] == 1396 and lay["dp"] == 4
    # under one sequence a GPU the default is raised to one a GPU, and said
    r = CliRunner().invoke(main, ["search", "-m", "tiny-moe", "-H", "cpu-local", "-n", "4", "--seq", "2097152",
                                  "--top", "1", "--json"])
    assert "the default, 2 sequences (4M tokens), is under one a GPU on 4 GPUs; searched at 4" in r.output


def test_a_headroom_of_the_whole_device_is_one_line():
    line = err_line(*run("search", "-m", "mixtral-8x7b", "-H", "dgx-h100", "-n", "64", "--headroom-gib", "79.6")[:2])
    assert "--headroom-gib: 79.6 GiB leaves nothing of dgx-h100's 79.6 GiB a GPU" in line


def test_batch_that_cannot_split_names_the_rule():
    # 1 sequence on 8 ranks: dp > 1 cannot split it, and pp > 1 has fewer micro-batches than stages
    code, text, _ = run("search", "-m", "tiny-moe", "-H", "cpu-local", "-n", "8", "--global-batch", "1",
                        "--schedules", "1f1b", "--json")
    assert code == 1
    why = " ".join(json.loads(text)["infeasible"])
    assert "global batch not divisible by dp*mbs" in why and "micro-batches < pp" in why
    assert "global batch 1 splits over dp in [1]" in why


def test_estimate_says_it_wrote_a_plan_and_warns_when_the_plan_does_not_fit(tmp_path):
    """estimate -o writes the layout asked for, fitting or not, and says so; one that does not fit
    is written with a warning naming the memory, since piper-train would refuse it."""
    base = ["estimate", "-m", "deepseek-v3", "-H", "frontier", "-n", "1024", "--mbs", "1"]
    small = ["--tp", "4", "--ep", "32", "--zero", "1"]  # the search's best's degrees
    for name, args, fits in (("big", ["--ep", "64"], False), ("small", small, True)):
        out = tmp_path / f"{name}.json"
        code, text, _ = run(*base, *args, "--pp", "16", "-o", str(out))
        assert code == 0 and out.exists(), text
        assert json.loads(out.read_text())["predicted"]["fits"] is fits
        assert f"wrote {out}" in text
        warned = [l for l in text.splitlines() if l.startswith("warning:")]
        if fits:
            assert not warned, text
        else:
            assert len(warned) == 1 and "does not fit" in warned[0] and "against the device's 64 GiB" in warned[0]


def test_search_prices_the_gradients_in_the_dtype_asked_for(tmp_path):
    """Megatron-Bridge's recipes reduce bf16 gradients (--grad-reduce-in-bf16): the search had no
    such option and priced every candidate's gradients in fp32, 2 bytes an element too many."""
    base = ["search", "-m", "qwen3-30b-a3b", "-H", "dgx-h100", "-n", "16", "--global-batch", "256", "--json"]
    best = {}
    for dt in ("fp32", "bf16"):
        code, text, _ = run(*base, "--grad-dtype", dt, "-o", str(tmp_path / f"{dt}.json"))
        assert code == 0, text
        best[dt] = json.loads(text)["top"][0]
        assert json.loads((tmp_path / f"{dt}.json").read_text())["layout"]["grad_dtype"] == dt
    from piper_plan.evaluate import estimate_layout
    from piper_plan.layout import Layout
    from piper_plan.specs.registry import load_hardware, load_model

    m, hw = load_model("qwen3-30b-a3b"), load_hardware("dgx-h100")
    lay = Layout(**best["fp32"]["layout"])
    mem = [estimate_layout(m, hw, lay.model_copy(update={"grad_dtype": dt})).peak_memory_gib[0]
           for dt in ("fp32", "bf16")]
    assert mem[1] < mem[0]  # the same layout holds half-size gradients
    code, text, _ = run(*base, "--grad-dtype", "bf16", "--runtime", "piper-train")
    assert code == 2 and "it cannot run --grad-dtype bf16 (piper-train reduces fp32 gradients)" in text
    for cmd in (base, ["estimate", "-m", "qwen3-30b-a3b", "-H", "dgx-h100", "-n", "16"]):  # fp32 weights' are fp32
        line = err_line(*run(*cmd, "--dtype", "fp32", "--grad-dtype", "bf16")[:2])
        assert "--grad-dtype bf16: the gradients of --dtype fp32 weights are fp32" in line


def test_estimate_json_has_required_keys():
    code, text, _ = run("estimate", "-m", "deepseek-v3", "-H", "frontier", "-n", "2048", "--pp", "16", "--ep", "64",
                        "--recompute", "full", "--global-batch", "4096", "--json")
    assert code == 0, text
    d = json.loads(text)
    for k in ("step_time_s", "tokens_per_s", "tflops_per_gpu", "hw_tflops_per_gpu", "mfu", "peak_memory_gib",
              "fits", "memory_gib_per_stage", "time_breakdown_s"):
        assert k in d
    assert {"compute", "a2a", "bubble", "dp_comm"} <= set(d["time_breakdown_s"])
    assert d["memory_gib_per_stage"][0]["stage"] == 0 and "activations" in d["memory_gib_per_stage"][0]


def test_planner_imports_no_torch():
    code = "import sys, piper_plan.cli, piper_plan.search, piper_plan.validate; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_the_cli_starts_without_the_fitting_and_statistics_libraries():
    """Every piper-plan command imports the CLI; scipy's optimizers (calibrate's fits) and
    statistics (validate's) load only with the command that uses them: importing
    scipy.optimize took 0.26 of the 0.56 s the CLI took to start."""
    code = "import sys, piper_plan.cli; print(sorted(m for m in ('scipy.optimize', 'scipy.stats') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "[]"


def test_failed_plan_write_leaves_old_file(tmp_path, monkeypatch):
    from piper_plan import plan as plan_mod

    p = tmp_path / "plan.json"
    p.write_text("old")
    monkeypatch.setattr(plan_mod.os, "replace", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(SpecError, match="cannot write"):
        plan_mod.atomic_write_text(p, "new")
    assert p.read_text() == "old" and [x.name for x in tmp_path.iterdir()] == ["plan.json"]


def test_written_files_are_readable_like_any_other(tmp_path):
    """An atomic write gets open()'s mode (0666 less the umask), not mkstemp's 0600, and a
    rewrite keeps the mode the file had."""
    from piper_plan import plan as plan_mod

    umask = os.umask(0o022)
    try:
        fresh, kept = tmp_path / "plan.json", tmp_path / "spec.yaml"
        plan_mod.atomic_write_text(fresh, "new")
        kept.write_text("old")
        kept.chmod(0o640)
        plan_mod.atomic_write_text(kept, "new")
    finally:
        os.umask(umask)
    assert fresh.stat().st_mode & 0o777 == 0o644 and kept.stat().st_mode & 0o777 == 0o640


def test_unknown_plan_schema_version(tmp_path):
    p = tmp_path / "plan.json"
    p.write_text(json.dumps({"schema_version": 99}))
    line = err_line(*run("show", str(p))[:2])
    assert "schema_version" in line


def test_sweep_writes_table_csv_and_png(tmp_path):
    code, text, _ = run("sweep", "-m", "mixtral-8x7b", "-H", "frontier", "--gpus", "64", "--vary",
                        "nic_gbps=12.5,25,50", "--csv", str(tmp_path / "s.csv"), "--plot", str(tmp_path / "s.png"),
                        "--json", str(tmp_path / "s.json"))
    assert code == 0, text
    rows = json.loads((tmp_path / "s.json").read_text())
    assert [r["network.nic_gbps"] for r in rows] == [12.5, 25, 50]
    assert rows[0]["tokens_per_s"] <= rows[2]["tokens_per_s"]  # a faster NIC never slows the best plan
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    assert len((tmp_path / "s.csv").read_text().splitlines()) == 4
    assert "prices the same" not in text  # the NIC moves the answer


def test_a_sweep_whose_varied_field_moves_nothing_says_so():
    # a bf16 peak under --dtype fp16 (its own peak): three identical rows had been printed without a word
    code, text, _ = run("sweep", "-m", "tiny-moe", "-H", "cpu-local", "--gpus", "4", "--global-batch", "8",
                        "--dtype", "fp32", "--vary", "peak_bf16=0.01,0.1")
    assert code == 0 and ("warning: cpu-local: --vary accelerator.peak_tflops.bf16: every value prices the same best "
                          "plan at the same throughput") in text


@pytest.mark.parametrize("suffix,magic", [(".pdf", b"%PDF"), (".svg", b"<?xml"), ("", b"\x89PNG")])
def test_a_sweep_plot_is_written_in_the_format_its_suffix_names(tmp_path, suffix, magic):
    p = tmp_path / f"s{suffix}"
    code, text, _ = run("sweep", "-m", "tiny-moe", "-H", "cpu-local", "--gpus", "4", "--global-batch", "8",
                        "--plot", str(p))
    assert code == 0, text
    assert p.read_bytes()[:len(magic)] == magic


def test_json_to_dev_stdout_reaches_a_pipe():
    # /dev/stdout's link names "pipe:[N]" in /proc, which no path reaches: the write had been refused
    cmd = [sys.executable, "-c", "from piper_plan.cli import main; main()", "sweep", "-m", "tiny-moe", "-H",
           "cpu-local", "--gpus", "4", "--global-batch", "8", "--json", "/dev/stdout"]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert '"gpus": 4' in r.stdout


def test_the_schema_requires_the_version_read_plan_requires():
    from piper_plan.plan import SCHEMA_VERSION, json_schema

    s = json_schema()
    assert "schema_version" in s["required"] and s["properties"]["schema_version"]["const"] == SCHEMA_VERSION


def test_sweep_csv_has_the_same_columns_in_the_table_s_order_whatever_fits(tmp_path):
    # the columns had been sorted by name (a varied field before gpus) and taken from the rows, so a
    # sweep where nothing fits had no step_time_s or peak_memory_gib column at all
    heads = {}
    for hbm in ("1", "1,64"):
        p = tmp_path / f"s{hbm}.csv"
        code, text, _ = run("sweep", "-m", "mixtral-8x7b", "-H", "frontier", "--gpus", "64", "--vary", f"hbm_gib={hbm}",
                            "--csv", str(p))
        assert code == (1 if hbm == "1" else 0), text  # nothing fitting anywhere is a failure, its table still written
        heads[hbm] = p.read_text().splitlines()[0]
    assert heads["1"] == heads["1,64"] == ("gpus,accelerator.memory_gib,global_batch,fits,tokens_per_s,tflops_per_gpu,"
                                          "mfu,step_time_s,peak_memory_gib,layout")


def test_a_sweep_where_nothing_fits_in_any_scenario_exits_non_zero_and_says_so(tmp_path):
    # as search does: a script reading the exit status must not take an empty answer for a plan
    code, text, _ = run("sweep", "-m", "mixtral-8x7b", "-H", "frontier", "--gpus", "64", "--vary", "hbm_gib=1,2",
                        "--json", str(tmp_path / "s.json"))
    assert code == 1 and "nothing fits in any scenario" in text
    assert [r["fits"] for r in json.loads((tmp_path / "s.json").read_text())] == [False, False]
    code, text, _ = run("sweep", "-m", "mixtral-8x7b", "-H", "frontier", "--gpus", "64", "--vary", "hbm_gib=1,64")
    assert code == 0 and "nothing fits in any scenario" not in text  # one scenario with a plan is an answer


def test_sweep_unknown_field_is_one_line():
    line = err_line(*run("sweep", "-m", "mixtral-8x7b", "-H", "frontier", "--gpus", "64", "--vary", "network.nope=1")[:2])
    assert "network.nope" in line


def test_bundled_specs_found_after_plain_wheel_install(tmp_path):
    import pathlib

    repo = pathlib.Path(__file__).resolve().parents[1]
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--target", str(target), str(repo)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    code = ("import piper_plan.specs as s; print(len(s.bundled_names('models')), len(s.bundled_names('hardware')),"
            " s.load_model('deepseek-v3').name, s.load_hardware('frontier').name,"
            " s.load_hardware('frontier-rocm57').efficiency.gemm)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"})
    n_models = len(list((repo / "models").glob("*.yaml")))
    n_hw = len(list((repo / "hardware").glob("*.yaml")))
    assert out.stdout.split() == [str(n_models), str(n_hw), "deepseek-v3", "frontier", "0.6"], out.stderr


@pytest.mark.parametrize("model,hw,gpus", [("deepseek-v3", "frontier", 256), ("mixtral-8x22b", "dgx-h100", 64),
                                           ("gpt-175b", "dgx-a100-80gb", 64)])
def test_state_memory_bound_never_drops_a_fitting_layout(model, hw, gpus):
    from piper_plan.cost.estimate import evaluate
    from piper_plan.search import SearchSpace, enumerate_layouts, search
    from piper_plan.specs import load_hardware, load_model

    m, h = load_model(model), load_hardware(hw)
    sp = SearchSpace(gpus=gpus, global_batch=gpus * 4, seq=4096)
    full, _ = enumerate_layouts(m, h, sp)
    est = evaluate(m, h, full)
    res = search(m, h, sp)
    assert int(est.fits.sum()) == len(res.order) > 0
    assert res.est.tokens_per_s[res.best] == est.tokens_per_s[est.fits].max()


def test_list_and_show_spec_render_derived_figures():
    code, out, _ = run("list", "models")
    assert code == 0 and "deepseek-v3" in out and "671.03B" in out and "37.55B" in out  # total, active (embedding incl.)
    code, out, _ = run("list", "hardware")
    assert code == 0 and "frontier" in out and "gcd-pair > node > switch" in out
    code, out, _ = run("show-spec", "mixtral-8x7b")
    assert code == 0 and "routed experts (8, top-2)" in out and "46.70B" in out
    code, out, _ = run("show-spec", "frontier")
    assert code == 0 and "12.5 (NIC)" in out  # 4 × 25 GB/s NICs shared by 8 GCDs
    assert "a2a_fanout=0.26" in out  # every figure the model prices is on show
    code, out, _ = run("show-spec", "gb200-nvl72")
    assert code == 0 and "links shared with nvl72" in out and "overlap_comm_units=20" in out
    assert "72 (a job fills 64)" in out  # topology.1.job_block
    code, out, _ = run("show-spec", "nope")
    assert code == 2 and "not a file and not a bundled model" in out


def test_show_spec_gives_mla_heads_their_own_widths_and_counts_layers_local_everywhere():
    # DeepSeek-V3's heads: q·k 128 + 64 (rope) = 192, v 128; hidden / heads (56) is no head's width
    code, out, _ = run("show-spec", "deepseek-v3")
    assert code == 0 and "7168 / 128 / 128 / 192 / 128 (q·k / v)" in out, out
    # Mistral-7B-v0.1: a 4,096-token window in each of its 32 layers
    code, out, _ = run("show-spec", os.path.join(os.path.dirname(__file__), "data", "hf", "mistral-7b-v0.1.json"))
    assert code == 0 and "sliding window of 4096 tokens in 32 of 32 layers" in out, out


def _imb(*extra):
    code, text, _ = run("estimate", "-m", "qwen3-30b-a3b", "-H", "dgx-h100", "-n", "64", "--ep", "8",
                        "--global-batch", "512", "--json", *extra)
    assert code == 0, text
    return json.loads(text[text.index("{"):])  # after any warning line (stderr shares the runner's output)


def test_migration_lowers_predicted_imbalance_and_costs_time(tmp_path):
    skewed = _imb("--routing", "zipf:1.0")
    migrated = _imb("--routing", "zipf:1.0", "--migration", "--migration-period", "10", "-o", str(tmp_path / "p.json"))
    assert migrated["imbalance"] < skewed["imbalance"]
    assert migrated["time_breakdown_s"]["migration"] > 0 == skewed["time_breakdown_s"]["migration"]
    plan = json.loads((tmp_path / "p.json").read_text())
    assert plan["migration"]["enabled"] and plan["migration"]["period_steps"] == 10


def test_routing_histogram_from_runtime_metrics(tmp_path):
    E = 128
    counts = [1000.0] * E
    counts[0] = 20000.0  # one hot expert
    rows = [{"step": s, "tokens_per_expert": {"0": counts, "1": counts}} for s in range(3)]
    f = tmp_path / "run.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    hot = _imb("--routing", str(f))
    assert hot["imbalance"] > _imb()["imbalance"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"tokens_per_expert": {"0": [1.0, 2.0]}}) + "\n")
    line = err_line(*run("estimate", "-m", "qwen3-30b-a3b", "-H", "dgx-h100", "-n", "64", "--ep", "8",
                         "--global-batch", "512", "--routing", str(bad))[:2])
    assert "tokens_per_expert" in line


def test_unknown_recompute_module_and_missing_fp8_peak_are_one_line():
    line = err_line(*run("estimate", "-m", "tiny-moe", "-H", "cpu-local", "-n", "8", "--recompute", "selective",
                         "--recompute-modules", "core_attn,bogus")[:2])
    assert "--recompute-modules" in line and "moe_act" in line
    line = err_line(*run("estimate", "-m", "tiny-moe", "-H", "frontier", "-n", "8", "--fp8", "mxfp8")[:2])
    assert "frontier" in line and "fp8" in line


def test_cuda_graph_scopes_are_a_stack_option_the_estimate_prices():
    eager = ("estimate", "-m", "qwen3-30b-a3b", "-H", "dgx-b200", "-n", "8", "--ep", "8", "--global-batch", "64",
             "--expert-gemm", "multistream", "--fp8", "mxfp8", "--json")
    code, text, _ = run(*eager)
    assert code == 0, text
    code2, text2, _ = run(*eager, "--cuda-graphs", "attn,moe_router,moe_preprocess")
    assert code2 == 0, text2
    host, graphed = (json.loads(t)["time_breakdown_s"]["host"] for t in (text, text2))
    assert host > graphed > 0
    code, out, _ = run(*eager, "--cuda-graphs", "attn,everything")
    assert "--cuda-graphs" in err_line(code, out) and "everything" in out


def test_the_search_tables_step_column_reads_three_significant_digits_evenly():
    from piper_plan.report import sig

    assert [sig(x) for x in (18.0, 18.63, 0.0857, 5.0, 123.4, 999.6, 1234.5)] == \
        ["18.0", "18.6", "0.0857", "5.00", "123", "1,000", "1,234"]
    assert [sig(x, 4) for x in (17.9999, 0.08591, 1234.5, 12345.6)] == ["18.00", "0.08591", "1,234", "12,346"]


def test_a_misspelt_spec_name_is_answered_with_the_nearest_bundled_one():
    code, out, _ = run("search", "-m", "deepseek-v3", "-H", "fronteir", "-n", "8")
    assert code == 2 and "did you mean frontier?" in out and len(out.strip().splitlines()) == 1
    code, out, _ = run("search", "-m", "zzz", "-H", "frontier", "-n", "8")
    assert code == 2 and "did you mean" not in out


def test_show_names_every_setting_that_changes_the_price(tmp_path):
    p = tmp_path / "plan.json"
    base = ["estimate", "-m", "mixtral-8x7b", "-H", "dgx-h100", "-n", "16", "--tp", "2", "--ep", "8", "--pp", "2"]

    def settings_row():
        shown = CliRunner().invoke(main, ["show", str(p)], terminal_width=200).output
        return next(line for line in shown.splitlines() if "stack settings off their defaults" in line)

    assert run(*base, "-o", str(p))[0] == 0
    assert settings_row().split("│")[2].strip() == "none"
    assert run(*base, "--a2a-overlap", "--schedule", "interleaved", "--vpp", "2", "--cuda-graphs", "attn",
               "--no-sequence-parallel", "--expert-gemm", "loop", "-o", str(p))[0] == 0
    row = settings_row()
    for said in ("sequence_parallel=False", "expert_gemm=loop", "cuda_graphs=attn", "a2a_overlap=True"):
        assert said in row, row


def test_the_default_batch_is_rounded_to_whole_data_parallel_micro_batches():
    # 24 GPUs at dp 24: the default 1,024 sequences (4M tokens) are 42 whole micro-batches a rank
    code, out, _ = run("estimate", "-m", "mixtral-8x7b", "-H", "dgx-h100", "-n", "24", "--ep", "8", "--json")
    assert code == 0, out
    assert json.loads(out)["layout"]["global_batch"] == 1008
    code, out, _ = run("estimate", "-m", "mixtral-8x7b", "-H", "dgx-h100", "-n", "24", "--ep", "8",
                       "--global-batch", "1024")
    assert "global batch 1024 is not a multiple of dp*mbs = 24" in err_line(code, out)


def test_a_default_batch_under_one_sequence_a_gpu_is_said_not_silently_searched():
    """The default global batch is 4M tokens whatever the machine: on 2,048 GPUs that is half a
    sequence a GPU, and the search says so (sweep rounds it up to one a GPU instead)."""
    runner = CliRunner()
    big = runner.invoke(main, ["search", "-m", "deepseek-v3", "-H", "dgx-h100", "-n", "2048", "--top", "1"])
    assert "warning: --global-batch: the default, 1,024 sequences" in big.output
    stated = runner.invoke(main, ["search", "-m", "deepseek-v3", "-H", "dgx-h100", "-n", "2048", "--top", "1",
                                  "--global-batch", "1024"])
    small = runner.invoke(main, ["search", "-m", "deepseek-v3", "-H", "dgx-h100", "-n", "512", "--top", "1"])
    assert "--global-batch: the default" not in stated.output + small.output


def test_search_tries_only_the_zero_stages_asked_for():
    stages = lambda *opt: {p["layout"]["zero"] for p in json.loads(run(  # noqa: E731
        "search", "-m", "mixtral-8x7b", "-H", "dgx-h100", "-n", "64", "--global-batch", "256", "--json",
        "--top", "200", *opt)[1])["top"]}
    assert stages() >= {0, 1, 2}  # stage 3 is tried too, ranked below them here
    assert stages("--zero", "3") == {3}
    assert stages("--zero", "0,2") == {0, 2}


@pytest.mark.parametrize("args,says", [
    (("--zero", "4"), "error: layout: --zero: got '4'; expected a comma-separated list of whole numbers up to 3"),
    (("--zero", "1,1"), "error: layout: --zero: got '1,1': 1 is listed twice; list each choice once"),
    (("--runtime", "piper-train", "--zero", "1,3"),
     "error: --runtime piper-train: it cannot run --zero 3 (piper-train implements ZeRO stages 0, 1 and 2)"),
])
def test_a_zero_stage_search_cannot_try_is_a_one_line_error(args, says):
    code, out, _ = run("search", "-m", "tiny-moe", "-H", "cpu-local", "-n", "4", "--global-batch", "8", *args)
    assert err_line(code, out) == says
