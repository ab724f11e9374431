"""Memory of the V schedules (zbv, dualpipev): rank r runs chunks r and 2pp-1-r and holds a
different number of micro-batches of each, so a rank's activations weigh each chunk by its own
count (memory.v_in_flight), and each printed row is a real rank with its real chunks."""
import pytest

from piper_plan.cost.batch import from_layouts
from piper_plan.cost.estimate import Routing, _pipeline, evaluate
from piper_plan.cost.memory import GIB, v_in_flight
from piper_plan.cost.stages import materialise, v_chunks, v_mid_rank
from piper_plan.layout import Layout
from piper_plan.specs import load_hardware, load_model

H100 = load_hardware("dgx-h100")
QWEN = load_model("qwen3-235b-a22b")
QWEN_ZBV = dict(gpus=256, ep=32, dp=32, pp=8, vpp=2, mbs=1, global_batch=1024, seq=4096, schedule="zbv")


def _torch_states(cls, pp, M, r):
    """Pareto-maximal (micro-batches of chunk r, of chunk 2pp-1-r) a rank holds in torch's own
    order, each counted from its forward to its weight gradient (or full backward)."""
    from torch.distributed.pipelining.schedules import _ComputationType as CT

    sched = object.__new__(cls)  # the order alone: no stages, no process group
    sched.pp_group_size, sched._n_microbatches, sched.n_local_stages = pp, M, 2
    sched._num_stages = sched.num_stages = 2 * pp
    held, seen = {r: 0, 2 * pp - 1 - r: 0}, set()
    for action in sched._calculate_single_rank_operations(r):
        for a in (getattr(action, "sub_actions", None) or [action]) if action is not None else ():
            if a.computation_type == CT.FORWARD:
                held[a.stage_index] += 1
            elif a.computation_type in (CT.FULL_BACKWARD, CT.BACKWARD_WEIGHT):
                held[a.stage_index] -= 1
            seen.add((held[r], held[2 * pp - 1 - r]))
    return {p for p in seen if not any(q != p and q[0] >= p[0] and q[1] >= p[1] for q in seen)}


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_each_chunk_holds_the_micro_batches_torch_s_own_order_keeps_in_flight(schedule):
    torch_sched = pytest.importorskip("torch.distributed.pipelining.schedules")
    cls = {"zbv": torch_sched.ScheduleZBVZeroBubble, "dualpipev": torch_sched.ScheduleDualPipeV}[schedule]
    for pp in range(2, 7):
        for M in range(2 * pp, 4 * pp + 2):
            lay = from_layouts([Layout(gpus=pp, pp=pp, vpp=2, mbs=1, global_batch=M, seq=8, schedule=schedule)])
            for r in range(pp):
                ours = {(int(a[0]), int(b[0])) for a, b in v_in_flight(lay, r)}
                assert ours == _torch_states(cls, pp, M, r), (schedule, pp, M, r)


def test_rank_zero_weighs_its_first_chunk_by_2pp_minus_1_and_binds():
    """qwen3-235b-a22b, zbv, pp 8: 94 layers split 6 x 14, 5, 5. Rank 0 holds 15 micro-batches
    of chunk 0 (6 layers) and 1 of chunk 15 (5 layers, the LM head): 95 layer-micro-batches, not
    the 8 x 11 = 88 of pp micro-batches through all its layers, and the most memory of any rank."""
    lay = from_layouts([Layout(**QWEN_ZBV)])
    est = evaluate(QWEN, H100, lay)
    assert [len(c) for c in materialise(QWEN.num_layers, 16, est.chunks)] == [6] * 14 + [5, 5]
    a_moe = _pipeline(QWEN, H100, lay, Routing(), "bf16").lc["a_moe"][0] / GIB
    rows = {d["role"]: d for d in est.row(0)["memory_gib_per_stage"]}
    assert rows["first+last"]["activations"] == pytest.approx(95 * a_moe, abs=1e-3)
    assert rows["first+last"]["total"] == pytest.approx(132.04, abs=0.01)
    assert float(est.peak_memory_gib[0]) == pytest.approx(rows["first+last"]["total"], abs=1e-3)


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
@pytest.mark.parametrize("L", [94, 61, 48, 41, 40, 36, 30])  # 13, 12, 0, 9, 7, 4 and 13 larger middle chunks
def test_every_row_is_a_real_rank_and_the_middle_row_is_the_busiest_middle_rank(schedule, L):
    """Rows name rank 0 (the embedding and the LM head), a middle rank and rank pp - 1, each with
    the layers its own two chunks hold; the middle row holds the most activations of ranks
    1 .. pp-2, counted chunk by chunk, so the peak is the largest over every rank."""
    m = type(QWEN).model_validate({**QWEN.model_dump(), "num_layers": L})  # a copy would keep cached layer counts
    pp = 8
    lay = from_layouts([Layout(**{**QWEN_ZBV, "schedule": schedule})])
    est = evaluate(m, H100, lay)
    sizes = [len(c) for c in materialise(L, 2 * pp, est.chunks)]
    a_moe = _pipeline(m, H100, lay, Routing(), "bf16").lc["a_moe"][0] / GIB
    held = [max(a * sizes[r] + b * sizes[2 * pp - 1 - r] for a, b in
                ((int(x[0]), int(y[0])) for x, y in v_in_flight(lay, r))) * a_moe for r in range(pp)]
    rows = {d["role"]: d for d in est.row(0)["memory_gib_per_stage"]}
    assert rows["first+last"]["stage"] == 0 and rows["turn"]["stage"] == pp - 1
    assert rows["turn"]["logits"] == 0.0 and rows["first+last"]["logits"] > 0  # the LM head runs on rank 0
    assert rows["turn"]["activations"] == pytest.approx(held[pp - 1], abs=1e-3)
    assert rows["mid"]["activations"] == pytest.approx(held[rows["mid"]["stage"]], abs=1e-3)
    assert rows["mid"]["activations"] == pytest.approx(max(held[1:pp - 1]), abs=1e-3)
    assert float(est.peak_memory_gib[0]) == pytest.approx(max(d["total"] for d in rows.values()))


