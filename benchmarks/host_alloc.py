"""piper-train's CPU allocator setting (piper_runtime.host.keep_freed_pages) against glibc's
default, on the MoE blocks of tiny-moe and small-moe-cpu.

One command:  python benchmarks/host_alloc.py  [--ranks 8] [--iters 60] [--rounds 2]

`ranks` processes (one thread each, as piper-train's CPU ranks) run forward + backward of one
MoE decoder block (bf16 autocast over fp32 weights, a fresh input every call) at once, first
with glibc's default allocator settings, then with the runtime's, alternating for `rounds`
rounds; the ranks start their timed calls together, after every rank's warm-up. Reported per
width and setting: CPU ms per call (mean over ranks, median over rounds), minor page faults and
system ms per call, and wall ms per call of the slowest rank; then default / runtime for CPU and
wall time."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

WIDTHS = ((64, 96, 64), (256, 512, 128))  # (hidden, expert ffn, tokens): tiny-moe's, small-moe-cpu's


def worker(d: int, f: int, seq: int, iters: int) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import resource
    import time

    from piper_runtime.host import keep_freed_pages

    applied = keep_freed_pages()
    import torch

    sys.path.insert(0, os.path.dirname(__file__))
    from layer_check import _spec
    from piper_runtime.model import Block, BuildCtx

    torch.set_num_threads(1)
    torch.manual_seed(0)
    blk = Block(_spec(d, f, seq), 1, BuildCtx(seq=seq, dtype="bf16", row_multiple=16))
    x = torch.randn(1, seq, d, requires_grad=True)

    def fb():
        x.data.normal_()
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            y = blk(x)
        y.float().sum().backward()
        for p in blk.parameters():  # as an optimizer step's zero_grad(set_to_none=True)
            p.grad = None

    for _ in range(30):  # past the GEMM library's per-shape builds
        fb()
    print("ready", flush=True)  # a barrier: every rank times the same contended window
    sys.stdin.readline()
    r0, c0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time(), time.perf_counter()
    for _ in range(iters):
        fb()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps(dict(applied=applied, cpu_ms=(time.process_time() - c0) / iters * 1e3,
                          wall_ms=(time.perf_counter() - t0) / iters * 1e3,
                          faults=(r1.ru_minflt - r0.ru_minflt) / iters, sys_ms=(r1.ru_stime - r0.ru_stime) / iters * 1e3)))


def run_once(width, ranks: int, iters: int, default: bool) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if default:
        env["PIPER_HOST_ALLOC"] = "default"
    else:
        env.pop("PIPER_HOST_ALLOC", None)
    args = [sys.executable, __file__, "--worker", *map(str, width), str(iters)]
    procs = [subprocess.Popen(args, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(ranks)]
    # start the timed calls together once every rank has warmed up (imports and warm-up finish at
    # different times; without this the first ranks time part of their loop uncontended)
    if any(p.stdout.readline().strip() != "ready" for p in procs):
        raise SystemExit("a worker failed before its timed calls")
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    outs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("a worker failed")
    return dict(applied=all(o["applied"] for o in outs), cpu_ms=statistics.fmean(o["cpu_ms"] for o in outs),
                wall_ms=max(o["wall_ms"] for o in outs), faults=statistics.fmean(o["faults"] for o in outs),
                sys_ms=statistics.fmean(o["sys_ms"] for o in outs))


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(*map(int, sys.argv[2:6]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args(argv)
    print(f"{a.ranks} processes at once on {os.cpu_count()} cores, one MoE block fwd+bwd each, {a.iters} calls")
    print(f"{'d':>4} {'tokens':>6} {'allocator':>9} {'CPU ms':>7} {'faults':>7} {'sys ms':>7} {'wall ms':>8}")
    for width in WIDTHS:
        res = {True: [], False: []}
        for _ in range(a.rounds):
            for default in (True, False):
                res[default].append(run_once(width, a.ranks, a.iters, default))
        med = {k: {f: statistics.median(r[f] for r in v) for f in ("cpu_ms", "wall_ms", "faults", "sys_ms")}
               for k, v in res.items()}
        if not all(r["applied"] for r in res[False]):
            print("   (mallopt not available here: both rows run glibc's default)")
        for default in (True, False):
            m = med[default]
            print(f"{width[0]:4d} {width[2]:6d} {'default' if default else 'runtime':>9} {m['cpu_ms']:7.2f} "
                  f"{m['faults']:7.0f} {m['sys_ms']:7.2f} {m['wall_ms']:8.2f}")
        print(f"{'':11} default/runtime: CPU {med[True]['cpu_ms'] / med[False]['cpu_ms']:.2f}x, "
              f"wall {med[True]['wall_ms'] / med[False]['wall_ms']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
