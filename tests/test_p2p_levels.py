"""Stage-boundary messages and the tied embedding's all-reduce are priced on the links the pairs
they join actually cross (comm.p2p with the world, comm.ends_span): a pipeline whose stages do
not fit a domain in twos has some boundaries on the next level up, and an interleaved
schedule's wrap from the last stage to the first spans the whole job."""
import numpy as np
import pytest

from piper_plan.cost import comm
from piper_plan.specs.registry import load_hardware

H100 = load_hardware("dgx-h100")  # 8 GPUs a node on NVLink (360 GB/s x comm), 40 GB/s NIC share above
META = load_hardware("meta-h100-roce")  # pods of 3,072 H100, a cluster 7x oversubscribed above them


def _at(hw, level, nbytes):
    bw, lat, _ = comm._levels(hw)
    return lat[level] + nbytes / bw[level]


def test_one_boundary_in_seven_and_the_wrap_leave_the_node():
    # 16 GPUs, pp 8 (2 ranks a stage), 2 chunks a rank: boundary 3 (ranks 6-9) crosses the node
    # edge in both rounds, and the one wrap (stage 7 -> 0) spans both nodes: 3 of 15 messages
    nbytes = 1e6
    got = float(comm.p2p(H100, nbytes, 2, 16, rounds=2))
    assert got == pytest.approx((12 * _at(H100, 0, nbytes) + 3 * _at(H100, 1, nbytes)) / 15, rel=1e-12)


def test_meta_s_pods_put_every_third_boundary_on_the_oversubscribed_cluster():
    # Llama 3 405B on 16,384 GPUs: stages of 1,024 ranks, pods of 3,072 hold three; 5 of the 15
    # boundaries cross a pod edge, and with 8 chunks a rank the 7 wraps span the job
    nbytes = 8192 * 16384 * 2 / 8
    pod, cluster = (_at(META, j, nbytes) for j in (len(META.topology) - 2, len(META.topology) - 1))
    got = float(comm.p2p(META, nbytes, 1024, 16384, rounds=8))
    assert got == pytest.approx((8 * 10 * pod + (8 * 5 + 7) * cluster) / (8 * 15 + 7), rel=1e-9)
    # the smallest level holding two stages (the pod) had priced every message
    old = float(comm.p2p(META, nbytes, 1024))
    assert old == pytest.approx(pod, rel=1e-12) and old < got


def test_a_pipeline_inside_one_node_sends_every_message_over_nvlink():
    got = comm.p2p(H100, 1e6, np.array([1, 1]), np.array([8, 8]), rounds=np.array([1, 4]))
    assert got == pytest.approx([_at(H100, 0, 1e6)] * 2, rel=1e-12)


def test_a_tied_embedding_s_two_copies_on_one_node_reduce_over_nvlink():
    # pp 8 on 8 GPUs: the first stage's rank 0 and the last's rank 7 share the node; priced as a
    # group tiling blocks of 14 ranks from rank 0 it had gone over the NIC
    bw, lat = comm.ends_span(H100, np.array([8, 16]))
    want_bw, want_lat, _ = comm._levels(H100)
    assert list(bw) == [want_bw[0], want_bw[1]] and list(lat) == [want_lat[0], want_lat[1]]
    nvlink = comm.ring_allreduce(H100, 1e8, 2, None, span=comm.ends_span(H100, 8))
    assert float(nvlink) < 0.2 * float(comm.ring_allreduce(H100, 1e8, 2, 7, world=8))


def test_a_levels_all_to_all_fraction_prices_the_all_to_all_and_not_the_ring_collectives():
    """GB200's NVLink5 tray: ring all-reduce bus bandwidth measured at 0.755 of the link (Level.comm),
    the all-to-all model set on the Megatron-Core report's dispatch latencies at 0.698
    (Level.a2a_comm). The all-to-all fraction had priced the ring collectives too, 8 % slow."""
    hw = load_hardware("gb200-nvl72")
    assert (hw.topology[0].comm, hw.topology[0].a2a_comm) == (0.755, 0.698)
    one = hw.model_copy(update={"topology": [lv.model_copy(update={"a2a_comm": None}) for lv in hw.topology]})
    ring = [float(comm.ring_allreduce(h, 4e9, 4, 1, world=4)) for h in (hw, one)]
    a2a = [float(comm.a2a_flat(h, 4e9, 4, 1, world=4)) for h in (hw, one)]
    steps = 6 * hw.topology[0].latency_us * 1e-6  # 2 (n - 1) latency steps
    assert ring[0] == ring[1] == pytest.approx(1.5 * 4e9 / (900e9 * 0.755) + steps, rel=1e-6)
    assert a2a[0] / a2a[1] == pytest.approx(0.755 / 0.698, rel=1e-2)


def test_a_spec_without_an_all_to_all_fraction_dumps_and_hashes_as_before_the_field_existed():
    """Level.a2a_comm at its default is not written out: a plan written before it was added carries
    a hardware spec without the key, and its hash must still match (plan.json's hardware_hash)."""
    import hashlib
    import json

    from piper_plan.plan import spec_hash

    h100 = load_hardware("dgx-h100")
    before = h100.model_dump(mode="json")  # the dump a plan written before the field holds, and hashes
    for lv in before["topology"]:
        lv.pop("a2a_comm", None)
    old_hash = hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()[:16]
    assert spec_hash(h100) == old_hash
    assert "a2a_comm" in str(load_hardware("gb200-nvl72").model_dump())
