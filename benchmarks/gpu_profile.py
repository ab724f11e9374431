"""Where a piper-train step's time goes on one GPU: wall per step against the GPU's kernel time,
and the kernels and ops that take it (torch.profiler), beside the plan's prediction.

    python benchmarks/gpu_profile.py plan.json [--out profile.txt] [--steps 10]

One rank (the plan's layout must be one GPU: gpus 1), its process group made here (NCCL on a
GPU, gloo on a CPU, where there are no kernels to count). The profiler records steps 4-6 (0-based;
each step starts at metrics.reset, which train() calls once a step, and the profiler's step
advances there: steps 0-2 wait, 3 warms up). Printed: the median wall of the recorded steps
(under the profiler, beside their kernel time) and of the unprofiled steps after them, the GPU
kernel seconds a recorded step (the sum
of the device events' own time, as torch's table totals it), kernel launches and synchronising
calls a step, and the plan's predicted step and its parts; --out writes that and two tables
(by GPU time, by CPU time). Kernel time near the wall: the step is bound by the GPU's work;
far under it: by the host issuing it or by synchronisations.

Measured on one H200 (2026-12-04, README "piper-train on one GPU"): Granite-3.0-3B-A800M,
MBS 4 x 2 micro-batches of 2,048 tokens, 0.68 s of kernels a step where the unprofiled step took
0.79 s; 0.61 s where it took 0.67 s once the MoE permutation lost its atomics and host
synchronisations (650 cudaStreamSynchronize a step before, 138 after)."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from datetime import timedelta

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

ACTIVE = 3  # recorded steps
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "aten::item")
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


def profile(plan_path: str, steps: int = 10) -> tuple[dict, object]:
    import torch
    import torch.distributed as dist
    import torch.profiler as tp
    from torch.autograd import DeviceType

    import piper_runtime.metrics as metrics
    from piper_plan.plan import read_plan
    from piper_runtime.config import TrainConfig
    from piper_runtime.train import train

    plan = read_plan(plan_path)
    if plan.layout.gpus != 1:
        raise SystemExit(f"{plan_path}: layout.gpus is {plan.layout.gpus}; this profiles one rank (gpus 1)")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29555")
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1, timeout=timedelta(seconds=120),
                            **({"device_id": dev} if cuda else {}))
    prof = tp.profile(activities=[tp.ProfilerActivity.CPU] + ([tp.ProfilerActivity.CUDA] if cuda else []),
                      schedule=tp.schedule(wait=4, warmup=1, active=ACTIVE, repeat=1))
    reset = metrics.reset

    def step_then_reset(chunks):  # train() calls metrics.reset at the start of every step
        prof.step()
        reset(chunks)

    metrics.reset = step_then_reset
    try:
        prof.start()
        recs = train(plan, TrainConfig(steps=max(steps, 4 + ACTIVE + 3), log_every=0), dev)
        prof.stop()
    finally:
        metrics.reset = reset
        dist.destroy_process_group()
    events = prof.events()
    # GPU-side ranges of user annotations (ProfilerStep#, Optimizer.step) are device events too
    # on recent torch: counting them would add each step's span to its kernels (torch's table
    # total leaves them out the same way)
    kernel_us = sum(e.self_device_time_total for e in events
                    if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False))
    ka = prof.key_averages()
    walls = [r["step_time_s"] for r in recs if not r.get("summary")]
    p = plan.predicted
    out = dict(plan=plan_path, device=torch.cuda.get_device_name(dev) if cuda else "cpu",
               step_wall_s=walls, median_wall_s_recorded=statistics.median(walls[4:4 + ACTIVE]),
               median_wall_s_unprofiled=statistics.median(walls[4 + ACTIVE:]),
               gpu_kernel_s_per_step=kernel_us / 1e6 / ACTIVE,
               kernel_launches_per_step=sum(e.count for e in ka if e.key in LAUNCHES) / ACTIVE,
               syncing_calls_per_step={e.key: e.count / ACTIVE for e in ka if e.key in SYNCS},
               predicted_step_s=p.step_time_s if p else None,
               predicted_parts_s=p.time_breakdown_s if p else None)
    return out, ka


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plan")
    ap.add_argument("--out", default=None, help="write the figures and the two tables here")
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    res, ka = profile(a.plan, a.steps)
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n" + ka.table(sort_by="self_device_time_total", row_limit=25))
            f.write("\n" + ka.table(sort_by="self_cpu_time_total", row_limit=25) + "\n")


if __name__ == "__main__":
    main()
