"""Multi-token prediction (ModelSpec.mtp_layers): DeepSeek-V3's module runs beside the LM head,
so it costs the head's pipeline rank a block, a projection and a second pass through the head."""
import pytest

from piper_plan.cost.batch import from_layouts
from piper_plan.cost.estimate import evaluate
from piper_plan.layout import Layout
from piper_plan.specs import load_hardware, load_model

MAIN, MTP = load_model("deepseek-v3"), load_model("deepseek-v3-mtp")
HW = load_hardware("dgx-b200")
# Megatron-Bridge 25.11's DGX-B200 "DeepSeekV3 (w/ MTP)" layout: 256 GPUs, PP16, EP8
LAY = dict(gpus=256, pp=16, dp=16, ep=8, mbs=1, global_batch=2048, seq=4096, fp8="mxfp8",
           expert_probs="activation", zero=1)


def _est(m, **kw):
    return evaluate(m, HW, from_layouts([Layout(**{**LAY, **kw})]))


def test_the_module_loads_the_last_stage_only():
    main, mtp = _est(MAIN, pipeline_split="even"), _est(MTP, pipeline_split="even")
    for comp in ("weights", "activations", "logits"):
        assert mtp.memory["last"][comp][0] > main.memory["last"][comp][0], comp
        assert mtp.memory["first"][comp][0] == main.memory["first"][comp][0], comp
        assert mtp.memory["mid"][comp][0] == main.memory["mid"][comp][0], comp
    # a second set of logits, kept for the module's loss
    assert mtp.memory["last"]["logits"][0] == pytest.approx(2 * main.memory["last"]["logits"][0])


def test_an_even_split_leaves_the_last_stage_the_bottleneck_and_a_balanced_one_moves_layers_off_it():
    even_main, even_mtp = _est(MAIN, pipeline_split="even"), _est(MTP, pipeline_split="even")
    assert even_mtp.step_time_s[0] > 1.2 * even_main.step_time_s[0]
    bal_main, bal_mtp = _est(MAIN), _est(MTP)
    assert bal_mtp.chunks.last[0] < bal_main.chunks.last[0]  # the module counts as the head's rank's work
    assert bal_mtp.step_time_s[0] < even_mtp.step_time_s[0]
    # the split Megatron-Bridge's DeepSeek-V3 recipes write by hand for PP16 with MTP,
    # "Et*4|(t*4|)*14tmL": 4 layers and the embedding, 14 x 4, then 1 layer, the module and the loss
    c = bal_mtp.chunks
    assert (c.first[0], c.mid_hi[0], c.n_hi[0], c.last[0]) == (4, 4, 0, 1)
    # its FLOPs count in the model TFLOPS: per token 260.6 against 250.5 GFLOP
    ratio_flops = MTP.flops_per_token(4096) / MAIN.flops_per_token(4096)
    assert bal_mtp.tflops_per_gpu[0] / bal_main.tflops_per_gpu[0] == pytest.approx(
        ratio_flops * bal_main.step_time_s[0] / bal_mtp.step_time_s[0])


def test_v_schedules_run_the_module_on_rank_zero_with_the_head():
    main, mtp = _est(MAIN, schedule="dualpipev", vpp=2), _est(MTP, schedule="dualpipev", vpp=2)
    assert mtp.memory["first"]["logits"][0] == pytest.approx(2 * main.memory["first"]["logits"][0])
    assert mtp.memory["first"]["weights"][0] > main.memory["first"]["weights"][0]
    assert mtp.memory["last"]["weights"][0] == main.memory["last"]["weights"][0]
