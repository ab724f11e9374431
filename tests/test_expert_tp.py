"""Expert tensor parallelism (Layout.etp): each expert split over etp ranks, its rows all-gathered
over them before the experts and reduce-scattered after (MoE Parallel Folding, arXiv 2504.14960
§3.3), as Megatron-Core runs it; its default before folding (etp = tp) is what the paper's "MCore"
baseline ran."""
import numpy as np
import pytest

from piper_plan.cost import comm
from piper_plan.cost.activations import moe_terms
from piper_plan.cost.batch import from_layouts
from piper_plan.cost.estimate import evaluate
from piper_plan.cost.memory import layer_params_per_rank
from piper_plan.errors import LayoutError, PiperError
from piper_plan.layout import Layout, check_degrees, rank_coords
from piper_plan.search import SearchSpace, enumerate_layouts, for_runtime
from piper_plan.specs import load_hardware, load_model

H100 = load_hardware("dgx-h100")
G8T8 = load_model("mixtral-8x22b").model_copy(update={"moe": load_model("mixtral-8x22b").moe.model_copy(
    update={"num_experts": 64, "top_k": 8, "expert_ffn_size": 2048})})  # the paper's fine-grained Mixtral


def _lay(**kw):
    base = dict(gpus=16, tp=2, dp=8, ep=4, global_batch=64, seq=4096)
    return Layout(**{**base, **kw})


def test_each_rank_holds_one_etp_th_of_its_local_experts_and_the_etp_groups_rows():
    m = load_model("mixtral-8x22b")
    whole, split = from_layouts([_lay(ep=4, etp=1)]), from_layouts([_lay(ep=4, etp=2)])
    assert layer_params_per_rank(m, split)[2][0] == pytest.approx(layer_params_per_rank(m, whole)[2][0] / 2)
    assert split.edp[0] == 2 and whole.edp[0] == 4  # dp·tp / (ep·etp)
    a1, a2 = (moe_terms(m, x, np.ones(1)) for x in (whole, split))
    assert a2["expert_in"][0] == pytest.approx(2 * a1["expert_in"][0])  # the gathered rows, d wide
    assert a2["expert_hidden"][0] == pytest.approx(a1["expert_hidden"][0])  # twice the rows, half the width
    assert a2["router_in"][0] == a1["router_in"][0]  # before the dispatch nothing changes


def test_expert_tensor_parallelism_costs_an_all_gather_and_a_reduce_scatter_each_way_inside_the_node():
    # one node: the EP group's members 2 ranks apart cross the same NVLink as 1 apart, so the
    # all-to-all is the same and what etp adds is its gather / scatter pair, forward and backward
    m = load_model("mixtral-8x22b")
    lays = [Layout(gpus=8, tp=2, dp=4, ep=2, etp=e, global_batch=64, seq=4096) for e in (1, 2)]
    whole, split = (evaluate(m, H100, from_layouts([x])) for x in lays)
    t = 4096 / 2 * m.moe.top_k * m.hidden_size * 2.0  # the rank's routed rows, bf16
    pair = float(comm.ring_allreduce(H100, np.array([t * 2]), np.array([2]), 1)[0])  # the etp group's rows
    layers = m.num_moe_layers * 64 // 4  # every layer, every micro-batch of the step
    added = float(split.time["a2a"][0] - whole.time["a2a"][0])
    assert added == pytest.approx(2 * pair * layers, rel=0.05)  # skew and imbalance move it a little
    assert split.peak_memory_gib[0] < whole.peak_memory_gib[0]  # half the expert weights and their state


def test_the_pre_folding_mapping_puts_the_fine_grained_exchange_across_nodes_and_loses_what_the_paper_measured():
    # Table 3: G8T8 on 128 H100, Megatron-Core (tp 2, ep 8 inside dp, so etp 2) 17.1 % MFU against
    # the fold's (tp 4, ep 8, etp 1) 28.8 %: the fold keeps the EP group inside a node
    mcore = Layout(gpus=128, tp=2, pp=8, dp=8, ep=8, etp=2, global_batch=256, seq=4096)
    fold = Layout(gpus=128, tp=4, pp=8, dp=4, ep=8, etp=1, global_batch=256, seq=4096)
    nodes = lambda lay: {c.node for c in rank_coords(lay, 8) if c.pp == 0 and c.edp == 0 and c.etp == 0}  # noqa: E731
    assert len(nodes(mcore)) == 2 and len(nodes(fold)) == 1  # one EP group's nodes
    a, b = (evaluate(G8T8, H100, from_layouts([x])) for x in (mcore, fold))
    assert a.time["a2a"][0] > 3 * b.time["a2a"][0]
    assert 1.35 < b.tflops_per_gpu[0] / a.tflops_per_gpu[0] < 2.0  # paper: 28.8 / 17.1 = 1.68


