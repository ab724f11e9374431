"""Would a host-launch floor explain the Megatron rows' misses? (A candidate term, not adopted.)

Claim checked (validation/README.md, "Where the MoE error is"): a count-based host model built
from published CPU timings moves the Megatron rows' error little. Each layer pass (forward +
backward of one transformer layer for one micro-batch) is taken to last the longer of its
predicted GPU time and its host time = operations x the CPU time of one eager op:

- operations per layer forward, from the module structure of Megatron-Core + Transformer Engine:
  attention 7 (fused norm+QKV GEMM, RoPE on q and k, fused attention, output GEMM, residual)
  plus FP8 quantisation kernels of its two GEMM inputs; router + dispatch preprocess 31 kernels
  (fused router, Megatron-LM docs/discussions/deepseek-v3-gb200-optimization: "from 72 to 31"),
  17 with DeepEP/HybridEP (same guide), 1 graph launch each where the recipe graphs
  moe_router/moe_preprocess; 10 others (norm, router GEMM, permute, two all-to-alls, sort,
  activation, unsort, unpermute, residual); per local expert 2 GEMMs and the quantisation
  kernels of their inputs (one GEMM per expert: Transformer Engine's multi-stream path);
  full-iteration CUDA graphs: none. Backward issues twice the forward's operations.
- CPU time of one op: torch.nn.Linear forward, TransformerEngine#2053: 13.48 us on DGX H100's
  Xeon 8480C (used for DGX H100/B200/B300), 37.08 us on GB200's Grace (GB200/GB300).

Prints each Megatron row's error without and with the floor, and both MAPEs.
Run: python benchmarks/host_floor_probe.py
"""
from __future__ import annotations

import csv
import re

from piper_plan.validate import data_path, explain

OP_US = {"dgx-h100": 13.48, "dgx-b200": 13.48, "dgx-b300": 13.48, "gb200-nvl72": 37.08, "gb300-nvl72": 37.08}
QUANT_KERNELS = {"bf16": 0, "fp8": 2, "mxfp8": 1}  # per quantised tensor (cost/compute.py FP8_QUANT)


def host_ops(row) -> int:
    """Operations one layer pass issues from the host (forward + backward), per the docstring."""
    notes = row["notes"]
    if re.search(r"full.iteration", notes):
        return 0
    q = QUANT_KERNELS[row["precision"]]
    local = int(row["experts"]) // int(row["ep"])
    eager = re.search(r"no CUDA graphs|cuda_graph_impl none|no cuda_graph_impl", notes)
    graph_attn = not eager and re.search(r"graphs on attn|attn, moe_router", notes)
    graph_router = not eager and "moe_router" in notes
    token_level = re.search(r"hybridep|deepep", notes, re.IGNORECASE)
    attn = 1 if graph_attn else 7 + 2 * q
    router = 2 if graph_router else (17 if token_level else 32)
    return 3 * (attn + router + 10 + local * (2 + 2 * q))


def main():
    rows = [r for r in csv.DictReader(open(data_path()))
            if r["group"] in ("megatron-bridge-moe", "mcore2026-moe-report")]
    before = after = 0.0
    print(f"{'row':36s} {'host ms':>8s} {'GPU ms':>8s} {'measured':>9s} {'error':>8s} {'w/ floor':>9s}")
    for r in rows:
        e = explain(r["id"])
        gpu = e["predicted_ms_per_layer_microbatch"]
        measured = gpu + e["missing_ms_per_layer_microbatch"]
        host = host_ops(r) * OP_US[r["hardware_spec"]] * 1e-3
        floor = max(gpu, host)
        if r["metric"] == "iteration_time_s":
            e0, e1 = gpu / measured - 1, floor / measured - 1
        else:  # throughput: predicted / published - 1 = measured time / predicted time - 1
            e0, e1 = measured / gpu - 1, measured / floor - 1
        before, after = before + abs(e0), after + abs(e1)
        print(f"{r['id']:36s} {host:8.2f} {gpu:8.2f} {measured:9.2f} {100 * e0:+7.0f}% {100 * e1:+8.0f}%")
    n = len(rows)
    print(f"MAPE over {n} Megatron rows: {100 * before / n:.1f} % without the floor, {100 * after / n:.1f} % with it")


if __name__ == "__main__":
    main()
