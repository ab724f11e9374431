"""Memory of the interleaved schedule: rank r runs chunks r, r + pp, ... and holds a different
number of micro-batches of each over its order, so where the chunks differ in size its
activations weigh each chunk by its own count (memory.interleaved_states), not every layer by
the rank's mean in flight."""
import numpy as np
import pytest

from piper_plan.cost.batch import from_layouts
from piper_plan.cost.estimate import Routing, _pipeline, evaluate
from piper_plan.cost.memory import GIB, in_flight, interleaved_states
from piper_plan.cost.stages import materialise
from piper_plan.layout import Layout
from piper_plan.specs import load_hardware, load_model

H100 = load_hardware("dgx-h100")


def _torch_states(pp, v, M, r):
    """Pareto-maximal micro-batches in flight of each of rank r's chunks in torch's own
    ScheduleInterleaved1F1B order, a micro-batch counting from its forward to its backward."""
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B
    from torch.distributed.pipelining.schedules import _ComputationType as CT

    sched = object.__new__(ScheduleInterleaved1F1B)  # the order alone: no stages, no process group
    sched.pp_group_size, sched._n_microbatches, sched.n_local_stages = pp, M, v
    sched.number_of_rounds = max(1, M // pp)
    sched.microbatches_per_round = M // sched.number_of_rounds
    held, seen = [0] * v, set()
    for a in sched._calculate_single_rank_operations(r):
        if a is None:
            continue
        held[a.stage_index // pp] += 1 if a.computation_type == CT.FORWARD else -1
        seen.add(tuple(held))
    return {p for p in seen if not any(q != p and all(x >= y for x, y in zip(q, p)) for q in seen)}


def test_each_chunk_holds_the_micro_batches_torch_s_own_order_keeps_in_flight():
    pytest.importorskip("torch.distributed.pipelining.schedules")
    for pp in range(2, 7):
        for v in range(2, 5):
            for M in range(pp, 5 * pp + 1, pp):
                for r in range(pp):
                    ours = {tuple(int(x) for x in s) for s in interleaved_states(pp, v, M, r)}
                    assert ours == _torch_states(pp, v, M, r), (pp, v, M, r)


def test_the_states_are_the_same_for_every_m_from_2pp():
    """interleaved_states walks the order at min(M, 2pp): checked against the full order."""
    from piper_plan.cost.schedule_sim import rank_orders

    for pp in (2, 3, 5, 8, 12):
        for v in (2, 3, 6):
            for r in range(pp):
                for M in (3 * pp, 7 * pp):
                    held, seen = [0] * v, set()
                    for kind, s, _ in rank_orders("interleaved", pp, v, M)[r]:
                        held[s // pp] += 1 if kind == "F" else -1
                        seen.add(tuple(held))
                    top = {p for p in seen if not any(q != p and all(x >= y for x, y in zip(q, p)) for q in seen)}
                    assert top == {tuple(int(x) for x in s) for s in interleaved_states(pp, v, M, r)}, (pp, v, r, M)


def test_with_equal_chunks_every_state_holds_korthikanti_s_count():
    """Equal chunks: each state holds the warm-up's pp·v + 2(pp - 1 - r) - pp + 1 chunk-micro-batches
    (in_flight's, Korthikanti 2022 §4.2.3), so weighing each chunk changes nothing."""
    for pp, v in ((4, 2), (8, 4), (6, 3)):
        lay = from_layouts([Layout(gpus=pp, pp=pp, vpp=v, mbs=1, global_batch=4 * pp, seq=8, schedule="interleaved")])
        for r in range(pp):
            totals = interleaved_states(pp, v, 4 * pp, r).sum(axis=1)
            assert np.all(totals == totals[0])
            assert totals[0] / v == pytest.approx(float(in_flight(lay, r)[0]))


def test_larger_early_chunks_hold_more_than_the_rank_s_mean_in_flight():
    """llama3-8b's 32 layers on pp 4 x vpp 3: the balanced split gives the early middle chunks a
    layer more (stages.materialise), and rank 1 runs two of the larger chunks first and the small
    one last, which its later states hold 2pp micro-batches of: its activations are the
    largest state's, each chunk's count times its layers, more than 2.75 micro-batches (in_flight)
    through all of its layers. The figure is the order walked by hand here, not the model's."""
    model = load_model("llama3-8b")
    lay = from_layouts([Layout(gpus=8, pp=4, vpp=3, dp=2, mbs=1, global_batch=32, seq=2048,
                               schedule="interleaved")])
    est = evaluate(model, H100, lay)
    sizes = [len(c) for c in materialise(model.num_layers, 12, est.chunks)]
    assert len(set(sizes[1:-1])) == 2, sizes  # the middle chunks differ, the case this is about
    a = _pipeline(model, H100, lay, Routing(), "bf16").lc["a_dense"][0] / GIB
    from piper_plan.cost.schedule_sim import rank_orders

    r = 1
    held, cur = 0, 0
    for kind, s, _ in rank_orders("interleaved", 4, 3, 8)[r]:  # M = 32 / 2 / 1 = 16 -> walked at 8 = 2pp
        cur += sizes[s] if kind == "F" else -sizes[s]
        held = max(held, cur)
    rows = {d["role"]: d for d in est.row(0)["memory_gib_per_stage"]}
    mean = float(in_flight(lay, r)[0]) * sum(sizes[r::4])
    assert rows["mid"]["activations"] == pytest.approx(held * a, rel=1e-6)
    assert held > mean
