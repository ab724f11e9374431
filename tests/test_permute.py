"""The MoE token permutation (runtime/moe/permute.py): both token sums (the GPU's slot buffer, the
CPU's embedding_bag gather-sum) agree with each other and with a plain loop, forward and backward,
with dropped pairs and with none routed at all; and a dropless MoE layer's forward and backward,
on either sum, dispatch no op that reads a device value back to the host (a GPU synchronisation)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from piper_runtime.moe.permute import Pairs, by_slot, combine, count, permute, sums_by_slot  # noqa: E402


def _routes(n=37, k=3, E=5, d=24, drop=True):
    g = torch.Generator().manual_seed(3)
    e = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(n)])
    w = torch.rand(n, k, generator=g)
    if drop:  # a few pairs dropped by capacity: id -1, weight 0
        e[::7, -1] = -1
        w = torch.where(e >= 0, w, torch.zeros_like(w))
    x = torch.randn(n, d, generator=g)
    return x, e, w


def _through(x, e, w, dtype, slots):
    """Permute into expert order, scale each row by its expert id + 1 (a stand-in expert),
    combine; returns the output and the gradients of x and w for a fixed upstream gradient."""
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    n, k = e.shape
    flat = e.reshape(-1)
    kept = (flat >= 0).nonzero().squeeze(1)
    src = kept[torch.argsort(flat[kept], stable=True)]
    with sums_by_slot(slots):
        pairs = Pairs.of(src, n, k)
    rows = permute(x, pairs, dtype)
    rows = rows * (flat[src] + 1).unsqueeze(1).to(rows.dtype)
    y = combine(rows, pairs, w, x.dtype)
    (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
    return y.detach(), x.grad, w.grad


def _loop(x, e, w):
    out = torch.zeros_like(x)
    for t in range(e.shape[0]):
        for j in range(e.shape[1]):
            if e[t, j] >= 0:
                out[t] += w[t, j] * (e[t, j] + 1) * x[t]
    return out


def test_count_is_bincount():
    ids = torch.tensor([3, 0, 3, 3, 1, 0])
    assert count(ids, 6).tolist() == torch.bincount(ids, minlength=6).tolist() == [2, 1, 0, 3, 0, 0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_slot_sums_and_the_gather_sum_give_the_same_output_and_gradients(dtype):
    x, e, w = _routes()
    by_add, by_slots = _through(x, e, w, dtype, False), _through(x, e, w, dtype, True)
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    for a, b in zip(by_add, by_slots):
        torch.testing.assert_close(a, b, **tol)
    torch.testing.assert_close(by_add[0], _loop(x, e, w), **tol)
    assert by_add[0].dtype == torch.float32 and by_add[1].dtype == torch.float32  # back in x's dtype


@pytest.mark.parametrize("slots", [True, False], ids=["slots", "gather-sum"])
def test_dropped_pairs_get_no_gradient_through_their_weight(slots):
    x, e, w = _routes()
    _, _, gw = _through(x, e, w, torch.float32, slots)
    assert (gw[e < 0] == 0).all() and (gw[e >= 0] != 0).all()


@pytest.mark.parametrize("slots", [True, False], ids=["slots", "gather-sum"])
def test_a_layer_whose_pairs_were_all_dropped_returns_zeros(slots):
    x, e, w = _routes(n=5, k=2)
    e, w = torch.full_like(e, -1), torch.zeros_like(w)
    y, gx, _ = _through(x, e, w, torch.float32, slots)
    assert y.shape == x.shape and not y.any() and (gx is None or not gx.any())


def test_the_device_picks_the_sum_and_a_context_can_force_it():
    assert not by_slot(torch.device("cpu")) and by_slot(torch.device("cuda"))
    with sums_by_slot():
        assert by_slot(torch.device("cpu"))
        with sums_by_slot(False):
            assert not by_slot(torch.device("cuda"))
        assert by_slot(torch.device("cpu"))
    assert not by_slot(torch.device("cpu"))


# aten ops that read a tensor's value back to the host, or size their output by it (CUDA's
# bincount reads the max): on a GPU each waits for the device
SYNCING = {"_local_scalar_dense", "is_nonzero", "nonzero", "bincount", "repeat_interleave", "unique"}
# Tensor methods that copy values to the host without an aten op when the tensor is on a CPU
READBACKS = ("tolist", "cpu", "item", "numpy", "__bool__", "__int__", "__float__")


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("slots", [True, False], ids=["slots", "gather-sum"])
@pytest.mark.parametrize("aux", [0.0, 0.01], ids=["no-aux", "aux-loss"])
def test_a_dropless_moe_layer_reads_nothing_back_from_the_device(aux, slots, monkeypatch):
    from piper_runtime.moe.dispatch import EPDispatcher
    from piper_runtime.moe.experts import GroupedExperts
    from piper_runtime.moe.layer import MoELayer
    from piper_runtime.moe.placement import ExpertPlacement
    from piper_runtime.moe.router import TopKRouter

    torch.manual_seed(0)
    d, E = 32, 8
    experts = GroupedExperts(E, d, 48)
    for p in experts.parameters():
        torch.nn.init.normal_(p, std=0.05)
    layer = MoELayer(TopKRouter(d, E, 2, aux_coef=aux), experts, None,
                     EPDispatcher(ExpertPlacement.contiguous(E, 1)))
    x = torch.randn(2, 24, d, requires_grad=True)
    layer(x).sum().backward()  # grouped GEMM's one-time probe reads back; it is cached after
    read = []

    def recording(name, orig):
        return lambda self, *a, **k: read.append(name) or orig(self, *a, **k)

    for name in READBACKS:
        monkeypatch.setattr(torch.Tensor, name, recording(name, getattr(torch.Tensor, name)))
    mode = _Ops()
    with mode, sums_by_slot(slots):
        layer(x).square().sum().backward()
    monkeypatch.undo()
    assert x.grad is not None and int(layer.dispatcher.tokens_per_expert.sum()) == 2 * (2 * 24 * 2)
    assert not (mode.seen & SYNCING), sorted(mode.seen & SYNCING)
    assert not read, read


def test_the_benchmark_s_three_forms_agree_before_it_times_them(capsys):
    from benchmark_support import load_benchmark

    mod = load_benchmark("permute")
    for dtype in ("fp32", "bf16"):
        assert mod.main(["--tokens", "96", "--hidden", "32", "--experts", "8", "--topk", "3", "--repeats", "3",
                         "--device", "cpu", "--dtype", dtype]) == 0
    out = capsys.readouterr().out
    assert "mismatch" not in out and out.count("baseline/gather_sum") == 2 and "piper-train takes gather_sum" in out
