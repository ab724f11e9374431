"""What-if sweeps rest on one physical claim: a machine better in any one respect (a faster link,
NIC, HBM or tensor core, a shorter latency or launch, more memory) never makes the best plan for a
job slower. Each layout's price need not be monotone on its own (a cost-balanced pipeline split
moves with the rates), but the search's best must be."""
import typing

import pytest

from piper_plan.errors import SpecError
from piper_plan.search import SearchSpace, default_global_batch, round_batch, search
from piper_plan.specs import load_hardware, load_model
from piper_plan.sweep import ALIASES, parse_vary, run_sweep, scenarios, set_field


def _better(hw):
    """(dotted field, value) pairs, each improving one figure of the spec."""
    acc, eff = hw.accelerator, hw.efficiency
    out = [("network.nic_gbps", 2.0 * hw.network.nic_gbps),
           ("accelerator.memory_bandwidth_gbps", 1.5 * acc.memory_bandwidth_gbps),
           ("accelerator.memory_gib", 1.5 * acc.memory_gib),
           ("efficiency.kernel_overhead_us", 0.5 * eff.kernel_overhead_us)]
    out += [(f"accelerator.peak_tflops.{d}", 1.5 * v) for d, v in acc.peak_tflops.items()]
    out += [(f"topology.{i}.bandwidth_gbps", 2.0 * lv.bandwidth_gbps)
            for i, lv in enumerate(hw.topology) if lv.bandwidth_gbps]
    out += [(f"topology.{i}.latency_us", 0.5 * lv.latency_us) for i, lv in enumerate(hw.topology)]
    return out


@pytest.mark.parametrize("model,hardware,gpus", [("gpt-oss-120b", "dgx-b200", 64), ("qwen3-30b-a3b", "frontier", 64),
                                                  ("deepseek-v3", "gb200-nvl72", 256)])
def test_a_better_machine_never_makes_the_best_plan_slower(model, hardware, gpus):
    m, hw = load_model(model), load_hardware(hardware)
    sp = SearchSpace(gpus=gpus, seq=m.seq_len, global_batch=round_batch(default_global_batch(m.seq_len), gpus))
    base = search(m, hw, sp)
    t0 = base.est.step_time_s[base.best]
    for path, value in _better(hw):
        res = search(m, set_field(hw, path, value), sp)
        assert res.est.step_time_s[res.best] <= t0 * (1 + 1e-9), f"{path} = {value}"


def _numeric_omitted(model):
    """(field, int or float) of each field `model` leaves out of its dump at its default that holds a number."""
    out = []
    for name in model._OMIT_AT_DEFAULT:
        ann = type(model).model_fields[name].annotation
        union = typing.get_origin(ann) is typing.Union  # Optional[float]
        kinds = [a for a in (typing.get_args(ann) if union else (ann,)) if a in (int, float)]
        if kinds:
            out.append((name, float if float in kinds else int))
    return out


@pytest.mark.parametrize("hardware", ["frontier", "gb200-nvl72"])
def test_every_alias_reaches_its_field_and_the_scenario_holds_the_new_value(hardware):
    # frontier leaves sustained_matmul and host_op_us at their defaults, which its dump leaves out
    # (the sweep had called them no such field); gb200-nvl72 writes the host section host_* name
    hw = load_hardware(hardware)
    aliases = [a for a, path in ALIASES.items() if a != "memory_gib"  # hbm_gib names its field too
               and (hw.host is not None or not path.startswith("host."))]
    vary = parse_vary([f"{alias}=0.5" for alias in aliases])
    (scenario,) = scenarios(hw, vary).values()
    for path in vary:
        node = scenario
        for p in path.split("."):
            node = node[p] if isinstance(node, dict) else getattr(node, p)
        assert node == 0.5, path
    assert len(vary) == len(set(ALIASES.values())) - (2 if hw.host is None else 0)


def _set_to_another_value(hw, path, current, kind):
    """set_field to the first of a few values other than `current` that the spec's bounds accept."""
    for value in ((2, 3) if kind is int else (0.5, 2.0)):
        if value != current:
            try:
                return set_field(hw, path, value), value
            except SpecError as e:
                assert "no such field" not in str(e) and "not a numeric field" not in str(e), e
    raise AssertionError(f"{path}: no value accepted")


