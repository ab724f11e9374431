"""Migration moves expert state exactly or not at all (2 CPU ranks, gloo, tiny-moe).

One spawn: a real training step (so gradients and Adam moments exist), then migrations
that fail part-way -- a rank raising after its first transfer, a rank raising after
staging, a corrupted staged buffer -- each leaving the previous placement and every byte
of expert state as it was; then a migration that succeeds, after which every logical
expert's state has the same checksum under its new (rank, slot)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from piper_plan.layout import Layout  # noqa: E402
from piper_plan.plan import Migration, make_plan  # noqa: E402
from piper_plan.specs.registry import load_hardware, load_model  # noqa: E402

WORLD = 2


def _plan(zero):
    lay = Layout(gpus=2, pp=1, dp=2, ep=2, mbs=1, global_batch=4, seq=16, zero=zero, dtype="fp32")
    return make_plan(load_model("tiny-moe"), load_hardware("cpu-local"), lay)


def _all_digest(chunks, opt):
    from piper_runtime.migrate import expert_state_digest

    parts = [None] * WORLD
    dist.all_gather_object(parts, expert_state_digest(chunks, opt))
    out = {}
    for p in parts:  # ep == dp here: each logical expert lives on exactly one rank
        assert not (set(out) & set(p))
        out.update(p)
    return out


def _worker(rank, store, zero):
    from datetime import timedelta

    from piper_runtime.config import TrainConfig
    from piper_runtime.mesh import build_groups
    from piper_runtime.migrate import Migrator, stage_moe_layers
    from piper_runtime.optim import DistOptimizer
    from piper_runtime.pipeline import Pipeline, build_local_chunks
    from piper_runtime.train import build_ctx, lm_loss

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, WORLD), rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=60))
    try:
        plan, cfg = _plan(zero), TrainConfig(timeout_s=60)
        groups = build_groups(plan, 60)
        chunks = build_local_chunks(plan, 0, build_ctx(plan, cfg, groups), 0, "cpu")
        pipe = Pipeline(plan, chunks, groups.pp, "cpu", lm_loss)
        named = [(n, p) for c in chunks.values() for n, p in c.named_parameters()]
        opt = DistOptimizer(named, groups, 2, zero, 1e-3, 0.1)
        g = torch.Generator().manual_seed(rank)
        tok = torch.randint(0, 512, (2, 17), generator=g)
        opt.zero_grad()
        pipe.step(tok[:, :-1], tok[:, 1:])
        opt.reduce_grads()
        opt.step()
        moe = stage_moe_layers(chunks)
        assert len(moe) == 3
        d0 = _all_digest(chunks, opt)
        maps0 = {k: m.dispatcher.placement.as_lists() for k, m in moe.items()}
        raw0 = {k: m.experts.w1.detach().clone() for k, m in moe.items()}
        # every MoE layer: keep expert 0 and 5 where they are, move the other six
        targets = {k: m.dispatcher.placement.rebalanced([[0, 4, 6, 7], [1, 2, 3, 5]]) for k, m in moe.items()}

        def corrupt(point, staged):
            if point == "staged" and rank == 1:
                next(iter(next(iter(staged.values())).values())).view(-1)[0] += 1.0

        def raise_at(where, who):
            def f(point, staged):
                if point == where and rank == who:
                    raise RuntimeError(f"simulated failure at {point}")
            return f

        mig = Migrator(Migration(enabled=True), groups, chunks, opt)
        # (a rank failing before any transfer is posted: its peers must not wait on sends to it)
        for fault in (raise_at("planned", 1), raise_at("transfer", 1), raise_at("staged", 0), corrupt):
            mig.fault = fault
            ev = mig.migrate(targets)
            assert not ev["ok"] and ev["error"], ev
            assert {k: m.dispatcher.placement.as_lists() for k, m in moe.items()} == maps0
            assert _all_digest(chunks, opt) == d0
            assert all(torch.equal(raw0[k], m.experts.w1) for k, m in moe.items())
        mig.fault = None
        ev = mig.migrate(targets)
        assert ev["ok"] and ev["error"] is None and ev["moved"] == {"1": 6, "2": 6, "3": 6}, ev
        assert all(m.dispatcher.placement.as_lists() == [[0, 4, 6, 7], [1, 5, 2, 3]] for m in moe.values())  # by slot
        d1 = _all_digest(chunks, opt)
        assert d1 == d0  # every logical expert's weights, gradients and Adam moments intact
        # expert 0 stayed in slot 0 of rank 0; expert 4 arrived in rank 0's freed slot 1
        if rank == 0:
            for k, m in moe.items():
                assert torch.equal(m.experts.w1[0], raw0[k][0])
                assert not torch.equal(m.experts.w1[1], raw0[k][1])
        # the model still trains under the new map
        opt.zero_grad()
        pipe.step(tok[:, :-1], tok[:, 1:])
        opt.reduce_grads()
        opt.step()
    finally:
        dist.destroy_process_group()


def test_failed_migration_changes_nothing_and_success_moves_all_state(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # each spawned rank one thread, as piper-train's CPU ranks
    mp.spawn(_worker, args=(str(tmp_path / "store"), 1), nprocs=WORLD, join=True)
