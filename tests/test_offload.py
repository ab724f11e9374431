"""Host offloading (cost/offload.py): the optimizer state stepped by the host CPU (Megatron-Core
--optimizer-cpu-offload) and saved activations parked in host memory (Transformer Engine CPU
offloading), priced from the hardware spec's host section."""
import numpy as np
import pytest
from click.testing import CliRunner

from piper_plan.cli import main
from piper_plan.cost.batch import from_layouts
from piper_plan.cost.estimate import evaluate
from piper_plan.cost.memory import GIB
from piper_plan.cost.offload import HOST_DRAM_BYTES, LINK_IN_BYTES, LINK_OUT_BYTES
from piper_plan.cost.stages import materialise
from piper_plan.errors import LayoutError, PiperError
from piper_plan.layout import Layout, check_layout
from piper_plan.search import SearchSpace, for_runtime, search
from piper_plan.specs import load_hardware, load_model

GB200 = load_hardware("gb200-nvl72")
LLAMA70 = load_model("llama3-70b")


def _est(hw=GB200, m=LLAMA70, **kw):
    base = dict(gpus=64, tp=2, pp=1, dp=32, mbs=1, global_batch=64, seq=8192, zero=1)
    return evaluate(m, hw, from_layouts([Layout(**{**base, **kw})]))


def _stage(est, key):
    return {r: float(c[key][0]) for r, c in est.memory.items() if key in c}


def test_offloaded_optimizer_state_leaves_the_device_for_the_host():
    kept, half, moved = _est(), _est(optimizer_offload=0.5), _est(optimizer_offload=1.0)
    state = lambda e: _stage(e, "master")["first"] + _stage(e, "optimizer")["first"]  # noqa: E731
    assert state(moved) == 0.0 and state(half) == pytest.approx(state(kept) / 2)
    assert _stage(moved, "host")["first"] == pytest.approx(state(kept))
    assert float(moved.peak_memory_gib[0]) == pytest.approx(float(kept.peak_memory_gib[0]) - state(kept))
    assert "host" not in kept.memory["first"]  # layouts that offload nothing keep their breakdown


def test_the_host_step_costs_at_least_its_copies_and_its_dram_passes():
    kept, moved = _est(), _est(optimizer_offload=1.0)
    owned = _stage(kept, "master")["first"] * GIB / 4.0  # fp32 master: 4 B per owned parameter
    h = GB200.host
    floor = owned * ((LINK_OUT_BYTES + LINK_IN_BYTES) / (h.link_gbps * 1e9) + HOST_DRAM_BYTES / (h.memory_bandwidth_gbps * 1e9))
    t0, t1 = float(kept.time["optimizer"][0]), float(moved.time["optimizer"][0])
    assert floor < t1 < floor + t0  # the device still clips the gradients; the host steps the rest
    assert t1 > 2 * t0  # a GPU's share of Grace's DRAM is ~40x below its HBM: offloading is not free


def test_offloaded_activations_leave_the_device_and_their_copies_hide_behind_compute():
    kept, parked = _est(), _est(offload_layers=40)
    a0 = _stage(kept, "activations")["first"]
    a1 = _stage(parked, "activations")["first"]
    assert a1 == pytest.approx(a0 * (80 - 40) / 80)
    assert _stage(parked, "host")["first"] == pytest.approx(a0 - a1)
    # a 70B layer's copy at the C2C share takes less than its forward or backward: nothing shows
    assert float(parked.time["offload"][0]) == 0.0
    assert float(parked.step_time_s[0]) == pytest.approx(float(kept.step_time_s[0]))


def test_copies_a_slow_link_cannot_hide_add_what_is_left_to_the_step():
    slow = GB200.model_copy(update={"host": GB200.host.model_copy(update={"link_gbps": 1.0})})
    kept, parked = _est(hw=slow), _est(hw=slow, offload_layers=40)
    exposed = float(parked.time["offload"][0])
    assert exposed > 0
    assert float(parked.step_time_s[0]) == pytest.approx(float(kept.step_time_s[0]) + exposed)
    assert sum(float(v[0]) for k, v in parked.time.items() if k != "total") == pytest.approx(float(parked.step_time_s[0]))


