"""Decoder model from a ModelSpec, built as pipeline chunks.

A chunk owns a list of global layer ids (plan.partition), the embedding if it is the first
chunk and the final norm + LM head if it is the last. Parameter names are global
("layers.7.attn.wq.weight"), and every parameter is initialised from a generator seeded by
(seed, name), so any layout -- and the single-process reference -- starts from the same
weights. Routed-expert weights are stacked per local slot; they are initialised (and
checkpointed) per logical expert id under "layers.<i>.moe.experts.<e>.<w1|w3|w2>".
Tensor-parallel shards (tp.py) are initialised as their slice of the logical tensor.

With tp > 1 the embedding and the LM head are split over the vocabulary (Megatron's
VocabParallelEmbedding and a column-parallel head); the last chunk returns this rank's
logits slice [B, S, V/tp] and the loss is tp.vocab_parallel_cross_entropy -- three
all-reduces of B·S values instead of all-gathering B·S·V logits (V/d times more bytes
than the hidden states; the gather would also hold the full logits on every rank).

The embedding and the LM head carry the vocabulary padded to a multiple of VOCAB_MULTIPLE
(runtimes.padded_vocab; Megatron's --make-vocab-size-divisible-by, nanoGPT's 50,304): an odd vocabulary
leaves the head's GEMMs without the aligned leading dimension the fast kernels need (Granite's
49,155 ran cuBLAS's sm75 fallback on an H200 at about 7x the aligned time, 2026-12-04). The
padded rows are parameters no target names; the logits carry them."""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from piper_plan.specs.model import ModelSpec

from . import timing
from piper_plan.runtimes import padded_vocab
from .layers import FFN, make_attention, make_norm
from .moe.dispatch import EPDispatcher
from .moe.experts import GroupedExperts
from .moe.layer import MoELayer
from .moe.placement import ExpertPlacement
from .moe.router import TopKRouter
from .tp import TP, local_slice, logical_shape, mark_partial, mark_shard

EXPERT_TAG = ".moe.experts."


@dataclass
class BuildCtx:
    """How this rank builds its chunks: EP group and exchange, router options, precision."""

    seq: int
    ep: int = 1
    ep_rank: int = 0
    ep_group: object = None
    exchange: object = None
    placements: dict[int, ExpertPlacement] = field(default_factory=dict)  # layer id -> map
    aux_coef: float = 0.0
    z_coef: float = 0.0
    capacity_factor: Optional[float] = None
    aux_scale: float = 1.0
    dtype: str = "fp32"                 # "fp32" | "bf16" (autocast, fp32 master weights)
    recompute: str = "none"             # "none" | "selective" (attention core: softmax(QKᵀ)V) | "full" (block)
    grouped_mm: Optional[bool] = None   # None: when it applies; False: per-expert loop
    row_multiple: int = 1               # pad each local expert's rows to a multiple (Accelerator.expert_row_multiple)
    tp: TP = field(default_factory=TP)  # tensor parallelism of the stage (size 1: none)

    @property
    def compute_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.dtype == "bf16" else torch.float32

    def placement(self, spec: ModelSpec, layer: int) -> ExpertPlacement:
        if layer not in self.placements:
            self.placements[layer] = ExpertPlacement.contiguous(spec.moe.num_experts, self.ep)
        return self.placements[layer]


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, layer: int, ctx: BuildCtx):
        super().__init__()
        d, tp = spec.hidden_size, ctx.tp
        self.recompute = ctx.recompute
        self.attn_norm = make_norm(spec.norm, d, tp, partial=tp.sp)  # SP: a sequence shard
        self.attn = make_attention(spec, ctx.seq, tp)
        self.attn.recompute_core = ctx.recompute == "selective"
        self.ffn_norm = make_norm(spec.norm, d, tp, partial=tp.sp)
        if spec.layer_is_moe(layer):
            m = spec.moe
            pl = ctx.placement(spec, layer)
            shared = FFN(d, m.shared_experts * m.shared_ffn, m.gated, tp=tp) if m.shared_experts else None
            # the router sees this rank's t/tp tokens: its balance statistics are summed over tp
            router = TopKRouter(d, m.num_experts, m.top_k, m.router, aux_coef=ctx.aux_coef,
                                z_coef=ctx.z_coef, capacity_factor=ctx.capacity_factor,
                                stats_group=tp.group if tp.size > 1 else None)
            mark_partial(router.gate.weight, tp)
            experts = GroupedExperts(pl.per_rank, d, m.expert_ffn_size, m.gated, grouped=ctx.grouped_mm,
                                     row_multiple=ctx.row_multiple)
            disp = EPDispatcher(pl, ctx.ep_rank, ctx.ep_group, ctx.exchange)
            self.moe = MoELayer(router, experts, shared, disp, ctx.aux_scale, ctx.compute_dtype, tp)
        else:
            self.ffn = FFN(d, spec.ffn_size, spec.ffn_gated, spec.linear_bias, tp)

    def _body(self, x):
        x = x + self.attn(self.attn_norm(x))
        h = self.ffn_norm(x)
        return x + (self.moe(h) if hasattr(self, "moe") else self.ffn(h))

    def forward(self, x):
        if self.recompute == "full" and x.requires_grad:
            return checkpoint(self._body, x, use_reentrant=False)
        return self._body(x)


