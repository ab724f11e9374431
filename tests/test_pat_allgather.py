"""An all-gather over a group of one rank a node is priced as NCCL runs it: its tuner times the
ring and PAT (2.23+) and takes the faster (NVIDIA/nccl src/graph/tuning.cc), so over thousands of
nodes a small gather, such as a ZeRO-3 unit's, pays PAT's log-depth hops and a fifth of a ring
step a rank, not the ring's n-1 network steps; a large one keeps the ring's bandwidth. Reduce-scatters stay rings
(NCCL runs PAT for a plain sum only; FSDP2 and Megatron's average_in_collective average in it)."""
import numpy as np
import pytest

from piper_plan.cost import comm, reduction
from piper_plan.specs.registry import load_hardware

H100 = load_hardware("dgx-h100")  # node of 8 (3 us), scalable unit of 256 (5 us), system (7 us)
FRONTIER = load_hardware("frontier")  # MI250X GCDs, 8 a node: RCCL
GB200 = load_hardware("gb200-nvl72")  # tray 4, NVLink rack 72 filled 64 a rack (3 us), system (7 us)
CPU = load_hardware("cpu-local")


def test_pat_latency_is_nccls_formula_at_nccls_hop():
    # NCCL: log2i(nNodes) x interLat / 3.5 + 2.8 us x nRanks, interLat 14 us (Simple, one rank a node)
    at14 = H100.model_copy(update={"topology": [lv.model_copy(update={"latency_us": 14.0}) if lv.via_nic else lv
                                                for lv in H100.topology]})
    assert comm.pat_latency(at14, 16, 8) == pytest.approx((4 * 14 / 3.5 + 2.8 * 16) * 1e-6, rel=1e-12)
    # and the ring's steps there are NCCL's 14 us too, so the pick between them is its tuner's
    assert float(comm.call_latency(at14, 16, 8)) == pytest.approx(15 * 14e-6, rel=1e-12)


def test_on_the_spec_s_own_hops_pat_keeps_nccl_s_ratios():
    # 16 nodes of one scalable unit at 5 us a hop: log2(16) hops at 1/3.5 of one, 0.2 of a ring step a rank
    assert comm.pat_latency(H100, 16, 8) == pytest.approx((4 * 5 / 3.5 + 0.2 * 5 * 16) * 1e-6, rel=1e-12)


def test_each_network_level_adds_its_own_depth_at_a_3_5th_of_a_hop():
    # 2,048 nodes: log2(32) hops inside a scalable unit (5 us), log2(64) across them (7 us), and
    # 0.2 of the ring's mean step (mostly 5 us hops, one in 32 at 7) a rank
    step = float(comm.group_span(H100, 2048, 8, world=16384)[1])
    assert 5e-6 < step < 5.1e-6
    want = (5 * 5 + 6 * 7) / 3.5 * 1e-6 + 0.2 * step * 2048
    assert comm.pat_latency(H100, 2048, 8, world=16384) == pytest.approx(want, rel=1e-12)


def test_pat_runs_only_at_one_rank_a_node_and_only_on_nccl():
    assert np.isinf(comm.pat_latency(H100, 16, 4))  # two ranks a node
    assert np.isinf(comm.pat_latency(H100, 64, 1))
    # an NVL72 rack is one node to NCCL (multi-node NVLink): 16 ranks 4 apart share a rack
    assert np.isinf(comm.pat_latency(GB200, 16, 4))
    assert np.isfinite(comm.pat_latency(GB200, 16, 64))  # one rank a rack of 64
    assert CPU.collectives == "gloo" and np.isinf(comm.pat_latency(CPU, 2, 8))
    # RCCL ships PAT disabled (ROCm/rccl's PAT_ENABLE default 0): Frontier's one GCD a node keeps the ring
    assert FRONTIER.accelerator.compute_capability is None and np.isinf(comm.pat_latency(FRONTIER, 16, 8))
    for hw, n, st in ((H100, 64, 1), (CPU, 2, 8), (FRONTIER, 16, 8)):
        assert float(comm.allgather(hw, 1e3, n, st)) == float(comm.ring_allreduce(hw, 1e3, n, st, 0.5))


