"""Placement planners (pure) and the planner-side migration model."""
from __future__ import annotations

import json

import numpy as np
import pytest

from piper_plan.cost.batch import from_layouts
from piper_plan.cost.migration import (
    bytes_per_param, load_counting_time, load_histogram, migration_overhead, predict_imbalance, predict_moe_layer_time,
)
from piper_plan.errors import SpecError
from piper_plan.layout import Layout
from piper_plan.placement import (
    contiguous_placement, lower_bound, lpt_local_placement, moved_experts, plan_placement, rank_loads,
    slot_lower_bound, swap_placement,
)
from piper_plan.specs.registry import load_hardware, load_model

PLANNERS = {"swap": swap_placement, "lpt": lpt_local_placement}


def _random_placement(rng, E, ep):
    perm = rng.permutation(E)
    return [sorted(perm[r * (E // ep):(r + 1) * (E // ep)].tolist()) for r in range(ep)]


@pytest.mark.parametrize("name", PLANNERS)
def test_deterministic_valid_never_worse(name):
    f = PLANNERS[name]
    rng = np.random.default_rng(0)
    for trial in range(40):
        E, ep = [(8, 2), (16, 4), (32, 8), (64, 8), (12, 3)][trial % 5]
        load = rng.zipf(1.3, E).astype(float) if trial % 2 else rng.random(E)
        start = _random_placement(rng, E, ep)
        a, b = f(load, start), f(load.copy(), [list(s) for s in start])
        assert a == b  # deterministic
        assert sorted(e for s in a for e in s) == list(range(E)) and all(len(s) == E // ep for s in a)
        assert rank_loads(load, a).max() <= rank_loads(load, start).max() + 1e-12
        assert rank_loads(load, a).max() >= slot_lower_bound(load, ep) - 1e-9 >= lower_bound(load, ep) - 2e-9


@pytest.mark.parametrize("name", PLANNERS)
@pytest.mark.parametrize("budget", [0, 1, 2, 3, 6])
def test_respects_max_moves(name, budget):
    rng = np.random.default_rng(budget)
    for _ in range(10):
        load = rng.random(32) ** 3
        start = _random_placement(rng, 32, 8)
        out = PLANNERS[name](load, start, max_moves=budget)
        assert moved_experts(start, out) <= budget
        assert rank_loads(load, out).max() <= rank_loads(load, start).max() + 1e-12
    assert plan_placement(load, start, name, 0) == [sorted(s) for s in start]


def test_reach_the_lower_bound_on_easy_cases():
    # a perfect split exists: loads 1..8 over 2 ranks of 4 (36 = 18 + 18), any start
    rng = np.random.default_rng(1)
    load = np.arange(1, 9, dtype=float)
    for _ in range(10):
        start = _random_placement(rng, 8, 2)
        out = lpt_local_placement(load, start)
        assert rank_loads(load, out).max() == lower_bound(load, 2) == 18
    # pairs: ep ranks of two experts summing to the same total; the swap planner gets there too
    ep = 6
    hi = rng.random(ep) + 1.0
    load = np.concatenate([hi, 3.0 - hi])
    start = [[r, ep + (r + 1) % ep] for r in range(ep)]
    for name in PLANNERS:
        out = PLANNERS[name](load, start)
        assert rank_loads(load, out).max() == pytest.approx(lower_bound(load, ep), rel=1e-12)
    # one expert dominates: the bound is that expert plus the lightest ones in its slots
    load = np.array([10.0] + [1.0] * 7)
    out = lpt_local_placement(load, contiguous_placement(8, 2))
    assert rank_loads(load, out).max() == slot_lower_bound(load, 2) == 13


def test_lpt_local_at_least_as_good_as_swap_on_skew():
    rng = np.random.default_rng(5)
    wins = 0
    for _ in range(20):
        load = 1.0 / np.arange(1, 65) ** 1.2
        load = load[rng.permutation(64)]
        start = contiguous_placement(64, 8)
        s, m = rank_loads(load, swap_placement(load, start)).max(), rank_loads(load, lpt_local_placement(load, start)).max()
        assert m <= s + 1e-12
        wins += m < s - 1e-12
    assert wins > 0  # the stronger planner is strictly better somewhere


def test_predict_imbalance_uses_the_planner():
    E, ep = 16, 8
    p = 1.0 / np.arange(1, E + 1) ** 1.0
    p = p[np.random.default_rng(20260505).permutation(E)]
    none, swap, lpt = (predict_imbalance(p, ep, x) for x in (None, "swap", "lpt"))
    assert none["moved"] == 0 and none["max_over_mean"] == pytest.approx(rank_loads(p / p.sum(), contiguous_placement(E, ep)).max() * ep)
    assert lpt["max_over_mean"] <= swap["max_over_mean"] <= none["max_over_mean"]
    assert lpt["max_over_mean"] <= 1.1 * lpt["lower_bound"]
    u = predict_imbalance(np.ones(E), ep, "lpt")
    assert u["max_over_mean"] == pytest.approx(1.0) and u["moved"] == 0
    capped = predict_imbalance(p, ep, "lpt", max_moves=2)
    assert capped["moved"] <= 2


def test_histogram_from_metrics_file(tmp_path):
    f = tmp_path / "m.jsonl"
    recs = [{"step": 0, "tokens_per_expert": {"1": [3, 1, 0, 0], "3": [1, 1, 1, 1]}},
            {"step": 1, "tokens_per_expert": {"1": [5, 1, 2, 0], "3": [0, 4, 0, 0]}}, {"summary": True}]
    f.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    h = load_histogram(f, 4)
    assert h.tolist() == [[8, 2, 2, 0], [1, 5, 1, 1]]
    assert predict_imbalance(h[0], 2, None)["max_over_mean"] == pytest.approx(10 / 6)
    assert predict_imbalance(h[0], 2, "lpt")["max_over_mean"] == pytest.approx(8 / 6)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"tokens_per_expert": {"1": [1, 2]}}\n')
    with pytest.raises(SpecError, match="tokens_per_expert"):
        load_histogram(bad, 4)


def test_a_metrics_file_holding_several_runs_gives_the_last_runs_histogram(tmp_path):
    # piper-train appends each run; the counts of an earlier run (perhaps another plan or model,
    # with other experts) had been summed into the last one's
    f = tmp_path / "m.jsonl"
    recs = [{"step": 0, "tokens_per_expert": {"0": [9, 9, 9, 9]}}, {"summary": True},
            {"step": 0, "tokens_per_expert": {"1": [3, 1, 0, 0]}}, {"step": 1, "tokens_per_expert": {"1": [5, 1, 2, 0]}},
            {"summary": True}]
    f.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    assert load_histogram(f, 4).tolist() == [[8, 2, 2, 0]]
    # a last run stopped before its summary is still the last run
    f.write_text("\n".join(json.dumps(r) for r in recs[:3]) + "\n")
    assert load_histogram(f, 4).tolist() == [[3, 1, 0, 0]]


def test_a_step_a_resumed_run_wrote_again_is_counted_once(tmp_path):
    # a run killed after step 2's record but before its checkpoint (at 2 steps) has no summary;
    # --resume writes step 2 again: its counts had been summed twice
    f = tmp_path / "m.jsonl"
    counts = [(0, [3, 1, 0, 0]), (1, [5, 1, 2, 0]), (2, [9, 9, 9, 9]),  # the crashed run
              (2, [0, 0, 4, 4]), (3, [1, 1, 1, 1])]  # the resumed run, from its checkpoint at 2 steps
    recs = [{"step": s, "tokens_per_expert": {"1": c}} for s, c in counts] + [{"summary": True}]
    f.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    assert load_histogram(f, 4).tolist() == [[9, 3, 7, 5]]


def test_migration_cost_model():
    # bf16 weights + bf16 grads + fp32 master + Adam = brief §4's 16 B/param
    assert float(bytes_per_param(2, 2, 0, 1)) == 16.0
    assert float(bytes_per_param(4, 4, 1, 4)) == 4 + 4 + 8 / 4
    m, hw = load_model("mixtral-8x7b"), load_hardware("dgx-h100")
    lay = Layout(gpus=64, pp=4, dp=16, ep=8, mbs=1, global_batch=256, seq=4096, dtype="bf16")
    a = migration_overhead(m, hw, lay, period=50)                 # worst case: whole expert sets move
    b = migration_overhead(m, hw, lay, period=100)
    # the moves amortise over the period; the load counts are paid every step (load_counting_time)
    count = float(load_counting_time(m, hw, from_layouts([lay]))[0])
    assert a["seconds_per_migration"] > 0 and count > 0
    assert b["seconds_per_step"] - count == pytest.approx((a["seconds_per_step"] - count) / 2)
    z = 1.0 / np.arange(1, 9) ** 1.2
    c = migration_overhead(m, hw, lay, period=50, p=z, step_time_s=10.0)
    assert 0 < c["seconds_per_migration"] <= a["seconds_per_migration"] and 0 < c["share"] < 1
    t1, t2 = predict_moe_layer_time(m, hw, lay, 1.0), predict_moe_layer_time(m, hw, lay, 2.0)
    assert t1 < t2 < 2 * t1  # expert GEMMs scale with the straggler's rows, the router does not


def test_migration_moves_over_the_links_the_ep_group_spans():
    # EP members sit ep_stride ranks apart (etp fastest, then ep when packed): with tp 8 and
    # etp 1 an EP group of 8 is one DGX node, as it is at tp 1, so migration moves over NVLink
    # in both; spread placement puts the same group one member per node, over the NICs
    m, hw = load_model("mixtral-8x7b"), load_hardware("dgx-h100")
    base = dict(gpus=64, ep=8, mbs=1, global_batch=256, seq=4096, dtype="bf16")
    tp1 = migration_overhead(m, hw, Layout(dp=64, **base), period=1)["seconds_per_migration"]
    tp8 = migration_overhead(m, hw, Layout(tp=8, dp=8, **base), period=1)["seconds_per_migration"]
    spread = migration_overhead(m, hw, Layout(dp=64, placement="spread", **base), period=1)["seconds_per_migration"]
    assert tp8 == pytest.approx(tp1)
    assert spread > 2 * tp1  # a NIC share per GPU is several times below NVLink


def test_zero_3_moves_a_shard_of_each_expert_weight_as_it_moves_a_shard_of_its_state():
    from piper_plan.cost.migration import bytes_per_param
    # bf16 weight 2, fp32 gradient 4, master 4 and Adam 8: ZeRO 1 shards 12 B, 2 the gradient
    # too, 3 the weight as well
    assert [float(bytes_per_param(2, 4, z, 8)) for z in range(4)] == [18.0, 2 + 4 + 12 / 8, 2 + 16 / 8, 18 / 8]


def test_a_migration_moves_whole_expert_sets_of_the_stage_s_moe_layers_at_18_bytes_a_parameter(monkeypatch):
    # Mixtral 8x7B at ep 8 (one expert a rank) and edp 1: the worst case re-places the rank's one
    # expert in each MoE layer of its stage (32 / pp), its bf16 weight, fp32 gradient (the layout's
    # default grad_dtype, Megatron's main_grad), fp32 master and Adam moments (2 + 4 + 12 B a
    # parameter), over the n - 1 peers of an all-to-all that counts a self share of 1/n (so
    # n / (n - 1) of it is offered)
    from piper_plan.cost import migration as mig
    from piper_plan.cost.batch import from_layouts

    m, hw = load_model("mixtral-8x7b"), load_hardware("dgx-h100")
    offered = []
    monkeypatch.setattr(mig.comm, "a2a_flat", lambda hw, nbytes, *a: offered.append(float(np.asarray(nbytes)[0]))
                        or np.asarray(nbytes))
    for pp in (1, 2, 4):
        mig.migration_time(m, hw, from_layouts([Layout(gpus=8 * pp, pp=pp, dp=8, ep=8, global_batch=64, seq=4096)]))
    assert m.expert_params == 3 * 4096 * 14336
    assert offered == pytest.approx([1 * (32 / pp) * m.expert_params * 18 * 8 / 7 for pp in (1, 2, 4)])


def test_piper_train_moves_its_fp32_parameter_not_a_bf16_weight_and_a_master():
    # piper-train's bf16 is an autocast copy of the fp32 parameter: a migration sends the parameter,
    # its fp32 gradient and Adam's two moments (runtime/migrate.py expert_fields), 16 B a parameter
    from piper_plan.cost.migration import bytes_per_param
    assert float(bytes_per_param(2, 4, 0, 1, casts=True)) == 16.0
    assert float(bytes_per_param(4, 4, 0, 1, casts=True)) == float(bytes_per_param(4, 4, 0, 1)) == 16.0
    assert float(bytes_per_param(2, 4, 1, 4, casts=True)) == 4 + 4 + 8 / 4  # ZeRO-1 shards the moments alone


def test_piper_train_s_busiest_owner_moves_the_state_of_the_whole_expert_tensors_it_owns(monkeypatch):
    """piper-train's ZeRO-1 gives each owner whole parameters: tiny-moe's 9 expert tensors (3 MoE
    layers x w1, w3, w2) over 2 owners put 5 on one, whose Adam moments a migration moves: 5/9 of
    each moved expert's 8 B, not the half a sharded stack moves."""
    from piper_plan.cost import migration as mig
    from piper_plan.cost.batch import from_layouts

    m, hw = load_model("tiny-moe"), load_hardware("cpu-local")
    offered = []
    monkeypatch.setattr(mig.comm, "a2a_flat", lambda hw, nbytes, *a: offered.append(float(np.asarray(nbytes)[0]))
                        or np.asarray(nbytes))
    for fused in (False, True):
        lay = Layout(gpus=4, dp=4, ep=2, global_batch=8, seq=64, zero=1, dtype="fp32", fused_kernels=fused)
        mig.migration_time(m, hw, from_layouts([lay]))
    per_expert = 4 * m.expert_params * 3 * 2  # 4 arrivals: E/ep, in each of the 3 MoE layers; n/(n-1) = 2
    assert offered[0] == pytest.approx(per_expert * (4 + 4 + 8 * 5 / 9))  # fp32 parameter, gradient, 5/9 moments
    assert offered[1] == pytest.approx(per_expert * (4 + 4 + 8 / 2))  # a fused stack: half of each tensor's


def test_a_migration_that_moves_nothing_still_agrees_over_its_groups():
    # the ready flag, checksums and commit vote are three small all-reduces (runtime/migrate.py),
    # milliseconds each on a CPU: a migration pays them beside what it moves
    from piper_plan.cost import migration as mig
    from piper_plan.cost.batch import from_layouts
    m, cpu = load_model("tiny-moe"), load_hardware("cpu-local")
    lay = from_layouts([Layout(gpus=4, dp=4, ep=4, global_batch=8, seq=64, fused_kernels=False)])
    even = np.ones(m.moe.num_experts)
    t = float(mig.migration_time(m, cpu, lay, even)[0])
    agree = float(mig._agreement(m, cpu, lay, np.ceil(m.num_moe_layers / lay.pp))[0])
    assert agree > 3 * cpu.topology[0].latency_us * 1e-6 and t > agree
    move_only = float(mig.comm.a2a_flat(cpu, 1.0, 4, lay.ep_stride, lay.gpus)[0])
    assert move_only < agree  # before, a migration was priced as the exchange alone


def test_migration_counts_the_load_every_step_however_rarely_it_moves():
    # piper-train all-reduces each step's per-expert counts over the stage after every optimizer
    # step (Migrator.gather_counts): a period of 1,000 steps amortises the moves, not that
    from piper_plan.cost import migration as mig
    from piper_plan.cost.batch import from_layouts
    m, cpu = load_model("tiny-moe"), load_hardware("cpu-local")
    lay = from_layouts([Layout(gpus=4, dp=4, ep=4, global_batch=8, seq=64, fused_kernels=False)])
    counting = float(mig.load_counting_time(m, cpu, lay)[0])
    assert counting > cpu.topology[0].latency_us * 1e-6
    per_step = float(mig.migration_step_time(m, cpu, lay, 1000)[0])
    assert counting < per_step < counting + float(mig.migration_time(m, cpu, lay)[0]) / 100
    no_ep = from_layouts([Layout(gpus=4, dp=4, ep=1, global_batch=8, seq=64, fused_kernels=False)])
    assert float(mig.load_counting_time(m, cpu, no_ep)[0]) == 0.0


def test_a_run_that_redoes_every_step_of_a_crashed_one_is_read_at_its_own_width(tmp_path):
    # a crashed 8-expert run (no summary line), then a whole 4-expert run from step 0 in the same file
    f = tmp_path / "m.jsonl"
    recs = [{"step": s, "tokens_per_expert": {"1": [1] * 8}} for s in (0, 1)]
    recs += [{"step": s, "tokens_per_expert": {"1": [2, 1, 1, 0]}} for s in (0, 1, 2)] + [{"summary": True}]
    f.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    assert load_histogram(f).tolist() == [[6, 3, 3, 0]]