def test_offload_needs_a_host_section_and_room_in_it():
    with pytest.raises(PiperError, match="hardware dgx-h100: host: .*host section"):
        _est(hw=load_hardware("dgx-h100"), optimizer_offload=1.0, tp=8, dp=8)
    small = GB200.model_copy(update={"host": GB200.host.model_copy(update={"memory_gib": 1.0})})
    assert bool(_est(hw=small, tp=4, dp=16, recompute="full").fits[0])
    assert not bool(_est(hw=small, tp=4, dp=16, recompute="full", optimizer_offload=1.0).fits[0])


def test_a_rank_keeps_at_least_one_layer_of_activations():
    lay = Layout(gpus=64, tp=2, pp=1, dp=32, mbs=1, global_batch=64, seq=8192, offload_layers=80)
    with pytest.raises(LayoutError, match="offload_layers < layers on a rank"):
        check_layout(lay, LLAMA70.num_layers)
    check_layout(lay.model_copy(update={"offload_layers": 79}), LLAMA70.num_layers)


def test_layer_offloading_runs_where_megatron_core_runs_it():
    """TransformerConfig refuses CPU offloading beside a pipeline, recompute, CUDA graphs or
    fine-grained offloading."""
    lay = Layout(gpus=64, tp=2, pp=1, dp=32, mbs=1, global_batch=64, seq=8192, offload_layers=10)
    for edit, rule in ((dict(pp=4, dp=8), "offload_layers with pp 1"),
                       (dict(recompute="selective"), "offload_layers without recompute"),
                       (dict(cuda_graphs=("attn",)), "offload_layers without cuda_graphs"),
                       (dict(offload_modules=("expert_fc1",)), "offload_layers or offload_modules, not both")):
        with pytest.raises(LayoutError, match=rule):
            check_layout(lay.model_copy(update=edit), LLAMA70.num_layers)


def test_the_search_prices_offload_and_says_when_the_host_is_full():
    sp = SearchSpace(gpus=64, global_batch=64, seq=8192, optimizer_offload=(1.0,), zeros=(0, 1))
    res = search(LLAMA70, GB200, sp)
    assert res.best is not None and res.batch.layout(res.best).optimizer_offload == 1.0
    small = GB200.model_copy(update={"host": GB200.host.model_copy(update={"memory_gib": 1.0})})
    assert any("host memory" in k for k in search(LLAMA70, small, sp).rejected)
    with pytest.raises(PiperError, match="--optimizer-offload 0.5"):
        for_runtime(SearchSpace(gpus=8, global_batch=8, seq=4096, optimizer_offload=(0.5,)), "piper-train")


def test_the_cli_names_the_spec_that_lacks_a_host():
    r = CliRunner().invoke(main, ["estimate", "-m", "llama3-70b", "-H", "dgx-h100", "-n", "64", "--tp", "8",
                                  "--optimizer-offload", "1"])
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert "dgx-h100" in r.output and "host" in r.output and len(r.output.strip().splitlines()) == 1
    ok = CliRunner().invoke(main, ["estimate", "-m", "llama3-70b", "-H", "gb200-nvl72", "-n", "64", "--tp", "2",
                                   "--offload-layers", "40", "--json"])
    assert ok.exit_code == 0, ok.output
    assert np.isfinite(float(__import__("json").loads(ok.output)["step_time_s"]))


def test_a_search_that_offloads_on_a_spec_without_a_host_is_refused_before_anything_is_priced(monkeypatch):
    import piper_plan.search as S

    def price(*args):
        raise AssertionError("priced before the refusal")

    monkeypatch.setattr(S, "evaluate", price)  # a wide space took 16 s, 7 GB to enumerate before evaluate refused it
    h100 = load_hardware("dgx-h100")
    for offload in (dict(optimizer_offload=(0.0, 1.0)), dict(offload_layers=(0, 2)),
                    dict(offload_modules=((), ("core_attn",)))):
        with pytest.raises(PiperError, match="dgx-h100: host: offloading .* needs the spec's host section"):
            search(LLAMA70, h100, SearchSpace(gpus=64, global_batch=64, seq=8192, **offload))
    r = CliRunner().invoke(main, ["search", "-m", "llama3-70b", "-H", "dgx-h100", "-n", "64", "--optimizer-offload",
                                  "0,1"])
    assert r.exit_code != 0 and "host section" in r.output and len(r.output.strip().splitlines()) == 1


