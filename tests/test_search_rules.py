"""The search ranks only what the layout check accepts, and drops as duplicates only what prices the
same: recompute_layers' bound, the overlapped all-to-all's compute units, one stage's schedule, an
a2a choice with no flat twin searched, HALO at the scale-up domain; sweep keeps its headroom."""
import numpy as np
import pytest
from click.testing import CliRunner

from piper_plan.cli import main
from piper_plan.errors import LayoutError
from piper_plan.layout import Layout, check_for, check_layout, rank_coords
from piper_plan.search import SearchSpace, search
from piper_plan.specs.registry import load_hardware, load_model

MIXTRAL, H100 = load_model("mixtral-8x7b"), load_hardware("dgx-h100")


def test_every_layout_ranked_under_recompute_layers_passes_the_layout_check():
    res = search(MIXTRAL, H100, SearchSpace(gpus=128, global_batch=512, seq=4096, recomputes=("full",),
                                            recompute_layers=(20,)), objective="memory")
    assert res.rejected.get("recompute_layers <= the layers of a chunk", 0) > 0
    for i in res.order[:200]:
        check_for(res.batch.layout(i), MIXTRAL, H100)


def test_an_overlapped_all_to_all_holding_every_sm_is_refused_before_the_search():
    with pytest.raises(LayoutError, match="a2a_sms=500 of the 132"):
        search(MIXTRAL, H100, SearchSpace(gpus=16, global_batch=64, seq=4096, a2a_overlap=True, a2a_sms=500))
    r = CliRunner().invoke(main, ["search", "-m", "mixtral-8x7b", "-H", "dgx-h100", "-n", "16", "--a2a-overlap",
                                  "--a2a-sms", "500"])
    assert r.exit_code == 2 and "a2a_sms=500" in r.output and len(r.output.strip().splitlines()) == 1


def test_one_stage_runs_no_pipeline_schedule():
    lay = dict(gpus=32, dp=32, ep=4, mbs=2, global_batch=64, seq=4096)
    check_layout(Layout(**lay), 24, 32)
    for sched, vpp in (("dualpipev", 2), ("zbv", 2), ("gpipe", 1)):
        with pytest.raises(LayoutError, match="pp=1 runs no pipeline schedule"):
            check_layout(Layout(**lay, schedule=sched, vpp=vpp), 24, 32)


def test_halo_alone_keeps_the_layouts_without_expert_parallelism():
    # without expert parallelism there is no all-to-all: asked for HALO alone, those layouts stay
    qwen, space = load_model("qwen3-30b-a3b"), dict(gpus=16, global_batch=64, seq=4096)
    halo_only, both = (search(qwen, H100, SearchSpace(**space, **kw)) for kw in ({"a2as": ("halo",)}, {}))
    no_ep = lambda r: r.est.tokens_per_s[r.order][r.batch.ep[r.order] == 1]  # noqa: E731
    assert len(no_ep(halo_only)) == len(no_ep(both)) > 0
    assert float(no_ep(halo_only).max()) == pytest.approx(float(no_ep(both).max()))


