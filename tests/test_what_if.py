"""What-if sweeps rest on one physical claim: a machine better in any one respect (a faster link,
NIC, HBM or tensor core, a shorter latency or launch, more memory) never makes the best plan for a
job slower. Each layout's price need not be monotone on its own (a cost-balanced pipeline split
moves with the rates), but the search's best must be."""
import pytest

from piper_plan.search import SearchSpace, default_global_batch, round_batch, search
from piper_plan.specs import load_hardware, load_model
from piper_plan.sweep import set_field


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
