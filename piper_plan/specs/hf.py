"""Import a Hugging Face `config.json` as a ModelSpec.

Families (keyed on `model_type`, else on `architectures[0]`): Mixtral, Qwen2-MoE / Qwen3-MoE,
DeepSeek-V2 / V3 (and Kimi K2, a DeepseekV3ForCausalLM), GLM-4.5 and later (glm4_moe), dots.llm1,
OLMoE, Granite MoE, MiniMax-M2, ERNIE 4.5, Phi-3.5-MoE (phimoe), DBRX, GPT-OSS, Llama 4 (text decoder of the multimodal config), and the
dense Llama, Mistral, Qwen2 and Qwen3.
Field names and layer-placement rules follow each family's transformers configuration and
modelling code; what ModelSpec does not carry is listed per family below (each < 0.05% of the
decoder's parameters). Only the decoder is imported: Llama 4's vision encoder (0.87B, 0.8% of
Scout's published 109B) is left out; DeepSeek-V3's multi-token-prediction module
(num_nextn_predict_layers) is imported as ModelSpec.mtp_layers.
Every problem is one SpecError line naming the file and the field; multi-token-prediction modules
a family's import leaves out (MiniMax-M2's) are named in one warning line on stderr.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import click
import numpy as np
from pydantic import ValidationError

from ..errors import SpecError, from_validation
from .model import MAX_LAYERS, MLASpec, ModelSpec, MoESpec

_MISSING = object()


def _short(v: Any) -> str:
    """repr of a bad value, cut to keep the error on one readable line."""
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


class _Cfg:
    """Typed, error-reporting access to one config dict (or its `text_config`)."""

    def __init__(self, data: dict, source: str, family: str, prefix: str = ""):
        self.data, self.source, self.family, self.prefix = data, source, family, prefix

    def _err(self, key: str, expected: str) -> SpecError:
        return SpecError(self.source, self.prefix + key, f"{expected} ({self.family} config)")

    def get(self, key: str, kind: type = int, default: Any = _MISSING, *, min_value: int = 1) -> Any:
        """The value of `key` checked against `kind`; a missing key gives `default`, or an
        error when no default is given. JSON null counts as missing."""
        v = self.data.get(key)
        if v is None:
            if default is _MISSING:
                raise self._err(key, "required field is missing")
            return default
        if kind is int:
            if isinstance(v, bool) or not isinstance(v, int):
                raise self._err(key, f"expected an integer, got {_short(v)}")
            if v < min_value:
                raise self._err(key, f"expected an integer >= {min_value}, got {v}")
        elif kind is bool:
            if not isinstance(v, bool):
                raise self._err(key, f"expected true or false, got {_short(v)}")
        elif kind is float:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise self._err(key, f"expected a positive number, got {_short(v)}")
            v = float(v)
        elif kind is str:
            if not isinstance(v, str):
                raise self._err(key, f"expected a string, got {_short(v)}")
        elif kind is list:
            if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
                raise self._err(key, f"expected a list of layer indices, got {_short(v)}")
        return v

    def stated(self, key: str, kind: type, absent: Any, *, min_value: int = 1) -> Any:
        """The value of `key` as the config's transformers class reads it: `absent` (the class's
        default) where the key is left out, None where it is null (an Optional field's "none")."""
        return self.get(key, kind, default=None, min_value=min_value) if key in self.data else absent

    def first(self, keys: tuple[str, ...], kind: type = int, default: Any = _MISSING) -> Any:
        """The first of several alias keys that is present (e.g. num_experts_per_tok / experts_per_token)."""
        for k in keys:
            if self.data.get(k) is not None:
                return self.get(k, kind)
        if default is _MISSING:
            raise self._err(keys[0], "required field is missing")
        return default


def _layer_indices(c: _Cfg, key: str, n: int, default: list) -> list:
    """A list of layer indices, each in 0..n-1 (an index past the model is a typo, not a no-op)."""
    idx = c.get(key, list, default=default)
    bad = [i for i in idx if not 0 <= i < n]
    if bad:
        raise c._err(key, f"expected layer indices 0..{n - 1}, got {bad[0]}")
    return idx


# what transformers reads for a config.json that omits num_key_value_heads, per model_type (the
# config classes' defaults: huggingface/transformers src/transformers/models/<type>/
# configuration_<type>.py @008e574, gpt_oss @02b8f42); the others (Llama, OLMoE, Granite MoE)
# fall back to num_attention_heads there too, and DeepSeek's MLA has no kv heads to count
_KV_HEADS_DEFAULT = {"mixtral": 8, "mistral": 8, "qwen2_moe": 16, "qwen3_moe": 4, "qwen2": 32, "qwen3": 32,
                     "gpt_oss": 8, "llama4": 8, "llama4_text": 8, "glm4_moe": 8, "dots1": 32, "minimax_m2": 8,
                     "ernie4_5_moe": 4, "phimoe": 8}
# ... and head_dim, where a config class states one (Qwen3Config 128, MiniMaxM2Config 128, GptOssConfig
# 64, Llama4TextConfig 128, same commits); the others (and an explicit null) take hidden / heads
_HEAD_DIM_DEFAULT = {"qwen3": 128, "minimax_m2": 128, "gpt_oss": 64, "llama4": 128, "llama4_text": 128}


def _base(c: _Cfg, mla: bool = False) -> dict:
    """Fields every decoder family shares (Llama naming). `mla`: the heads' widths are MLA's own
    (DeepSeek), so hidden_size need not divide by the heads."""
    layers = c.get("num_hidden_layers")
    if layers > MAX_LAYERS:  # before any per-layer list is built from it
        raise c._err("num_hidden_layers", f"expected at most {MAX_LAYERS}, got {layers}")
    hidden = c.get("hidden_size")
    heads = c.get("num_attention_heads")
    out = dict(num_layers=layers, hidden_size=hidden, num_heads=heads, vocab_size=c.get("vocab_size"))
    kv = c.get("num_key_value_heads", default=_KV_HEADS_DEFAULT.get(c.family, heads))
    if heads % kv:
        said = "" if c.data.get("num_key_value_heads") is not None else f" (missing: transformers' {c.family} default)"
        raise c._err("num_key_value_heads", f"must divide num_attention_heads ({heads}), got {kv}{said}")
    if kv != heads:
        out["num_kv_heads"] = kv
    head_dim = c.stated("head_dim", int, _HEAD_DIM_DEFAULT.get(c.family))
    # only a head_dim that differs from hidden/heads is a separate figure
    if head_dim is not None and head_dim * heads != hidden:
        out["head_dim"] = head_dim
    if head_dim is None and not mla and hidden % heads:
        raise c._err("hidden_size", f"must divide by num_attention_heads ({heads}) when head_dim is not given, "
                                    f"got {hidden}")
    # transformers 5 saves the RoPE settings as rope_parameters, earlier releases as rope_scaling
    for key in ("rope_scaling", "rope_parameters"):
        v = c.data.get(key)
        if v is not None and not isinstance(v, dict):
            raise c._err(key, f"expected an object, got {_short(v)}")
    key = "rope_scaling" if c.data.get("rope_scaling") else "rope_parameters"
    scaling = c.data.get(key)
    if isinstance(scaling, dict):
        for sub in ("rope_type", "type"):  # a number or a list here silently meant no YaRN
            if scaling.get(sub) is not None and not isinstance(scaling[sub], str):
                raise c._err(f"{key}.{sub}", f"expected a name such as yarn or llama3, got {_short(scaling[sub])}")
        if (scaling.get("rope_type") or scaling.get("type")) == "yarn":
            out["rope_scaling"] = "yarn"
    return out


def _local_every(local: list[bool], c: _Cfg, field: str, what: str) -> int | None:
    """ModelSpec.full_attention_every for a mask of the layers that attend locally (within a window
    or a chunk): None where none does, 0 where all do, N where the full-attention layers are every
    N-th (N-1, 2N-1, ...). Any other pattern has no form in the spec: refused, naming `field`."""
    if not any(local):
        return None
    full = [i for i, x in enumerate(local) if not x]
    if not full:
        return 0
    every = full[0] + 1
    if full != list(range(every - 1, len(local), every)):
        shown = ", ".join(map(str, full[:12])) + (", ..." if len(full) > 12 else "")
        raise c._err(field, f"expected {what} every Nth layer or in none (the only patterns modelled), got it in "
                            f"layers {shown} of {len(local)}")
    return every


def _with_window(out: dict, window: int | None, local: list[bool], c: _Cfg, field: str) -> dict:
    """Attach a sliding window of `window` tokens to the layers `local` marks (_local_every)."""
    every = _local_every(local, c, field, "full attention") if window else None
    if every is not None:
        out["sliding_window"] = window
        if every != 1:
            out["full_attention_every"] = every
    return out


def _fit_layer_pattern(mask: list[bool], c: _Cfg, field: str) -> tuple[int, int]:
    """(dense_layers, every) such that ModelSpec.layer_is_moe(i) — i >= dense_layers and
    (i - dense_layers + 1) % every == 0 — reproduces the family's MoE-layer mask."""
    n = len(mask)
    if not any(mask):
        raise c._err(field, "no layer is an MoE layer; import it as a dense model instead")
    # leading dense layers can also be the first gap of an interleave (Maverick: dense 0, every 2);
    # the first MoE layer fixes `every` for each count of leading dense layers
    first, ids = mask.index(True), np.arange(n)
    for dense in range(first + 1):
        every = first - dense + 1
        if np.array_equal(np.asarray(mask), (ids >= dense) & ((ids - dense + 1) % every == 0)):
            return dense, every
    moe = [i for i, m in enumerate(mask) if m]
    dense_ids = [i for i, m in enumerate(mask) if not m]
    kind, ids = ("MoE", moe) if len(moe) <= len(dense_ids) else ("dense", dense_ids)
    shown = ", ".join(map(str, ids[:12])) + (", ..." if len(ids) > 12 else "")
    raise c._err(field, "MoE layers must be a leading run of dense layers, then every N-th layer "
                        f"(got {kind} layers {shown} of {n})")


def _moe_block(c: _Cfg, num_experts: int, top_k: int, ffn: int, every: int = 1, **kw) -> dict:
    """A gated (SwiGLU) MoE block: every family imported here uses 3-matrix experts."""
    if top_k > num_experts:
        key = next((k for k in ("num_experts_per_tok", "experts_per_token", "moe_top_k", "moe_k") if k in c.data),
                   "num_experts_per_tok")
        raise c._err(key, f"top-k {top_k} exceeds the {num_experts} routed experts")
    moe = dict(num_experts=num_experts, top_k=top_k, expert_ffn_size=ffn, gated=True, **kw)
    if every != 1:
        moe["every"] = every
    return moe


def _with_layers(out: dict, moe: dict, dense: int, c: _Cfg, ffn_key: str) -> dict:
    """Attach the MoE block and, where some layers are dense (leading or interleaved), their
    FFN width from `ffn_key` (read only then: all-MoE configs may carry an unused value)."""
    out["moe"] = moe
    if dense:
        out["dense_layers"] = dense
    if dense or moe.get("every", 1) != 1:
        out["ffn_size"] = c.get(ffn_key)
    return out


def _tied(c: _Cfg, default: bool) -> bool:
    return c.get("tie_word_embeddings", bool, default=default)


def _mixtral(c: _Cfg) -> dict:
    # Experts: SwiGLU w1/w3/w2. sliding_window holds in every layer, as transformers' Mixtral and
    # Phimoe attention pass it (their configs default it to None: no window; Mixtral-8x7B-v0.1
    # publishes null); a window spanning max_position_embeddings or more changes nothing
    # (Phi-3.5-MoE: 131,072 of 131,072) and is left out.
    out = _base(c)
    out["moe"] = _moe_block(c, c.get("num_local_experts"), c.get("num_experts_per_tok"),
                            c.get("intermediate_size"), router="softmax")
    out["tied_embeddings"] = _tied(c, False)
    window = c.get("sliding_window", default=None)
    context = c.get("max_position_embeddings", default=None)
    if window is not None and context is not None and window >= context:
        window = None
    return _with_window(out, window, [True] * out["num_layers"], c, "sliding_window")


def _qwen_moe(c: _Cfg) -> dict:
    # transformers Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer: layer i is sparse when
    # i not in mlp_only_layers and num_experts > 0 and (i + 1) % decoder_sparse_step == 0.
    # Not modelled: Qwen2-MoE q/k/v biases and shared_expert_gate (d + 3 d per layer),
    # Qwen3-MoE per-head q_norm / k_norm weights (2 head_dim per layer).
    out = _base(c)
    n = out["num_layers"]
    step = c.get("decoder_sparse_step", default=1)
    only_mlp = set(_layer_indices(c, "mlp_only_layers", n, []))
    mask = [i not in only_mlp and (i + 1) % step == 0 for i in range(n)]
    dense, every = _fit_layer_pattern(mask, c, "mlp_only_layers" if only_mlp else "decoder_sparse_step")
    # Qwen2-MoE's one shared expert; Qwen3-MoE's block has none, whatever stray key a config holds
    # (Qwen2MoeConfig defaults its width to 5632 where a config leaves it out)
    shared_ffn = (c.get("shared_expert_intermediate_size", default=5632, min_value=0) if c.family == "qwen2_moe"
                  else 0)
    extra = dict(shared_experts=1, shared_expert_ffn_size=shared_ffn) if shared_ffn else {}
    moe = _moe_block(c, c.get("num_experts"), c.get("num_experts_per_tok"), c.get("moe_intermediate_size"),
                     every, router="softmax", **extra)
    out = _with_layers(out, moe, dense, c, "intermediate_size")
    out["tied_embeddings"] = _tied(c, False)
    return _qwen_window(c, out)


def _qwen_window(c: _Cfg, out: dict) -> dict:
    """Qwen2 / Qwen3 (dense) and Qwen2-MoE / Qwen3-MoE: a sliding window only under
    use_sliding_window (false in every release), in the layers transformers' config classes
    (configuration_<type>.py @008e574; defaults sliding_window 4096, max_window_layers 28) mark
    sliding_attention: qwen2, qwen3 layers i >= max_window_layers; qwen2_moe the even layers below
    it; qwen3_moe every layer (its config has no max_window_layers and its attention passes the
    window in each). A config's own layer_types (qwen2, qwen3, qwen2_moe) replaces the rule."""
    if not c.get("use_sliding_window", bool, default=False):
        return out
    window, n = c.stated("sliding_window", int, 4096), out["num_layers"]
    if window is None:
        return out
    field = "max_window_layers"
    if c.family == "qwen3_moe":
        local = [True] * n
    elif c.data.get("layer_types") is not None:
        types, field = c.data["layer_types"], "layer_types"
        if not (isinstance(types, list) and all(isinstance(t, str) for t in types) and len(types) == n):
            raise c._err("layer_types", f"expected {n} layer type names (one a layer)")
        local = [t == "sliding_attention" for t in types]
    else:
        m = c.get("max_window_layers", default=28, min_value=0)
        local = [i % 2 == 0 and i < m for i in range(n)] if c.family == "qwen2_moe" else [i >= m for i in range(n)]
    return _with_window(out, window, local, c, field)


# what transformers' config classes build where a config leaves these keys out (DeepseekV3Config:
# first_k_dense_replace 3, n_shared_experts 1; Glm4MoeConfig: 1 and 1; DeepseekV2Config: 0 and 2);
# other families' code defaults them to 0 / none. A trimmed config read with 0 had priced 61 MoE
# layers and no shared expert for DeepSeek-V3, 4 % more parameters than the model transformers builds.
_FIRST_DENSE_DEFAULT = {"deepseek_v3": 3, "glm4_moe": 1}
_SHARED_EXPERTS_DEFAULT = {"deepseek_v3": 1, "glm4_moe": 1, "deepseek_v2": 2}


def _first_dense(c: _Cfg) -> int:
    return c.get("first_k_dense_replace", default=_FIRST_DENSE_DEFAULT.get(c.family, 0), min_value=0)


def _deepseek(c: _Cfg) -> dict:
    # DeepseekV2/V3 modelling code: layer i is MoE when n_routed_experts is set,
    # i >= first_k_dense_replace and i % moe_layer_freq == 0; V3's MTP modules (_with_mtp).
    # Not modelled: V3's e_score_correction_bias (n_routed_experts per MoE layer).
    out = _base(c, mla=True)
    out.pop("num_kv_heads", None)  # MLA: num_key_value_heads is not a GQA figure
    out.pop("head_dim", None)
    n = out["num_layers"]
    first = _first_dense(c)
    freq = c.get("moe_layer_freq", default=1)
    mask = [i >= first and i % freq == 0 for i in range(n)]
    dense, every = _fit_layer_pattern(mask, c, "first_k_dense_replace" if first >= n else "moe_layer_freq")
    out["mla"] = dict(q_lora_rank=c.get("q_lora_rank", default=None), kv_lora_rank=c.get("kv_lora_rank"),
                      qk_nope_head_dim=c.get("qk_nope_head_dim"),
                      qk_rope_head_dim=c.get("qk_rope_head_dim", min_value=0),
                      v_head_dim=c.get("v_head_dim"))
    scoring = c.get("scoring_func", str, default="softmax")
    if scoring not in ("softmax", "sigmoid"):
        raise c._err("scoring_func", f"expected softmax or sigmoid, got {scoring!r}")
    return _with_mtp(c, _deepseek_moe(c, out, dense, every, scoring))


def _deepseek_moe(c: _Cfg, out: dict, dense: int, every: int, router: str, method: str = "") -> dict:
    """DeepSeek's MoE fields (n_routed_experts, num_experts_per_tok, moe_intermediate_size,
    n_shared_experts, n_group / topk_group; intermediate_size for the dense layers), which GLM-4.5
    and dots.llm1 keep under grouped-query attention. `method`: as _route_groups."""
    # an explicit null builds none (DeepSeek's modelling code: `if config.n_shared_experts is not None`),
    # where a key left out takes the config class's default
    shared = c.stated("n_shared_experts", int, _SHARED_EXPERTS_DEFAULT.get(c.family, 0), min_value=0) or 0
    moe = _moe_block(c, c.get("n_routed_experts"), c.get("num_experts_per_tok"), c.get("moe_intermediate_size"),
                     every, router=router, **({"shared_experts": shared} if shared else {}),
                     **_route_groups(c, method))
    out = _with_layers(out, moe, dense, c, "intermediate_size")
    out["tied_embeddings"] = _tied(c, False)
    return out


def _with_mtp(c: _Cfg, out: dict) -> dict:
    """num_nextn_predict_layers: the multi-token-prediction modules pre-training runs after the main
    model (DeepSeek-V3, GLM-4.5; ModelSpec.mtp_layers)."""
    mtp = c.get("num_nextn_predict_layers", default=0, min_value=0)
    if mtp:
        out["mtp_layers"] = mtp
    return out


# the routers DeepSeek's modelling code switches on (V2: greedy, group_limited_greedy; V3: noaux_tc)
_TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")


def _route_groups(c: _Cfg, method: str = "") -> dict:
    """DeepSeek's group-limited routing (modelling code: topk_method group_limited_greedy in V2,
    noaux_tc in V3): the routed experts form n_group groups of consecutive ids and a token picks
    its experts inside its topk_group best groups. "greedy" (V2-Lite) routes over all experts.
    `method`: the routing of a family whose code has no topk_method switch (GLM-4.5, dots.llm1)."""
    # DeepseekV3Config has no topk_method: V3's code always routes by group (noaux_tc)
    method = method or c.get("topk_method", str, default="noaux_tc" if c.family == "deepseek_v3" else "greedy")
    if method not in _TOPK_METHODS:  # a misspelt one ("noaux-tc") silently routed over every expert
        raise c._err("topk_method", f"expected one of {', '.join(_TOPK_METHODS)}, got {_short(method)}")
    if method == "greedy":
        return {}
    # missing: transformers' defaults, DeepseekV3Config's 8 groups of which 4 (configuration_deepseek_v3.py
    # @008e574), one group elsewhere (DeepseekV2Config's None, Glm4MoeConfig's 1: no limit)
    d_groups, d_limit = (8, 4) if c.family == "deepseek_v3" else (1, 1)
    groups, limit = c.get("n_group", default=d_groups), c.get("topk_group", default=d_limit)
    experts, k = c.get("n_routed_experts"), c.get("num_experts_per_tok")
    if experts % groups:
        raise c._err("n_group", f"must divide n_routed_experts ({experts}), got {groups}")
    if limit > groups:
        raise c._err("topk_group", f"must not exceed n_group ({groups}), got {limit}")
    if limit * experts // groups < k:
        raise c._err("topk_group", f"{limit} groups of {experts // groups} experts hold fewer than "
                                   f"num_experts_per_tok ({k})")
    return dict(route_groups=groups, route_group_limit=limit) if limit < groups else {}


def _llama(c: _Cfg) -> dict:
    # Llama, and the families built on its decoder layer: Mistral, Qwen2, Qwen3 (dense).
    # Mistral's sliding_window holds in every layer (arXiv 2310.06825 Table 1: window 4096;
    # transformers' MistralConfig defaults it to 4096, configuration_mistral.py @001f85b; null in
    # v0.2 and later: no window); Qwen's under use_sliding_window (_qwen_window).
    # Not modelled: Qwen2's q/k/v biases (no attention_bias key; < 0.01%), Qwen3's per-head q/k norms.
    out = _base(c)
    out["ffn_size"] = c.get("intermediate_size")
    out["tied_embeddings"] = _tied(c, False)
    # ModelSpec has one bias flag for attention and FFN; Llama configs set both alike
    # (a mismatch would miscount by (ffn + hidden) per layer, < 0.01%). Both are read, so a bad
    # second value is refused whatever the first says.
    attention_bias, mlp_bias = c.get("attention_bias", bool, default=False), c.get("mlp_bias", bool, default=False)
    if attention_bias or mlp_bias:
        out["linear_bias"] = True
    if c.family == "mistral":
        window = c.stated("sliding_window", int, 4096)
        return _with_window(out, window, [True] * out["num_layers"], c, "sliding_window")
    if c.family in ("qwen2", "qwen3"):
        return _qwen_window(c, out)
    return out


def _gpt_oss(c: _Cfg) -> dict:
    # Modelled: q/k/v/o biases (attention_bias), the alternating sliding-window layers
    # (layer_types; attention FLOPs only), the expert biases (gate_up_proj_bias, down_proj_bias:
    # their unfused adds, not their 0.03% of the parameters) and the swiglu clamp (swiglu_limit).
    # Not modelled: the router bias and the per-head attention sinks.
    out = _base(c)
    window = c.stated("sliding_window", int, 128)  # GptOssConfig's sliding_window; null: none
    types = c.data.get("layer_types")
    if types is None and window:  # GptOssConfig's default: sliding and full attention in turn, sliding first
        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(c.get("num_hidden_layers"))]
    if types is not None and not (isinstance(types, list) and all(isinstance(t, str) for t in types)):
        raise c._err("layer_types", "expected a list of layer type names")
    if types is not None and len(types) != out["num_layers"]:
        raise c._err("layer_types", f"expected one entry a layer ({out['num_layers']}), got {len(types)}")
    if window and types:
        every = _local_every([t != "full_attention" for t in types], c, "layer_types", "full_attention")
        if every is not None:
            out["sliding_window"], out["full_attention_every"] = window, every
    out["moe"] = _moe_block(c, c.first(("num_local_experts", "num_experts")),
                            c.first(("num_experts_per_tok", "experts_per_token")),
                            c.get("intermediate_size"), router="softmax", expert_bias=True)
    clamp = c.stated("swiglu_limit", float, 7.0)  # GptOssConfig's
    if clamp is not None:
        out["moe"]["glu_clamp"] = clamp
    out["tied_embeddings"] = _tied(c, False)
    if c.get("attention_bias", bool, default=True):
        out["linear_bias"] = True
    return out


