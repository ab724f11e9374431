"""The planner's closed-form pipeline step against the schedule run action by action
(piper_plan/cost/schedule_sim.py)."""
import sys
from pathlib import Path

import pytest

from piper_plan.cost.schedule_sim import priced_step, rank_orders, simulate

# (pp, vpp, M): the interleaved layouts checked; M a multiple of pp, as Megatron and torch need
INTERLEAVED = [(2, 2, 8), (4, 2, 8), (4, 2, 16), (4, 3, 12), (8, 2, 16), (8, 4, 32), (3, 2, 6)]
ONE_CHUNK = [(2, 8), (4, 8), (4, 16), (8, 32), (3, 5)]
F_MB, B_MB = 24.0, 48.0  # one micro-batch's forward and backward on a rank, all its chunks (ms)


def _cases():
    for pp, vpp, M in INTERLEAVED:
        yield "interleaved", pp, vpp, M
    for pp, M in ONE_CHUNK:
        yield "1f1b", pp, 1, M
        yield "gpipe", pp, 1, M


def _benchmark():
    """benchmarks/p2p_overlap.py, whose helpers read torch's own schedule."""
    bench = str(Path(__file__).resolve().parents[1] / "benchmarks")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    import p2p_overlap
    return p2p_overlap


def _sim(schedule, pp, vpp, M, msg, overlap):
    return simulate(rank_orders(schedule, pp, vpp, M), F_MB / vpp, B_MB / vpp, msg, overlap)


@pytest.mark.parametrize("pp,vpp,M", INTERLEAVED)
def test_the_interleaved_order_is_the_one_torch_runs(pp, vpp, M):
    """ScheduleInterleaved1F1B's own per-rank order (its idle slots dropped), from torch's method."""
    S = pytest.importorskip("torch.distributed.pipelining.schedules")
    sched = _benchmark().torch_interleaved(pp, vpp, M)  # no stages or process group: only the order
    for rank, ours in enumerate(rank_orders("interleaved", pp, vpp, M)):
        torch_ops = [a for a in sched._calculate_single_rank_operations(rank) if a is not None]
        kinds = {S._ComputationType.FORWARD: "F", S._ComputationType.FULL_BACKWARD: "B"}
        assert [(kinds[a.computation_type], a.stage_index, a.microbatch_index) for a in torch_ops] == ours


@pytest.mark.parametrize("schedule,pp,vpp,M", list(_cases()))
def test_without_messages_the_simulated_step_is_the_closed_form_bubble(schedule, pp, vpp, M):
    assert _sim(schedule, pp, vpp, M, 0.0, True) == pytest.approx(priced_step(schedule, pp, vpp, M, F_MB, B_MB, 0.0))


@pytest.mark.parametrize("schedule,pp,vpp,M", [c for c in _cases() if c[0] != "gpipe"])
@pytest.mark.parametrize("overlap", [True, False])
def test_messages_a_tenth_of_a_chunk_s_forward_are_priced_within_2_percent_never_faster(schedule, pp, vpp, M, overlap):
    """The regime of every GPU row in validation/published.csv (a boundary message a tenth of a
    chunk's forward or less). 1F1B waits on its messages whatever the setting (estimate prices
    it so; torch's Schedule1F1B and Megatron's blocking batch do)."""
    msg = 0.1 * F_MB / vpp
    sim = _sim(schedule, pp, vpp, M, msg, overlap and schedule == "interleaved")
    assert sim * (1 - 1e-9) <= priced_step(schedule, pp, vpp, M, F_MB, B_MB, msg, overlap) <= sim * 1.02


@pytest.mark.parametrize("M", [2, 4, 8, 16])
def test_a_two_stage_1f1b_is_priced_as_it_runs_at_any_message_size(M):
    """Both ranks of a two-stage pipeline are ends, each sending one message a micro-batch
    (estimate._p2p_sends): the closed form is then the schedule's own step."""
    orders = rank_orders("1f1b", 2, 1, M)
    for msg in (1.2, 7.2, 24.0, 48.0):
        assert priced_step("1f1b", 2, 1, M, F_MB, B_MB, msg) == pytest.approx(
            simulate(orders, F_MB, B_MB, msg, overlap=False))


@pytest.mark.parametrize("schedule,pp,vpp,M", list(_cases()))
def test_a_message_as_long_as_a_chunk_s_forward_is_never_priced_faster_than_the_schedule_runs(schedule, pp, vpp, M):
    """Past that regime the closed form errs on the slow side (up to 11 % for 1F1B and interleaved
    with a message as long as a chunk's forward): the steady-state share hides no more than the
    schedule can, so a plan on a slow link is not promised a step it cannot reach. GPipe is
    checked against torch's ScheduleGPipe, whose sends run while the next micro-batch computes
    (it waits on them at the end of each phase): the closed form, which prices them waited, is
    the slower there by far more."""
    msg = F_MB / vpp
    for overlap in (True, False):
        sim = _sim(schedule, pp, vpp, M, msg, schedule == "gpipe" or (overlap and schedule == "interleaved"))
        assert priced_step(schedule, pp, vpp, M, F_MB, B_MB, msg, overlap) >= sim * (1 - 1e-9)


@pytest.mark.parametrize("schedule,pp,vpp,M", list(_cases()))
def test_a_receive_posted_first_moves_when_sent_and_one_posted_at_its_action_waits(schedule, pp, vpp, M):
    """The rendezvous path (posted receives) meets the two it lies between: every receive posted
    before the rank's first action is the eager transfer, every one posted at the action that
    needs it is the waited one."""
    orders = rank_orders(schedule, pp, vpp, M)
    first = [{a: 0 for a in ops} for ops in orders]
    at_need = [{a: i for i, a in enumerate(ops)} for ops in orders]
    for msg in (0.5, 2.4, 8.0):
        f, b = F_MB / vpp, B_MB / vpp
        assert simulate(orders, f, b, msg, posted=first) == pytest.approx(simulate(orders, f, b, msg))
        assert simulate(orders, f, b, msg, posted=at_need) == pytest.approx(simulate(orders, f, b, msg, overlap=False))
    with pytest.raises(ValueError, match="posted receives need overlap"):
        simulate(orders, 1.0, 2.0, 0.1, overlap=False, posted=first)


@pytest.mark.parametrize("pp,vpp,M", INTERLEAVED)
def test_piper_train_s_interleaved_schedule_as_torch_lowers_it_is_priced_within_2_percent(pp, vpp, M):
    """torch places each receive one or more actions ahead of the one that needs it
    (_add_send_recv), so with messages a tenth of a chunk's forward its schedule runs as with
    eager transfers, and the closed form that prices piper-train's plans is within 2 % of it,
    never the faster."""
    pytest.importorskip("torch")
    torch_recv_posts = _benchmark().torch_recv_posts

    orders, msg = rank_orders("interleaved", pp, vpp, M), 0.1 * F_MB / vpp
    as_torch = simulate(orders, F_MB / vpp, B_MB / vpp, msg, posted=torch_recv_posts(pp, vpp, M))
    assert as_torch == pytest.approx(simulate(orders, F_MB / vpp, B_MB / vpp, msg), rel=1e-3)
    assert as_torch <= priced_step("interleaved", pp, vpp, M, F_MB, B_MB, msg) <= 1.02 * as_torch
