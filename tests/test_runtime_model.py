"""Single-process pieces of the runtime: model shapes from a spec, router, experts, data,
checkpoint atomicity."""
from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from piper_plan.specs.registry import load_model  # noqa: E402
from piper_runtime.data import DataError, SyntheticTokens, open_tokens  # noqa: E402
from piper_runtime.model import BuildCtx, build_full  # noqa: E402
from piper_runtime.moe.experts import GroupedExperts  # noqa: E402
from piper_runtime.moe.router import TopKRouter  # noqa: E402
from runtime_test_support import GELU2, MLA  # noqa: E402


# MLA with no rotary part (qk_rope_head_dim 0, which the spec allows): no shared rotary key
MLA_NOPE = MLA.model_copy(update={"name": "mla-no-rope",
                                  "mla": MLA.mla.model_copy(update={"qk_rope_head_dim": 0})})


@pytest.mark.parametrize("spec", [load_model("tiny-moe"), load_model("tiny-dense"), MLA, MLA_NOPE, GELU2],
                         ids=lambda s: s.name)
def test_parameter_count_and_causality(spec):
    seq = 16
    m = build_full(spec, BuildCtx(seq=seq, aux_coef=0.01), seed=0)
    assert sum(p.numel() for p in m.parameters()) == spec.total_params
    x = torch.randint(0, spec.vocab_size, (2, seq), generator=torch.Generator().manual_seed(0))
    y = m(x)
    assert y.shape == (2, seq, spec.vocab_size) and torch.isfinite(y).all()
    x2 = x.clone()
    x2[:, 10:] = (x2[:, 10:] + 1) % spec.vocab_size  # change only the future of position 9
    y2 = m(x2)
    # causal attention; routing of earlier tokens does not depend on later ones (dropless)
    torch.testing.assert_close(y2[:, :10], y[:, :10], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(y2[:, 10:], y[:, 10:])


@pytest.mark.parametrize("spec", [load_model("tiny-moe"), load_model("tiny-dense"), MLA, GELU2],
                         ids=lambda s: s.name)
def test_planner_counts_the_runtime_parameter_tensors(spec):
    """The eager optimizer's per-tensor cost needs the tensor count the runtime really holds."""
    m = build_full(spec, BuildCtx(seq=16), seed=0)
    nt = spec.param_tensors
    expected = (spec.num_dense_layers * nt["dense_layer"]
                + spec.num_moe_layers * (nt["moe_replicated"] + nt["moe_experts"])
                + nt["embedding"] + nt["head"] + nt["final_norm"])
    assert len(list(m.parameters())) == expected


def test_same_seed_same_weights_any_layout():
    spec = load_model("tiny-moe")
    a = dict(build_full(spec, BuildCtx(seq=16), seed=3).named_parameters())
    b = dict(build_full(spec, BuildCtx(seq=16), seed=3).named_parameters())
    c = dict(build_full(spec, BuildCtx(seq=16), seed=4).named_parameters())
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["layers.1.moe.experts.w1"], c["layers.1.moe.experts.w1"])


def test_router_losses_and_normalisation():
    E, k, N = 8, 2, 32
    r = TopKRouter(16, E, k, "softmax", aux_coef=0.01, z_coef=0.001)
    torch.nn.init.zeros_(r.gate.weight)  # uniform scores
    out = r(torch.randn(N, 16))
    # uniform P_e = 1/E  ->  aux = coef · E · Σ f_e / E = coef, whatever the tie-breaking
    # z = coef · (log E)^2 for all-zero logits
    assert float(out.aux_loss.detach()) == pytest.approx(0.01 + 0.001 * math.log(E) ** 2, rel=1e-6)
    s = TopKRouter(16, E, k, "sigmoid")
    o = s(torch.randn(N, 16))
    torch.testing.assert_close(o.weights.sum(-1), torch.ones(N))  # sigmoid: renormalised top-k
    assert o.aux_loss is None and o.experts.shape == (N, k)


def test_router_capacity_drops_overflow_in_token_order():
    r = TopKRouter(4, 4, 1, "softmax", capacity_factor=1.0)
    with torch.no_grad():
        r.gate.weight.zero_()
        r.gate.weight[0, 0] = 10.0  # every token prefers expert 0
    x = torch.zeros(8, 4)
    x[:, 0] = 1.0
    out = r(x)
    assert r.capacity(8) == 2
    assert out.experts.view(-1).tolist() == [0, 0, -1, -1, -1, -1, -1, -1]
    assert (out.weights.view(-1)[2:] == 0).all()


