"""A whole all-reduce is priced as NCCL runs it: its tuner times a ring and a double binary tree
for each call and takes the faster (NVIDIA/nccl src/graph/tuning.cc), so over many nodes a small
all-reduce pays the tree's log-depth latency, not the ring's 2(n-1) steps, and a large one keeps
the ring's bandwidth. Reduce-scatters stay rings, all-gathers over one rank a node may run PAT
(tests/test_pat_allgather.py); gloo runs rings."""
import numpy as np
import pytest

from piper_plan.cost import comm, reduction
from piper_plan.specs.registry import load_hardware

H100 = load_hardware("dgx-h100")  # node of 8 (3 us), scalable unit of 256 (5 us), system (7 us)
FRONTIER = load_hardware("frontier")  # gcd pair 2 (2 us), node 8 (3), switch 32 (5), group 1,024 (6)
GB200 = load_hardware("gb200-nvl72")  # tray 4 (2.5 us), NVLink rack 72 filled 64 a rack (3), system (7)
CPU = load_hardware("cpu-local")


def test_tree_latency_is_nccls_formula_on_a_two_level_machine():
    # 128 H100, 16 nodes in one scalable unit: NCCL's 2((nRanks/nNodes - 1) intraLat + log2(nNodes) interLat)
    assert comm.tree_latency(H100, 128, 1) == pytest.approx(2 * (7 * 3 + 4 * 5) * 1e-6, rel=1e-12)


def test_each_network_level_adds_the_depth_of_its_own_subtree():
    # 16,384 H100: 7 NVLink hops in the node's chain, log2(32) hops inside a scalable unit, log2(64) across them
    assert comm.tree_latency(H100, 16384, 1) == pytest.approx(2 * (7 * 3 + 5 * 5 + 6 * 7) * 1e-6, rel=1e-12)


def test_the_chain_inside_a_node_crosses_every_sub_node_level():
    # 64 Frontier GCDs: the chain through a node's 8 passes 4 pairs (1 hop each, 2 us) and
    # joins them with 3 hops (3 us); then log2(4) nodes of a switch, log2(2) switches
    assert comm.tree_latency(FRONTIER, 64, 1) == pytest.approx(2 * (4 * 2 + 3 * 3 + 2 * 5 + 1 * 6) * 1e-6, rel=1e-12)
    # an NVL72 rack is one NVLink domain, so its 64 ranks form one chain, as NCCL's multi-node NVLink
    assert comm.tree_latency(GB200, 128, 1) == pytest.approx(2 * (16 * 3 * 2.5 + 15 * 3 + 1 * 7) * 1e-6, rel=1e-12)


def test_a_strided_group_of_one_rank_a_node_is_all_tree():
    assert comm.tree_latency(H100, 16, 8) == pytest.approx(2 * 4 * 5e-6, rel=1e-12)


def test_a_tree_over_three_nodes_is_one_level_deep():
    # NCCL's log2i: floor(log2 3) = 1, as a binary tree of three nodes has depth 1
    assert comm.tree_latency(H100, 24, 1) == pytest.approx(2 * (7 * 3 + 1 * 5) * 1e-6, rel=1e-12)


def test_groups_a_domain_boundary_cuts_wait_on_their_fullest_node():
    # 72 ranks on racks filled 64 at a time: one group holds 64 ranks of a rack (a 63-hop chain)
    # and 8 of the next; the tree waits on that chain and one hop between the two racks
    assert comm.tree_latency(GB200, 72, 1) == pytest.approx(comm.tree_latency(GB200, 128, 1), rel=1e-12)
    # 12 H100 ranks a group: some group fills a node (7 hops), and spans two nodes (1 network hop)
    assert comm.tree_latency(H100, 12, 1) == pytest.approx(2 * (7 * 3 + 1 * 5) * 1e-6, rel=1e-12)


