"""Closed loop (issue 8): predicted vs measured piper-train step time on the calibrated
cpu-local spec, for tiny-moe and small-moe-cpu under plans that differ in PP, EP, DP,
micro-batch, schedule and all-to-all algorithm; plus the memory check.

One command:  python benchmarks/closed_loop.py  [--steps 22] [--warmup 14] [--rounds 2]
                                               [--hardware SPEC] [--models tiny-moe,small-moe-cpu]

By default it first calibrates this machine (`piper-plan calibrate --quick`, 8 ranks, under two
minutes) into a temporary spec and plans on that: the claim is that a spec measured on a machine
predicts piper-train there, and the bundled cpu-local was measured on another host (or another
day of a shared VM). --hardware SPEC plans on a stored spec instead (bundled name or YAML path).
On the shared 2-core VM of 2026-12-03 one plan's step time moved by up to 1.7x between runs
minutes apart (pp2 dp4 ep4 1f1b: 327-564 ms), so one run's median error moved by +-15 points:
tiny-moe read 15-33 % on the bundled spec in four one-round runs, 9 % and 39 % on two fresh
calibrations (the second while calibrate's probes ran 1.1-1.5x slower than at its calibration).

Each plan runs --steps optimizer steps on 8 local gloo ranks (one thread each); the first
--warmup steps are dropped and the median of the rest is the plan's time in that round. The
plans run one after another, --rounds times over (this shared machine's speed drifts by
10-30% over minutes, measured: the same plan 297-325 ms in two runs 10 minutes apart, so
every plan sees every period alike), and the median over rounds is the measured step time;
the spread across rounds is printed beside it. Before each round a few of calibrate's own probes
(machine_speed) say whether the machine still runs at the speed the spec was calibrated at. The warm-up
is long because the planner predicts the steady state: a CPU's bf16 GEMM library builds a
kernel the first time it meets a shape (~0.6 ms CPU each, measured here), and MoE expert GEMMs
meet new row counts for the first ten or so steps. Reported:
per-plan error (predicted/measured − 1), the median |error|, the Spearman rank correlation
(scipy) between predicted and measured, and whether the plan the planner ranks first among
them is within 10% of the fastest measured (acceptance: ≤ 20%, ≥ 0.8, yes). The runtime
reduces gradients after the pipeline, so plans say overlap_grad_reduce=false. cpu-local is one
node, so its HALO plans run the flat exchange (nothing to aggregate; the planner prices them
flat too): the HALO-vs-flat comparison on a real multi-node network is benchmarks/halo_netns.py."""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
from scipy.stats import spearmanr

from piper_plan.evaluate import build_plan, estimate_layout
from piper_plan.layout import Layout
from piper_plan.specs.model import ModelSpec
from piper_plan.specs.registry import load_hardware, load_model

sys.path.insert(0, "benchmarks")
from _args import comma_list, int_at_least, one_of  # noqa: E402
from runtime_throughput import SMALL  # noqa: E402

# (pp, dp, ep, vpp, schedule, mbs, a2a): distinct in PP, EP, DP, micro-batch, schedule, a2a
LAYOUTS = [
    (1, 8, 8, 1, "1f1b", 1, "flat"),
    (1, 8, 4, 1, "1f1b", 2, "halo"),
    (2, 4, 4, 1, "1f1b", 1, "flat"),
    (2, 4, 2, 1, "gpipe", 2, "flat"),
    (2, 4, 4, 2, "zbv", 1, "flat"),
    (4, 2, 2, 1, "1f1b", 1, "flat"),
    (2, 4, 2, 2, "interleaved", 1, "halo"),
]
MODELS = {"tiny-moe": (lambda: load_model("tiny-moe"), 64, 16),
          "small-moe-cpu": (lambda: ModelSpec(**SMALL), 128, 16)}
MAX_MEDIAN_ERROR, MIN_SPEARMAN = 0.20, 0.8  # the acceptance the docstring states (with: top plan within 10%)


def plans_for(hw, name):
    make, seq, gb = MODELS[name]
    spec = make()
    out = []
    for pp, dp, ep, vpp, sched, mbs, a2a in LAYOUTS:
        lay = Layout(gpus=8, pp=pp, dp=dp, ep=ep, vpp=vpp, mbs=mbs, global_batch=gb, seq=seq, schedule=sched,
                     dtype="bf16", zero=1, a2a=a2a, overlap_grad_reduce=False, fused_kernels=False)
        est = estimate_layout(spec, hw, lay)
        if est.fits[0]:
            out.append(build_plan(spec, hw, lay, est))
    return out


