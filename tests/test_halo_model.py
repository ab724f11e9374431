"""The planner's HALO cost model (piper_plan.cost.comm.a2a_halo), the emulated specs that
benchmarks/halo_netns.py writes from its micro-calibration, and benchmarks/halo_model.py.
No torch, no root."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from piper_plan.cost import comm
from piper_plan.specs import load_hardware

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))


def _racks_filled(job_block: int):
    """gb200-nvl72 with `job_block` GPUs of each rack filled by a job's consecutive ranks (the
    bundled spec: 64, NVIDIA's --segment 16), set as a sweep sets a field."""
    from piper_plan.sweep import set_field

    return set_field(load_hardware("gb200-nvl72"), "topology.1.job_block", job_block)


def _rail(intra_gbps: float = 0.3, comm_eff: float = 0.8, lat_us: float = 50.0):
    """A 4 nodes x 2 ranks rail spec, one NIC per rank (like hardware/emu-rail-1.yaml)."""
    hw = load_hardware("emu-rail-1")
    levels = [hw.topology[0].model_copy(update={"bandwidth_gbps": intra_gbps, "latency_us": lat_us}),
              hw.topology[1].model_copy(update={"latency_us": lat_us})]
    eff = hw.efficiency.model_copy(update={"comm": comm_eff, "collective_overhead_us": 0.0})
    return hw.model_copy(update={"topology": levels, "efficiency": eff})


def test_phase3_forwarding_is_exposed_after_phase2():
    """Packs share the NIC and land together, so every pack's forwarding (not just the last
    one's) follows Phase II: HALO = T_II + (N-1)·T_fwd when Phase II is the longer phase."""
    nodes, q, per = 4, 2, 4 * 2**20
    n = nodes * q
    hw = _rail(lat_us=0.0)
    slow = _rail(intra_gbps=0.15, lat_us=0.0)  # half the intra rate
    fast = _rail(intra_gbps=1e6, lat_us=0.0)
    t, t_slow, t_fast = (float(comm.a2a_halo(h, per * n, n, 1)) for h in (hw, slow, fast))
    fwd = (nodes - 1) * (q - 1) * per / (0.3e9 * 0.8)  # Phase III bytes at the intra rate
    assert t - t_fast == pytest.approx(fwd, rel=1e-3)
    assert t_slow - t == pytest.approx(fwd, rel=1e-3)
    # Phase II alone: (N-1) packs of q·per bytes over the rank's own NIC
    t2 = (nodes - 1) * q * per / (hw.nic_gbps_per_gpu * 1e9 * 0.8)
    assert t_fast == pytest.approx(t2, rel=1e-3)


def test_phase3_pays_one_message_per_local_rank():
    """Alpha terms (bandwidth x1e6): max(Phase I, Phase II) + (q-1) intra messages: the relay
    coalesces every pack's rows for a local rank into one message."""
    from halo_model import alpha_only

    hw = alpha_only(load_hardware("frontier"))  # levels: gcd-pair 2 us, node 3, switch 5, group 6
    nodes = 16
    n = 8 * nodes
    t = float(comm.a2a_halo(hw, 8 * n, n, 1))
    a_intra = 1 * 2e-6 + 6 * 3e-6  # q-1 = 7 local peers: 1 on the GCD pair, 6 on the node
    a_packs = 3 * 5e-6 + 12 * 6e-6  # 15 remote nodes: 3 on the switch, 12 in the group
    assert t == pytest.approx(max(a_intra, a_packs) + a_intra, rel=1e-3)
    flat = float(comm.a2a_flat(hw, 8 * n, n, 1))
    assert flat == pytest.approx(2e-6 + 6 * 3e-6 + 24 * 5e-6 + 96 * 6e-6, rel=1e-3)