def test_published_runs_that_offloaded_activations_fit_and_price_within_the_dense_targets():
    # validation/host-offload.csv: Megatron-Bridge's Llama 3 70B (64 GB200 / GB300) and Llama 3.1
    # 405B (128 GB200) runs with Megatron-FSDP and 20-95 layers of activations offloaded to the
    # Grace host, added before they were priced. First priced: MAPE 6.6 %, max 14.4 %. Without the
    # offload every layout sat at 269-320 GiB against the devices' memory; with it every one fits
    # (Llama 3 70B on GB200: 181.2 of 185 GiB, the GB200's nvidia-smi total; validation/README.md,
    # "Runs that offloaded to the host", "Device memory as nvidia-smi reports it")
    from piper_plan import validate as V

    res = V.run(path=V.data_path().parent / "host-offload.csv")
    kinds = V.summary(res)["kinds"]
    assert len(res) == 10 and kinds["dense"]["rows"] == 10
    assert kinds["dense"]["mape"] <= V.TARGETS["dense"][0] and kinds["dense"]["max_abs_pct"] <= V.TARGETS["dense"][1]
    assert all(r.peak_memory_gib <= r.device_memory_gib for r in res)


def test_the_search_tries_offloading_as_a_choice_and_says_when_it_is_what_fits():
    # Llama 3 70B on 4 GB200: its parameter and optimizer state alone exceed the device memory
    # unless the host holds the optimizer state
    from piper_plan.diagnose import diagnose

    on_device = SearchSpace(gpus=4, global_batch=64, seq=8192)
    assert search(LLAMA70, GB200, on_device).best is None
    hint = diagnose(LLAMA70, GB200, on_device, search(LLAMA70, GB200, on_device))
    assert any("--optimizer-offload 1" in line for line in hint)
    either = SearchSpace(gpus=4, global_batch=64, seq=8192, optimizer_offload=(0.0, 1.0), offload_layers=(0, 20))
    res = search(LLAMA70, GB200, either)
    assert res.best is not None and res.batch.layout(res.best).optimizer_offload == 1.0
    assert set(np.unique(res.batch.opt_offload)) == {0.0, 1.0}  # both tried


def test_a_sweep_over_the_host_s_memory_shows_where_offloading_starts_to_fit():
    # Llama 3 70B on 4 GB200: nothing fits with 60 GiB of host memory a GPU, the optimizer state
    # fits in the spec's 223
    from piper_plan.sweep import parse_vary, run_sweep

    vary = parse_vary(["host_gib=60,223"])
    assert vary == {"host.memory_gib": [60.0, 223.0]}
    rows = run_sweep(LLAMA70, GB200, [4], vary,
                     SearchSpace(gpus=4, global_batch=64, seq=8192, optimizer_offload=(0.0, 1.0)))
    by = {r["host.memory_gib"]: r for r in rows}
    assert by[60.0]["tokens_per_s"] == 0 and by[223.0]["tokens_per_s"] > 0


def test_a_rank_with_fewer_layers_than_the_mean_still_keeps_one_layer_on_the_device():
    # offload_layers is checked against ceil(L / pp) - 1 = 7 for DeepSeek-V3 (61 layers) on pp 8, but the
    # balanced split gives rank 0 (the embedding) 7 layers: Transformer Engine keeps its last one, so
    # 6 of 7 go to the host, not all of them
    m = load_model("deepseek-v3")
    base = dict(gpus=256, pp=8, dp=32, ep=32, mbs=1, global_batch=1024, seq=4096)
    kept, parked = (evaluate(m, GB200, from_layouts([Layout(**base, offload_layers=n)])) for n in (0, 7))
    layers = len(materialise(m.num_layers, 8, parked.chunks)[0])
    assert layers == 7
    a0, a1 = kept.memory["first"]["activations"][0], parked.memory["first"]["activations"][0]
    assert a1 == pytest.approx(a0 * (layers - 6) / layers) and a1 > 0
