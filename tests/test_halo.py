"""HALO equals flat all_to_all_single value for value and in order, forward and backward.

One spawned gloo world of 8 CPU processes runs every virtual node map (node maps only decide
who relays what; all ranks share one machine), on subgroups where the map is smaller than 8."""
from __future__ import annotations

import datetime
import os
import zlib

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from runtime_test_support import report_failures, spawn_and_check  # noqa: E402

WORLD = 8
# name -> (group's global ranks, node of each group rank)
MAPS = {
    "2x2": ([0, 1, 2, 3], [0, 0, 1, 1]),
    "2x4": (list(range(8)), [0] * 4 + [1] * 4),
    "4x2": (list(range(8)), [0, 0, 1, 1, 2, 2, 3, 3]),
    "3x2 (subgroup 2..7)": ([2, 3, 4, 5, 6, 7], [0, 0, 1, 1, 2, 2]),
    "uneven 3,1,2": ([0, 1, 2, 3, 4, 5], [0, 0, 0, 1, 2, 2]),
    "uneven 1,3,2,2 strided": (list(range(8)), [1, 0, 2, 0, 3, 2, 0, 3]),
    "one node": ([4, 5, 6, 7], [0, 0, 0, 0]),
    "one rank per node": ([0, 1, 2, 3, 4], [0, 1, 2, 3, 4]),
    # a stage straddling two nodes: GPUs 2-3 of one, 0-5 of the next; each relay on its rail where
    # the other node has one (third entry: each group rank's GPU index on its node)
    "rails 2-3 | 0-5": (list(range(8)), [0, 0, 1, 1, 1, 1, 1, 1], [2, 3, 0, 1, 2, 3, 4, 5]),
}
TRIALS = 4
MAPS_ORDER = {name: i for i, name in enumerate(MAPS)}


def _matrix(gen, w: int, trial: int):
    """Row counts s -> d: random uneven, ~30% zeros, one silent rank, trial 3 all zero."""
    c = torch.randint(0, 6, (w, w), generator=gen)
    c[torch.rand((w, w), generator=gen) < 0.3] = 0
    z = int(torch.randint(0, w, (1,), generator=gen))
    c[z, :] = 0
    c[:, z] = 0
    if trial == 3:
        c.zero_()
    return c


def _flat(x, send, recv, group):
    out = x.new_empty((sum(recv), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group)
    return out


def _worker(rank: int, store_path: str, errfile: str):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    from piper_runtime.moe import halo as halo_mod
    from piper_runtime.moe.halo import HaloExchange

    # each batch's phases, read off its tags: in order (NCCL's way) a batch holds one phase,
    # the phases ascending, so a batch only waits on its peers' batches of the same phase
    posted, post = [], halo_mod._post
    phase = lambda tag: 1 if tag == halo_mod._TAG_I else 2 if tag == halo_mod._TAG_II else 3  # noqa: E731
    halo_mod._post = lambda ops: (posted.append({phase(op.tag) for op in ops}) if ops else None, post(ops))[1]

    store = dist.FileStore(store_path, WORLD)
    timeout = datetime.timedelta(seconds=int(os.environ.get("HALO_TEST_TIMEOUT", 60)))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD, timeout=timeout)
    with report_failures(errfile) as failures:
        try:
            for name, (ranks, node_of, *rails) in MAPS.items():
                group = dist.new_group(ranks, timeout=timeout) if len(ranks) < WORLD else None
                if rank not in ranks:
                    continue
                rail_of = rails[0] if rails else None
                halos = {m: HaloExchange(group, node_of, mode=m, rail_of=rail_of) for m in HaloExchange.MODES}
                in_order = {m: HaloExchange(group, node_of, mode=m, in_order=True, rail_of=rail_of)
                            for m in ("coalesced", "simple")}
                halo = halos["coalesced"]
                me, w = dist.get_rank(group), len(ranks)
                gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))  # same on every rank
                for trial in range(TRIALS):
                    c = _matrix(gen, w, trial)
                    send, recv = c[me].tolist(), c[:, me].tolist()
                    shape = (sum(send), 3) if trial != 2 else (sum(send), 2, 4)  # trailing dims too
                    # Rows carry (source, row index) so order errors show, plus noise for bits.
                    x = torch.randn(shape, generator=torch.Generator().manual_seed(100 * me + trial))
                    x.select(-1, 0).reshape(-1)[: shape[0]] = me * 1000 + torch.arange(shape[0], dtype=x.dtype)
                    x.requires_grad_(True)
                    counts = halo.exchange_counts(send) if trial == 1 else None  # both count paths
                    # modes cycle with the trial (offset per map): trials 0-2 give each mode a non-empty run
                    mode = HaloExchange.MODES[(trial + MAPS_ORDER[name]) % len(HaloExchange.MODES)]
                    y = halos[mode](x, send, recv, counts=counts)
                    ref = _flat(x.detach(), send, recv, group)
                    if not torch.equal(y.detach(), ref):
                        failures.append(f"{name} trial {trial} ({mode}) rank {me}: forward differs")
                    if counts is not None:  # dispatcher use: the combine reuses the transposed counts
                        back = halo(y.detach(), recv, send, counts=counts.transposed())
                        if not torch.equal(back, x.detach()):
                            failures.append(f"{name} rank {me}: combine with transposed counts differs")
                    for m, h in in_order.items():  # NCCL's ordering, run on gloo: the same rows
                        posted.clear()
                        if not torch.equal(h(x.detach(), send, recv, counts=counts), ref):
                            failures.append(f"{name} trial {trial} ({m}, in order) rank {me}: forward differs")
                        phases = [sorted(b) for b in posted]
                        if any(len(b) != 1 for b in phases) or phases != sorted(phases):
                            failures.append(f"{name} trial {trial} ({m}, in order) rank {me}: batches {phases}")
                    gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(7 + me + trial))
                    y.backward(gy)
                    gref = _flat(gy, recv, send, group)  # flat backward: the reverse exchange
                    if not torch.equal(x.grad, gref):
                        failures.append(f"{name} trial {trial} ({mode}) rank {me}: gradient differs")
                if w > 1:  # a bf16 exchange (gloo moves bytes; still bit-identical)
                    c = _matrix(gen, w, 0)
                    send, recv = c[me].tolist(), c[:, me].tolist()
                    xb = torch.randn(sum(send), 5).to(torch.bfloat16)
                    if not torch.equal(halo(xb, send, recv), _flat(xb, send, recv, group)):
                        failures.append(f"{name} bf16 rank {me}: forward differs")
        finally:
            dist.destroy_process_group()