def test_a_small_gather_over_many_nodes_takes_pat():
    ring = float(comm.ring_allreduce(H100, 1e6, 2048, 8, 0.5, world=16384))
    got = float(comm.allgather(H100, 1e6, 2048, 8, world=16384))
    bw = float(comm.group_span(H100, 2048, 8, world=16384)[0])
    pat = float(comm.pat_latency(H100, 2048, 8, world=16384))
    assert got == pytest.approx(pat + 1e6 / (comm.PAT_BW * bw), rel=1e-12)
    assert ring > 0.01 and got < 0.3 * ring  # 2,047 network steps against a fifth of one a rank


def test_a_large_gather_keeps_the_ring_s_bandwidth():
    # 1 GB over 16 nodes: PAT's bytes cross at 0.75 of the ring's bus rate, (n-1)/n against 1/0.75
    ring = float(comm.ring_allreduce(H100, 1e9, 16, 8, 0.5))
    assert float(comm.allgather(H100, 1e9, 16, 8)) == ring
    assert float(comm.pat_latency(H100, 16, 8)) + 1e9 / (comm.PAT_BW * float(comm.group_span(H100, 16, 8)[0])) > ring


def test_one_rank_or_no_bytes_moves_nothing():
    assert float(comm.allgather(H100, 1e6, 1, 8)) == 0.0
    assert float(comm.allgather(H100, 0.0, 2048, 8)) == 0.0


def _lay(**kw):
    from piper_plan.cost.batch import from_layouts
    from piper_plan.layout import Layout

    return from_layouts([Layout(seq=4096, **kw)])


def _coll(b, rep, units=(1.0, 0.0)):
    from piper_plan.cost.estimate import _group_terms

    grp = _group_terms(H100, b, 4096)
    return grp, reduction.collectives(H100, b, grp, np.array([rep]), np.array([0.0]), np.array([2.0]), units=units)


def test_zero_s_gather_is_an_all_gather_as_nccl_picks_it():
    # tp 8 strides the data-parallel group one rank a node: 2,048 ranks gather 2 MB of bf16 weights
    b = _lay(gpus=16384, tp=8, dp=2048, global_batch=2048, zero=1)
    _, coll = _coll(b, 1e6)
    want = float(comm.allgather(H100, 2e6, 2048, 8, world=16384))
    assert float(np.max(coll.ag)) == pytest.approx(want, rel=1e-9)
    assert want < 0.3 * float(comm.ring_allreduce(H100, 2e6, 2048, 8, 0.5, world=16384))
    # the reduce-scatter stays a ring
    assert float(np.max(coll.rs_half)) == pytest.approx(float(comm.ring_allreduce(
        H100, 4e6, 2048, 8, 0.5, world=16384)), rel=1e-9)


def test_zero3_units_gather_as_pat_calls_and_reduce_scatter_as_ring_calls():
    # 80 units of 20 MB over 2,048 nodes: the whole 1.6 GB gather would ring, but each unit's is
    # its own call, which NCCL runs as PAT; the reduce-scatters add the ring's n-1 steps a call
    b = _lay(gpus=16384, tp=8, dp=2048, global_batch=2048, zero=3)
    _, coll = _coll(b, 8e8, units=(80.0, 0.0))
    one = float(comm.allgather(H100, 1.6e9, 2048, 8, world=16384))
    assert one == float(comm.ring_allreduce(H100, 1.6e9, 2048, 8, 0.5, world=16384))
    unit = float(comm.allgather(H100, 1.6e9 / 80, 2048, 8, world=16384))
    bw = float(comm.group_span(H100, 2048, 8, world=16384)[0])
    assert unit == pytest.approx(float(comm.pat_latency(H100, 2048, 8, world=16384)) + 2e7 / (comm.PAT_BW * bw),
                                 rel=1e-12)
    assert float(np.max(coll.gather_extra)) == pytest.approx(80 * unit - one, rel=1e-9)
    ring_call = float(comm.call_latency(H100, 2048, 8, world=16384))
    assert float(np.max(coll.unit_extra)) == pytest.approx(79 * ring_call, rel=1e-9)
    assert float(np.max(coll.gather_extra)) < 0.7 * float(np.max(coll.unit_extra))