def _llama4(c: _Cfg) -> dict:
    # Llama4ForConditionalGeneration keeps the decoder in text_config (the vision encoder is
    # not modelled); Llama4TextConfig.moe_layers defaults to
    # range(interleave_moe_layer_step - 1, num_hidden_layers, interleave_moe_layer_step).
    # Dense layers use intermediate_size_mlp; MoE layers have one shared expert of
    # intermediate_size and a sigmoid top-k router.
    t = c
    if "text_config" in c.data:
        tc = c.data["text_config"]
        if not isinstance(tc, dict):
            raise c._err("text_config", "expected an object")
        t = _Cfg(tc, c.source, c.family, "text_config.")
    out = _base(t)
    n = out["num_layers"]
    step = t.get("interleave_moe_layer_step", default=1)
    moe_layers = _layer_indices(t, "moe_layers", n, list(range(step - 1, n, step)))
    mask = [i in set(moe_layers) for i in range(n)]
    dense, every = _fit_layer_pattern(mask, t, "moe_layers")
    moe = _moe_block(t, t.get("num_local_experts"), t.get("num_experts_per_tok"), t.get("intermediate_size"),
                     every, shared_experts=1, router="sigmoid")
    out = _with_layers(out, moe, dense, t, "intermediate_size_mlp")
    # chunked local attention (Llama4TextConfig: attention_chunk_size 8192) in the RoPE layers;
    # the NoPE layers (no_rope_layers[i] == 0; default every no_rope_layer_interval-th, 4) attend
    # to the whole sequence
    # (null: no chunks, Llama4TextConfig's int | None)
    chunk = t.stated("attention_chunk_size", int, 8192)
    if chunk:
        n_int = t.get("no_rope_layer_interval", int, default=4)
        rope = t.data.get("no_rope_layers") or [int((i + 1) % n_int != 0) for i in range(n)]
        if not (isinstance(rope, list) and len(rope) == n and all(v in (0, 1) for v in rope)):
            raise t._err("no_rope_layers", f"expected {n} entries of 0 or 1 (1: a RoPE, chunked layer)")
        every = _local_every([v == 1 for v in rope], t, "no_rope_layers", "a NoPE (full-attention) layer")
        if every is not None:
            out["attention_chunk"], out["full_attention_every"] = chunk, every
    # the multimodal config keeps tie_word_embeddings at the top level
    out["tied_embeddings"] = t.get("tie_word_embeddings", bool, default=_tied(c, False))
    return out


