"""Layout.recompute_modules (Megatron-Core --recompute-modules): each module drops the tensors it
would have saved and re-runs its forward in the backward; core_attn alone is plain selective."""
import numpy as np
import pytest

from piper_plan.cost import activations as act
from piper_plan.cost.batch import from_layouts
from piper_plan.cost.estimate import evaluate
from piper_plan.layout import Layout
from piper_plan.specs.registry import load_hardware, load_model

BASE = dict(gpus=16, pp=2, dp=8, ep=8, global_batch=256, seq=4096)  # (dp 8: tp·pp·dp = gpus)


@pytest.fixture(scope="module")
def qwen():
    return load_model("qwen3-30b-a3b"), load_hardware("dgx-h100")


def _pair(m, hw, mods):
    lays = [Layout(**BASE, recompute="selective", recompute_modules=x) for x in (("core_attn",), mods)]
    batch = from_layouts(lays)
    return batch, evaluate(m, hw, batch)


def test_moe_act_drops_the_activation_fed_to_the_down_projection(qwen):
    m, hw = qwen
    batch, est = _pair(m, hw, ("core_attn", "moe_act"))
    terms = act.moe_terms(m, batch, np.ones(2), hw.accelerator.expert_row_multiple)
    rows = 4096 * m.moe.top_k  # one micro-batch, tp 1: every token's k copies
    assert terms["expert_act"][0] == pytest.approx(2.0 * rows * m.moe.expert_ffn_size, rel=1e-9)
    assert terms["expert_act"][1] == 0.0
    others = {k: v for k, v in terms.items() if k != "expert_act"}
    assert all(v[0] == v[1] for v in others.values())
    assert est.peak_memory_gib[1] < est.peak_memory_gib[0]
    assert est.step_time_s[1] > est.step_time_s[0]  # the activation re-runs in the backward


def test_layernorm_drops_the_norm_outputs(qwen):
    m, hw = qwen
    batch, _ = _pair(m, hw, ("core_attn", "layernorm"))
    a, mo = act.attention_terms(m, batch), act.moe_terms(m, batch, np.ones(2))
    assert a["qkv_in"][0] > 0 and a["qkv_in"][1] == 0.0 and a["attn_norm_in"][1] == a["attn_norm_in"][0]
    assert mo["router_in"][0] > 0 and mo["router_in"][1] == 0.0


def test_moe_recompute_keeps_only_the_block_input_and_repeats_its_all_to_all(qwen):
    # Megatron-Core's MoE checkpoint saves what the block is called with, the pre-MLP norm's
    # output (t/tp x d in the activation dtype), besides the norm's own input; layernorm
    # recompute discards that output too, leaving the norm's input alone
    m, hw = qwen
    batch, est = _pair(m, hw, ("core_attn", "moe"))
    mo = act.moe_terms(m, batch, np.ones(2))
    kept = {k for k, v in mo.items() if v[1] > 0}
    assert kept == {"moe_norm_in", "router_in"}
    assert mo["router_in"][1] == 2.0 * 4096 * m.hidden_size  # bf16, tp 1: one micro-batch's tokens
    with_ln = from_layouts([Layout(**BASE, recompute="selective", recompute_modules=("core_attn", "moe", "layernorm"))])
    assert {k for k, v in act.moe_terms(m, with_ln, np.ones(1)).items() if v[0] > 0} == {"moe_norm_in"}
    # the forward's dispatch and combine run again in the backward
    assert est.time["a2a"][1] > est.time["a2a"][0]


def test_without_core_attn_the_attention_scores_are_not_recomputed():
    m = load_model("gpt-22b")
    lays = [Layout(gpus=8, tp=8, global_batch=4, mbs=4, seq=2048, attention_kernel="eager", recompute="selective",
                   recompute_modules=x) for x in (("core_attn",), ("layernorm",))]
    a = act.attention_terms(m, from_layouts(lays))
    assert a["probs"][0] == 0.0 and a["probs"][1] > 0  # scores saved again once core_attn is off the list


