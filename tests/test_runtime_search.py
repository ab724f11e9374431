"""`piper-plan search --runtime piper-train`: only plans the bundled runtime runs, priced as it
runs them."""
import numpy as np
import pytest
from click.testing import CliRunner

from piper_plan.cli import main
from piper_plan.cost.batch import from_layouts
from piper_plan.cost.reduction import tensor_host_time
from piper_plan.layout import Layout
from piper_plan.search import SearchSpace, for_runtime, search
from piper_plan.specs.registry import load_hardware, load_model


def test_every_ranked_plan_is_one_piper_train_accepts():
    m, hw = load_model("tiny-moe"), load_hardware("cpu-local")
    res = search(m, hw, for_runtime(SearchSpace(gpus=8, global_batch=32, seq=64), "piper-train"))
    lays = [res.batch.layout(int(i)) for i in res.order]
    assert lays
    assert all(not x.fused_kernels and not x.overlap_grad_reduce and x.zero <= 2 and x.a2a in ("flat", "halo")
               for x in lays)
    assert not any(x.zero == 2 and x.schedule in ("zbv", "dualpipev") for x in lays)
    assert any(x.schedule == "zbv" for x in lays)  # the schedules themselves stay (with ZeRO 0-1)


def test_the_default_runtime_leaves_the_space_alone():
    sp = SearchSpace(gpus=8, global_batch=32, seq=64)
    assert for_runtime(sp, "any") is sp


def test_a_feature_piper_train_lacks_is_a_one_line_error():
    r = CliRunner().invoke(main, ["search", "-m", "tiny-moe", "-H", "cpu-local", "-n", "4", "--runtime",
                                  "piper-train", "--fp8", "mxfp8"])
    assert r.exit_code == 2
    assert r.output.strip() == ("error: --runtime piper-train: it cannot run --fp8 mxfp8 (piper-train runs its "
                                "GEMMs in the layout's dtype, not FP8)")


def test_piper_train_zero2_pays_a_call_per_bucket_and_a_copy_per_tensor_each_micro_batch():
    hw = load_hardware("cpu-local")
    lays = from_layouts([Layout(gpus=4, dp=4, global_batch=16, seq=64, mbs=1, zero=z, fused_kernels=False)
                         for z in (1, 2)])
    rep_t, exp_t, M = np.array([40.0, 40.0]), np.array([9.0, 9.0]), np.array([4.0, 4.0])
    small = np.array([1e5, 1e5])  # parameters: their gradients far below a bucket's cap
    red, _ = tensor_host_time(hw, lays, np.array([4, 4]), rep_t, exp_t, M, small, small)
    # ep 1: experts replicate over all 4 ranks too; a bucket per owner and group (4 + 4), and
    # each of the 49 tensors packed into its bucket, every one of the 4 micro-batches
    eff = hw.efficiency
    want = 4 * (8 * eff.collective_overhead_us + 49 * eff.optimizer_tensor_us["copy"]) * 1e-6
    assert red[1] - red[0] == pytest.approx(want)


def test_zero2_buckets_also_go_at_the_cap_so_big_chunks_make_more_calls():
    from piper_plan.cost.rank_memory import BUCKET_CAP_BYTES

    hw = load_hardware("cpu-local")
    lays = from_layouts([Layout(gpus=4, dp=4, global_batch=16, seq=64, mbs=1, zero=2, fused_kernels=False,
                                dtype="fp32")] * 2)
    t, M, none = np.array([40.0, 40.0]), np.array([1.0, 1.0]), np.array([0.0, 0.0])
    params = np.array([1e5, 40 * BUCKET_CAP_BYTES / 4])  # fp32 gradients: 40 caps' worth in the second
    red, _ = tensor_host_time(hw, lays, np.array([1, 1]), t, none, M, params, none)
    assert red[1] - red[0] == pytest.approx((40 - 4) * hw.efficiency.collective_overhead_us * 1e-6)


