"""Pipeline hops on ranks that share cores: does a pipeline's fill and drain run faster
because idle ranks free their cores? (The model question behind Accelerator.ranks_per_core.)

One command:  python benchmarks/pipeline_hop.py  [--ranks 8] [--steps 10]

`ranks` local gloo ranks (one thread each) run ranks/pp independent pipelines of pp stages
(torch.distributed.pipelining, Schedule1F1B), each stage one 64×64 Linear, on 64×64
micro-batches. Reported per (pp, M): the step's wall time (slowest rank, median), the mean
CPU seconds per rank, and their ratio to summed-CPU / cores — the step if every core were
busy the whole time. A ratio near 1 says idle time is reused; above 1 says the critical path
(waits for a neighbour's message, then a core) binds even at full-load rates."""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _args import int_at_least  # noqa: E402

RUNS = ((2, 4), (2, 8), (4, 8))  # (pp, M)

def _run(rank, n, path, pp, M, steps, out_path):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(path, n), rank=rank, world_size=n)
    lanes = n // pp
    groups = [dist.new_group(list(range(i, n, lanes))) for i in range(lanes)]
    stage_idx = rank // lanes
    torch.manual_seed(0)
    stage = PipelineStage(torch.nn.Linear(64, 64), stage_idx, pp, torch.device("cpu"), group=groups[rank % lanes])
    sch = Schedule1F1B(stage, n_microbatches=M, loss_fn=lambda out, tgt: out.pow(2).mean())
    x, tgt = torch.randn(M, 64, 64), torch.zeros(M, 64, 64)

    def step():
        if stage_idx == 0:
            sch.step(x)
        elif stage_idx == pp - 1:
            sch.step(target=tgt)
        else:
            sch.step()

    for _ in range(3):
        step()
    walls, cpus = [], []
    for _ in range(steps):
        dist.barrier()
        c0, t0 = time.process_time(), time.perf_counter()
        step()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    res = [None] * n
    dist.all_gather_object(res, (statistics.median(walls), statistics.median(cpus)))
    if rank == 0:
        with open(out_path, "w") as f:
            f.write(f"{max(r[0] for r in res)} {statistics.fmean(r[1] for r in res)}")
    dist.destroy_process_group()


def ranks_type(text: str) -> int:
    """--ranks: every pipeline depth run must split the ranks into whole lanes (checked here, not
    after the first runs)."""
    step = math.lcm(*(pp for pp, _ in RUNS))
    ranks = int_at_least(step)(text)
    if ranks % step:
        depths = " and ".join(str(pp) for pp in sorted({pp for pp, _ in RUNS}))
        raise argparse.ArgumentTypeError(f"expected a multiple of {step} (pipelines of {depths} stages), got {ranks}")
    return ranks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=ranks_type, default=8, help="a multiple of 4")
    ap.add_argument("--steps", type=int_at_least(1), default=10)
    a = ap.parse_args(argv)
    import torch.multiprocessing as mp

    cores = os.cpu_count() or 1
    print(f"{a.ranks} ranks on {cores} cores; each stage one 64x64 Linear, 1F1B")
    print(f"{'pp':>3} {'M':>3} {'wall ms':>8} {'CPU/rank ms':>12} {'sum CPU/cores ms':>17} {'wall / that':>12}")
    for pp, M in RUNS:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "res")
            mp.spawn(_run, args=(a.ranks, os.path.join(tmp, "store"), pp, M, a.steps, out), nprocs=a.ranks)
            wall, cpu = map(float, open(out).read().split())
        bound = cpu * a.ranks / cores
        print(f"{pp:>3} {M:>3} {wall * 1e3:8.1f} {cpu * 1e3:12.2f} {bound * 1e3:17.1f} {wall / bound:12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
