"""EP dispatcher on 3 gloo ranks: uneven splits, experts and whole ranks that receive no
rows, a rank with no tokens at all, dropped assignments, a non-contiguous placement --
outputs and gradients equal a dense single-process computation of the same experts, with
the flat exchange and with HALO over two virtual nodes, to which the dispatcher hands the
counts it exchanged (HALO's own count exchange is disabled in that run), and with the token
sums a GPU takes (by slot, runtime/moe/permute.py) as well as the CPU's (embedding_bag)."""
from __future__ import annotations

import time
import types

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from piper_runtime.moe.dispatch import EPDispatcher  # noqa: E402
from piper_runtime.moe.exchange_flat import FlatExchange  # noqa: E402
from piper_runtime.moe.experts import GroupedExperts  # noqa: E402
from piper_runtime.moe.permute import sums_by_slot  # noqa: E402
from piper_runtime.moe.placement import ExpertPlacement  # noqa: E402

E, EP, D, F, K = 6, 3, 16, 32, 2
# logical expert -> (rank, slot); rank 1 holds experts 2 and 5, which nobody routes to
PLACE = ExpertPlacement(E, EP, rank_of=[2, 0, 1, 0, 2, 1], slot_of=[1, 0, 0, 1, 0, 1])
# per source rank: token -> K logical experts (-1: dropped by capacity); rank 2 has no tokens
ROUTES = {
    0: [[0, 1], [1, 4], [3, -1], [0, 4], [4, 3]],
    1: [[0, 4], [4, 0], [0, 4], [3, 1]],
    2: [],
}


def _inputs(r: int):
    g = torch.Generator().manual_seed(100 + r)
    n = len(ROUTES[r])
    x = torch.randn(n, D, generator=g)
    w = torch.rand(n, K, generator=g)
    idx = torch.tensor(ROUTES[r], dtype=torch.long).view(n, K)
    w = torch.where(idx >= 0, w, torch.zeros_like(w))
    gout = torch.randn(n, D, generator=g)
    return x, idx, w, gout


def _weights():
    """Logical expert weights w1 (gate), w3 (up) [E, D, F] and w2 (down) [E, F, D]."""
    g = torch.Generator().manual_seed(7)
    return [torch.randn(*shape, generator=g) * 0.1 for shape in ((E, D, F), (E, D, F), (E, F, D))]


def _dense(x, idx, w, ws):
    """Σ_k w · SwiGLU_e(x) with a plain loop over tokens and choices."""
    w1, w3, w2 = ws
    out = torch.zeros_like(x)
    for n in range(x.shape[0]):
        for k in range(K):
            e = int(idx[n, k])
            if e < 0:
                continue
            h = torch.nn.functional.silu(x[n] @ w1[e]) * (x[n] @ w3[e])
            out[n] = out[n] + w[n, k] * (h @ w2[e])
    return out


def _no_count_exchange(*_a, **_k):
    raise AssertionError("HALO exchanged counts itself: the dispatcher should pass them")


def _worker(rank: int, store: str, grouped, a2a: str, slots: bool) -> None:
    torch.set_num_threads(1)
    from datetime import timedelta
    dist.init_process_group("gloo", store=dist.FileStore(store, EP), rank=rank, world_size=EP,
                            timeout=timedelta(seconds=60))
    try:
        ws = _weights()
        experts = GroupedExperts(E // EP, D, F, gated=True, grouped=grouped)
        mine = PLACE.local_experts(rank)
        ours = (experts.w1, experts.w3, experts.w2)
        with torch.no_grad():
            for p, w in zip(ours, ws):
                p.copy_(w[mine])
        if a2a == "halo":
            from piper_runtime.moe.halo import HaloExchange

            ex = HaloExchange(dist.group.WORLD, [0, 0, 1])
            ex._start_counts = _no_count_exchange  # counts must come from the dispatcher
        else:
            ex = FlatExchange(dist.group.WORLD)
        disp = EPDispatcher(PLACE, rank, dist.group.WORLD, ex)
        x, idx, w, gout = _inputs(rank)
        x.requires_grad_(True)
        import piper_runtime.moe.dispatch as dispatch_mod

        def slow_counts(*a, **k):  # the count exchange, made to take 0.2 s more
            time.sleep(0.2)
            return dist.all_to_all_single(*a, **k)

        dispatch_mod.dist = types.SimpleNamespace(all_to_all_single=slow_counts)
        try:
            with sums_by_slot(slots):
                y = disp(x, idx, w, experts)
                (y * gout).sum().backward()
        finally:
            dispatch_mod.dist = dist
        # the count exchange is timed as all-to-all, as the plan prices it (its call and its wait)
        assert disp.a2a.fwd_s >= 0.2, disp.a2a.fwd_s

        # dense reference over every rank's tokens (all inputs are reproducible anywhere)
        rws = [w.clone().requires_grad_() for w in ws]
        total, ref_x = 0.0, None
        for r in range(EP):
            xr, ir, wr, gr = _inputs(r)
            xr.requires_grad_(True)
            total = total + (_dense(xr, ir, wr, rws) * gr).sum()
            if r == rank:
                ref_x, ref_y = xr, _dense(xr, ir, wr, rws)
        total.backward()
        torch.testing.assert_close(y, ref_y.detach(), rtol=1e-5, atol=1e-6)
        if ref_x.grad is None:  # rank 2 has no tokens: nothing flows back to it
            assert x.grad is None or x.grad.numel() == 0
        else:
            torch.testing.assert_close(x.grad, ref_x.grad, rtol=1e-5, atol=1e-6)
        for p, rw in zip(ours, rws):
            torch.testing.assert_close(p.grad, rw.grad[mine], rtol=1e-5, atol=1e-6)
        # rows each rank's experts computed: rank 1 none at all
        expect = {0: [3, 3], 1: [0, 0], 2: [6, 5]}[rank]
        assert disp.tokens_per_slot.tolist() == expect, disp.tokens_per_slot.tolist()
        if rank == 1:
            assert all(float(p.grad.abs().sum()) == 0.0 for p in ours)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("grouped,a2a,slots", [(None, "flat", False), (False, "flat", False), (None, "halo", False),
                                               (None, "flat", True), (None, "halo", True)],
                         ids=["grouped_mm", "loop", "halo", "grouped_mm-slot-sums", "halo-slot-sums"])
def test_dispatch_zero_and_uneven(tmp_path, grouped, a2a, slots, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # an inherited value must not win, nor this one leak
    mp.spawn(_worker, args=(str(tmp_path / "store"), grouped, a2a, slots), nprocs=EP, join=True)


def test_placement_rejects_bad_maps():
    with pytest.raises(ValueError):
        ExpertPlacement(4, 2, rank_of=[0, 0, 0, 1], slot_of=[0, 1, 0, 0])
    p = ExpertPlacement.contiguous(8, 4)
    assert p.local_experts(3) == [6, 7] and p.physical_ids().tolist() == list(range(8))
