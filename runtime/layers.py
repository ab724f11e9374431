"""Dense building blocks of the decoder: norms, rotary embedding, attention (MHA/GQA and
MLA), feed-forward (SwiGLU or GELU). Shapes: x [B, S, d]."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from piper_plan.specs.model import ModelSpec


def make_norm(kind: str, d: int) -> nn.Module:
    return nn.RMSNorm(d, eps=1e-6) if kind == "rmsnorm" else nn.LayerNorm(d, eps=1e-5)


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

    def __init__(self, spec: ModelSpec, seq: int):
        super().__init__()
        d, H, KV, hd, b = spec.hidden_size, spec.num_heads, spec.kv_heads, spec.hd, spec.linear_bias
        self.H, self.KV, self.hd = H, KV, hd
        self.wq = nn.Linear(d, H * hd, bias=b)
        self.wk = nn.Linear(d, KV * hd, bias=b)
        self.wv = nn.Linear(d, KV * hd, bias=b)
        self.wo = nn.Linear(H * hd, d, bias=b)
        cos, sin = rope_tables(seq, hd - hd % 2)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def core(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.KV != self.H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, _ = x.shape
        q = self.wq(x).view(B, S, self.H, self.hd).transpose(1, 2)
        k = self.wk(x).view(B, S, self.KV, self.hd).transpose(1, 2)
        v = self.wv(x).view(B, S, self.KV, self.hd).transpose(1, 2)
        q, k = apply_rope(q, self.cos, self.sin), apply_rope(k, self.cos, self.sin)
        o = _core(self, q, k, v)
        return self.wo(o.transpose(1, 2).reshape(B, S, -1))


class MLAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434 §2.1), implemented as
    written (not mapped to GQA): optional low-rank query, a shared compressed KV latent
    plus one shared rotary key, per-head up-projections. Parameter count equals
    ModelSpec.attn_params; the cache-time absorption trick is an inference optimisation
    and is not used in training."""

    def __init__(self, spec: ModelSpec, seq: int):
        super().__init__()
        m, d, H = spec.mla, spec.hidden_size, spec.num_heads
        self.H, self.nope, self.rope, self.vd, self.kvr = H, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            self.wq_a = nn.Linear(d, m.q_lora_rank, bias=False)
            self.q_norm = nn.RMSNorm(m.q_lora_rank, eps=1e-6)
            self.wq_b = nn.Linear(m.q_lora_rank, H * qk, bias=False)
        else:
            self.wq = nn.Linear(d, H * qk, bias=False)
        self.wkv_a = nn.Linear(d, m.kv_lora_rank + m.qk_rope_head_dim, bias=False)
        self.kv_norm = nn.RMSNorm(m.kv_lora_rank, eps=1e-6)
        self.wkv_b = nn.Linear(m.kv_lora_rank, H * (m.qk_nope_head_dim + m.v_head_dim), bias=False)
        self.wo = nn.Linear(H * m.v_head_dim, d, bias=False)
        cos, sin = rope_tables(seq, max(2, m.qk_rope_head_dim - m.qk_rope_head_dim % 2))
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def core(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, _ = x.shape
        q = self.wq_b(self.q_norm(self.wq_a(x))) if hasattr(self, "wq_a") else self.wq(x)
        q = q.view(B, S, self.H, self.nope + self.rope).transpose(1, 2)
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        c, k_pe = self.wkv_a(x).split([self.kvr, self.rope], dim=-1)
        kv = self.wkv_b(self.kv_norm(c)).view(B, S, self.H, self.nope + self.vd).transpose(1, 2)
        k_nope, v = kv.split([self.nope, self.vd], dim=-1)
        if self.rope:
            q_pe = apply_rope(q_pe, self.cos, self.sin)
            k_pe = apply_rope(k_pe.unsqueeze(1), self.cos, self.sin).expand(B, self.H, S, self.rope)
        q = torch.cat([q_nope, q_pe], dim=-1)
        k = torch.cat([k_nope, k_pe], dim=-1)
        o = _core(self, q, k, v)
        return self.wo(o.transpose(1, 2).reshape(B, S, -1))


class FFN(nn.Module):
    """Dense feed-forward: SwiGLU (w1 gate, w3 up, w2 down) or GELU (w1 up, w2 down)."""

    def __init__(self, d: int, f: int, gated: bool = True, bias: bool = False):
        super().__init__()
        self.gated = gated
        self.w1 = nn.Linear(d, f, bias=bias)
        self.w3: Optional[nn.Linear] = nn.Linear(d, f, bias=bias) if gated else None
        self.w2 = nn.Linear(f, d, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x)))


def _core(mod: nn.Module, q, k, v):
    """The attention core; recomputed in backward under selective recompute (Megatron's
    'selective': the score/softmax/value part, whose activations grow with s²)."""
    if getattr(mod, "recompute_core", False) and q.requires_grad:
        return checkpoint(mod.core, q, k, v, use_reentrant=False)
    return mod.core(q, k, v)


def make_attention(spec: ModelSpec, seq: int) -> nn.Module:
    return MLAttention(spec, seq) if spec.mla is not None else Attention(spec, seq)
