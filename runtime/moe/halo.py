"""HALO: a hierarchical, NIC-affine all-to-all with the exact semantics of
``dist.all_to_all_single(out, x, output_split_sizes=recv_splits, input_split_sizes=send_splits)``
on row tensors (dim 0 is split; any trailing shape).

Data flow (brief §3; the code is our reconstruction):

- Phase I: rows bound for ranks of my own node go straight to them (intra-node link).
- Phase II (concurrent with I): for each remote node, one pack of every row bound for any rank
  of that node, sent to its *peer* there: the rank on my rail / NIC (my GPU index on my node,
  from the plan's rank map), or where that node has no rank of the group on it, the rank at my
  local index among the group's ranks (modulo the node's count when it has fewer).
- Phase III: the peer forwards the packs' rows to their final local rank. By default
  (``mode="coalesced"``) it sends ONE message per local rank, holding that rank's rows of
  every pack (sources ascending), once all its packs have landed: (q-1) messages per relay
  instead of (N-1)(q-1). On gloo each message is a P2P op whose posting, rendezvous
  notifications (gloo/transport/tcp/pair.cc: a send waits for the receiver's recv-ready note)
  and completion cost CPU on every rank, and where ranks share cores that CPU is the fixed
  cost of a small exchange (8 ranks on 2 cores, 4 KiB per peer: ~1 ms of CPU per rank per flat
  call, ~2 per per-pack HALO call, wall ~ ranks x CPU / cores). ``mode="per_pack"`` forwards
  each pack as soon as it lands instead (Phase III
  of an early pack overlaps Phase II of later ones; the packs share the NIC, so they land
  together and there is little to overlap); ``mode="simple"`` is the first version (counts
  first, all of Phase II, then per-pack Phase III), kept as a benchmark baseline.

All messages are batched asynchronous P2P (``dist.batch_isend_irecv``); zero-row messages are
never posted (both ends know the counts, so they skip the same ones). Receives land directly in
their slice of the output where it is one slice; the copies are the packing gather when a
node's ranks are not consecutive in the group, the relay's own rows of each pack, and in the
coalesced mode the relay's concatenation of each local rank's rows and, when that rank's
sources via one relay are not adjacent in its output, the scatter of the received message.

Counts: the relay must know how each incoming pack splits over its node's ranks, i.e. the
per-(source, destination) row counts. ``exchange_counts`` gets the whole W x W matrix with one
small ``all_to_all_single`` of int64 (W messages of W x 8 bytes per rank). Measured on the
emulated 4 x 2 networks of benchmarks/halo_netns.py it costs the same as the flat path's own
recv-split exchange (W int64 per peer): 6-9 ms each on that oversubscribed 2-core machine, both
latency-bound. Without ``counts`` the call runs that exchange itself, concurrently with
Phase I; the Phase II packs are posted once it is done (their receivers need the sizes, and a
send posted before its receive measured ~1.5x slower at 1 MiB/peer on gloo). A dispatcher that
calls ``exchange_counts`` in place of its own count exchange gets ``recv_splits`` from it
(``counts.recv(rank)``) and passes ``counts`` to the dispatch and ``counts.transposed()`` to the
combine, so counts cross the network once per layer; backward reuses the transposed matrix and
exchanges nothing. If a rank's ``recv_splits`` disagree with the senders' counts it raises
ValueError; its peers then fail at the group's collective timeout.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.distributed as dist

# P2P tags (gloo matches messages by (peer, tag)); far from 0, which other users default to.
_TAG_I = 7_100_001
_TAG_II = 7_100_002
_TAG_III = 7_200_000  # + source rank: one relayed message per (source, relay -> destination)


@dataclass(frozen=True)
class Counts:
    """Row counts of one exchange: ``matrix[s][d]`` rows go from group rank s to d."""

    matrix: tuple[tuple[int, ...], ...]

    @property
    def size(self) -> int:
        return len(self.matrix)

    def send(self, r: int) -> list[int]:
        return list(self.matrix[r])

    def recv(self, r: int) -> list[int]:
        return [row[r] for row in self.matrix]

    def transposed(self) -> "Counts":
        return Counts(tuple(zip(*self.matrix)))


class _Nodes:
    """Group ranks grouped by node, and the deterministic rail peer of every (rank, node).

    ``rail_of[i]``: the i-th group rank's GPU (and so NIC rail) index on its node, the plan's
    rank map ``local``; without it, a rank's index among the group's ranks of its node. A group
    whose members sit at other GPU indices on different nodes (a stage straddling two nodes)
    otherwise relays across rails, which a rail-optimised fabric sends over its spine."""

    def __init__(self, node_of: Sequence[int], rail_of: Optional[Sequence[int]] = None):
        self.node_of = list(node_of)
        order: dict[int, list[int]] = {}
        for r, n in enumerate(self.node_of):
            order.setdefault(n, []).append(r)
        self.members = order  # node id -> its group ranks, ascending
        self.local = {r: i for ranks in order.values() for i, r in enumerate(ranks)}
        self.rail = list(rail_of) if rail_of is not None else [self.local[r] for r in range(len(self.node_of))]
        if len(self.rail) != len(self.node_of):
            raise ValueError(f"rail_of has {len(self.rail)} entries; node_of has {len(self.node_of)}")
        self.on_rail: dict[tuple[int, int], int] = {}
        for r, n in enumerate(self.node_of):
            self.on_rail.setdefault((n, self.rail[r]), r)
        # A node's ranks are one consecutive block of the group: its pack is a slice, no gather.
        self.block = {n: ranks == list(range(ranks[0], ranks[0] + len(ranks))) for n, ranks in order.items()}

    def peer(self, r: int, node: int) -> int:
        """The rank of ``node`` that receives r's pack: the one on r's rail, else (no group rank
        of that node on it) the one at r's local index, wrapped when the node has fewer."""
        hit = self.on_rail.get((node, self.rail[r]))
        if hit is not None:
            return hit
        ranks = self.members[node]
        return ranks[self.local[r] % len(ranks)]