def label(lay) -> str:
    return (f"pp{lay.pp} dp{lay.dp} ep{lay.ep} mbs{lay.mbs} {lay.schedule}" + (f" v{lay.vpp}" if lay.vpp > 1 else "")
            + f" {lay.a2a}")


def new_shape_cost_us(dtype: str = "bf16", shapes: int = 200) -> tuple[float, float]:
    """CPU µs per GEMM (m×256 @ 256×512) on a row count never seen before vs the same row
    counts again: the one-time kernel build the warm-up steps pay."""
    import torch

    torch.set_num_threads(1)
    dt = getattr(torch, {"bf16": "bfloat16", "fp32": "float32"}[dtype])
    w = torch.randn(256, 512, dtype=dt)
    xs = [torch.randn(m, 256, dtype=dt) for m in range(1000, 1000 + shapes)]

    def once() -> float:
        t = time.process_time()
        for x in xs:
            x @ w
        return (time.process_time() - t) / len(xs) * 1e6
    return once(), once()


def machine_speed(hw_name: str) -> float | None:
    """How much slower this machine runs now than when the spec was calibrated: geometric mean
    of now / then over `piper-plan calibrate --check`'s sample of the spec's own probes (GEMMs
    of each dtype, streams, piper-train's blocks; 8 ranks at once). None when the spec has no
    calibration record beside it."""
    from piper_plan.calibrate_check import check
    from piper_plan.errors import PiperError

    try:
        rows = check(hw_name)["rows"]
    except PiperError:
        return None
    return float(np.exp(np.mean(np.log([r[3] for r in rows])))) if rows else None


def calibrate_here() -> str:
    """Calibrate this machine (quick, 8 ranks, on cpu-local's unmeasured fields) into a temporary
    folder; returns the spec's path (its .calibration.json beside it, for machine_speed)."""
    import tempfile

    from piper_plan.calibrate import calibrate

    out = f"{tempfile.mkdtemp(prefix='piper-closed-loop-')}/cpu-here.yaml"
    res = calibrate(output=out, base="cpu-local", ranks=8, device="cpu", kind="quick", name="cpu-here",
                    timeout=120.0, show_progress=False)
    print(f"calibrated this machine in {res['wall_s']:.0f} s -> {out}")
    return out


def run(hw_name: str, models: list[str], steps: int, warmup: int = 14, rounds: int = 2, drift: bool = True) -> dict:
    from piper_runtime.config import TrainConfig
    from piper_runtime.launch import spawn_jobs

    hw = load_hardware(hw_name)
    print(f"== closed loop on {hw.name} ({hw.source[:90]}...)\n   {steps} steps per plan, first {warmup} dropped, "
          f"median of the rest, median over {rounds} round(s); bf16; 8 ranks, OMP_NUM_THREADS=1")
    summary = {}
    for name in models:
        plans = plans_for(hw, name)
        t0 = time.perf_counter()
        per_round, speeds = [], []
        for _ in range(rounds):
            speeds.append(machine_speed(hw_name) if drift else None)
            per_round.append(spawn_jobs([(p, TrainConfig(steps=steps, timeout_s=300, log_every=0)) for p in plans]))
        wall = time.perf_counter() - t0
        pred, meas = [], []
        sp = "" if None in speeds else ", machine now / at calibration: " + " ".join(f"{v:.2f}" for v in speeds)
        print(f"\n{name}: {len(plans)} plans x {rounds} round(s), {wall:.0f} s wall{sp}")
        print(f"   {'layout':<34} {'pred ms':>8} {'meas ms':>8} {'rounds ms':>15} {'error':>7} {'a2a pred':>9} "
              f"{'a2a meas':>9}")
        for i, p in enumerate(plans):
            ms, As = [], []
            for recs in per_round:
                use = recs[i][warmup:] if len(recs[i]) > warmup else recs[i][-1:]
                ms.append(statistics.median(r["step_time_s"] for r in use))
                As.append(statistics.median(r["a2a_time_s"] for r in use))
            m, a = statistics.median(ms), statistics.median(As)
            pr = p.predicted
            pred.append(pr.step_time_s)
            meas.append(m)
            spread = f"{min(ms) * 1e3:.0f}-{max(ms) * 1e3:.0f}"
            print(f"   {label(p.layout):<34} {pr.step_time_s * 1e3:8.1f} {m * 1e3:8.1f} {spread:>15} "
                  f"{100 * (pr.step_time_s / m - 1):+6.1f}% {pr.a2a_time_s * 1e3:9.1f} {a * 1e3:9.1f}")
        pred, meas = np.array(pred), np.array(meas)
        err = np.abs(pred / meas - 1)
        rho = float(spearmanr(pred, meas).statistic)
        top = int(np.argmin(pred))
        within = meas[top] <= 1.10 * meas.min()
        print(f"   median |error| {100 * np.median(err):.1f}%  Spearman {rho:.2f}  planner's top plan "
              f"({label(plans[top].layout)}) measured {meas[top] / meas.min():.2f}× the fastest -> "
              f"{'within' if within else 'NOT within'} 10%")
        summary[name] = dict(median_abs_error=float(np.median(err)), spearman=rho, top_within_10pct=bool(within),
                             top_over_fastest=float(meas[top] / meas.min()), machine_speed=speeds)
    print("\nacceptance (median |error| <= 20%, Spearman >= 0.8, top plan within 10%): "
          + "; ".join(f"{k}: {100 * v['median_abs_error']:.1f}%, {v['spearman']:.2f}, {v['top_within_10pct']}"
                      for k, v in summary.items()))
    return summary