def test_call_floor_overlaps_flat_transfer_but_adds_to_halo():
    """a2a_call with a per-call floor co (a small call's cost beyond its α-β set-ups, so a
    whole small flat call is co + the flat set-ups): flat pays max(co + its set-ups, wire -
    its set-ups); HALO's rendezvous phases pay the floor and then their wire, less the
    first-round set-ups the floor already holds (Phase III's stay)."""
    hw = load_hardware("emu-rail-1")
    co, hop, inter = 6e-3, 2.5e-3, hw.topology[1].latency_us * 1e-6
    lv = [hw.topology[0].model_copy(update={"latency_us": hop * 1e6}), hw.topology[1]]
    hw = hw.model_copy(update={"topology": lv, "efficiency": hw.efficiency.model_copy(
        update={"collective_overhead_us": co * 1e6})})
    n, small, big = 8, 8 * 4096, 8 * 4 * 2**20
    a_flat = hop + 6 * inter  # 1 node neighbour, 6 peers on other nodes
    a_first = max(hop, 3 * inter)  # Phase I's one intra message vs Phase II's 3 packs
    assert float(comm.a2a_call(hw, small, n, 1, False)) == pytest.approx(co + a_flat)
    for size in (small, big):
        halo, flat = float(comm.a2a_halo(hw, size, n, 1)), float(comm.a2a_flat(hw, size, n, 1))
        assert halo >= a_first + hop  # Phase III's set-up stays in the wire time
        assert float(comm.a2a_call(hw, size, n, 1, True)) == pytest.approx(co + a_flat + halo - a_first)
    assert float(comm.a2a_call(hw, big, n, 1, False)) == pytest.approx(flat - a_flat)
    zero = hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"collective_overhead_us": 0.0})})
    assert float(comm.a2a_call(zero, big, n, 1, True)) == pytest.approx(halo)  # no floor: the wire time


def test_shared_nic_carries_early_packs_during_the_floor():
    """Two ranks per NIC (the emulated uplink): HALO's dependent call is the floor plus its
    wire less min(co, half the NIC's Phase II time) -- the early rank's packs go out while the
    late one waits -- and never below floor + wire − the NIC time's other half; with a NIC per
    rank (the rails) nothing is hidden."""
    from piper_plan.cost.comm import _alphas, _halo_phases

    n = 8
    for name, share in (("emu-uplink", 2), ("emu-rail-1", 1)):
        hw = load_hardware(name)
        co = hw.efficiency.collective_overhead_us * 1e-6
        a_flat, a_first, _ = _alphas(hw, n, 1)
        for size in (8 * 4096, 8 * 16384, 8 * 2**20):
            t2 = float(_halo_phases(hw, size, n, 1)[1])
            halo = float(comm.a2a_halo(hw, size, n, 1))
            hide = min(co, t2 * (1 - 1 / share))
            assert float(comm.a2a_call(hw, size, n, 1, True)) == pytest.approx(co + a_flat + halo - a_first - hide)
            if share == 1:
                assert hide == 0.0
    up = load_hardware("emu-uplink")
    t2 = float(_halo_phases(up, 8 * 2**20, n, 1)[1])
    assert t2 / 2 > up.efficiency.collective_overhead_us * 1e-6  # big packs: the whole floor is used


def test_halo_degenerates_to_flat():
    hw = load_hardware("frontier")
    for n, stride in ((8, 1), (4, 8)):  # one node; one member per node
        assert float(comm.a2a_halo(hw, 2**20, n, stride)) == float(comm.a2a_flat(hw, 2**20, n, stride))


def test_rail_spine_makes_halo_win_and_vectorises():
    """On a rail fabric with a quarter-rate spine flat pays the spine, HALO does not; the
    model is vectorised over message sizes."""
    hw = load_hardware("emu-rail-q")
    n = np.full(3, 8)  # one entry per layout, as the search evaluates them
    sizes = np.array([2**18, 2**20, 2**22]) * 8
    flat, halo = comm.a2a_flat(hw, sizes, n, 1), comm.a2a_halo(hw, sizes, n, 1)
    assert flat.shape == halo.shape == (3,)
    assert np.all(flat / halo > 4)
    assert np.allclose(halo, [float(comm.a2a_halo(hw, s, 8, 1)) for s in sizes])


def test_emulated_spec_from_micro_calibration():
    """halo_netns.hardware_yaml turns the micro-calibration into the spec's figures."""
    import halo_netns

    calib = {"intra": {"latency_us": 60.0, "bandwidth_gbps": 9.0},
             "inter": {"latency_us": 55.0, "bandwidth_gbps": 0.037},
             "micro": {"tiny_a2a_ms": 6.5, "tiny_a2a_bytes_per_peer": 4, "tiny_reps": 63, "reps": 3,
                       "fan_bytes": 4 * 2**20, "fan_flows": 3, "fan_gbps": 0.0285, "cross_gbps": 0.0084,
                       "intra_ms": {str(2**20): 4.0, str(4 * 2**20): 14.0}, "intra_gbps": 0.3146,
                       "round_ms": 2.4, "hop_ms": 1.4}}
    d = halo_netns.hardware_yaml("rail-1", 300, calib)
    assert d["efficiency"]["comm"] == pytest.approx(0.0285 / 0.0375, abs=1e-3)
    # the floor beyond the 4-byte call's own set-ups: 1 node neighbour (2,400 us) + 6 remote (55 us)
    assert d["efficiency"]["collective_overhead_us"] == pytest.approx(6500.0 - 2400.0 - 6 * 55.0)
    assert d["network"]["cross_rail_taper"] == pytest.approx(0.0084 / (0.0375 * 0.76), abs=1e-3)
    assert d["topology"][0]["bandwidth_gbps"] == pytest.approx(0.3146)  # loaded, not the lone pair's 9
    assert d["topology"][0]["latency_us"] == 2400.0  # HALO's dependent round under load, not the idle 60 us
    assert d["topology"][1]["latency_us"] == 55.0
    assert "fan-out" in d["efficiency"]["source"] and "slope" in d["topology"][0]["source"]
    up = halo_netns.hardware_yaml("uplink", 300, calib)  # two ranks share one uplink
    assert up["efficiency"]["comm"] == pytest.approx(min(1.0, 0.0285 / 0.01875), abs=1e-3)