# one value piper-train does not run for each field of its table (runtimes.PIPER_TRAIN)
UNRUN = {"dtype": "fp16", "zero": 3, "fp8": "mxfp8", "a2a": "dedup", "expert_gemm": "multistream",
         "expert_probs": "activation", "a2a_overlap": True, "tp_comm_overlap": True, "attention_fp8": True,
         "cuda_graphs": ("attn",), "recompute_modules": ("mlp",), "dropout": True, "etp": 2, "cp": 2,
         "optimizer_offload": 0.5, "offload_layers": 1, "recompute_layers": 1, "p2p_scatter_gather": True,
         "offload_modules": ("expert_fc1",), "fp8_params": True, "p2p_overlap": False, "grad_dtype": "bf16",
         "attention_kernel": "fa2", "native_eager": True, "fsdp2": True, "compiled": ("loss",),
         "grad_sync": "step", "wgrad_accum": "gemm"}


def test_the_search_and_the_launch_refuse_the_same_features():
    pytest.importorskip("torch")
    from piper_plan.errors import PiperError
    from piper_plan.plan import make_plan
    from piper_plan.runtimes import PIPER_TRAIN
    from piper_plan.specs.hardware import AttentionPlateau, Host
    from piper_runtime.launch import check_supported

    assert set(UNRUN) == {s.field for s in PIPER_TRAIN}
    m, hw = load_model("tiny-moe"), load_hardware("cpu-local")
    several = {"zero": "zeros", "a2a": "a2as", "recompute_modules": "selective", "etp": "etps", "cp": "cps",
               "recompute_layers": "recompute_layers", "optimizer_offload": "optimizer_offload",
               "offload_layers": "offload_layers", "offload_modules": "offload_modules"}
    for s in PIPER_TRAIN:
        bad = UNRUN[s.field]
        # fields that mean something only beside another (runtimes.PIPER_TRAIN lists them first)
        extra = {"recompute_modules": {"recompute": "selective"}, "recompute_layers": {"recompute": "full"},
                 "fp8_params": {"fp8": "mxfp8"}, "attention_fp8": {"fp8": "current"}, "fsdp2": {"zero": 3},
                 "grad_sync": {"zero": 3},
                 "p2p_overlap": {"schedule": "interleaved", "vpp": 2, "pp": 2}}.get(s.field, {})
        ep = 1 if s.field in ("etp", "p2p_overlap", "native_eager") else 2  # two ranks: one expert group of etp 2
        dp = 1 if s.field in ("cp", "p2p_overlap") else 2  # two ranks: one sequence over both; two stages
        # offloading is priced only on a spec with a host section: this test's own, not a machine's figures
        spec = hw.model_copy(update={"host": Host(link_gbps=10, memory_bandwidth_gbps=10, memory_gib=16)})
        if s.field == "attention_kernel":  # FlashAttention-2 is priced only where a spec states its plateau
            fa2 = AttentionPlateau(forward=hw.efficiency.attention)
            spec = spec.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"attention_fa2": fa2})})
        model = load_model("tiny-dense") if s.field == "native_eager" else m  # an eager block counted dense only
        plan = make_plan(model, spec, Layout(gpus=2, dp=dp, ep=ep, global_batch=4, seq=32, **extra, **{s.field: bad}))
        with pytest.raises(PiperError, match=f"plan: layout.{s.field} = "):
            check_supported(plan, 2)
        attr = several.get(s.field, s.field)
        if s.field in ("zero", "dropout", "p2p_scatter_gather"):
            continue  # the space enumerates ZeRO stages itself (cut, below), never tries dropout and splits
            # every tp > 1 message by sequence parallelism
        in_space = {"fp8_params": {"fp8": "mxfp8"}, "attention_fp8": {"fp8": "current"}}.get(s.field, {})
        asked = {attr: (bad,) if attr in several.values() else bad}
        sp = SearchSpace(gpus=2, global_batch=4, seq=32, **in_space, **asked)
        with pytest.raises(PiperError, match=f"it cannot run {s.option} "):
            for_runtime(sp, "piper-train")
    assert for_runtime(SearchSpace(gpus=2, global_batch=4, seq=32), "piper-train").zeros == (0, 1, 2)