def failed_checks(summary: dict) -> list[str]:
    """The acceptance checks (module docstring: median |error| <= 20%, Spearman >= 0.8, the
    planner's top plan within 10% of the fastest measured) each model fails, as phrases; a NaN
    Spearman (every plan measured alike) fails, as it says nothing about the ranking."""
    out = []
    for name, v in summary.items():
        if not v["median_abs_error"] <= MAX_MEDIAN_ERROR:
            out.append(f"{name} median |error| {100 * v['median_abs_error']:.1f}% > {100 * MAX_MEDIAN_ERROR:.0f}%")
        if not v["spearman"] >= MIN_SPEARMAN:
            out.append(f"{name} Spearman {v['spearman']:.2f} < {MIN_SPEARMAN}")
        if not v["top_within_10pct"]:
            out.append(f"{name} top plan measured {v['top_over_fastest']:.3f}x the fastest (not within 10%)")
    return out


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int_at_least(1), default=22)
    ap.add_argument("--warmup", type=int_at_least(0), default=14, help="steps dropped before the median")
    ap.add_argument("--rounds", type=int_at_least(1), default=2, help="passes over the plans; the median is kept")
    ap.add_argument("--hardware", default=None,
                    help="plan on this stored spec (bundled name or YAML) instead of calibrating this machine first")
    ap.add_argument("--no-drift", action="store_true", help="skip the machine-speed reference before each round")
    ap.add_argument("--models", type=comma_list(one_of(list(MODELS))), default=list(MODELS),
                    help=f"comma-separated, of {','.join(MODELS)}")
    ap.add_argument("--skip-memory", action="store_true")
    a = ap.parse_args(argv)
    if a.hardware is not None:  # refused now, not after the GEMM probe
        from piper_plan.errors import PiperError

        try:
            load_hardware(a.hardware)
        except PiperError as e:
            ap.error(f"argument --hardware: {e}")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    first, again = new_shape_cost_us()
    print(f"bf16 GEMM m×256@256×512, one thread: {first:.0f} µs CPU on a new row count, {again:.0f} µs on the same "
          f"ones again -> {first - again:.0f} µs per new shape (why --warmup is {a.warmup})")
    summary = run(a.hardware or calibrate_here(), a.models, a.steps, a.warmup, a.rounds, not a.no_drift)
    failed = failed_checks(summary)
    if not a.skip_memory:
        import memory_check
        print()
        if memory_check.main([]) != 0:
            failed.append("memory check (worst activation error > 10%)")
    # the last line says which acceptance check failed; the exit code says whether any did
    print(f"FAILED: {'; '.join(failed)}" if failed else "acceptance met")
    return 1 if failed else 0

if __name__ == "__main__":
    sys.exit(main())
