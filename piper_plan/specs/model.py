"""ModelSpec: what a user describes about a (Mixture-of-Experts) decoder-only transformer.

All sizes are element counts (not bytes). Parameter and FLOP counts derived here are the
ones every other module uses; formulas name their source.
"""
from __future__ import annotations

from functools import cached_property
from typing import Literal, Optional

import numpy as np
from pydantic import Field, model_validator

from .base import _Optional, _Strict


# Upper bounds on sizes: far beyond any published model (4,096 layers; widths to 2**20; a
# 16M-token vocabulary or sequence), finite so a typo cannot overflow the cost model's integer
# arithmetic or keep it looping over a billion layers.
MAX_LAYERS, MAX_WIDTH, MAX_HEADS, MAX_EXPERTS = 4096, 1 << 20, 1 << 16, 1 << 16
MAX_VOCAB = MAX_SEQ = 1 << 24


class MLASpec(_Strict):
    """Multi-head latent attention (DeepSeek-V2/V3, arXiv 2405.04434 §2.1)."""

    q_lora_rank: Optional[int] = Field(None, ge=1, le=MAX_WIDTH, description="query compression rank; null = no q compression")
    kv_lora_rank: int = Field(..., ge=1, le=MAX_WIDTH)
    qk_nope_head_dim: int = Field(..., ge=1, le=MAX_WIDTH)
    qk_rope_head_dim: int = Field(..., ge=0, le=MAX_WIDTH)
    v_head_dim: int = Field(..., ge=1, le=MAX_WIDTH)


class MoESpec(_Optional):
    _OMIT_AT_DEFAULT = ("route_groups", "route_group_limit", "expert_bias", "glu_clamp")

    num_experts: int = Field(..., ge=1, le=MAX_EXPERTS, description="routed experts per MoE layer")
    top_k: int = Field(..., ge=1)
    expert_ffn_size: int = Field(..., ge=1, le=MAX_WIDTH, description="hidden width of one routed expert")
    shared_experts: int = Field(0, ge=0, le=MAX_EXPERTS)
    shared_expert_ffn_size: Optional[int] = Field(None, ge=1, le=MAX_WIDTH, description="width of one shared expert (default expert_ffn_size)")
    gated: bool = Field(True, description="3-matrix SwiGLU expert (true) or 2-matrix up/down expert (false)")
    router: Literal["softmax", "sigmoid"] = "softmax"
    every: int = Field(1, ge=1, le=MAX_LAYERS, description="an MoE layer every N layers after the leading dense ones (Llama 4 Maverick: 2)")
    route_groups: Optional[int] = Field(
        None, ge=1, description="group-limited routing (DeepSeek-V2/V3 n_group): the experts form this many "
        "groups of consecutive ids, and a token's top-k experts come from route_group_limit of them")
    route_group_limit: Optional[int] = Field(None, ge=1, description="groups a token may route to (topk_group)")
    expert_bias: bool = Field(False, description="routed experts' linears carry biases (GPT-OSS); priced as "
                              "Megatron-Core adds fc2's: per local expert, in fp32, outside the GEMM (cost.compute)")
    glu_clamp: Optional[float] = Field(None, gt=0, description="the gated expert's input is clamped to this "
                                       "magnitude before its activation (GPT-OSS swiglu_limit 7.0): separate "
                                       "clamp and concatenate kernels in Megatron-Core")

    @model_validator(mode="after")
    def _k(self):
        if self.shared_expert_ffn_size is not None and not self.shared_experts:
            raise ValueError("shared_expert_ffn_size needs shared_experts > 0 (no shared expert to be that wide)")
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) must not exceed num_experts ({self.num_experts})")
        if (self.route_groups is None) != (self.route_group_limit is None):
            raise ValueError("route_groups and route_group_limit go together")
        if self.route_groups is not None:
            if self.num_experts % self.route_groups:
                raise ValueError(f"route_groups ({self.route_groups}) must divide num_experts ({self.num_experts})")
            if self.route_group_limit > self.route_groups:
                raise ValueError(f"route_group_limit ({self.route_group_limit}) exceeds route_groups "
                                 f"({self.route_groups})")
            if self.route_group_limit * self.num_experts // self.route_groups < self.top_k:
                raise ValueError(f"route_group_limit ({self.route_group_limit}) groups hold fewer than top_k "
                                 f"({self.top_k}) experts")
        return self

    @property
    def group_limited(self) -> bool:
        """Routing confines a token to fewer groups than there are."""
        return self.route_groups is not None and self.route_group_limit < self.route_groups

    @property
    def routing_groups(self) -> tuple[int, int]:
        """(groups, groups a token may use) as the routing cost functions take them (cost.routing):
        (1, 1) when routing is not group-limited."""
        return (self.route_groups, self.route_group_limit) if self.group_limited else (1, 1)

    @property
    def shared_ffn(self) -> int:
        return self.shared_expert_ffn_size or self.expert_ffn_size

    @property
    def matrices(self) -> int:
        return 3 if self.gated else 2