def test_halo_model_report(capsys):
    import halo_model

    r = halo_model.build("frontier", [16, 512], [4, 16384], "deepseek-v3", [4096])
    hw = load_hardware("frontier")
    n = 16 * 8
    want = float(comm.a2a_call(hw, 4096 * n, n, 1, False) / comm.a2a_call(hw, 4096 * n, n, 1, True))
    assert r["grid"][16][4] == pytest.approx(want)
    for N in (16, 512):  # alpha-only speedups do not depend on message size; bandwidth-only ones ~ do not either
        p = r["parts"][N]
        assert p[4]["alpha_only"] == pytest.approx(p[16384]["alpha_only"], rel=0.02)
        assert p[4]["bandwidth_only"] == pytest.approx(p[16384]["bandwidth_only"], rel=1e-6)
    b = r["layer"][4096][16]["bytes_per_peer"]
    assert b == 4096 * 8 * 7168 * 2 / 128  # tokens x top_k x hidden x bf16 / group size
    halo_model.render(r)
    assert "paper: 1.2-9x" in capsys.readouterr().out
    assert halo_model.main(["--hardware", "no-such-spec"]) == 2


def test_token_level_exchange_sends_each_token_once_per_node():
    """DeepEP / HybridEP (Layout.a2a dedup): a token crosses to a remote node once if any of its
    top-k experts lives there: 1 - C(E - E/N, k)/C(E, k) per node, against k/N copies."""
    from math import comb

    from piper_plan.cost import comm
    from piper_plan.specs.registry import load_hardware

    E, k = 128, 8
    for N in (2, 4, 8):
        hit = 1 - comb(E - E // N, k) / comb(E, k)
        assert comm.dedup_fraction(E, k, N) == pytest.approx(N * hit / k, rel=1e-12)
    assert comm.dedup_fraction(E, k, 1) == 1.0
    hw = load_hardware("dgx-h100")
    nbytes = 4096 * k * 2048 * 2.0  # one rank's dispatch: tokens x top-k x hidden x bf16
    halo = comm.a2a_halo(hw, nbytes, 16, 1)
    dedup = comm.a2a_dedup(hw, nbytes, 16, 1, E, k)
    assert dedup < 0.5 * halo  # 2 nodes: about a quarter of Phase II's bytes cross
    # inside one node a token still goes once to each rank holding one of its experts
    r = comm.dedup_fraction(E, k, 8)
    assert r == pytest.approx(8 * (1 - comb(E - E // 8, k) / comb(E, k)) / k, rel=1e-12)
    assert comm.a2a_dedup(hw, nbytes, 8, 1, E, k) == pytest.approx(float(comm.a2a_flat(hw, nbytes * r, 8, 1)))


def test_fanout_efficiency_slows_only_the_flat_exchanges_network_bytes():
    """efficiency.a2a_fanout (frontier: RCCL's fan-out all-to-all measured at 1/2-1/3 of MPI's,
    itself 0.66 of the NIC): the flat exchange's bytes through the NICs move at a2a_fanout of the
    NIC rate instead of comm; its bytes inside a node and HALO's packs keep comm."""
    hw = load_hardware("frontier")
    assert hw.efficiency.a2a_fanout == 0.26
    at_comm = hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"a2a_fanout": None})})
    no_lat = [lv.model_copy(update={"latency_us": 0.0}) for lv in hw.topology]
    hw0, at_comm0 = (h.model_copy(update={"topology": no_lat}) for h in (hw, at_comm))
    nbytes = 64 * 2**20
    assert float(comm.a2a_flat(hw, nbytes, 8, 1)) == float(comm.a2a_flat(at_comm, nbytes, 8, 1))  # one node
    slow = hw.efficiency.comm / hw.efficiency.a2a_fanout
    for n in (64, 1024):  # 8 and 128 nodes: the NIC is the bottleneck, its time scales by comm / a2a_fanout
        assert float(comm.a2a_flat(hw0, nbytes, n, 1)) == pytest.approx(slow * float(comm.a2a_flat(at_comm0, nbytes, n, 1)))
        assert float(comm.a2a_halo(hw, nbytes, n, 1)) == float(comm.a2a_halo(at_comm, nbytes, n, 1))


