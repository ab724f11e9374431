"""Weights every tensor-parallel rank holds whole are priced whole: MLA's down-projections and
their norms, and GQA's key/value projections where tp exceeds the kv heads. The planner's
per-rank attention parameters equal what piper-train's own modules hold on a rank."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from piper_plan.cost.batch import from_layouts  # noqa: E402
from piper_plan.cost.estimate import evaluate  # noqa: E402
from piper_plan.layout import Layout  # noqa: E402
from piper_plan.specs import load_hardware, load_model  # noqa: E402
from piper_plan.specs.model import ModelSpec  # noqa: E402
from piper_runtime.layers import FFN, Attention, MLAttention  # noqa: E402
from piper_runtime.tp import TP  # noqa: E402


def _held(module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("heads,kv,tp,bias", [(16, 2, 8, False), (16, 4, 8, True), (16, 8, 8, False),
                                              (16, 8, 4, True), (16, 1, 16, False)])
def test_gqa_rank_holds_what_the_planner_prices(heads, kv, tp, bias):
    spec = ModelSpec(name="x", num_layers=2, hidden_size=256, num_heads=heads, num_kv_heads=kv, vocab_size=256,
                     seq_len=64, ffn_size=512, linear_bias=bias)
    with torch.device("meta"):
        held = _held(Attention(spec, 64, TP(size=tp, rank=tp - 1)))
    assert spec.attn_params_per_rank(tp) == pytest.approx(held, rel=1e-12)


@pytest.mark.parametrize("gated", [True, False])
def test_dense_ffn_rank_holds_its_down_bias_whole(gated):
    spec = ModelSpec(name="x", num_layers=2, hidden_size=256, num_heads=16, num_kv_heads=8, vocab_size=256,
                     seq_len=64, ffn_size=512, linear_bias=True, ffn_gated=gated)
    with torch.device("meta"):
        held = _held(FFN(256, 512, gated, True, TP(size=4, rank=1)))
    assert (spec.dense_ffn_params - spec.dense_ffn_whole) / 4 + spec.dense_ffn_whole == held


@pytest.mark.parametrize("q_lora", [1536, 0])
@pytest.mark.parametrize("tp", [1, 2, 8])
def test_mla_rank_holds_its_down_projections_whole(tp, q_lora):
    base = load_model("deepseek-v3")
    spec = base.model_copy(update={"mla": base.mla.model_copy(update={"q_lora_rank": q_lora})})
    with torch.device("meta"):
        held = _held(MLAttention(spec, 64, TP(size=tp, rank=0)))
    assert spec.attn_params_per_rank(tp) == pytest.approx(held, rel=1e-12)
    assert spec.attn_params_per_rank(tp) > spec.attn_params / tp or tp == 1


def test_deepseek_v3_tp8_weights_count_the_replicated_mla_projections():
    """A middle stage of DeepSeek-V3 at tp 8 holds 8 MoE layers' MLA down-projections whole:
    each layer's (1 - 1/8) of them more than a tp-split count gives."""
    m, hw = load_model("deepseek-v3"), load_hardware("dgx-h100")
    lay = Layout(gpus=1024, tp=8, pp=8, dp=16, ep=64, global_batch=1024, seq=4096)
    est = evaluate(m, hw, from_layouts([lay]))
    mid = est.row(0)["memory_gib_per_stage"][1]
    whole = float(m.attn_params_whole(8))
    per_layer = (m.attn_params - whole) / 8 + whole + m.shared_params / 8 + 2 * m.norm_params + m.router_params
    experts = m.moe.num_experts / 64 * m.expert_params
    layers = round(mid["weights"] * 2**30 / 2 / (per_layer + experts))
    assert layers * (per_layer + experts) * 2 / 2**30 == pytest.approx(mid["weights"], abs=1e-4)  # the row rounds to 0.1 MiB
    assert np.isclose(whole, 1536 * 7168 + 1536 + 7168 * (512 + 64) + 512)
