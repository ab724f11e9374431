"""Fused attention's block costs (Efficiency.attention_blocks): the kernel computes every
128x128 tile its mask touches and pays a fixed cost a query block's pass, so its rate per FLOP
rises with length and falls in narrow windows and context-parallel ring steps
(kernels.tile_cost, block_factor; compute.attention_tiles)."""
import numpy as np
import pytest

from piper_plan.cost.batch import from_layouts
from piper_plan.cost.compute import attention_tiles, core_attention
from piper_plan.cost.kernels import block_factor, tile_cost
from piper_plan.errors import SpecError
from piper_plan.layout import Layout
from piper_plan.specs import load_hardware, load_model
from piper_plan.validate_attention import attention_check, fit_block_costs, price_row

GB200 = load_hardware("gb200-nvl72")


def test_the_closed_forms_causal_unmasked_and_windowed():
    c, n = 3.0, 32.0
    assert tile_cost(c, n) == pytest.approx((n + 1 + 2 * c) / n)  # n(n+1)/2 tiles + c n, for n²/2 counted
    assert tile_cost(c, n, causal=False) == pytest.approx(1 + c / n)
    assert tile_cost(c, n, cp=4, causal=False) == pytest.approx(1 + 4 * c / n)  # a pass a ring step
    # GPT-OSS's 128-token window: each query block touches its own tile and the one before
    assert tile_cost(c, n, k=1) == pytest.approx((1 + (n - 1) * 2 + c * n) / (n - 0.5))


def test_a_window_as_long_as_the_sequence_is_plain_causal_attention():
    for k in (32.0, 64.0):
        assert tile_cost(2.0, 32.0, k=k) == pytest.approx(tile_cost(2.0, 32.0))


def test_the_plateau_holds_where_it_was_measured_and_per_flop_time_falls_with_length():
    assert block_factor(GB200, 4096) == pytest.approx((1.0, 1.0))
    f = [block_factor(GB200, s)[0] for s in (2048, 4096, 8192, 32768, 131072)]
    assert all(a > b for a, b in zip(f, f[1:]))
    # towards the kernel's asymptote: (n+1+2c)/n -> 1
    c = GB200.efficiency.attention_blocks.forward
    assert block_factor(GB200, 1 << 24)[0] == pytest.approx(1 / tile_cost(c, 32.0), rel=1e-3)


def test_each_ring_step_of_context_parallelism_pays_a_pass_over_the_ranks_query_blocks():
    assert tile_cost(2.0, 256.0, cp=1) == tile_cost(2.0, 256.0)
    # the ring's last rank: cp passes of n/cp query blocks against 1/cp of the counted tiles
    assert tile_cost(2.0, 256.0, cp=8) == pytest.approx((256 + 1 + 2 * 2.0 * 8) / 256)
    f1, f8 = block_factor(GB200, 131072)[0], block_factor(GB200, 131072, cp=8)[0]
    assert f1 < f8 < block_factor(GB200, 4096)[0]  # dearer than one rank, still cheaper than 4k


def test_flashattention2_and_specs_without_block_costs_keep_one_rate():
    assert block_factor(load_hardware("dgx-h100"), 65536, kernel="fa2") == (1.0, 1.0)
    for hw in ("dgx-a100-80gb", "frontier", "amd-mi300x", "cpu-local"):
        assert load_hardware(hw).efficiency.attention_blocks is None
        assert block_factor(load_hardware(hw), 65536) == (1.0, 1.0)


@pytest.mark.parametrize("spec, sweep", [
    ("gb200-nvl72", "gb200-nvl72"), ("dgx-b200", "gb200-nvl72"), ("gb300-nvl72", "gb300-nvl72"),
    ("dgx-b300", "gb300-nvl72"), ("dgx-h200", "dgx-h200"), ("dgx-h100", "dgx-h200"), ("dgx-h800", "dgx-h200"),
    ("meta-h100-roce", "dgx-h200")])
def test_each_spec_states_the_costs_fitted_to_its_kernels_unmasked_sweep(spec, sweep):
    bl = load_hardware(spec).efficiency.attention_blocks
    assert (bl.forward, bl.backward) == tuple(round(x, 2) for x in fit_block_costs(sweep))
    assert (bl.block, bl.seq) == (128, 4096)


@pytest.mark.parametrize("hw", ["gb200-nvl72", "gb300-nvl72", "dgx-h200"])
def test_the_causal_rows_out_of_sample_follow_the_length_law(hw):
    # the fit saw only unmasked rows at 4k-16k; each causal row's rate against its own 4k row
    rows = {r["seq"]: r for r in attention_check() if r["hardware"] == hw and r["kind"] == "causal"}
    for ph in ("forward", "backward"):
        errs = [(r[f"{ph}_predicted"] / rows[4096][f"{ph}_predicted"]) / (r[ph] / rows[4096][ph]) - 1.0
                for r in rows.values()]
        assert np.mean(np.abs(errs)) < 0.06 and max(np.abs(errs)) < 0.12, (ph, errs)