@pytest.mark.parametrize("hardware", ["dgx-h100", "frontier", "gb200-nvl72"])
def test_a_field_left_at_its_default_can_be_varied(hardware):
    hw = load_hardware(hardware)
    owners = {"accelerator": hw.accelerator, "efficiency": hw.efficiency, "topology.0": hw.topology[0]}
    checked = 0
    for prefix, model in owners.items():
        for name, kind in _numeric_omitted(model):
            if name == "job_block":  # a job holds whole nodes: no job_block on a level inside one (below)
                continue
            new, value = _set_to_another_value(hw, f"{prefix}.{name}", getattr(model, name), kind)
            target = new.topology[0] if prefix == "topology.0" else getattr(new, prefix)
            assert getattr(target, name) == value, f"{prefix}.{name}"
            checked += 1
    assert checked >= 15  # sustained_matmul, a2a_fanout, host_op_us, ... and the level's comm
    # the first level above the node, filled one node a domain
    above = next(i for i, lv in enumerate(hw.topology) if lv.size > hw.gpus_per_node)
    new = set_field(hw, f"topology.{above}.job_block", hw.gpus_per_node)
    assert new.topology[above].job_block == new.job_blocks[above] == hw.gpus_per_node


def test_varying_sustained_matmul_on_a_spec_that_leaves_it_out_changes_the_price():
    # the reported repro: frontier leaves sustained_matmul at 1; --vary sustained=0.9,1.0 had failed
    m, hw = load_model("mixtral-8x7b"), load_hardware("frontier")
    rows = run_sweep(m, hw, [64], parse_vary(["sustained=0.9,1.0"]), SearchSpace(gpus=64, global_batch=256, seq=4096))
    assert [r["efficiency.sustained_matmul"] for r in rows] == [0.9, 1.0]
    assert rows[0]["tokens_per_s"] < rows[1]["tokens_per_s"]


def test_a_section_the_spec_leaves_out_is_named_when_a_sweep_sets_one_of_its_fields():
    with pytest.raises(SpecError, match="no host section"):
        set_field(load_hardware("dgx-h100"), "host.link_gbps", 10.0)


def test_gpus_beyond_a_top_level_that_is_no_network_are_refused_not_priced_at_its_links(tmp_path):
    # a spec cut to its node: 16 GPUs would be priced as one NVLink domain of 16, whatever the NICs
    from click.testing import CliRunner

    from piper_plan.cli import main
    spec = tmp_path / "one-node.yaml"
    spec.write_text("base: dgx-h100\nmax_gpus: 8\ntopology:\n  - {name: node, size: 8, bandwidth_gbps: 450, "
                    "latency_us: 3, source: test}\n")
    for args in (["sweep", "--gpus", "8,16", "--vary", "nic_gbps=1,400"], ["search", "-n", "16"]):
        r = CliRunner().invoke(main, [*args, "-m", "mixtral-8x7b", "-H", str(spec), "--global-batch", "64"])
        assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
        assert "topology: -n 16 is beyond its top level 'node' (8 GPUs), which is no network" in r.output


def test_a_varied_max_gpus_is_the_scenario_s_machine():
    from click.testing import CliRunner

    from piper_plan.cli import main
    r = CliRunner().invoke(main, ["sweep", "-m", "tiny-moe", "-H", "dgx-h100", "--gpus", "16,32", "--global-batch",
                                  "64", "--vary", "max_gpus=8,1024"])
    assert r.exit_code == 0 and "max_gpus: the machine has 8 GPUs; -n 16" in r.output, r.output
    assert r.output.count("the machine has") == 2  # -n 16 and -n 32 on the 8-GPU machine, once each


