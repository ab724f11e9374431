"""Flat all_to_all_single vs HALO on emulated multi-node networks (network namespaces + tc).

    sudo python benchmarks/halo_netns.py [--out out/halo_netns.json] [--nic-mbit 300]

Needs root (without it, says so and exits 0). Builds, per topology, 4 nodes x 2 ranks out of
``piper-halo-*`` namespaces (see netns_topo.py), runs one gloo process per rank inside its
namespace (GLOO_SOCKET_IFNAME = its NIC), times every exchange as the slowest rank's time
from a barrier (median of the repetitions) and tears the namespaces down whatever happens.

Topologies: *uplink* (one shaped uplink per node, rate = --nic-mbit), *rail-q* and *rail-1*
(a shaped NIC per rank on its rail, spine at 1/4 and 1x one NIC's rate). Each is also written
as emu-<topology>.yaml with the tc rates and the p2p figures measured here, into --hw-dir
(default out/netns-specs/ under the current directory, which git ignores from the repository
root), so a plain run leaves the bundled hardware/emu-*.yaml alone. To refresh the bundled
specs deliberately, from the repository root: sudo python benchmarks/halo_netns.py --hw-dir
hardware, then review `git diff hardware/` before committing.

Columns: flat (dist.all_to_all_single), HALO (runtime/moe/halo.py, default coalesced Phase III,
counts known), HALO with the counts exchanged inside the call, per-pack (Phase III forwarded as
each pack lands), simple (counts first, Phase II, then Phase III), and the planner's predicted
times when piper_plan.cost.comm can price them. Every cell is the median of interleaved
repetitions (all variants of one repetition run back to back, so load drift hits all alike),
with the spread of the repetitions and a bootstrap interval of flat/HALO: a cell whose interval
holds 1 is a measured tie, and auto's choice there is reported as a tie, not scored.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import netns_topo  # noqa: E402
from _args import int_at_least, positive_float  # noqa: E402

NODES, PER_NODE = 4, 2
# not the repository's hardware/: a run writing there would rewrite the tracked, reviewed specs
HW_DIR = "out/netns-specs"
ROW = 256  # fp32 elements per row: 1 KiB rows
SIZES_KIB = [4, 16, 64, 256, 1024, 4096]
TOPOLOGIES = {  # name -> spine rate as a share of one NIC (None: the uplink topology)
    "uplink": None,
    "rail-q": 0.25,
    "rail-1": 1.0,
}


# ---------------------------------------------------------------- inside a rank process
def _timed(fn, dist, torch):
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
    return float(dt) * 1e3


SMALL_REPS = 9  # x reps below 256 KiB per peer, where a repetition costs milliseconds


def measure_rows(sizes_kib: list[int], reps: int, node_of: list[int], beside: dict[str, list[float]]) -> list[dict]:
    """Time flat vs HALO over sizes (KiB per peer, uniform splits); ms, median of reps
    (SMALL_REPS x the reps below 256 KiB), with every repetition's times kept. Collective:
    every rank calls it; rows are the same on all.

    flat: all_to_all_single with recv_splits known. halo: HALO (coalesced Phase III) with the
    count matrix known (a dispatcher gets it from exchange_counts in place of the flat path's
    own recv-split exchange). halo_counts: the same exchanging the counts inside the call.
    per_pack: Phase III forwarded as each pack lands. simple: all of Phase II, then Phase III."""
    import torch
    import torch.distributed as dist
    from piper_runtime.moe.halo import HaloExchange

    w = dist.get_world_size()
    halo, simple = HaloExchange(None, node_of), HaloExchange(None, node_of, mode="simple")
    per_pack = HaloExchange(None, node_of, mode="per_pack")
    rows = []
    for kib in sizes_kib:
        n = kib * 1024 // (4 * ROW)
        splits = [n] * w
        x = torch.randn(n * w, ROW)
        out = torch.empty_like(x)
        counts = halo.exchange_counts(splits)
        runs = {
            "flat": lambda: dist.all_to_all_single(out, x, splits, splits),
            "halo": lambda: halo(x, splits, splits, counts=counts),
            "halo_counts": lambda: halo(x, splits, splits),
            "per_pack": lambda: per_pack(x, splits, splits, counts=counts),
            "simple": lambda: simple(x, splits, splits, counts=counts),
        }
        runs["flat"]()
        for k in ("halo", "halo_counts", "per_pack", "simple"):  # same values, same order, on a real network
            if not torch.equal(runs[k](), out):
                raise RuntimeError(f"{k} output differs from flat at {kib} KiB per peer")
        times = {k: [] for k in runs}
        for _ in range(reps if kib >= 256 else SMALL_REPS * reps):
            for k, fn in runs.items():  # interleaved, so drift hits all alike
                times[k].append(_timed(fn, dist, torch))
            # floor and hop samples (4 B messages, never a compared row) beside every
            # repetition, so they see the shared cores' load of the period they are compared in
            fixed_cost_samples(beside, 1)
        med = {f"{k}_ms": statistics.median(v) for k, v in times.items()}
        rows.append({"bytes_per_peer": kib * 1024, **med, "speedup": med["flat_ms"] / med["halo_ms"],
                     "reps": len(times["flat"]), "times_ms": times})
    return rows


def count_exchange_ms(reps: int = 15) -> dict:
    """Median ms of HALO's count exchange (all_to_all of W^2 int64) beside the flat path's own
    recv-split exchange (all_to_all of W int64). Collective."""
    import torch
    import torch.distributed as dist
    from piper_runtime.moe.halo import HaloExchange

    w = dist.get_world_size()
    halo = HaloExchange(None, [0] * w)
    splits = [1] * w
    one = torch.ones(w, dtype=torch.int64)
    got = torch.empty_like(one)
    runs = {"halo_counts": lambda: halo.exchange_counts(splits),
            "flat_recv_splits": lambda: dist.all_to_all_single(got, one)}
    times = {k: [_timed(fn, dist, torch) for _ in range(reps)] for k, fn in runs.items()}
    return {f"{k}_ms": statistics.median(v) for k, v in times.items()}


def p2p_calibration(peers: dict[str, int], small: int = 2**20, big: int = 4 * 2**20) -> dict:
    """Rank 0 <-> each named peer: one-way latency (half the fastest 4-byte ping-pong of 30, us:
    the link and stack's own per-message cost; the median, also kept, adds the wait for the
    peer to be scheduled on the shared cores, which the per-call floor already prices) and
    bandwidth (GB/s) from the slope between one-way transfers of `small` and `big` bytes, each
    timed to a 4-byte ack (medians of 3), so fixed costs cancel. Collective."""
    import torch
    import torch.distributed as dist

    me, res = dist.get_rank(), {}
    tiny = torch.zeros(1)
    bufs = {n: torch.zeros(n // 4) for n in (small, big)}
    for name, p in peers.items():
        if me == 0:
            lat = []
            for _ in range(30):
                t = time.perf_counter()
                dist.send(tiny, p)
                dist.recv(tiny, p)
                lat.append((time.perf_counter() - t) / 2)
            one_way = {}
            for n, buf in bufs.items():
                ts = []
                for _ in range(3):
                    t = time.perf_counter()
                    dist.send(buf, p)
                    dist.recv(tiny, p)
                    ts.append(time.perf_counter() - t)
                one_way[n] = statistics.median(ts)
            slope = max(one_way[big] - one_way[small], 1e-9) / (big - small)
            res[name] = {"latency_us": min(lat) * 1e6, "latency_median_us": statistics.median(lat) * 1e6,
                         "bandwidth_gbps": 1 / slope / 1e9}
        elif me == p:
            for _ in range(30):
                dist.recv(tiny, 0)
                dist.send(tiny, 0)
            for buf in bufs.values():
                for _ in range(3):
                    dist.recv(buf, 0)
                    dist.send(tiny, 0)
        dist.barrier()
    return res


def _streams_ms(peers: list[tuple[int, int]], nbytes: int, reps: int) -> float:
    """Median ms (slowest rank, from a barrier) of every rank streaming one nbytes message to
    each dst while receiving one from each src, for all (dst, src) in `peers` at once, receives
    posted first (gloo P2P is a rendezvous). Collective."""
    import torch
    import torch.distributed as dist

    outs = [torch.zeros(nbytes // 4) for _ in peers]
    ins = [torch.zeros(nbytes // 4) for _ in peers]

    def go():
        ops = [dist.P2POp(dist.irecv, buf, src) for (_, src), buf in zip(peers, ins)]
        ops += [dist.P2POp(dist.isend, buf, dst) for (dst, _), buf in zip(peers, outs)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()

    go()  # warm the connections and the TCP windows
    return statistics.median(_timed(go, dist, torch) for _ in range(reps))


def tiny_a2a_ms(reps: int) -> list[float]:
    """ms of all_to_all_single with 4 bytes per peer over all ranks (slowest rank, from a
    barrier), `reps` calls: the per-call floor. Collective."""
    import torch
    import torch.distributed as dist

    w = dist.get_world_size()
    one, got = torch.zeros(w), torch.zeros(w)
    return [_timed(lambda: dist.all_to_all_single(got, one), dist, torch) for _ in range(reps)]


def hop_ms(dependent: bool) -> float:
    """ms (slowest rank, from a barrier) of every rank sending 4 bytes to its same-index peer
    on the next node (receiving from the previous node's) and, when `dependent`, then
    forwarding 4 bytes to its next node neighbour once that message has landed: the second
    message is a dependent intra-node hop, as a HALO relay's Phase III is. Collective."""
    import torch
    import torch.distributed as dist

    me = dist.get_rank()
    node, loc = divmod(me, PER_NODE)
    rank = lambda n, lo: (n % NODES) * PER_NODE + lo % PER_NODE  # noqa: E731
    a, b, c, d = (torch.zeros(1) for _ in range(4))

    def go():
        ws = dist.batch_isend_irecv([dist.P2POp(dist.irecv, b, rank(node - 1, loc)),
                                     dist.P2POp(dist.isend, a, rank(node + 1, loc))])
        if dependent:
            hop = dist.irecv(d, rank(node, loc - 1))
            ws[0].wait()  # each gloo work is waited on once: a second wait hangs
            ws = ws[1:] + [hop, dist.isend(b, rank(node, loc + 1))]
        for w in ws:
            w.wait()

    return _timed(go, dist, torch)


def fixed_cost_samples(into: dict[str, list[float]], reps: int) -> None:
    """Append `reps` samples each, interleaved, of the per-call floor of both algorithms (flat
    all_to_all_single and HALO, counts known, 4 bytes per peer) and of the one-hop and two-hop
    4-byte patterns (hop_ms). Collective."""
    import torch
    import torch.distributed as dist
    from piper_runtime.moe.halo import HaloExchange

    w = dist.get_world_size()
    halo = HaloExchange(None, [k // PER_NODE for k in range(w)])
    one, splits = torch.zeros(w, 1), [1] * w
    counts = halo.exchange_counts(splits)
    for _ in range(reps):
        into.setdefault("tiny_a2a", []).extend(tiny_a2a_ms(1))
        into.setdefault("tiny_halo", []).append(_timed(lambda: halo(one, splits, splits, counts=counts), dist, torch))
        into.setdefault("hop1", []).append(hop_ms(False))
        into.setdefault("hop2", []).append(hop_ms(True))


def micro_calibration(cross_rail: bool, reps: int = 3, tiny_reps: int = 21, big: int = 4 * 2**20,
                      intra_sizes: tuple[int, int] = (2**20, 4 * 2**20), intra_reps: int = 5) -> dict:
    """The model's parameters, measured on this topology apart from the compared rows (and
    before them), each with every rank active at once, as in an exchange. Collective.

    tiny_a2a: all_to_all_single calls of 4 bytes per peer (the per-call floor,
      collective_overhead_us); measure_rows adds one beside every timed repetition, and the
      floor is the median of all, so it sees the load (8 ranks and other users on 2 cores) of
      the period it is compared in. tiny_halo likewise: HALO's 4-byte call; median(tiny_halo)
      - median(tiny_a2a) is what HALO's dependent Phase III round adds to the floor under that
      load (relay and receiver must run again, and HALO's P2P ops cost more CPU than the one
      collective), the node level's latency_us (its idle ping-pong is ~70 us). hop1 / hop2
      (hop_ms) time the bare mechanism, a dependent 4-byte intra-node message, for the report.
    fan_gbps: per-rank injection bandwidth when EVERY rank streams one `big` message to its
      same-index peer on EVERY other node at once: the NODES-1 concurrent flows per rank that
      any all-to-all puts on a NIC / uplink. (One flow per NIC reached 0.95 of the tc rate on
      the rails, three flows 0.76: TCP flows sharing one shaped queue lose efficiency, so the
      fan-out is part of the link's figure.) cross_gbps (rail only): the same to the
      other-index peer on every other node, so every flow crosses the spine.
    intra_gbps: per-rank bandwidth of the intra-node link with every rank streaming to a node
      neighbour at once (8 ranks share 2 cores, so a lone pair's rate is no guide), from the
      slope between `intra_sizes`, so fixed costs cancel."""
    import torch.distributed as dist

    me = dist.get_rank()
    node, loc = divmod(me, PER_NODE)
    samples: dict[str, list[float]] = {}
    fixed_cost_samples(samples, tiny_reps)
    res = {"fixed_cost_samples": samples, "tiny_a2a_bytes_per_peer": 4, "reps": reps, "fan_bytes": big,
           "fan_flows": NODES - 1}

    def rank(n: int, lo: int) -> int:
        return (n % NODES) * PER_NODE + lo % PER_NODE

    fans = {"fan": 0}
    if cross_rail:
        fans["cross"] = 1
    for name, dl in fans.items():
        peers = [(rank(node + k, loc + dl), rank(node - k, loc - dl)) for k in range(1, NODES)]
        t = _streams_ms(peers, big, reps)
        res[f"{name}_ms"] = t
        res[f"{name}_gbps"] = len(peers) * big / t * 1e3 / 1e9
    nb = rank(node, loc + 1)
    nb_src = rank(node, loc - 1)
    ti = {n: _streams_ms([(nb, nb_src)], n, intra_reps) for n in intra_sizes}
    lo, hi = intra_sizes
    res.update(intra_ms={str(n): t for n, t in ti.items()},
               intra_gbps=(hi - lo) / max(ti[hi] - ti[lo], 1e-6) * 1e3 / 1e9)
    return res


def worker(a) -> int:
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    w = NODES * PER_NODE
    dist.init_process_group("gloo", store=dist.FileStore(a.store, w), rank=a.rank, world_size=w,
                            timeout=datetime.timedelta(seconds=180))
    node_of = [k // PER_NODE for k in range(w)]
    calib = p2p_calibration({"intra": 1, "inter": PER_NODE})
    micro = calib["micro"] = micro_calibration(a.cross_rail)  # before the rows it is compared with
    samples = micro.pop("fixed_cost_samples")
    rows = measure_rows(a.sizes, a.reps, node_of, samples)
    med = {k: statistics.median(v) for k, v in samples.items()}
    micro.update(tiny_a2a_ms=med["tiny_a2a"], tiny_reps=len(samples["tiny_a2a"]), tiny_halo_ms=med["tiny_halo"],
                 round_ms=max(med["tiny_halo"] - med["tiny_a2a"], 0.0), hop_ms=max(med["hop2"] - med["hop1"], 0.0))
    calib["count_exchange"] = count_exchange_ms()
    if a.rank == 0:
        Path(a.result).write_text(json.dumps({"calibration": calib, "rows": rows}))
    dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------- the driver (root)
def run_topology(name: str, nic_mbit: float, sizes_kib: list[int], reps: int,
                 timeout_s: float = 900) -> dict:
    """Build one topology, run the ranks, tear it down; returns {calibration, rows}."""
    spine = TOPOLOGIES[name]
    if spine is None:
        ranks = netns_topo.build_uplink(NODES, PER_NODE, nic_mbit)
    else:
        ranks = netns_topo.build_rail(NODES, PER_NODE, nic_mbit, nic_mbit * spine)
    tmp = Path(tempfile.mkdtemp(prefix="piper-halo-"))
    try:
        result = tmp / "result.json"
        netns_topo.run_ranks(ranks, lambda r: [
            str(Path(__file__).resolve()), "--worker", "--rank", str(r.rank), "--store", str(tmp / "store"),
            "--result", str(result), "--reps", str(reps), "--sizes", *map(str, sizes_kib),
            *(["--cross-rail"] if spine is not None else [])], tmp, timeout_s, name)
        res = json.loads(result.read_text())
        res["calibration"]["qdisc"] = netns_topo.qdisc_stats()  # before the namespaces go
        return res
    finally:
        netns_topo.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


def hardware_yaml(name: str, nic_mbit: float, calib: dict) -> dict:
    """The emulated topology as a HardwareSpec mapping (GB/s = 10^9 B/s; us). The comm
    efficiency, per-call floor and cross-rail taper come from micro_calibration, measured on
    this topology before the compared rows (never fitted to them); the rates are the tc ones."""
    from piper_plan.specs import load_hardware

    base = load_hardware("cpu-local")
    tc = "tc rate set by benchmarks/halo_netns.py"
    meas = "measured by benchmarks/halo_netns.py (gloo p2p between rank namespaces; latency: half the fastest of 30 ping-pongs)"
    nic = nic_mbit * 1e6 / 8 / 1e9
    spine = TOPOLOGIES[name]
    inter, intra, micro = calib["inter"], calib["intra"], calib["micro"]
    per_gpu = nic / (PER_NODE if spine is None else 1)  # HardwareSpec.nic_gbps_per_gpu of this spec
    comm_eff = min(1.0, micro["fan_gbps"] / per_gpu)
    fan = (f"every rank streams {micro['fan_bytes'] >> 20} MiB at once to each of its {micro['fan_flows']} "
           f"{{}} peers on the other nodes ({micro['fan_flows']} concurrent flows per rank, as in an all-to-all); "
           f"bytes / median time of {micro['reps']}")
    eff = base.efficiency.model_dump()
    eff.update(
        comm=round(comm_eff, 3), collective_overhead_us=round(micro["tiny_a2a_ms"] * 1e3, 1),
        source=f"{base.efficiency.source}; {_MICRO_SRC}: comm = per-rank bandwidth of a fan-out across nodes "
               f"({fan.format('same-index')}) / tc rate per rank; "
               f"collective_overhead_us = median all_to_all_single of {micro['tiny_a2a_bytes_per_peer']} B per "
               f"peer over all ranks ({micro['tiny_reps']} calls: a block first, then one beside every timed repetition) "
               f"less its message set-ups at this spec's latencies")
    net = {"nics_per_node": 1 if spine is None else PER_NODE, "nic_gbps": nic,
           "nic_affinity": [0] * PER_NODE if spine is None else list(range(PER_NODE)), "source": tc}
    if spine is not None:
        # per-GPU share of the NIC's effective rate across the spine with every rank crossing it
        # (tc alone says spine / NODES; the measured share also carries the spine's own efficiency)
        taper = min(1.0, micro["cross_gbps"] / (per_gpu * comm_eff))
        net.update(rail_optimized=True, cross_rail_taper=round(taper, 4),
                   source=f"{tc}: NIC {nic_mbit:g} Mbit/s, spine {spine:g} x NIC shared by {NODES} ranks per rail "
                          f"(nominal cross_rail_taper {spine / NODES:g}); cross_rail_taper {_MICRO_SRC}: per-rank "
                          f"bandwidth of a fan-out in which every flow crosses the spine ({fan.format('other-index')}) "
                          f"/ (NIC rate x comm)")
    lo, hi = (int(k) for k in micro["intra_ms"])
    intra_src = (f"unshaped intra-node veth; bandwidth {_MICRO_SRC}: every rank streams to a node neighbour at once, "
                 f"slope between {lo >> 20} and {hi >> 20} MiB (medians); latency {_MICRO_SRC}: what HALO's dependent "
                 f"intra-node round adds to the per-call floor under full load (median of {micro['tiny_reps']} HALO "
                 f"calls of 4 B per peer minus median of as many all_to_all_single ones; a bare dependent 4-byte "
                 f"message to a node neighbour adds {micro['hop_ms'] * 1e3:.0f} us; idle ping-pong: "
                 f"{intra['latency_us']:.0f} us)")
    spec = {
        "name": f"emu-{name}",
        "source": f"emulated by benchmarks/halo_netns.py: {NODES} nodes x {PER_NODE} ranks in network namespaces, "
                  f"tbf-shaped veths, gloo over TCP (MTU {netns_topo.MTU})",
        "accelerator": base.accelerator.model_dump(),
        "efficiency": eff,
        "gpus_per_node": PER_NODE,
        "max_gpus": NODES * PER_NODE,
        "network": net,
        "topology": [
            {"name": "node", "size": PER_NODE, "bandwidth_gbps": round(micro["intra_gbps"], 4),
             "latency_us": round(max(micro["round_ms"] * 1e3, intra["latency_us"]), 1), "source": intra_src},
            {"name": "system", "size": NODES * PER_NODE, "via_nic": True, "taper": 1.0,
             "latency_us": round(inter["latency_us"], 1),
             "source": f"latency {meas}; {'uplink' if spine is None else 'rails + spine'} per network"},
        ],
        "collectives": "gloo",  # the emulated nodes' ranks run torch's gloo backend
    }
    # the floor is what a small call costs beyond its α-β set-ups (comm.a2a_call adds them back)
    from piper_plan.cost import comm
    from piper_plan.specs.hardware import HardwareSpec

    a_flat = float(comm._alphas(HardwareSpec(**spec), NODES * PER_NODE, 1)[0])
    eff["collective_overhead_us"] = round(max(0.0, micro["tiny_a2a_ms"] * 1e-3 - a_flat) * 1e6, 1)
    return spec


_MICRO_SRC = "measured by benchmarks/halo_netns.py micro_calibration (separate patterns, not the compared exchanges)"


def write_hardware(name: str, data: dict, hw_dir: Path) -> Path:
    import yaml

    from piper_plan.specs import load_hardware

    hw_dir.mkdir(parents=True, exist_ok=True)
    path = hw_dir / f"emu-{name}.yaml"
    path.write_text("# Written by benchmarks/halo_netns.py; refresh: sudo python benchmarks/halo_netns.py "
                    "--hw-dir hardware\n"
                    + yaml.safe_dump(data, sort_keys=False, width=120))
    load_hardware(str(path))  # must load as a HardwareSpec
    return path


def predict(hw_path: Path, bytes_per_peer: int, world: int):
    """Planner's seconds for this exchange, or None when the model cannot say:
    {flat, halo} from comm.a2a_call (flat: the per-call floor overlapping the transfer; HALO:
    floor, then its rendezvous phases' wire time), and {flat_sum, halo_sum}, the additive form
    wire + collective_overhead_us x a2a_rounds (the form a2a_call replaced), for comparison."""
    try:
        from piper_plan.cost import comm
        from piper_plan.specs import load_hardware

        hw = load_hardware(str(hw_path))
        co = hw.efficiency.collective_overhead_us * 1e-6
        nbytes = bytes_per_peer * world
        out = {}
        for algo, is_halo in (("flat", False), ("halo", True)):
            wire = comm.a2a_halo(hw, nbytes, world, 1) if is_halo else comm.a2a_flat(hw, nbytes, world, 1)
            out[algo] = float(comm.a2a_call(hw, nbytes, world, 1, is_halo, wire=wire))
            out[f"{algo}_sum"] = float(wire) + co * float(comm.a2a_rounds(hw, world, 1, is_halo))
        return out
    except Exception as e:  # a model still being written must not sink the measurement
        print(f"(no prediction: {type(e).__name__}: {e})", file=sys.stderr)
        return None


def run_benchmark(topologies: list[str], nic_mbit: float, sizes_kib: list[int], reps: int,
                  hw_dir: Path | None = None) -> list[dict]:
    """Measure every topology; rows are dicts (topology, bytes_per_peer, *_ms, speedups)."""
    rows = []
    for name in topologies:
        t = time.perf_counter()
        res = run_topology(name, nic_mbit, sizes_kib, reps)
        hw_path = write_hardware(name, hardware_yaml(name, nic_mbit, res["calibration"]), hw_dir) if hw_dir else None
        for r in res["rows"]:
            r.update(topology=name, nic_mbit=nic_mbit, calibration=res["calibration"])
            pred = predict(hw_path, r["bytes_per_peer"], NODES * PER_NODE) if hw_path else None
            r.update({f"pred_{k}_ms": None if pred is None else pred[k] * 1e3
                      for k in ("flat", "halo", "flat_sum", "halo_sum")})
            rows.append(r)
        print(f"{name}: {time.perf_counter() - t:.0f} s", file=sys.stderr)
    return rows


def _err(pred, meas):
    return None if pred is None else (pred - meas) / meas


def spread(v: list[float]) -> float:
    """Interquartile range of repetitions over their median (relative)."""
    import numpy as np

    q1, med, q3 = np.percentile(v, [25, 50, 75])
    return float((q3 - q1) / med)


def ratio_interval(flat: list[float], halo: list[float], level: float = 0.9, draws: int = 2000) -> tuple:
    """Bootstrap interval (`level`) of median(flat) / median(halo): repetitions resampled in
    pairs (flat and HALO of one repetition ran back to back, under the same load)."""
    import numpy as np

    f, h = np.asarray(flat), np.asarray(halo)
    idx = np.random.default_rng(0).integers(0, len(f), (draws, len(f)))
    r = np.median(f[idx], axis=1) / np.median(h[idx], axis=1)
    lo, hi = np.quantile(r, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def compare(rows: list[dict]) -> None:
    """Adds err_flat, err_halo (relative, signed), spreads, the flat/HALO interval, auto (the
    algorithm with the smaller predicted time, flat on ties as `--a2a auto` keeps it), faster
    (measured) and verdict: "yes" (auto picked the faster), "NO", or "tie" when the measured
    interval of flat/HALO holds 1 (this run cannot say which is faster, so neither choice is
    scored)."""
    for r in rows:
        t = r["times_ms"]
        lo, hi = ratio_interval(t["flat"], t["halo"])
        r.update(spread_flat=spread(t["flat"]), spread_halo=spread(t["halo"]), ratio_lo=lo, ratio_hi=hi,
                 err_flat=_err(r["pred_flat_ms"], r["flat_ms"]), err_halo=_err(r["pred_halo_ms"], r["halo_ms"]),
                 err_flat_sum=_err(r["pred_flat_sum_ms"], r["flat_ms"]),
                 err_halo_sum=_err(r["pred_halo_sum_ms"], r["halo_ms"]),
                 faster="halo" if r["halo_ms"] < r["flat_ms"] else "flat",
                 auto=None if r["pred_flat_ms"] is None else ("halo" if r["pred_halo_ms"] < r["pred_flat_ms"]
                                                              else "flat"))
        r["verdict"] = ("-" if r["auto"] is None else "tie" if lo <= 1.0 <= hi
                        else "yes" if r["auto"] == r["faster"] else "NO")


def print_table(rows: list[dict]) -> None:
    f = "{:<8} {:>8} {:>9} {:>9} {:>9} {:>12} {:>9} {:>9} {:>10}"
    print(f.format("topology", "KiB/peer", "flat ms", "HALO ms", "HALO/flat", "HALO+counts", "per-pack", "simple",
                   "count xchg"))
    for r in rows:
        ce = r["calibration"]["count_exchange"]
        print(f.format(r["topology"], r["bytes_per_peer"] // 1024, f"{r['flat_ms']:.2f}", f"{r['halo_ms']:.2f}",
                       f"{r['speedup']:.2f}x", f"{r['flat_ms'] / r['halo_counts_ms']:.2f}x",
                       f"{r['flat_ms'] / r['per_pack_ms']:.2f}x", f"{r['flat_ms'] / r['simple_ms']:.2f}x",
                       f"{ce['halo_counts_ms']:.1f}/{ce['flat_recv_splits_ms']:.1f}"))
    print("HALO: coalesced Phase III, counts known (the dispatcher's one count exchange); HALO+counts, per-pack "
          "(Phase III per pack as it lands) and simple (no phase overlap) as speedups over flat (HALO/flat = "
          "flat ms / HALO ms); count xchg: ms of HALO's W^2 count all_to_all / flat's W recv-split all_to_all.\n")
    f = "{:<8} {:>8} {:>9} {:>5} {:>9} {:>7} {:>9} {:>5} {:>9} {:>7} {:>16} {:>6} {:>6} {:>5}"
    print(f.format("topology", "KiB/peer", "flat ms", "iqr", "pred flat", "err", "HALO ms", "iqr", "pred HALO", "err",
                   "flat/HALO [90%]", "faster", "auto", "ok"))
    for r in rows:
        pct = lambda e: "-" if e is None else f"{100 * e:+.0f}%"  # noqa: E731
        num = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        print(f.format(r["topology"], r["bytes_per_peer"] // 1024, f"{r['flat_ms']:.2f}",
                       f"{100 * r['spread_flat']:.0f}%", num(r["pred_flat_ms"]), pct(r["err_flat"]),
                       f"{r['halo_ms']:.2f}", f"{100 * r['spread_halo']:.0f}%", num(r["pred_halo_ms"]),
                       pct(r["err_halo"]), f"{r['speedup']:.2f} [{r['ratio_lo']:.2f},{r['ratio_hi']:.2f}]",
                       r["faster"], r["auto"] or "-", r["verdict"]))
    print("pred: piper_plan.cost.comm.a2a_call (a2a_flat / a2a_halo with the per-call floor) on the emitted "
          "emu-<topology>.yaml (--hw-dir), whose parameters come from micro_calibration, not from these rows; "
          "err = pred/meas - 1; iqr: interquartile range of the repetitions / median; [90%]: bootstrap interval "
          "of flat/HALO; auto = the smaller prediction; faster = measured; ok: tie when the interval holds 1 "
          "(this run cannot tell which is faster; not scored).")
    for name, c in {r["topology"]: r["calibration"] for r in rows}.items():
        m, q = c["micro"], c.get("qdisc", {})
        extra = f", cross-rail fan-out {m['cross_gbps'] * 8e3:.0f} Mbit/s per rank" if "cross_gbps" in m else ""
        drops = sum(v["drops"] for v in q.values())
        print(f"  {name}: floor (4-byte all_to_all) {m['tiny_a2a_ms']:.2f} ms, 4-byte HALO {m['tiny_halo_ms']:.2f} ms, "
              f"bare dependent intra-node hop {m['hop_ms']:.2f} ms, intra {m['intra_gbps']:.2f} GB/s per rank, "
              f"fan-out {m['fan_gbps'] * 8e3:.0f} Mbit/s per rank{extra}; tc drops {drops} of "
              f"{sum(v['packets'] for v in q.values())} packets on {len(q)} shaped queues")


def summarize(rows: list[dict]) -> dict:
    """Max |error| per algorithm and topology, cells within 25%, and auto's verdicts, for
    a2a_call and (errors only) the additive form (wire + floor x rounds)."""
    out = {}
    for name in dict.fromkeys(r["topology"] for r in rows):
        mine = [r for r in rows if r["topology"] == name and r["auto"] is not None]
        if mine:
            out[name] = {k: max(abs(r[f"err_{k}"]) for r in mine) for k in ("flat", "halo", "flat_sum", "halo_sum")}
            out[name].update(cases=len(mine), within_25=sum(abs(r[f"err_{k}"]) <= 0.25 for r in mine
                                                            for k in ("flat", "halo")),
                             **{f"auto_{v}": sum(r["verdict"] == v for r in mine) for v in ("yes", "tie", "NO")})
    for name, s in out.items():
        print(f"summary {name:<7} max |err| flat {100 * s['flat']:.0f}%  HALO {100 * s['halo']:.0f}%  "
              f"within 25%: {s['within_25']}/{2 * s['cases']}  auto right {s['auto_yes']}, tie {s['auto_tie']}, "
              f"wrong {s['auto_NO']} of {s['cases']}   (additive form: flat {100 * s['flat_sum']:.0f}%  "
              f"HALO {100 * s['halo_sum']:.0f}%)")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="out/halo_netns.json", help="results JSON")
    ap.add_argument("--nic-mbit", type=positive_float, default=300, help="shaped NIC (rail) / uplink rate, Mbit/s")
    ap.add_argument("--sizes", type=int_at_least(1), nargs="+", default=SIZES_KIB, help="KiB per peer")
    ap.add_argument("--reps", type=int_at_least(1), default=7,
                    help=f"timed repetitions for >= 256 KiB ({SMALL_REPS}x below)")
    ap.add_argument("--topologies", nargs="+", default=list(TOPOLOGIES), choices=list(TOPOLOGIES))
    ap.add_argument("--hw-dir", default=HW_DIR,
                    help=f"where emu-*.yaml go ('' = none; default {HW_DIR}; 'hardware' refreshes the bundled specs)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--cross-rail", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return worker(a)
    # exit 0 when skipped: nothing failed, nothing was measured, and the line says so
    if os.geteuid() != 0:
        print("halo_netns: skipped: needs root to build network namespaces (sudo python benchmarks/halo_netns.py)")
        return 0
    if not (shutil.which("ip") and shutil.which("tc")):
        print("halo_netns: skipped: needs iproute2 (ip, tc) to build network namespaces")
        return 0
    netns_topo.guard()
    netns_topo.teardown()  # leftovers of a crashed run
    try:
        rows = run_benchmark(a.topologies, a.nic_mbit, a.sizes, a.reps, Path(a.hw_dir) if a.hw_dir else None)
    except RuntimeError as e:
        print(f"halo_netns: {e}", file=sys.stderr)
        return 1
    finally:
        netns_topo.cleanup()
    compare(rows)
    print_table(rows)
    summary = summarize(rows)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