def _glm4_moe(c: _Cfg) -> dict:
    # transformers Glm4MoeDecoderLayer: layer i is MoE when i >= first_k_dense_replace; its router
    # (Glm4MoeTopkRouter) is DeepSeek-V3's: sigmoid scores, group-limited top-k over n_group /
    # topk_group, whatever the config's topk_method; the shared experts are one MLP of
    # moe_intermediate_size x n_shared_experts; its MTP modules as V3's (_with_mtp).
    # Not modelled: q/k/v biases (attention_bias; o_proj has none, < 0.01%), use_qk_norm's per-head
    # norms, the partial rotary embedding (no cost of its own), e_score_correction_bias.
    return _with_mtp(c, _gqa_moe(c, "sigmoid", "noaux_tc"))


def _dots1(c: _Cfg) -> dict:
    # transformers Dots1 (rednote-hilab dots.llm1): DeepSeek-V3's MoE (sigmoid router, shared
    # experts, first_k_dense_replace) with grouped-query attention instead of MLA; its config's
    # scoring_func is not read by the modelling code. Not modelled: per-head q/k norms.
    return _gqa_moe(c, "sigmoid", "noaux_tc")


def _gqa_moe(c: _Cfg, router: str, method: str) -> dict:
    """DeepSeek's MoE (_deepseek_moe) in every layer from first_k_dense_replace on, under ordinary
    grouped-query attention."""
    out = _base(c)
    first = _first_dense(c)
    dense, every = _fit_layer_pattern([i >= first for i in range(out["num_layers"])], c, "first_k_dense_replace")
    return _deepseek_moe(c, out, dense, every, router, method)


