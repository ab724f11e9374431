"""Flat all_to_all_single vs HALO on emulated multi-node networks (network namespaces + tc).

    sudo python benchmarks/halo_netns.py [--out out/halo_netns.json] [--nic-mbit 300]

Needs root (without it, says so and exits 0). Builds, per topology, 4 nodes x 2 ranks out of
``piper-halo-*`` namespaces (see netns_topo.py), runs one gloo process per rank inside its
namespace (GLOO_SOCKET_IFNAME = its NIC), times every exchange as the slowest rank's time
from a barrier (median of the repetitions) and tears the namespaces down whatever happens.

Topologies: *uplink* (one shaped uplink per node, rate = --nic-mbit), *rail-q* and *rail-1*
(a shaped NIC per rank on its rail, spine at 1/4 and 1x one NIC's rate). Each is also written
as hardware/emu-<topology>.yaml with the tc rates and the p2p figures measured here.

Columns: flat (dist.all_to_all_single), HALO (runtime/moe/halo.py, counts exchanged inside
the call), simple (HALO without overlap: counts first, Phase II, then Phase III), and the
planner's predicted times when piper_plan.cost.comm can price them.
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import netns_topo  # noqa: E402

NODES, PER_NODE = 4, 2
ROW = 256  # fp32 elements per row: 1 KiB rows
SIZES_KIB = [4, 16, 64, 256, 1024, 4096]
TOPOLOGIES = {  # name -> spine rate as a share of one NIC (None: the uplink topology)
    "uplink": None,
    "rail-q": 0.25,
    "rail-1": 1.0,
}
_children: list[subprocess.Popen] = []


# ---------------------------------------------------------------- inside a rank process
def _timed(fn, dist, torch):
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
    return float(dt) * 1e3


def measure_rows(sizes_kib: list[int], reps: int, node_of: list[int]) -> list[dict]:
    """Time flat vs HALO over sizes (KiB per peer, uniform splits); ms, median of reps (5x the
    reps below 256 KiB). Collective: every rank calls it; rows are the same on all.

    flat: all_to_all_single with recv_splits known. halo: HALO with the count matrix known (a
    dispatcher gets it from exchange_counts in place of the flat path's own recv-split
    exchange). halo_counts: HALO exchanging the counts inside the call. simple: HALO without
    overlap (all of Phase II, then all of Phase III), counts known."""
    import torch
    import torch.distributed as dist
    from piper_runtime.moe.halo import HaloExchange

    w = dist.get_world_size()
    halo, simple = HaloExchange(None, node_of), HaloExchange(None, node_of, overlap=False)
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
            "simple": lambda: simple(x, splits, splits, counts=counts),
        }
        runs["flat"]()
        for k in ("halo", "halo_counts", "simple"):  # same values, same order, on a real network
            if not torch.equal(runs[k](), out):
                raise RuntimeError(f"{k} output differs from flat at {kib} KiB per peer")
        times = {k: [] for k in runs}
        for _ in range(reps if kib >= 256 else 5 * reps):
            for k, fn in runs.items():  # interleaved, so drift hits all alike
                times[k].append(_timed(fn, dist, torch))
        med = {f"{k}_ms": statistics.median(v) for k, v in times.items()}
        rows.append({"bytes_per_peer": kib * 1024, **med, "speedup": med["flat_ms"] / med["halo_ms"],
                     "reps": len(times["flat"])})
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
    """Rank 0 <-> each named peer: one-way latency (half the median 4-byte ping-pong, us) and
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
            res[name] = {"latency_us": statistics.median(lat) * 1e6, "bandwidth_gbps": 1 / slope / 1e9}
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
    rows = measure_rows(a.sizes, a.reps, node_of)
    calib["count_exchange"] = count_exchange_ms()
    if a.rank == 0:
        Path(a.result).write_text(json.dumps({"calibration": calib, "rows": rows}))
    dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------- the driver (root)
def _cleanup() -> None:
    for p in _children:
        if p.poll() is None:
            p.kill()
    for p in _children:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    _children.clear()
    netns_topo.teardown()


def _on_signal(signum, _frame):
    raise SystemExit(128 + signum)  # unwinds through the finally blocks


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
        for r in ranks:
            env = dict(os.environ, GLOO_SOCKET_IFNAME=r.ifname, OMP_NUM_THREADS="1")
            cmd = ["ip", "netns", "exec", r.netns, sys.executable, str(Path(__file__).resolve()), "--worker",
                   "--rank", str(r.rank), "--store", str(tmp / "store"), "--result", str(result),
                   "--reps", str(reps), "--sizes", *map(str, sizes_kib)]
            log = open(tmp / f"rank{r.rank}.log", "w")
            _children.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout_s
        while any(p.poll() is None for p in _children):
            if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in _children):
                break
            time.sleep(0.5)
        bad = [i for i, p in enumerate(_children) if p.poll() != 0]
        if bad:
            tail = (tmp / f"rank{bad[0]}.log").read_text()[-1500:]
            raise RuntimeError(f"{name}: rank {bad[0]} failed or timed out:\n{tail}")
        return json.loads(result.read_text())
    finally:
        _cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