def test_the_search_tries_each_selective_module_set_as_a_choice_of_its_own():
    from piper_plan.search import SearchSpace, search

    m, hw = load_model("qwen3-30b-a3b"), load_hardware("dgx-h100")
    base = SearchSpace(gpus=16, global_batch=256, seq=4096, schedules=("1f1b",))
    sets = (("core_attn",), ("moe_act", "layernorm"), ("moe",))
    one, many = search(m, hw, base), search(m, hw, SearchSpace(**{**base.__dict__, "selective": sets}))
    sel = many.batch.recompute == 1
    # every selective candidate of the default search, once per module set
    assert int(sel.sum()) == 3 * int((one.batch.recompute == 1).sum())
    found = {many.batch.layout(int(i)).recompute_modules for i in np.flatnonzero(sel)}
    assert found == {tuple(sorted(s, key=("core_attn", "layernorm", "mla_up_proj", "mlp", "moe_act", "moe",
                                             "shared_experts").index)) for s in sets}
    # a larger space never finds a worse best plan
    assert many.est.tokens_per_s[many.best] >= one.est.tokens_per_s[one.best]


def test_search_cli_takes_module_sets_and_names_them_in_its_table():
    from click.testing import CliRunner

    from piper_plan.cli import main

    args = ["search", "-m", "qwen3-30b-a3b", "-H", "dgx-h100", "-n", "16", "--global-batch", "256",
            "--schedules", "1f1b", "--top", "200"]
    r = CliRunner().invoke(main, args + ["--selective", "core_attn", "--selective", "moe_act,layernorm"])
    assert r.exit_code == 0, r.output
    assert "rc=selective(layernorm,moe_act)" in r.output.replace("\n", "")
    bad = CliRunner().invoke(main, args + ["--selective", "moe,bogus"])
    assert bad.exit_code != 0 and "--selective" in bad.output and len(bad.output.strip().splitlines()) == 1


def test_xmoe_attention_block_checkpoint_keeps_only_the_layer_input_and_reruns_its_collective():
    # X-MoE (Megatron-DeepSpeed fork) with --checkpoint-attention --checkpoint-layernorm wraps both
    # norms, the projections, the core and the residual in one checkpoint: only the layer input is
    # saved, the whole block re-runs in the backward, its tensor-parallel all-reduce included
    m, hw = load_model("xmoe-small"), load_hardware("frontier-rocm57")
    lays = [Layout(gpus=16, tp=2, dp=8, ep=8, global_batch=64, seq=2048, sequence_parallel=False,
                   recompute="selective", recompute_modules=x) for x in (("core_attn",), ("attn_block",))]
    batch = from_layouts(lays)
    est = evaluate(m, hw, batch)
    a = act.attention_terms(m, batch)
    assert {k for k, v in a.items() if v[1] > 0} == {"attn_norm_in"}
    assert a["attn_norm_in"][1] == a["attn_norm_in"][0] > 0
    mo = act.moe_terms(m, batch, np.ones(2))
    assert mo["moe_norm_in"][0] > 0 and mo["moe_norm_in"][1] == 0.0  # that norm ran inside the checkpoint
    assert mo["router_in"][1] == mo["router_in"][0] > 0                 # the block's output feeds the MoE block
    assert est.peak_memory_gib[1] < est.peak_memory_gib[0]
    assert est.time["compute"][1] > est.time["compute"][0]
    assert est.time["tp_comm"][1] > est.time["tp_comm"][0]


def test_xmoe_intermediate_checkpoint_reruns_every_expert_s_activation_and_down_projection(qwen):
    # --checkpoint-intermediate: ParallelMLP (each expert's) checkpoints its activation and fc2 from
    # fc1's output, so fc2's input is not saved and fc2's forward GEMM runs again: more than moe_act
    m, hw = qwen
    lays = [Layout(**BASE, recompute="selective", recompute_modules=x)
            for x in (("core_attn",), ("core_attn", "moe_act"), ("core_attn", "act_fc2"))]
    batch = from_layouts(lays)
    est = evaluate(m, hw, batch)
    terms = act.moe_terms(m, batch, np.ones(3), hw.accelerator.expert_row_multiple)
    assert terms["expert_act"][0] > 0 and terms["expert_act"][1] == terms["expert_act"][2] == 0.0
    assert terms["expert_hidden"][2] == terms["expert_hidden"][0] > 0  # fc1's output is the checkpoint's input
    assert est.step_time_s[0] < est.step_time_s[1] < est.step_time_s[2]