def test_a_small_all_reduce_over_many_nodes_takes_the_tree():
    ring = float(comm.ring_allreduce(H100, 8.0, 16384, 1, world=16384))
    t = float(comm.allreduce(H100, 8.0, 16384, 1, world=16384))
    assert ring > 0.1  # 2 x 16,383 ring steps: over 100 ms for 8 bytes
    assert t == pytest.approx(float(comm.tree_latency(H100, 16384, 1)) + 8.0 / (comm.TREE_BW * 0.9 * float(
        comm.group_span(H100, 16384, 1)[0])), rel=1e-9)
    assert t < 2e-4


def test_a_large_all_reduce_keeps_the_ring_over_a_few_nodes_and_takes_the_tree_over_many():
    # 1 GB: the tree's bytes move ~8 % slower (1/0.46 against 2(n-1)/n), which the ring's 2(n-1)
    # latency steps outweigh from about 100 H100 ranks
    nbytes = 1e9
    for n in (32, 64):
        assert float(comm.allreduce(H100, nbytes, n, 1)) == float(comm.ring_allreduce(H100, nbytes, n, 1))
    for n in (128, 256):
        assert float(comm.allreduce(H100, nbytes, n, 1)) < float(comm.ring_allreduce(H100, nbytes, n, 1))


def test_bytes_that_are_not_finite_price_as_the_ring_does():
    for nbytes in (float("inf"), float("nan")):
        got, ring = float(comm.allreduce(H100, nbytes, 16, 1)), float(comm.ring_allreduce(H100, nbytes, 16, 1))
        assert got == ring or (got != got and ring != ring)


def _lay(**kw):
    from piper_plan.cost.batch import from_layouts
    from piper_plan.layout import Layout

    return from_layouts([Layout(seq=4096, **kw)])


def test_zero0_s_gradient_all_reduce_is_the_tree_over_two_thousand_nodes():
    # tp 8 strides the data-parallel group one rank a node: 2,048 ranks, 400 MB of gradients
    from piper_plan.cost.estimate import _group_terms
    from piper_plan.cost.reduction import collectives

    b = _lay(gpus=16384, tp=8, dp=2048, global_batch=2048, zero=0)
    rep, exp, eb = np.array([1e8]), np.array([0.0]), np.array([2.0])
    coll = collectives(H100, b, _group_terms(H100, b, 4096), rep, exp, eb)
    gb = 4.0  # fp32 gradients
    want = float(comm.allreduce(H100, 1e8 * gb, 2048, 8, world=16384))
    assert float(np.max(coll.rs_full)) == pytest.approx(want, rel=1e-9)
    assert want < 0.6 * float(comm.ring_allreduce(H100, 1e8 * gb, 2048, 8, world=16384))


def test_hybrid_copies_all_reduce_is_the_tree_where_shards_are_small_and_copies_many():
    # ZeRO-1 in 512 copies of a one-rank shard, one copy a node: 40 MB over 512 nodes
    from piper_plan.cost.estimate import _group_terms
    from piper_plan.cost.reduction import collectives, hybrid

    b = _lay(gpus=4096, tp=8, dp=512, global_batch=512, zero=1, zero_replicas=512)
    grp = _group_terms(H100, b, 4096)
    rep, exp, eb = np.array([1e7]), np.array([0.0]), np.array([2.0])
    hy = hybrid(H100, b, grp["edp"], rep, exp, eb, collectives(H100, b, grp, rep, exp, eb))
    want = float(comm.allreduce(H100, 4e7, 512, 8, world=4096))
    assert float(np.max(hy.ar_rep)) == pytest.approx(want, rel=1e-9)
    assert want < 0.5 * float(comm.ring_allreduce(H100, 4e7, 512, 8, world=4096))


def test_migration_s_count_all_reduce_is_the_tree_over_a_stage_of_many_nodes():
    from piper_plan.cost import migration
    from piper_plan.specs.registry import load_model

    m = load_model("deepseek-v3")
    b = _lay(gpus=2048, tp=1, pp=1, dp=2048, ep=256, global_batch=2048)
    counts = 8.0 * m.num_moe_layers * m.moe.num_experts
    want = float(comm.allreduce(H100, counts, 2048, 1, world=2048))
    assert float(migration.load_counting_time(m, H100, b)[0]) == pytest.approx(want, rel=1e-9)
    assert want < 0.2 * float(comm.ring_allreduce(H100, counts, 2048, 1, world=2048))