def test_without_block_costs_the_plateau_would_price_a_32k_causal_layer_a_quarter_slow():
    # the sweep's causal row at 32k on GB200: 1,720 TFLOPS forward, 1,473 backward
    flat = GB200.model_copy(update={"efficiency": GB200.efficiency.model_copy(update={"attention_blocks": None})})
    row = {"hardware_spec": "gb200-nvl72", "mask": "causal", "window": "", "batch": "1", "seq": "32768",
           "heads": "64", "head_dim": "128"}
    (ff, fb), (lf, lb) = price_row(row, flat), price_row(row)
    assert 1720 / ff > 1.25 and 1473 / fb > 1.25
    assert abs(lf / 1720 - 1) < 0.05 and abs(lb / 1473 - 1) < 0.05


def _lay(**kw):
    return from_layouts([Layout(**{**dict(gpus=8, dp=8, global_batch=8, seq=4096), **kw})])


def test_a_model_with_windowed_layers_averages_their_tiles_by_their_flops():
    m = load_model("gpt-oss-120b")
    lay = _lay(ep=8)
    f, _ = attention_tiles(m, GB200, lay)
    full, _ = block_factor(GB200, 4096)
    win, _ = block_factor(GB200, 4096, window=128)
    s = 4096.0
    share = 0.5 * 0.5 * s / float(m.attended_keys(s))  # half the layers are full
    assert f[0] == pytest.approx(share * full + (1 - share) * win)
    assert win > 3.0 * full  # a 128-token window's tile does little work for its pass


def test_a_long_sequence_layer_costs_what_the_law_gives_over_the_plateau():
    m = load_model("llama3-8b")
    flat = GB200.model_copy(update={"efficiency": GB200.efficiency.model_copy(update={"attention_blocks": None})})
    lay = _lay(seq=65536, global_batch=8)
    ovh = GB200.efficiency.kernel_overhead_us * 1e-6
    a, b = (core_attention(m, hw, lay, "bf16").f[0] - ovh for hw in (GB200, flat))
    assert a / b == pytest.approx(block_factor(GB200, 65536)[0], rel=1e-9)


@pytest.mark.parametrize("blocks", ["{forward: -1}", "{fwd: 2.0}", "{forward: 2.0, block: 0}"])
def test_a_spec_whose_block_costs_cannot_be_a_kernels_is_refused_in_one_line(tmp_path, blocks):
    p = tmp_path / "s.yaml"
    p.write_text(f"base: dgx-h200\nefficiency: {{attention_blocks: {blocks}}}\n")
    with pytest.raises(SpecError) as e:
        load_hardware(str(p))
    msg = str(e.value)
    assert "attention_blocks" in msg and "\n" not in msg and msg.startswith(str(p))


def test_chunked_local_layers_run_causal_within_their_chunk():
    m = load_model("llama4-scout")  # aligned 8,192-token chunks, every 4th layer full
    lay = _lay(ep=8, seq=32768)
    f, b = attention_tiles(m, GB200, lay)
    s = 32768.0
    share = 0.25 * 0.5 * s / float(m.attended_keys(s))
    for got, i in ((f, 0), (b, 1)):
        want = share * block_factor(GB200, s)[i] + (1 - share) * block_factor(GB200, 8192)[i]
        assert got[0] == pytest.approx(want)


def test_flashattention2_layers_keep_their_flat_rate_at_any_length():
    m = load_model("llama3-8b")
    h100 = load_hardware("dgx-h100")
    flat = h100.model_copy(update={"efficiency": h100.efficiency.model_copy(update={"attention_blocks": None})})
    lay = from_layouts([Layout(gpus=8, dp=8, global_batch=8, seq=65536, attention_kernel="fa2")])
    a, b = (core_attention(m, hw, lay, "bf16") for hw in (h100, flat))
    assert (a.f[0], a.b[0]) == (b.f[0], b.b[0])
    cudnn = from_layouts([Layout(gpus=8, dp=8, global_batch=8, seq=65536)])
    assert core_attention(m, h100, cudnn, "bf16").f[0] < core_attention(m, flat, cudnn, "bf16").f[0]


def test_a_spec_stating_only_the_forwards_cost_uses_it_for_the_backward():
    one = GB200.model_copy(update={"efficiency": GB200.efficiency.model_copy(
        update={"attention_blocks": GB200.efficiency.attention_blocks.model_copy(update={"backward": None})})})
    f, b = block_factor(one, 32768)
    assert f == b == pytest.approx(block_factor(GB200, 32768)[0])
