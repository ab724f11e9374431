"""What a fused (Transformer Engine / Megatron-Core) layer saves for its backward: FP8 GEMM
inputs as their quantised copy, and no expert output where the routing probability is applied
inside the experts' activation."""
import numpy as np
import pytest

from piper_plan.cost import activations as act
from piper_plan.cost.batch import from_layouts
from piper_plan.layout import Layout
from piper_plan.specs import load_model


def _terms(m, **kw):
    lay = from_layouts([Layout(gpus=8, dp=8, ep=8, mbs=2, global_batch=16, seq=4096, **kw)])
    t = {**act.attention_terms(m, lay), **act.moe_terms(m, lay, imb=1.0)}
    return {k: float(v[0]) for k, v in t.items()}


@pytest.mark.parametrize("fp8,per_elem", [("current", 1.0), ("mxfp8", 1 + 1 / 32), ("blockwise", 1 + 4 / 128)])
def test_fp8_saves_gemm_inputs_as_their_quantised_copy(fp8, per_elem):
    m = load_model("qwen3-30b-a3b")
    bf, q = _terms(m), _terms(m, fp8=fp8)
    # the expert GEMMs' inputs: 2 bytes an element in bf16, 1 plus the recipe's scales in FP8
    for k in ("expert_in", "expert_act", "qkv_in"):
        assert q[k] == pytest.approx(bf[k] * per_elem / 2)
    # what no GEMM takes as its input, or what the attention kernel keeps, stays in bf16
    for k in ("expert_hidden", "expert_out", "attn_out", "qkv", "router_in", "moe_norm_in"):
        assert q[k] == bf[k]
    # the output projection's own quantised copy of the attention output exists only under FP8
    assert bf["proj_in_fp8"] == 0 and q["proj_in_fp8"] == pytest.approx(bf["attn_out"] * per_elem / 2)
    saved = (1 - per_elem / 2) * sum(bf[k] for k in ("expert_in", "expert_act", "qkv_in")) - q["proj_in_fp8"]
    assert sum(bf.values()) - sum(q.values()) == pytest.approx(saved) and saved > 0.1 * sum(bf.values())


def test_probabilities_in_the_activation_keep_no_expert_output():
    m = load_model("qwen3-30b-a3b")
    comb, inact = _terms(m), _terms(m, expert_probs="activation")
    rows = 2 * 4096 * m.moe.top_k
    assert comb["expert_out"] == 2.0 * rows * m.hidden_size and inact["expert_out"] == 0
    assert {k: v for k, v in comb.items() if k != "expert_out"} == {k: v for k, v in inact.items() if k != "expert_out"}
    # piper-train's eager modules combine with the weights whatever the layout says
    eager = _terms(m, expert_probs="activation", fused_kernels=False)
    assert eager["expert_out"] == comb["expert_out"]


def test_expert_probs_travels_through_the_batch_and_the_cli():
    import json

    from click.testing import CliRunner

    from piper_plan.cli import main

    lay = Layout(gpus=8, dp=8, ep=8, global_batch=16, seq=4096, expert_probs="activation")
    assert from_layouts([lay]).layout(0).expert_probs == "activation"
    args = ["estimate", "-m", "qwen3-30b-a3b", "-H", "dgx-h100", "-n", "8", "--ep", "8", "--global-batch", "64",
            "--mbs", "2", "--json"]
    peak = {}
    for probs in ("combine", "activation"):
        r = CliRunner().invoke(main, args + ["--expert-probs", probs])
        assert r.exit_code == 0, r.output
        peak[probs] = json.loads(r.output)["peak_memory_gib"]
    assert peak["activation"] < peak["combine"]
    assert np.isfinite(peak["activation"])


def test_probabilities_in_the_activation_need_the_fused_stack():
    from click.testing import CliRunner

    from piper_plan.cli import main
    from piper_plan.errors import LayoutError
    from piper_plan.layout import check_layout

    lay = Layout(gpus=8, dp=8, ep=8, global_batch=16, seq=4096, expert_probs="activation", fused_kernels=False)
    with pytest.raises(LayoutError, match="fused kernels"):
        check_layout(lay, num_layers=48, num_experts=128)
    for cmd in (["estimate", "--ep", "8"], ["search"]):
        r = CliRunner().invoke(main, cmd + ["-m", "qwen3-30b-a3b", "-H", "dgx-h100", "-n", "8", "--global-batch", "64",
                                            "--kernels", "unfused", "--expert-probs", "activation"])
        assert r.exit_code != 0 and "expert" in r.output and len(r.output.strip().splitlines()) == 1


def test_a_layouts_expert_output_does_not_depend_on_the_layouts_priced_beside_it():
    # per-layer costs are priced once per key of the columns they read: expert_probs is one of
    # them, so a batch mixing both keeps each layout's own saved expert outputs
    from piper_plan.cost.estimate import evaluate
    from piper_plan.specs import load_hardware

    m, hw = load_model("mixtral-8x7b"), load_hardware("dgx-h100")
    base = dict(gpus=64, tp=2, pp=4, dp=8, ep=8, mbs=1, global_batch=1024, seq=4096)
    lays = [Layout(**base, expert_probs=p) for p in ("combine", "activation")]
    alone = [evaluate(m, hw, from_layouts([x])).memory["first"]["activations"][0] for x in lays]
    for order in (lays, lays[::-1]):
        together = evaluate(m, hw, from_layouts(order)).memory["first"]["activations"]
        assert sorted(together) == pytest.approx(sorted(alone), rel=1e-12)
    assert alone[1] < alone[0]
