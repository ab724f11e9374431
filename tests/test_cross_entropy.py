"""What the loss holds of the LM head's logits (Layout.cross_entropy; rank_memory.logits_bytes):
counted op by op on CPU, the live bytes of torch's F.cross_entropy on an fp32 copy (torchtitan's
and Hugging Face's uncompiled loss), against what the planner prices for the micro-batch in its
backward."""
import weakref

import numpy as np
import pytest

from piper_plan.cost.batch import from_layouts
from piper_plan.cost.estimate import evaluate
from piper_plan.cost.rank_memory import logits_bytes
from piper_plan.layout import Layout
from piper_plan.specs import load_hardware
from piper_plan.specs.model import ModelSpec

T, V = 256, 3000


def _live_bytes(step):
    """(bytes live when `step`'s forward returns, the most live at once in its backward) of the
    storages of over 1,000 elements the ops under `step` make, per logit: each counts until its
    storage is freed (a weak reference to the storage, which torch keeps one Python object for, not
    to a tensor, whose wrapper can die while autograd keeps the memory). It reads torch.profiler's
    allocation events' figures on this loss (4 and 12; the per-element counts agree to 1e-5)."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Live(TorchDispatchMode):
        live = peak = 0
        ptrs: set = set()

        def _free(self, key, n):
            self.ptrs.discard(key)
            self.live -= n

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.numel() > 1000 and t.untyped_storage().data_ptr() not in self.ptrs:
                    storage = t.untyped_storage()
                    key, n = storage.data_ptr(), storage.nbytes()
                    self.ptrs.add(key)
                    self.live += n
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(storage, self._free, key, n)
            return out

    mode = Live()
    mode.ptrs = set()
    with mode:
        loss = step()
        kept = mode.live
        mode.peak = kept  # the backward's peak over what the forward left
        loss.backward()
    return kept / (T * V), mode.peak / (T * V)


def _logits():
    import torch

    torch.manual_seed(0)
    # the LM head's bf16 output; the caller drops it before the backward (torchtitan: `del pred`)
    return torch.randn(T, V, dtype=torch.bfloat16, requires_grad=True), torch.randint(0, V, (T,))


def test_torchs_cross_entropy_keeps_fp32_log_probabilities_and_holds_three_fp32_copies_in_its_backward():
    pytest.importorskip("torch")
    import torch.nn.functional as F

    pred, labels = _logits()
    kept, peak = _live_bytes(lambda: F.cross_entropy(pred.float(), labels))
    assert (kept, peak) == (4.0, 12.0)
    assert tuple(map(float, logits_bytes(2.0, False, True))) == (kept, peak - kept)


def test_the_planner_prices_each_loss_at_the_micro_batch_in_its_backward():
    m = ModelSpec(name="small", num_layers=1, hidden_size=64, num_heads=4, num_kv_heads=4, head_dim=16,
                  vocab_size=V, seq_len=T, ffn_size=128)
    hw = load_hardware("dgx-h100")

    def logits(**kw):  # bytes a logit of the one micro-batch
        mem = evaluate(m, hw, from_layouts([Layout(gpus=1, global_batch=1, seq=T, **kw)])).memory
        return float(mem[next(iter(mem))]["logits"][0]) * 2**30 / (T * V)

    assert logits() == 4.0 + 2.0                       # Megatron-Core's, in place
    assert logits(cross_entropy="eager") == 12.0       # torch's F.cross_entropy on fp32
    # piper-train's loss is torch's at tp 1, but its plans keep Megatron's price by default (search
    # --runtime piper-train does not change it; --cross-entropy eager prices what it runs): the additive peak would
    # put the 8 B beside the whole step's gradients, which its runs allocate later in the backward (an
    # H200 run of plan A reserved 65.9 GiB where 12 B read 70.4: README "piper-train on one GPU")
    assert logits(fused_kernels=False) == 6.0
    assert logits(compiled=("loss",), cross_entropy="eager") == pytest.approx(2.0 + 2.0 + 8.0 / V)


def test_torchtitans_rows_read_torchs_loss_unless_compiled():
    from piper_plan import validate as V_

    table = V_.data_path().parent / "torchtitan.csv"
    lay = {r.id: r for r in V_.run(path=table)}
    h100, h200 = lay["tt35"], lay["tt27"]  # loss eager (torchtitan 0.0.2); compiled (June 2025)
    # their reserved peaks (47.65, 47.96 GiB) bound both from above, within 3 % and 6 %
    assert 0.97 * 47.65 <= h100.peak_memory_gib <= 47.65 and 0.94 * 47.96 <= h200.peak_memory_gib <= 47.96
    assert np.isfinite(h100.predicted)


def test_the_cli_prices_cross_entropy_eager_and_refuses_another_word():
    import json

    from click.testing import CliRunner

    from piper_plan.cli import main

    args = ["estimate", "-m", "llama3-8b", "-H", "dgx-h100", "-n", "8", "--global-batch", "8", "--seq", "8192",
            "--zero", "3", "--fsdp2", "--json"]
    peak = {c: json.loads(CliRunner().invoke(main, args + ["--cross-entropy", c]).output)["peak_memory_gib"]
            for c in ("fused", "eager")}
    assert peak["eager"] - peak["fused"] == pytest.approx(6.0 * 8192 * 128256 / 2**30, rel=1e-9)
    bad = CliRunner().invoke(main, args + ["--cross-entropy", "chunked"])
    assert bad.exit_code != 0 and "--cross-entropy" in bad.output and "Traceback" not in bad.output
    from piper_plan.errors import LayoutError
    from piper_plan.search import SearchSpace

    with pytest.raises(LayoutError, match="cross_entropy fused or eager"):
        SearchSpace(gpus=8, global_batch=8, seq=2048, cross_entropy="chunked")


def test_torchs_cross_entropy_moves_the_bytes_its_ops_read_and_write_and_the_planner_prices_them():
    pytest.importorskip("torch")
    import torch.nn.functional as F
    from benchmark_support import load_benchmark

    from piper_plan.cost.compute import EAGER_CE_BYTES, EAGER_CE_OPS, Phase, _elementwise, lm_head_phase
    from piper_plan.cost.kernels import stream_time

    count = load_benchmark("eager_bytes")._counter(set())
    pred, labels = _logits()
    with count:
        loss = F.cross_entropy(pred.float(), labels)
        forward, forward_ops = count.bytes["elementwise"] / (T * V), count.ops["elementwise"]
        loss.backward()
    backward = count.bytes["elementwise"] / (T * V) - forward
    # labels and the scalar loss add a few bytes a token
    assert (round(forward, 2), round(backward, 2)) == EAGER_CE_BYTES
    assert (forward_ops, count.ops["elementwise"] - forward_ops) == EAGER_CE_OPS
    m = ModelSpec(name="small", num_layers=1, hidden_size=64, num_heads=4, num_kv_heads=4, head_dim=16,
                  vocab_size=V, seq_len=T, ffn_size=128)
    hw = load_hardware("dgx-h100")
    lay = {c: from_layouts([Layout(gpus=1, global_batch=1, seq=T, cross_entropy=c)]) for c in ("fused", "eager")}
    head = {c: lm_head_phase(m, hw, b, "bf16") for c, b in lay.items()}
    n, z, norm_bytes = np.full(1, float(T * V)), np.zeros(1), np.full(1, T * 2.0 * 64 * 2.0)
    torch_ce = Phase(stream_time(hw, 18.0 * n, 3), stream_time(hw, 26.0 * n, 4), z, z)
    norm = _elementwise(hw, norm_bytes, 1)
    fused_ce = _elementwise(hw, n * 12.0 + norm_bytes, 3)
    assert np.allclose(head["eager"].v - head["fused"].v, (torch_ce + norm).v - fused_ce.v, rtol=0, atol=1e-15)
    # compiled, the loss is Inductor's fused kernels whatever cross_entropy says
    compiled = from_layouts([Layout(gpus=1, global_batch=1, seq=T, cross_entropy="eager", compiled=("loss",))])
    assert np.array_equal(lm_head_phase(m, hw, compiled, "bf16").v, head["fused"].v)