def test_varying_the_host_without_offloading_says_it_changes_nothing():
    from click.testing import CliRunner

    from piper_plan.cli import main
    args = ["sweep", "-m", "deepseek-v3", "-H", "gb200-nvl72", "--gpus", "144", "--global-batch", "1024",
            "--vary", "host_link_gbps=50,146"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0 and "--vary host.link_gbps: the search tries no host offloading" in r.output
    r = CliRunner().invoke(main, [*args, "--optimizer-offload", "0,1"])
    assert "tries no host offloading" not in r.output


def test_a_list_index_counts_from_the_start_only():
    hw = load_hardware("dgx-h100")
    for alias in ("-1", "00", "+0"):  # "topology.00" beside "topology.0" had passed "given twice", the later winning
        with pytest.raises(SpecError, match="no such field"):
            set_field(hw, f"topology.{alias}.latency_us", 5.0)
    assert set_field(hw, "topology.0.latency_us", 5.0).topology[0].latency_us == 5.0


def test_the_plot_puts_the_field_that_moves_on_x_and_leaves_out_what_does_not_fit():
    from piper_plan.sweep import plot_lines
    rows = [dict(gpus=n, **{"network.nic_gbps": 25.0, "accelerator.memory_gib": g}, fits=n > 128,
                 tokens_per_s=float(n * g) if n > 128 else 0.0, mfu=0.3) for n in (128, 256) for g in (32.0, 64.0)]
    x, others, lines = plot_lines(rows, ["network.nic_gbps", "accelerator.memory_gib"])
    assert x == "accelerator.memory_gib" and others == ["gpus", "network.nic_gbps"]
    assert list(lines) == [(256, 25.0)] and [r[x] for r in lines[(256, 25.0)]] == [32.0, 64.0]


def _sweep(*args):
    from click.testing import CliRunner

    from piper_plan.cli import main
    return CliRunner().invoke(main, ["sweep", *args])


def test_a_scenario_the_options_cannot_run_on_is_refused_naming_it_before_any_search(monkeypatch):
    """MXFP8 at compute capability 9 had been refused after the scenarios before it were searched,
    in a line that named no scenario, and the sweep's rows were lost."""
    import piper_plan.sweep

    def searched(*a, **k):
        raise AssertionError("a scenario was searched before every scenario was checked")

    monkeypatch.setattr(piper_plan.sweep, "search", searched)
    r = _sweep("-m", "qwen3-30b-a3b", "-H", "gb200-nvl72", "--gpus", "8", "--fp8", "mxfp8",
               "--vary", "accelerator.compute_capability=10,9")
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert r.output.startswith("error: --vary: accelerator.compute_capability=9: this scenario cannot run the "
                               "options asked: layout: fp8 mxfp8 needs compute capability 10 or later"), r.output


def test_a_sweep_of_more_searches_than_it_can_run_is_refused_before_building_them():
    values = ",".join(str(1 + i) for i in range(400))
    r = _sweep("-m", "tiny-moe", "-H", "cpu-local", "--gpus", "4", "--vary", f"nic_gbps={values}",
               "--vary", f"hbm_gib={values}")
    assert r.exit_code == 2 and "error: --vary: 160,000 searches: expected at most 100,000" in r.output


def test_csv_to_stdout_holds_the_data_alone_and_the_table_goes_to_stderr(tmp_path):
    """A pipe into pandas read the box-drawn table first; the table now goes to stderr there."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "piper_plan.cli", "sweep", "-m", "tiny-moe", "-H", "cpu-local", "--gpus", "4",
           "--global-batch", "8", "--vary", "nic_gbps=1,2", "--csv", "/dev/stdout"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("gpus,network.nic_gbps,global_batch,fits,") and len(lines) == 3, p.stdout
    assert "best plan per scenario" in p.stderr


def test_sweep_warns_where_the_default_batch_is_raised_as_search_does(tmp_path):
    out = tmp_path / "s.json"
    r = _sweep("-m", "mixtral-8x7b", "-H", "frontier", "--gpus", "512,2048", "--vary", "nic_gbps=25",
               "--json", str(out))
    assert r.exit_code == 0, r.output
    assert ("warning: --global-batch: the default, 1,024 sequences (4M tokens), is under one a GPU on 2,048 GPUs; "
            "searched at 2,048 (one a GPU)") in r.output
    import json
    assert [row["global_batch"] for row in json.loads(out.read_text())] == [1024, 2048]


def test_a_plot_of_one_line_says_which_gpu_count_it_is(tmp_path, monkeypatch):
    """Nothing fit at 64 GPUs, so the plot drew the 128-GPU line alone, with no legend to say so."""
    import matplotlib.axes

    from piper_plan.sweep import plot
    labels = []
    monkeypatch.setattr(matplotlib.axes.Axes, "legend", lambda self, *a, **k: labels.append(
        [h.get_label() for h in self.get_lines()]))
    rows = [dict(gpus=n, **{"accelerator.memory_gib": g}, fits=n > 64, tokens_per_s=float(g), mfu=0.3)
            for n in (64, 128) for g in (80.0, 120.0)]
    plot(rows, ["accelerator.memory_gib"], str(tmp_path / "p.png"))
    assert labels == [["gpus=128"]] and (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_a_scenario_where_nothing_fits_has_the_same_keys_as_one_that_fits():
    m, hw = load_model("mixtral-8x7b"), load_hardware("dgx-h100")
    rows = run_sweep(m, hw, [8, 64], {}, SearchSpace(gpus=8, global_batch=64, seq=4096), batch_given=True)
    assert [r["fits"] for r in rows] == [False, True] and rows[0].keys() == rows[1].keys()
    assert rows[0]["step_time_s"] is None and rows[0]["peak_memory_gib"] is None