class Chunk(nn.Module):
    """Pipeline chunk: [embedding] -> blocks -> [final norm -> LM head]. Input: token ids
    [B, S] (first chunk) or hidden [B, S, d] fp32 ([B, S/tp, d] under sequence
    parallelism); output: hidden fp32, or logits fp32 [B, S, V] ([B, S, V/tp] with tp), V the
    padded vocabulary (runtimes.padded_vocab)."""

    def __init__(self, spec: ModelSpec, layers: list[int], first: bool, last: bool, ctx: BuildCtx,
                 embed: Optional[nn.Embedding] = None):
        super().__init__()
        self.spec, self.layer_ids, self.first, self.last = spec, list(layers), first, last
        self.bf16 = ctx.dtype == "bf16"
        self.tp = tp = ctx.tp
        v_local = tp.shard(padded_vocab(spec.vocab_size), "vocab_size")
        need_embed = first or (last and spec.tied_embeddings)
        if need_embed:
            if embed is None:
                embed = nn.Embedding(v_local, spec.hidden_size)
                mark_shard(embed.weight, 0, tp)
            self.embed = embed
        self.layers = nn.ModuleDict({str(i): Block(spec, i, ctx) for i in layers})
        if last:
            self.norm = make_norm(spec.norm, spec.hidden_size, tp, partial=tp.sp)
            if not spec.tied_embeddings:
                self.head = nn.Linear(spec.hidden_size, v_local, bias=False)
                mark_shard(self.head.weight, 0, tp)
        self.times = timing.Acc()

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids [B, S] -> hidden; with tp, rows outside this rank's vocabulary slice
        are zero and the sum over tp is the residual stream's layout (tp.exit)."""
        tp = self.tp
        if tp.size == 1:
            return self.embed(ids)
        n = self.embed.weight.shape[0]
        local = ids - tp.rank * n
        inside = (local >= 0) & (local < n)
        x = self.embed(local.clamp(0, n - 1)) * inside.unsqueeze(-1)
        return tp.exit(x)

    def moe_layers(self) -> dict[int, MoELayer]:
        return {int(i): b.moe for i, b in self.layers.items() if hasattr(b, "moe")}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            if self.first:
                x = self._embed(x)
            x = timing.start(x, self.times)
            for blk in self.layers.values():
                x = blk(x)
            if self.last:
                h = self.tp.enter(self.norm(x))
                w = self.embed.weight if self.spec.tied_embeddings else self.head.weight
                x = F.linear(h, w)
            return timing.end(x.float(), self.times)


def _seed_of(seed: int, name: str) -> int:
    return int(hashlib.sha256(f"{seed}:{name}".encode()).hexdigest()[:15], 16)


def _init_tensor(t: torch.Tensor, name: str, seed: int, num_layers: int) -> None:
    """Deterministic init of one (logical) tensor, independent of layout and rank."""
    leaf = name.rsplit(".", 1)[-1]
    if "norm" in name and leaf == "weight":
        t.fill_(1.0)
        return
    if leaf == "bias":
        t.zero_()
        return
    std = 0.02
    if {"wo", "w2"} & set(name.split(".")):  # attention, FFN and expert output projections
        std /= math.sqrt(2 * num_layers)  # GPT-2 scaled residual projections
    g = torch.Generator().manual_seed(_seed_of(seed, name))
    t.copy_(torch.randn(t.shape, generator=g) * std)


@torch.no_grad()
def init_params(chunk: Chunk, seed: int) -> None:
    """Initialise every parameter of `chunk` by its global (logical) name."""
    L = chunk.spec.num_layers
    for name, p in chunk.named_parameters():
        if EXPERT_TAG in name:
            prefix, wname = name.split(EXPERT_TAG)
            layer = int(prefix.split(".")[1])
            logical = chunk.layers[str(layer)].moe.dispatcher.placement.local_experts(
                chunk.layers[str(layer)].moe.dispatcher.ep_rank)
            for slot, e in enumerate(logical):
                buf = torch.empty(p.shape[1:])
                _init_tensor(buf, f"{prefix}{EXPERT_TAG}{e}.{wname}", seed, L)
                p[slot].copy_(buf)
        else:
            buf = torch.empty(logical_shape(p))
            _init_tensor(buf, name, seed, L)
            p.copy_(local_slice(buf, p))


def build_chunk(spec: ModelSpec, layers: list[int], first: bool, last: bool, ctx: BuildCtx,
                seed: int, device: torch.device | str = "cpu", embed: Optional[nn.Embedding] = None) -> Chunk:
    """One pipeline chunk with initialised weights on `device`. Pass `embed` to share the
    first chunk's embedding with a last chunk on the same rank (tied, V schedules)."""
    c = Chunk(spec, layers, first, last, ctx, embed=embed)
    init_params(c, seed)
    return c.to(device)


def build_full(spec: ModelSpec, ctx: BuildCtx, seed: int, device="cpu") -> Chunk:
    """The whole model as one chunk on one rank (ep must be 1): the reference."""
    return build_chunk(spec, list(range(spec.num_layers)), True, True, ctx, seed, device)
