"""Search speed: candidates evaluated per second and wall time, start-up included.

Each case runs `piper-plan search` in a fresh interpreter (cold start) and reports its wall
time (start-up included), the number of layouts evaluated and candidates per CPU-second of
enumeration + evaluation (CPU time, so other load on the machine does not inflate it), both in
that cold process and warm (best of 5 in one process, after one discarded search that pays numpy's
first-call costs); the baseline in the same run is a
per-candidate Python loop over the same cost model (the `estimate` path, one layout at a time)
on a sample, to show what vectorising buys. Targets (issue 3): >= 1,000,000 candidates/s on
one core, every case < 3 s wall.

"Evaluated" counts every layout the search accounts for, including those a cheap state-memory
bound discards without pricing them (search.STATE_BOUND); the loop prices every layout it times.
So two speed-ups are printed: end to end (evaluated layouts a CPU-second over the loop's), which
includes what the bound saves, and per priced layout (priced layouts a CPU-second over the
loop's), which is the vectorised pricing's alone.

    python benchmarks/search_speed.py
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

# global batches as published: DeepSeek-V3 trained with 15,360 sequences of 4,096 tokens
# (arXiv 2412.19437 §4.2); Megatron's 1T GPT used 3,072 sequences on 3,072 A100s (Narayanan 2021 Table 1)
CASES = [("deepseek-v3", "frontier", 1024, 15360), ("deepseek-v3", "dgx-h100", 16384, 15360),
         ("gpt-1t", "dgx-a100-80gb", 3072, 3072)]


def cold_search(model, hw, gpus, gbs):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "piper_plan.cli", "search", "-m", model, "-H", hw, "-n", str(gpus),
                          "--global-batch", str(gbs), "--json", "--top", "1"], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    d = json.loads(out.stdout)
    return wall, d


def warm_rate(model, hw, gpus, gbs, reps=5) -> tuple[float, float]:
    """(evaluated, priced) candidates per CPU-second of enumeration + evaluation, best of `reps`
    warm runs after one discarded run (its first calls into numpy's ufuncs and allocator cost a few ms)."""
    from piper_plan.search import SearchSpace, search
    from piper_plan.specs import load_hardware, load_model

    m, h = load_model(model), load_hardware(hw)
    sp = SearchSpace(gpus=gpus, global_batch=gbs, seq=m.seq_len)
    search(m, h, sp)
    best = 0.0, 0.0
    for _ in range(reps):
        r = search(m, h, sp)
        best = max(best, (r.evaluated / r.cpu_s, r.priced / r.cpu_s))
    return best


def loop_rate(model, hw, gpus, gbs, n=200, reps=3):
    """Baseline: the same model evaluated one layout per call, timed as the search is (CPU
    seconds, after a warm-up call, the best of `reps` passes), so load on the machine slows
    neither side more than the other."""
    from piper_plan.cost.batch import from_layouts
    from piper_plan.cost.estimate import evaluate
    from piper_plan.search import SearchSpace, enumerate_layouts
    from piper_plan.specs import load_hardware, load_model

    m, h = load_model(model), load_hardware(hw)
    batch, _ = enumerate_layouts(m, h, SearchSpace(gpus=gpus, global_batch=gbs, seq=m.seq_len))
    lays = [batch.layout(i) for i in range(min(n, len(batch)))]
    evaluate(m, h, from_layouts(lays[:1]))
    best = 0.0
    for _ in range(reps):
        t0 = time.process_time()
        for lay in lays:
            evaluate(m, h, from_layouts([lay]))
        best = max(best, len(lays) / (time.process_time() - t0))
    return best


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)  # no options: refuse any
    print(f"{'case':32s} {'cold wall s':>11s} {'evaluated':>10s} {'priced':>10s} {'eval/CPU-s cold':>15s} "
          f"{'eval/CPU-s warm':>15s} {'priced/CPU-s warm':>17s} {'loop/CPU-s':>10s} {'speed-up e2e':>12s} "
          f"{'per priced':>10s}")
    for model, hw, gpus, gbs in CASES:
        wall, d = cold_search(model, hw, gpus, gbs)
        cold = d["evaluated"] / d["search_cpu_s"]
        warm, warm_priced = warm_rate(model, hw, gpus, gbs)
        base = loop_rate(model, hw, gpus, gbs)
        print(f"{model + ' on ' + str(gpus) + ' ' + hw:32s} {wall:11.2f} {d['evaluated']:10,d} "
              f"{d['priced']:10,d} {cold:15,.0f} {warm:15,.0f} {warm_priced:17,.0f} "
              f"{base:10,.0f} {warm / base:11.0f}x {warm_priced / base:9.0f}x")
    print("evaluated: every layout the search accounts for, those the state-memory bound discards unpriced "
          "included; priced: those it prices.\nThe loop prices each layout it times: 'per priced' (warm priced "
          "rate / loop) is the pricing speed-up; 'e2e' adds what the bound saves.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
