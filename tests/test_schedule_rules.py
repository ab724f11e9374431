"""Schedules the closed forms cannot price are refused, by the layout check and by the search
alike: ZB-V before its warm-up can fill, Megatron-Core's EP overlap outside its interleaved 1F1B."""
import pytest

from piper_plan.errors import LayoutError
from piper_plan.layout import Layout, check_layout
from piper_plan.search import SearchSpace, search
from piper_plan.specs.registry import load_hardware, load_model

QWEN = load_model("qwen3-30b-a3b")
H100 = load_hardware("dgx-h100")


def test_zbv_needs_the_micro_batches_that_fill_its_warm_up():
    # pp 4: rank 0's first last-chunk forward waits for micro-batch 0 to pass 7 chunks
    lay = dict(gpus=32, pp=4, dp=8, ep=8, vpp=2, mbs=1, seq=4096, schedule="zbv")
    with pytest.raises(LayoutError, match=r"zbv needs microbatches >= 2\*pp-1"):
        check_layout(Layout(**lay, global_batch=48), QWEN.num_layers, 128)  # 6 micro-batches
    check_layout(Layout(**lay, global_batch=56), QWEN.num_layers, 128)  # 7


def test_the_search_drops_the_zbv_layouts_too_short_to_price():
    res = search(QWEN, H100, SearchSpace(gpus=32, global_batch=64, seq=4096, schedules=("zbv",)))
    assert res.rejected.get("zbv needs micro-batches >= 2*pp-1", 0) > 0
    kept = res.batch
    assert (kept.m >= 2 * kept.pp - 1)[kept.pp > 1].all()


def test_megatron_s_ep_overlap_with_a_pipeline_runs_interleaved_only():
    lay = dict(gpus=32, pp=2, dp=16, ep=8, mbs=1, global_batch=64, seq=4096, a2a_overlap=True)
    with pytest.raises(LayoutError, match="a2a_overlap with pp > 1 needs the interleaved schedule"):
        check_layout(Layout(**lay, schedule="1f1b"), QWEN.num_layers, 128)
    check_layout(Layout(**lay, schedule="interleaved", vpp=2), QWEN.num_layers, 128)
    res = search(QWEN, H100, SearchSpace(gpus=32, global_batch=64, seq=4096, a2a_overlap=True))
    assert res.rejected.get("a2a_overlap with pp > 1 needs the interleaved schedule", 0) > 0
    b = res.batch
    assert (b.sched[b.pp > 1] == 2).all()
