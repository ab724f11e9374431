"""search(keep=k) prices the space PRICE_CHUNK layouts at a time and keeps only the best k, the
leanest fitting and the leanest of all: the ranking, the figures and the counts it reports are those of
the one search over every layout, and no pricing call holds more than a chunk (`piper-plan search`
on a wide space was killed for memory)."""
import numpy as np
import pytest

import piper_plan.search as S
from piper_plan.search import SearchSpace, diagnose, search
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
def test_the_leanest_found_chunk_by_chunk_is_the_one_np_argmin_picks_over_all(peaks):
    peaks = np.array(peaks)  # ties: the first lowest; a NaN: the first NaN
    for size in (1, 2, 3, len(peaks)):
        lean = None
        for s in range(0, len(peaks), size):
            lean = S._leaner(lean, peaks[s:s + size], np.arange(s, min(s + size, len(peaks))))
        assert lean[1] == np.argmin(peaks)