def _olmoe(c: _Cfg) -> dict:
    # transformers OlmoeDecoderLayer: every layer is MoE, softmax router, experts of
    # intermediate_size. Not modelled: the q/k norms over the whole projection (2 d per layer).
    out = _base(c)
    out["moe"] = _moe_block(c, c.get("num_experts"), c.get("num_experts_per_tok"), c.get("intermediate_size"),
                            router="softmax")
    out["tied_embeddings"] = _tied(c, False)
    return out


def _granitemoe(c: _Cfg) -> dict:
    # transformers GraniteMoe / GraniteMoeShared: every layer is MoE (softmax over the top-k logits),
    # experts of intermediate_size; GraniteMoeShared adds one shared MLP of shared_intermediate_size
    # (0: none). The embedding / residual / attention / logit multipliers cost nothing measurable.
    out = _base(c)
    shared = c.get("shared_intermediate_size", default=0, min_value=0)
    extra = dict(shared_experts=1, shared_expert_ffn_size=shared) if shared else {}
    out["moe"] = _moe_block(c, c.get("num_local_experts"), c.get("num_experts_per_tok"),
                            c.get("intermediate_size"), router="softmax", **extra)
    out["tied_embeddings"] = _tied(c, False)  # GraniteMoeConfig's default; the releases state true
    return out


