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


def cross_entropy_loss(pred, labels):
    """torchtitan's loss (torchtitan/components/loss.py cross_entropy_loss): fp32 cross-entropy over
    the LM head's logits."""
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))


def partitioned_saves(fn, *args) -> list[tuple[torch.Tensor, bool]]:
    """What torch.compile saves of `fn`'s forward for its backward, called on `args`: the forward
    graph AOTAutograd's min_cut_rematerialization_partition leaves with Inductor's decompositions
    (what Inductor runs; only the code generation is left out, so it runs on any CPU). Returns
    (fake value, is a graph input) for each saved tensor, the forward's one output excluded."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table

    graphs = []

    def forward_graph(gm, _example):
        graphs.append(gm)
        return gm.forward

    backend = aot_autograd(fw_compiler=forward_graph, bw_compiler=lambda gm, _example: gm.forward,
                           partition_fn=min_cut_rematerialization_partition, decompositions=select_decomp_table())
    torch._dynamo.reset()
    torch.compile(fn, backend=backend, fullgraph=True)(*args)
    out = next(n for n in graphs[0].graph.nodes if n.op == "output").args[0]
    vals = [(n.meta.get("val"), n.op == "placeholder") for n in out[1:]]
    return [(v, inp) for v, inp in vals if isinstance(v, torch.Tensor)]


def tp_op_sac_saves(shape, tp: int, sp: bool, gated: bool = True) -> int:
    """Bytes torch.compile saves (partitioned_saves) of one tensor-parallel rank's block under
    torchtitan's per-op policy: the block above on `shape` (dim, heads, kv_heads, head_dim, tokens,
    ffn) with its heads and FFN split over `tp` ranks of a fake process group (torch's
    FakeProcessGroup: collectives traced, not run), its row-parallel outputs all-reduced or, with
    sequence parallelism (`sp`), reduce-scattered and its norms' outputs all-gathered, as torchtitan's
    parallelize_llama lays it out; `gated` False: a GELU FFN of w1 and w2. The block input is counted,
    the weights and rotary table are not. Initialises the default process group: run it alone in a
    process."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.utils.checkpoint import checkpoint

    dist.init_process_group("fake", rank=0, world_size=tp, store=FakeStore())
    group = dist.group.WORLD
    d, h, kv, hd, t, f = shape
    bf = torch.bfloat16
    local = {"wq": (h // tp * hd, d), "wk": (kv // tp * hd, d), "wv": (kv // tp * hd, d), "wo": (d, h // tp * hd),
             "w1": (f // tp, d), "w3": (f // tp, d), "w2": (d, f // tp)}
    weights = {k: torch.randn(*s, dtype=bf, requires_grad=True) for k, s in local.items()}
    norms = RMSNorm(d).to(bf), RMSNorm(d).to(bf)
    gather = (lambda y: funcol.all_gather_tensor(y, 1, group)) if sp else (lambda y: y)  # noqa: E731

    def reduce(y):
        if tp == 1:
            return y
        return funcol.reduce_scatter_tensor(y, "sum", 1, group) if sp else funcol.all_reduce(y, "sum", group)

    def block(x, cis, w):
        a = gather(norms[0](x))
        n = a.shape[1]
        q, k, v = (F.linear(a, w[p]).view(1, n, -1, hd) for p in ("wq", "wk", "wv"))
        q, k = apply_rotary_emb(q, k, cis)
        k, v = repeat_kv(k, h // kv), repeat_kv(v, h // kv)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        hh = x + reduce(F.linear(o.transpose(1, 2).contiguous().view(1, n, -1), w["wo"]))
        b = gather(norms[1](hh))
        mid = F.silu(F.linear(b, w["w1"])) * F.linear(b, w["w3"]) if gated else F.gelu(F.linear(b, w["w1"]))
        return hh + reduce(F.linear(mid, w["w2"]))

    context_fn, _, _ = op_sac_context()
    x = torch.randn(1, t // tp if sp else t, d, dtype=bf, requires_grad=True)

    def run(x, cis, *ws):
        return checkpoint(block, x, cis, dict(zip(weights, ws)), use_reentrant=False, context_fn=context_fn)

    try:
        saves = partitioned_saves(run, x, freqs_cis(hd, t), *weights.values())
    finally:
        dist.destroy_process_group()
    return sum(v.numel() * v.element_size() for v, is_input in saves if not is_input) + x.numel() * x.element_size()


if __name__ == "__main__":  # imported by eager_bytes.py, float8_sac.py and tests; nothing of its own to run
    import sys

    print("benchmarks/native_block.py: a helper module (torchtitan's block, imported by eager_bytes.py and "
          "float8_sac.py), not a benchmark; nothing to run", file=sys.stderr)
    sys.exit(2)
