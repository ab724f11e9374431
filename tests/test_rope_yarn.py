"""YaRN RoPE: Megatron fuses only plain RoPE, so a YaRN model pays the unfused passes."""
import numpy as np
import pytest

from piper_plan.cost import host
from piper_plan.cost.batch import from_layouts
from piper_plan.cost.compute import UNFUSED_ROPE, attention_phase
from piper_plan.cost.kernels import stream_time
from piper_plan.layout import Layout
from piper_plan.specs import load_hardware, load_model
from piper_plan.specs.hf import model_from_hf_config


def _lay(**kw):
    return from_layouts([Layout(gpus=8, dp=8, ep=8, mbs=2, global_batch=16, seq=4096, **kw)])


def test_the_hf_import_reads_yarn_and_the_bundled_specs_say_it():
    import json
    from pathlib import Path

    cfg = json.loads((Path(__file__).parent / "data" / "hf" / "gpt-oss-120b.json").read_text())
    assert model_from_hf_config(cfg, "gpt-oss-120b/config.json").rope_scaling == "yarn"
    assert load_model("gpt-oss-120b").rope_scaling == "yarn" and load_model("deepseek-v3").rope_scaling == "yarn"
    assert load_model("qwen3-30b-a3b").rope_scaling is None and load_model("llama3-8b").rope_scaling is None


def test_yarn_rope_costs_the_unfused_passes_on_the_fused_stack_only():
    hw = load_hardware("gb300-nvl72")
    yarn = load_model("gpt-oss-120b")
    plain = yarn.model_copy(update={"rope_scaling": None})
    fused, eager = _lay(), _lay(fused_kernels=False, expert_probs="combine")
    extra = attention_phase(yarn, hw, fused, "bf16").v - attention_phase(plain, hw, fused, "bf16").v
    # q (64 heads) and k (8) of 64 dims over 8192 tokens, bf16: 10 more accesses and 10 more
    # kernels forward, 6 and 8 backward
    qk = 8192 * (64 + 8) * 64 * 2.0
    (af, kf), (ab, kb) = UNFUSED_ROPE["f"], UNFUSED_ROPE["b"]
    assert extra[0, 0] == pytest.approx(stream_time(hw, (af - 2) * qk, 2 * kf - 2))
    assert extra[1, 0] == pytest.approx(stream_time(hw, (ab - 4) * qk, 2 * kb - 2))
    assert extra[2, 0] == 0.0  # no weight gradient
    assert np.allclose(attention_phase(yarn, hw, eager, "bf16").v, attention_phase(plain, hw, eager, "bf16").v)


def test_mla_applies_its_own_rope_so_yarn_costs_nothing_apart():
    hw = load_hardware("dgx-h100")
    m = load_model("deepseek-v3")
    lay = from_layouts([Layout(gpus=256, dp=256, ep=256, global_batch=256, seq=4096)])
    plain = m.model_copy(update={"rope_scaling": None})
    assert np.allclose(attention_phase(m, hw, lay, "bf16").v, attention_phase(plain, hw, lay, "bf16").v)
    assert np.allclose(host.layer_ops(m, lay)[1], host.layer_ops(plain, lay)[1])


def test_the_host_issues_the_unfused_ropes_operations_unless_attention_is_graphed():
    yarn = load_model("gpt-oss-120b")
    plain = yarn.model_copy(update={"rope_scaling": None})
    eager, graphed = _lay(), _lay(cuda_graphs=("attn",))
    assert host.layer_ops(yarn, eager)[1][0] - host.layer_ops(plain, eager)[1][0] == 10.0
    assert host.layer_ops(yarn, graphed)[1][0] == host.layer_ops(plain, graphed)[1][0]


def test_a_learned_position_table_leaves_the_blocks_no_rotary_pass():
    """Megatron GPT adds its learned positions to the embedding once; its blocks rotate nothing,
    so their forward elementwise bytes are the norm's and the residual's alone."""
    from piper_plan.cost.kernels import stream_time as stream

    hw, gpt = load_hardware("dgx-a100-80gb"), load_model("gpt-1.7b")
    assert gpt.learned_positions
    rotary = gpt.model_copy(update={"learned_positions": False})
    lay = from_layouts([Layout(gpus=8, dp=8, mbs=2, global_batch=16, seq=2048)])  # tp 1, no dropout
    own, rotated = (attention_phase(x, hw, lay, "bf16").v[0, 0] for x in (gpt, rotary))
    t, d, rope = 2 * 2048, 2304, 2 * (24 + 24) * 96  # tokens; hidden; q's and k's elements a token
    with_rope, without = stream(hw, t * (5 * d + rope) * 2.0, 4), stream(hw, t * 5 * d * 2.0, 4)
    assert rotated - own == pytest.approx(float(with_rope - without))
