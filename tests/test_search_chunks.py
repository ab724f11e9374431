"""search(keep=k) enumerates the space ENUM_CELLS grid cells at a time, prices it PRICE_CHUNK layouts at
a time and keeps only the best k, the leanest fitting and the leanest of all: the ranking, the figures and
the counts it reports are those of the one search over every layout, and no enumeration step or pricing
call holds more than a slice or a chunk (`piper-plan search` on a wide space was killed for memory)."""
from dataclasses import fields

import numpy as np
import pytest

import piper_plan.search as S
from piper_plan.cost.batch import LayoutBatch, concat
from piper_plan.diagnose import diagnose
from piper_plan.search import SearchSpace, search
from piper_plan.specs.registry import load_hardware, load_model

MIXTRAL, LLAMA70, H100 = load_model("mixtral-8x7b"), load_model("llama3-70b"), load_hardware("dgx-h100")
SPACE = SearchSpace(gpus=16, global_batch=128, seq=4096)  # 10,668 layouts priced, 4,035 fit


def _rows(res, idx):
    return [(res.batch.layout(int(i)).model_dump(), res.est.row(int(i)), str(res.est.dominant()[int(i)]))
            for i in idx]


@pytest.mark.parametrize("objective, headroom", [("throughput", 0.0), ("mfu", 8.0), ("memory", 0.0)])
def test_the_best_kept_from_small_chunks_rank_and_price_as_in_the_search_over_every_layout(monkeypatch, objective,
                                                                                           headroom):
    full = search(MIXTRAL, H100, SPACE, objective=objective, headroom_gib=headroom)
    monkeypatch.setattr(S, "PRICE_CHUNK", 97)  # over a hundred chunks: the best and their ties spread over them
    kept = search(MIXTRAL, H100, SPACE, objective=objective, headroom_gib=headroom, keep=10)
    assert _rows(kept, kept.order[:10]) == _rows(full, full.order[:10])
    assert kept.fitting == len(full.order) > 10
    assert (kept.rejected, kept.evaluated) == (full.rejected, full.evaluated)
    # the memory note's leanest fitting plan, wherever it ranks
    assert kept.est.peak_memory_gib[kept.order].min() == full.est.peak_memory_gib[full.order].min()


# 16 GPUs: 450 layouts priced, none fits; 8: every layout refused by the state bound, none priced
@pytest.mark.parametrize("gpus", [16, 8])
def test_where_nothing_fits_the_kept_search_diagnoses_as_the_search_over_every_layout(monkeypatch, gpus):
    sp = SearchSpace(gpus=gpus, global_batch=64, seq=32768)
    full = search(LLAMA70, H100, sp)
    monkeypatch.setattr(S, "PRICE_CHUNK", 97)
    monkeypatch.setattr(S, "ENUM_CELLS", 1000)  # diagnose prices every layout slice by slice too
    kept = search(LLAMA70, H100, sp, keep=10)
    assert full.best is None and kept.best is None and len(kept.batch) == min(len(full.batch), 1)  # the leanest
    assert diagnose(LLAMA70, H100, sp, kept) == diagnose(LLAMA70, H100, sp, full)


def test_the_kept_rows_report_the_offload_time_where_the_space_parks_activations_as_the_search_over_all():
    # the best and the leanest of Llama 3 8B on 8 GB200 park nothing, others do: a step's breakdown
    # has "offload" (0.0 for them) only where a layout priced beside them parks activations
    llama8, gb200 = load_model("llama3-8b"), load_hardware("gb200-nvl72")
    sp = SearchSpace(gpus=8, global_batch=256, seq=4096, offload_modules=((), ("attn_norm",)))
    full, kept = search(llama8, gb200, sp), search(llama8, gb200, sp, keep=1)
    assert "offload" in kept.est.row(kept.best)["time_breakdown_s"]
    assert _rows(kept, kept.order[:1]) == _rows(full, full.order[:1])


def test_no_pricing_call_of_a_kept_search_holds_more_than_a_chunk(monkeypatch):
    sizes, price = [], S.evaluate
    monkeypatch.setattr(S, "evaluate", lambda m, hw, lay, *a: sizes.append(len(lay)) or price(m, hw, lay, *a))
    monkeypatch.setattr(S, "PRICE_CHUNK", 500)
    res = search(MIXTRAL, H100, SPACE, keep=3)
    assert res.evaluated > 20 * 500 and max(sizes) <= 500
    assert len(res.batch) <= 5 and res.fitting > 1000  # the 3 best, the leanest fitting and the leanest of all