def test_a_model_with_an_mtp_module_is_refused_before_the_search_not_after_the_plan(tmp_path):
    """piper-train builds no multi-token-prediction module, so a search for it must not write a plan
    its launch check then refuses (an imported DeepSeek-V3 or GLM-4.5 config.json carries one)."""
    from piper_plan.errors import PiperError

    mtp = load_model("tiny-moe").model_copy(update={"mtp_layers": 1})
    with pytest.raises(PiperError, match="--runtime piper-train: piper-train trains no multi-token-prediction"):
        for_runtime(SearchSpace(gpus=2, global_batch=4, seq=32), "piper-train", mtp)
    assert for_runtime(SearchSpace(gpus=2, global_batch=4, seq=32), "any", mtp).gpus == 2  # other stacks train it
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(main, ["search", "-m", "deepseek-v3-mtp", "-H", "cpu-local", "-n", "8",
                                  "--runtime", "piper-train", "-o", str(out)])
    assert r.exit_code != 0 and not out.exists()
    assert r.output.strip().count("\n") == 0 and "mtp_layers 0" in r.output


def test_a_setting_no_searched_layout_would_run_is_not_refused(tmp_path):
    """--no-p2p-overlap means something only to the interleaved schedule, --selective only to
    selective recompute: a piper-train search without them may carry either, and the plan it
    writes launches (runtimes.Support.searched_when beside read_when)."""
    from piper_plan.errors import PiperError
    from piper_plan.plan import read_plan
    from piper_plan.runtimes import PIPER_TRAIN

    base = dict(gpus=2, global_batch=4, seq=32)
    waited = SearchSpace(**base, p2p_overlap=False)
    with pytest.raises(PiperError, match="it cannot run --p2p-overlap false"):
        for_runtime(waited, "piper-train")
    assert for_runtime(SearchSpace(**base, p2p_overlap=False, schedules=("1f1b", "zbv")), "piper-train").gpus == 2
    with pytest.raises(PiperError, match="it cannot run --selective"):
        for_runtime(SearchSpace(**base, selective=(("mlp",),)), "piper-train")
    assert for_runtime(SearchSpace(**base, selective=(("mlp",),), recomputes=("none", "full")), "piper-train")
    assert {s.field for s in PIPER_TRAIN if s.searched_when} == {s.field for s in PIPER_TRAIN if s.read_when}

    out = tmp_path / "plan.json"
    args = ["search", "-m", "tiny-moe", "-H", "cpu-local", "-n", "4", "--global-batch", "8", "--seq", "32",
            "--runtime", "piper-train", "--no-p2p-overlap", "-o", str(out)]
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code != 0 and not out.exists() and "--p2p-overlap false" in refused.output
    ran = CliRunner().invoke(main, args + ["--schedules", "gpipe,1f1b"])
    assert ran.exit_code == 0, ran.output
    plan = read_plan(out)
    assert plan.layout.schedule in ("gpipe", "1f1b") and plan.layout.p2p_overlap is False
    pytest.importorskip("torch")
    from piper_runtime.launch import check_supported
    check_supported(plan, 4)


def test_a_model_windowed_in_every_layer_is_refused_as_a_windowed_one():
    # Mistral-7B-v0.1 imports as sliding_window 4096 in every layer (full_attention_every 0); piper-train
    # attends to the whole sequence, so it would train another model than the plan priced
    from pathlib import Path

    from piper_plan.errors import PiperError

    m = load_model(str(Path(__file__).parent / "data" / "hf" / "mistral-7b-v0.1.json"))
    assert (m.sliding_window, m.full_attention_every) == (4096, 0)
    with pytest.raises(PiperError, match=r"piper-train trains no sliding-window .*sliding_window 4096"):
        for_runtime(SearchSpace(gpus=8, global_batch=32, seq=4096), "piper-train", m)
    pytest.importorskip("torch")
    from piper_plan.plan import make_plan
    from piper_runtime.launch import check_supported

    plan = make_plan(m, load_hardware("cpu-local"), Layout(gpus=2, dp=2, global_batch=4, seq=32,
                                                           fused_kernels=False, overlap_grad_reduce=False))
    with pytest.raises(PiperError, match="model.sliding_window: piper-train trains no"):
        check_supported(plan, 2)