def test_the_mtp_module_beside_the_head_holds_the_head_chunk_s_one_micro_batch():
    """deepseek-v3 with its MTP module under zbv (pp 16, even split: both models cut the same):
    rank 0 runs the module with the head in chunk 31, which holds one micro-batch at rank 0's
    peak, so the module adds one MoE layer and its inputs once, not pp times."""
    main, mtp = load_model("deepseek-v3"), load_model("deepseek-v3-mtp")
    hw = load_hardware("dgx-b200")
    lay = from_layouts([Layout(gpus=256, pp=16, vpp=2, dp=16, ep=8, mbs=1, global_batch=2048, seq=4096,
                               schedule="zbv", pipeline_split="even")])
    e_main, e_mtp = evaluate(main, hw, lay), evaluate(mtp, hw, lay)
    lc = _pipeline(mtp, hw, lay, Routing(), "bf16").lc
    mtp_in = 4.0 * mtp.hidden_size * 2.0 * 4096  # [norm(h); norm(emb)] and the norms' inputs, bf16
    added = e_mtp.memory["first"]["activations"][0] - e_main.memory["first"]["activations"][0]
    assert added == pytest.approx((lc["a_moe"][0] + mtp_in) / GIB, rel=1e-9)


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_the_middle_rank_named_is_the_busiest_in_layers_and_in_activations(schedule):
    """Every count of larger middle chunks (n_hi, the first of the 2pp - 2 middle chunks one
    layer more): the rank v_mid_rank names runs the most layers and holds the most
    layer-micro-batches of ranks 1 .. pp-2."""
    for pp in range(3, 9):
        lay = from_layouts([Layout(gpus=pp, pp=pp, vpp=2, mbs=1, global_batch=4 * pp, seq=8, schedule=schedule)])
        for n_hi in range(0, 2 * pp - 2):
            chunks = {r: [int(x) for x in v_chunks(3, n_hi, pp, r)] for r in range(1, pp - 1)}
            layers = {r: sum(c) for r, c in chunks.items()}
            held = {r: max(a[0] * c[0] + b[0] * c[1] for a, b in v_in_flight(lay, r)) for r, c in chunks.items()}
            named = int(v_mid_rank(n_hi, pp))
            assert layers[named] == max(layers.values()) and held[named] == max(held.values()), (pp, n_hi)


def test_a_v_schedules_rows_say_rank_0_holds_both_ends_and_rank_pp_minus_1_the_turn():
    from piper_plan.evaluate import estimate_layout
    from piper_plan.layout import Layout
    from piper_plan.specs.registry import load_hardware, load_model

    m, hw = load_model("mixtral-8x7b"), load_hardware("dgx-h100")
    lay = Layout(gpus=32, pp=4, dp=8, ep=8, vpp=2, schedule="zbv", global_batch=64, seq=4096)
    rows = {r["stage"]: r for r in estimate_layout(m, hw, lay).row(0)["memory_gib_per_stage"]}
    assert rows[0]["role"] == "first+last" and rows[0]["logits"] > 0
    assert rows[3]["role"] == "turn" and rows[3]["logits"] == 0