def test_a_planar_nic_carries_an_all_to_all_on_one_plane_and_a_ring_on_all():
    """network.planes (DGX B300 on Spectrum-X: each ConnectX-8 is 2 x 400GbE on two networks): an
    all-to-all's per-peer connections use one port, so its NIC-bound time doubles, flat and HALO's
    packs alike; inside a node nothing changes, and a ring all-reduce stripes its channels over both
    ports and keeps the whole NIC rate."""
    hw = load_hardware("dgx-b300")
    assert hw.network.planes == 2
    one = hw.model_copy(update={"network": hw.network.model_copy(update={"planes": 1})})
    no_lat = [lv.model_copy(update={"latency_us": 0.0}) for lv in hw.topology]
    hw0, one0 = (h.model_copy(update={"topology": no_lat}) for h in (hw, one))
    nbytes = 256 * 2**20
    assert float(comm.a2a_flat(hw, nbytes, 8, 1)) == float(comm.a2a_flat(one, nbytes, 8, 1))  # one node: NVLink
    for n in (64, 256):  # 8 and 32 nodes: the NIC is the bottleneck
        assert float(comm.a2a_flat(hw0, nbytes, n, 1)) == pytest.approx(2 * float(comm.a2a_flat(one0, nbytes, n, 1)))
        t2, t2_one = comm._halo_phases(hw, nbytes, n, 1)[1], comm._halo_phases(one, nbytes, n, 1)[1]
        assert float(t2) == pytest.approx(2 * float(t2_one))
        assert float(comm.ring_allreduce(hw, nbytes, n, 1)) == float(comm.ring_allreduce(one, nbytes, n, 1))
    d = hw.model_dump()
    d["network"]["planes"] = 0
    with pytest.raises(ValueError, match="planes"):
        type(hw).model_validate(d)


def test_frontier_halo_speedup_falls_in_the_papers_range():
    """The Piper paper measures HALO at 1.2-9x the bandwidth of RCCL's all-to-all on 16-512 Frontier
    nodes (brief §1). With a2a_fanout the model predicts inside that range at every node count and
    message size of the benchmark's grid; with the fan-out at comm (as before a2a_fanout) it
    predicted HALO slower than RCCL for large messages."""
    import halo_model

    r = halo_model.build("frontier", halo_model.NODES, halo_model.KIB, "deepseek-v3", [4096])
    assert r["in_paper_range"] == r["cells"] == 42
    hw = load_hardware("frontier")
    at_comm = hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"a2a_fanout": None})})
    big = 16384 * 1024 * 16 * 8  # 16 MiB a peer over 16 nodes
    assert float(comm.a2a_call(at_comm, big, 128, 1, False) / comm.a2a_call(at_comm, big, 128, 1, True)) < 1.2


def test_nvl72_tray_shares_the_rack_links():
    """GB200 NVL72 has no GPU-to-GPU links inside a compute tray: an EP8 exchange over two trays
    moves 7/8 of its bytes through one 900 GB/s NVLink budget, not 3/8 and 4/8 through two."""
    hw = load_hardware("gb200-nvl72")
    assert hw.topology[0].shared_links
    bw = hw.topology[1].bandwidth_gbps * 1e9 * hw.topology[1].a2a_comm  # an all-to-all's fraction of it
    nbytes = 512 * 2**20
    lat = 3 * 2.5e-6 + 4 * 3e-6  # 3 tray peers, 4 rack peers
    assert float(comm.a2a_flat(hw, nbytes, 8, 1)) == pytest.approx(nbytes * 7 / 8 / bw + lat, rel=1e-9)
    d = hw.model_dump()
    d["topology"][-1]["shared_links"] = True  # the top level has no next level to share with
    with pytest.raises(ValueError, match="shared_links"):
        type(hw).model_validate(d)


