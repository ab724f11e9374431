"""What the fused MoE phase (cost/compute.moe_phase) streams besides its GEMMs: the shared experts'
activation like a dense FFN's, and GPT-OSS's per-expert extras on the rows the experts run."""
import numpy as np
import pytest

from piper_plan.cost import compute
from piper_plan.cost.batch import from_layouts
from piper_plan.layout import Layout
from piper_plan.specs.registry import load_hardware, load_model

H100 = load_hardware("dgx-h100")


def _captured(monkeypatch, name, m, lay):
    seen = []
    real = getattr(compute, name)

    def spy(*a, **k):
        seen.append(a)
        return real(*a, **k)

    monkeypatch.setattr(compute, name, spy)
    compute.moe_phase(m, H100, from_layouts([lay]), "bf16", np.ones(1))
    return seen


def test_the_shared_experts_activation_is_streamed_as_a_dense_ffns(monkeypatch):
    m = load_model("deepseek-v3")
    bare = m.model_copy(update={"moe": m.moe.model_copy(update={"shared_experts": 0})})
    lay = Layout(gpus=64, dp=64, ep=64, mbs=1, global_batch=64, seq=4096)
    with_shared, without = (_captured(monkeypatch, "_elementwise", x, lay)[0][1] for x in (m, bare))
    fs, t = m.moe.shared_experts * m.moe.shared_ffn, 4096
    # gated: read the two halves, write the product (the dense FFN's 3·f elements a token)
    assert float(with_shared[0] - without[0]) == pytest.approx(3 * fs * t * 2)


@pytest.mark.parametrize("etp", [2, 4])
def test_gpt_oss_extras_run_on_the_rows_the_experts_gather(monkeypatch, etp):
    # expert tensor parallelism all-gathers the etp group's rows before the GEMMs; fc2's bias pass
    # and the clamp run on those rows, as the GEMMs do
    m = load_model("gpt-oss-120b")
    lay = Layout(gpus=64, dp=64, ep=8, etp=etp, mbs=1, global_batch=64, seq=4096, expert_gemm="multistream")
    (args,) = _captured(monkeypatch, "_expert_extras", m, lay)
    rows = 4096 * m.moe.top_k * etp  # the rank's tokens' routed copies, times the group's etp ranks
    assert float(np.asarray(args[3])[0]) == pytest.approx(rows)
