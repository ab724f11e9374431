"""α-β communication costs over the topology, vectorised over layouts.

A group is `n` ranks spaced `stride` apart in the global rank order (tp fastest); the groups of
one kind tile the `world` ranks in blocks of span n·stride from rank 0 (layout.rank_coords), and a
domain of a level holds S consecutive ranks [kS, (k+1)S), S the level's job_block (the GPUs of a
domain a job's ranks fill: its size unless the spec says otherwise, HardwareSpec.job_blocks; an
NVL72 rack that a block scheduler fills 64 at a time holds 64). A block that S does not divide, nor
divides S, is cut by some domain boundary off its ends: a rank whose piece of the block is small
reaches most of its group beyond the domain, and that busiest rank sets the collective's time, so
each level counts the fewest members any rank of the group finds inside its domain (level_counts:
gcd(n·stride, S) / stride once the world is large; min(n, S // stride) where S and the span divide
one another, as on machines of power-of-two levels, or where one domain holds the world: 576 GB200
filled 72 a rack at EP 64 leave 8 members of the group on ranks 64-127 in the first rack; filled 64
a rack, every group sits in one). The group's peers split over levels by those counts, and the
level's bandwidth applies among the ranks one domain holds. A message of B bytes to a peer whose
smallest common level is j costs α_j + B / (β_j · e_comm). Levels inside a node have their own links;
levels above it share the GPU's NIC share (nics · nic_gbps / gpus_per_node), tapered per
level; on a rail-optimised fabric traffic between different NIC indices also crosses a
spine of `cross_rail_taper` × the NIC rate.

Flat all-to-all: every byte goes straight to its destination; links of different levels
run concurrently (time = the slowest), message set-up is paid per peer. Its bytes through the
NICs move at efficiency.a2a_fanout of the NIC rate where a spec measures that the library's
fan-out (a message to every remote peer at once) falls short of `comm` (RCCL on Slingshot).
On a planar fabric (network.planes > 1: each NIC's ports on separate networks) an all-to-all's
NIC bytes, flat or HALO's packs, move over one plane: each peer is one connection, and NCCL's
default single queue pair per connection uses one port ("if you use a single QP (the default),
only one port will be used", NCCL maintainer, NVIDIA/nccl#1015; "Alltoall cannot aggregate the
bandwidth of multiple NICs", NVIDIA/nccl-tests#267); DeepEP's and HybridEP's kernels used only
the first plane of a dual-plane ConnectX-8 on DGX B300 (deepseek-ai/DeepEP #566, PR #650).
Ring collectives spread their channels over the ports and keep the whole NIC rate (NCCL's ring
all-reduce reached 760 GB/s bus bandwidth on 16 B300 nodes of 2 x 400GbE planes, NVIDIA/nccl#2035).
A ring leaves each domain below a NIC level by one edge per channel, and its channels run over
the NICs of all the group's members in that domain, so the level carries one rank's ring traffic
at that many NIC shares (group_span): the 760 GB/s above is ~8 x the 100 GB/s NIC of one GPU,
and a group with one member per node keeps the one share (tensor-parallel-strided groups).
A whole all-reduce is the faster of that ring and NCCL's double binary tree, as NCCL's tuner
picks per call (allreduce): over many nodes a small one pays the tree's log-depth latency. An
all-gather over one rank a node is the faster of the ring and NCCL's PAT (allgather); a
reduce-scatter stays a ring (PAT does not run the averaged sums the priced stacks reduce with).
HALO (brief §3): Phase I intra-node exchange ‖ Phase II one pack per remote node to the
same-index peer (stays on its rail), then Phase III forwards inside the node (a2a_halo).
A `mesh` level (AMD's 8-GPU platforms: one Infinity Fabric link per GPU pair, no switch) gives
a rank's traffic only the links to the peers it reaches there: k of its size-1 peers, k/(size-1)
of the level's bandwidth (_mesh_share): a ring of 2 of 8 MI300X moves over one 64 GB/s link, a
ring or all-to-all of all 8 over all seven (RCCL's all_reduce 319 GB/s busbw of 448).
Times in seconds, bytes in bytes.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..specs.hardware import HardwareSpec
from .routing import dedup_fraction


def level_counts(hw: HardwareSpec, n, stride, world=None) -> np.ndarray:
    """[levels, ...] members of the group inside one domain of each level around its worst-placed
    rank, the one with the fewest (module docstring): min(n, max(1, F // stride)), F the shortest
    run of ranks a domain (its job_block of ranks) holds of one group's block (_smallest_piece).
    `world`: the ranks the groups tile (Layout.gpus; None: the one group, n·stride ranks from rank
    0). The top level holds the whole group."""
    # a few operations on [levels, n]: cheaper than grouping the layouts' (n, stride) pairs first
    n, st = np.asarray(n), np.maximum(np.asarray(stride), 1)
    span = n * st
    world = span if world is None else np.asarray(world)
    sizes = _expand(np.array(hw.job_blocks), np.broadcast(span, world).ndim)
    piece = np.minimum(span, sizes)  # where S and the span divide one another
    # neither divides the other, and a domain boundary falls inside the world
    cut = (span % sizes != 0) & (sizes % np.maximum(span, 1) != 0) & (world > sizes)  # (an empty group: span 0)
    if cut.any():
        piece = np.where(cut, _smallest_piece(span, sizes, world, cut), piece)
    c = np.array(np.minimum(n, np.maximum(1, piece // st)))
    c[-1] = n  # the top level holds the whole group
    return c


def in_scaleup(hw: HardwareSpec, n, stride, world=None) -> np.ndarray:
    """Whether every group of n ranks `stride` apart lies inside one scale-up domain
    (HardwareSpec.scaleup_level: the links a rank reaches without its NICs), the worst-placed
    group included (level_counts)."""
    return level_counts(hw, n, stride, world)[hw.scaleup_level] >= np.asarray(n)


def _smallest_piece(span, sizes, world, cut) -> np.ndarray:
    """Ranks in the shortest run of a group's block (length `span`, blocks from rank 0) that one
    domain of `sizes` holds, where `cut` (else 0): a boundary jS inside the world leaves
    min(jS mod span, span - jS mod span) at the block's ends, a domain inside the block S. The
    offsets jS mod span are the multiples of gcd(span, S), all of them within span/gcd steps,
    so the minimum is the gcd once the world holds that many domains; fewer, and it is found by
    stepping through the boundaries (few distinct (span, S, world) in any batch)."""
    span, sizes, world = np.broadcast_arrays(span, sizes, world)
    out = np.zeros(span.shape, dtype=np.int64)
    uniq, inv = np.unique(np.stack([span[cut], sizes[cut], world[cut]]), axis=1, return_inverse=True)
    piece = np.empty(uniq.shape[1], dtype=np.int64)
    for i, (L, S, W) in enumerate(uniq.T):
        steps = min(-(-W // S) - 1, L // np.gcd(L, S))  # the boundaries inside the world, one period of them
        r = np.arange(1, steps + 1, dtype=np.int64) * S % L
        r = r[r > 0]  # a boundary at a block's edge cuts no block
        piece[i] = min(L, S, np.minimum(r, L - r).min()) if r.size else min(L, S)
    out[cut] = piece[inv.reshape(-1)]
    return out


def _levels(hw: HardwareSpec, a2a: bool = False):
    """(bytes/s, seconds, via a NIC) [levels]: each level's bandwidth at its own measured fraction
    (Level.comm, else efficiency.comm), an all-to-all's (`a2a`) at Level.a2a_comm where measured
    apart: an all-to-all fit had priced Blackwell's NVLink ring collectives 8 % below their
    measured bus bandwidth."""
    eff = [(a2a and lv.a2a_comm) or lv.comm or hw.efficiency.comm for lv in hw.topology]
    bw = np.array([hw.level_bandwidth_gbps(i) * e for i, e in enumerate(eff)]) * 1e9
    lat = np.array([lv.latency_us for lv in hw.topology]) * 1e-6
    nic = np.array([lv.via_nic for lv in hw.topology])
    return bw, lat, nic


def _expand(x, nd):
    return x.reshape((-1,) + (1,) * nd)


def _mesh_share(hw: HardwareSpec, peers) -> np.ndarray:
    """[levels, ...] fraction of each level's bandwidth a rank reaching `peers` [levels, ...]
    others through it can use: on a mesh level its links to those peers, peers/(size-1)
    (capped at 1; 1 where it reaches none, the level then carrying nothing); else 1."""
    peers = np.asarray(peers, dtype=float)
    mesh = _expand(np.array([lv.mesh for lv in hw.topology]), peers.ndim - 1)
    links = _expand(np.array([max(lv.size - 1, 1) for lv in hw.topology], dtype=float), peers.ndim - 1)
    return np.where(mesh & (peers >= 1), np.minimum(peers / links, 1.0), 1.0)


def _bw_time(hw: HardwareSpec, per_level_bytes: np.ndarray, cross_rail_bytes=0.0, peers=None) -> np.ndarray:
    """Bandwidth time of an all-to-all's exchange when each level carries per_level_bytes[j] (from
    one rank) concurrently, to peers[j] peers there (for mesh levels, _mesh_share; None: the whole
    level's links), at each level's all-to-all fraction (_levels)."""
    bw, _, nic = _levels(hw, a2a=True)
    nd = per_level_bytes.ndim - 1
    if any(lv.shared_links for lv in hw.topology):  # a level riding the next one's links adds to its bytes
        per_level_bytes = np.array(per_level_bytes, dtype=float)
        for j, lv in enumerate(hw.topology):
            if lv.shared_links:
                per_level_bytes[j + 1] += per_level_bytes[j]
                per_level_bytes[j] = 0.0
    bwx, nicx = _expand(bw, nd) * (1.0 if peers is None else _mesh_share(hw, peers)), _expand(nic, nd)
    # NIC-carried bytes at level j and above all pass level j's (tapered) NIC bottleneck
    above = np.flip(np.cumsum(np.flip(per_level_bytes * nicx, 0), 0), 0)
    t = np.where(nicx, above, per_level_bytes) / bwx
    out = t.max(axis=0)
    if hw.network.rail_optimized:
        spine = hw.nic_gbps_per_gpu * 1e9 * hw.efficiency.comm * hw.network.cross_rail_taper
        out = np.maximum(out, np.asarray(cross_rail_bytes) / spine)
    return out


def _split(hw, n, stride, world=None):
    c = level_counts(hw, n, stride, world).astype(float)
    prev = np.concatenate([np.ones_like(c[:1]), c[:-1]], 0)
    return c, c - prev  # counts, peers first met at each level


def _cross_rail_share(hw: HardwareSpec, n, stride, world=None) -> np.ndarray:
    """Largest share, over the ranks, of a rank's peers beyond its scale-up domain that sit on
    another rail (NIC index, HardwareSpec.nic_of: nic_affinity or blocks; the rails repeat every
    node, an NVL72 tray too); a group is `n` ranks `stride` apart in blocks from rank 0, tiling
    `world` (None: one group). Counted on the ranks themselves: a strided group's members one a
    node can each sit on another NIC (EP 2 over 6 ranks of 2-GPU nodes, spread: pairs (0, 3),
    (1, 4), (2, 5), every one across the rails), where counting a node's members had put them on
    the rank's own. 0 off a rail-optimised fabric, and where its spine carries the NICs' rate
    (cross_rail_taper 1, no level faster than `comm` of it): cross-rail bytes are NIC bytes then,
    which bind no sooner on the spine than on the NICs (_bw_time), and a search on 16,384 GPUs
    need not count them."""
    n, st = np.broadcast_arrays(np.asarray(n), np.maximum(np.asarray(stride), 1))
    world = n * st if world is None else np.broadcast_to(np.asarray(world), n.shape)
    net, eff = hw.network, hw.efficiency.comm
    spine_full = net.cross_rail_taper >= 1.0 and all((lv.comm or eff) <= eff for lv in hw.topology if lv.via_nic)
    if not net.rail_optimized or spine_full:
        return np.zeros(n.shape)
    nics = tuple(hw.nic_of(i) for i in range(hw.gpus_per_node))
    up = hw.job_blocks[hw.scaleup_level]
    return _by_key(lambda *key: _cross_rail_cached(nics, up, *key), n, st, world)


def _by_key(fn, *cols) -> np.ndarray:
    """fn(*key) for each distinct key of the broadcast `cols` (a search has few), placed where
    the columns hold that key: a scalar fn's value or an array fn's over those places."""
    cols = np.broadcast_arrays(*cols)
    out = np.zeros(cols[0].shape)
    for key in set(zip(*(c.ravel().tolist() for c in cols))):
        on = np.logical_and.reduce([c == v for c, v in zip(cols, key)])
        out = np.where(on, fn(*key), out)
    return out


@lru_cache(maxsize=4096)
def _cross_rail_cached(nics: tuple, up: int, n: int, st: int, world: int) -> float:
    """_cross_rail_share of one group shape: every alignment of a block against the scale-up
    domains repeats within lcm(block, domain) ranks (the first 8,192 of them looked at)."""
    span = n * st
    ranks = np.arange(min(max(world, span), np.lcm(span, up), 8192))
    members = (ranks // span * span + ranks % st)[:, None] + st * np.arange(n)[None, :]  # [ranks, n]
    remote = members // up != (ranks // up)[:, None]
    nic = np.array(nics)
    other = remote & (nic[members % len(nics)] != nic[ranks % len(nics)][:, None])
    far = remote.sum(1)
    share = np.divide(other.sum(1), far, out=np.zeros(len(ranks)), where=far > 0)
    return float(share.max()) if len(share) else 0.0


def _together(nbytes, n, stride):
    """nbytes (float), n and stride broadcast to one shape, so that per-level counts
    ([levels] + that shape) and per-member bytes line up whichever of them is an array."""
    return np.broadcast_arrays(np.asarray(nbytes, dtype=float), np.asarray(n), np.asarray(stride))


def a2a_flat(hw: HardwareSpec, nbytes, n, stride, world=None):
    """Flat all-to-all: each rank sends nbytes in total, nbytes/n to each member (self incl.);
    `world`: the ranks the groups tile (level_counts)."""
    nbytes, n, stride = _together(nbytes, n, stride)
    c, peers = _split(hw, n, stride, world)
    per = nbytes / np.maximum(n, 1)
    B = peers * per
    _, lat, nic = _levels(hw)
    node = hw.scaleup_level  # NVL72-style fabrics span nodes without the NICs
    inter = B[node + 1:].sum(0) if node + 1 < len(hw.topology) else np.zeros_like(per)
    cross = inter * _cross_rail_share(hw, n, stride, world)
    slow = _a2a_nic_slowdown(hw)
    if slow != 1.0:  # network bytes of a fan-out: at a2a_fanout, not comm, of one plane's rate
        B = B * np.where(_expand(nic, B.ndim - 1), slow, 1.0)
        cross = cross * slow
    t = _bw_time(hw, B, cross, peers) + (peers * _expand(lat, peers.ndim - 1)).sum(0)
    return np.where(n > 1, t, 0.0)


def _a2a_nic_slowdown(hw: HardwareSpec) -> float:
    """How much longer an all-to-all's fan-out keeps the NIC than `comm` of its rate implies:
    one plane of network.planes, at efficiency.a2a_fanout where measured (module docstring)."""
    fan = hw.efficiency.a2a_fanout
    return hw.network.planes * (hw.efficiency.comm / fan if fan is not None else 1.0)


def a2a_halo(hw: HardwareSpec, nbytes, n, stride, flat=None, world=None):
    """HALO all-to-all time (see module docstring). `flat`: a2a_flat of the same arguments,
    if the caller has it already (HALO falls back to it when it cannot help); `world` as there.

    T = max(T_I, T_II) + T_III, each phase α-β:
    - T_I: intra-node exchange, (q-1) messages of `per` bytes over the node's links;
    - T_II: one pack of q·per bytes to the same-index peer of each of the N-1 remote nodes
      (its own rail: no cross-rail share), N-1 messages;
    - T_III: the relay forwards the packs' rows to the other q-1 local ranks, ONE message per
      local rank holding its rows of all N-1 packs (runtime/moe/halo.py's coalesced mode):
      q-1 messages and (N-1)·(q-1)·per bytes on the intra links.
    Phase III follows all of Phase II: the N-1 packs share the rank's NIC fairly, so they land
    together at its end (on the emulated rails of benchmarks/halo_netns.py, forwarding each
    pack as it landed ran within ~10 % of forwarding after all of them, and cost more
    messages). Phase III also waits for Phase I, which holds the same intra links."""
    n = np.asarray(n)
    t1, t2_wire, t2_lat, t3, q, nodes = _halo_phases(hw, nbytes, n, stride, world)
    t = np.maximum(t1, t2_wire + t2_lat) + t3
    if flat is None:
        flat = a2a_flat(hw, nbytes, n, stride, world)
    # one node, or one member per node: HALO degenerates to the flat exchange
    return np.where((nodes <= 1) | (q <= 1), flat, np.where(n > 1, t, 0.0))


def a2a_dedup(hw: HardwareSpec, nbytes, n, stride, experts: int, top_k: int, groups: int = 1, limit: int = 1,
              world=None):
    """Token-level all-to-all (DeepEP normal kernels, HybridEP): a token goes once to each rank
    holding one of its experts, not once per expert (dedup_fraction over the n ranks), and across
    nodes once per destination node, forwarded inside it over the scale-up links (the DeepEP
    README's NVLink-to-RDMA forwarding): HALO's phases with Phase II carrying the node-level
    fraction and Phases I and III the rank-level one; inside one scale-up domain, the flat
    exchange of the rank-level bytes. `nbytes` counts top-k copies, as for a2a_flat; `groups`,
    `limit`: group-limited routing (ModelSpec.moe.route_groups / route_group_limit), which
    confines a token to fewer ranks and nodes; `world` as for a2a_flat."""
    n = np.asarray(n)
    q = level_counts(hw, n, stride, world)[hw.scaleup_level].astype(float)
    nodes = np.maximum(n / np.maximum(q, 1.0), 1.0)
    per_rank = np.asarray(nbytes, dtype=float) * dedup_fraction(experts, top_k, n, groups, limit)
    one_domain = (nodes <= 1) | (q <= 1)
    t1, _, _, t3, _, _ = _halo_phases(hw, per_rank, n, stride, world)
    _, t2_wire, t2_lat, _, _, _ = _halo_phases(hw, nbytes, n, stride, world)
    t = np.maximum(t1, t2_wire * dedup_fraction(experts, top_k, nodes, groups, limit) + t2_lat) + t3
    return np.where(one_domain, a2a_flat(hw, per_rank, n, stride, world), np.where(n > 1, t, 0.0))


def _halo_phases(hw: HardwareSpec, nbytes, n, stride, world=None):
    """HALO's phases (a2a_halo): (T_I, Phase II's bandwidth time, its set-ups, T_III,
    members per node q, nodes)."""
    nbytes, n, stride = _together(nbytes, n, stride)
    q, _, intra, inter_peers, latx = _node_split(hw, n, stride, world)
    # q: the busiest rank's members in its node; where boundaries split a group unevenly, its
    # n/q - 1 packs of q·per still carry the (n - q)·per bytes it sends beyond the node
    nodes = np.maximum(n / np.maximum(q, 1), 1.0)
    per = nbytes / np.maximum(n, 1)
    lat_intra = (intra * latx).sum(0)  # q-1 messages inside the node
    t1 = _bw_time(hw, intra * per, peers=intra) + lat_intra
    # Phase II: per remote node one pack of q·per bytes (inter_peers/q packs per level); each
    # pack is one connection, so one plane of a planar NIC carries it
    t2_wire = _bw_time(hw, inter_peers * per) * hw.network.planes
    t2_lat = (inter_peers / np.maximum(q, 1) * latx).sum(0)
    # Phase III: one message per other local member, its `per` bytes of each of nodes-1 packs
    t3 = _bw_time(hw, intra * per, peers=intra) * (nodes - 1) + lat_intra
    return t1, t2_wire, t2_lat, t3, q, nodes


def _node_split(hw: HardwareSpec, n, stride, world=None):
    """A group of n ranks `stride` apart, split at the scale-up domain (node): (members per
    node q, peers first met at each level, those inside the node, those outside it, each
    level's latency broadcast to their shape)."""
    c, peers = _split(hw, n, stride, world)
    _, lat, _ = _levels(hw)
    node = hw.scaleup_level
    intra, inter = peers.copy(), peers.copy()
    intra[node + 1:] = 0.0
    inter[: node + 1] = 0.0
    return c[node], peers, intra, inter, _expand(lat, peers.ndim - 1)


def _dependent(n, q, halo) -> np.ndarray:
    """HALO that is truly hierarchical (several scale-up domains, several members in each):
    its Phase III waits on Phase II."""
    return np.asarray(halo, dtype=bool) & (np.asarray(n) > q) & (q > 1)


def a2a_rounds(hw: HardwareSpec, n, stride, halo, world=None) -> np.ndarray:
    """Dependent communication rounds of one all-to-all: 1 flat; 2 for truly hierarchical
    HALO (Phase III waits on Phase II)."""
    return np.where(_dependent(n, level_counts(hw, n, stride, world)[hw.scaleup_level], halo), 2.0, 1.0)


def _alphas(hw: HardwareSpec, n, stride, world=None):
    """Message set-up times (s) of one all-to-all: (flat: one message per peer at its level's
    latency; HALO's first round: the larger of Phase I's q-1 intra-node and Phase II's packs;
    and q, the members per node)."""
    q, peers, intra, inter, latx = _node_split(hw, n, stride, world)
    first = np.maximum((intra * latx).sum(0), (inter / np.maximum(q, 1) * latx).sum(0))
    return (peers * latx).sum(0), first, q


def a2a_call(hw: HardwareSpec, nbytes, n, stride, halo, wire=None, world=None):
    """Wall time of one all-to-all call on ranks that pay a per-call floor
    (efficiency.collective_overhead_us, co: what a small call costs beyond its α-β time):

        flat:                   max(co + α_flat, wire − α_flat)
        HALO, truly hierarchical (a2a_rounds = 2):  co + α_flat + wire − α_1 − hide

    where wire = a2a_flat / a2a_halo (pass it as `wire` if the caller has it), α_flat the flat
    exchange's message set-ups (co + α_flat is a whole small flat call, as measured) and α_1
    HALO's first-round set-ups (the larger of Phase I's and Phase II's, see _alphas), which the
    floor already holds; Phase III's set-up stays in `wire`; hide = min(co, T_II·(1 − 1/share)):
    a NIC shared by `share` ranks moves the early ranks' packs while the last one waits.

    Physics: the floor is time a call waits for its peers to be scheduled (ranks sharing
    cores). In a flat all_to_all_single every rank posts to all peers at once, and bytes
    between the pairs already running move meanwhile (the kernel's socket buffers take them
    whether or not the receiving process runs), so the call costs the larger of floor and
    transfer. HALO's phases are rendezvous P2P between fixed pairs: a pack leaves once its one
    relay is running and has posted, and Phase III once every pack has landed, so the waits
    and the transfers follow one another and add. Measured on the emulated networks of
    benchmarks/halo_netns.py (4 nodes x 2 ranks on 2 shared cores, floor 5.4-6.8 ms): the
    overlapped form under-predicted HALO at 64 KiB per peer by 28-31 % in both runs on the
    rails (Phase II's wire, ~14 ms there, plus the floor was measured), the sum by <= 10 % in
    one run and <= 13 % in the other except one cell whose measurement swung 30 % between runs;
    for flat the sum over-predicted 4-64 KiB by up to 87-147 %. With co = 0 (the bundled GPU
    specs) both are the wire time exactly."""
    co = hw.efficiency.collective_overhead_us * 1e-6
    if wire is None:
        wire = np.where(np.asarray(halo, dtype=bool), a2a_halo(hw, nbytes, n, stride, world=world),
                        a2a_flat(hw, nbytes, n, stride, world))
    wire = np.asarray(wire, dtype=float)
    if co == 0:
        return wire
    a_flat, a_first, q = _alphas(hw, n, stride, world)
    dependent = _dependent(n, q, halo)
    floor = co + a_flat
    # a NIC that `share` ranks of a node send through carries the packs of the ranks that start
    # Phase II early while the last one still waits (the floor's co): after the floor, what
    # remains is the NIC's Phase II time less up to co, but never less than the last rank's
    # own share (rails, one NIC per rank: nothing to hide). Measured on the emulated uplink
    # (benchmarks/halo_netns.py, 2 ranks a NIC): HALO at 16 KiB per peer ran floor + 4.0 ms
    # where the NIC's Phase II alone takes 5.1 ms
    share = max(1.0, hw.gpus_per_node / max(hw.network.nics_per_node, 1))
    hide = 0.0
    if share > 1:
        t2_wire = _halo_phases(hw, nbytes, n, stride, world)[1]
        hide = np.where(dependent, np.minimum(co, t2_wire * (1.0 - 1.0 / share)), 0.0)
    t = np.where(dependent, floor + wire - a_first - hide, np.maximum(floor, wire - a_flat))
    return np.where(np.asarray(n) > 1, t, wire)


def skew(hw: HardwareSpec, compute_s):
    """Seconds the last rank arrives late at a collective after `compute_s` seconds of work
    since the previous one, beyond what efficiency.collective_overhead_us already holds
    (efficiency.collective_skew_us: independent progress jitter grows like √W)."""
    eff = hw.efficiency
    if not eff.collective_skew_us:
        return np.zeros_like(np.asarray(compute_s, dtype=float))
    root_ms = np.sqrt(np.maximum(np.asarray(compute_s, dtype=float), 0.0) * 1e3)
    return eff.collective_skew_us * 1e-6 * np.maximum(root_ms - np.sqrt(eff.collective_skew_base_ms), 0.0)


def group_span(hw: HardwareSpec, n, stride, world=None):
    """(bandwidth B/s, latency s) a ring over a group of n ranks `stride` apart moves at: the
    slowest of the levels it spans, a NIC level counted at its per-GPU share times the group's
    members inside the domain it joins (the ring's channels leave that domain through all their
    NICs, module docstring; capped by the levels below), and the mean latency of its steps,
    each at the level it crosses (_hop_latency; `world`: as for level_counts). Pass it to
    ring_allreduce as `span` when several collectives share one group."""
    n = np.asarray(n)
    c = level_counts(hw, n, stride, world)
    bw, lat, nic = _levels(hw)
    top = np.minimum((c < n).sum(0), len(hw.topology) - 1)  # first level holding the whole group
    nd = c.ndim - 1
    below = np.concatenate([np.ones_like(c[:1]), c[:-1]], 0)  # members inside the domain a level joins
    # a NIC level at its members' NIC shares; a mesh level over its links to the other c-1 members
    eff = _expand(bw, nd) * np.where(_expand(nic, nd), below, 1) * _mesh_share(hw, c - 1)
    spanned = _expand(np.arange(len(hw.topology)), nd) <= top
    return np.where(spanned, eff, np.inf).min(axis=0), _hop_latency(lat, c, n)


def _hop_latency(lat, c, n) -> np.ndarray:
    """Seconds a ring step waits on average along a chain of n ranks (a ring less one edge: the
    n-1 steps a chunk passes on one pass) with c [levels, ...] of them in one domain of each
    level: the chain leaves a domain of level j-1 once between each two of the n/c[j-1] it
    covers, and that step runs at level j or above; the others stay below it. Each level's
    latency is so paid on its own steps only, as NCCL's ring model charges an all-reduce's
    2(nNodes-1) inter-node steps at the network's latency and its other 2(n-nNodes) at
    NVLink's (NVIDIA/nccl src/graph/tuning.cc, ncclTopoTuneModel). 0 for one rank."""
    nd = c.ndim - 1
    n = np.asarray(n, dtype=float)
    domains = n / np.maximum(c, 1)  # domains of each level the group covers
    below = np.concatenate([np.broadcast_to(n, domains[:1].shape), domains[:-1]], 0)
    reach = np.maximum(below - 1.0, 0.0)  # steps that leave a domain of the level below: here or above
    steps = np.clip(reach - np.concatenate([reach[1:], np.zeros_like(reach[:1])], 0), 0.0, None)
    return (steps * _expand(lat, nd)).sum(0) / np.maximum(n - 1.0, 1.0)


def ring_allreduce(hw: HardwareSpec, nbytes, n, stride, fraction=1.0, span=None, world=None):
    """Ring all-reduce of nbytes over n ranks: 2(n-1)/n·B over the slowest level spanned,
    2(n-1) latency steps, each at the level it crosses (group_span), plus
    efficiency.collective_step_us (0 unless measured on shared cores). fraction=0.5 gives a
    reduce-scatter or an all-gather, which NCCL runs as a ring; a whole all-reduce, which it may
    run as a tree, is `allreduce`."""
    nbytes = np.asarray(nbytes, dtype=float)
    n = np.asarray(n)
    bw, lat = span if span is not None else group_span(hw, n, stride, world)
    lat = lat + hw.efficiency.collective_step_us * 1e-6  # each step waits for its sender (shared cores)
    t = fraction * (2.0 * (n - 1) / np.maximum(n, 1) * nbytes / bw + 2.0 * (n - 1) * lat)
    return np.where((n > 1) & (nbytes > 0), t, 0.0)  # nothing to reduce issues no collective


# NCCL's tree all-reduce (NVIDIA/nccl src/graph/tuning.cc, ncclTopoTuneModel / ncclTopoGetAlgoTime):
# its bus bandwidth 0.92 of the ring's, halved into algorithm bandwidth (each byte goes up the tree
# and back down: ratio .5 where the ring's is n/(2(n-1))), and cut again by the Simple protocol's
# treeCorrectionFactor, indexed by log2i(bytes / 64): 0.5-0.9 below 512 MiB, 1 from there. RCCL
# (the AMD specs) keeps per-architecture tables of its own; these are NVIDIA's, used for both
TREE_BW = 0.92 * 0.5
TREE_CORRECTION = np.array([.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9])
_TREE_FACTOR = np.append(TREE_CORRECTION, 1.0)  # indexed by log2i(bytes / 64) capped at 23: 1 from 512 MiB


def _node_tree(hw: HardwareSpec, n, stride):
    """A group of n ranks `stride` apart, as NCCL's tuner sees it: (hops [levels, ...] a chain
    through the group's fullest node takes at each level below the first NIC level, and a binary
    tree over each NIC level's domains, floor(log2) of the domains of the level below it holds;
    the fullest node's members; each level's latency plus efficiency.collective_step_us). A
    domain of S ranks holds at most min(n, ceil(S / stride)) members: where a domain boundary
    cuts the groups, the fullest node is the one every group waits on."""
    n, st = np.asarray(n, dtype=float), np.maximum(np.asarray(stride, dtype=float), 1.0)
    nd = np.broadcast(n, st).ndim
    _, lat, nic = _levels(hw)
    sizes = _expand(np.array(hw.job_blocks, dtype=float), nd)
    full = np.minimum(n, np.ceil(sizes / st))  # [levels, ...] the most members one domain holds
    full[-1] = n  # the top level holds the whole group
    first_nic = int(np.argmax(nic)) if nic.any() else len(nic)
    below = np.concatenate([np.ones_like(full[:1]), full[:-1]], 0)
    node = full[first_nic - 1] if first_nic > 0 else np.ones_like(full[0])  # the fullest node's members
    # along the node's chain, a level's hops are the domains of the level below it passes, less its own
    chain = np.ceil(node / below) - np.ceil(node / full)
    tree = np.floor(np.log2(np.maximum(np.ceil(full / below), 1.0)))
    on_node = _expand(np.arange(len(nic)) < first_nic, nd)
    hops = np.where(on_node, chain, tree)
    return hops, on_node, node, _expand(lat, nd) + hw.efficiency.collective_step_us * 1e-6


def tree_latency(hw: HardwareSpec, n, stride) -> np.ndarray:
    """Seconds of latency NCCL's double binary tree all-reduce pays over n ranks `stride` apart:
    twice (reduce up, broadcast down) a chain through the group's members in its fullest node
    (the levels below the first NIC level, each hop at the level it crosses) and a binary tree
    over the nodes (_node_tree). NCCL's own model is 2((nRanks/nNodes - 1) intraLat +
    log2i(nNodes) interLat), whose Simple-protocol hop latencies match its ring's (network 14 /
    14 us, NVLink 4.0 / 3.4 us: tuning.cc hwLat), so a hop here waits what a ring step waits
    (Level.latency_us). 0 for one rank."""
    hops, _, _, lat = _node_tree(hw, n, stride)
    return 2.0 * (hops * lat).sum(0)


# NCCL's PAT (2.23+; NVIDIA/nccl src/graph/tuning.cc, ncclTopoTuneModel): all-gathers and
# reduce-scatters over groups of one rank a node (ncclPatEnable: nNodes == nRanks), Simple protocol,
# bus bandwidth 0.75 of the ring's with no algorithm-bandwidth ratio (each byte crosses once, where
# the ring's (n-1)/n is priced), latency log2i(nNodes) x interLat / 3.5 + 2.8 us x nRanks beside a
# base of 8 us (the ring's 8.4, left out of both here). interLat at one rank a node is the tree's
# network hop, 14 us (Simple), which NCCL's ring also steps at there; its 2.8 us a rank is 0.2 of
# that hop. The ring here steps at the spec's level latencies (Level.latency_us: 5-7 us on the H100
# specs), so PAT's terms are taken on the same scale, a hop at its level's latency and a rank at 0.2
# of the group's mean ring step, and the faster of the two is NCCL's pick on that scale (with 14 us
# hops, exactly its tuner's). NCCL needs compute capability 6.0 for PAT; RCCL ships it off
# (PAT_ENABLE 0 in ROCm/rccl's tuning.cc), so the AMD specs, which state no compute capability,
# keep the ring
PAT_BW = 0.75
PAT_HOP_SHARE = 1.0 / 3.5
PAT_RANK_SHARE = 2.8 / 14.0


def pat_runs(hw: HardwareSpec, n, stride) -> np.ndarray:
    """Where NCCL may run PAT over n ranks `stride` apart: two ranks or more, each in a node of
    its own (_node_tree's fullest node holds one), on a spec whose library runs it (_runs_pat)."""
    return _pat_where(hw, n, _node_tree(hw, n, stride)[2])


def _pat_where(hw: HardwareSpec, n, node) -> np.ndarray:
    """pat_runs from the group's fullest node's members (_node_tree), where they are at hand."""
    return (node <= 1) & (np.asarray(n) > 1) & _runs_pat(hw)


def pat_latency(hw: HardwareSpec, n, stride, span=None, world=None) -> np.ndarray:
    """Seconds of latency NCCL's PAT all-gather pays over n ranks `stride` apart: the binary tree
    over the nodes (_node_tree: floor(log2) of each NIC level's domains, at that level's latency)
    at 1/3.5 of a hop each, plus 0.2 of the group's mean ring step (group_span; `span` where
    found) a rank; inf where it does not run (pat_runs)."""
    hops, on_node, node, lat = _node_tree(hw, n, stride)
    step = (span if span is not None else group_span(hw, n, stride, world))[1]
    t = PAT_HOP_SHARE * np.where(on_node, 0.0, hops * lat).sum(0) + PAT_RANK_SHARE * step * np.asarray(n, float)
    return np.where(_pat_where(hw, n, node), t, np.inf)


def _runs_pat(hw: HardwareSpec) -> bool:
    """NCCL on an NVIDIA GPU of compute capability 6.0 or more (ncclPatEnable); not gloo, and not
    RCCL (the specs without a compute capability), which ships PAT disabled."""
    cc = hw.accelerator.compute_capability
    return hw.collectives == "nccl" and cc is not None and cc >= 6.0


def allgather(hw: HardwareSpec, nbytes, n, stride, span=None, world=None):
    """An all-gather of an nbytes buffer over n ranks as NCCL runs it: the faster of the ring
    (ring_allreduce at fraction 0.5) and, over groups of one rank a node, PAT (pat_latency +
    nbytes / (PAT_BW x the ring's bus rate)): over thousands of nodes a small gather, such as a
    ZeRO-3 unit's, pays PAT's 0.2 of a ring step a rank in place of the ring's n-1 network steps;
    a large one keeps the ring's bandwidth. Reduce-scatters stay rings: NCCL runs PAT for a plain sum only,
    not for the PreMulSum and SumPostDiv that an average in the collective maps to (tuning.cc),
    which torch FSDP2 asks for with bf16 and fp32 gradients (ReduceOp.AVG,
    _get_gradient_divide_factors) and Megatron-Core with average_in_collective, a recipe setting
    no layout holds. Seconds."""
    nbytes = np.asarray(nbytes, dtype=float)
    span = span if span is not None else group_span(hw, n, stride, world)
    ring = ring_allreduce(hw, nbytes, n, stride, 0.5, span=span, world=world)
    if not _runs_pat(hw):
        return ring
    pat = pat_latency(hw, n, stride, span=span) + nbytes / (PAT_BW * span[0])
    return np.where((np.asarray(n) > 1) & (nbytes > 0), np.minimum(ring, pat), 0.0)


def allreduce(hw: HardwareSpec, nbytes, n, stride, span=None, world=None):
    """An all-reduce of nbytes over n ranks as the library runs it: NCCL times a ring and a tree
    for each call and takes the faster (tuning.cc), so over many nodes a small all-reduce pays the
    tree's log-depth latency instead of the ring's 2(n-1) steps, and a large one the ring's
    bandwidth. The tree moves nbytes / (TREE_BW x the ring's bus rate x TREE_CORRECTION); gloo
    (HardwareSpec.collectives) runs the ring. NCCL's 1.4x "plateau" on a large multi-node ring's
    latency is not priced. Seconds."""
    nbytes = np.asarray(nbytes, dtype=float)
    span = span if span is not None else group_span(hw, n, stride, world)
    ring = ring_allreduce(hw, nbytes, n, stride, span=span, world=world)
    if hw.collectives != "nccl":
        return ring
    # NCCL's log2i(bytes >> 6); bytes that are not finite read the last entry (the ring prices them so too)
    step = np.floor(np.log2(np.maximum(np.nan_to_num(nbytes, nan=np.inf), 64.0) / 64.0))
    corr = _TREE_FACTOR[np.minimum(step, len(TREE_CORRECTION)).astype(int)]
    tree = tree_latency(hw, n, stride) + nbytes / (TREE_BW * span[0] * corr)
    return np.where((np.asarray(n) > 1) & (nbytes > 0), np.minimum(ring, tree), 0.0)


def call_latency(hw: HardwareSpec, n, stride, span=None, world=None):
    """Seconds of latency one all-gather or reduce-scatter over n ranks pays beside its bytes:
    its n-1 steps (ring_allreduce at fraction 0.5, with no bytes), also a rooted chain's n-1;
    0 for one rank. What a collective split into k calls pays k times."""
    n = np.asarray(n)
    _, lat = span if span is not None else group_span(hw, n, stride, world)
    return np.where(n > 1, (n - 1) * (lat + hw.efficiency.collective_step_us * 1e-6), 0.0)


def rooted(hw: HardwareSpec, nbytes, n, stride, reduce=False, span=None, world=None):
    """A broadcast from, or (reduce=True) a reduce to, one root of nbytes over n ranks: the root's
    whole buffer leaves (or enters) it, so B over the slowest level spanned rather than an
    all-gather's (n-1)/n·B (nccl-tests doc/PERFORMANCE.md: bus bandwidth = algorithm bandwidth for
    Broadcast and Reduce, (n-1)/n of it for AllGather and ReduceScatter), and n-1 latency steps
    along the chain. gloo's reduce (HardwareSpec.collectives; gloo/reduce.cc) is a ring
    reduce-scatter and then a gather of the reduced chunks into the root: 2(n-1)/n·B, an
    all-reduce's bytes, in n steps. Zero with one rank or nothing to move."""
    nbytes = np.asarray(nbytes, dtype=float)
    n = np.asarray(n)
    bw, lat = span if span is not None else group_span(hw, n, stride, world)
    lat = lat + hw.efficiency.collective_step_us * 1e-6
    if reduce and hw.collectives == "gloo":
        t = 2.0 * (n - 1) / np.maximum(n, 1) * nbytes / bw + n * lat
    else:
        t = nbytes / bw + (n - 1) * lat
    return np.where((n > 1) & (nbytes > 0), t, 0.0)


def p2p(hw: HardwareSpec, nbytes, stride, world=None, rounds=1):
    """Seconds of one stage-boundary message, averaged over the pipeline's messages a micro-batch
    makes: stage k's ranks [k·s, (k+1)·s) send to the next stage's, s = `stride` (the ranks of one
    stage), so boundary k is priced at the first level whose domains (its job_block of ranks)
    hold both stages whole, each `rounds` times (vpp for a looped interleaved schedule, 1 for a V,
    whose two arms cross the same boundaries), and the rounds - 1 wraps (the last stage's chunk
    back to the first's) at the level holding the whole `world`. Pods of 3,072
    H100 at s 1,024 (Meta's Llama 3 405B) put one boundary in three on the cluster's tapered
    network, which the smallest level holding two stages had missed. Without `world`: the first
    level whose domain holds two stages, one pair's message."""
    st = np.maximum(np.asarray(stride), 1)
    bw, lat = _one_peer(hw)
    nbytes = np.asarray(nbytes, dtype=float)
    if world is None:
        sizes = _expand(np.array(hw.job_blocks), st.ndim)
        top = np.minimum((sizes // st < 2).sum(0), len(hw.topology) - 1)
        return lat[top] + nbytes / bw[top]
    blocks = tuple(hw.job_blocks)
    share_lat = _by_key(lambda *key: _hop_levels(blocks, *key) @ lat, st, world, rounds)
    share_time = _by_key(lambda *key: (_hop_levels(blocks, *key) / bw).sum(), st, world, rounds)
    return share_lat + share_time * nbytes


def _one_peer(hw: HardwareSpec):
    """(bytes/s, seconds) [levels] of a message to one peer: on a mesh level one link of it."""
    bw, lat, _ = _levels(hw)
    return bw * _mesh_share(hw, np.ones(len(hw.topology))), lat


@lru_cache(maxsize=4096)
def _hop_levels(blocks: tuple, stride: int, world: int, rounds: int) -> np.ndarray:
    """Share of a micro-batch's stage-boundary messages at each level (p2p): pp - 1 boundaries
    `rounds` times, rounds - 1 wraps at the level holding the world; the top level holds
    everything."""
    S = np.array(blocks)[:, None]
    pp = max(world // stride, 2)
    k = np.arange(pp - 1)
    whole = (k * stride) // S == ((k + 2) * stride - 1) // S  # [levels, boundaries]: both stages in one domain
    whole[-1] = True
    share = rounds * np.bincount(whole.argmax(0), minlength=len(blocks)).astype(float)
    share[_world_level(blocks, world)] += rounds - 1
    return share / share.sum()


def _world_level(blocks, world) -> np.ndarray:
    """The first level whose domain (its job_block of ranks) holds ranks 0..world-1, else the top."""
    S, w = np.array(blocks)[:, None], np.atleast_1d(np.asarray(world))[None, :]
    holds = S >= w
    return np.where(holds.any(0), holds.argmax(0), len(blocks) - 1).reshape(np.shape(world))


def ends_span(hw: HardwareSpec, world):
    """(bytes/s, seconds) between a first-stage rank and its twin on the last stage, a world
    apart less one stage (a tied embedding's two copies): one peer over the level holding the
    world; the pair does not tile the ranks in blocks from rank 0 as group_span's groups do (8
    GPUs at pp 8 keep the pair (0, 7) in one node)."""
    bw, lat = _one_peer(hw)
    j = _world_level(tuple(hw.job_blocks), world)
    return bw[j], lat[j]