def test_halo_bit_identical_to_flat(tmp_path):
    spawn_and_check(_worker, tmp_path, WORLD)


def test_node_map_length_checked():
    from piper_runtime.moe.halo import _Nodes

    n = _Nodes([0, 0, 0, 1, 2, 2])
    assert n.members == {0: [0, 1, 2], 1: [3], 2: [4, 5]}
    # Node 1 has one rank: every remote rank sends to it; node 2 wraps local index 2 -> 0.
    assert [n.peer(r, 1) for r in (0, 1, 2, 4, 5)] == [3, 3, 3, 3, 3]
    assert [n.peer(r, 2) for r in (0, 1, 2, 3)] == [4, 5, 4, 4]
    assert not _Nodes([0, 1, 0, 1]).block[0]


def test_a_pack_is_relayed_on_its_senders_rail_where_the_other_node_has_it():
    """A group over GPUs 4-7 of node 1 and 0-7 of node 2 (a stage straddling them): GPU 4's pack
    for node 2 goes to node 2's GPU 4, not to its first group rank (GPU 0), which a rail-optimised
    fabric reaches only over its spine. Node 2's GPUs 0-3, whose rails node 1 lacks, keep the
    local-index rule."""
    from piper_runtime.moe.halo import _Nodes

    n = _Nodes([1] * 4 + [2] * 8, rail_of=[4, 5, 6, 7, *range(8)])
    assert [n.peer(r, 2) for r in range(4)] == [8, 9, 10, 11]  # node 2's GPUs 4-7
    assert [n.peer(r, 1) for r in range(4, 12)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [_Nodes([1] * 4 + [2] * 8).peer(r, 2) for r in range(4)] == [4, 5, 6, 7]  # no rails: local index
    with pytest.raises(ValueError, match="rail_of has 3 entries; node_of has 4"):
        _Nodes([0, 0, 1, 1], rail_of=[0, 1, 0])


def test_per_pack_forwarding_is_refused_where_batches_complete_in_order():
    from piper_runtime.moe.halo import HaloExchange

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="per_pack"):
            HaloExchange(None, [0], mode="per_pack", in_order=True)
        assert not HaloExchange(None, [0]).in_order  # gloo matches message by message
    finally:
        dist.destroy_process_group()


def test_receive_splits_that_disagree_with_the_senders_are_refused_not_misread():
    # a rank told to receive 2 rows where its peers send 3 would read past or short of its buffer
    from piper_runtime.moe.halo import HaloExchange

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match=r"recv_splits\[0\] = 2 disagrees with its own send_splits\[0\] = 3"):
            HaloExchange(None, [0])(torch.ones(3, 4), [3], [2])
    finally:
        dist.destroy_process_group()
