"""The training loop of one rank: build groups, chunks, pipeline and optimizer from the
plan, then per step: pipelined forward/backward over the micro-batches, gradient
reduction (dp / edp / tied embedding), global-norm clipping, AdamW (ZeRO-1 or -2 as the
plan says), metrics, checkpoint."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from piper_plan.errors import PiperError
from piper_plan.plan import Plan

from . import checkpoint, metrics
from .config import TrainConfig
from .data import make_source, rank_rows
from .mesh import Groups, build_groups, tp_of
from .migrate import stage_state
from .model import BuildCtx
from .pipeline import Pipeline, build_local_chunks
from .tp import TP, vocab_parallel_cross_entropy


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of one micro-batch (fp32)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def loss_for(tp: TP):
    """lm_loss, or with tp > 1 the vocabulary-parallel one over this rank's logits slice."""
    if tp.size == 1:
        return lm_loss
    return lambda logits, targets: vocab_parallel_cross_entropy(logits.flatten(0, 1), targets.flatten(), tp)


def make_exchange(plan: Plan, groups: Groups):
    """The EP row exchange the plan asks for (None when ep == 1)."""
    if plan.layout.ep == 1:
        return None
    import torch.distributed as dist

    if plan.layout.a2a == "halo":
        try:
            from .moe.halo import HaloExchange
        except ImportError as e:
            raise PiperError(f"plan.layout.a2a = 'halo' but the HALO exchange is unavailable ({e})") from None
        ranks = dist.get_process_group_ranks(groups.ep)
        nodes, rails = [plan.rank_map[r].node for r in ranks], [plan.rank_map[r].local for r in ranks]
        # all on one node, or one rank per node: nothing to aggregate, and HALO's per-peer
        # messages only cost more than the one collective (the planner prices it as flat too)
        if len(set(nodes)) not in (1, len(nodes)):
            return HaloExchange(groups.ep, nodes, rail_of=rails)
    from .moe.exchange_flat import FlatExchange
    return FlatExchange(groups.ep)


def build_ctx(plan: Plan, cfg: TrainConfig, groups: Optional[Groups]) -> BuildCtx:
    lay = plan.layout
    return BuildCtx(seq=lay.seq, ep=lay.ep, ep_rank=groups.ep_rank if groups else 0,
                    ep_group=groups.ep if groups else None,
                    exchange=make_exchange(plan, groups) if groups else None,
                    aux_coef=cfg.aux_coef, z_coef=cfg.z_coef, capacity_factor=cfg.capacity_factor,
                    aux_scale=1.0 / lay.microbatches, dtype=lay.dtype, recompute=lay.recompute,
                    grouped_mm=cfg.grouped_mm, tp=tp_of(plan, groups),
                    row_multiple=plan.hardware.accelerator.expert_row_multiple)


def train(plan: Plan, cfg: TrainConfig, device: torch.device) -> list[dict]:
    """Run cfg.steps optimizer steps (from the checkpoint's step with cfg.resume) on this
    rank; the process group must exist. Returns rank 0's records (others: [])."""
    from .optim import DistOptimizer

    lay = plan.layout
    groups = build_groups(plan, cfg.timeout_s)
    ctx = build_ctx(plan, cfg, groups)
    chunks = build_local_chunks(plan, groups.pp_rank, ctx, cfg.seed, device)
    pipe = Pipeline(plan, chunks, groups.pp, device, loss_for(ctx.tp))
    named, seen, chunk_of = [], set(), {}
    for ci, c in chunks.items():
        for n, p in c.named_parameters():
            if id(p) not in seen:
                seen.add(id(p))
                named.append((n, p))
                chunk_of[n] = ci
    opt = DistOptimizer(named, groups, lay.dp, lay.zero, cfg.lr, cfg.weight_decay, chunk_of=chunk_of)
    start = checkpoint.load(cfg.checkpoint, opt, chunks) if cfg.resume else 0
    source = make_source(plan.model.vocab_size, lay.seq, cfg.seed, cfg.data, cfg.data_dtype)
    rep = metrics.Reporter(plan, cfg.metrics, cfg.log_every)
    mig = None
    if plan.migration.enabled and lay.ep > 1:  # expert migration (runtime/migrate.py)
        from .migrate import Migrator, restore_window
        mig = Migrator(plan.migration, groups, chunks, opt)
        if cfg.resume:  # the load window the saved run had, so the same experts move next
            restore_window(mig, checkpoint.read_experts(checkpoint.latest(cfg.checkpoint)))
    for step in range(start, cfg.steps):
        rows = rank_rows(source.batch(step, lay.global_batch), lay.dp, groups.dp_rank)
        tokens, targets = rows[:, :-1].to(device), rows[:, 1:].to(device)
        metrics.reset(chunks)
        opt.zero_grad()
        clock = metrics.PhaseClock()
        losses = pipe.step(tokens, targets)
        clock.mark("pipeline")
        opt.reduce_grads()
        clock.mark("grad_reduce")
        norm = opt.clip(cfg.clip)
        clock.mark("clip")
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        clock.mark("optimizer")
        stats = metrics.rank_stats(groups, chunks, losses, clock.total_s, norm, clock.phases)
        event = None
        if mig is not None:  # step boundary: before stats reset; its time is the step's, as the plan's is
            after = metrics.PhaseClock()
            event = mig.after_step(step)
            after.mark("migration")
            stats["phases"].update(after.phases)
            stats["step_s"] += after.total_s
        # each stage migrates its own layers: one rank of each (its ranks' events are alike) reports it
        stats["migration"] = event if groups.dp_rank == 0 and groups.tp_rank == 0 else None
        rep.step(step, stats)  # into the record and the JSONL
        done = step + 1
        if cfg.checkpoint and ((cfg.checkpoint_every and done % cfg.checkpoint_every == 0) or done == cfg.steps):
            # the ranks of a stage hold the same experts state: one of them sends it to rank 0
            lead = groups.dp_rank == 0 and groups.tp_rank == 0
            checkpoint.save(cfg.checkpoint, done, plan, opt, chunks, stage_state(chunks, mig) if lead else None,
                            checkpoint.run_settings(cfg))
    rep.finish()
    return rep.records if rep.rank0 else []