class HaloExchange:
    """Hierarchical all-to-all over ``group`` (None: the default group).

    ``node_of[i]`` is the node of the i-th rank of the group, ``rail_of[i]`` its GPU index there
    (from a plan's rank map; _Nodes). Calling
    it is a drop-in for the flat exchange: ``out = halo(x, send_splits, recv_splits)``;
    autograd-aware (backward is the reverse exchange). Pass ``counts`` from
    ``exchange_counts`` to skip the internal count exchange. ``mode``: "coalesced" (default),
    "per_pack" or "simple" (see the module docstring); all give the same result."""

    MODES = ("coalesced", "per_pack", "simple")

    def __init__(self, group: Optional[dist.ProcessGroup], node_of: Sequence[int], mode: str = "coalesced",
                 in_order: Optional[bool] = None, rail_of: Optional[Sequence[int]] = None):
        """``in_order`` (default: the group's backend is NCCL) posts every message in the batch
        of its own phase at both ends: NCCL runs a rank's batched P2P calls one after another and
        completes each only when all its operations do, so a Phase III receive posted with Phase
        I (what gloo, matching message by message, is fastest with) would wait on a relay's later
        batch while the relay waits on this rank's: a cycle."""
        if mode not in self.MODES:
            raise ValueError(f"HALO mode {mode!r}: expected one of {', '.join(self.MODES)}")
        nccl = dist.get_backend(group) == "nccl"
        self.in_order = nccl if in_order is None else in_order
        if self.in_order and mode == "per_pack":
            raise ValueError("HALO mode 'per_pack' forwards each pack in a batch of its own, which NCCL's in-order "
                             "batches cannot match with the receives posted before them: use 'coalesced' or 'simple'")
        # the count exchange's tensors live where the backend moves them
        self.count_device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        self.group = group
        self.mode = mode
        self.overlap = mode != "simple"
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if len(node_of) != self.world:
            raise ValueError(f"node_of has {len(node_of)} entries; the group has {self.world} ranks")
        self.nodes = _Nodes(node_of, rail_of)
        self.my_node = self.nodes.node_of[self.rank]

    # ---- counts ------------------------------------------------------------------------
    def _start_counts(self, send_splits: Sequence[int]):
        w = self.world
        inp = torch.tensor(list(send_splits), dtype=torch.int64, device=self.count_device).repeat(w)
        out = torch.empty(w * w, dtype=torch.int64, device=self.count_device)
        work = dist.all_to_all_single(out, inp, group=self.group, async_op=True)
        return work, out

    def _finish_counts(self, pending) -> Counts:
        work, out = pending
        work.wait()
        return Counts(tuple(tuple(row) for row in out.view(self.world, self.world).tolist()))

    def exchange_counts(self, send_splits: Sequence[int]) -> Counts:
        """All ranks' send splits (one all_to_all_single of W^2 int64 per rank). Collective."""
        return self._finish_counts(self._start_counts(send_splits))

    # ---- exchange ----------------------------------------------------------------------
    def __call__(self, x: torch.Tensor, send_splits: Sequence[int], recv_splits: Sequence[int],
                 counts: Optional[Counts] = None) -> torch.Tensor:
        send_splits, recv_splits = [int(v) for v in send_splits], [int(v) for v in recv_splits]
        if len(send_splits) != self.world or len(recv_splits) != self.world:
            raise ValueError(f"send/recv splits need {self.world} entries each")
        if sum(send_splits) != x.shape[0]:
            raise ValueError(f"send splits sum to {sum(send_splits)} but x has {x.shape[0]} rows")
        return _HaloFn.apply(x, self, send_splits, recv_splits, counts)

    def run(self, x: torch.Tensor, send: list[int], recv: list[int],
            counts: Optional[Counts]) -> tuple[torch.Tensor, Counts]:
        """One exchange without autograd; returns the output and the counts it used."""
        x = x.contiguous()
        if self.mode == "coalesced":
            return self._run_coalesced(x, send, recv, counts)
        pending = None if counts is not None else self._start_counts(send)
        if pending is not None and not self.overlap:
            counts, pending = self._checked(pending, recv), None
        out = x.new_empty((sum(recv), *x.shape[1:]))
        cur = _Call(x, out, _offsets(send), _offsets(recv))
        keep = []  # packs built by a gather must live until their send completes
        # Receives go first, so each peer's send finds its receive posted and goes out at once
        # (gloo's P2P is a rendezvous: a send posted before its receive waits a round trip and
        # is then written by gloo's single I/O thread, which measured ~1.5x slower Phase II).
        # Phase II sends wait for the counts, so their relays have posted by then. Relayed
        # rows land straight in `out`; the relay knows nothing else.
        extra = self._relay_recvs(cur, recv) if self.overlap else []
        counts, packs, pack_works, works = self._phases_1_2(cur, send, recv, counts, pending, extra, keep)
        if self.overlap:  # Phase III: forward each pack as soon as it lands
            for (s, buf), w in zip(packs, pack_works):
                w.wait()
                works += _post(self._relay_sends(cur, s, buf, counts))
        else:  # simple HALO: all of Phase II, then all of Phase III
            for w in pack_works + works:
                w.wait()
            ops = self._relay_recvs(cur, recv)
            for s, buf in packs:
                ops += self._relay_sends(cur, s, buf, counts)
            works = _post(ops)
        for w in works:
            w.wait()
        del keep
        return out, counts

    def _run_coalesced(self, x: torch.Tensor, send: list[int], recv: list[int],
                       counts: Optional[Counts]) -> tuple[torch.Tensor, Counts]:
        """Phase I ‖ Phase II, then one Phase III message per (relay, local rank)."""
        pending = None if counts is not None else self._start_counts(send)
        out = x.new_empty((sum(recv), *x.shape[1:]))
        cur = _Call(x, out, _offsets(send), _offsets(recv))
        keep = []
        # Everything that needs no counts first, receives before sends (gloo P2P rendezvous):
        # Phase I both ways, and the Phase III receives, whose sizes are my own recv splits
        # (in order, as NCCL needs: with the Phase III sends instead)
        relayed, recvs = self._coalesced_recvs(cur, recv)
        early, late = ([], recvs) if self.in_order else (recvs, [])
        counts, packs, pack_works, works = self._phases_1_2(cur, send, recv, counts, pending, early, keep)
        for w in pack_works:  # Phase III needs every pack (they share the NIC: they land together)
            w.wait()
        works += _post(late + self._coalesced_sends(cur, packs, counts, keep))
        for w in works:
            w.wait()
        for buf, parts in relayed:  # messages whose sources are not adjacent in `out`
            off = 0
            for s, n in parts:
                out.narrow(0, cur.roff[s], n).copy_(buf.narrow(0, off, n))
                off += n
        del keep
        return out, counts

    def _phases_1_2(self, cur: "_Call", send: list[int], recv: list[int], counts, pending, extra: list,
                    keep: list):
        """Post Phase I both ways (receives first, then `extra` receives, then sends: gloo's
        P2P is a rendezvous), copy my own rows, finish the counts, post Phase II. Returns
        (counts, packs, the packs' receive works, every other work)."""
        me = self.rank
        works = _post(self._phase1(cur, send, recv, dist.irecv) + extra + self._phase1(cur, send, recv, dist.isend))
        if send[me] != recv[me]:  # my own rows: the counts need not travel to tell
            raise ValueError(f"rank {me}: recv_splits[{me}] = {recv[me]} disagrees with its own send_splits[{me}] = "
                             f"{send[me]}")
        if send[me]:
            cur.out.narrow(0, cur.roff[me], recv[me]).copy_(cur.x.narrow(0, cur.soff[me], send[me]))
        if pending is not None:  # the counts travelled while Phase I ran
            counts = self._checked(pending, recv)
        packs, ops = self._pack_recvs(cur, counts)
        pack_works = _post(ops + self._pack_sends(cur, send, keep))
        # Wait on each work once: a gloo send work counts completions, a second wait hangs.
        return counts, packs, pack_works[:len(packs)], works + pack_works[len(packs):]

    def _coalesced_recvs(self, cur: "_Call", recv: list[int]):
        """Phase III receives: one message from each other rank p of my node holding, sources
        ascending, the rows of every remote source whose peer on my node is p. Lands in `out`
        when those sources' slices are adjacent there, else in a buffer scattered afterwards."""
        by_relay: dict[int, list[int]] = {}
        for s, node in enumerate(self.nodes.node_of):
            if node != self.my_node and recv[s]:
                by_relay.setdefault(self.nodes.peer(s, self.my_node), []).append(s)
        relayed, ops = [], []
        for p, srcs in sorted(by_relay.items()):
            if p == self.rank:
                continue
            n = sum(recv[s] for s in srcs)
            if all(cur.roff[b] == cur.roff[a] + recv[a] for a, b in zip(srcs, srcs[1:])):
                buf = cur.out.narrow(0, cur.roff[srcs[0]], n)
            else:
                buf = cur.out.new_empty((n, *cur.out.shape[1:]))
                relayed.append((buf, [(s, recv[s]) for s in srcs]))
            ops.append(self._op(dist.irecv, buf, p, _TAG_III))
        return relayed, ops

    def _coalesced_sends(self, cur: "_Call", packs: list, counts: Counts, keep: list) -> list:
        """Phase III sends: for each local rank, its rows of every pack (sources ascending, as
        `packs` is) in one message; my own rows go straight into `out`."""
        mine, c = self.nodes.members[self.my_node], counts.matrix
        parts: dict[int, list[torch.Tensor]] = {d: [] for d in mine}
        for s, buf in packs:
            off = 0
            for d in mine:
                n = c[s][d]
                if n and d == self.rank:
                    cur.out.narrow(0, cur.roff[s], n).copy_(buf.narrow(0, off, n))
                elif n:
                    parts[d].append(buf.narrow(0, off, n))
                off += n
        ops = []
        for d, ts in parts.items():
            if ts:
                msg = ts[0] if len(ts) == 1 else torch.cat(ts)
                keep.append(msg)
                ops.append(self._op(dist.isend, msg, d, _TAG_III))
        return ops

    def _checked(self, pending, recv: list[int]) -> Counts:
        counts = self._finish_counts(pending)
        if counts.recv(self.rank) != recv:
            raise ValueError(f"rank {self.rank}: recv_splits {recv} disagree with the senders' "
                             f"send_splits {counts.recv(self.rank)}")
        return counts

    def _op(self, fn, t, peer, tag):
        return dist.P2POp(fn, t, group=self.group, group_peer=peer, tag=tag)

    def _phase1(self, cur: "_Call", send, recv, fn) -> list:
        """Phase I sends or receives (fn): rows to / from the other ranks of my node."""
        ops = []
        for d in self.nodes.members[self.my_node]:
            if d != self.rank and fn is dist.isend and send[d]:
                ops.append(self._op(fn, cur.x.narrow(0, cur.soff[d], send[d]), d, _TAG_I))
            if d != self.rank and fn is dist.irecv and recv[d]:
                ops.append(self._op(fn, cur.out.narrow(0, cur.roff[d], recv[d]), d, _TAG_I))
        return ops

    def _pack_sends(self, cur: "_Call", send, keep: list) -> list:
        """Phase II sends: one pack per remote node, to my peer there."""
        ops, nodes = [], self.nodes
        for node, ranks in nodes.members.items():
            n = sum(send[d] for d in ranks)
            if node == self.my_node or not n:
                continue
            if nodes.block[node]:
                pack = cur.x.narrow(0, cur.soff[ranks[0]], n)
            else:
                pack = torch.cat([cur.x.narrow(0, cur.soff[d], send[d]) for d in ranks])
                keep.append(pack)
            ops.append(self._op(dist.isend, pack, nodes.peer(self.rank, node), _TAG_II))
        return ops

    def _pack_recvs(self, cur: "_Call", counts: Counts):
        """Phase II receives: the packs I relay, from remote ranks whose peer on my node is me."""
        nodes, c, mine = self.nodes, counts.matrix, self.nodes.members[self.my_node]
        packs, ops = [], []
        for s, node in enumerate(nodes.node_of):
            if node != self.my_node and nodes.peer(s, self.my_node) == self.rank:
                n = sum(c[s][d] for d in mine)
                if n:
                    buf = cur.x.new_empty((n, *cur.x.shape[1:]))
                    packs.append((s, buf))
                    ops.append(self._op(dist.irecv, buf, s, _TAG_II))
        return packs, ops

    def _relay_recvs(self, cur: "_Call", recv) -> list:
        """Phase III receives: rows from remote s arrive from s's peer on my node."""
        ops = []
        for s, node in enumerate(self.nodes.node_of):
            if node != self.my_node and recv[s]:
                p = self.nodes.peer(s, self.my_node)
                if p != self.rank:
                    ops.append(self._op(dist.irecv, cur.out.narrow(0, cur.roff[s], recv[s]), p, _TAG_III + s))
        return ops

    def _relay_sends(self, cur: "_Call", s: int, buf: torch.Tensor, counts: Counts) -> list:
        """Phase III sends: split the pack from s over my node's ranks (mine I copy)."""
        ops, off = [], 0
        for d in self.nodes.members[self.my_node]:
            n = counts.matrix[s][d]
            if n and d == self.rank:
                cur.out.narrow(0, cur.roff[s], n).copy_(buf.narrow(0, off, n))
            elif n:
                ops.append(self._op(dist.isend, buf.narrow(0, off, n), d, _TAG_III + s))
            off += n
        return ops


@dataclass
class _Call:
    """Buffers and offsets of one exchange."""

    x: torch.Tensor
    out: torch.Tensor
    soff: list[int]
    roff: list[int]


def _post(ops: list) -> list:
    return dist.batch_isend_irecv(ops) if ops else []


def _offsets(splits: list[int]) -> list[int]:
    off, acc = [], 0
    for v in splits:
        off.append(acc)
        acc += v
    return off


class _HaloFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ex: HaloExchange, send, recv, counts):
        out, used = ex.run(x, send, recv, counts)
        ctx.ex, ctx.send, ctx.recv, ctx.counts = ex, send, recv, used
        return out

    @staticmethod
    def backward(ctx, grad):
        # The reverse exchange: every row goes back to where it came from, same order.
        g, _ = ctx.ex.run(grad, ctx.recv, ctx.send, ctx.counts.transposed())
        return g, None, None, None, None
