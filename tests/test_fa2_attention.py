"""A stack that runs FlashAttention-2 where the hardware spec's attention plateau is another
kernel's (PyTorch SDPA on Hopper, torch 2.5.1-2.10: torchtitan) is priced at FlashAttention-2's
own plateaus (Layout.attention_kernel fa2, efficiency.attention_fa2); a spec that states none
refuses it in one line, as does FP8 attention beside it."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

from piper_plan.cli import main
from piper_plan.cost.kernels import flash_attention_bwd_time, flash_attention_time, head_dim_slowdown
from piper_plan.errors import LayoutError, SpecError
from piper_plan.evaluate import estimate_layout
from piper_plan.layout import Layout, check_layout
from piper_plan.specs import load_hardware, load_model

LLAMA = dict(gpus=8, tp=1, pp=1, dp=8, mbs=1, global_batch=64, seq=8192, zero=1)


def step(hw, kernel, **kw):
    lay = Layout(**{**LLAMA, **kw}, attention_kernel=kernel)
    return estimate_layout(load_model("llama3-8b"), load_hardware(hw), lay).row(0)["step_time_s"]


def test_fa2_runs_at_its_measured_rate_against_cudnn_s_on_an_h100():
    # FlashAttention-3 paper, H100, head dim 128, seq 4k: FA2 319 vs cuDNN 518 TFLOPS forward, 310 vs 499 backward
    h100 = load_hardware("dgx-h100")
    flops, ovh = np.array([1e15]), h100.efficiency.kernel_overhead_us * 1e-6

    def ratio(fn, *rows):
        fa2, flash = (fn(h100, flops, *rows, "bf16", 128, 128, k) - ovh for k in ("fa2", "flash"))
        return fa2 / flash
    assert ratio(flash_attention_time) == pytest.approx(518 / 319, rel=2e-3)
    assert ratio(flash_attention_bwd_time, 0) == pytest.approx(499 / 310, rel=2e-3)


def test_narrow_heads_slow_fa2_by_its_own_softmax_share():
    h100 = load_hardware("dgx-h100")  # non-causal forward at 4k: FA2 368 TFLOPS at head dim 128, 321 at 64
    assert head_dim_slowdown(h100, 64, 64, "fa2") == pytest.approx(368 / 321, rel=1e-3)
    assert head_dim_slowdown(h100, 64, 64) == pytest.approx(1.49)  # cuDNN's: 609 / 408 on the same charts


def test_fa2_slows_an_h100_step_but_not_an_a100_one_whose_flash_is_fa2():
    assert step("dgx-h100", "flash") < step("dgx-h100", "fa2") < step("dgx-h100", "eager")
    assert step("dgx-h200", "flash") < step("dgx-h200", "fa2")
    assert step("dgx-a100-80gb", "fa2") == step("dgx-a100-80gb", "flash")


def test_a_spec_without_a_flashattention2_plateau_refuses_it_in_one_line():
    with pytest.raises(SpecError, match="efficiency.attention_fa2"):
        step("dgx-b200", "fa2")
    for cmd in (["estimate", "-n", "8"], ["search", "-n", "8"], ["sweep", "--gpus", "8,16"]):
        r = CliRunner().invoke(main, [cmd[0], "-m", "llama3-8b", "-H", "dgx-b200", *cmd[1:], "--attention", "fa2"])
        assert r.exit_code != 0 and len(r.output.strip().splitlines()) == 1, (cmd, r.output)
        assert "dgx-b200.yaml: efficiency.attention_fa2: expected FlashAttention-2" in r.output


def test_fa2_beside_fp8_attention_is_refused_and_beside_context_parallelism_runs():
    with pytest.raises(LayoutError, match="attention_fp8 needs attention flash"):
        check_layout(Layout(**LLAMA, attention_kernel="fa2", attention_fp8=True), 32)
    r = CliRunner().invoke(main, ["search", "-m", "llama3-8b", "-H", "dgx-h100", "-n", "8", "--attention", "fa2",
                                  "--attention-fp8"])
    assert r.exit_code != 0 and "--attention-fp8: with --attention fa2: expected --attention flash" in r.output
    check_layout(Layout(**{**LLAMA, "dp": 4}, cp=2, attention_kernel="fa2"), 32)  # ring attention over FA2
    with pytest.raises(LayoutError, match="cp > 1 needs fused attention"):
        check_layout(Layout(**{**LLAMA, "dp": 4}, cp=2, attention_kernel="eager"), 32)


def test_search_writes_the_kernel_it_priced_into_the_plan(tmp_path):
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(main, ["search", "-m", "llama3-8b", "-H", "dgx-h100", "-n", "8", "--attention", "fa2",
                                  "-o", str(out)])
    assert r.exit_code == 0, r.output
    plan = json.loads(out.read_text())
    assert plan["layout"]["attention_kernel"] == "fa2"
    lay = Layout(**plan["layout"])
    assert step("dgx-h100", "fa2", **{k: getattr(lay, k) for k in LLAMA if k != "zero"}, zero=lay.zero) == \
        pytest.approx(plan["predicted"]["step_time_s"])


HEAD = "id,group,model,hardware,gpus,seq,metric,value,tp,pp,dp,mbs,gbs,zero_stage,attention_kernel"


def test_validate_reads_a_row_s_attention_kernel_and_refuses_an_unknown_one(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(HEAD + "\na,g,llama3-8b,H100,8,8192,tokens_per_s_per_gpu,6000,1,1,8,1,8,3,\n"
                 "b,g,llama3-8b,H100,8,8192,tokens_per_s_per_gpu,6000,1,1,8,1,8,3,fa2\n")
    r = CliRunner().invoke(main, ["validate", "--table", str(p), "--json"])
    assert r.exit_code == 0, r.output
    pred = {x["id"]: x["predicted"] for x in json.loads(r.output)["rows"]}
    assert pred["b"] < pred["a"]  # FlashAttention-2 on an H100: fewer tokens a second
    p.write_text(HEAD + "\na,g,llama3-8b,H100,8,8192,tokens_per_s_per_gpu,6000,1,1,8,1,8,3,fa3\n")
    r = CliRunner().invoke(main, ["validate", "--table", str(p)])
    assert r.exit_code != 0 and "attention_kernel: expected one of flash, fa2, eager" in r.output


def test_a_plateau_with_a_misspelt_key_is_refused(tmp_path):
    p = tmp_path / "h.yaml"
    p.write_text("base: dgx-b200\nefficiency: {attention_fa2: {forward: 0.3, bwd: 0.3}}\n")
    with pytest.raises(SpecError, match="bwd"):
        load_hardware(str(p))
    # a spec that states no plateau dumps as it did before the field existed (its plan hash holds)
    assert "attention_fa2" not in load_hardware("dgx-b200").model_dump()["efficiency"]


def test_flash_and_fa2_layouts_priced_together_keep_their_own_kernels():
    from piper_plan.cost.batch import from_layouts
    from piper_plan.cost.estimate import evaluate

    m, h100 = load_model("llama3-8b"), load_hardware("dgx-h100")
    lays = [Layout(**LLAMA, attention_kernel=k) for k in ("flash", "fa2")]
    together = evaluate(m, h100, from_layouts(lays))
    alone = [evaluate(m, h100, from_layouts([x])).row(0)["step_time_s"] for x in lays]
    assert [together.row(i)["step_time_s"] for i in range(2)] == pytest.approx(alone)
    assert alone[0] < alone[1]


def test_the_sensitivity_scan_moves_fa2_s_plateau_with_the_attention_family():
    from piper_plan.validate_sensitivity import scaled

    fa = scaled(load_hardware("dgx-h100"), ("attention",), 1.25).efficiency.attention_fa2
    assert (fa.forward, fa.backward, fa.softmax_share) == pytest.approx((0.344 * 1.25, 0.265 * 1.25, 0.146))


def test_a_torchtitan_row_that_states_no_kernel_runs_what_its_torch_runs_on_its_gpu(tmp_path):
    head = ("id,group,source,model,hardware,gpus,seq,metric,value,tp,pp,dp,mbs,gbs,zero_stage,fsdp2,cross_entropy,"
            "attention_kernel,notes")
    # one FSDP and one loss for every row (a PyTorch-native row would run torch FSDP2's and torch's cross-entropy
    # by default): the kernel alone differs
    run = "llama3-8b,{hw},8,8192,tokens_per_s_per_gpu,6000,1,1,8,1,8,3,no,fused"
    lines = [f"fa2,t,torchtitan,{run.format(hw='H100')},fa2,",
             f"titan,torchtitan,docs/performance.md,{run.format(hw='H100')},,pytorch version: 2.7.0a0",
             f"new,bench,torchtitan benchmarks,{run.format(hw='H100')},,torch 2.11.0 nightly",
             f"flash,t,torchtitan,{run.format(hw='H100')},flash,",
             f"mcore,t,Megatron-Bridge docs,{run.format(hw='H100')},,",
             f"a100,torchtitan,torchtitan,{run.format(hw='A100 80GB')},,",
             f"a100-flash,t,Megatron-Bridge docs,{run.format(hw='A100 80GB')},,",
             f"mi300x,torchtitan,torchtitan,{run.format(hw='MI300X')},,",
             f"mi300x-flash,t,t,{run.format(hw='MI300X')},flash,"]
    p = tmp_path / "t.csv"
    p.write_text("\n".join([head, *lines]) + "\n")
    r = CliRunner().invoke(main, ["validate", "--table", str(p), "--json"])
    assert r.exit_code == 0, r.output
    pred = {x["id"]: x["predicted"] for x in json.loads(r.output)["rows"]}
    assert pred["titan"] == pred["fa2"] < pred["flash"]  # torch 2.7 on Hopper: FlashAttention-2
    assert pred["new"] == pred["flash"] == pred["mcore"]  # torch 2.11 prefers cuDNN's; Megatron runs TE's
    assert pred["a100"] == pred["a100-flash"] and pred["mi300x"] == pred["mi300x-flash"]  # no other plateau


@pytest.mark.parametrize("notes,kernel", [
    ("versions: 'pytorch version: 2.7.0a0+gitb98af95, torchao version: 0.10.0'", "fa2"),
    ("torch 2.1.2", "fa2"), ("torch 2.5.1", "fa2"), ("PyTorch 2.10", "fa2"),
    ("torchtitan 0.2.0, no torch named", "fa2"),
    ("torch 2.5.0 (cuDNN's kernel first on H100)", None), ("torch 2.11.0", None), ("pytorch-2.11", None),
    ("torch v2.11", None), ("torch_version=2.11.0", None), ("PyTorch nightly (2.11.0.dev20260101)", None),
    ("torch==2.12.0; compared with a torch 2.4 run", None), ("torch.compile 2.5x faster", "fa2"),
    ("torch>=2.11", None), ("torch/2.11.0", None), ("torch.__version__ 2.11.0", None), ("PyTorch release 2.11", None),
    ("nvcr.io/nvidia/pytorch:25.01-py3 (torch 2.6.0a0)", "fa2"), ("NGC PyTorch 26.03 container, torch 2.11", None),
])
def test_the_torch_a_torchtitan_row_names_decides_its_kernel(notes, kernel):
    from piper_plan.validate import _sdpa_kernel

    row = {"group": "torchtitan", "source": "pytorch/torchtitan docs", "notes": notes}
    assert _sdpa_kernel(row, load_hardware("dgx-h100")) == kernel


def test_only_a_pytorch_native_stack_without_fp8_attention_is_read_as_fa2():
    from piper_plan.validate import _sdpa_kernel

    h100 = load_hardware("dgx-h100")
    # a Megatron row that names torchtitan in passing runs Transformer Engine's cuDNN kernel
    assert _sdpa_kernel({"group": "megatron-bridge-moe", "source": "vs torchtitan", "notes": ""}, h100) is None
    assert _sdpa_kernel({"group": "g", "source": "Megatron-Bridge docs (vs torchtitan)", "notes": ""}, h100) is None
    assert _sdpa_kernel({"group": "g", "source": "torchtitan", "notes": "", "attention_fp8": "yes"}, h100) is None
    # a torchtitan group's row that names Megatron in its source (a baseline it beat) still ran torch's SDPA
    assert _sdpa_kernel({"group": "torchtitan", "source": "torchtitan (vs Megatron-LM)", "notes": ""}, h100) == "fa2"
    assert _sdpa_kernel({"group": "g", "source": "torchtitan", "notes": ""}, load_hardware("dgx-b200")) is None


def test_a_row_s_kernel_holds_when_its_layout_is_searched_and_fp8_attention_beside_fa2_is_refused(tmp_path):
    head = "id,group,source,model,hardware,gpus,seq,metric,value,gbs,cross_entropy,attention_kernel,attention_fp8"
    run = "llama3-8b,H100,8,8192,tokens_per_s_per_gpu,6000,64,fused"  # one loss for all: the kernel alone differs
    p = tmp_path / "t.csv"
    p.write_text("\n".join([head, f"blank,torchtitan,torchtitan,{run},,", f"fa2,g,s,{run},fa2,",
                            f"flash,g,s,{run},flash,"]) + "\n")
    r = CliRunner().invoke(main, ["validate", "--table", str(p), "--json"])
    assert r.exit_code == 0, r.output
    rows = {x["id"]: x for x in json.loads(r.output)["rows"]}
    assert rows["blank"]["predicted"] == rows["fa2"]["predicted"] < rows["flash"]["predicted"]
    assert rows["fa2"]["layout"].endswith("attn=fa2") and "attn=" not in rows["flash"]["layout"]
    p.write_text("\n".join([head, f"a,g,s,{run},fa2,yes"]) + "\n")
    r = CliRunner().invoke(main, ["validate", "--table", str(p)])
    assert r.exit_code != 0 and len(r.output.strip().splitlines()) == 1
    assert "row a: layout: attention_fp8 needs attention flash" in r.output


def test_a_layer_table_row_may_run_fa2_where_the_spec_states_it(tmp_path):
    head = "experiment,model_spec,hardware_spec,tp,mbs,seq,recompute,sequence_parallel,forward_ms,backward_ms,attention"
    p = tmp_path / "layer.csv"
    p.write_text(head + "\nh100,llama3-8b,dgx-h100,1,1,8192,none,no,10,20,fa2\n"
                 "h100f,llama3-8b,dgx-h100,1,1,8192,none,no,10,20,flash\n")
    r = CliRunner().invoke(main, ["validate", "--layer-table", str(p), "--json"])
    assert r.exit_code == 0, r.output
    p.write_text(head + "\nb200,llama3-8b,dgx-b200,1,1,8192,none,no,10,20,fa2\n")
    r = CliRunner().invoke(main, ["validate", "--layer-table", str(p)])
    assert r.exit_code != 0 and "efficiency.attention_fa2" in r.output and len(r.output.strip().splitlines()) == 1


def test_a_row_that_states_only_its_kernel_still_takes_its_recipe_from_its_nearest_row():
    # context-parallel.csv's NeMo 24.03 rows state attention_kernel fa2 and no recipe column: the rest
    # of their recipe (tensor-parallel overlap, gradient dtype, FP8 weights) still comes from the
    # nearest bundled row of their stack, as it did before they stated the kernel
    from piper_plan import validate as V

    rows = {r.id: r for r in V.run(path=V.data_path().parent / "context-parallel.csv")}
    nemo = [r for i, r in rows.items() if i.startswith("nemo-llama2-7b-h100")]
    assert len(nemo) == 6 and all(r.recipe_from and r.recipe_from.startswith("mb-llama") for r in nemo)
