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


def _ranks(sizes, pp, v_shape):
    """Each rank's chunk sizes: rank r runs chunks r and 2·pp - 1 - r (V) or r, r + pp, ... (looped)."""
    C = len(sizes)
    if v_shape:
        return [[sizes[r], sizes[C - 1 - r]] for r in range(pp)]
    return [sizes[r::pp] for r in range(pp)]


def _sizes(L, C, f, la):
    """Chunk sizes materialise gives ends of f and la layers: the first middle chunks one more."""
    import numpy as np

    from piper_plan.cost.stages import ChunkSizes

    rem, mids = L - f - la, C - 2
    cs = ChunkSizes(np.array(f), np.array(la), np.array(-(-rem // mids)), np.array(rem / mids), np.array(rem % mids))
    return [len(c) for c in materialise(L, C, cs)]


def _busiest(L, C, pp, v_shape, f, la, xf, xl):
    """The busiest rank's layers (+ the embedding and head where it runs them), counted chunk by chunk."""
    ranks = _ranks(_sizes(L, C, f, la), pp, v_shape)
    load = [sum(r) for r in ranks]
    load[0] += xf + (xl if v_shape else 0.0)
    if not v_shape:
        load[-1] += xl
    return max(load)


@pytest.mark.parametrize("v_shape", [True, False], ids=["V (zbv, dualpipev)", "looped (interleaved)"])
def test_each_ranks_layers_are_counted_chunk_by_chunk(v_shape):
    """rank_layers gives rank 0, the busiest middle rank and the last rank the layers their chunks
    hold (V: rank r runs chunks r and C-1-r; looped: r, r + pp, ...). The larger middle chunks,
    the first few, fall one a rank, so a middle rank runs vpp of them only once every rank has
    one: counting vpp larger chunks on every middle rank gave a DualPipeV middle rank 8 layers
    for 7 (48 layers, 16 chunks, a 1.2-layer head) and tipped the balanced split. Each is a real
    rank: a V schedule's middle role is the rank v_mid_rank names, its last role rank pp - 1 with
    its own two chunks (it stood in for the busiest middle rank, 7 layers where rank 7 of 48 on 8
    runs 6)."""
    import itertools

    import numpy as np

    from piper_plan.cost.stages import chunk_sizes, mid_base, rank_layers, v_mid_rank

    one = np.array([True])
    cases = ((61, 16, 2), (48, 8, 2), (30, 4, 2), (94, 16, 2), (26, 6, 2)) if v_shape else \
        ((61, 8, 4), (48, 8, 2), (30, 4, 2), (94, 8, 4), (26, 3, 4), (80, 4, 2), (30, 8, 1))
    for (L, pp, vpp), xf, xl in itertools.product(cases, (0.0, 0.05, 0.6), (0.0, 0.6, 1.2, 2.5, 3.8)):
        cs = chunk_sizes(L, np.array([pp * vpp]), np.array([xf]), np.array([xl]), minimise=one,
                         v_shape=np.array([v_shape]))
        ranks = [sum(r) for r in _ranks(_sizes(L, pp * vpp, int(cs.first[0]), int(cs.last[0])), pp, v_shape)]
        got = [int(x[0]) for x in rank_layers(L, cs, np.array([pp]), np.array([vpp]), np.array([v_shape]))]
        assert got == [ranks[0], max(ranks[1:-1]), ranks[-1]], (L, pp, vpp, xf, xl)
        if v_shape:
            assert ranks[int(v_mid_rank(cs.n_hi, pp)[0])] == max(ranks[1:-1])
            assert int(mid_base(cs)[0]) == min(_sizes(L, pp * vpp, int(cs.first[0]), int(cs.last[0]))[1:-1])


def test_every_stage_holds_one_of_four_kinds_of_layer_count_as_materialise_splits_them():
    """The interleaved walk and the chunks' memory read a stage's layers by its kind (stages.stage_kind:
    the first, a larger middle one, a smaller middle one, the last; stages.kind_layers): each
    stage's kind gives the layers materialise puts in it, on every split the search makes."""
    import itertools

    import numpy as np

    from piper_plan.cost.stages import chunk_sizes, kind_layers, stage_kind

    for L, C, xf, xl, v in itertools.product((7, 24, 61, 94, 126), (1, 2, 3, 8, 16, 32, 64), (0.0, 0.6), (0.3, 2.5),
                                             (False, True)):
        if C > L or (v and C % 2):
            continue
        cs = chunk_sizes(L, np.array([C]), np.array([xf]), np.array([xl]), minimise=np.array([True]),
                         v_shape=np.array([v]))
        sizes = [len(c) for c in materialise(L, C, cs)]
        kinds = stage_kind(np.arange(C), C, cs.n_hi[0])
        assert [int(kind_layers(cs)[k, 0]) for k in kinds] == sizes, (L, C, xf, xl, v)


def test_a_looped_ranks_stages_count_by_kind_as_stage_kind_labels_them_one_by_one():
    """interleaved_pipe shares a rank's windows by its compute summed over its stages j·pp + rank,
    read as each kind's count (stages.kind_counts) times that kind's figure: the counts are those
    of stage_kind over the rank's stages, for every rank, vpp and number of larger middle stages
    (vpp 1: 1F1B's one stage a rank, as its walk reads them)."""
    import numpy as np

    from piper_plan.cost.stages import kind_counts, stage_kind

    for pp in (2, 3, 4, 7, 8, 16):
        for vpp in (1, 2, 3, 5, 8):
            C = pp * vpp
            for n_hi in range(max(C - 2, 1)):
                got = kind_counts(np.full(pp, pp), np.full(pp, vpp), np.full(pp, n_hi), np.arange(pp))
                for rank in range(pp):
                    want = np.bincount(stage_kind(np.arange(vpp) * pp + rank, C, n_hi), minlength=4)
                    assert got[:, rank].tolist() == want.tolist(), (pp, vpp, n_hi, rank)


def test_v_schedules_balance_rank_zeros_two_end_chunks_against_the_busiest_middle_rank():
    """zbv / dualpipev: rank 0 runs the first and the last chunk. Against a brute-force search
    over both ends' sizes with each rank's chunks counted one by one, the balanced split reaches
    the same busiest rank (layers + embedding + head), including heads heavier than a chunk's
    share (x_l 2.5, 3.8: DeepSeek-V3 with its MTP module beside the head), where one end at a
    time could only bring the head's chunk down to one layer."""
    import itertools

    import numpy as np

    from piper_plan.cost.stages import chunk_sizes

    one = np.array([True])
    for (L, pp), xf, xl in itertools.product(((61, 16), (48, 8), (30, 4), (94, 16), (26, 6)), (0.0, 0.05, 0.6),
                                             (0.0, 0.6, 1.2, 2.5, 3.8)):
        C = 2 * pp
        cs = chunk_sizes(L, np.array([C]), np.array([xf]), np.array([xl]), minimise=one, v_shape=one)
        ours = _busiest(L, C, pp, True, int(cs.first[0]), int(cs.last[0]), xf, xl)
        exact = min(_busiest(L, C, pp, True, f, la, xf, xl)
                    for f in range(1, L) for la in range(1, L) if L - f - la >= C - 2)
        assert ours == pytest.approx(exact), (L, pp, xf, xl)


def test_a_model_with_more_layers_never_prices_faster_on_the_same_layout():
    """Qwen3-30B-A3B on 64 Frontier GCDs, DualPipeV over PP 8: 48 layers priced 33.1 s a step and
    52 layers 30.4 s, because a middle rank was counted at two larger chunks (8 layers) where it
    runs one (7), which tipped the 48-layer split towards rank 0. Layers 44 to 56 now price in order."""
    m, hw = load_model("qwen3-30b-a3b"), load_hardware("frontier")
    lay = Layout(gpus=64, tp=2, pp=8, dp=4, ep=8, vpp=2, mbs=2, global_batch=1024, seq=4096, schedule="dualpipev",
                 recompute="full", sequence_parallel=True, zero=1)
    steps = [float(evaluate(m.model_copy(update={"num_layers": L}), hw, from_layouts([lay])).step_time_s[0])
             for L in (44, 48, 52, 56)]
    assert steps == sorted(steps), steps


def test_a_rank_with_less_work_but_more_exchange_sets_the_zero_bubble_schedules_bubble():
    """zbv's bubble reads a rank's own F, B and W (schedule.zbv_bubble), and its all-to-all runs in
    F and B but not in the weight pass W. DeepSeek-V2 on 128 MI300X, ZB-V over PP 8: with 64 layers rank 0
    (the embedding, the LM head, one dense layer) has the most work, a middle rank (8 MoE layers)
    the most exchange. Pricing the bubble of the busiest rank alone priced 64 layers 1.6 % faster
    than 60; each rank's own micro-batches and bubble, the longest of them, prices them in order."""
    m, hw = load_model("deepseek-v2"), load_hardware("amd-mi300x")
    lay = Layout(gpus=128, pp=8, dp=16, ep=8, vpp=2, mbs=8, global_batch=1024, seq=4096, schedule="zbv",
                 recompute="full", zero=2, a2a="halo", placement="spread")
    steps = [float(evaluate(m.model_copy(update={"num_layers": L}), hw, from_layouts([lay])).step_time_s[0])
             for L in (56, 60, 64, 68)]
    assert steps == sorted(steps), steps


def test_megatron_s_even_split_refuses_layers_that_do_not_fill_its_chunks():
    """Megatron-Core's even split asserts num_layers % pp == 0 and its layers a stage % vpp == 0
    (transformer_block.get_num_layers_to_build; the account split counts the embedding and the
    loss as a layer each first). Llama 3 70B's 80 layers fill neither 32 stages nor 8 x 4 chunks."""
    from piper_plan.errors import LayoutError
    from piper_plan.layout import check_layout

    base = dict(gpus=256, dp=8, mbs=1, global_batch=512, seq=8192)
    for pp, vpp in ((32, 1), (8, 4), (6, 1)):
        kw = dict(pp=pp, vpp=vpp, schedule="interleaved" if vpp > 1 else "1f1b", gpus=pp * 8)
        with pytest.raises(LayoutError, match="pipeline_split even needs whole layers a chunk"):
            check_layout(Layout(**{**base, **kw}, pipeline_split="even"), 80)
        check_layout(Layout(**{**base, **kw}), 80)  # the cost-balanced split takes any count
    for pp, vpp in ((16, 1), (8, 5), (4, 2)):
        check_layout(Layout(**{**base, "gpus": pp * 8}, pp=pp, vpp=vpp, pipeline_split="even",
                            schedule="interleaved" if vpp > 1 else "1f1b"), 80)
    # 94 layers + 2 slots fill 8 x 4 chunks under account, not under even
    qwen = dict(gpus=64, pp=8, vpp=4, dp=8, mbs=1, global_batch=512, seq=4096, schedule="interleaved")
    check_layout(Layout(**qwen, pipeline_split="account"), 94)
    with pytest.raises(LayoutError, match="94 layer slots do not split into pp=8 x vpp=4"):
        check_layout(Layout(**qwen, pipeline_split="even"), 94)


def test_the_search_ranks_no_even_split_megatron_refuses():
    from piper_plan.search import SearchSpace, search

    m, hw = load_model("llama3-70b"), load_hardware("dgx-h100")
    res = search(m, hw, SearchSpace(gpus=256, global_batch=512, seq=4096, pipeline_split="even"))
    assert res.rejected["pipeline_split even needs layers % (pp*vpp) == 0"] > 0
    chunks = res.batch.pp[res.order] * res.batch.vpp[res.order]
    assert len(chunks) and (80 % chunks == 0).all()
    balanced = search(m, hw, SearchSpace(gpus=256, global_batch=512, seq=4096))
    assert not any(k.startswith("pipeline_split") for k in balanced.rejected)
