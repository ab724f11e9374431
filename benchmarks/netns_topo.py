"""Emulated multi-node networks out of Linux network namespaces (root only).

Every object lives in namespaces named ``piper-halo-*`` that this module creates; nothing is
added to the host's own namespace, and ``teardown()`` removes them all (veth pairs and bridges
die with their namespace). Addresses are 10.77.0.0/24, inside those namespaces only.

Bandwidth is shaped with tbf on both ends of a veth (one qdisc per direction); this kernel has
no netem, so latency is not emulated. Rates are Mbit/s (10^6 bit/s).

- *uplink*: rank namespaces hang off an unshaped node bridge; each node bridge reaches the
  switch bridge through one shaped uplink.
- *rail*: each rank has its own shaped NIC on the bridge of rail = its local index; the rail
  bridges are joined by one shaped spine veth; the ranks of a node are joined pairwise by
  unshaped veths carrying /32 host routes to each other's NIC address (rp_filter off).
"""
from __future__ import annotations

import subprocess
from dataclasses import dataclass

PREFIX = "piper-halo-"
FABRIC = PREFIX + "fab"
MTU = 9000  # jumbo frames, as HPC fabrics use; also fewer packets for 2 busy cores
BURST_PKTS = 2
QUEUE_MS = 200.0


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


def _shape(ns: str, dev: str, mbit: float) -> None:
    """tbf on dev's egress. Burst: BURST_PKTS jumbo frames, so bursts are paced almost at once (a
    large bucket sends its whole content at memory speed after every idle gap, which made
    exchanges up to that size look free); tbf segments bigger GSO packets to fit it. Queue:
    QUEUE_MS of the rate (>= 256 KiB), deep enough that TCP is paced by the bucket, not by drops.
    PIPER_TBF_BURST_PKTS / PIPER_TBF_QUEUE_MS override them for experiments."""
    import os

    pkts = int(os.environ.get("PIPER_TBF_BURST_PKTS", BURST_PKTS))
    qms = float(os.environ.get("PIPER_TBF_QUEUE_MS", QUEUE_MS))
    burst = pkts * (MTU + 64)
    limit = max(int(mbit * 1e6 / 8 * qms * 1e-3), 256 * 1024)
    nsx(ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{mbit}mbit",
        "burst", str(burst), "limit", str(limit))


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


def _rank_ns(k: int, bridge: str, nic_mbit: float | None) -> RankNet:
    ns = _netns(f"r{k}")
    addr = f"10.77.0.{10 + k}"
    _veth(ns, "nic", FABRIC, f"r{k}")
    _up(ns, "nic")
    _up(FABRIC, f"r{k}", master=bridge)
    nsx(ns, "ip", "addr", "add", f"{addr}/24", "dev", "nic")
    if nic_mbit:
        _shape(ns, "nic", nic_mbit)           # rank -> fabric
        _shape(FABRIC, f"r{k}", nic_mbit)     # fabric -> rank
    return RankNet(k, ns, "nic", addr)


def build_uplink(nodes: int, per_node: int, uplink_mbit: float) -> list[RankNet]:
    teardown()
    _netns("fab")
    _bridge(FABRIC, "sw")
    ranks = []
    for n in range(nodes):
        _bridge(FABRIC, f"nb{n}")
        _veth(FABRIC, f"up{n}a", FABRIC, f"up{n}b")
        _up(FABRIC, f"up{n}a", master=f"nb{n}")
        _up(FABRIC, f"up{n}b", master="sw")
        _shape(FABRIC, f"up{n}a", uplink_mbit)  # switch -> node (egress into the node bridge)
        _shape(FABRIC, f"up{n}b", uplink_mbit)  # node -> switch
        ranks += [_rank_ns(n * per_node + l, f"nb{n}", None) for l in range(per_node)]
    return ranks


def build_rail(nodes: int, per_node: int, nic_mbit: float, spine_mbit: float) -> list[RankNet]:
    teardown()
    _netns("fab")
    for l in range(per_node):
        _bridge(FABRIC, f"rail{l}")
    # The spine: a chain rail0 - rail1 - ... of shaped veths (one link for two rails).
    for l in range(per_node - 1):
        _veth(FABRIC, f"sp{l}a", FABRIC, f"sp{l}b")
        _up(FABRIC, f"sp{l}a", master=f"rail{l}")
        _up(FABRIC, f"sp{l}b", master=f"rail{l + 1}")
        _shape(FABRIC, f"sp{l}a", spine_mbit)
        _shape(FABRIC, f"sp{l}b", spine_mbit)
    ranks = []
    for n in range(nodes):
        mine = [_rank_ns(n * per_node + l, f"rail{l}", nic_mbit) for l in range(per_node)]
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
