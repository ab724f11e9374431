"""A step's record reads its MoE statistics and losses back from the device in one copy: every
.tolist() or float() of a GPU tensor is a synchronisation of its own (one per layer and statistic
was 96 of an H200 step's 138), and the values it reads are the counts exactly."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from piper_plan.specs import load_model  # noqa: E402
from piper_runtime import metrics  # noqa: E402
from piper_runtime.model import BuildCtx, build_full  # noqa: E402


def _chunk():
    spec = load_model("tiny-moe")
    c = build_full(spec, BuildCtx(seq=16, aux_coef=0.01), seed=0)
    ids = torch.randint(0, spec.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    loss = c(ids).float().logsumexp(-1).mean()
    loss.backward()
    return spec, c, loss.detach()


def _recording(calls, name, orig):
    return lambda self, *a, **k: calls.append(name) or orig(self, *a, **k)


def test_the_record_reads_every_statistic_and_loss_back_in_one_copy(monkeypatch):
    spec, c, loss = _chunk()
    calls = []
    for name in ("tolist", "item", "__float__", "__int__", "cpu"):
        orig = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, _recording(calls, name, orig))
    groups = SimpleNamespace(rank=0, pp_rank=0, dp_rank=0, ep_rank=0, edp_rank=0)
    rec = metrics.rank_stats(groups, {0: c}, [loss, loss * 2], 0.1, 1.0)
    monkeypatch.undo()
    assert calls == ["tolist"]
    moe = c.moe_layers()
    assert len(moe) > 1 and set(rec["moe"]) == set(moe)
    for layer, m in moe.items():
        assert rec["moe"][layer]["routed"] == m.dispatcher.tokens_per_expert.tolist()
        assert rec["moe"][layer]["slot_tokens"] == m.dispatcher.tokens_per_slot.tolist()
        assert all(isinstance(v, int) for v in rec["moe"][layer]["routed"])
    assert rec["aux"] == pytest.approx(sum(float(m.aux_total) for m in moe.values()))
    assert rec["aux"] > 0 and rec["losses"] == pytest.approx([float(loss), 2 * float(loss)])


def test_counts_come_back_exact_beyond_float32():
    big = torch.tensor([2**40 + 1, 3], dtype=torch.long)
    assert metrics._read_back([big, torch.tensor(0.5)]) == [[2**40 + 1, 3], [0.5]]


def test_a_step_s_reset_keeps_the_aux_total_where_the_layer_adds_to_it():
    _, c, _ = _chunk()
    m = next(iter(c.moe_layers().values()))
    m.aux_total = m.aux_total.to(torch.float64)  # stands for "another device": reset keeps it there
    metrics.reset({0: c})
    assert m.aux_total.device == torch.device("cpu") and float(m.aux_total) == 0.0
