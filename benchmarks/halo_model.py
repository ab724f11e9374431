"""The planner's predicted HALO / flat all-to-all speedup on a bundled hardware spec.

    python benchmarks/halo_model.py [--hardware frontier] [--nodes 16 32 ...] [--kib 4 64 ...]

No root, no torch: it evaluates piper_plan.cost.comm (a2a_call over a2a_flat / a2a_halo) for an
expert-parallel group spanning every GPU of `nodes` whole nodes (placement packed, stride 1),
uniform traffic, and prints

1. speedup = predicted flat time / predicted HALO time per node count and message size
   (bytes each rank sends to each peer), beside the paper's reported 1.2-9x;
2. the same for one MoE layer's dispatch of a real model (per-rank tokens x top_k x hidden x
   2 bytes, bf16, spread evenly over the group);
3. where the speedup comes from: the speedup with every level's latency set to 0 (bandwidth
   terms only: NIC affinity, rails, tapers, Phase III's extra intra-node bytes) and with
   every bandwidth x1e6 (message-count alpha terms only).

The paper's range (brief §1, "Headline claims"): HALO 1.2-9x the bandwidth of the vendor
all-to-all (RCCL through torch.distributed) at 16-512 nodes on Frontier.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _args import int_at_least  # noqa: E402

PAPER = (1.2, 9.0)  # brief §1: HALO vs RCCL all-to-all, 16-512 Frontier nodes
NODES = [16, 32, 64, 128, 256, 512]
KIB = [4, 16, 64, 256, 1024, 4096, 16384]


def speedup(hw, nodes: int, bytes_per_peer: float) -> float:
    """Predicted flat / HALO time of one all-to-all over all GPUs of `nodes` nodes."""
    from piper_plan.cost import comm

    n = nodes * hw.gpus_per_node
    nbytes = bytes_per_peer * n
    flat = comm.a2a_call(hw, nbytes, n, 1, False)
    halo = comm.a2a_call(hw, nbytes, n, 1, True)
    return float(flat / halo)


def alpha_only(hw):
    """The spec with every bandwidth x1e6: only per-message latency terms remain."""
    big = 1e6
    levels = [lv.model_copy(update={"bandwidth_gbps": lv.bandwidth_gbps * big} if lv.bandwidth_gbps else {})
              for lv in hw.topology]
    net = hw.network.model_copy(update={"nic_gbps": hw.network.nic_gbps * big})
    return hw.model_copy(update={"topology": levels, "network": net})


def beta_only(hw):
    """The spec with every latency 0 and no per-call floor: only bandwidth terms remain."""
    levels = [lv.model_copy(update={"latency_us": 0.0}) for lv in hw.topology]
    eff = hw.efficiency.model_copy(update={"collective_overhead_us": 0.0})
    return hw.model_copy(update={"topology": levels, "efficiency": eff})


def layer_bytes_per_peer(model, tokens: int, nodes: int, gpus_per_node: int) -> float:
    """Dispatch bytes a rank sends each peer for one MoE layer: tokens x top_k rows of hidden
    bf16 values, spread evenly over an EP group of every GPU."""
    return tokens * model.moe.top_k * model.hidden_size * 2 / (nodes * gpus_per_node)


def build(hw_name: str, nodes: list[int], kib: list[int], model_name: str, tokens: list[int]) -> dict:
    from piper_plan.specs import load_hardware, load_model

    hw = load_hardware(hw_name)
    model = load_model(model_name)
    a_hw, b_hw = alpha_only(hw), beta_only(hw)
    grid = {N: {k: speedup(hw, N, k * 1024) for k in kib} for N in nodes}
    parts = {N: {k: {"alpha_only": speedup(a_hw, N, k * 1024), "bandwidth_only": speedup(b_hw, N, k * 1024)}
                 for k in (kib[0], kib[-1])} for N in nodes}
    layer = {t: {N: {"bytes_per_peer": (b := layer_bytes_per_peer(model, t, N, hw.gpus_per_node)),
                     "speedup": speedup(hw, N, b)} for N in nodes} for t in tokens}
    vals = [v for row in grid.values() for v in row.values()]
    return {"hardware": hw.name, "model": model.name, "paper_range": PAPER, "grid": grid, "parts": parts,
            "layer": layer, "min": min(vals), "max": max(vals),
            "in_paper_range": sum(PAPER[0] <= v <= PAPER[1] for v in vals), "cells": len(vals),
            "gpus_per_node": hw.gpus_per_node, "rail_optimized": hw.network.rail_optimized,
            "comm": hw.efficiency.comm, "a2a_fanout": hw.efficiency.a2a_fanout}


def _fmt(v: float) -> str:
    style = "green" if PAPER[0] <= v <= PAPER[1] else "red" if v < 1 else "yellow"
    return f"[{style}]{v:.2f}x[/{style}]"


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes / 1024:.0f} KiB"


def render(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    kib = list(next(iter(r["grid"].values())))
    t = Table(title=f"Predicted HALO / flat all-to-all speedup on {r['hardware']} (EP group = every GPU of the "
                    f"nodes; bytes per peer)", caption=f"paper: {PAPER[0]}-{PAPER[1]:g}x at 16-512 nodes "
                    "(brief §1). green: inside it; yellow: 1x to the paper's low end; red: HALO slower")
    t.add_column("nodes", justify="right")
    t.add_column("GPUs", justify="right")
    for k in kib:
        t.add_column(_size(k * 1024), justify="right")
    for N, row in r["grid"].items():
        t.add_row(str(N), str(N * r["gpus_per_node"]), *(_fmt(v) for v in row.values()))
    con.print(t)

    t = Table(title=f"One {r['model']} MoE layer's dispatch (bf16 rows, tokens per rank x top_k spread over the "
                    "group): bytes per peer and predicted speedup")
    t.add_column("tokens / rank", justify="right")
    for N in next(iter(r["layer"].values())):
        t.add_column(f"{N} nodes", justify="right")
    for tok, row in r["layer"].items():
        t.add_row(str(tok), *(f"{_size(c['bytes_per_peer'])}: {_fmt(c['speedup'])}" for c in row.values()))
    con.print(t)

    t = Table(title="Where the speedup comes from: alpha terms only (bandwidth x1e6) vs bandwidth terms only "
                    "(latency 0)")
    t.add_column("nodes", justify="right")
    sizes = list(next(iter(r["parts"].values())))
    for k in sizes:
        t.add_column(f"{_size(k * 1024)}: alpha only", justify="right")
        t.add_column(f"{_size(k * 1024)}: bandwidth only", justify="right")
    for N, row in r["parts"].items():
        t.add_row(str(N), *(f"{row[k][p]:.2f}x" for k in sizes for p in ("alpha_only", "bandwidth_only")))
    con.print(t)
    con.print(
        f"Predicted speedup {r['min']:.2f}-{r['max']:.2f}x over the grid ({r['in_paper_range']}/{r['cells']} cells "
        f"inside the paper's {PAPER[0]}-{PAPER[1]:g}x).\n"
        "Where it comes from: flat sends g*N-1 messages per rank, each paying its level's latency; HALO sends N-1 "
        "packs across the network, q-1 intra-node messages in Phase I and q-1 in Phase III (each local rank gets "
        "its rows of all N-1 packs in one forward), which pay the cheaper intra-node latency - that is the alpha "
        "column. " + _bandwidth_story(r))


def _bandwidth_story(r: dict) -> str:
    """Why the bandwidth-only column reads as it does on this spec."""
    extra = ("HALO adds Phase III's intra-node bytes after Phase II (the packs share the NIC fairly and land "
             "together)")
    if r.get("a2a_fanout") is not None:
        return (f"The bandwidth column: on {r['hardware']} the library's fan-out all-to-all moves its network bytes "
                f"at efficiency.a2a_fanout = {r['a2a_fanout']:g} of the NIC rate (derived from the published measurements quoted in the spec), while "
                f"HALO's packs to the same-index peers run at comm = {r['comm']:g}, so up to "
                f"{r['comm'] / r['a2a_fanout']:.2f}x, less because {extra}.")
    return (f"The bandwidth column is ~1x or below on {r['hardware']}: its fabric is "
            f"{'rail-optimised' if r['rail_optimized'] else 'not rail-optimised'}, so flat's inter-node bytes already "
            f"go out through the same NICs at the same rate, and {extra}, so at large messages HALO is predicted "
            "slower. HALO's bandwidth win needs GPU->NIC affinity that flat traffic breaks (a rail fabric with a "
            "tapered spine: see hardware/emu-rail-q.yaml and benchmarks/halo_netns.py).")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", default="frontier", help="bundled name or YAML path")
    ap.add_argument("--nodes", type=int_at_least(1), nargs="+", default=NODES)
    ap.add_argument("--kib", type=int_at_least(1), nargs="+", default=KIB, help="bytes per peer, KiB")
    ap.add_argument("--model", default="deepseek-v3", help="model for the MoE-layer table")
    ap.add_argument("--tokens", type=int_at_least(1), nargs="+", default=[1024, 4096, 16384], help="tokens per rank")
    ap.add_argument("--json", help="also write the numbers here")
    a = ap.parse_args(argv)
    from piper_plan.errors import PiperError

    try:
        r = build(a.hardware, a.nodes, a.kib, a.model, a.tokens)
    except PiperError as e:
        print(f"halo_model: {e}", file=sys.stderr)
        return 2
    render(r)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(r, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