@pytest.mark.parametrize("job_block", [64, 72])
def test_on_nvl72_halo_is_searched_where_an_ep_group_leaves_the_rack(job_block):
    # the cost model splits HALO at the scale-up domain (a rack's job_block of ranks), not at the
    # 4-GPU tray; filled 72 a rack, an EP group of 16 in a world of 288 fits a rack by its size, but
    # the group on ranks 64-79 has 8 members in each of two racks (rank_coords), so HALO differs
    # from flat there too
    from piper_plan.sweep import set_field

    m = load_model("qwen3-235b-a22b")
    gb200 = set_field(load_hardware("gb200-nvl72"), "topology.1.job_block", job_block)
    res = search(m, gb200, SearchSpace(gpus=288, global_batch=1152, seq=4096))
    b = res.batch
    halo = np.flatnonzero(b.a2a == 1)
    assert len(halo)
    small = 0
    for i in halo[:300]:
        lay = b.layout(i)
        racks = {}
        for c in rank_coords(lay, gb200.gpus_per_node):
            racks.setdefault((c.pp, c.edp, c.etp), set()).add(c.rank // job_block)
        assert max(len(r) for r in racks.values()) > 1, lay
        stride = lay.etp if lay.placement == "packed" else lay.dp * lay.cp * lay.tp // lay.ep
        small += lay.ep * stride <= job_block
    # filled 72: groups no larger than a rack that some rack boundary still cuts; filled 64, the
    # groups HALO is searched for here all span more than a rack's 64 ranks
    assert small if job_block == 72 else not small


def test_sweep_keeps_the_headroom_it_is_given():
    from piper_plan.sweep import run_sweep
    space = SearchSpace(gpus=64, global_batch=512, seq=4096)
    free, kept = (run_sweep(MIXTRAL, H100, [64], {}, space, headroom_gib=h)[0] for h in (0.0, 60.0))
    assert kept["peak_memory_gib"] + 60.0 <= H100.accelerator.memory_gib < free["peak_memory_gib"] + 60.0
    assert kept["global_batch"] == free["global_batch"] == 512


def test_one_stage_layouts_are_searched_whatever_schedules_are_asked_for():
    # pp 1 runs no schedule: it had been dropped as a duplicate of the 1f1b it was not asked for
    m, hw = load_model("gpt-1.7b"), load_hardware("dgx-h100")
    inter = search(m, hw, SearchSpace(gpus=8, global_batch=512, seq=2048, schedules=("interleaved",)))
    every = search(m, hw, SearchSpace(gpus=8, global_batch=512, seq=2048))
    best = inter.batch.layout(inter.best)
    assert (best.pp, best.schedule, best.vpp) == (1, "1f1b", 1)
    assert inter.est.tokens_per_s[inter.best] == every.est.tokens_per_s[every.best]


def test_sequence_parallelism_needs_each_ranks_sequence_to_split_over_tp():
    m, hw = load_model("llama3-70b"), load_hardware("dgx-h100")
    res = search(m, hw, SearchSpace(gpus=32, global_batch=64, seq=4100))
    assert res.rejected["sequence parallelism needs (seq/cp) % tp == 0"] > 0
    assert all(4100 % res.batch.layout(i).tp == 0 for i in res.order)
    with pytest.raises(LayoutError, match="does not split into tp=8"):
        check_for(Layout(gpus=32, tp=8, pp=4, dp=1, global_batch=64, seq=4100), m, hw)


def test_megatron_lm_s_interleaved_schedule_without_p2p_overlap_needs_more_than_two_stages():
    m, hw = load_model("mixtral-8x7b"), load_hardware("dgx-h100")
    res = search(m, hw, SearchSpace(gpus=16, global_batch=256, seq=4096, schedules=("interleaved",), p2p_overlap=False))
    lays = [res.batch.layout(i) for i in res.order]
    assert lays and all(x.pp != 2 for x in lays if x.schedule == "interleaved")
    assert res.rejected["interleaved without p2p overlap needs pp > 2"] > 0


def test_piper_train_s_diagnosis_names_no_option_it_cannot_run():
    r = CliRunner().invoke(main, ["search", "-m", "llama3-70b", "-H", "gb200-nvl72", "-n", "4", "--runtime",
                                  "piper-train", "--global-batch", "64"])
    assert r.exit_code == 1 and "nothing fits" in r.output
    assert "--optimizer-offload" not in r.output and "host's memory" not in r.output


def test_the_diagnosis_says_when_the_machine_has_no_more_gpus():
    r = CliRunner().invoke(main, ["search", "-m", "kimi-k2", "-H", "dgx-h800", "-n", "1024", "--headroom-gib", "70"])
    assert r.exit_code == 1 and "no fit up to the machine's 2048 GPUs (max_gpus)" in r.output


def test_a_sweep_prices_the_batch_it_is_given_and_says_which():
    r = CliRunner().invoke(main, ["sweep", "-m", "gpt-1.7b", "-H", "dgx-h100", "--gpus", "8,16", "--global-batch",
                                  "12"], terminal_width=200)
    assert r.exit_code == 0, r.output
    assert [ln.split("│")[2].strip() for ln in r.output.splitlines() if ln.startswith("│")] == ["12", "12"]


def test_the_search_tries_every_micro_batch_size_that_splits_the_batch():
    # 1,024 short sequences of a small model on 4 ranks: the fastest micro-batch is far above 16
    m, cpu = load_model("tiny-moe"), load_hardware("cpu-local")
    sp = SearchSpace(gpus=4, global_batch=1024, seq=m.seq_len, pps=(1,), eps=(1,), zeros=(0,))
    res = search(m, cpu, sp)
    tried = set(res.batch.mbs.tolist())
    assert {1, 2, 16, 32, 64, 128, 256} <= tried and 3 not in tried  # 3 splits no share of 1,024
    at16 = search(m, cpu, SearchSpace(**{**sp.__dict__, "mbs": (1, 2, 4, 8, 16)}))
    assert res.batch.mbs[res.best] > 16
    assert res.est.tokens_per_s[res.best] > at16.est.tokens_per_s[at16.best]


def test_zero_stages_without_a_data_parallel_group_are_searched_once():
    # tp 8 pp 8 ep 8 on 64 GPUs leaves no data-parallel group: ZeRO 0, 1 and 2 run the same step
    res = search(MIXTRAL, H100, SearchSpace(gpus=64, global_batch=64, seq=4096, tps=(8,), pps=(8,)),
                 objective="memory")
    alone = (res.batch.dp == 1) & (res.batch.ep * res.batch.etp == res.batch.tp)
    assert alone.any() and set(res.batch.zero[alone].tolist()) == {0}
    assert res.rejected["duplicate (ZeRO stage without a data-parallel group)"] > 0
    top = [res.batch.layout(i) for i in res.order[:10]]
    assert len({repr(x.model_copy(update={"zero": 0})) for x in top}) == len(top)  # none differs by ZeRO alone


def test_memory_refusals_name_the_headroom_they_were_held_to():
    res = search(MIXTRAL, H100, SearchSpace(gpus=64, global_batch=1024, seq=4096), headroom_gib=8)
    avail = H100.accelerator.memory_gib - 8
    assert res.rejected[f"worst stage exceeds device memory less the 8 GiB headroom ({avail:.1f} GiB)"] > 0
    assert not any(k == "worst stage exceeds device memory" for k in res.rejected)


def test_equal_throughput_ranks_the_layout_holding_less_memory_first():
    res = search(load_model("qwen3-235b-a22b"), load_hardware("gb200-nvl72"),
                 SearchSpace(gpus=128, global_batch=1024, seq=4096))
    tok, mem = res.est.tokens_per_s[res.order], res.est.peak_memory_gib[res.order]
    ties = np.flatnonzero(tok[1:] == tok[:-1])
    assert len(ties) and (mem[ties + 1] >= mem[ties]).all()


def test_tensor_parallelism_that_would_straddle_scale_up_domains_is_a_counted_refusal():
    # on 48 GPUs of 8-GPU nodes tp 6 (ranks 6-11 in two nodes), 12, 16, ... are refused, counted
    m = load_model("gpt-175b")
    res = search(m, load_hardware("dgx-a100-80gb"), SearchSpace(gpus=48, global_batch=1536, seq=2048))
    assert set(res.batch.tp.tolist()) <= {1, 2, 4, 8}
    assert res.rejected["tp not a divisor of the scale-up domain (8 GPUs): a tp group's collectives on every "
                        "layer would cross the NICs"] > 0


def test_a_micro_batch_whose_logits_alone_overflow_the_device_is_refused_by_a_bound_that_holds():
    from piper_plan.cost.batch import from_layouts
    from piper_plan.cost.estimate import evaluate
    from piper_plan.search import LOGITS_BOUND, enumerate_layouts
    m, hw = load_model("deepseek-v3"), load_hardware("frontier")
    batch, rejected = enumerate_layouts(m, hw, SearchSpace(gpus=64, global_batch=8192, seq=4096, pps=(8,), eps=(8,)))
    assert rejected[LOGITS_BOUND] > 0 and batch.mbs.max() <= 160 and (batch.mbs[batch.tp == 1] <= 20).all()
    # just over the bound at tp 8 (a sequence's logits are 3.2 GB / 8): the layout estimate prices overflows
    lay = Layout(gpus=64, tp=8, pp=8, dp=1, ep=8, mbs=256, global_batch=8192, seq=4096, recompute="full")
    assert not evaluate(m, hw, from_layouts([lay])).fits[0]