@pytest.mark.parametrize("gated", [True, False])
def test_grouped_gemm_equals_loop(gated, monkeypatch):
    from piper_runtime.moe import experts as E

    if not E._probe(torch.device("cpu"), torch.float32):
        pytest.skip("grouped_mm does not run on this torch build: both sides would be the loop")
    grouped_calls = []
    real = E.F.grouped_mm
    monkeypatch.setattr(E.F, "grouped_mm", lambda *a, **k: grouped_calls.append(1) or real(*a, **k))
    g = torch.Generator().manual_seed(1)
    counts = torch.tensor([5, 0, 9, 2])
    x = torch.randn(int(counts.sum()), 32, generator=g)
    outs = []
    for grouped in (None, False):
        ex = GroupedExperts(4, 32, 16, gated=gated, grouped=grouped)
        params = [p for p in ex.parameters()]
        with torch.no_grad():
            for i, p in enumerate(params):
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(2 + i)))
        xi = x.clone().requires_grad_()
        y = ex(xi, counts)
        y.sum().backward()  # an expanded gradient: the grouped path must cope
        outs.append((y.detach(), xi.grad, *[p.grad for p in params]))
    assert grouped_calls  # the first side ran the grouped kernel, not the loop
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert all(float(g[1].abs().sum()) == 0.0 for g in outs[0][2:])  # no rows for slot 1: no gradient


def test_the_grouped_gemm_probe_can_first_run_inside_a_checkpointed_forward_or_under_no_grad():
    from torch.utils.checkpoint import checkpoint

    from piper_runtime.moe import experts as E

    counts = torch.tensor([3, 5])
    ex = GroupedExperts(2, 16, 32, gated=True)
    with torch.no_grad():
        for p in ex.parameters():
            p.normal_()
    x = torch.randn(8, 16, dtype=torch.bfloat16, requires_grad=True)
    E._GROUPED_OK.clear()  # the probe runs on the first call: here, inside full recompute's checkpoint
    y = checkpoint(lambda t: ex(t, counts), x, use_reentrant=False)
    y.float().sum().backward()  # the recomputation saves what the forward saved (it raised before)
    assert x.grad is not None and E._GROUPED_OK[("cpu", torch.bfloat16)]
    E._GROUPED_OK.clear()  # an evaluation pass first: the probe still runs its backward
    with torch.no_grad():
        ex(x.detach(), counts)
    assert E._GROUPED_OK[("cpu", torch.bfloat16)]


def test_an_odd_vocabulary_is_padded_to_aligned_rows_that_no_target_names():
    from piper_plan.runtimes import padded_vocab

    spec = load_model("tiny-moe").model_copy(update={"vocab_size": 500})  # like Granite's 49,155
    seq, rows = 16, padded_vocab(500)
    assert rows == 512 and rows % 64 == 0
    m = build_full(spec, BuildCtx(seq=seq, aux_coef=0.01), seed=0)
    assert m.embed.weight.shape[0] == m.head.weight.shape[0] == rows
    assert sum(p.numel() for p in m.parameters()) == spec.total_params + 2 * (rows - 500) * spec.hidden_size
    x = torch.randint(0, 500, (2, seq), generator=torch.Generator().manual_seed(0))
    y = m(x)
    assert y.shape == (2, seq, rows) and torch.isfinite(y).all()
    loss = torch.nn.functional.cross_entropy(y.flatten(0, 1), torch.roll(x, -1, 1).flatten())
    loss.backward()
    assert torch.isfinite(loss) and m.head.weight.grad[500:].abs().sum() > 0  # trained, as Megatron's are


def test_synthetic_stream_is_deterministic_per_step():
    s = SyntheticTokens(100, 12, seed=5)
    assert torch.equal(s.batch(3, 4), SyntheticTokens(100, 12, seed=5).batch(3, 4))
    assert not torch.equal(s.batch(3, 4), s.batch(4, 4))
    b = s.batch(0, 64)
    assert b.shape == (64, 13) and int(b.max()) < 100
    follows = (s.succ[b[:, :-1]] == b[:, 1:]).float().mean()
    assert 0.6 < float(follows) < 0.9  # 75% successor-table transitions (+ chance hits)


def test_token_files(tmp_path):
    ok = tmp_path / "ok.npy"
    np.save(ok, np.arange(100, dtype=np.uint16) % 50)
    assert len(open_tokens(str(ok), vocab=50, seq=8)) == 100
    bad = tmp_path / "bad.npy"
    np.save(bad, np.arange(100, dtype=np.int64))
    with pytest.raises(DataError, match="expected uint16 or uint32.*int64"):
        open_tokens(str(bad), vocab=500, seq=8)
    odd = tmp_path / "odd.bin"
    odd.write_bytes(np.arange(51, dtype=np.uint16).tobytes())
    with pytest.raises(DataError, match="not a whole number of uint32"):
        open_tokens(str(odd), vocab=500, seq=8, dtype="uint32")
    big = tmp_path / "big.bin"
    big.write_bytes(np.full(40, 60000, dtype=np.uint16).tobytes())
    with pytest.raises(DataError, match="token id 60000 >= vocab_size 512"):
        open_tokens(str(big), vocab=512, seq=8)


