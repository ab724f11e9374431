"""piper-train's bf16 weight copies: autocast casts the fp32 weights in each micro-batch's forward
and the copies stay saved for that micro-batch's backward, so a pipeline rank holds one per
micro-batch in flight (none saved where full recompute re-runs the block); the memory model
prices the copies beyond the state's one as `weight_casts` (rank_memory.cast_copies)."""
from __future__ import annotations

import pytest

from piper_plan.evaluate import estimate_layout
from piper_plan.layout import Layout
from piper_plan.specs import load_hardware, load_model

H200 = load_hardware("dgx-h200")
GRANITE = "tests/data/hf/granite-3.0-3b-a800m-instruct.json"


def _bf16_copies(recompute: str, micro_batches: int):
    """Distinct bf16 weight-shaped storages saved by `micro_batches` forwards of one MoE block
    whose backwards have not run, and the bytes of one bf16 copy of the block's matrices."""
    torch = pytest.importorskip("torch")
    from piper_runtime.metrics import saved_tensor_bytes
    from piper_runtime.model import Block, BuildCtx

    spec = load_model("tiny-moe")
    torch.manual_seed(0)
    blk = Block(spec, spec.dense_layers, BuildCtx(seq=40, dtype="bf16", recompute=recompute))
    for p in blk.parameters():
        torch.nn.init.normal_(p, std=0.02)
    router = blk.moe.router.gate.weight  # the router runs in fp32: not cast
    mats = [p for p in blk.parameters() if p.dim() >= 2 and p is not router]
    # a linear saves its cast weight transposed; 40 tokens match no weight dimension, so a bf16
    # storage of a weight's shape is a cast of it
    shapes = {tuple(p.shape) for p in mats} | {tuple(p.shape[::-1]) for p in mats if p.dim() == 2}
    one = sum(2 * p.numel() for p in mats)
    outs, copies = [], []
    for _ in range(micro_batches):
        x = torch.randn(1, 40, spec.hidden_size, requires_grad=True)

        def fwd():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return blk(x)

        out, _, items = saved_tensor_bytes(fwd, exclude=list(blk.parameters()))
        outs.append(out)  # keeps this micro-batch's graph, and what it saved, alive
        copies += [nbytes for s, dt, nbytes, _ in items if s in shapes and dt == "bfloat16"]  # distinct storages
    return len(copies), sum(copies), one


def test_each_micro_batch_in_flight_holds_its_own_bf16_copy_of_the_block_s_weights():
    n1, bytes1, one = _bf16_copies("none", 1)
    n2, bytes2, _ = _bf16_copies("none", 2)
    assert bytes1 == one and n1 > 3  # every matrix but the router's, once
    assert bytes2 == 2 * one and n2 == 2 * n1


def test_full_recompute_saves_no_copy():
    n, nbytes, _ = _bf16_copies("full", 2)
    assert n == 0 and nbytes == 0


def _mem(**kw):
    base = dict(gpus=4, pp=4, global_batch=16, seq=2048, mbs=2, zero=0, a2a="flat", fused_kernels=False)
    est = estimate_layout(load_model(GRANITE), H200, Layout(**{**base, **kw}))
    return est.memory


EMBEDDING_GIB = 2 * load_model(GRANITE).embedding_params / 2**30  # looked up in fp32, never cast


def test_the_first_of_four_stages_prices_three_more_copies_and_the_last_none():
    mem = _mem()
    first, mid, last = mem["first"], mem["mid"], mem["last"]
    # four micro-batches in flight on the first stage; its embedding table is not cast
    assert float(first["weight_casts"][0]) == pytest.approx(3 * (float(first["weights"][0]) - EMBEDDING_GIB))
    assert float(mid["weight_casts"][0]) == pytest.approx(2 * float(mid["weights"][0]))  # three in flight
    assert float(last["weight_casts"][0]) == 0.0


@pytest.mark.parametrize("kw", [dict(fused_kernels=True), dict(dtype="fp32"), dict(recompute="full")],
                         ids=["fused", "fp32", "full-recompute"])
def test_fused_stacks_fp32_and_full_recompute_hold_one_copy_or_none(kw):
    assert "weight_casts" not in _mem(**kw)["first"]


def test_recomputing_half_of_each_chunk_saves_half_of_the_extra_copies():
    # Granite: 32 layers over 4 stages, 8 a chunk; the first 4 of each re-run
    mem = _mem(recompute="full", recompute_layers=4)["first"]
    assert float(mem["weight_casts"][0]) == pytest.approx(1.5 * (float(mem["weights"][0]) - EMBEDDING_GIB))
