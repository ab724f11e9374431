"""Pipeline stages and schedule from a plan (torch.distributed.pipelining).

Chunk c of plan.partition runs on pipeline rank plan.chunk_stage_rank(c): looped for
gpipe/1f1b/interleaved, V-shaped for zbv/dualpipev -- the same maps torch's schedules use,
checked here. Stage metadata is given statically (token ids in, fp32 hidden or logits
out), so no shape-inference forward runs (it would run the EP all-to-all on garbage).

Gradients are not scaled by the schedule (scale_grads=False): a tied embedding shared by
two chunks of one rank would be divided twice. The loss function divides by the number of
micro-batches instead, and the MoE auxiliary-loss gradient uses the same 1/M."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    Schedule1F1B, ScheduleDualPipeV, ScheduleGPipe, ScheduleInterleaved1F1B, ScheduleZBVZeroBubble,
)

from piper_plan.plan import Plan

from piper_plan.runtimes import padded_vocab
from .model import BuildCtx, Chunk, build_chunk

SCHEDULE_CLASSES = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved": ScheduleInterleaved1F1B,
    "zbv": ScheduleZBVZeroBubble,
    "dualpipev": ScheduleDualPipeV,
}


def local_chunk_ids(plan: Plan, pp_rank: int) -> list[int]:
    return [c for c in range(plan.layout.stages) if plan.chunk_stage_rank(c) == pp_rank]


def build_local_chunks(plan: Plan, pp_rank: int, ctx: BuildCtx, seed: int, device) -> dict[int, Chunk]:
    """This rank's chunks, keyed by chunk (stage) index. With tied embeddings and the first
    and last chunk on this rank (V schedules), both share one embedding module."""
    spec, n = plan.model, plan.layout.stages
    out: dict[int, Chunk] = {}
    for c in local_chunk_ids(plan, pp_rank):
        embed = out[0].embed if (c == n - 1 and 0 in out and spec.tied_embeddings) else None
        out[c] = build_chunk(spec, plan.partition[c], c == 0, c == n - 1, ctx, seed, device, embed=embed)
    return out


def _stage_meta(plan: Plan, chunk: int, device):
    """Example input and output of chunk `chunk` (requires_grad marks what carries gradients).
    With tp, hidden states travel as this rank's sequence shard under sequence parallelism
    (replicated otherwise) and the last chunk's logits are this rank's vocabulary slice."""
    lay, spec = plan.layout, plan.model
    seq = lay.seq // lay.tp if lay.sp else lay.seq
    hid = torch.empty(lay.mbs, seq, spec.hidden_size, device=device, requires_grad=True)
    inp = torch.empty(lay.mbs, lay.seq, dtype=torch.long, device=device) if chunk == 0 else hid
    out = (torch.empty(lay.mbs, lay.seq, padded_vocab(spec.vocab_size) // lay.tp, device=device, requires_grad=True)
           if chunk == lay.stages - 1 else hid)
    return inp, out


class Pipeline:
    """The rank's stages and the plan's schedule.

    step(tokens, targets, losses) runs one optimizer step's forward and backward over
    plan.layout.microbatches micro-batches; `losses` receives the unscaled per-micro-batch
    LM losses when this rank holds the last chunk."""

    def __init__(self, plan: Plan, chunks: dict[int, Chunk], pp_group, device,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
        lay = plan.layout
        self.plan, self.chunks, self.M = plan, chunks, lay.microbatches
        self.has_first = 0 in chunks
        self.has_last = (lay.stages - 1) in chunks
        self._raw: list[torch.Tensor] = []
        M = self.M

        def scaled_loss(out, tgt):
            loss = loss_fn(out, tgt)
            self._raw.append(loss.detach())
            return loss / M

        self.stages = []
        for c, mod in sorted(chunks.items()):
            inp, out = _stage_meta(plan, c, device)
            self.stages.append(PipelineStage(mod, c, lay.stages, device, input_args=inp, output_args=out,
                                             group=pp_group))
        cls = SCHEDULE_CLASSES[lay.schedule]
        if lay.schedule in ("gpipe", "1f1b"):
            self.schedule = cls(self.stages[0], M, loss_fn=scaled_loss, scale_grads=False)
        else:
            self.schedule = cls(self.stages, M, loss_fn=scaled_loss, scale_grads=False)
            for st in self.stages:
                want = plan.chunk_stage_rank(st.stage_index)
                got = self.schedule.stage_index_to_group_rank[st.stage_index]
                if want != got:
                    raise RuntimeError(f"schedule puts stage {st.stage_index} on pp rank {got}, plan on {want}")

    def step(self, tokens: torch.Tensor, targets: torch.Tensor) -> list[torch.Tensor]:
        self._raw.clear()
        args = (tokens,) if self.has_first else ()
        kw = {"target": targets, "losses": []} if self.has_last else {}
        self.schedule.step(*args, **kw, return_outputs=False)
        return list(self._raw)

    def modules(self) -> list[nn.Module]:
        return [self.chunks[c] for c in sorted(self.chunks)]