def test_all_to_all_model_against_megatron_core_table7():
    """validation/a2a_mcore_table7.csv (Megatron-Core MoE report Table 7: DeepSeek-V3 shapes, EP 8-64):
    the flat model is within 16 % of the NCCL dispatcher on H100 at every EP size and within 10 % on
    GB200 (whose NVLink levels take their all-to-all efficiency from these eight GB200 rows:
    Level.a2a_comm); the
    token-level model (group-limited as DeepSeek-V3 routes) within 30 % of HybridEP across H100
    nodes. Inside GB200's one scale-up domain the model's HybridEP is 19 % fast at EP 8 and 28 %
    slow at EP 64: the measured dispatch grows less with EP than the model's; not asserted."""
    from piper_plan.validate_kernels import a2a_check

    rows = a2a_check()
    assert len(rows) == 16
    err = {(r["hardware"], r["backend"], r["ep"]): r["predicted_us"] / r["dispatch_us"] - 1 for r in rows}
    for ep in (8, 16, 32, 64):
        assert abs(err["dgx-h100", "nccl", ep]) <= 0.16
        assert abs(err["gb200-nvl72", "nccl", ep]) <= 0.10
    for ep in (16, 32, 64):
        assert abs(err["dgx-h100", "hybridep", ep]) <= 0.30


def test_frontier_node_all_to_all_against_rccl_on_one_mi250x_node():
    """validation/a2a_rccl_mi250x_node.csv (RCCL's all-to-all on the 8 GCDs of one LUMI-G node,
    Frontier's node design): at the 0.5-1 MiB a peer nearest a training step's exchange, the
    frontier spec's node level (one 50 GB/s xGMI link at efficiency.comm) is within 10 % of the
    measured median; below ~256 KiB the model runs short of RCCL's ~32 µs floor (its α sum is
    20 µs and the GPU specs price no per-call overhead): ~12 µs a call, tens of ms in a Frontier
    row's step of 10-100 s, so not priced; asserted only as the model being short there."""
    from piper_plan.validate_kernels import rccl_node_check

    rows = rccl_node_check()
    assert [r["bytes_per_peer"] for r in rows] == sorted(r["bytes_per_peer"] for r in rows)
    big = [r for r in rows if r["bytes_per_peer"] >= 512 * 1024]
    assert len(big) == 2
    for r in big:
        assert abs(r["predicted_us"] / r["measured_us"] - 1) <= 0.10
    small = rows[0]
    assert small["bytes_per_peer"] == 1 and small["predicted_us"] < small["min_us"]


def test_a_level_measured_on_its_own_links_uses_its_own_efficiency():
    """Level.a2a_comm (GB200's NVLink levels, from Table 7) and Level.comm (their ring all-reduce's
    measured bus bandwidth) scale that level's bandwidth only: an all-to-all inside the rack slows
    by the ratio, one across racks keeps the NICs' efficiency."""
    from piper_plan.cost import comm

    hw = load_hardware("gb200-nvl72")
    generic = hw.model_copy(update={"topology": [lv.model_copy(update={"comm": None, "a2a_comm": None})
                                                 for lv in hw.topology]})
    inside = [comm.a2a_flat(h, 256e6, 64, 1) for h in (hw, generic)]
    assert inside[0] > inside[1]
    nvl = hw.topology[hw.scaleup_level]
    assert nvl.a2a_comm < nvl.comm < hw.efficiency.comm
    assert all(lv.comm is None and lv.a2a_comm is None for lv in hw.topology if lv.via_nic)


def test_a_ring_across_nodes_moves_at_its_members_nics_not_one_gpus():
    """NCCL's ring all-reduce over 16 DGX B300 nodes reached 760 GB/s bus bandwidth (NVIDIA/nccl#2035)
    with a 100 GB/s NIC per GPU: each node's ring traffic leaves through all eight NICs. The model
    gives the same order at a large message (within 25 %), where pricing every byte at one GPU's
    NIC share gave a tenth of it; a data-parallel group with one member per node (TP 8) keeps the
    one NIC share."""
    hw = load_hardware("dgx-b300")
    n, nbytes = 128, 16e9
    busbw = 2 * (n - 1) / n * nbytes / float(comm.ring_allreduce(hw, nbytes, n, 1)) / 1e9
    assert busbw == pytest.approx(760, rel=0.25)
    per_gpu_nic = hw.nic_gbps_per_gpu * hw.efficiency.comm
    strided = 2 * (16 - 1) / 16 * nbytes / float(comm.ring_allreduce(hw, nbytes, 16, 8)) / 1e9
    assert strided == pytest.approx(per_gpu_nic, rel=0.02)