@pytest.mark.parametrize("peaks", [[3.0, 1.0, 2.0, 1.0, 4.0, 1.0], [3.0, 1.0, np.nan, 1.0, np.nan]])
@pytest.mark.parametrize("backwards", [False, True])
def test_the_leanest_found_chunk_by_chunk_is_the_one_np_argmin_picks_over_all(peaks, backwards):
    # chunks come out of enumeration order where the space has host-offloading choices (crossed outermost)
    peaks = np.array(peaks)  # ties: the first lowest; a NaN: the first NaN
    for size in (1, 2, 3, len(peaks)):
        lean = None
        starts = range(0, len(peaks), size)
        for s in reversed(starts) if backwards else starts:
            lean = S._leaner(lean, peaks[s:s + size], np.arange(s, min(s + size, len(peaks))))
        assert lean[1] == np.argmin(peaks)


LLAMA8, GB200 = load_model("llama3-8b"), load_hardware("gb200-nvl72")
# spaces whose rules first remove layouts in different slices, one with host-offloading choices (the
# enumeration order crosses them outermost, so a slice's layouts are not contiguous in it)
SLICED = [(MIXTRAL, H100, SearchSpace(gpus=16, global_batch=128, seq=4096, hsdp=True, recompute_layers=(0, 1)),
           "mfu", 8.0),
          (LLAMA8, GB200, SearchSpace(gpus=8, global_batch=256, seq=4096, optimizer_offload=(0.0, 0.5),
                                      offload_modules=((), ("attn_norm",))), "throughput", 0.0)]


@pytest.mark.parametrize("m, hw, sp, objective, headroom", SLICED)
def test_the_best_kept_from_one_tuple_a_slice_rank_price_and_count_as_the_search_over_every_layout(
        monkeypatch, m, hw, sp, objective, headroom):
    full = search(m, hw, sp, objective=objective, headroom_gib=headroom)
    monkeypatch.setattr(S, "ENUM_CELLS", 1)  # a slice per (tp, cp, pp, dp, ep, etp) tuple
    monkeypatch.setattr(S, "PRICE_CHUNK", 97)
    kept = search(m, hw, sp, objective=objective, headroom_gib=headroom, keep=10)
    assert _rows(kept, kept.order[:10]) == _rows(full, full.order[:10])
    # the rules in the order the search over every layout lists them, whichever slice each first removes from
    assert list(kept.rejected.items()) == list(full.rejected.items())
    assert (kept.evaluated, kept.fitting) == (full.evaluated, len(full.order))
    lean = int(np.argmin(full.est.peak_memory_gib))  # the leanest of all, which diagnose reads
    assert kept.batch.layout(int(np.argmin(kept.est.peak_memory_gib))) == full.batch.layout(lean)


# 26 (tp, cp, pp, dp, ep, etp) tuples of 960 grid cells each, host-offloading choices included
TUPLES26 = SearchSpace(gpus=64, global_batch=512, seq=4096, mbs=(1, 2), optimizer_offload=(0.0, 0.5),
                       offload_modules=((), ("attn_norm",)))


def test_the_slices_sorted_by_their_keys_are_the_layouts_enumerated_at_once_row_for_row():
    whole, rejected = S.enumerate_layouts(LLAMA8, GB200, TUPLES26, 0.0)
    counted = {}
    parts = list(S.enumerate_slices(LLAMA8, GB200, TUPLES26, counted, 0.0, cells=1))
    lay, key = concat([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    assert len(parts) == 26 and len(lay) == len(whole) == len(np.unique(key))
    at = np.argsort(key)
    assert all(np.array_equal(getattr(lay, f.name)[at], getattr(whole, f.name)) for f in fields(LayoutBatch))
    assert list(S._counted(counted).items()) == list(rejected.items())


def test_no_enumeration_step_of_a_kept_search_builds_more_than_a_slice(monkeypatch):
    sp = TUPLES26
    n_all = search(LLAMA8, GB200, sp).evaluated
    built, slices, make, enum = [], [], S._batch, S.enumerate_slices
    monkeypatch.setattr(S, "_batch", lambda cols, j, *a: built.append(len(j)) or make(cols, j, *a))
    monkeypatch.setattr(S, "enumerate_slices", lambda *a: (slices.append(len(p[0])) or p for p in enum(*a)))
    monkeypatch.setattr(S, "ENUM_CELLS", 2000)  # two tuples a slice
    res = search(LLAMA8, GB200, sp, keep=3)
    assert res.evaluated == n_all > 5 * 2000 and len(slices) == 13
    assert max(built) <= 2000 and max(slices) <= 2000  # the state bound's layouts, a slice's with offload choices
