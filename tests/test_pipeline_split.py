"""Layout.pipeline_split: how layers fall into pipeline chunks. Megatron-Core splits evenly unless
told to count the embedding and the loss as a layer each; piper balances by cost. A big LM head
(GPT-OSS: 201k vocabulary) makes the even split's last stage the pipeline's straggler."""
import pytest

from piper_plan.cost.batch import from_layouts
from piper_plan.cost.estimate import evaluate
from piper_plan.cost.stages import materialise
from piper_plan.layout import Layout
from piper_plan.specs.registry import load_hardware, load_model


def _run(m, hw, **kw):
    splits = ("balanced", "even", "account")
    lays = [Layout(**kw, pipeline_split=s) for s in splits]
    est = evaluate(m, hw, from_layouts(lays))
    parts = {s: materialise(m.num_layers, lays[i].stages, est.chunks, i) for i, s in enumerate(splits)}
    return est, parts


def test_megatron_splits_put_whole_layers_where_its_rules_do():
    m, hw = load_model("gpt-oss-120b"), load_hardware("dgx-h100")
    est, parts = _run(m, hw, gpus=64, pp=4, ep=8, dp=16, mbs=1, global_batch=256, seq=4096)
    assert [len(c) for c in parts["even"]] == [9, 9, 9, 9]  # 36 layers / 4
    # balanced by cost: the LM head's stage holds fewer layers than the others
    bal = [len(c) for c in parts["balanced"]]
    assert bal[-1] < 9 and sum(bal) == 36
    # the even split's last stage runs 9 layers and the head: the slowest step of the three
    assert est.step_time_s[1] > est.step_time_s[2] >= est.step_time_s[0]


def test_account_counts_the_embedding_and_loss_as_one_layer_each():
    m, hw = load_model("qwen3-235b-a22b"), load_hardware("dgx-h100")
    _, parts = _run(m, hw, gpus=256, pp=8, vpp=4, schedule="interleaved", ep=8, dp=32, mbs=1, global_batch=512,
                    seq=4096)
    sizes = [len(c) for c in parts["account"]]
    # 94 layers + 2 slots over 32 chunks: 3 slots each, the first and last give one up
    assert sizes[0] == 2 and sizes[-1] == 2 and set(sizes[1:-1]) == {3} and sum(sizes) == 94


def test_one_stage_ignores_the_split():
    m, hw = load_model("gpt-oss-120b"), load_hardware("dgx-h100")
    est, _ = _run(m, hw, gpus=8, pp=1, ep=8, dp=8, mbs=1, global_batch=64, seq=4096)
    assert est.step_time_s[0] == pytest.approx(est.step_time_s[1]) == pytest.approx(est.step_time_s[2])


def test_the_balanced_split_reaches_the_exact_min_max_partition():
    """chunk_sizes' balanced rule against partition.balanced_partition (exact) on equal layers
    with an embedding and LM head of various weights: the largest chunk is the same."""
    import itertools

    import numpy as np

    from piper_plan.cost.stages import chunk_sizes
    from piper_plan.partition import balanced_partition

    one = np.array([True])
    for L, C in ((61, 32), (48, 24), (30, 7), (94, 32), (12, 5), (26, 13)):
        for xf, xl in itertools.product((0.0, 0.05, 0.6), (0.0, 0.27, 0.6, 1.2, 2.5)):
            cs = chunk_sizes(L, np.array([C]), np.array([xf]), np.array([xl]), minimise=one)
            ours = max(cs.first[0] + xf, cs.last[0] + xl, cs.mid_hi[0])
            exact = max(len(p) + xf * (0 in p) + xl * (L - 1 in p)
                        for p in balanced_partition(np.ones(L), C, xf, xl))
            assert ours == pytest.approx(exact), (L, C, xf, xl)


def test_61_layers_on_32_stages_leave_the_lm_head_a_stage_of_one_layer():
    # every middle stage holds 2 layers whatever the ends hold, so the head's stage takes 1:
    # rounding (61 + head) / 32 per end gave it 2 layers and the head, the pipeline's straggler
    m, hw = load_model("xmoe-super"), load_hardware("frontier")
    est, parts = _run(m, hw, gpus=512, pp=32, ep=16, dp=16, mbs=1, global_batch=1024, seq=4096, recompute="full",
                      zero=2, sequence_parallel=False)
    sizes = [len(c) for c in parts["balanced"]]
    assert sizes[-1] == 1 and max(sizes) == 2 and sum(sizes) == 61
    # even (Megatron's default) keeps its own rule: it cannot split 61 evenly and rounds
    assert est.step_time_s[0] < est.step_time_s[1]


def test_v_schedules_balance_rank_zeros_two_end_chunks_as_a_pair():
    """zbv / dualpipev: rank 0 runs the first and the last chunk. Against a brute-force search
    over both ends' sizes, rank 0's pair (layers + embedding + head) weighed against a middle
    rank's pair of chunks gives the same bottleneck, including heads heavier than a chunk's share
    (x_l 2.5, 3.8: DeepSeek-V3 with its MTP module beside the head), where one end at a time
    could only bring the head's chunk down to one layer."""
    import itertools

    import numpy as np

    from piper_plan.cost.stages import chunk_sizes

    one = np.array([True])
    for L, C in ((61, 32), (48, 16), (30, 8), (94, 32), (26, 12)):
        for xf, xl in itertools.product((0.0, 0.05, 0.6), (0.0, 0.6, 1.2, 2.5, 3.8)):
            cs = chunk_sizes(L, np.array([C]), np.array([xf]), np.array([xl]), minimise=one, v_shape=one)
            ours = max(cs.first[0] + xf + cs.last[0] + xl, 2 * cs.mid_hi[0])
            exact = min(max(f + xf + la + xl, 2 * -(-(L - f - la) // (C - 2)))
                        for f in range(1, L) for la in range(1, L) if L - f - la >= C - 2)
            assert ours == pytest.approx(exact), (L, C, xf, xl)