def test_piper_train_s_gathers_are_owner_broadcasts_and_keep_the_ring_s_unit_latency():
    # eager kernels (fused_kernels false): the owners broadcast, which NCCL runs as a ring only
    b = _lay(gpus=16384, tp=8, dp=2048, global_batch=2048, zero=3, fused_kernels=False)
    _, coll = _coll(b, 8e8, units=(80.0, 0.0))
    assert np.array_equal(coll.gather_extra, coll.unit_extra)
    assert float(np.max(coll.ag)) == pytest.approx(float(comm.rooted(H100, 3.2e9, 2048, 8, world=16384)), rel=1e-9)
    # hybrid-sharded too: within a shard of 512, one rank a node
    from piper_plan.cost.reduction import hybrid

    b = _lay(gpus=16384, tp=8, dp=2048, global_batch=2048, zero=3, zero_replicas=4, fused_kernels=False)
    grp, coll = _coll(b, 8e8, units=(80.0, 0.0))
    hy = hybrid(H100, b, grp["edp"], np.array([8e8]), np.array([0.0]), np.array([2.0]), coll)
    assert np.array_equal(hy.gather_extra, hy.unit_extra)


def test_where_no_group_can_run_pat_the_gathers_keep_the_ring_s_unit_latency():
    b = _lay(gpus=1024, tp=1, dp=1024, global_batch=1024, zero=3)  # 8 ranks a node
    _, coll = _coll(b, 8e8, units=(80.0, 0.0))
    assert coll.gather_extra is coll.unit_extra


def test_hybrid_shards_gather_as_nccl_picks():
    # ZeRO-3 in 4 copies of a 512-rank shard, one rank a node: 20 MB of weights a shard gathers
    # in 10 calls, each (and the whole) small enough for PAT
    from piper_plan.cost.reduction import hybrid

    b = _lay(gpus=16384, tp=8, dp=2048, global_batch=2048, zero=3, zero_replicas=4)
    grp, coll = _coll(b, 1e7, units=(10.0, 0.0))
    hy = hybrid(H100, b, grp["edp"], np.array([1e7]), np.array([0.0]), np.array([2.0]), coll)
    whole = float(comm.allgather(H100, 2e7, 512, 8, world=16384))
    assert whole < 0.8 * float(comm.ring_allreduce(H100, 2e7, 512, 8, 0.5, world=16384))
    assert float(np.max(hy.ag)) == pytest.approx(whole, rel=1e-9)
    unit = float(comm.allgather(H100, 2e6, 512, 8, world=16384))
    assert unit < 0.5 * float(comm.ring_allreduce(H100, 2e6, 512, 8, 0.5, world=16384))  # each call is PAT
    split = 10 * unit - whole
    assert float(np.max(hy.gather_extra)) == pytest.approx(split, rel=1e-9)
    assert float(np.max(hy.gather_extra)) < 0.7 * float(np.max(hy.unit_extra))


def test_a_zero3_step_pays_the_gathers_own_unit_latency_forward_and_backward():
    # not overlapped: each of M micro-batches gathers for its forward and again for its backward
    from dataclasses import replace

    b = _lay(gpus=16384, tp=8, dp=2048, global_batch=4096, zero=3, overlap_grad_reduce=False)
    grp, coll = _coll(b, 8e8, units=(80.0, 0.0))
    win = reduction.PipeWindow(F=np.zeros(1), B=np.zeros(1), W=np.zeros(1), M=np.array([2.0]))
    got = reduction.dp_comm_time(H100, b, grp["edp"], win, coll)
    as_rings = reduction.dp_comm_time(H100, b, grp["edp"], win, replace(coll, ag_unit_extra=None))
    saved = 2 * 2 * (float(np.max(coll.unit_extra)) - float(np.max(coll.gather_extra)))
    assert saved > 0.1
    assert float(np.max(as_rings - got)) == pytest.approx(saved, rel=1e-9)
