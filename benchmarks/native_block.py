"""torchtitan's dense Llama block as its 64-A100 presets ran it in 2024, for counting the bytes
its eager modules move (benchmarks/eager_bytes.py --solve-native; cost/eager.py NATIVE).

Transcribed from pytorch/torchtitan torchtitan/models/llama/model.py (apply_rotary_emb,
repeat_kv, Attention, FeedForward, TransformerBlock's forward; read at 0199cbc) and
torchtitan/models/norms.py's RMSNorm (read at 026e23a), the norm_type "rmsnorm" that the
presets name (train_configs/llama2_13b.toml and llama3_8b.toml: "NOTE: this toml config is a
preset for 64 A100 GPUs", norm_type = "rmsnorm", compile = false). FSDP2's mixed precision
(param_dtype bf16) hands the block bf16 weights, so the whole block runs in bf16 without
autocast; the norm and RoPE compute in fp32 inside, as the code says. Only the dense block is
here: the 2024 presets train dense Llama 2 and Llama 3."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        return self._norm(x.float()).type_as(x) * self.weight


def freqs_cis(head_dim: int, seq: int, theta: float = 10000.0) -> torch.Tensor:
    """precompute_freqs_cis: complex64 (seq, head_dim / 2)."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    return torch.polar(torch.ones(seq, head_dim // 2), torch.outer(torch.arange(seq).float(), freqs))


def apply_rotary_emb(xq, xk, cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    cis = cis[: xq_.shape[1]].view(1, xq_.shape[1], 1, xq_.shape[-1])
    return torch.view_as_real(xq_ * cis).flatten(3).type_as(xq), torch.view_as_real(xk_ * cis).flatten(3).type_as(xk)


def repeat_kv(x, n_rep: int):
    bs, slen, n_kv, hd = x.shape
    if n_rep == 1:
        return x
    return torch.unsqueeze(x, dim=3).expand(bs, slen, n_kv, n_rep, hd).reshape(bs, slen, n_kv * n_rep, hd)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, head_dim: int):
        super().__init__()
        self.n_rep, self.head_dim = heads // kv_heads, head_dim
        self.wq = nn.Linear(dim, heads * head_dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.wo = nn.Linear(heads * head_dim, dim, bias=False)

    def forward(self, x, cis):
        bs, seqlen, _ = x.shape
        xq = self.wq(x).view(bs, seqlen, -1, self.head_dim)
        xk = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, cis)
        keys, values = repeat_kv(xk, self.n_rep), repeat_kv(xv, self.n_rep)
        out = F.scaled_dot_product_attention(xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                             is_causal=True)
        return self.wo(out.transpose(1, 2).contiguous().view(bs, seqlen, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """`dim` hidden size, `heads` / `kv_heads` attention heads of `head_dim`, `ffn` the SwiGLU's width."""

    def __init__(self, dim: int, heads: int, kv_heads: int, head_dim: int, ffn: int):
        super().__init__()
        self.attention = Attention(dim, heads, kv_heads, head_dim)
        self.feed_forward = FeedForward(dim, ffn)
        self.attention_norm, self.ffn_norm = RMSNorm(dim), RMSNorm(dim)

    def forward(self, x, cis):
        h = x + self.attention(self.attention_norm(x), cis)
        return h + self.feed_forward(self.ffn_norm(h))


def op_sac_context(save_cpu_attention: bool = True):
    """torchtitan's per-op selective activation checkpointing for one block, as a checkpoint
    context_fn: torchtitan/distributed/activation_checkpoint.py's _get_custom_policy over its
    _op_sac_save_list (aten.mm, the SDPA kernels, _c10d_functional.reduce_scatter_tensor, aten.max),
    every second aten.mm of the block recomputed. `save_cpu_attention` adds the CPU's name for the
    flash kernel (a GPU runs _scaled_dot_product_flash_attention, which the list holds). Returns
    (context_fn, made, rerun): the forward contexts made (their .storage holds what each forward
    saved) and the output shapes of the aten.mm the forward left for the backward to re-run (torch's
    SAC decides in the forward and replays those)."""
    from collections import defaultdict

    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    save = {torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_efficient_attention.default,
            torch.ops.aten._scaled_dot_product_flash_attention.default,
            torch.ops.aten._scaled_dot_product_cudnn_attention.default,
            torch.ops._c10d_functional.reduce_scatter_tensor.default, torch.ops.aten.max.default}
    if save_cpu_attention:
        save.add(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default)
    made, rerun = [], []

    def policy(meta, ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == torch.ops.aten.mm.default:
            meta[f"{mode}_mm_count"] += 1
            if not ctx.is_recompute and meta[f"{mode}_mm_count"] % 2 == 0:  # left for the backward to re-run
                rerun.append((args[0].shape[0], args[1].shape[1]))
        # saves the output of every op on the list but every second mm
        keep = func in save and not (func == torch.ops.aten.mm.default and meta[f"{mode}_mm_count"] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    def context_fn():  # a count of mm a checkpoint call, as torchtitan's selective_checkpointing_context_fn
        from functools import partial

        fwd, rec = create_selective_checkpoint_contexts(partial(policy, defaultdict(int)))
        made.append(fwd)
        return fwd, rec

    return context_fn, made, rerun