def test_a_fully_connected_node_gives_a_group_only_the_links_to_its_members():
    """8 x MI300X: seven 64 GB/s Infinity Fabric links per GPU, one to each peer, no switch. RCCL's
    all_reduce over all 8 reached 318.98 GB/s bus bandwidth (rocm-blogs mi300x-rccl-xgmi): the
    spec's 448 x 0.712. A pair has one link, four GPUs three; one message crosses one link; an
    all-to-all among 4 of the 8 moves each peer's bytes over that peer's own link."""
    hw = load_hardware("amd-mi300x")
    eff, nbytes = hw.topology[0].comm, 1e9

    def busbw(n, stride=1):
        return 2 * (n - 1) / n * nbytes / float(comm.ring_allreduce(hw, nbytes, n, stride)) / 1e9

    assert busbw(8) == pytest.approx(318.98, rel=0.01)
    assert busbw(2) == pytest.approx(64 * eff, rel=0.01) and busbw(4) == pytest.approx(192 * eff, rel=0.01)
    assert busbw(4, 2) == pytest.approx(192 * eff, rel=0.01)  # a strided group has its own direct links too
    assert float(comm.p2p(hw, nbytes, 1)) == pytest.approx(3e-6 + nbytes / (64e9 * eff), rel=1e-6)
    per_peer = nbytes / 4
    wire = float(comm.a2a_flat(hw, nbytes, 4, 1)) - 3 * 3e-6
    assert wire == pytest.approx(per_peer / (64e9 * eff), rel=1e-6)
    # a switched node (DGX H100) gives any group the GPU's whole NVLink rate
    h100 = load_hardware("dgx-h100")
    assert float(comm.group_span(h100, 2, 1)[0]) == float(comm.group_span(h100, 8, 1)[0])


def test_nvl72_rails_repeat_every_tray_not_every_rack():
    # a rank's peers in another rack with its tray-local index share its rail: 18 of a full rack's
    # 72, so 3/4 of the remote bytes cross rails (a spine tapered to a quarter of the NIC rate);
    # two racks a job fills whole
    gb200 = _racks_filled(72)
    tapered = gb200.model_copy(update={"network": gb200.network.model_copy(update={"cross_rail_taper": 0.25})})
    spine = gb200.nic_gbps_per_gpu * 1e9 * gb200.efficiency.comm * 0.25 / comm._a2a_nic_slowdown(gb200)
    remote = 72 * 1e9  # 1 GB to each of the 72 members of the other rack
    t = float(comm.a2a_flat(tapered, 144e9, 144, 1))
    assert t == pytest.approx(remote * 0.75 / spine, rel=0.02)


def test_an_array_of_message_sizes_prices_each_size():
    hw = load_hardware("dgx-h100")
    sizes = np.array([1e9, 2e9, 3e9])
    for f in (comm.a2a_flat, comm.a2a_halo):
        assert f(hw, sizes, 16, 1) == pytest.approx([float(f(hw, s, 16, 1)) for s in sizes])


