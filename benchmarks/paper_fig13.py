"""Paper check (issue 3): the layout Piper's planner picks on `frontier` for the X-MoE models
and the weak-scaling family, its predicted model TFLOPS/GPU, beside the paper's reported figure
(brief §5) with the ratio. A report, not an assertion.

The search here is unconstrained (TP, DualPipeV, ZeRO-2, fused kernels: what piper-plan would
pick for these jobs), so its figures are not the paper's runs. The validation rows for the same
jobs price Piper's own runtime (its PP x EP mesh under 1F1B, validate.piper_space) and X-MoE's
(no pipeline), and give the Piper/X-MoE ratios beside the paper's: piper-plan validate
--group piper2026-fig13 (and --group xmoe2025).

    python benchmarks/paper_fig13.py
"""
import argparse
import sys

from piper_plan.search import SearchSpace, default_global_batch, round_batch, search
from piper_plan.specs import load_hardware, load_model

PAPER = [("xmoe-small", 8, 2048, 90.44), ("xmoe-medium", 32, 4096, 57.83), ("xmoe-large", 80, 4096, 46.89),
         ("xmoe-super", 512, 4096, 36.96), ("piper-110b", 64, 4096, 45.15), ("piper-862b", 512, 4096, 39.38),
         ("piper-1.7t", 1024, 4096, 33.04)]


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)  # no options: refuse any
    hw = load_hardware("frontier")
    print("unconstrained search (what piper-plan picks); the paper's own stack: piper-plan validate --group piper2026-fig13")
    print(f"{'model':12s} {'GCDs':>5s} {'chosen layout':58s} {'pred TF':>8s} {'paper TF':>9s} {'ratio':>6s}")
    for name, gpus, seq, paper in PAPER:
        m = load_model(name)
        res = search(m, hw, SearchSpace(gpus=gpus, global_batch=round_batch(default_global_batch(seq), gpus), seq=seq))
        if res.best is None:
            print(f"{name:12s} {gpus:5d} nothing fits")
            continue
        i = res.best
        lay = res.batch.layout(i)
        desc = (f"tp{lay.tp} pp{lay.pp} dp{lay.dp} ep{lay.ep} mbs{lay.mbs} {lay.schedule} rc={lay.recompute} "
                f"z{lay.zero} {lay.a2a}")
        tf = float(res.est.tflops_per_gpu[i])
        print(f"{name:12s} {gpus:5d} {desc:58s} {tf:8.1f} {paper:9.2f} {tf / paper:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
