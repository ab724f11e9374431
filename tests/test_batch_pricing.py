"""The search prices thousands of layouts in one vectorised pass, sharing work between them (each
distinct per-layer configuration once, the pipeline once per layout across its ZeRO stages). A
layout's price must not depend on the company it is priced in: every figure equals what it gets
priced alone, as `piper-plan estimate` does."""
import numpy as np
import pytest

from piper_plan.cost.batch import from_layouts
from piper_plan.cost.estimate import Routing, evaluate
from piper_plan.plan import Migration
from piper_plan.search import SearchSpace, default_global_batch, enumerate_layouts, round_batch
from piper_plan.specs import load_hardware, load_model

SKEWED = Routing("zipf", 1.2, migration=Migration(enabled=True, period_steps=50, planner="lpt"))
JOBS = [("mixtral-8x7b", "gb200-nvl72", 32, dict(optimizer_offload=(0.0, 0.5), offload_layers=(0, 1)), None),
        ("deepseek-v3", "frontier", 1024, {}, None), ("gpt-1t", "dgx-a100-80gb", 3072, {}, None),
        ("tiny-moe", "cpu-local", 4, {}, None), ("qwen3-30b-a3b", "dgx-h100", 64, {}, SKEWED)]


def _figures(est, i):
    out = {"step": est.step_time_s[i], "peak": est.peak_memory_gib[i], "fits": est.fits[i], "imb": est.imbalance[i]}
    out.update({f"time.{k}": v[i] for k, v in est.time.items()})
    for role, comps in est.memory.items():
        out.update({f"memory.{role}.{k}": np.asarray(v)[i] for k, v in comps.items()})
    return out


@pytest.mark.parametrize("model,hardware,gpus,space,routing", JOBS)
def test_a_layout_priced_in_a_search_batch_is_priced_as_alone(model, hardware, gpus, space, routing):
    m, hw = load_model(model), load_hardware(hardware)
    sp = SearchSpace(gpus=gpus, seq=m.seq_len, global_batch=round_batch(default_global_batch(m.seq_len), gpus), **space)
    batch, _ = enumerate_layouts(m, hw, sp)
    assert len(np.unique(batch.zero)) > 1  # the batch holds layouts at several ZeRO stages
    together = evaluate(m, hw, batch, routing)
    for i in np.random.default_rng(0).choice(len(batch), 25, replace=False):
        alone = evaluate(m, hw, from_layouts([batch.layout(i)]), routing)
        a, b = _figures(together, i), _figures(alone, 0)
        # components reported only where some layout of the batch has them (ZeRO-3's gathered
        # units, offloaded state) are zero for a layout without them
        for k in a.keys() | b.keys():
            assert a.get(k, 0.0) == pytest.approx(b.get(k, 0.0), rel=1e-12, abs=1e-15), (k, batch.layout(i))