def _minimax_m2(c: _Cfg) -> dict:
    # transformers MiniMaxM2: every layer is MoE with a sigmoid router (plus e_score_correction_bias),
    # experts of intermediate_size, grouped-query attention of head_dim. Not modelled: the per-layer
    # q/k norms, the partial rotary embedding, and the multi-token-prediction modules of the release
    # config (use_mtp, num_mtp_modules): transformers' model does not build them and their structure
    # is not published, so the import says it leaves them out (_warn_dropped_mtp).
    out = _base(c)
    types, n = c.data.get("attn_type_list"), out["num_layers"]
    if types is not None and (not isinstance(types, list) or any(t != 1 for t in types)):
        raise c._err("attn_type_list", "expected full softmax attention (1) in every layer; lightning attention "
                                       "(MiniMax-01's 0) is not modelled")
    if types is not None and len(types) != n:
        raise c._err("attn_type_list", f"expected one entry a layer ({n}), got {len(types)}")
    out["moe"] = _moe_block(c, c.get("num_local_experts"), c.get("num_experts_per_tok"), c.get("intermediate_size"),
                            router="sigmoid")
    out["tied_embeddings"] = _tied(c, False)
    return out


def _phimoe(c: _Cfg) -> dict:
    # transformers Phimoe (Phi-3.5-MoE): Mixtral's layout (every layer MoE, SwiGLU experts w1/w3/w2 of
    # intermediate_size) with LayerNorm. Its SparseMixer router picks the top 2 of a softmax, priced
    # as Mixtral's. Not modelled: the q/k/v/o biases (attention_bias) and the LM head's bias
    # (lm_head_bias): 2 d + 2 kv-width + vocab per model, < 0.01 %.
    out = _mixtral(c)
    out["norm"] = "layernorm"
    return out