def _moe_pair(m, hw, **base):
    lays = [Layout(**base, recompute=r, recompute_modules=mods)
            for r, mods in (("none", ("core_attn",)), ("selective", ("moe",)))]
    return evaluate(m, hw, from_layouts(lays))


def test_moe_recompute_puts_its_rerun_all_to_all_in_the_step(qwen):
    """A re-run MoE block exchanges its tokens again: under 1F1B nothing hides that exchange, so
    the step grows by at least the all-to-all it adds, and no other collective changes."""
    m, hw = qwen
    est = _moe_pair(m, hw, gpus=64, tp=2, pp=4, dp=8, ep=8, global_batch=256, seq=4096, schedule="1f1b")
    assert est.time["a2a"][1] > est.time["a2a"][0]
    assert est.step_time_s[1] - est.step_time_s[0] >= est.time["a2a"][1] - est.time["a2a"][0]
    assert est.time["tp_comm"][1] == pytest.approx(est.time["tp_comm"][0], rel=1e-9)


def test_moe_recompute_never_speeds_up_a_dualpipev_step():
    """dualpipev hides the exchanges behind the other micro-batch's compute: the re-run one hides
    at most the compute it came with, so recomputing the MoE block cannot make the step faster.
    (vpp 2: the layout check refuses dualpipev on one chunk a rank, which this test once priced.)"""
    m, hw = load_model("deepseek-v3"), load_hardware("dgx-h800")
    for tp in (1, 2, 4):
        est = _moe_pair(m, hw, gpus=256, tp=tp, pp=16, dp=16 // tp, ep=16, global_batch=1024, seq=4096,
                        schedule="dualpipev", vpp=2)
        assert est.step_time_s[1] >= est.step_time_s[0]


@pytest.mark.parametrize("mods, cp", [(("attn_block", "act_fc2"), 1), (("core_attn",), 2), (("moe",), 1)])
def test_a_selective_layout_prices_alike_whatever_shares_its_batch(mods, cp):
    """The collectives a selective recompute re-runs (the attention block's tensor-parallel one,
    the core attention's context-parallel ring, the MoE block's all-to-all) are the layout's own:
    a layout without recompute but the same module list, ahead of it in a batch, takes none away."""
    m, hw = load_model("deepseek-v3"), load_hardware("dgx-h800")
    base = dict(gpus=256, tp=8, cp=cp, pp=8, dp=4 // cp, ep=16, global_batch=1024, seq=4096, recompute_modules=mods)
    sel = Layout(**base, recompute="selective")
    alone = evaluate(m, hw, from_layouts([sel])).step_time_s[0]
    after_none = evaluate(m, hw, from_layouts([Layout(**base, recompute="none"), sel])).step_time_s[1]
    assert after_none == pytest.approx(alone, rel=1e-12)


def test_a_selective_module_re_run_holds_its_internals_as_full_recompute_holds_its_layer():
    """Megatron's selective checkpoint re-runs the listed modules one layer and one micro-batch at a
    time in the backward, their internals beside everything kept, as full recompute's rebuilt layer
    is. Only full recompute had been charged that buffer, so re-running the MoE block alone priced
    less memory than re-running every layer whole (DeepSeek-V3, 1,024 Frontier GCDs: 131.8 < 139.7 GiB)."""
    m, hw = load_model("deepseek-v3"), load_hardware("frontier")
    base = dict(gpus=1024, tp=1, pp=32, dp=32, ep=16, mbs=16, schedule="gpipe", zero=2, a2a="halo",
                global_batch=1024, seq=4096)
    lays = [Layout(**base, recompute=r, recompute_modules=mods)
            for r, mods in (("none", ("core_attn",)), ("selective", ("moe",)), ("full", ("core_attn",)))]
    est = evaluate(m, hw, from_layouts(lays))
    none, sel, full = est.peak_memory_gib
    assert none > sel > full
    rebuilt = est.memory["last"]["recomputed_layer"]
    assert rebuilt[0] == 0 and rebuilt[1] > 0 and rebuilt[2] > 0
