"""Emulated multi-node networks out of Linux network namespaces (root only).

Every object lives in namespaces named ``piper-halo-*`` that this module creates; nothing is
added to the host's own namespace, and ``teardown()`` removes them all (veth pairs and bridges
die with their namespace). Addresses are 10.77.0.0/24, inside those namespaces only.

Bandwidth is shaped with tbf on both ends of a veth (one qdisc per direction); this kernel has
no netem, so latency is not emulated. Rates are Mbit/s (10^6 bit/s).

The shaped links are lossless, as HPC fabrics are (InfiniBand and Slingshot use link-level
credit flow control; a switch never drops a packet for want of buffer): every tbf queue holds
the most bytes TCP can ever have in flight through it, so TCP is paced by the token bucket and
never by a drop (see ``lossless_limit``). A drop costs TCP a retransmit timeout of >= 200 ms
(TCP_RTO_MIN), which on a queue sized by time alone (first version: 200 ms of the rate) made
the 256 KiB flat exchange on the quarter-rate spine bimodal (12 flows x 256 KiB = 3 MiB
against a 1.9 MB queue). ``qdisc_stats`` reads the drop counters back, so a run can show it
had none.

- *uplink*: rank namespaces hang off an unshaped node bridge; each node bridge reaches the
  switch bridge through one shaped uplink.
- *rail*: each rank has its own shaped NIC on the bridge of rail = its local index; the rail
  bridges are joined by one shaped spine veth; the ranks of a node are joined pairwise by
  unshaped veths carrying /32 host routes to each other's NIC address (rp_filter off).
"""
from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PREFIX = "piper-halo-"
FABRIC = PREFIX + "fab"
MTU = 9000  # jumbo frames, as HPC fabrics use; also fewer packets for 2 busy cores
BURST_PKTS = 2
BURST_MS = 1.0


@dataclass(frozen=True)
class RankNet:
    rank: int
    netns: str
    ifname: str  # GLOO_SOCKET_IFNAME
    addr: str