def test_expert_groups_order_etp_fastest_then_ep():
    coords = rank_coords(_lay(ep=4, etp=2), 8)
    etp_group = [c.rank for c in coords if (c.ep, c.edp) == (1, 1)]
    ep_group = [c.rank for c in coords if (c.edp, c.etp) == (1, 0)]
    assert etp_group == [10, 11] and ep_group == [8, 10, 12, 14]
    spread = rank_coords(_lay(ep=4, etp=2, placement="spread"), 8)
    assert [c.rank for c in spread if (c.edp, c.etp) == (0, 0)] == [0, 4, 8, 12]  # edp·etp apart


@pytest.mark.parametrize("kw, rule", [(dict(ep=8, etp=4), "ep*etp divides dp*tp"),
                                      (dict(ep=2, etp=3, tp=3, dp=4, gpus=12), "etp divides the expert width")])
def test_degrees_that_cannot_fold_are_refused_with_the_rule_named(kw, rule):
    with pytest.raises(LayoutError, match=rule.replace("*", r"\*")):
        check_degrees(_lay(**kw), 8, 16384)


def test_the_search_tries_the_expert_tensor_parallel_degrees_asked_for_and_only_valid_ones():
    m = load_model("mixtral-8x22b")
    sp = SearchSpace(gpus=64, global_batch=256, seq=4096, etps=(1, 2, 4), schedules=("1f1b",))
    batch, _ = enumerate_layouts(m, H100, sp)
    assert set(np.unique(batch.etp)) == {1, 2, 4}
    assert not ((batch.dp * batch.tp) % (batch.ep * batch.etp)).any()
    default, _ = enumerate_layouts(m, H100, SearchSpace(gpus=64, global_batch=256, seq=4096, schedules=("1f1b",)))
    assert set(np.unique(default.etp)) == {1}  # whole experts unless asked


def test_piper_train_refuses_expert_tensor_parallelism_in_the_search():
    # and at launch: tests/test_runtime_search.py holds the two refusals to the same table
    with pytest.raises(PiperError, match="--etp 2"):
        for_runtime(SearchSpace(gpus=8, global_batch=8, seq=512, etps=(1, 2)), "piper-train")


def test_a_searched_batch_prices_each_expert_tensor_parallel_layout_as_it_prices_it_alone():
    # the vectorised model prices distinct column combinations once: etp must be one of the keys
    m = load_model("mixtral-8x22b")
    batch, _ = enumerate_layouts(m, H100, SearchSpace(gpus=64, global_batch=256, seq=4096, etps=(1, 2, 4),
                                                      schedules=("1f1b",)))
    est = evaluate(m, H100, batch)
    pick = np.random.default_rng(0).choice(len(batch), 24, replace=False)
    assert set(batch.etp[pick]) == {1, 2, 4}
    for i in pick:
        one = evaluate(m, H100, from_layouts([batch.layout(int(i))]))
        assert one.step_time_s[0] == pytest.approx(est.step_time_s[i], rel=1e-12)
        assert one.peak_memory_gib[0] == pytest.approx(est.peak_memory_gib[i], rel=1e-12)


def test_the_cli_takes_expert_tensor_parallel_degrees_and_names_them_in_its_layouts():
    from click.testing import CliRunner

    from piper_plan.cli import main

    est = CliRunner().invoke(main, ["estimate", "-m", "mixtral-8x22b", "-H", "dgx-h100", "-n", "16", "--tp", "2",
                                    "--ep", "4", "--etp", "2", "--pp", "1", "--seq", "4096", "--global-batch", "64",
                                    "--recompute", "full", "--json"])
    assert est.exit_code == 0, est.output
    assert '"etp": 2' in est.output
    args = ["search", "-m", "mixtral-8x22b", "-H", "dgx-h100", "-n", "64", "--global-batch", "256", "--seq", "4096",
            "--schedules", "1f1b", "--top", "2000"]
    r = CliRunner().invoke(main, args + ["--etp", "1,2"])
    assert r.exit_code == 0, r.output
    assert " etp2 " in r.output.replace("\n", "")
    for bad in ("0", "1,x", ""):
        out = CliRunner().invoke(main, args + ["--etp", bad])
        assert out.exit_code != 0 and "--etp" in out.output and len(out.output.strip().splitlines()) == 1


def test_a_handed_over_schema_row_is_read_with_the_expert_tensor_parallelism_its_notes_state(tmp_path):
    # the handed-over schema (../shared/validation) has no etp column: "ETP n" in a row's notes
    # sets it, two different figures there leave it at 1
    import csv

    from piper_plan import validate as V

    src = next(r for r in csv.DictReader(open(V.data_path())) if r["id"] == "mb-dsv3-gb300-bf16")
    cols = [c for c in src if c not in ("cp", "etp")]
    path = tmp_path / "t.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerow({**src, "id": "two", "notes": "TP1 PP2 EP32 ETP 2"})
        w.writerow({**src, "id": "unclear", "notes": "ETP 2 in one run, ETP 4 in another"})
    res = {r.id: r for r in V.run(path=path)}
    assert " etp2 " in f" {res['two'].layout} " and "etp" not in res["unclear"].layout
