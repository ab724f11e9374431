"""What-if sweeps rest on one physical claim: a machine better in any one respect (a faster link,
NIC, HBM or tensor core, a shorter latency or launch, more memory) never makes the best plan for a
job slower. Each layout's price need not be monotone on its own (a cost-balanced pipeline split
moves with the rates), but the search's best must be."""
import pytest

from piper_plan.search import SearchSpace, default_global_batch, round_batch, search
from piper_plan.specs import load_hardware, load_model
from piper_plan.sweep import set_field


def _better(hw):
    """(dotted field, factor) pairs, each improving one figure of the spec."""
    out = [("network.nic_gbps", 2.0), ("accelerator.memory_bandwidth_gbps", 1.5), ("accelerator.memory_gib", 1.5),
           ("efficiency.kernel_overhead_us", 0.5)]
    out += [(f"accelerator.peak_tflops.{d}", 1.5) for d in hw.accelerator.peak_tflops]
    out += [(f"topology.{i}.bandwidth_gbps", 2.0) for i, lv in enumerate(hw.topology) if lv.bandwidth_gbps]
    out += [(f"topology.{i}.latency_us", 0.5) for i, lv in enumerate(hw.topology)]
    return out


@pytest.mark.parametrize("model,hardware,gpus", [("gpt-oss-120b", "dgx-b200", 64), ("qwen3-30b-a3b", "frontier", 64),
                                                  ("deepseek-v3", "gb200-nvl72", 256)])
def test_a_better_machine_never_makes_the_best_plan_slower(model, hardware, gpus):
    m, hw = load_model(model), load_hardware(hardware)
    sp = SearchSpace(gpus=gpus, seq=m.seq_len, global_batch=round_batch(default_global_batch(m.seq_len), gpus))
    base = search(m, hw, sp)
    t0 = base.est.step_time_s[base.best]
    for path, factor in _better(hw):
        node = hw.model_dump()
        *parents, leaf = path.split(".")
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        better = set_field(hw, path, node[leaf] * factor)
        res = search(m, better, sp)
        assert res.est.step_time_s[res.best] <= t0 * (1 + 1e-9), f"{path} x{factor}"
