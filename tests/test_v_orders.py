"""torch's ZB-V and DualPipeV orders walked stage by stage (cost/v_orders.py) against the orders run
action by action (schedule_sim.simulate), messages free."""
import numpy as np
import pytest

from piper_plan.cost.interleaved import kind_phases
from piper_plan.cost.schedule import dualpipev_bubble, zbv_bubble
from piper_plan.cost.schedule_sim import rank_orders, simulate, v_fewest, v_path
from piper_plan.cost.stages import chunk_sizes, materialise, stage_kind, v_mid_rank
from piper_plan.cost.v_orders import pair_hiding, v_pipe, v_step

SCHEDULES = {"zbv": 3, "dualpipev": 4}


def _ran(schedule, M, f, b, w, hide=0.0):
    return simulate(rank_orders(schedule, len(f) // 2, 2, M), f, b, 0.0, wgt=w, hide=hide)


def _step(schedule, M, f, b, w, hide=0.0):
    V = len(f)
    col = (x[:, None] for x in (f, b, w, np.full(V, hide)))
    return float(v_step([SCHEDULES[schedule]], [V // 2], [M], *col)[0])


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("pp", [2, 3, 4, 6, 8])
def test_the_walk_at_the_fewest_micro_batches_is_the_order_run_action_by_action(schedule, pp):
    rng = np.random.default_rng(pp)
    for trial in range(4):
        f, b, w = rng.uniform(0.2, 1.5, (3, 2 * pp))
        hide = rng.uniform(0.0, 0.8) if schedule == "dualpipev" and trial % 2 else 0.0
        M = int(v_fewest(schedule == "zbv", pp))
        walked = v_path(schedule, pp, *(x[:, None] for x in (f, b, w, np.full(2 * pp, hide))))[0]
        assert walked == pytest.approx(_ran(schedule, M, f, b, w, hide), rel=1e-12)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("pp", [2, 3, 4, 6, 8])
def test_past_them_the_busiest_rank_s_work_is_never_below_the_order_and_at_most_three_percent_over(schedule, pp):
    """Stages drawn at random from 0.2-1.5 (far less even than any split the planner makes)."""
    rng = np.random.default_rng(10 + pp)
    M0 = int(v_fewest(schedule == "zbv", pp))
    for trial in range(3):
        f, b, w = rng.uniform(0.2, 1.5, (3, 2 * pp))
        hide = rng.uniform(0.0, 0.8) if schedule == "dualpipev" else 0.0
        for M in (M0 + 1, M0 + pp, M0 + 4 * pp):
            ran = _ran(schedule, M, f, b, w, hide)
            assert ran * (1 - 1e-12) <= _step(schedule, M, f, b, w, hide) <= ran * 1.03


def _balanced(L, pp, x_first, x_last):
    """Each V stage's layers' worth on the balanced split, the extras on the end stages
    (benchmarks/v_chunks.py's stage_seconds)."""
    cs = chunk_sizes(L, np.array([2 * pp]), np.array([x_first]), np.array([x_last]), minimise=np.array([True]),
                     v_shape=np.array([True]))
    s = np.array([len(c) for c in materialise(L, 2 * pp, cs)], float)
    s[0] += x_first
    s[-1] += x_last
    return s


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("L,x_first,x_last", [(61, 0.1, 2.7), (94, 0.1, 1.5), (36, 0.1, 1.0)])
def test_on_the_balanced_split_the_walk_is_the_whole_order(schedule, L, x_first, x_last):
    """Where the closed forms (a rank's chunks read as halves, every rank alike) missed by -8 ... +8 %."""
    for pp in (4, 8):
        s = _balanced(L, pp, x_first, x_last)
        for ratio in (0.5, 1.0):  # the weight pass a half or all of the backward-input's seconds
            for M in (2 * pp, 5 * pp, 12 * pp):
                ran = _ran(schedule, M, s, s, ratio * s)
                assert _step(schedule, M, s, s, ratio * s) == pytest.approx(ran, rel=1e-12)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_on_equal_stages_the_walk_is_the_closed_form(schedule):
    pp, M = 6, 20
    f, b, w = 1.0, 0.9, 0.6
    ones = np.ones(2 * pp)
    closed = (zbv_bubble if schedule == "zbv" else dualpipev_bubble)(pp, 2 * f, 2 * b, 2 * w)
    assert _step(schedule, M, f * ones, b * ones, w * ones) == pytest.approx(M * 2 * (f + b + w) + closed)


def test_a_pair_hides_no_more_than_the_shorter_of_its_two_halves():
    """An overlapped pair lasts at least its longer half (simulate's floor): a hiding past it buys nothing."""
    pp = 4
    s = np.ones(2 * pp)
    assert _step("dualpipev", 3 * pp, s, s, s, hide=1.0) == pytest.approx(_step("dualpipev", 3 * pp, s, s, s, hide=5.0))
    assert _step("dualpipev", 3 * pp, s, s, s, hide=1.0) < _step("dualpipev", 3 * pp, s, s, s, hide=0.5)


def _layer_phases(n):
    """lc's per-layer (f, b, w, r) rows for n layouts: dense, MoE, embedding, LM head."""
    return {"dense_v": np.array([1.0, 1.1, 0.9, 0.0])[:, None] * np.ones(n),
            "moe_v": np.array([2.0, 2.3, 1.5, 0.4])[:, None] * np.ones(n),
            "emb_v": np.array([0.2, 0.1, 0.1, 0.0])[:, None] * np.ones(n),
            "head_v": np.array([1.8, 1.6, 1.4, 0.0])[:, None] * np.ones(n)}


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_each_stage_runs_at_its_rank_s_role_s_pace(schedule):
    """v_pipe's twelve figures (stage kind x rank role) walked are the order run with each stage's
    own seconds: its kind's compute, scaled as its role's windows scale its rank's compute, and a
    dualpipev pair hiding its forward stage's share of the rank's hiding."""
    pp, M, L = 5, 14, 23
    cs = chunk_sizes(L, np.array([2 * pp]), np.array([0.1]), np.array([1.5]), minimise=np.array([True]),
                     v_shape=np.array([True]))
    layers = np.array([len(c) for c in materialise(L, 2 * pp, cs)], float)
    n_hi = cs.n_hi
    kinds_of = stage_kind(np.arange(2 * pp), 2 * pp, n_hi[0])
    per_kind = np.zeros(4)
    per_kind[kinds_of] = layers  # a kind's stages hold as many layers
    nm = (per_kind * 0.75)[:, None]
    kinds = kind_phases(per_kind[:, None] - nm, nm, _layer_phases(1), weight_apart=True)  # [4, 1] each
    role_rank = [0, int(v_mid_rank(n_hi, pp)[0]), pp - 1]
    scale = np.array([[1.2, 1.0, 1.3], [1.1, 1.4, 0.9], [1.0, 1.0, 1.0]])  # [F B W, role]
    hide = np.array([0.0, 0.0, 0.0]) if schedule == "zbv" else np.array([3.0, 2.0, 4.0])
    held = [[k[kinds_of[r], 0] + k[kinds_of[2 * pp - 1 - r], 0] for r in role_rank] for k in kinds]
    windows = tuple((scale[i] * np.array(held[i]))[:, None] for i in range(3))
    priced = v_pipe(np.array([SCHEDULES[schedule]]), np.array([pp]), np.array([M]), n_hi, kinds, windows, hide[:, None])
    rank = np.minimum(np.arange(2 * pp), 2 * pp - 1 - np.arange(2 * pp))
    role = np.where(rank == 0, 0, np.where(rank == pp - 1, 2, 1))
    f, b, w = (kinds[i][kinds_of, 0] * scale[i, role] for i in range(3))
    whole = sum(k[kinds_of, 0] for k in kinds)
    # a middle rank's hiding in proportion to its stages' compute, the representative one's: `hide`
    h = whole * (hide / np.array([whole[r] + whole[2 * pp - 1 - r] for r in role_rank]))[role]
    walked = v_step([SCHEDULES[schedule]], [pp], [M], *(x[:, None] for x in (f, b, w, h)))[0]
    assert priced[0] == pytest.approx(walked, rel=1e-12)
    if schedule == "zbv":  # and that order is torch's, each stage with its own seconds
        assert walked == pytest.approx(_ran("zbv", M, f, b, w), rel=1e-12)


def test_a_pair_hides_each_chunk_s_exchange_behind_the_other_s_compute_alone():
    """A pair so lasts at least its longer chunk (each chunk its compute and its exchange in turn),
    and never hides more than the whole micro-batch's compute bound once allowed."""
    rng = np.random.default_rng(7)
    a_f, a_b, c_f, c_b = rng.uniform(0.0, 2.0, (4, 10000))
    hidden = pair_hiding(a_f, a_b, c_f, c_b)
    pair = c_f + a_f + c_b + a_b - hidden
    assert np.all(pair >= np.maximum(c_f + a_f, c_b + a_b) - 1e-12)
    assert np.all(hidden <= np.minimum(a_f + a_b, c_f + c_b) + 1e-12)
    # a forward whose exchange outlasts the backward's compute keeps the difference exposed
    assert pair_hiding(3.0, 0.0, 5.0, 1.0) == 1.0


def test_a_dualpipev_rank_s_work_counts_the_hiding_its_pairs_can_run():
    """DeepSeek-V3 on 1,024 Frontier GCDs, dualpipev at pp 2, experts over 16 GCDs (HALO), full
    recompute: the backward chunks, with the re-run forward's exchange, take about twice the
    forward ones, so a pair hides at most the forward's compute of the backward's exchange.
    Bounded by the whole micro-batch's compute, a rank's work counted more hiding than the walk of
    the order lets any pair run (each at least its longer chunk): the step's bubble beyond that
    work read 58 s of 266 (22 %). Counted as the pairs can run, the bubble is the fill and the
    drain, 4.1 s (1.5 %)."""
    from piper_plan.cost.batch import from_layouts
    from piper_plan.cost.estimate import evaluate
    from piper_plan.layout import Layout
    from piper_plan.specs import load_hardware, load_model

    m, hw = load_model("deepseek-v3"), load_hardware("frontier")
    lay = from_layouts([Layout(gpus=1024, pp=2, vpp=2, dp=512, ep=16, mbs=1, global_batch=15360, seq=4096,
                               schedule="dualpipev", recompute="full", zero=1, a2a="halo")])
    e = evaluate(m, hw, lay)
    assert 0.0 < e.time["bubble"][0] < 0.03 * e.step_time_s[0]
    assert e.time["a2a"][0] > 0.2 * e.step_time_s[0]  # what the pairs cannot hide stays in the step


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_the_graph_built_from_arrays_is_the_one_swept_op_by_op(schedule):
    """schedule_sim._v_graph (all ops at once, the levels relaxed or stepped) against _graph's sweep
    of the same orders: each level holds the same ops (kind and stage), and each rank ends on its
    sweep's last op's level. pp 33 and 40 take the stepped levels."""
    from piper_plan.cost.schedule_sim import _graph, _v_graph

    for pp in (2, 3, 5, 8, 33, 40):
        kind, stage, _, level, last = _v_graph(schedule, pp)
        k2, s2, _, l2, last2, _ = _graph(rank_orders(schedule, pp, 2, int(v_fewest(schedule == "zbv", pp))))
        assert sorted(zip(level.tolist(), kind.tolist(), stage.tolist())) == sorted(zip(l2.tolist(), k2.tolist(),
                                                                                     s2.tolist()))
        assert level[last].tolist() == l2[last2].tolist()


def test_each_stage_reads_the_row_of_its_kind_and_its_rank_s_role_looped_or_v():
    """stages.kind_role_rows, the map both stage-by-stage walks read: stage s of a looped pipeline
    runs on rank s % pp, of a V on rank min(s, 2pp - 1 - s); role 0 rank 0, 2 rank pp - 1, 1 else."""
    from piper_plan.cost.stages import kind_role_rows

    pp, n_hi = np.array([2, 4, 4, 5]), np.array([0, 3, 3, 7])
    for v_shape, vpp, distinct in ((False, np.array([2, 2, 3, 2]), 4), (True, np.full(4, 2), 3)):
        maps, which = kind_role_rows(pp, vpp, n_hi, v_shape)
        assert len(set(which.tolist())) == distinct  # a map a distinct (pp, vpp, n_hi)
        for i in range(len(pp)):
            C = int(pp[i] * vpp[i])
            for s in range(C):
                rank = min(s, C - 1 - s) if v_shape else s % pp[i]
                role = 0 if rank == 0 else 2 if rank == pp[i] - 1 else 1
                assert maps[which[i], s] == stage_kind(s, C, n_hi[i]) * 3 + role, (v_shape, i, s)
