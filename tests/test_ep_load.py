"""The EP load a plan assumes (max/mean routed rows per rank of an EP group): the micro-batch's,
which prices the step, and the step's, which piper-train measures (ep_max_over_mean)."""
import pytest
from click.testing import CliRunner

from piper_plan.cli import main
from piper_plan.cost.estimate import Routing
from piper_plan.evaluate import build_plan, ep_load_step, estimate_layout
from piper_plan.layout import Layout
from piper_plan.plan import Migration, read_plan
from piper_plan.specs import load_hardware, load_model

MOE, CPU = load_model("tiny-moe"), load_hardware("cpu-local")


def _plan(routing=None, **kw):
    lay = Layout(**{**dict(gpus=4, dp=4, ep=4, mbs=1, global_batch=4, seq=64), **kw})
    est = estimate_layout(MOE, CPU, lay, routing)
    return build_plan(MOE, CPU, lay, est, 0, routing), est


def test_a_plan_carries_the_load_its_step_time_was_priced_with():
    plan, est = _plan()
    assert plan.predicted.imbalance == pytest.approx(float(est.imbalance[0])) and plan.predicted.imbalance > 1.0
    # one micro-batch a step: the step's load is the micro-batch's
    assert plan.predicted.ep_load_step == pytest.approx(plan.predicted.imbalance)


def test_a_step_of_many_micro_batches_averages_their_sampling_noise():
    one, _ = _plan()
    many, _ = _plan(global_batch=32)  # 8 micro-batches a step
    assert many.predicted.imbalance == pytest.approx(one.predicted.imbalance)
    assert 1.0 < many.predicted.ep_load_step < many.predicted.imbalance


def test_skewed_routing_loads_a_rank_more_and_migration_evens_it():
    uniform = ep_load_step(MOE, Layout(gpus=4, dp=4, ep=4, global_batch=32, seq=64), Routing())
    zipf = Routing("zipf", 1.2)
    skewed = ep_load_step(MOE, Layout(gpus=4, dp=4, ep=4, global_batch=32, seq=64), zipf)
    zipf_mig = Routing("zipf", 1.2, migration=Migration(enabled=True, planner="lpt"))
    evened = ep_load_step(MOE, Layout(gpus=4, dp=4, ep=4, global_batch=32, seq=64), zipf_mig)
    assert uniform < evened < skewed


def test_no_expert_parallelism_or_no_experts_is_an_even_load():
    assert ep_load_step(MOE, Layout(gpus=4, dp=4, ep=1, global_batch=32, seq=64), Routing("zipf", 2.0)) == 1.0
    dense = load_model("tiny-dense")
    assert ep_load_step(dense, Layout(gpus=4, dp=4, global_batch=32, seq=64), Routing()) == 1.0


def test_show_prints_the_plan_s_load_not_nan(tmp_path):
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(main, ["estimate", "-m", "tiny-moe", "-H", "cpu-local", "-n", "4", "--dp", "4", "--ep", "4",
                                  "--mbs", "1", "--global-batch", "4", "--seq", "64", "-o", str(out)])
    assert r.exit_code == 0, r.output
    shown = CliRunner().invoke(main, ["show", str(out)]).output
    assert "nan" not in shown
    assert f"{read_plan(out).predicted.imbalance:.3f}" in shown


def test_a_plan_written_before_the_load_was_recorded_shows_it_as_unknown(tmp_path):
    import json

    plan, _ = _plan()
    doc = json.loads(plan.model_dump_json())
    for k in ("imbalance", "ep_load_step"):
        del doc["predicted"][k]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    assert read_plan(old).predicted.ep_load_step is None
    shown = CliRunner().invoke(main, ["show", str(old)]).output
    assert "imbalance" in shown and "nan" not in shown and "1.000" not in shown.split("imbalance")[1].split("\n")[0]


def test_a_measured_histogram_is_balanced_layer_by_layer_not_on_the_layers_average():
    # each MoE layer waits on its own busiest rank: 48 layers with the same Zipf skew over
    # different hot experts average to a flat histogram, but none of them is flat
    import numpy as np

    from piper_plan.cost.imbalance import expert_popularity, imbalance
    rng = np.random.default_rng(0)
    w = 1.0 / np.arange(1, 65)
    h = np.stack([w[rng.permutation(64)] for _ in range(48)]) * 1000
    p = expert_popularity(64, "histogram", histogram=h)
    ep, rows = np.array([8]), np.array([1e9])  # rows: sampling noise out of the way
    per_layer = np.mean([float(imbalance(r, ep, rows)[0]) for r in p])
    assert float(imbalance(p, ep, rows)[0]) == pytest.approx(per_layer)
    assert per_layer > 1.5 * float(imbalance(p.mean(0), ep, rows)[0])
