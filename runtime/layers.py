"""Dense building blocks of the decoder: norms, rotary embedding, attention (MHA/GQA and
MLA), feed-forward (SwiGLU or GELU). Shapes: x [B, S, d], or [B, S/tp, d] on a sequence
shard under sequence parallelism.

With tensor parallelism (tp.py) attention keeps heads/tp query heads per rank (column-
parallel Q, K, V and up-projections, row-parallel output projection) and the FFN f/tp of
its width (column-parallel gate/up, row-parallel down). Key/value heads are sharded when
tp divides them; when tp > kv heads (allowed by the planner when kv heads divide tp) every
rank keeps the whole (small) K/V weights and computes only the one head its query heads
use, a partial-gradient parameter summed over tp. MLA's down-projections and their norms
are replicated (as in Megatron-Core, "duplicated" linears), also partial-gradient."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from piper_plan.specs.model import ModelSpec

from .tp import TP, mark_partial, mark_shard


def make_norm(kind: str, d: int, tp: Optional[TP] = None, partial: bool = False) -> nn.Module:
    """partial: the norm sees a sequence shard or a tp-partial gradient (sum over tp)."""
    n = nn.RMSNorm(d, eps=1e-6) if kind == "rmsnorm" else nn.LayerNorm(d, eps=1e-5)
    if tp is not None:
        for p in n.parameters():
            mark_partial(p, tp, partial)
    return n


def _col(lin: nn.Linear, tp: TP) -> nn.Linear:
    """Column-parallel: this rank holds rows (outputs) [rank·n, (rank+1)·n) of the logical weight."""
    mark_shard(lin.weight, 0, tp)
    if lin.bias is not None:
        mark_shard(lin.bias, 0, tp)
    return lin


def _row(lin: nn.Linear, tp: TP) -> nn.Linear:
    """Row-parallel: this rank holds input columns; the bias is added after the reduction."""
    mark_shard(lin.weight, 1, tp)
    mark_partial(lin.bias, tp, tp.sp)
    return lin


def _row_out(lin: nn.Linear, h: torch.Tensor, tp: TP) -> torch.Tensor:
    """h @ Wᵀ over this rank's input slice, reduced over tp, then the bias."""
    if tp.size == 1:
        return lin(h)
    y = tp.exit(F.linear(h, lin.weight))
    return y if lin.bias is None else y + lin.bias


def compute_input(x: torch.Tensor) -> torch.Tensor:
    """A block's input in autocast's dtype, cast once. Autocast caches weight casts, not
    activation casts: each linear reading an fp32 input (q, k and v; gate and up) would cast and
    save a copy of its own (benchmarks/memory_check.py counts what a block saves); cast before
    the tensor-parallel gather, the sequence all-gather also moves half the bytes."""
    dev = x.device.type
    if not torch.is_autocast_enabled(dev) or not x.is_floating_point():
        return x
    dt = torch.get_autocast_dtype(dev)
    return x if x.dtype == dt else x.to(dt)


