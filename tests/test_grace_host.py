"""Grace's per-operation host cost (gb200/gb300 specs) is derived from the x86 figure, and a
measured A/B pair on GB200 tests the host model where it matters (validation/README.md,
"Grace's host cost, derived rather than carried over")."""
import pytest

from piper_plan.specs import load_hardware
from piper_plan.validate_explain import explain

TORCH_LINEAR_US = {"xeon_8480c": 13.48, "grace": 37.08}  # TransformerEngine#2053, torch rows
PY_OP_CALL_NS = {"h100_host": 182.0, "grace": 197.0}  # pytorch#187862


def test_grace_specs_carry_the_x86_cost_split_by_what_each_part_costs_on_grace():
    x86 = load_hardware("dgx-h100").efficiency.host_op_us
    python_part = x86 - TORCH_LINEAR_US["xeon_8480c"]
    grace = TORCH_LINEAR_US["grace"] + python_part * PY_OP_CALL_NS["grace"] / PY_OP_CALL_NS["h100_host"]
    for name in ("gb200-nvl72", "gb300-nvl72"):
        assert load_hardware(name).efficiency.host_op_us == pytest.approx(grace, abs=0.01)
    for name in ("dgx-b200", "dgx-b300", "dgx-h200"):  # the x86 DGX hosts share the H100 figure
        assert load_hardware(name).efficiency.host_op_us == x86


def test_gpt_oss_on_gb200_prices_alltoall_and_hybridep_alike_as_measured():
    # Megatron-Bridge PR #3561: the alltoall dispatcher 4.2 % faster than HybridEP in the same
    # GPT-OSS-120B EP64 recipe on GB200 (the 26.04.01 / 26.04 rows: 16,640 / 15,938 tok/s). A host
    # cost that makes the router's 32 operations bind prices alltoall 17 % slower (99.66 us did).
    alltoall = explain("mb-gptoss120b-gb200-bf16-260401")["predicted"]
    hybridep = explain("mb-gptoss120b-gb200-bf16-2604")["predicted"]
    ratio = alltoall / hybridep
    assert 0.95 <= ratio <= 1.10