def sh(*args: str) -> None:
    r = subprocess.run(list(args), capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{' '.join(args)}: {r.stderr.strip()}")


def nsx(ns: str, *args: str) -> None:
    sh("ip", "netns", "exec", ns, *args)


def existing() -> list[str]:
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [ln.split()[0] for ln in r.stdout.splitlines() if ln.startswith(PREFIX)]


def teardown() -> None:
    """Delete every namespace this module may have made (also leftovers of a crashed run)."""
    for ns in existing():
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _netns(name: str) -> str:
    ns = PREFIX + name
    sh("ip", "netns", "add", ns)
    nsx(ns, "ip", "link", "set", "lo", "up")
    for key in ("all", "default"):
        nsx(ns, "sysctl", "-qw", f"net.ipv4.conf.{key}.rp_filter=0")
    # Idle gaps between timed exchanges must not reset TCP's window (per-namespace sysctl).
    nsx(ns, "sysctl", "-qw", "net.ipv4.tcp_slow_start_after_idle=0")
    return ns


def lossless_limit(flows: int) -> int:
    """Bytes a tbf queue needs so that `flows` TCP flows through it are never dropped: TCP has
    at most a socket send buffer of unacknowledged bytes in flight per flow, and gloo sets
    SO_SNDBUF to the message size, which the kernel caps at net.core.wmem_max and doubles
    (socket(7)). So flows x 2 x wmem_max bounds what can ever sit in the queue."""
    wmem_max = int(open("/proc/sys/net/core/wmem_max").read())
    return flows * 2 * wmem_max


def _shape(ns: str, dev: str, mbit: float, flows: int) -> None:
    """tbf on dev's egress. Burst: BURST_MS of the rate, at least BURST_PKTS jumbo frames. tbf
    keeps at most `burst` tokens, so when its dequeue timer fires late (8 ranks on 2 shared
    cores delay softirqs by a fraction of a millisecond) the tokens of the delay beyond the
    bucket are lost and the link runs below its rate; a bucket of 1 ms of the rate absorbs
    such delays. A much larger one would let the first `burst` bytes after every idle gap out
    at memory speed, which made small exchanges look free (the first version's reason for 2
    frames). Queue: ``lossless_limit(flows)``. PIPER_TBF_BURST_MS / PIPER_TBF_LIMIT_BYTES
    override them for experiments."""
    import os

    burst_ms = float(os.environ.get("PIPER_TBF_BURST_MS", BURST_MS))
    burst = max(BURST_PKTS * (MTU + 64), int(mbit * 1e6 / 8 * burst_ms * 1e-3))
    limit = int(os.environ.get("PIPER_TBF_LIMIT_BYTES", 0)) or lossless_limit(flows)
    nsx(ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{mbit}mbit",
        "burst", str(burst), "limit", str(limit))


def qdisc_stats() -> dict[str, dict[str, int]]:
    """Per shaped device ("<namespace>/<dev>"): packets sent, dropped and overlimit (delayed by
    the bucket) since the topology was built, from `tc -s -j qdisc`."""
    import json

    out = {}
    for ns in existing():
        r = subprocess.run(["ip", "netns", "exec", ns, "tc", "-s", "-j", "qdisc", "show"],
                           capture_output=True, text=True)
        for q in json.loads(r.stdout or "[]"):
            if q.get("kind") == "tbf":
                out[f"{ns[len(PREFIX):]}/{q['dev']}"] = {k: int(q.get(k, 0)) for k in ("packets", "drops", "overlimits")}
    return out


def _up(ns: str, dev: str, master: str | None = None) -> None:
    nsx(ns, "ip", "link", "set", dev, "mtu", str(MTU))
    if master:
        nsx(ns, "ip", "link", "set", dev, "master", master)
    nsx(ns, "ip", "link", "set", dev, "up")


def _bridge(ns: str, name: str) -> None:
    nsx(ns, "ip", "link", "add", name, "type", "bridge")
    _up(ns, name)


def _veth(ns_a: str, a: str, ns_b: str, b: str) -> None:
    sh("ip", "link", "add", a, "netns", ns_a, "type", "veth", "peer", "name", b, "netns", ns_b)


def _rank_ns(k: int, bridge: str, nic_mbit: float | None, flows: int = 0) -> RankNet:
    ns = _netns(f"r{k}")
    addr = f"10.77.0.{10 + k}"
    _veth(ns, "nic", FABRIC, f"r{k}")
    _up(ns, "nic")
    _up(FABRIC, f"r{k}", master=bridge)
    nsx(ns, "ip", "addr", "add", f"{addr}/24", "dev", "nic")
    if nic_mbit:
        _shape(ns, "nic", nic_mbit, flows)           # rank -> fabric
        _shape(FABRIC, f"r{k}", nic_mbit, flows)     # fabric -> rank
    return RankNet(k, ns, "nic", addr)


def build_uplink(nodes: int, per_node: int, uplink_mbit: float) -> list[RankNet]:
    teardown()
    w = nodes * per_node
    flows = per_node * (w - per_node)  # a node's ranks to (or from) every rank off the node
    _netns("fab")
    _bridge(FABRIC, "sw")
    ranks = []
    for n in range(nodes):
        _bridge(FABRIC, f"nb{n}")
        _veth(FABRIC, f"up{n}a", FABRIC, f"up{n}b")
        _up(FABRIC, f"up{n}a", master=f"nb{n}")
        _up(FABRIC, f"up{n}b", master="sw")
        _shape(FABRIC, f"up{n}a", uplink_mbit, flows)  # switch -> node (egress into the node bridge)
        _shape(FABRIC, f"up{n}b", uplink_mbit, flows)  # node -> switch
        ranks += [_rank_ns(n * per_node + l, f"nb{n}", None) for l in range(per_node)]
    return ranks


def build_rail(nodes: int, per_node: int, nic_mbit: float, spine_mbit: float) -> list[RankNet]:
    teardown()
    w = nodes * per_node
    nic_flows = w - per_node  # a rank's flows off its node (intra-node peers use their own link)
    spine_flows = w * (w - per_node)  # an upper bound: every off-node flow of every rank
    _netns("fab")
    for l in range(per_node):
        _bridge(FABRIC, f"rail{l}")
    # The spine: a chain rail0 - rail1 - ... of shaped veths (one link for two rails).
    for l in range(per_node - 1):
        _veth(FABRIC, f"sp{l}a", FABRIC, f"sp{l}b")
        _up(FABRIC, f"sp{l}a", master=f"rail{l}")
        _up(FABRIC, f"sp{l}b", master=f"rail{l + 1}")
        _shape(FABRIC, f"sp{l}a", spine_mbit, spine_flows)
        _shape(FABRIC, f"sp{l}b", spine_mbit, spine_flows)
    ranks = []
    for n in range(nodes):
        mine = [_rank_ns(n * per_node + l, f"rail{l}", nic_mbit, nic_flows) for l in range(per_node)]
        for i, a in enumerate(mine):  # unshaped intra-node links with host routes
            for b in mine[i + 1:]:
                _veth(a.netns, f"in{b.rank}", b.netns, f"in{a.rank}")
                _up(a.netns, f"in{b.rank}")
                _up(b.netns, f"in{a.rank}")
                nsx(a.netns, "ip", "route", "add", f"{b.addr}/32", "dev", f"in{b.rank}", "src", a.addr)
                nsx(b.netns, "ip", "route", "add", f"{a.addr}/32", "dev", f"in{a.rank}", "src", b.addr)
        for r in mine:
            for dev in [f"in{o.rank}" for o in mine if o is not r]:
                nsx(r.netns, "sysctl", "-qw", f"net.ipv4.conf.{dev}.rp_filter=0")
        ranks += mine
    return ranks


# ---------------------------------------------------------------- rank processes in the namespaces
_children: list[subprocess.Popen] = []


def _stop_ranks() -> None:
    for p in _children:
        if p.poll() is None:
            p.kill()
    for p in _children:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    _children.clear()


def cleanup() -> None:
    """Kill every rank process still running, then delete the namespaces (teardown)."""
    _stop_ranks()
    teardown()


def _on_signal(signum, _frame):
    raise SystemExit(128 + signum)  # unwinds through the callers' finally blocks


def guard() -> None:
    """Clean up at exit and on SIGINT / SIGTERM, whatever happens to the driver."""
    atexit.register(cleanup)
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)


