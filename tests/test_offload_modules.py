"""Megatron-Core's fine-grained activation offloading (Layout.offload_modules): the listed modules'
saved tensors wait in host memory between each layer's forward and backward, one layer's staying
on the device, and their copies run behind the rank's compute (cost/activations.OFFLOAD_TERMS,
cost/offload.py)."""
import numpy as np
import pytest
from click.testing import CliRunner

from piper_plan.cli import main
from piper_plan.cost import activations as act
from piper_plan.cost.batch import from_layouts
from piper_plan.cost.estimate import evaluate
from piper_plan.cost.memory import GIB
from piper_plan.errors import LayoutError, PiperError
from piper_plan.layout import Layout, check_layout
from piper_plan.search import SearchSpace, for_runtime
from piper_plan.specs import load_hardware, load_model

GB200 = load_hardware("gb200-nvl72")
MIXTRAL = load_model("mixtral-8x7b")
BASE = dict(gpus=8, pp=1, dp=8, ep=8, mbs=1, global_batch=64, seq=4096, zero=1)
EXPERTS = ("expert_fc1", "moe_act")


def _lay(**kw):
    return Layout(**{**BASE, **kw})


def _est(hw=GB200, m=MIXTRAL, **kw):
    return evaluate(m, hw, from_layouts([_lay(**kw)]))


def _first(est, key):
    return float(est.memory["first"][key][0])


def test_the_experts_inputs_leave_the_device_but_for_one_layer_and_wait_on_the_host():
    kept, parked = _est(), _est(offload_modules=EXPERTS)
    lay = from_layouts([_lay(offload_modules=EXPERTS)])
    terms = act.moe_terms(MIXTRAL, lay, parked.imbalance, GB200.accelerator.expert_row_multiple)
    per_layer = float(terms["expert_in"][0] + terms["expert_hidden"][0])
    # one stage, one micro-batch in flight: every layer's copy goes but the last one's (its backward runs first)
    moved = (MIXTRAL.num_layers - 1) * per_layer / GIB
    assert _first(kept, "activations") - _first(parked, "activations") == pytest.approx(moved)
    assert _first(parked, "host") == pytest.approx(moved)
    assert float(kept.peak_memory_gib[0]) - float(parked.peak_memory_gib[0]) == pytest.approx(moved)


def test_the_copies_run_behind_compute_and_only_what_they_outlast_shows():
    def link(gbps):
        return GB200.model_copy(update={"host": GB200.host.model_copy(update={"link_gbps": gbps})})
    for hw in (link(10_000.0), GB200, link(1.0)):
        kept, parked = _est(hw=hw), _est(hw=hw, offload_modules=EXPERTS)
        exposed = float(parked.time["offload"][0])
        assert float(parked.step_time_s[0]) == pytest.approx(float(kept.step_time_s[0]) + exposed)
        if hw.host.link_gbps > 1_000:
            assert exposed == 0.0  # a fast link hides every copy behind the layer's compute
    # Mixtral's experts keep 2 x 14,336 wide fc1 outputs: at the C2C's 146 GB/s a layer's copies
    # outlast its forward, so offloading them costs time on GB200 (1.0 GB/s: far more)
    assert 0.0 < float(_est(offload_modules=EXPERTS).time["offload"][0]) < exposed


def test_full_recompute_saves_only_layer_inputs_so_nothing_is_offloaded():
    kept, parked = _est(recompute="full"), _est(recompute="full", offload_modules=EXPERTS)
    assert float(parked.peak_memory_gib[0]) == pytest.approx(float(kept.peak_memory_gib[0]))
    assert float(parked.step_time_s[0]) == pytest.approx(float(kept.step_time_s[0]))


def test_a_fused_norm_is_no_module_of_its_own_so_the_qkv_linear_carries_its_input():
    def parked(mods, **kw):
        lay = from_layouts([_lay(offload_modules=mods, **kw)])
        terms = act.attention_terms(MIXTRAL, lay)
        return act.module_offload_bytes(MIXTRAL, lay, 1.0)[1][0], terms
    nothing, _ = parked(("attn_norm",))
    qkv, terms = parked(("qkv_linear",))
    assert nothing == 0.0  # Transformer Engine's LayerNormLinear: the norm module is an IdentityOp
    assert qkv == pytest.approx(terms["attn_norm_in"][0] + terms["qkv_in"][0])
    split = dict(recompute="selective", recompute_modules=("layernorm",))
    norm, terms = parked(("attn_norm",), **split)  # layernorm recompute: the norm is a module, its output re-made
    assert norm == pytest.approx(terms["attn_norm_in"][0]) and terms["qkv_in"][0] == 0.0


def test_tensors_below_megatrons_minimum_stay_on_the_device():
    lay = from_layouts([_lay(seq=16, global_batch=64, offload_modules=("core_attn", "attn_proj", *EXPERTS))])
    assert act.module_offload_bytes(MIXTRAL, lay, 1.0)[1][0] == 0.0  # 16 tokens: every tensor under 1M elements
    lay = from_layouts([_lay(seq=64, global_batch=64, offload_modules=EXPERTS)])
    terms = act.moe_terms(MIXTRAL, lay, 1.0)
    # 128 routed rows: fc1's input (x 4,096) stays, its output (x 28,672: 3.7M elements) goes
    assert act.module_offload_bytes(MIXTRAL, lay, 1.0)[1][0] == pytest.approx(terms["expert_hidden"][0])


