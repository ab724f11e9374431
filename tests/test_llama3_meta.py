"""Meta's Llama 3 405B pre-training runs (arXiv 2407.21783 Table 4), a stack and a machine the
bundled table never read: validation/llama3-405b-meta.csv on hardware/meta-h100-roce.yaml."""
import csv
import io

import numpy as np

from piper_plan import validate as V
from piper_plan.cost import comm
from piper_plan.specs.registry import load_hardware

TABLE = V.data_path().parent / "llama3-405b-meta.csv"


def test_meta_s_8k_to_16k_gpu_runs_price_within_the_dense_targets():
    # first priced (the table written before): +9.9 %, +9.8 %, +2.7 %
    res = V.run(path=TABLE)
    dense = V.summary(res)["kinds"]["dense"]
    assert dense["rows"] == 3
    assert dense["mape"] <= V.TARGETS["dense"][0] and dense["max_abs_pct"] <= V.TARGETS["dense"][1]
    assert all(r.predicted > 0 for r in res)


def test_the_paper_s_one_layer_chunks_are_what_make_the_16k_run_price_right(tmp_path):
    # Table 4's 16K run has 16 micro-batches for 16 stages: with one chunk a rank (vpp blank)
    # most of its step would be bubble
    rows = list(csv.DictReader(io.StringIO(TABLE.read_text())))
    for r in rows:
        r["vpp"] = ""
    flat_table = tmp_path / "one-chunk.csv"
    with flat_table.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    flat = {r.id: r.predicted for r in V.run(path=flat_table)}
    chunked = {r.id: r.predicted for r in V.run(path=TABLE)}
    assert flat["meta-l3-405b-16k"] < 0.75 * chunked["meta-l3-405b-16k"]


def test_the_meta_cluster_is_the_dgx_h100_node_on_a_network_oversubscribed_above_a_pod():
    meta, dgx = load_hardware("meta-h100-roce"), load_hardware("dgx-h100")
    assert meta.accelerator == dgx.accelerator and meta.efficiency == dgx.efficiency
    # one rank a pod: a ring between pods runs at 1/7 of the NIC rate, inside a pod at all of it
    across, _ = comm.group_span(meta, np.array([4]), np.array([3072]))
    inside, _ = comm.group_span(meta, np.array([4]), np.array([512]))
    assert np.isclose(across[0] / inside[0], 1 / 7, rtol=1e-3)


def test_the_account_split_s_two_extra_slots_let_estimate_and_search_reach_meta_s_layout():
    """126 layers, the embedding and the loss fill 128 one-slot chunks over pp 16 x vpp 8: the
    chunk-count bound counts the slots under the account split (it had refused 128 chunks for
    126 layers, so neither estimate nor search could reach the published layout)."""
    import pytest

    from piper_plan.layout import Layout, LayoutError, check_layout
    from piper_plan.search import SearchSpace, enumerate_layouts
    from piper_plan.specs.registry import load_model

    meta = dict(gpus=16384, tp=8, pp=16, dp=128, vpp=8, mbs=1, global_batch=2048, seq=8192,
                schedule="interleaved", recompute="none")
    check_layout(Layout(**meta, pipeline_split="account"), 126)
    with pytest.raises(LayoutError, match="pp\\*vpp <= layers"):
        check_layout(Layout(**meta, pipeline_split="balanced"), 126)
    sp = SearchSpace(gpus=16384, seq=8192, global_batch=2048, tps=(8,), pps=(16,), mbs=(1,), zeros=(1,),
                     recomputes=("none",), schedules=("interleaved",), pipeline_split="account")
    batch, _ = enumerate_layouts(load_model("llama3.1-405b"), load_hardware("meta-h100-roce"), sp)
    assert batch is not None and np.any((batch.pp == 16) & (batch.vpp == 8))


def test_the_account_split_s_slots_do_not_let_recompute_layers_pass_the_model_s_layers():
    """One chunk holds every layer: recompute_layers 33 of a 32-layer model is refused under the
    account split as under the balanced one (its two extra slots hold the embedding and the loss)."""
    import pytest

    from piper_plan.layout import Layout, LayoutError, check_layout

    one = dict(gpus=8, tp=1, pp=1, dp=8, mbs=1, global_batch=64, seq=4096, recompute="full")
    for split in ("account", "balanced"):
        with pytest.raises(LayoutError, match="recompute_layers <= the layers of a chunk"):
            check_layout(Layout(**one, recompute_layers=33, pipeline_split=split), 32)
    check_layout(Layout(**one, recompute_layers=32, pipeline_split="account"), 32)
