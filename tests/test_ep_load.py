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


@pytest.mark.parametrize("experts,ep,zipf_s,rows", [(64, 8, 0.3, 64), (64, 8, 0.5, 64), (64, 8, 1.0, 64),
                                                      (128, 16, 0.8, 256), (256, 32, 0.6, 128)])
def test_placement_and_sampling_combine_as_the_busiest_rank_s_expected_load(experts, ep, zipf_s, rows):
    # the ranks' loads drawn as the model assumes them (a multinomial over the ranks' shares of a
    # Zipf popularity): their expected max/mean is the combination's to 4 %, where the product of
    # the two factors, which had priced it, counted the draws' excess on top of a hot rank's (up
    # to +24 %)
    import numpy as np

    from piper_plan.cost.imbalance import combined, expert_popularity, placement_imbalance, sampling_factor

    p = expert_popularity(experts, "zipf", zipf_s)
    f, s = placement_imbalance(p, ep), float(sampling_factor(ep, rows))
    draws = np.random.default_rng(0).multinomial(rows * ep, p.reshape(ep, -1).sum(1), size=20000)
    expected = float((draws.max(1) / rows).mean())
    assert float(combined(f, s)) == pytest.approx(expected, rel=0.04)
    assert abs(float(combined(f, s)) - expected) < abs(f * s - expected)


def test_a_run_re_planned_from_its_own_histogram_is_not_charged_its_counting_noise_twice():
    # a histogram of uniform routing read off finite counts shows a placement spread that is
    # only the counting's: taken off, the re-planned load is the uniform plan's
    import numpy as np

    from piper_plan.cost.imbalance import denoised, observed_rows, placement_imbalance, sampling_factor

    counts = np.random.default_rng(1).multinomial(4096, np.full(8, 1 / 8), size=3)  # tiny-moe's 8 experts, 3 layers
    seen = [placement_imbalance(c / 4096, 4) for c in counts]
    assert max(seen) > 1.02  # the counting alone spreads it
    assert list(observed_rows(counts)) == [4096.0] * 3
    left = denoised(np.array(seen), sampling_factor(4, 4096 / 4))
    assert all(a - 1.0 < 0.5 * (b - 1.0) for a, b in zip(left, seen) if b > 1.02)
    uniform, _ = _plan()
    replanned, _ = _plan(Routing(distribution="histogram", histogram=counts.tolist()))
    # each layer's spread lies within its counting noise: nothing of it is left (the noise kept, 1.131 against
    # the uniform plan's 1.127)
    assert replanned.predicted.ep_load_step == pytest.approx(uniform.predicted.ep_load_step, rel=1e-9)


def test_a_histogram_beside_another_distribution_takes_nothing_off_it():
    # plan.Routing keeps a histogram whatever its distribution: a Zipf plan's placement spread had
    # been cancelled as the counting noise of a histogram it does not price (2.17 -> 1.00)
    zipf = Routing(distribution="zipf", zipf_s=1.2)
    stray = Routing(distribution="zipf", zipf_s=1.2, histogram=[[1, 0, 0, 0, 0, 0, 0, 0]] * 3)
    assert _plan(stray)[0].predicted.ep_load_step == pytest.approx(_plan(zipf)[0].predicted.ep_load_step, rel=1e-12)