def rope_tables(seq: int, dim: int, theta: float = 10000.0):
    """cos, sin [seq, dim/2] for rotary embedding on pairs (x[2i], x[2i+1]) (RoFormer)."""
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    ang = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    return ang.cos(), ang.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, S, D] (D even) rotated by position."""
    S = x.shape[-2]
    c, s = cos[:S].to(x.dtype), sin[:S].to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)


class Attention(nn.Module):
    """Causal self-attention, MHA or GQA (num_kv_heads < num_heads), rotary positions,
    torch's scaled_dot_product_attention."""

    def __init__(self, spec: ModelSpec, seq: int, tp: Optional[TP] = None):
        super().__init__()
        tp = tp or TP()
        d, H, KV, hd, b = spec.hidden_size, spec.num_heads, spec.kv_heads, spec.hd, spec.linear_bias
        self.tp = tp
        self.H = tp.shard(H, "num_heads")
        # kv_rows: None when K/V are sharded; else this rank's rows of the replicated K/V weights
        self.kv_rows: Optional[slice] = None
        if KV % tp.size == 0:
            self.KV = KV // tp.size
            kv_out = self.KV * hd
        elif tp.size % KV == 0:
            self.KV = 1
            head = tp.rank // (tp.size // KV)
            self.kv_rows = slice(head * hd, (head + 1) * hd)
            kv_out = KV * hd
        else:
            raise ValueError(f"tp = {tp.size} neither divides nor is a multiple of kv heads = {KV}")
        self.hd = hd
        self.wq = _col(nn.Linear(d, self.H * hd, bias=b), tp)
        self.wk = nn.Linear(d, kv_out, bias=b)
        self.wv = nn.Linear(d, kv_out, bias=b)
        for lin in (self.wk, self.wv):
            if self.kv_rows is None:
                _col(lin, tp)
            else:
                mark_partial(lin.weight, tp)
                mark_partial(lin.bias, tp)
        self.wo = _row(nn.Linear(self.H * hd, d, bias=b), tp)
        cos, sin = rope_tables(seq, hd - hd % 2)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def core(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.KV != self.H)

    def _kv(self, lin: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        if self.kv_rows is None:
            return lin(x)
        b = None if lin.bias is None else lin.bias[self.kv_rows]
        return F.linear(x, lin.weight[self.kv_rows], b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.tp.enter(compute_input(x))
        B, S, _ = x.shape
        q = self.wq(x).view(B, S, self.H, self.hd).transpose(1, 2)
        k = self._kv(self.wk, x).view(B, S, self.KV, self.hd).transpose(1, 2)
        v = self._kv(self.wv, x).view(B, S, self.KV, self.hd).transpose(1, 2)
        q, k = apply_rope(q, self.cos, self.sin), apply_rope(k, self.cos, self.sin)
        o = _core(self, q, k, v)
        return _row_out(self.wo, o.transpose(1, 2).reshape(B, S, -1), self.tp)


class MLAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434 §2.1), implemented as
    written (not mapped to GQA): optional low-rank query, a shared compressed KV latent
    plus one shared rotary key, per-head up-projections. Parameter count equals
    ModelSpec.attn_params; the cache-time absorption trick is an inference optimisation
    and is not used in training."""

    def __init__(self, spec: ModelSpec, seq: int, tp: Optional[TP] = None):
        super().__init__()
        tp = tp or TP()
        m, d = spec.mla, spec.hidden_size
        H = tp.shard(spec.num_heads, "num_heads")
        self.tp = tp
        self.H, self.nope, self.rope, self.vd, self.kvr = H, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            self.wq_a = nn.Linear(d, m.q_lora_rank, bias=False)
            self.q_norm = nn.RMSNorm(m.q_lora_rank, eps=1e-6)
            self.wq_b = _col(nn.Linear(m.q_lora_rank, H * qk, bias=False), tp)
            mark_partial(self.wq_a.weight, tp)
            mark_partial(self.q_norm.weight, tp)
        else:
            self.wq = _col(nn.Linear(d, H * qk, bias=False), tp)
        self.wkv_a = nn.Linear(d, m.kv_lora_rank + m.qk_rope_head_dim, bias=False)
        self.kv_norm = nn.RMSNorm(m.kv_lora_rank, eps=1e-6)
        mark_partial(self.wkv_a.weight, tp)
        mark_partial(self.kv_norm.weight, tp)
        self.wkv_b = _col(nn.Linear(m.kv_lora_rank, H * (m.qk_nope_head_dim + m.v_head_dim), bias=False), tp)
        self.wo = _row(nn.Linear(H * m.v_head_dim, d, bias=False), tp)
        cos, sin = rope_tables(seq, max(2, m.qk_rope_head_dim - m.qk_rope_head_dim % 2))
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def core(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.tp.enter(compute_input(x))
        B, S, _ = x.shape
        # the latents' norms in fp32, as the residual stream's: their fp32 weights against autocast's
        # bf16 output had sent torch's rms_norm down its unfused path, with a warning from every rank
        q = self.wq_b(self.q_norm(self.wq_a(x).float())) if hasattr(self, "wq_a") else self.wq(x)
        q = q.view(B, S, self.H, self.nope + self.rope).transpose(1, 2)
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        c, k_pe = self.wkv_a(x).split([self.kvr, self.rope], dim=-1)
        kv = self.wkv_b(self.kv_norm(c.float())).view(B, S, self.H, self.nope + self.vd).transpose(1, 2)
        k_nope, v = kv.split([self.nope, self.vd], dim=-1)
        k_pe = k_pe.unsqueeze(1)  # one rotary key shared by the heads (none at qk_rope_head_dim 0)
        if self.rope:
            q_pe = apply_rope(q_pe, self.cos, self.sin)
            k_pe = apply_rope(k_pe, self.cos, self.sin)
        q = torch.cat([q_nope, q_pe], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(B, self.H, S, self.rope)], dim=-1)
        o = _core(self, q, k, v)
        return _row_out(self.wo, o.transpose(1, 2).reshape(B, S, -1), self.tp)


class FFN(nn.Module):
    """Dense feed-forward: SwiGLU (w1 gate, w3 up, w2 down) or GELU (w1 up, w2 down);
    with tp, f/tp of the width per rank (dense layers and the shared experts)."""

    def __init__(self, d: int, f: int, gated: bool = True, bias: bool = False, tp: Optional[TP] = None):
        super().__init__()
        tp = tp or TP()
        self.gated, self.tp = gated, tp
        fl = tp.shard(f, "ffn width")
        self.w1 = _col(nn.Linear(d, fl, bias=bias), tp)
        self.w3: Optional[nn.Linear] = _col(nn.Linear(d, fl, bias=bias), tp) if gated else None
        self.w2 = _row(nn.Linear(fl, d, bias=bias), tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.tp.enter(compute_input(x))
        h = F.silu(self.w1(x)) * self.w3(x) if self.gated else F.gelu(self.w1(x))
        return _row_out(self.w2, h, self.tp)


def _core(mod: nn.Module, q, k, v):
    """The attention core; recomputed in backward under selective recompute (Megatron's
    'selective': the score/softmax/value part, whose activations grow with s²)."""
    if getattr(mod, "recompute_core", False) and q.requires_grad:
        return checkpoint(mod.core, q, k, v, use_reentrant=False)
    return mod.core(q, k, v)


def make_attention(spec: ModelSpec, seq: int, tp: Optional[TP] = None) -> nn.Module:
    return MLAttention(spec, seq, tp) if spec.mla is not None else Attention(spec, seq, tp)