def hardware_yaml(name: str, nic_mbit: float, calib: dict) -> dict:
    """The emulated topology as a HardwareSpec mapping (GB/s = 10^9 B/s; us)."""
    from piper_plan.specs import load_hardware

    base = load_hardware("cpu-local")
    tc = "tc rate set by benchmarks/halo_netns.py"
    meas = "measured by benchmarks/halo_netns.py (gloo p2p between rank namespaces)"
    nic = nic_mbit * 1e6 / 8 / 1e9
    spine = TOPOLOGIES[name]
    inter, intra = calib["inter"], calib["intra"]
    eff = base.efficiency.model_dump()
    eff.update(comm=round(min(1.0, inter["bandwidth_gbps"] / nic), 3),
               source=f"{base.efficiency.source}; comm = measured same-rail p2p bandwidth / tc rate ({meas})")
    net = {"nics_per_node": 1 if spine is None else PER_NODE, "nic_gbps": nic,
           "nic_affinity": [0] * PER_NODE if spine is None else list(range(PER_NODE)), "source": tc}
    if spine is not None:
        # per-GPU share of a NIC's rate across the spine when all NODES ranks of a rail cross it
        net.update(rail_optimized=True, cross_rail_taper=spine / NODES,
                   source=f"{tc}: NIC {nic_mbit} Mbit/s, spine {spine:g} x NIC shared by {NODES} ranks per rail")
    return {
        "name": f"emu-{name}",
        "source": f"emulated by benchmarks/halo_netns.py: {NODES} nodes x {PER_NODE} ranks in network namespaces, "
                  f"tbf-shaped veths, gloo over TCP (MTU {netns_topo.MTU})",
        "accelerator": base.accelerator.model_dump(),
        "efficiency": eff,
        "gpus_per_node": PER_NODE,
        "max_gpus": NODES * PER_NODE,
        "network": net,
        "topology": [
            {"name": "node", "size": PER_NODE, "bandwidth_gbps": round(intra["bandwidth_gbps"], 4),
             "latency_us": round(intra["latency_us"], 1), "source": f"unshaped intra-node veth, {meas}"},
            {"name": "system", "size": NODES * PER_NODE, "via_nic": True, "taper": 1.0,
             "latency_us": round(inter["latency_us"], 1),
             "source": f"latency {meas}; {'uplink' if spine is None else 'rails + spine'} per network"},
        ],
    }


def write_hardware(name: str, data: dict, hw_dir: Path) -> Path:
    import yaml

    from piper_plan.specs import load_hardware

    path = hw_dir / f"emu-{name}.yaml"
    path.write_text(f"# Written by benchmarks/halo_netns.py; rerun it to refresh.\n"
                    + yaml.safe_dump(data, sort_keys=False, width=120))
    load_hardware(str(path))  # must load as a HardwareSpec
    return path


def predict(hw_path: Path, bytes_per_peer: int, world: int):
    """Planner's (flat, halo) seconds for this exchange, or None when the model cannot say."""
    try:
        from piper_plan.cost import comm
        from piper_plan.specs import load_hardware

        hw = load_hardware(str(hw_path))
        if hasattr(comm, "a2a_time"):  # the planner's single entry point, when it exists
            return tuple(float(comm.a2a_time(hw, bytes_per_peer * world, world, 1, algo=a)) for a in ("flat", "halo"))
        return (float(comm.a2a_flat(hw, bytes_per_peer * world, world, 1)),
                float(comm.a2a_halo(hw, bytes_per_peer * world, world, 1)))
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
            r.update(pred_flat_ms=pred and pred[0] * 1e3, pred_halo_ms=pred and pred[1] * 1e3)
            rows.append(r)
        print(f"{name}: {time.perf_counter() - t:.0f} s", file=sys.stderr)
    return rows


def print_table(rows: list[dict]) -> None:
    f = "{:<8} {:>8} {:>9} {:>9} {:>9} {:>12} {:>9} {:>10} {:>10} {:>10}"
    print(f.format("topology", "KiB/peer", "flat ms", "HALO ms", "HALO/flat", "HALO+counts", "simple", "pred flat",
                   "pred HALO", "count xchg"))
    for r in rows:
        pf = "-" if r["pred_flat_ms"] is None else f"{r['pred_flat_ms']:.2f}"
        ph = "-" if r["pred_halo_ms"] is None else f"{r['pred_halo_ms']:.2f}"
        ce = r["calibration"]["count_exchange"]
        print(f.format(r["topology"], r["bytes_per_peer"] // 1024, f"{r['flat_ms']:.2f}", f"{r['halo_ms']:.2f}",
                       f"{r['speedup']:.2f}x", f"{r['flat_ms'] / r['halo_counts_ms']:.2f}x",
                       f"{r['flat_ms'] / r['simple_ms']:.2f}x", pf, ph,
                       f"{ce['halo_counts_ms']:.1f}/{ce['flat_recv_splits_ms']:.1f}"))
    print("HALO: counts known (the dispatcher's one count exchange); HALO+counts and simple (no phase overlap)"
          " as speedups over flat; count xchg: ms of HALO's W^2 count all_to_all / flat's W recv-split all_to_all.")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="out/halo_netns.json", help="results JSON")
    ap.add_argument("--nic-mbit", type=float, default=300, help="shaped NIC (rail) / uplink rate, Mbit/s")
    ap.add_argument("--sizes", type=int, nargs="+", default=SIZES_KIB, help="KiB per peer")
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions for >= 256 KiB (5x below)")
    ap.add_argument("--topologies", nargs="+", default=list(TOPOLOGIES), choices=list(TOPOLOGIES))
    ap.add_argument("--hw-dir", default=str(REPO / "hardware"), help="where emu-*.yaml go ('' = none)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return worker(a)
    if os.geteuid() != 0 or not (shutil.which("ip") and shutil.which("tc")):
        print("halo_netns: needs root and iproute2 (ip, tc) to build network namespaces; skipped.")
        return 0
    atexit.register(_cleanup)
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    netns_topo.teardown()  # leftovers of a crashed run
    try:
        rows = run_benchmark(a.topologies, a.nic_mbit, a.sizes, a.reps, Path(a.hw_dir) if a.hw_dir else None)
    except RuntimeError as e:
        print(f"halo_netns: {e}", file=sys.stderr)
        return 1
    finally:
        _cleanup()
    print_table(rows)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