@pytest.mark.parametrize("update,field", [
    ({"sliding_window": 4, "full_attention_every": 2}, "sliding_window"),
    ({"attention_chunk": 8, "full_attention_every": 4}, "attention_chunk"),
    ({"learned_positions": True}, "learned_positions"),
    ({"rope_scaling": "yarn"}, "rope_scaling"),  # (Kimi K2, DeepSeek-V2/V3: it had trained plain RoPE unsaid)
])
def test_a_model_feature_piper_train_does_not_build_is_refused_before_the_search_and_at_launch(tmp_path, update,
                                                                                                  field):
    # a run without the feature trains another model than the plan priced (it had run bit-identically
    # to the model without it, under the windowed model's hash)
    pytest.importorskip("torch")
    from piper_plan.errors import PiperError
    from piper_plan.plan import make_plan
    from piper_runtime.launch import check_supported

    m = load_model("tiny-moe").model_copy(update=update)
    with pytest.raises(PiperError, match=f"piper-train trains no .*{field}"):
        for_runtime(SearchSpace(gpus=2, global_batch=4, seq=32), "piper-train", m)
    plan = make_plan(m, load_hardware("cpu-local"), Layout(gpus=2, dp=2, ep=2, global_batch=4, seq=32,
                                                           fused_kernels=False, overlap_grad_reduce=False))
    with pytest.raises(PiperError, match=f"model.{field}: piper-train trains no"):
        check_supported(plan, 2)
    r = CliRunner().invoke(main, ["search", "-m", "gpt-oss-20b", "-H", "cpu-local", "-n", "8",
                                  "--runtime", "piper-train", "-o", str(tmp_path / "p.json")])
    assert r.exit_code != 0 and "piper-train trains no" in r.output and not (tmp_path / "p.json").exists()


def test_estimate_prices_a_layout_as_piper_train_runs_it_and_refuses_what_it_cannot_run(tmp_path):
    # estimate had no --runtime: its plans were priced for fused kernels and an overlapped reduction,
    # which piper-train refuses at launch (its message had named an option estimate did not have)
    pytest.importorskip("torch")
    import json

    from piper_plan.plan import read_plan
    from piper_runtime.launch import check_supported

    base = ["estimate", "-m", "tiny-moe", "-H", "cpu-local", "-n", "4", "--ep", "2", "--global-batch", "8",
            "--runtime", "piper-train"]
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(main, base + ["--json", "-o", str(out)])
    assert r.exit_code == 0, r.output
    lay = json.loads(r.output)["layout"]
    assert not lay["fused_kernels"] and not lay["overlap_grad_reduce"]
    check_supported(read_plan(out), 4)  # the launch check passes
    for extra, said in ((["--zero", "3"], "layout.zero = 3: piper-train implements ZeRO stages 0, 1 and 2"),
                        (["--a2a", "dedup"], "layout.a2a = dedup:"),
                        (["--pp", "2", "--schedule", "zbv", "--zero", "2"], "layout.zero: ZeRO-2 reduces"),
                        (["--kernels", "fused"], "layout.fused_kernels: piper-train does not run fused kernels; "
                                                 "use --kernels unfused")):
        r = CliRunner().invoke(main, base + extra)
        assert r.exit_code == 2 and r.output.startswith(f"error: --runtime piper-train: {said}"), r.output
        assert len(r.output.strip().splitlines()) == 1


def test_estimate_for_piper_train_refuses_an_uneven_tensor_parallel_split_and_prices_fp32_gradients():
    # the launch's tp splits (runtimes.tp_refusal) had not been read: a plan was written that
    # piper-train then refused; and --grad-dtype bf16 had been priced though piper-train reduces fp32
    import json

    base = ["estimate", "-m", "tiny-moe", "-H", "cpu-local", "-n", "2", "--runtime", "piper-train"]
    r = CliRunner().invoke(main, base + ["--tp", "2", "--seq", "63", "--no-sequence-parallel"])
    assert r.exit_code == 2 and r.output.strip() == ("error: --runtime piper-train: layout.mbs*seq (tokens split "
                                                     "over tp before routing): 63 is not divisible by tp=2")
    r = CliRunner().invoke(main, base + ["--grad-dtype", "bf16"])
    assert r.exit_code == 2 and "piper-train reduces fp32 gradients; use --grad-dtype fp32" in r.output
    r = CliRunner().invoke(main, base + ["--json"])
    assert r.exit_code == 0 and json.loads(r.output)["layout"]["grad_dtype"] == "fp32"