def _sub(c: _Cfg, key: str) -> _Cfg:
    """A nested config block (DBRX's attn_config / ffn_config) with the same checks; absent or
    null reads as {} (transformers builds the block's defaults then)."""
    v = c.data.get(key)
    if v is None:
        v = {}
    if not isinstance(v, dict):
        raise c._err(key, f"expected an object, got {_short(v)}")
    return _Cfg(v, c.source, c.family, prefix=f"{c.prefix}{key}.")


def _dbrx(c: _Cfg) -> dict:
    # transformers DbrxConfig: d_model / n_heads / n_layers at the top, attention in attn_config
    # (kv_n_heads, default 1), experts in ffn_config (ffn_hidden_size, moe_num_experts, moe_top_k;
    # defaults 3584 / 4 / 1). Every layer is MoE with GLU experts (w1, v1, w2), a softmax router whose
    # top-k weights are renormalised, and bias-free LayerNorm. Not modelled: clip_qkv (a clamp).
    attn, ffn = _sub(c, "attn_config"), _sub(c, "ffn_config")
    layers = c.first(("n_layers", "num_hidden_layers"))
    if layers > MAX_LAYERS:
        raise c._err("n_layers", f"expected at most {MAX_LAYERS}, got {layers}")
    hidden, heads = c.first(("d_model", "hidden_size")), c.first(("n_heads", "num_attention_heads"))
    if hidden % heads:  # in DBRX's own names, not ModelSpec's
        key = "d_model" if c.data.get("d_model") is not None else "hidden_size"
        raise c._err(key, f"must divide by n_heads ({heads}), got {hidden}")
    out = dict(num_layers=layers, hidden_size=hidden, num_heads=heads, vocab_size=c.get("vocab_size"))
    kv = attn.get("kv_n_heads", default=1)
    if heads % kv:
        raise attn._err("kv_n_heads", f"must divide n_heads ({heads}), got {kv}")
    if kv != heads:
        out["num_kv_heads"] = kv
    act = ffn.data.get("ffn_act_fn")
    if act is not None and not (isinstance(act, dict) and act.get("name", "silu") == "silu"):
        raise ffn._err("ffn_act_fn", f"expected {{'name': 'silu'}} (DBRX's GLU experts), got {_short(act)}")
    out["moe"] = _moe_block(ffn, ffn.get("moe_num_experts", default=4), ffn.get("moe_top_k", default=1),
                            ffn.get("ffn_hidden_size", default=3584), router="softmax")
    out["norm"] = "layernorm"
    out["tied_embeddings"] = _tied(c, False)
    return out


def _ernie4_5_moe(c: _Cfg) -> dict:
    # transformers Ernie4_5_MoeDecoderLayer: layer i is MoE when (i + 1) % moe_layer_interval == 0
    # and moe_layer_start_index <= i <= moe_layer_end_index (-1: the last layer, as its config
    # resolves it), else a dense MLP of intermediate_size; the router a softmax whose top-k is
    # chosen on the probabilities plus e_score_correction_bias; the shared experts one MLP of
    # moe_intermediate_size x moe_num_shared_experts; tied embeddings unless the config unties
    # them. MTP modules (num_nextn_predict_layers) as DeepSeek's (_with_mtp) but each a dense
    # block of intermediate_size (mtp_dense): Baidu's modelling code builds mtp_block from decoder
    # layers of index 0, below moe_layer_start_index (PaddleFormers ernie4_5_moe modeling_moe.py,
    # its tensor-parallel map naming only mtp_block.0.mlp), as vLLM's ernie_mtp.py does (a
    # LlamaDecoderLayer); transformers does not build them, the released PT checkpoints carry
    # them. Not modelled: use_bias (false in
    # the releases), the interleaved (GLM-style) RoPE pairing (no cost of its own).
    out = _base(c)
    n = out["num_layers"]
    start = c.get("moe_layer_start_index", default=1, min_value=0)
    end = c.get("moe_layer_end_index", default=-1, min_value=-1)
    if end >= n:
        raise c._err("moe_layer_end_index", f"expected -1 or a layer index 0..{n - 1}, got {end}")
    end = n - 1 if end == -1 else end
    interval = c.get("moe_layer_interval", default=1)
    mask = [(i + 1) % interval == 0 and start <= i <= end for i in range(n)]
    # a run of dense layers after the MoE ones has no form in the spec: the end index is at fault
    dense, every = _fit_layer_pattern(mask, c, "moe_layer_end_index" if end < n - 1 else "moe_layer_start_index")
    shared = c.get("moe_num_shared_experts", default=2, min_value=0)  # Ernie4_5_MoeConfig's default
    width = c.get("moe_intermediate_size")
    extra = dict(shared_experts=1, shared_expert_ffn_size=width * shared) if shared else {}
    moe = _moe_block(c, c.get("moe_num_experts"), c.get("moe_k"), width, every, router="softmax", **extra)
    out = _with_layers(out, moe, dense, c, "intermediate_size")
    out["tied_embeddings"] = _tied(c, True)
    out = _with_mtp(c, out)
    if out.get("mtp_layers"):
        out["ffn_size"] = c.get("intermediate_size")  # the MTP block's width, dense layers or none
        out["mtp_dense"] = True
    return out


_FAMILIES: dict[str, Callable[[_Cfg], dict]] = {
    "mixtral": _mixtral,
    "qwen2_moe": _qwen_moe, "qwen3_moe": _qwen_moe,
    "deepseek_v2": _deepseek, "deepseek_v3": _deepseek,
    "llama": _llama, "mistral": _llama, "qwen2": _llama, "qwen3": _llama,
    "gpt_oss": _gpt_oss,
    "llama4": _llama4, "llama4_text": _llama4,
    "glm4_moe": _glm4_moe, "dots1": _dots1, "olmoe": _olmoe, "granitemoe": _granitemoe,
    "granitemoeshared": _granitemoe, "minimax_m2": _minimax_m2, "ernie4_5_moe": _ernie4_5_moe,
    "phimoe": _phimoe, "dbrx": _dbrx,
}
_ARCHITECTURES = {
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe", "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV2ForCausalLM": "deepseek_v2", "DeepseekV3ForCausalLM": "deepseek_v3",
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "GptOssForCausalLM": "gpt_oss",
    "Llama4ForConditionalGeneration": "llama4", "Llama4ForCausalLM": "llama4_text",
    "Glm4MoeForCausalLM": "glm4_moe", "Dots1ForCausalLM": "dots1", "OlmoeForCausalLM": "olmoe",
    "GraniteMoeForCausalLM": "granitemoe", "GraniteMoeSharedForCausalLM": "granitemoeshared",
    "MiniMaxM2ForCausalLM": "minimax_m2", "Ernie4_5_MoeForCausalLM": "ernie4_5_moe",
    "PhimoeForCausalLM": "phimoe", "PhiMoEForCausalLM": "phimoe", "DbrxForCausalLM": "dbrx",
}