def test_medium_messages_pay_nccls_tree_correction():
    bw = float(comm.group_span(H100, 4096, 1)[0])
    lat = float(comm.tree_latency(H100, 4096, 1))
    # 1 MiB: log2(2^20 / 64) = 14, NCCL's Simple-protocol factor 0.5
    tree = lat + 2**20 / (comm.TREE_BW * 0.5 * bw)
    assert float(comm.allreduce(H100, 2.0**20, 4096, 1)) == pytest.approx(min(tree, float(
        comm.ring_allreduce(H100, 2.0**20, 4096, 1))), rel=1e-12)
    # 512 MiB and beyond: no correction
    big = 2.0**29
    assert float(comm.allreduce(H100, big, 4096, 1)) == pytest.approx(min(
        lat + big / (comm.TREE_BW * bw), float(comm.ring_allreduce(H100, big, 4096, 1))), rel=1e-12)


def test_gloo_runs_the_ring():
    # 16 CPU ranks over two of cpu-local's nodes: a tree would be shorter, but gloo rings
    assert CPU.collectives == "gloo"
    ring = float(comm.ring_allreduce(CPU, 8.0, 16, 1))
    assert float(comm.tree_latency(CPU, 16, 1)) < ring / 1.5
    assert float(comm.allreduce(CPU, 8.0, 16, 1)) == ring


def test_one_rank_or_no_bytes_moves_nothing():
    assert float(comm.allreduce(H100, 8.0, 1, 1)) == 0.0
    assert float(comm.allreduce(H100, 0.0, 64, 1)) == 0.0
    assert float(comm.tree_latency(H100, 1, 1)) == 0.0


def _copies_extra(hw, dense, expert, groups, units, moe_units):
    one = reduction._both(comm.allreduce, hw, dense, expert, groups)
    return float(reduction._unit_allreduce_extra(hw, dense, expert, groups, units, moe_units, one)), float(one)


def test_a_unit_s_all_reduce_across_copies_is_priced_at_its_own_size():
    # ZeRO-3 in copies (FSDP2's HSDP) all-reduces each unit's shard as its own call: 62 dense calls
    # and 58 expert calls, each as NCCL picks for its bytes, less the one call's price
    groups = ((8, 4096, None, 32768), (8, 256, None, 32768))
    dense, expert = 3e8, 2e10
    got, one = _copies_extra(H100, dense, expert, groups, 62, 58)
    split = (62 * float(comm.allreduce(H100, dense / 62, 8, 4096, world=32768))
             + 58 * float(comm.allreduce(H100, expert / 58, 8, 256, world=32768)))
    assert got == pytest.approx(split - one, rel=1e-12)


def test_bandwidth_bound_units_keep_the_ring_and_its_latency():
    # 20 GB of expert shards in 58 calls of 345 MB over 8 copies a node apart: each call is a ring
    # (its bytes split evenly), so each call beyond the first adds the ring's 2(n-1) steps, not the tree's
    groups = ((1, 1, None, 32768), (8, 256, None, 32768))
    got, _ = _copies_extra(H100, 0.0, 2e10, groups, 1, 58)
    ring_call = 2 * float(comm.call_latency(H100, 8, 256, world=32768))
    assert ring_call > float(comm.tree_latency(H100, 8, 256))
    assert got == pytest.approx(57 * ring_call, rel=1e-9)


def test_latency_bound_units_take_the_tree():
    # 11 units of 1 kB each across 64 copies a node apart: each call takes the tree's 2 log2(64) hops
    groups = ((64, 8, None, 512), (1, 1, None, 512))
    got, _ = _copies_extra(H100, 11e3, 0.0, groups, 11, 0)
    tree = float(comm.tree_latency(H100, 64, 8))
    assert tree < 2 * float(comm.call_latency(H100, 64, 8, world=512))
    assert got == pytest.approx(10 * tree, rel=0.02)  # the bytes' own time is a hair of it
