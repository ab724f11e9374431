"""Fused attention's block costs (Efficiency.attention_blocks, AttentionPlateau.blocks): the kernel
computes every 128x128 tile its mask touches and pays a fixed cost a query block's pass, so its
rate per FLOP rises with length and falls in narrow windows and context-parallel ring steps
(kernels.tile_cost, block_factor; compute.attention_tiles)."""
import numpy as np
import pytest

from piper_plan.cost.batch import from_layouts
from piper_plan.cost.compute import attention_tiles, core_attention
from piper_plan.cost.kernels import block_factor, tile_cost
from piper_plan.errors import SpecError
from piper_plan.layout import Layout
from piper_plan.specs import load_hardware, load_model
from piper_plan.validate_attention import attention_check, fit_block_costs, fit_chart_block_costs, price_row

GB200 = load_hardware("gb200-nvl72")
H100 = load_hardware("dgx-h100")


def _tiles(mask, q_idx, k_idx, b):
    """Tiles of b x b a kernel touches and the query blocks it passes over: its queries and keys
    each one run of token positions (a rank's chunks joined end to end, as Transformer Engine
    hands them to the kernel), padded to whole tiles, mask(q, k) on token positions."""
    q_idx, k_idx = np.asarray(q_idx), np.asarray(k_idx)
    touched = 0
    for qt in range(0, len(q_idx), b):
        for kt in range(0, len(k_idx), b):
            touched += bool(mask(q_idx[qt:qt + b, None], k_idx[None, kt:kt + b]).any())
    return touched, -(-len(q_idx) // b)


def _brute(c, s, w=None, cp=1, b=16):
    """tile_cost by enumeration: the slowest rank's tiles + c x passes, times cp, over the counted
    tiles (s²/2, or s·w − w²/2). Under cp > 1, Transformer Engine's load-balanced P2P ring for every
    rank: rank r holds chunks r and 2cp−1−r of L tokens; step 0 its own chunks causal; step i
    (sender r − i mod cp) all its queries against the sender's first chunk where i <= r, else its
    second chunk's queries against both of the sender's."""
    causal = (lambda q, k: k <= q) if w is None else (lambda q, k: (k <= q) & (k > q - w))
    if cp == 1:
        touched, passes = _tiles(causal, range(s), range(s), b)
        worst = touched + c * passes
    else:
        L = s // (2 * cp)
        chunk = lambda j: list(range(j * L, (j + 1) * L))  # noqa: E731
        pair = lambda r: chunk(r) + chunk(2 * cp - 1 - r)  # noqa: E731
        worst = 0.0
        for r in range(cp):
            t, p = _tiles(causal, pair(r), pair(r), b)
            for i in range(1, cp):
                src = (r - i) % cp
                q, k = (pair(r), chunk(src)) if i <= r else (chunk(2 * cp - 1 - r), pair(src))
                dt, dp = _tiles(causal, q, k, b)
                t, p = t + dt, p + dp
            worst = max(worst, t + c * p)
    counted = (s * s / 2.0 if w is None else s * min(w, s) - min(w, s) ** 2 / 2.0) / b ** 2
    return worst * cp / counted


@pytest.mark.parametrize("s, w, cp", [(256, None, 1), (200, None, 1), (10, None, 1), (256, 32, 1), (256, 40, 1),
                                      (256, 8, 1), (512, None, 2), (512, None, 4), (480, None, 4), (96, None, 4),
                                      (256, None, 8), (384, None, 4), (264, None, 2)])
def test_the_closed_form_counts_the_tiles_and_passes_transformer_engines_kernels_make(s, w, cp):
    assert tile_cost(2.5, s, w, cp, block=16) == pytest.approx(_brute(2.5, s, w, cp))


def test_a_window_runs_no_ring_and_is_causal():
    for kw in (dict(cp=2), dict(causal=False)):
        with pytest.raises(ValueError, match="runs no context-parallel ring"):
            tile_cost(2.0, 4096, window=128, **kw)


def test_long_sequences_approach_the_simple_forms():
    c, b, n = 3.0, 128, 4096.0
    assert tile_cost(c, n * b, block=b) == pytest.approx((n + 1 + 2 * c) / n)
    assert tile_cost(c, n * b, causal=False, block=b) == pytest.approx(1 + c / n)
    assert tile_cost(c, n * b, cp=4, causal=False, block=b) == pytest.approx(1 + 4 * c / n)  # a pass a ring step
    assert tile_cost(c, n * b, cp=8, block=b) == pytest.approx((n + 1 + 2 * c * 8) / n)
    # GPT-OSS's 128-token window: each query block touches its own tile and the one before
    assert tile_cost(c, n * b, window=b, block=b) == pytest.approx((1 + (n - 1) * 2 + c * n) / (n - 0.5))


def test_a_window_as_long_as_the_sequence_is_plain_causal_attention():
    for w in (4096, 8192):
        assert tile_cost(2.0, 4096, window=w) == pytest.approx(tile_cost(2.0, 4096))


def test_the_plateau_holds_where_it_was_measured_and_per_flop_time_falls_with_length():
    assert block_factor(GB200, 4096) == pytest.approx((1.0, 1.0))
    f = [block_factor(GB200, s)[0] for s in (2048, 4096, 8192, 32768, 131072)]
    assert all(a > b for a, b in zip(f, f[1:]))
    c = GB200.efficiency.attention_blocks.forward  # towards the kernel's asymptote: (n+1+2c)/n -> 1
    assert block_factor(GB200, 1 << 24)[0] == pytest.approx(1 / tile_cost(c, 4096.0), rel=1e-3)


def test_each_ring_step_of_context_parallelism_pays_a_pass_over_the_ranks_query_blocks():
    f1, f8 = block_factor(GB200, 131072)[0], block_factor(GB200, 131072, cp=8)[0]
    assert f1 < f8 < block_factor(GB200, 4096)[0]  # dearer than one rank, still cheaper than 4k


def test_specs_without_block_costs_keep_one_rate():
    for hw in ("dgx-a100-80gb", "frontier", "amd-mi300x", "cpu-local"):
        assert load_hardware(hw).efficiency.attention_blocks is None
        assert block_factor(load_hardware(hw), 65536) == (1.0, 1.0)
    assert block_factor(load_hardware("dgx-a100-80gb"), 65536, kernel="fa2") == (1.0, 1.0)
    assert block_factor(H100, 65536, kernel="eager") == (1.0, 1.0)


@pytest.mark.parametrize("spec, sweep", [
    ("gb200-nvl72", "gb200-nvl72"), ("dgx-b200", "gb200-nvl72"), ("gb300-nvl72", "gb300-nvl72"),
    ("dgx-b300", "gb300-nvl72"), ("dgx-h200", "dgx-h200"), ("dgx-h100", "dgx-h200"), ("dgx-h800", "dgx-h200"),
    ("meta-h100-roce", "dgx-h200")])
def test_each_spec_states_the_costs_fitted_to_its_kernels_unmasked_sweep(spec, sweep):
    bl = load_hardware(spec).efficiency.attention_blocks
    assert (bl.forward, bl.backward) == tuple(round(x, 2) for x in fit_block_costs(sweep))
    assert (bl.block, bl.seq) == (128, 4096)


@pytest.mark.parametrize("spec", ["dgx-h100", "dgx-h200", "dgx-h800", "meta-h100-roce"])
def test_flashattention2_states_the_costs_fitted_to_the_fa3_papers_h100_charts(spec):
    bl = load_hardware(spec).efficiency.attention_fa2.blocks
    assert (bl.forward, bl.backward) == tuple(round(x, 2) for x in fit_chart_block_costs("fa2"))
    # far smaller than cuDNN 9.19's on the same GPU: FlashAttention-2's rate barely moves with length
    assert bl.forward < 0.5 < bl.backward < load_hardware(spec).efficiency.attention_blocks.backward


def test_the_fa3_charts_show_an_older_cudnn_that_gained_nothing_with_length():
    # cuDNN of mid-2024 on H100, unmasked 609 / 600 / 595 TFLOPS at 4k / 8k / 16k: no fixed cost a
    # forward pass, against cuDNN 9.19's 2.00 on H200 (validation/README.md, the two readings)
    f, b = fit_chart_block_costs("cudnn")
    assert (round(f, 2), round(b, 2)) == (0.0, 1.61)
    assert f < H100.efficiency.attention_blocks.forward and b < H100.efficiency.attention_blocks.backward


def test_flashattention2s_causal_chart_rows_follow_its_law_out_of_sample():
    import csv
    from piper_plan.validate_attention import FA3_CHARTS, TABLES
    rows = {int(r["seq"]): float(r["tflops"]) for r in csv.DictReader(open(TABLES / FA3_CHARTS))
            if r["kernel"] == "fa2" and r["mask"] == "causal"}
    for s in (2048, 8192, 16384):
        pred = block_factor(H100, 4096, kernel="fa2")[0] / block_factor(H100, s, kernel="fa2")[0]
        assert pred == pytest.approx(rows[s] / rows[4096], rel=0.03), s


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
    f, _ = attention_tiles(m, GB200, _lay(ep=8))
    full, _ = block_factor(GB200, 4096)
    win, _ = block_factor(GB200, 4096, window=128)
    s = 4096.0
    share = 0.5 * 0.5 * s / float(m.attended_keys(s))  # half the layers are full
    assert f[0] == pytest.approx(share * full + (1 - share) * win)
    assert win > 3.0 * full  # a 128-token window's tile does little work for its pass


def test_a_model_with_windowed_layers_runs_its_context_parallelism_as_gathered_or_exchanged_heads():
    # Transformer Engine runs sliding windows only with all-gather or all-to-all CP (layout.cp_comm_refusal):
    # all_gather's two kernels a rank, one pass over each chunk's query blocks, for the full layers too;
    # a2a's one kernel over the whole sequence, one rank's
    m = load_model("gpt-oss-120b")
    whole = attention_tiles(m, GB200, _lay(ep=8, seq=16384))
    gathered, heads = (attention_tiles(m, GB200, from_layouts([Layout(gpus=8, dp=2, cp=4, ep=8, global_batch=2,
                                                                      seq=16384, cp_comm=c)]))
                       for c in ("all_gather", "a2a"))
    assert heads == whole
    share = 0.5 * 0.5 * 16384 / float(m.attended_keys(16384.0))  # every second layer full
    for got, i in ((gathered[0], 0), (gathered[1], 1)):
        full = block_factor(GB200, 16384, cp=4, comm="all_gather")[i]
        win = block_factor(GB200, 16384, window=m.sliding_window, cp=4, comm="all_gather")[i]
        assert got[0] == pytest.approx(share * full + (1 - share) * win)
    # a 16K sequence's chunks start on a block's edge: the windows cost what one rank's do
    assert gathered[0][0] == pytest.approx(whole[0][0], rel=0.01)
    dense = load_model("llama3-8b")  # full layers only: the P2P ring, a pass a step
    cp4 = from_layouts([Layout(gpus=8, dp=2, cp=4, global_batch=2, seq=16384)])
    assert attention_tiles(dense, GB200, cp4)[0][0] == pytest.approx(block_factor(GB200, 16384, cp=4)[0])
    assert attention_tiles(dense, GB200, cp4)[0][0] > block_factor(GB200, 16384)[0]


def test_chunked_local_layers_run_causal_within_their_chunk():
    m = load_model("llama4-scout")  # aligned 8,192-token chunks, every 4th layer full
    f, b = attention_tiles(m, GB200, _lay(ep=8, seq=32768))
    s = 32768.0
    share = 0.25 * 0.5 * s / float(m.attended_keys(s))
    for got, i in ((f, 0), (b, 1)):
        assert got[0] == pytest.approx(share * block_factor(GB200, s)[i] + (1 - share) * block_factor(GB200, 8192)[i])
    # 12,288 tokens: one whole chunk and a last one of 4,096, each priced at its own length, weighted
    # by its counted FLOPs (8192² against 4096²)
    f, _ = attention_tiles(m, GB200, _lay(ep=8, seq=12288))
    s = 12288.0
    share = 0.25 * 0.5 * s / float(m.attended_keys(s))
    local = (8192.0 ** 2 * block_factor(GB200, 8192)[0] + 4096.0 ** 2 * 1.0) / (8192.0 ** 2 + 4096.0 ** 2)
    assert f[0] == pytest.approx(share * block_factor(GB200, s)[0] + (1 - share) * local)


def test_a_long_sequence_layer_costs_what_the_law_gives_over_the_plateau():
    m = load_model("llama3-8b")
    flat = GB200.model_copy(update={"efficiency": GB200.efficiency.model_copy(update={"attention_blocks": None})})
    lay = _lay(seq=65536)
    ovh = GB200.efficiency.kernel_overhead_us * 1e-6
    a, b = (core_attention(m, hw, lay, "bf16").f[0] - ovh for hw in (GB200, flat))
    assert a / b == pytest.approx(block_factor(GB200, 65536)[0], rel=1e-9)


def test_flashattention2_layers_run_at_their_own_block_costs():
    m = load_model("llama3-8b")
    no_fa2_blocks = H100.model_copy(update={"efficiency": H100.efficiency.model_copy(update={
        "attention_fa2": H100.efficiency.attention_fa2.model_copy(update={"blocks": None})})})
    lay = from_layouts([Layout(gpus=8, dp=8, global_batch=8, seq=65536, attention_kernel="fa2")])
    ovh = H100.efficiency.kernel_overhead_us * 1e-6
    a, b = (core_attention(m, hw, lay, "bf16") for hw in (H100, no_fa2_blocks))
    assert (a.f[0] - ovh) / (b.f[0] - ovh) == pytest.approx(block_factor(H100, 65536, kernel="fa2")[0], rel=1e-9)
    # it gains less with length than cuDNN's kernel does
    assert block_factor(H100, 65536)[0] < block_factor(H100, 65536, kernel="fa2")[0] < 1.0


def test_a_spec_stating_only_the_forwards_cost_uses_it_for_the_backward():
    one = GB200.model_copy(update={"efficiency": GB200.efficiency.model_copy(
        update={"attention_blocks": GB200.efficiency.attention_blocks.model_copy(update={"backward": None})})})
    f, b = block_factor(one, 32768)
    assert f == b == pytest.approx(block_factor(GB200, 32768)[0])


@pytest.mark.parametrize("blocks", ["{forward: -1}", "{fwd: 2.0}", "{forward: 2.0, block: 0}",
                                    "{forward: 2.0, seq: 64}"])
def test_a_spec_whose_block_costs_cannot_be_a_kernels_is_refused_in_one_line(tmp_path, blocks):
    p = tmp_path / "s.yaml"
    p.write_text(f"base: dgx-h200\nefficiency: {{attention_blocks: {blocks}}}\n")
    with pytest.raises(SpecError) as e:
        load_hardware(str(p))
    msg = str(e.value)
    assert "attention_blocks" in msg and "\n" not in msg and msg.startswith(str(p))


def test_a_spec_without_block_costs_dumps_as_before_the_fields_existed():
    # plan.json embeds the spec and its hash (plan.spec_hash): a plan written before the fields
    # existed must still read, so a spec stating none writes neither key
    a100 = load_hardware("dgx-a100-80gb")  # FlashAttention-2's plateau, no block costs
    eff = a100.model_dump(mode="json")["efficiency"]
    assert "attention_blocks" not in eff and "blocks" not in eff["attention_fa2"]
    assert "blocks" in H100.model_dump(mode="json")["efficiency"]["attention_fa2"]