class ModelSpec(_Optional):
    _OMIT_AT_DEFAULT = ("rope_scaling", "attention_chunk", "mtp_dense")  # specs without them dump (and hash) as before

    name: str = Field(min_length=1)
    source: str = Field("", description="where the architecture figures come from")
    num_layers: int = Field(..., ge=1, le=MAX_LAYERS)
    hidden_size: int = Field(..., ge=1, le=MAX_WIDTH)
    num_heads: int = Field(..., ge=1, le=MAX_HEADS)
    num_kv_heads: Optional[int] = Field(None, ge=1, le=MAX_HEADS, description="GQA key/value heads (default num_heads)")
    head_dim: Optional[int] = Field(None, ge=1, le=MAX_WIDTH, description="default hidden_size / num_heads")
    mla: Optional[MLASpec] = None
    vocab_size: int = Field(..., ge=1, le=MAX_VOCAB)
    seq_len: int = Field(4096, ge=1, le=MAX_SEQ, description="default training sequence length, tokens")
    ffn_size: int = Field(0, ge=0, le=MAX_WIDTH, description="dense FFN width (dense layers; 0 if every layer is MoE)")
    ffn_gated: bool = Field(True, description="dense FFN is SwiGLU (3 matrices) rather than GELU (2)")
    dense_layers: int = Field(0, ge=0, le=MAX_LAYERS, description="leading dense layers before the first MoE layer")
    moe: Optional[MoESpec] = None
    tied_embeddings: bool = False
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    linear_bias: bool = Field(False, description="biases on attention/FFN linears (GPT-2/Megatron GPT)")
    rope_scaling: Optional[Literal["yarn"]] = Field(
        None, description="YaRN-scaled RoPE (HF rope_scaling.rope_type yarn: GPT-OSS, DeepSeek-V2/V3). Megatron fuses "
        "RoPE only for its plain 'rope' position embedding (Megatron-LM arguments.py; Megatron-Bridge "
        "utils/fusions.validate_rope_fusion_compatibility), so a YaRN model without MLA applies it with Megatron-Core's "
        "unfused PyTorch ops (cost.compute); MLA applies its own")
    sliding_window: Optional[int] = Field(None, ge=1, le=MAX_SEQ, description="attention window, tokens, of the windowed layers")
    attention_chunk: Optional[int] = Field(
        None, ge=1, le=MAX_SEQ, description="chunked local attention (Llama 4's attention_chunk_size): the "
        "windowed layers attend causally within aligned chunks of this many tokens, not a sliding window")
    full_attention_every: int = Field(1, ge=0, description="with sliding_window or attention_chunk: every Nth layer "
                                      "attends to the whole sequence, the others within the window or chunk "
                                      "(GPT-OSS: 2; Llama 4: 4, its NoPE layers); 0: no layer does, every layer is "
                                      "local (Mistral-7B-v0.1's 4,096-token window)")
    learned_positions: bool = Field(False, description="learned absolute position table of seq_len × hidden (Megatron GPT)")
    mtp_layers: int = Field(0, ge=0, le=MAX_LAYERS, description="multi-token-prediction modules after the last layer (DeepSeek-V3: "
                            "1): each a block like the last layer, a 2d→d projection and 3 norms, sharing the "
                            "embedding and LM head, whose logits it computes again")
    mtp_dense: bool = Field(False, description="each MTP module's block is a dense layer of ffn_size whatever the "
                            "last layer is (ERNIE 4.5: its mtp_block is a decoder layer of index 0, below "
                            "moe_layer_start_index)")

    @model_validator(mode="after")
    def _check(self):
        if self.moe is None and self.ffn_size == 0:
            raise ValueError("a dense model needs ffn_size > 0")
        if self.moe is not None and self.dense_layers > 0 and self.ffn_size == 0:
            raise ValueError("dense_layers > 0 needs ffn_size > 0")
        if self.moe is not None and self.moe.every > 1 and self.ffn_size == 0:
            raise ValueError("moe.every > 1 interleaves dense layers, which need ffn_size > 0")
        if self.dense_layers > self.num_layers:
            raise ValueError("dense_layers exceeds num_layers")
        if self.moe is None and self.dense_layers:
            raise ValueError("dense_layers counts the leading dense layers of a MoE model; a dense model has no moe")
        if self.mla is not None and self.head_dim is not None:
            raise ValueError("head_dim is unused with mla (its widths are mla's qk_nope/qk_rope/v_head_dim)")
        if self.mtp_dense and (self.mtp_layers == 0 or self.ffn_size == 0):
            raise ValueError("mtp_dense needs mtp_layers > 0 and ffn_size > 0 (the dense block's width)")
        local = self.sliding_window is not None or self.attention_chunk is not None
        if self.sliding_window is not None and self.attention_chunk is not None:
            raise ValueError("sliding_window and attention_chunk are two kinds of local attention: give one")
        if local and self.full_attention_every > self.num_layers:
            raise ValueError(f"full_attention_every ({self.full_attention_every}) exceeds num_layers ({self.num_layers})")
        if not local and self.full_attention_every != 1:
            raise ValueError("full_attention_every needs sliding_window or attention_chunk (which layers are local; "
                             "without either every layer attends to the whole sequence)")
        if self.moe is not None and self.dense_layers + self.moe.every > self.num_layers:
            raise ValueError(f"no layer is an MoE layer ({self.dense_layers} leading dense layers, then one MoE "
                             f"layer every {self.moe.every}, in {self.num_layers} layers)")
        kv = self.num_kv_heads or self.num_heads
        if self.num_heads % kv:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({kv})")
        if self.mla is None and self.head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must divide by num_heads when head_dim is not given")
        return self

    # ---- shape helpers -------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    def layer_is_moe(self, i: int) -> bool:
        """Layer i (0-based) is an MoE layer: after the leading dense ones, every `moe.every`-th."""
        if self.moe is None or i < self.dense_layers:
            return False
        return (i - self.dense_layers + 1) % self.moe.every == 0

    @cached_property
    def moe_layer_mask(self) -> tuple[bool, ...]:
        return tuple(self.layer_is_moe(i) for i in range(self.num_layers))

    @property
    def num_moe_layers(self) -> int:
        return sum(self.moe_layer_mask)

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    # ---- parameter counts (elements) ------------------------------------------------
    @property
    def attn_params(self) -> int:
        """Attention weights of one layer. GQA: q/o d·H·hd, k/v d·KV·hd each.
        MLA (DeepSeek-V2 §2.1): optional q down/up, kv down (incl. shared rope key), kv up, out."""
        d, H = self.hidden_size, self.num_heads
        if self.mla is not None:
            m = self.mla
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            q = d * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * H * qk if m.q_lora_rank else d * H * qk
            kv = d * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank + m.kv_lora_rank * H * (m.qk_nope_head_dim + m.v_head_dim)
            return q + kv + H * m.v_head_dim * d
        p = d * H * self.hd * 2 + d * self.kv_heads * self.hd * 2
        if self.linear_bias:
            p += H * self.hd + 2 * self.kv_heads * self.hd + d
        return p

    def attn_params_whole(self, tp):
        """Attention weights of one layer that every one of `tp` tensor-parallel ranks holds whole
        (tp: a degree or an array of them); the rest splits over tp. MLA: the q and kv
        down-projections and their norms (Megatron-Core's "duplicated" linears, piper-train's
        too). GQA where tp exceeds the kv heads: the key and value projections, which piper-train
        keeps whole on each rank and multiplies by its own head's rows (Megatron-Core refuses tp
        beyond the kv heads). With biases, the output projection's too (a row-parallel layer adds
        it once, after the reduction)."""
        tp = np.asarray(tp)
        d = self.hidden_size
        if self.mla is not None:
            m = self.mla
            q = d * m.q_lora_rank + m.q_lora_rank if m.q_lora_rank else 0
            return np.full(tp.shape, float(q + d * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank))
        kv = 2 * self.kv_heads * self.hd * (d + self.linear_bias)
        return np.where(tp > self.kv_heads, float(kv), 0.0) + d * self.linear_bias

    def attn_params_per_rank(self, tp):
        """Attention weights of one layer on one of `tp` tensor-parallel ranks (attn_params_whole)."""
        whole = self.attn_params_whole(tp)
        return (self.attn_params - whole) / np.asarray(tp, dtype=float) + whole

    def kv_heads_per_rank(self, tp):
        """Key/value heads on one of `tp` tensor-parallel ranks: kv_heads / tp, but at least one
        (where tp exceeds GQA's kv heads a rank computes its own head's key and value)."""
        return np.maximum(self.kv_heads / np.asarray(tp, dtype=float), 1.0)

    def qkv_dim_per_rank(self, tp):
        """qkv_dim on one of `tp` tensor-parallel ranks: where tp exceeds GQA's kv heads a rank
        computes its own head's key and value (one head each), not kv_heads / tp of one."""
        tp = np.asarray(tp, dtype=float)
        if self.mla is not None:
            return self.qkv_dim / tp
        return self.hd * (self.num_heads / tp + 2 * self.kv_heads_per_rank(tp))

    @property
    def attn_out_dim(self) -> int:
        """Width of the attention output (input of the output projection)."""
        return self.num_heads * (self.mla.v_head_dim if self.mla else self.hd)

    @property
    def qkv_dim(self) -> int:
        """Width of the stored q, k, v activations per token (before TP split)."""
        if self.mla is not None:
            m = self.mla
            return self.num_heads * (2 * (m.qk_nope_head_dim + m.qk_rope_head_dim) + m.v_head_dim)
        return self.hd * (self.num_heads + 2 * self.kv_heads)

    @property
    def norm_params(self) -> int:
        return self.hidden_size * (2 if self.norm == "layernorm" else 1)

    @property
    def dense_ffn_params(self) -> int:
        d, f = self.hidden_size, self.ffn_size
        p = (3 if self.ffn_gated else 2) * d * f
        if self.linear_bias:
            p += f * (2 if self.ffn_gated else 1) + d
        return p

    @property
    def dense_ffn_whole(self) -> int:
        """Dense FFN weights every tensor-parallel rank holds whole: the down projection's bias."""
        return self.hidden_size * self.linear_bias if self.ffn_size else 0

    @property
    def expert_params(self) -> int:
        """One routed expert: 3·d·f (SwiGLU) or 2·d·f (brief §2)."""
        assert self.moe is not None
        return self.moe.matrices * self.hidden_size * self.moe.expert_ffn_size

    @property
    def shared_params(self) -> int:
        if self.moe is None:
            return 0
        return self.moe.shared_experts * self.moe.matrices * self.hidden_size * self.moe.shared_ffn

    @property
    def router_params(self) -> int:
        return 0 if self.moe is None else self.hidden_size * self.moe.num_experts

    @property
    def dense_layer_params(self) -> int:
        return self.attn_params + self.dense_ffn_params + 2 * self.norm_params

    @property
    def moe_layer_nonexpert_params(self) -> int:
        """Parameters of an MoE layer that every rank of the stage replicates (attention,
        norms, router, shared experts)."""
        return self.attn_params + 2 * self.norm_params + self.router_params + self.shared_params

    @property
    def moe_layer_expert_params(self) -> int:
        return 0 if self.moe is None else self.moe.num_experts * self.expert_params

    @property
    def embedding_params(self) -> int:
        return (self.vocab_size + self.seq_len * self.learned_positions) * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    @property
    def param_tensors(self) -> dict[str, int]:
        """Parameter tensors (not elements) per part, as a PyTorch runtime holds them: one per
        weight and bias, each norm 1 (RMSNorm) or 2 (LayerNorm), a layer's routed experts as
        one stacked tensor per matrix (2 or 3, however many experts a rank holds). Eager
        optimizers pay a host cost per tensor (Efficiency.optimizer_tensor_us). Keys:
        dense_layer, moe_replicated (attention, norms, router, shared experts), moe_experts,
        embedding, head (0 when tied), final_norm."""
        b = 2 if self.linear_bias else 1
        norm = 2 if self.norm == "layernorm" else 1
        if self.mla is not None:  # q (down, norm, up or one matrix), kv down, kv norm, kv up, out
            attn = (3 if self.mla.q_lora_rank else 1) + 4
        else:
            attn = 4 * b
        ffn = (3 if self.ffn_gated else 2) * b if self.ffn_size else 0
        moe = self.moe
        shared = moe.matrices if moe is not None and moe.shared_experts else 0
        return {"dense_layer": attn + 2 * norm + ffn,
                "moe_replicated": attn + 2 * norm + 1 + shared if moe is not None else 0,
                "moe_experts": moe.matrices if moe is not None else 0,
                "embedding": 1 + int(self.learned_positions), "head": 0 if self.tied_embeddings else 1,
                "final_norm": norm}

    @property
    def mtp_is_moe(self) -> bool:
        """A multi-token-prediction block is the kind of the model's last layer (DeepSeek-V3's
        checkpoint: layer 61, the MTP block, holds routed experts like layers 3-60), unless the
        spec says it is dense (mtp_dense)."""
        return not self.mtp_dense and self.layer_is_moe(self.num_layers - 1)

    @property
    def mtp_extra_params(self) -> int:
        """One MTP module beyond its block (DeepSeek-V3 §2.2, Megatron-Core's
        MultiTokenPredictionLayer): the projection of [norm(h); norm(emb)] from 2d to d, and
        three norms (hnorm, enorm, the module's final norm); embedding and head are shared."""
        return 2 * self.hidden_size * self.hidden_size + 3 * self.norm_params

    def _mtp_block_params(self, experts_per_token: bool = False) -> int:
        """One MTP module's block, a layer of the last layer's kind: all its experts, or with
        `experts_per_token` the top-k a token touches."""
        if not self.mtp_is_moe:
            return self.dense_layer_params
        experts = self.moe.top_k * self.expert_params if experts_per_token else self.moe_layer_expert_params
        return self.moe_layer_nonexpert_params + experts

    @property
    def mtp_params(self) -> int:
        """All MTP modules: block + projection + norms each."""
        return self.mtp_layers * (self._mtp_block_params() + self.mtp_extra_params)

    @property
    def total_params(self) -> int:
        return (
            self.num_dense_layers * self.dense_layer_params
            + self.num_moe_layers * (self.moe_layer_nonexpert_params + self.moe_layer_expert_params)
            + self.embedding_params + self.lm_head_params + self.norm_params + self.mtp_params
        )

    @property
    def active_params(self) -> int:
        """Parameters touched by one token: top-k of the routed experts, embedding included
        (Mistral, Qwen and Meta count it so; DeepSeek and OpenAI leave the input embedding out)."""
        act_moe = 0 if self.moe is None else self.moe.top_k * self.expert_params
        return (
            self.num_dense_layers * self.dense_layer_params
            + self.num_moe_layers * (self.moe_layer_nonexpert_params + act_moe)
            + self.embedding_params + self.lm_head_params + self.norm_params
            + self.mtp_layers * (self._mtp_block_params(experts_per_token=True) + self.mtp_extra_params)
        )

    # ---- FLOPs (forward, per token, model FLOPs) -----------------------------------
    @property
    def qk_v_dims(self) -> tuple[int, int]:
        if self.mla is not None:
            return self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim, self.mla.v_head_dim
        return self.hd, self.hd

    def attended_keys(self, seq):
        """Keys a query attends to under causal masking, averaged over queries and layers:
        s/2 for full attention (brief §9: causal counted as half); w·(1 − w/2s) inside a
        window w < s; (q·c² + r²)/2s in aligned chunks of c (s = q·c + r: each chunk is a causal
        sequence of its own). Works on numpy arrays of seq."""
        import numpy as np

        s = np.asarray(seq, dtype=float)
        if self.sliding_window is not None:
            w = np.minimum(float(self.sliding_window), s)
            local = w * (1.0 - w / (2.0 * s))
        elif self.attention_chunk is not None:
            c = float(self.attention_chunk)
            q = np.floor(s / c)
            local = (q * c * c + (s - q * c) ** 2) / (2.0 * s)
        else:
            return 0.5 * s
        full = self.full_layers / self.num_layers
        return full * 0.5 * s + (1.0 - full) * local

    @property
    def full_layers(self) -> int:
        """Layers that attend to the whole sequence: every full_attention_every-th with local
        attention (none where it is 0), all without."""
        if self.sliding_window is None and self.attention_chunk is None:
            return self.num_layers
        return self.num_layers // self.full_attention_every if self.full_attention_every else 0

    def attn_core_flops(self, seq: int, causal: bool = True) -> float:
        """Score and value matmuls per token per layer (average over layers), forward:
        2·keys·H·(d_qk + d_v) with keys = attended_keys(s) when causal, s when not."""
        dqk, dv = self.qk_v_dims
        keys = float(self.attended_keys(seq)) if causal else float(seq)
        return 2.0 * keys * self.num_heads * (dqk + dv)

    def flops_per_token(self, seq: Optional[int] = None, causal: bool = True) -> float:
        """Model FLOPs per token for forward + backward (3× forward): 6·active matmul
        params + attention core; embedding lookup excluded, LM head included. Each MTP module
        adds its block, its projection and the shared LM head's matmul again (as Megatron-Core
        counts them: DeepSeek-V3 260 GFLOP a token with one module, 250 without)."""
        s = seq or self.seq_len
        mtp = self.mtp_layers
        # the LM head is a matmul even when its weight is the (tied) embedding; MTP runs it again
        norms = self.norm_params * (2 * (self.num_layers + mtp) + 1) + mtp * 3 * self.norm_params
        matmul = (self.active_params - self.embedding_params - norms
                  + self.vocab_size * self.hidden_size * (self.tied_embeddings + mtp))
        fwd = 2.0 * matmul + (self.num_layers + mtp) * self.attn_core_flops(s, causal)
        return 3.0 * fwd

    def layer_breakdown(self, seq: Optional[int] = None) -> list[dict]:
        """Per-layer-kind parameters and forward FLOPs per token (for show-spec)."""
        s = seq or self.seq_len
        rows = [
            dict(part="embedding", count=1, params=self.embedding_params, fwd_flops=0.0),
            dict(part="attention", count=self.num_layers, params=self.attn_params,
                 fwd_flops=2.0 * self.attn_params + self.attn_core_flops(s)),
        ]
        if self.num_dense_layers and self.ffn_size:
            rows.append(dict(part="dense FFN", count=self.num_dense_layers, params=self.dense_ffn_params,
                             fwd_flops=2.0 * self.dense_ffn_params))
        if self.moe is not None:
            m = self.moe
            rows.append(dict(part="router", count=self.num_moe_layers, params=self.router_params,
                             fwd_flops=2.0 * self.router_params))
            rows.append(dict(part=f"routed experts ({m.num_experts}, top-{m.top_k})", count=self.num_moe_layers,
                             params=self.moe_layer_expert_params, fwd_flops=2.0 * m.top_k * self.expert_params))
            if m.shared_experts:
                rows.append(dict(part=f"shared experts ({m.shared_experts})", count=self.num_moe_layers,
                                 params=self.shared_params, fwd_flops=2.0 * self.shared_params))
        rows.append(dict(part="LM head" + (" (tied)" if self.tied_embeddings else ""), count=1,
                         params=self.lm_head_params, fwd_flops=2.0 * self.vocab_size * self.hidden_size))
        if self.mtp_layers:
            per_token = self.flops_per_token(s) / 3.0 - self._without_mtp().flops_per_token(s) / 3.0
            rows.append(dict(part="MTP module (block, projection, head again)", count=self.mtp_layers,
                             params=self.mtp_params // self.mtp_layers, fwd_flops=per_token / self.mtp_layers))
        return rows

    def _without_mtp(self) -> "ModelSpec":
        return self.model_copy(update={"mtp_layers": 0})