# families whose layers the spec cannot describe: refused with the reason, not priced as another
_UNMODELLED = {
    "qwen3_next": "its Gated DeltaNet linear-attention layers", "qwen3_5": "its Gated DeltaNet linear-attention layers",
    "qwen3_5_moe": "its Gated DeltaNet linear-attention layers",
    "deepseek_v32": "DeepSeek Sparse Attention (the lightning indexer and top-k key selection)",
    "glm_moe_dsa": "DeepSeek Sparse Attention (the lightning indexer and top-k key selection)",
    "minimax": "its lightning (linear) attention layers",
    "jamba": "its Mamba layers", "granitemoehybrid": "its Mamba layers", "nemotron_h": "its Mamba layers",
    "kimi_linear": "its Kimi Delta Attention (linear) layers",
    "longcat_flash": "its zero-computation experts and shortcut-connected MoE",
}

# keys that give attention a form ModelSpec cannot hold, whatever the config's model_type says (a
# DeepSeek-V3.2 config relabelled deepseek_v3 had been priced as dense MLA, without a word)
_UNMODELLED_KEYS = {
    "index_topk": "DeepSeek Sparse Attention's indexer (top-k key selection)",
    "linear_attn_config": "linear-attention layers",
    "full_attention_interval": "linear-attention layers between the full-attention ones",
}
_MODELLED_LAYER_TYPES = ("full_attention", "sliding_attention")
# Llama 4's chunked local attention (Llama4TextConfig builds layer_types from no_rope_layers;
# the importer reads the chunks from attention_chunk_size and no_rope_layers)
_FAMILY_LAYER_TYPES = {"llama4": ("chunked_attention",), "llama4_text": ("chunked_attention",)}


def _refuse_unmodelled_keys(cfg: dict, source: str, family: str, prefix: str = "") -> None:
    """One line naming the first key (at the top or under text_config; `prefix`: where `cfg`
    itself sits in the file) whose layers ModelSpec has no form for: sparse or linear attention,
    or a layer_types entry other than the attention the family's importer reads (mamba,
    linear_attention)."""
    known = _MODELLED_LAYER_TYPES + _FAMILY_LAYER_TYPES.get(family, ())
    for part, at in ((cfg, prefix), (cfg.get("text_config"), prefix + "text_config.")):
        if not isinstance(part, dict):
            continue
        for key, what in _UNMODELLED_KEYS.items():
            if part.get(key) is not None:
                raise SpecError(source, at + key, f"{what} is not modelled (ModelSpec has no form for it)")
        types = part.get("layer_types")
        if isinstance(types, list):
            other = sorted({t for t in types if isinstance(t, str) and t not in known})
            if other:
                raise SpecError(source, at + "layer_types", f"{other[0]!r} layers are not modelled (expected "
                                                            f"{' or '.join(known)})")


_HUNYUAN = ("hunyuan", "hunyuan_v1_moe")


def _hunyuan(cfg: dict, source: str) -> SpecError:
    """Why a Hunyuan config (Tencent's remote-code HunYuan, model_type hunyuan; transformers'
    HunYuanMoEV1, hunyuan_v1_moe) is refused: the features of its config that no importer reads,
    cross-layer attention only where use_cla is on (Hunyuan-Large; Hunyuan-A13B has it off)."""
    mt = cfg.get("model_type")
    if cfg.get("use_cla") is True:
        return SpecError(source, "use_cla", "cross-layer attention (layers sharing their key/value projections) "
                                            "is not modelled (hunyuan config)")
    lists = [k for k in ("moe_topk", "moe_intermediate_size", "num_shared_expert") if isinstance(cfg.get(k), list)]
    why = [f"its per-layer MoE lists ({', '.join(lists)}; ModelSpec has one MoE block for all layers)"] if lists else []
    if cfg.get("use_mixed_mlp_moe") is True:
        why.append("use_mixed_mlp_moe's shared MLP beside the experts")
    what = " or ".join(why) or "its config"
    return SpecError(source, "model_type", f"{mt!r} is not modelled: no importer reads {what}")


def _unmodelled(source: str, field: str, mt: str) -> SpecError:
    return SpecError(source, field, f"{mt!r} is not modelled: ModelSpec has no form for {_UNMODELLED[mt]}")


def _family(cfg: dict, source: str) -> tuple[str, dict, str]:
    """(family, the dict its fields are read from, that dict's prefix in the file): the config's
    own model_type, else its architectures[0]; else, for a type no importer reads, the decoder it
    keeps in text_config where that decoder's type is one (a multimodal wrapper: Kimi-K2.5's
    kimi_k25 around a deepseek_v3), said in a warning. Refused in one line otherwise."""
    mt = cfg.get("model_type")
    if mt is not None and not isinstance(mt, str):
        raise SpecError(source, "model_type", f"expected a string, got {_short(mt)}")
    if mt in _HUNYUAN:
        raise _hunyuan(cfg, source)
    if isinstance(mt, str) and mt in _FAMILIES:
        return mt, cfg, ""
    if isinstance(mt, str) and mt in _UNMODELLED:
        raise _unmodelled(source, "model_type", mt)
    archs = _architectures(cfg, source, "")
    if archs and archs[0] in _ARCHITECTURES:
        return _ARCHITECTURES[archs[0]], cfg, ""
    text = cfg.get("text_config")
    inner = text.get("model_type") if isinstance(text, dict) and mt is not None else None
    if isinstance(inner, str) and inner in _UNMODELLED:  # the wrapped decoder is one no spec describes
        raise _unmodelled(source, "text_config.model_type", inner)
    if isinstance(text, dict) and mt is not None and not (isinstance(inner, str) and inner in _FAMILIES):
        # a decoder typed by its own name but built from a family's class (Kimi-K2.5's text_config:
        # model_type kimi_k2, architectures DeepseekV3ForCausalLM), as at the top level
        inner_archs = _architectures(text, source, "text_config.")
        inner = _ARCHITECTURES.get(inner_archs[0]) if inner_archs else inner
    if isinstance(inner, str) and inner in _FAMILIES:
        click.echo(f"warning: {source}: model_type {mt!r} keeps a {inner} decoder in text_config: the spec and "
                   f"its plans price that language model, not the vision tower", err=True)
        return inner, text, "text_config."
    supported = ", ".join(sorted(_FAMILIES))
    if mt is None and not archs:
        raise SpecError(source, "model_type", f"required field is missing (supported: {supported})")
    got = mt if mt is not None else archs
    raise SpecError(source, "model_type", f"unsupported model {got!r} (supported: {supported})")