def run_ranks(ranks: list[RankNet], args_of: Callable[[RankNet], list[str]], logs: Path, timeout_s: float,
              what: str) -> None:
    """Run `python <args_of(rank)>` inside each rank's namespace (GLOO_SOCKET_IFNAME its NIC, one
    thread), each logging to logs/rank<k>.log, and wait for all; a rank that fails or outlives
    timeout_s raises with its log's tail. No rank process outlives it; the namespaces do (their
    queues' counters are still to read: qdisc_stats), until cleanup()."""
    try:
        for r in ranks:
            env = dict(os.environ, GLOO_SOCKET_IFNAME=r.ifname, OMP_NUM_THREADS="1")
            log = open(logs / f"rank{r.rank}.log", "w")
            _children.append(subprocess.Popen(["ip", "netns", "exec", r.netns, sys.executable, *args_of(r)],
                                              env=env, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout_s
        while any(p.poll() is None for p in _children):
            if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in _children):
                break
            time.sleep(0.5)
        bad = [i for i, p in enumerate(_children) if p.poll() != 0]
        if bad:
            tail = (logs / f"rank{bad[0]}.log").read_text()[-1500:]
            raise RuntimeError(f"{what}: rank {bad[0]} failed or timed out:\n{tail}")
    finally:
        _stop_ranks()


if __name__ == "__main__":  # imported by halo_netns.py and p2p_overlap.py; nothing of its own to run
    print("benchmarks/netns_topo.py: a helper module (the namespaces and shaped links halo_netns.py and "
          "p2p_overlap.py run on), not a benchmark; nothing to run", file=sys.stderr)
    sys.exit(2)
