"""A ring collective pays each level's latency on the steps that cross it, as NCCL's own ring
model does (src/graph/tuning.cc: an all-reduce's 2(nNodes-1) inter-node steps at the network's
latency, the other 2(n-nNodes) at NVLink's), not every step at the slowest level it spans."""
import pytest

from piper_plan.cost import comm
from piper_plan.specs.registry import load_hardware

H100 = load_hardware("dgx-h100")  # node of 8 (3 us), scalable unit of 256 (5 us), system (7 us)
FRONTIER = load_hardware("frontier")  # gcd pair 2 (2 us), node 8 (3), switch 32 (5), group 1,024 (6)


def _latency(hw, n, stride, world=None):
    """Seconds of a 1-byte all-reduce less its bandwidth part: the latency the model charges."""
    bw, _ = comm.group_span(hw, n, stride, world)
    return float(comm.ring_allreduce(hw, 1.0, n, stride, world=world)) - 2.0 * (n - 1) / n / float(bw)


def test_a_ring_over_four_nodes_pays_the_network_on_its_six_inter_node_steps():
    # 32 ranks, 4 nodes: NCCL's 2(4-1) = 6 steps at 5 us, 2(32-4) = 56 at 3 us
    assert _latency(H100, 32, 1) == pytest.approx((6 * 5 + 56 * 3) * 1e-6, rel=1e-9)


def test_one_rank_a_node_crosses_the_network_on_every_step():
    # a data-parallel group strided by tp 8: each of its 2(16-1) steps leaves a node
    assert _latency(H100, 16, 8, 128) == pytest.approx(30 * 5e-6, rel=1e-9)


def test_a_ring_inside_a_node_pays_nvlink_alone():
    assert _latency(H100, 8, 1) == pytest.approx(14 * 3e-6, rel=1e-9)


def test_each_level_of_a_deeper_topology_is_paid_on_its_own_steps():
    # 64 consecutive GCDs: 32 pairs, 8 nodes, 2 switches, one group. One pass of 63 steps leaves
    # a pair 31 times, a node 7 times, a switch once: 32 steps at 2 us, 24 at 3, 6 at 5, 1 at 6
    one_pass = 32 * 2 + 24 * 3 + 6 * 5 + 1 * 6
    assert _latency(FRONTIER, 64, 1) == pytest.approx(2 * one_pass * 1e-6, rel=1e-9)
    # the top level spanned had priced all 126 steps
    assert _latency(FRONTIER, 64, 1) < 126 * 6e-6
