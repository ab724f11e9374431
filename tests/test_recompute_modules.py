"""Layout.recompute_modules (Megatron-Core --recompute-modules): each module drops the tensors it
would have saved and re-runs its forward in the backward; core_attn alone is plain selective."""
import numpy as np
import pytest

from piper_plan.cost import activations as act
from piper_plan.cost.batch import from_layouts
from piper_plan.cost.estimate import evaluate
from piper_plan.layout import Layout
from piper_plan.specs.registry import load_hardware, load_model

BASE = dict(gpus=16, pp=2, ep=8, global_batch=256, seq=4096)


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
    m, hw = qwen
    batch, est = _pair(m, hw, ("core_attn", "moe"))
    mo = act.moe_terms(m, batch, np.ones(2))
    kept = {k for k, v in mo.items() if v[1] > 0}
    assert kept == {"moe_norm_in"}
    # the forward's dispatch and combine run again in the backward
    assert est.time["a2a"][1] > est.time["a2a"][0]


def test_without_core_attn_the_attention_scores_are_not_recomputed():
    m = load_model("gpt-22b")
    lays = [Layout(gpus=8, tp=8, global_batch=4, mbs=4, seq=2048, attention_kernel="eager", recompute="selective",
                   recompute_modules=x) for x in (("core_attn",), ("layernorm",))]
    a = act.attention_terms(m, from_layouts(lays))
    assert a["probs"][0] == 0.0 and a["probs"][1] > 0  # scores saved again once core_attn is off the list