def _fewest_in_a_domain(lay, group_of, size: int) -> int:
    """Members of a group of `lay` (group_of: RankCoord -> the group's key) that the rank with the
    fewest finds in its domain of `size` consecutive ranks, over every group of layout.rank_coords."""
    from piper_plan.layout import rank_coords

    groups = {}
    for c in rank_coords(lay, 4):
        groups.setdefault(group_of(c), []).append(c.rank // size)
    return min(min(domains.count(d) for d in domains) for domains in groups.values())


@pytest.mark.parametrize("gpus,tp,dp,ep,etp,placement", [
    (576, 1, 576, 64, 1, "packed"),   # racks of 72: the groups on ranks 64-127 ... 448-511 straddle two
    (128, 1, 128, 64, 1, "packed"),   # racks of 72: the second group has 8 ranks in the first, 56 in the second
    (64, 1, 64, 64, 1, "packed"),     # the whole world in one rack
    (288, 1, 288, 16, 1, "packed"),
    (288, 1, 288, 8, 1, "spread"),    # members 36 apart
    (576, 4, 72, 8, 2, "packed"),
    (576, 2, 144, 16, 1, "spread"),   # members 18 apart: a span of 288
    (1920, 8, 15, 5, 8, "packed"),    # a DP group of 15 at tp 8 (a span of 120) in pods of 160
    (960, 2, 40, 8, 1, "spread"),
])
def test_the_members_a_domain_holds_are_those_of_the_busiest_rank_of_the_rank_map(gpus, tp, dp, ep, etp, placement):
    """comm.level_counts against layout.rank_coords: for the EP and DP groups of each layout, at
    every level below the top of NVL72 racks filled 72 and 64 a job (trays of 4) and of A100 pods
    of 160 (nodes of 8), the fewest members any rank finds in its domain of job_block ranks."""
    from piper_plan.layout import Layout

    lay = Layout(gpus=gpus, tp=tp, dp=dp, pp=gpus // (tp * dp), ep=ep, etp=etp, placement=placement,
                 global_batch=dp, seq=4096)
    ep_stride = etp if placement == "packed" else dp * tp // ep
    for hw in (_racks_filled(72), _racks_filled(64), load_hardware("dgx-a100-80gb")):
        for j, (lv, block) in enumerate(zip(hw.topology[:-1], hw.job_blocks)):
            want_ep = _fewest_in_a_domain(lay, lambda c: (c.pp, c.edp, c.etp), block)
            want_dp = _fewest_in_a_domain(lay, lambda c: (c.pp, c.tp), block)
            assert comm.level_counts(hw, ep, ep_stride, gpus)[j] == want_ep, (hw.job_blocks, lv.name)
            assert comm.level_counts(hw, dp, tp, gpus)[j] == want_dp, (hw.job_blocks, lv.name)


def test_the_steady_state_count_is_the_gcd_of_span_and_domain():
    """Once the world holds every offset of the blocks against the domains (lcm(span, S) ranks
    and more), the fewest members is gcd(n·stride, S) / stride (at least 1), S the ranks a domain
    holds; where S and the span divide one another, as on machines of power-of-two levels, it is
    min(n, S // stride)."""
    from math import gcd, lcm

    hw = _racks_filled(72)
    for n in (2, 3, 4, 6, 8, 16, 64, 128):
        for stride in (1, 2, 4, 8, 16, 48):
            world = 4 * lcm(n * stride, 72)
            assert comm.level_counts(hw, n, stride, world)[1] == min(n, max(1, gcd(n * stride, 72) // stride))
    h100 = load_hardware("dgx-h100")  # nodes of 8, scalable units of 256
    for n in (2, 4, 8, 16, 64, 512):
        for stride in (1, 2, 8, 32):
            for world in (n * stride, 4 * n * stride, 32768):
                got = comm.level_counts(h100, n, stride, world)[:2].ravel()
                assert list(got) == [min(n, max(1, s // stride)) for s in (8, 256)]


def test_an_ep_group_of_64_stays_on_nvlink_in_racks_filled_64_a_job_and_straddles_racks_filled_72():
    """576 GB200 at EP 64. Filled 72 a rack, the group on ranks 64-127 holds 8 of its members in
    the first rack and 56 in the second: its busiest rank sends 56 of its 64 1 MB shares over its
    NIC (40 GB/s at comm 0.8) with 56 set-ups of 7 us, 4 over the rack at 3 us and 3 over its tray
    at 2.5 us: 1.81 ms. Filled 64 a rack (the bundled spec), every group is one rack's ranks and
    takes 0.29 ms over NVLink, as the one group of a 64-GPU world does."""
    racks_of_72, bundled = _racks_filled(72), load_hardware("gb200-nvl72")
    assert bundled.job_blocks == [4, 64, 18432]
    assert list(comm.level_counts(racks_of_72, 64, 1, 576).ravel()) == [4, 8, 64]
    nic = racks_of_72.nic_gbps_per_gpu * 1e9 * racks_of_72.efficiency.comm
    want = 56 * 1e6 / nic + 56 * 7e-6 + 4 * 3e-6 + 3 * 2.5e-6
    assert float(comm.a2a_flat(racks_of_72, 64e6, 64, 1, 576)) == pytest.approx(want, rel=1e-9)
    assert list(comm.level_counts(bundled, 64, 1, 576).ravel()) == [4, 64, 64]
    one_rack = float(comm.a2a_flat(racks_of_72, 64e6, 64, 1, 64))
    assert one_rack == pytest.approx(0.288e-3, rel=1e-2)
    assert float(comm.a2a_flat(bundled, 64e6, 64, 1, 576)) == pytest.approx(one_rack, rel=1e-12)


def test_a_rack_filled_64_a_job_prices_a_layout_as_a_rack_of_64_gpus():
    """DeepSeek-V3 on 576 GB200 at tp 1, pp 9, dp 64, EP 64 (each stage's 64 ranks one EP group):
    racks of 72 filled 64 a job price every term as racks of 64 GPUs would (the rack's bandwidth
    inside one); filled 72 a job, stages 1-7 straddle two racks and the all-to-all pays the NIC."""
    from piper_plan.cost.batch import from_layouts
    from piper_plan.cost.estimate import evaluate
    from piper_plan.layout import Layout
    from piper_plan.specs import load_model
    from piper_plan.sweep import set_field

    m, lay = load_model("deepseek-v3"), from_layouts([Layout(gpus=576, pp=9, dp=64, ep=64, global_batch=4608,
                                                              seq=4096)])
    racks_of_64 = set_field(_racks_filled(64), "topology.1.size", 64)
    filled_64, as_64, filled_72 = (evaluate(m, hw, lay) for hw in (_racks_filled(64), racks_of_64, _racks_filled(72)))
    for k in filled_64.time:
        assert float(filled_64.time[k][0]) == pytest.approx(float(as_64.time[k][0]), rel=1e-12), k
    assert float(filled_72.time["a2a"][0]) > 5 * float(filled_64.time["a2a"][0])


def test_a_level_s_job_block_lies_between_the_node_and_the_top_and_within_its_domains():
    """job_block: 1..size, a multiple of the level below's (a job holds whole nodes), no more than
    a domain's share of the level below's blocks, and refused on the node and on the top level
    (which holds the whole job); left at its default it is not written out, so older specs dump
    and hash as before; a level above one set derives its own from it."""
    gb200 = load_hardware("gb200-nvl72")
    d = gb200.model_dump()
    assert d["topology"][1]["job_block"] == 64 and "job_block" not in d["topology"][0] | d["topology"][2]
    for level, value, match in ((1, 73, "exceeds the domain's size 72"), (1, 0, "greater than or equal to 1"),
                                (1, 66, "multiple of the level below's 4"), (0, 4, "a job holds whole nodes"),
                                (2, 64, "the top level holds the whole job")):
        bad = gb200.model_dump()
        bad["topology"][level]["job_block"] = value
        with pytest.raises(ValueError, match=match):
            type(gb200).model_validate(bad)
    h100 = load_hardware("dgx-h100")
    assert "job_block" not in str(h100.model_dump()) and h100.job_blocks == [lv.size for lv in h100.topology]
    # racks of 72 filled 64, under pods of 8 racks: a pod holds 512 of a job's ranks unless it says fewer
    pods = gb200.model_dump()
    pods["topology"].insert(2, {"name": "pod", "size": 576, "via_nic": True, "latency_us": 5.0})
    assert type(gb200).model_validate(pods).job_blocks == [4, 64, 512, 18432]
    pods["topology"][2]["job_block"] = 576
    with pytest.raises(ValueError, match="at most the 512"):
        type(gb200).model_validate(pods)


@pytest.mark.parametrize("name", ["gb200-nvl72", "gb300-nvl72", "gb200-nvl72-nemo260601", "gb300-nvl72-nemo260601"])
def test_every_bundled_nvl72_spec_fills_64_gpus_a_rack_and_names_its_source(name):
    """The NVL72 specs (and their variants, through base:) place a job 64 GPUs a rack, and the
    file that sets it cites NVIDIA's Slurm block-scheduling guidance beside the figure."""
    import re

    from piper_plan.specs.registry import bundled_dir

    hw = load_hardware(name)
    assert [lv.job_block for lv in hw.topology] == [None, 64, None]
    text = (bundled_dir("hardware") / f"{name.split('-nemo')[0]}.yaml").read_text()
    block = re.search(r"^ +job_block: 64 +#(.*(?:\n +#.*)*)", text, re.M)
    assert block, "job_block: 64 without a comment beside it"
    for cited in ("--segment 16", "Slurm Block Scheduling", "developer.nvidia.com", "128+ GPUs"):
        assert cited in " ".join(block.group(1).replace("#", " ").split()), cited
    assert hw.topology[1].source.startswith("job_block 64: ")  # as show-spec prints the level


def test_a_strided_group_s_remote_peers_on_other_nics_cross_the_rails():
    # EP 2 over 6 ranks of 2-GPU nodes, spread (stride 3): pairs (0, 3), (1, 4), (2, 5), each rank's
    # peer on the other NIC index; counting a node's members (one each) had put it on the rank's rail
    q = load_hardware("emu-rail-q")  # a spine of 0.07 x the NIC rate between rails
    assert float(comm._cross_rail_share(q, 2, 3, 6)) == 1.0
    assert float(comm._cross_rail_share(q, 4, 2, 8)) == 0.0  # members 0, 2, 4, 6: one local index, one rail
    assert float(comm._cross_rail_share(q, 8, 1, 16)) == 0.5  # 3 of rank 0's 6 remote peers on the other rail
    nbytes = 4e6
    across = float(comm.a2a_flat(q, nbytes, 2, 3, world=6))
    spine = q.nic_gbps_per_gpu * 1e9 * q.efficiency.comm * q.network.cross_rail_taper
    assert across >= nbytes / 2 / spine  # the half sent to the peer goes over the spine
    # on a fabric without rails nothing is cross-rail
    assert float(comm._cross_rail_share(load_hardware("frontier"), 8, 1, 64)) == 0.0