@pytest.mark.parametrize("mods, graphs, fused, rule", [
    (("attn_proj",), (), True, "attn_proj with core_attn"),
    (("mlp_norm",), ("attn",), True, "without norms under CUDA graphs"),
    (EXPERTS, (), False, "needs fused kernels"),
])
def test_offloading_refuses_what_megatron_core_cannot_run(mods, graphs, fused, rule):
    with pytest.raises(LayoutError, match=rule):
        check_layout(_lay(offload_modules=mods, cuda_graphs=graphs, fused_kernels=fused), MIXTRAL.num_layers,
                     MIXTRAL.moe.num_experts)
    with pytest.raises(LayoutError, match=rule):
        SearchSpace(gpus=8, global_batch=64, seq=4096, offload_modules=((), mods), cuda_graphs=graphs,
                    fused_kernels=fused)


def test_piper_train_keeps_its_activations_on_the_device():
    with pytest.raises(PiperError, match="--offload-modules"):
        for_runtime(SearchSpace(gpus=8, global_batch=8, seq=4096, offload_modules=((), EXPERTS)), "piper-train")


@pytest.mark.parametrize("args, names", [
    (["-m", "mixtral-8x7b", "-H", "gb200-nvl72", "--offload-modules", "expert_fc2"], "--offload-modules"),
    (["-m", "llama3-70b", "-H", "gb200-nvl72", "--tp", "8", "--offload-modules", "moe_act"], "llama3-70b"),
    (["-m", "mixtral-8x7b", "-H", "dgx-h100", "--offload-modules", "expert_fc1"], "dgx-h100"),
])
def test_the_cli_refuses_a_bad_offload_in_one_line(args, names):
    r = CliRunner().invoke(main, ["estimate", "-n", "8", *args])
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert names in r.output and len(r.output.strip().splitlines()) == 1


def test_the_published_qwen3_235b_gb200_run_fits_as_its_script_offloaded():
    """The Megatron-Core report's Qwen3-235B GB200 MXFP8 run (919 TFLOPS) offloads its experts' fc1
    and activation inputs (its reproduction script: --offload-modules expert_fc1 moe_act); without
    that the model puts its first stage at 202 GiB of the device's 185."""
    from piper_plan import validate as V

    row = next(r for r in V.run() if r.id == "mcore-qwen3-235b-gb200-mxfp8")
    assert row.peak_memory_gib < row.device_memory_gib
    rows = V.read_rows(V.data_path())
    bare = dict(next(r for r in rows if r["id"] == row.id), offload_modules="")
    lay = V.row_layout(bare)
    assert lay.offload_modules == ()
    est = evaluate(load_model("qwen3-235b-a22b"), GB200, from_layouts([lay]))
    assert float(est.peak_memory_gib[0]) > row.device_memory_gib
    assert np.isfinite(row.predicted) and abs(row.error_pct) < 10.0


def test_the_search_tries_each_offload_set_as_a_choice_and_keeps_what_pays():
    """DeepSeek-V3 on 112 GB200 with FP8 weights (as Megatron's MXFP8 recipes keep them): without
    offloading the best plan recomputes every layer; parking the experts' fc1 and activation
    inputs on the Grace host lets a plan that recomputes nothing fit, and the search, trying both
    sets, finds it faster."""
    from piper_plan.search import search

    m = load_model("deepseek-v3")
    space = dict(gpus=112, global_batch=1024, seq=4096, fp8="mxfp8", fp8_params=True, expert_probs="activation")
    kept = search(m, GB200, SearchSpace(**space))
    both = search(m, GB200, SearchSpace(**space, offload_modules=((), EXPERTS)))
    assert len(both.batch) == 2 * len(kept.batch)
    assert kept.batch.layout(kept.best).recompute == "full"
    best = both.batch.layout(both.best)
    assert best.offload_modules == EXPERTS and best.recompute != "full"
    assert float(both.est.tokens_per_s[both.best]) > 1.1 * float(kept.est.tokens_per_s[kept.best])
    r = CliRunner().invoke(main, ["search", "-m", "deepseek-v3", "-H", "gb200-nvl72", "-n", "112", "--global-batch",
                                  "1024", "--fp8", "mxfp8", "--fp8-params", "--expert-probs", "activation",
                                  "--offload-modules", "none",
                                  "--offload-modules", "expert_fc1,moe_act", "--top", "1"])
    assert r.exit_code == 0, r.output
    assert "offload(expert_fc1+moe_act)" in r.output


def test_a_table_row_naming_an_unknown_module_is_refused_in_one_line(tmp_path):
    import csv

    from piper_plan import validate as V

    row = dict(next(r for r in V.read_rows(V.data_path()) if r["id"] == "mcore-qwen3-235b-gb200-mxfp8"),
               offload_modules="expert_fc2+moe_act")
    path = tmp_path / "mine.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        w.writeheader()
        w.writerow(row)
    r = CliRunner().invoke(main, ["validate", "--table", str(path)])
    assert r.exit_code != 0 and "Traceback" not in r.output
    line = r.output.strip()
    assert len(line.splitlines()) == 1 and "offload_modules" in line and "'expert_fc2'" in line