def _architectures(cfg: dict, source: str, prefix: str) -> list[str]:
    """The config's `architectures` (transformers' class names), [] where absent; anything but a
    list of names is refused, naming the field."""
    archs = cfg.get("architectures")
    if archs is None:
        return []
    if not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise SpecError(source, prefix + "architectures", f"expected a list of class names such as "
                                                         f"[\"MixtralForCausalLM\"], got {_short(archs)}")
    return archs


def _name(cfg: dict, source: str) -> str:
    p = Path(source)
    if p.stem and p.stem.lower() != "config":
        return p.stem
    if p.parent.name:
        return p.parent.name
    n = cfg.get("_name_or_path")
    return n.rsplit("/", 1)[-1] if isinstance(n, str) and n else "hf-model"


def model_from_hf_config(cfg: dict, source: str) -> ModelSpec:
    """A ModelSpec from a parsed HF config.json; `source` names the file in errors and in
    the spec's `source` field. seq_len keeps ModelSpec's default (4096): a config's
    max_position_embeddings is the longest context, not a training length; but no longer than
    that context, where it is shorter (a 2,048-token model trained on its own length)."""
    if not isinstance(cfg, dict):
        raise SpecError(source, "<root>", "expected a JSON object (a Hugging Face config.json)")
    name = _name(cfg, source)
    family, cfg, prefix = _family(cfg, source)
    _refuse_unmodelled_keys(cfg, source, family, prefix)
    c = _Cfg(cfg, source, family, prefix)
    fields = _FAMILIES[family](c)
    fields.update(name=name, source=f"HF config.json {source} ({family})")
    context = c.first(("max_position_embeddings", "max_seq_len"), default=None)  # (DBRX: max_seq_len)
    if context is not None and context < ModelSpec.model_fields["seq_len"].default:
        fields.setdefault("seq_len", context)
    try:
        spec = ModelSpec.model_validate(fields)
    except ValidationError as e:
        raise _validation_error(source, family, e) from None
    _warn_dropped_mtp(cfg, source, family, spec)
    return spec


# keys a config.json counts its multi-token-prediction modules under (DeepSeek-V3 / GLM-4.5 / ERNIE
# 4.5: num_nextn_predict_layers; MiniMax-M2: num_mtp_modules under use_mtp; Qwen3-Next:
# mtp_num_hidden_layers; Megatron-Bridge exports: mtp_num_layers)
_MTP_KEYS = ("num_nextn_predict_layers", "num_mtp_modules", "mtp_num_hidden_layers", "mtp_num_layers")


def _warn_dropped_mtp(cfg: dict, source: str, family: str, spec: ModelSpec) -> None:
    """One warning line on stderr where the config has multi-token-prediction modules the spec
    leaves out (MiniMax-M2's use_mtp / num_mtp_modules): the plan prices the model without them,
    which pre-training with them would not be."""
    if spec.mtp_layers or cfg.get("use_mtp") is False:
        return
    keys = [k for k in _MTP_KEYS if isinstance(cfg.get(k), int) and not isinstance(cfg[k], bool) and cfg[k] > 0]
    if not keys:
        return
    count = cfg[keys[0]]
    keys = (["use_mtp"] if cfg.get("use_mtp") is True else []) + keys
    click.echo(f"warning: {source}: {', '.join(keys)}: {count} multi-token-prediction module(s) left out (not "
               f"modelled for {family}): the spec and its plans price the model without them", err=True)


def _validation_error(source: str, family: str, err: ValidationError) -> SpecError:
    """ModelSpec's refusal of an imported figure in the importer's own form: the key the config.json
    spells, the range allowed where a bound was broken, and the family tag."""
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e.get("loc", ()))
    if e.get("type") in ("less_than_equal", "greater_than_equal") and loc:
        lo, hi = _bounds(loc)
        allowed = f"in {lo}..{hi}" if lo is not None and hi is not None else f">= {lo}" if hi is None else f"<= {hi}"
        return SpecError(source, _HF_NAMES.get(loc, loc), f"expected an integer {allowed}, got "
                                                          f"{_short(e.get('input'))} ({family} config)")
    out = from_validation(source, err, _HF_NAMES)
    return SpecError(out.source, out.field, f"{out.expected} ({family} config)")


def _bounds(loc: str) -> tuple[Any, Any]:
    """(ge, le) of a ModelSpec field by its dotted path ("moe.num_experts"); None where unbounded."""
    *outer, name = loc.split(".")
    model = {"moe": MoESpec, "mla": MLASpec}.get(outer[-1], ModelSpec) if outer else ModelSpec
    info = model.model_fields.get(name)
    got = {type(m).__name__: m for m in (info.metadata if info else ())}
    return getattr(got.get("Ge"), "ge", None), getattr(got.get("Le"), "le", None)


# ModelSpec fields as the config.json keys they are read from say them (the usual spellings; a
# family with its own names is named after the slash)
_HF_NAMES = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
             "num_kv_heads": "num_key_value_heads", "ffn_size": "intermediate_size",
             "moe.expert_ffn_size": "moe_intermediate_size / intermediate_size",
             "moe.num_experts": "n_routed_experts / num_local_experts / num_experts",
             "moe.top_k": "num_experts_per_tok", "mtp_layers": "num_nextn_predict_layers",
             "moe.shared_experts": "n_shared_experts", "dense_layers": "first_k_dense_replace"}