@contextmanager
def _one_rank_world(tmp_path):
    """A gloo world of one rank in this process with tiny-moe's chunks and a ZeRO-1 optimizer:
    (plan, named parameters, optimizer, chunks); the process group is destroyed on the way out."""
    import torch.distributed as dist

    from piper_plan.layout import Layout
    from piper_plan.plan import make_plan
    from piper_plan.specs.registry import load_hardware
    from piper_runtime.mesh import build_groups
    from piper_runtime.optim import DistOptimizer
    from piper_runtime.pipeline import build_local_chunks

    plan = make_plan(load_model("tiny-moe"), load_hardware("cpu-local"),
                     Layout(gpus=1, global_batch=2, seq=16, dtype="fp32"))
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        groups = build_groups(plan, 30)
        chunks = build_local_chunks(plan, 0, BuildCtx(seq=16), 0, "cpu")
        named = [(n, p) for c in chunks.values() for n, p in c.named_parameters()]
        yield plan, named, DistOptimizer(named, groups, 1, 1, 1e-3, 0.0), chunks
    finally:
        dist.destroy_process_group()


def test_crash_mid_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    """World of one rank in this process: save step 1, crash while writing step 2, and the
    step-1 checkpoint is still the latest, valid and loadable."""
    import torch.distributed.checkpoint as dcp

    from piper_runtime import checkpoint

    with _one_rank_world(tmp_path) as (plan, named, opt, chunks):
        ck = tmp_path / "ck"
        checkpoint.save(ck, 1, plan, opt, chunks)
        saved = {n: p.detach().clone() for n, p in named}

        real_save = dcp.save

        def dying_save(state, checkpoint_id):
            real_save({k: v for i, (k, v) in enumerate(state.items()) if i < 3}, checkpoint_id=checkpoint_id)
            raise OSError("disk full (simulated)")

        monkeypatch.setattr(checkpoint.dcp, "save", dying_save)
        with torch.no_grad():
            for _, p in named:
                p.add_(1.0)
        # one line naming the folder and the reason (a PiperError), the half-written step removed
        with pytest.raises(checkpoint.CheckpointError, match=r"cannot write checkpoint step 2 \(disk full \(simulated\)\)"):
            checkpoint.save(ck, 2, plan, opt, chunks)
        assert not list(ck.glob(".step_*"))
        monkeypatch.setattr(checkpoint.dcp, "save", real_save)
        assert checkpoint.latest(ck).name == "step_00000001"
        assert checkpoint.validate(ck, plan) == 1
        assert checkpoint.load(ck, opt, chunks) == 1
        for n, p in named:
            assert torch.equal(p.detach(), saved[n]), n


def test_tensor_parallelism_splits_the_padded_vocabulary():
    from piper_plan.errors import PiperError
    from piper_plan.layout import Layout
    from piper_plan.plan import make_plan
    from piper_plan.specs.registry import load_hardware
    from piper_runtime.config import check_tp

    hw = load_hardware("cpu-local")
    odd = load_model("tiny-moe").model_copy(update={"vocab_size": 501})  # 512 rows: 256 a rank
    check_tp(make_plan(odd, hw, Layout(gpus=2, tp=2, mbs=2, global_batch=2, seq=32)))
    three = load_model("tiny-moe").model_copy(update={"num_heads": 6, "num_kv_heads": 6, "head_dim": 16})
    with pytest.raises(PiperError, match="vocab_size"):  # 512 rows do not split three ways
        check_tp(make_plan(three, hw, Layout(gpus=3, tp=3, mbs=3, global_batch=3, seq=33)))


def test_a_save_prunes_only_its_own_older_steps(tmp_path):
    """A save keeps the newest step before it and removes older step_NNNNNNNN folders; a folder the
    user named otherwise (a copy kept as step_best) and a later step (a run resumed from an earlier
    one) are not its to remove. Pruning by sorted name had removed both, and kept step_best over
    the step before."""
    from piper_runtime import checkpoint

    with _one_rank_world(tmp_path) as (plan, named, opt, chunks):
        ck = tmp_path / "ck"
        for extra in ("step_best", "step_00000009"):
            (ck / extra).mkdir(parents=True)
            (ck / extra / "meta.json").write_text("{}")
        for step in (1, 2, 3):
            checkpoint.save(ck, step, plan, opt, chunks)
        assert sorted(p.name for p in ck.iterdir() if p.is_dir()) == ["step_00000002", "step_00000003",
                                                                      "step_00000009", "step_best"]
        assert checkpoint.latest(ck).name == "step_00000003"
