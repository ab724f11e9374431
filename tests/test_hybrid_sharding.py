"""Hybrid sharding (Layout.zero_replicas: HSDP, Megatron-Core's partial distributed optimizer): a
ZeRO shard spans dp·cp / r neighbouring ranks and its r copies all-reduce it once a step."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

from piper_plan.cli import main
from piper_plan.cost import comm
from piper_plan.cost.batch import from_layouts
from piper_plan.cost.estimate import evaluate
from piper_plan.layout import Layout, rank_coords
from piper_plan.search import SearchSpace, hsdp_replicas, search
from piper_plan.specs import load_hardware, load_model
from piper_plan.sweep import set_field

MIXTRAL, H100 = load_model("mixtral-8x7b"), load_hardware("dgx-h100")


def _est(m, hw, layouts):
    return evaluate(m, hw, from_layouts(layouts))


def test_a_shard_of_a_hybrid_layout_holds_what_whole_group_zero_holds_over_that_many_ranks():
    # 128 ranks as 4 copies of a 32-rank shard hold, per rank, the state ZeRO holds over 32 ranks
    # (EP 8: experts replicated over 16 ranks, sharded over 16 / 4 = 4 of them, as over edp 4)
    for zero in (1, 2, 3):
        h, w = (_est(MIXTRAL, H100, [Layout(gpus=g, dp=g, ep=8, global_batch=4 * g, seq=4096, zero=zero,
                                            zero_replicas=r)]).memory["first"] for g, r in ((128, 4), (32, 1)))
        for part in ("weights", "grads", "master", "optimizer"):
            assert h[part][0] == pytest.approx(w[part][0], rel=1e-12), (zero, part)


def test_more_copies_of_each_shard_never_hold_less():
    lays = [Layout(gpus=128, dp=128, ep=8, global_batch=512, seq=4096, zero=z, zero_replicas=r)
            for z in (1, 2, 3) for r in (1, 2, 4, 8, 16, 32, 64)]
    peak = _est(MIXTRAL, H100, lays).peak_memory_gib.reshape(3, -1)
    assert (np.diff(peak, axis=1) > 0).all()


def _collectives(lay: Layout, m=MIXTRAL, hw=H100):
    from piper_plan.cost.estimate import _group_terms
    from piper_plan.cost.reduction import collectives, hybrid

    b = from_layouts([lay])
    grp = _group_terms(hw, b, m.hidden_size)
    rep, exp = np.array([1e9]), np.array([4e9])  # a rank's replicated and expert parameters
    eb = b.act_bytes.astype(float)
    return b, grp["edp"], hybrid(hw, b, grp["edp"], rep, exp, eb, collectives(hw, b, grp, rep, exp, eb))


def test_a_shard_reduces_and_gathers_as_a_group_of_its_size_and_its_copies_all_reduce_the_shard():
    # 16 nodes of 8 H100s, r = 16: a dense shard is one node's 8 ranks; the experts (EP 8, so 16
    # ranks hold each) are sharded over 16 / 16 = 1 rank. Each copy's ring runs a shard apart
    _, _, hy = _collectives(Layout(gpus=128, dp=128, ep=8, global_batch=512, seq=4096, zero=1, zero_replicas=16))
    _, _, node = _collectives(Layout(gpus=8, dp=8, ep=8, global_batch=32, seq=4096, zero=1))
    assert hy.rs_half[0] == pytest.approx(node.rs_half[0], rel=1e-12)  # experts: a shard of one rank reduces nothing
    assert hy.ag[0] == pytest.approx(node.ag[0], rel=1e-12)
    gb = 4.0
    want = comm.allreduce(H100, 1e9 * gb / 8, 16, 8) + comm.allreduce(H100, 4e9 * gb / 1, 16, 8)
    assert hy.ar_rep[0] == pytest.approx(float(want), rel=1e-12)
    _, _, whole = _collectives(Layout(gpus=128, dp=128, ep=8, global_batch=512, seq=4096, zero=1))
    assert whole.ar_rep == 0.0 and whole.ag[0] > hy.ag[0]  # one group over 16 nodes: no copies, a longer ring


def test_the_copies_all_reduce_once_a_step_after_the_last_reduce_scatter():
    from piper_plan.cost.reduction import PipeWindow, dp_comm_time

    z = np.zeros(1)
    for zero in (1, 2):
        b, edp, hy = _collectives(Layout(gpus=128, dp=128, ep=8, global_batch=512, seq=4096, zero=zero,
                                         zero_replicas=16, overlap_grad_reduce=False))
        M = b.m.astype(float)
        t = dp_comm_time(H100, b, edp, PipeWindow(z, z, z, M), hy)
        co = H100.efficiency.collective_overhead_us * 1e-6
        # two reductions, a node's 8 dense owners (experts: one), two copies' rings, the norm
        calls = co * (2 + 8 + 2 + 1)
        rounds = M if zero == 2 else 1.0  # ZeRO-2 reduce-scatters each micro-batch
        assert t[0] == pytest.approx(rounds * hy.rs_half[0] + hy.ag[0] + hy.ar_rep[0] + calls, rel=1e-12)


def _cli(*args):
    r = CliRunner().invoke(main, list(args))
    return r.exit_code, r.output


@pytest.mark.parametrize("extra,needle", [
    (["--zero", "0", "--zero-replicas", "2"], "zero_replicas == 1 with zero 0"),
    (["--zero-replicas", "3"], "zero_replicas divides dp into shards of 2 ranks or more"),
    (["--zero-replicas", "16"], "zero_replicas divides dp into shards of 2 ranks or more"),  # shards of one rank
    (["--ep", "4", "--zero-replicas", "8"], "zero_replicas divides the expert-data-parallel group"),
])
def test_replicas_that_cannot_split_the_groups_are_refused_in_one_line(extra, needle):
    code, out = _cli("estimate", "-m", "mixtral-8x7b", "-H", "dgx-h100", "-n", "16", "--global-batch", "64", *extra)
    lines = [x for x in out.strip().splitlines() if x.strip()]
    assert code == 2 and len(lines) == 1 and needle in lines[0] and "Traceback" not in out, out


def test_the_search_tries_hybrid_sharding_only_when_asked_and_keeps_each_shard_inside_the_scale_up_domain():
    sp = dict(gpus=256, global_batch=1024, seq=4096)
    plain = search(MIXTRAL, H100, SearchSpace(**sp))
    assert (plain.batch.zrep == 1).all()
    hy = search(MIXTRAL, H100, SearchSpace(hsdp=True, **sp))
    b = hy.batch
    on = b.zrep > 1
    assert on.any() and (b.zero[on] >= 1).all()
    shard = b.dpcp[on] // b.zrep[on]
    assert (shard * b.tp[on] <= 8).all() and (shard >= 2).all()  # a node of 8 H100s holds each shard
    # every whole-group layout is still there, priced as before
    assert hy.evaluated > plain.evaluated and np.isin(plain.est.step_time_s, hy.est.step_time_s).all()


@pytest.mark.parametrize("job_block,want", [
    # filled 64 a rack (the bundled spec, NVIDIA's --segment 16): shards of 64, 32 at tp 2; 576 ranks in 9 racks
    (64, [4, 8, 9, 1, 1]),
    # filled 72 a rack: shards of 64 of a 256-rank group would put ranks 64-71 of the second in the first
    # rack, so only shards of 8 stay whole (4 at tp 2); a group of 576 cuts into shards of 72; 64 ranks fit
    # one rack while they are the whole world, not in a world of 128
    (72, [32, 64, 8, 1, 8]),
])
def test_the_scale_up_domain_of_an_nvl72_rack_holds_a_shard_of_as_many_ranks_as_a_job_fills(job_block, want):
    gb200 = set_field(load_hardware("gb200-nvl72"), "topology.1.job_block", job_block)
    tp, dpcp, world = np.array([1, 2, 1, 1, 1]), np.array([256, 256, 576, 64, 64]), np.array([256, 512, 576, 64, 128])
    assert list(hsdp_replicas(gb200, tp, dpcp, world)) == want
    # each of those shards (dp // shard neighbouring members of a data-parallel group) sits in one
    # rack, as layout.rank_coords places its ranks job_block a rack
    for t, d, w, r in zip(tp, dpcp, world, want):
        lay = Layout(gpus=int(w), tp=int(t), dp=int(d), pp=int(w // (d * t)), global_batch=int(d), seq=4096)
        racks = {}
        for c in rank_coords(lay, gb200.gpus_per_node):
            racks.setdefault((c.pp, c.dp // (d // r), c.tp), set()).add(c.rank // job_block)
        assert all(len(x) == 1 for x in racks.values())


def test_a_node_of_8_h100s_holds_a_shard_of_up_to_8_ranks():
    # shards of 8, or of one rank at tp 8 (which the search then refuses)
    assert list(hsdp_replicas(H100, np.array([1, 8]), np.array([256, 32]))) == [32, 32]


def test_piper_train_hybrid_shards_zero1_and_zero2_and_the_search_for_it_tries_both():
    pytest.importorskip("torch")
    from piper_plan.plan import make_plan
    from piper_plan.search import for_runtime
    from piper_runtime.launch import check_supported

    m = load_model("tiny-moe")
    for zero in (1, 2):
        check_supported(make_plan(m, load_hardware("cpu-local"), Layout(
            gpus=4, dp=4, ep=2, global_batch=8, seq=32, zero=zero, zero_replicas=2, fused_kernels=False,
            overlap_grad_reduce=False)), 4)
    res = search(MIXTRAL, H100, for_runtime(SearchSpace(gpus=32, global_batch=256, seq=4096, hsdp=True), "piper-train"))
    hy = res.batch.zrep > 1
    assert set(res.batch.zero[hy]) == {1, 2}  # no ZeRO-3: piper-train runs none


def test_a_hybrid_plan_keeps_its_replicas_in_plan_json_and_shows_them(tmp_path):
    p = tmp_path / "plan.json"
    code, out = _cli("estimate", "-m", "mixtral-8x7b", "-H", "dgx-h100", "-n", "64", "--ep", "8", "--zero", "3",
                     "--zero-replicas", "8", "--global-batch", "256", "-o", str(p))
    assert code == 0, out
    assert json.loads(p.read_text())["layout"]["zero_replicas"] == 8
    code, out = _cli("show", str(p))
    assert code == 0 and "z3x8" in out, out


def test_piper_train_s_hybrid_zero1_is_priced_as_its_whole_group_all_reduce_and_its_shard_s_broadcasts():
    # piper-train's ZeRO-1 all-reduces over the whole group; hybrid, each owner broadcasts its fp32
    # parameters over its shard alone (runtime/optim.py), and no copies are reconciled
    from piper_plan.cost.reduction import PipeWindow, dp_comm_time

    hw = load_hardware("frontier")
    b, edp, hy = _collectives(Layout(gpus=64, dp=64, ep=8, global_batch=64, seq=4096, zero=1, zero_replicas=8,
                                     fused_kernels=False, overlap_grad_reduce=False, sequence_parallel=False), hw=hw)
    _, _, whole = _collectives(Layout(gpus=64, dp=64, ep=8, global_batch=64, seq=4096, zero=1, fused_kernels=False,
                                      overlap_grad_reduce=False, sequence_parallel=False), hw=hw)
    # dense shard: 8 ranks; experts (edp 8) over 8 / 8 = one rank: nothing to broadcast
    assert hy.ag[0] == pytest.approx(float(comm.rooted(hw, 1e9 * 4.0, 8, 1)), rel=1e-12)
    assert hy.ar_rep[0] == 0.0 and hy.rs_full[0] == whole.rs_full[0]
    z = np.zeros(1)
    t = dp_comm_time(hw, b, edp, PipeWindow(z, z, z, b.m), hy)
    norm = comm.allreduce(hw, 8.0, 64, 1)  # the norm's all-reduce: NCCL's tree over 8 nodes
    assert t[0] == pytest.approx(whole.rs_full[0] + hy.ag[0] + float(norm), rel=1e-12)


def test_piper_train_s_hybrid_zero2_reduces_within_the_shard_and_all_reduces_the_owners_sums_across_copies():
    # piper-train's ZeRO-2, hybrid: each bucket is reduced to its owner inside the shard, and once a
    # step the owners of the same parameters in the r shards all-reduce their sums (runtime/optim.py)
    from piper_plan.cost.reduction import PipeWindow, dp_comm_time, grad_bytes

    hw = load_hardware("frontier")
    b, edp, hy = _collectives(Layout(gpus=64, dp=64, ep=8, global_batch=64, seq=4096, zero=2, zero_replicas=4,
                                     fused_kernels=False, overlap_grad_reduce=False, sequence_parallel=False), hw=hw)
    gb, st_e = float(grad_bytes(b, b.act_bytes.astype(float))[0]), int(b.edp_stride[0])
    # dense shards of 64 / 4 = 16 neighbouring ranks; experts (edp 8) in shards of 2, st_e apart
    reduce = comm.rooted(hw, 1e9 * gb, 16, 1, True) + comm.rooted(hw, 4e9 * gb, 2, st_e, True)
    assert hy.rs_half[0] == pytest.approx(float(reduce), rel=1e-12)
    copies = comm.allreduce(hw, 1e9 * gb / 16, 4, 16) + comm.allreduce(hw, 4e9 * gb / 2, 4, 2 * st_e)
    assert hy.ar_rep[0] == pytest.approx(float(copies), rel=1e-12)
    z = np.zeros(1)
    t = dp_comm_time(hw, b, edp, PipeWindow(z, z, z, b.m), hy)
    norm = comm.allreduce(hw, 8.0, 64, 1)  # one micro-batch: its reduce, the copies, the broadcasts
    assert t[0] == pytest.approx(hy.rs_half[0] + hy.ar_rep[0] + hy.ag[0] + float(norm), rel=1e-12)
