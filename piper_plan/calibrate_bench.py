"""Micro-benchmarks for `piper-plan calibrate`, run by N local ranks at once (torch, lazily).

Every rank runs every compute benchmark at the same time as the others, because that is how a
training run uses the machine: on a CPU, N ranks of one thread each share the cores, so the
per-rank rate the planner needs is the one measured with all N busy. Communication runs in
consecutive groups of n ranks for each n dividing N, all N/n groups at once (as the EP groups
of one pipeline stage do).

Timing: CPU — after a warm-up and a barrier, each rank repeats the kernel for a fixed wall
window (so the contention is the same throughout) and reports window/count; CUDA — CUDA events
around a batch of launches sized to the window. Collectives: the slowest rank's time per call.
Times in seconds, sizes in bytes.
"""
from __future__ import annotations

import itertools
import os
import queue as _queue
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import PiperError


@dataclass
class BenchPlan:
    """What to measure. gemm: (dtype, m, n, k, groups); stream: fp32 element counts of
    c = a + b; attention: (batch, heads, seq, head_dim), causal, bf16; comm_sizes: bytes per
    rank buffer; window_s: seconds per compute point; comm_window_s: target per comm point."""

    gemm: list[tuple[str, int, int, int, int]]
    stream: list[int]
    attention: list[tuple[int, int, int, int]]
    comm_sizes: list[int]
    comm_kinds: tuple[str, ...] = ("p2p", "allreduce", "alltoall")
    layers: tuple[str, ...] = ()          # dtypes for the framework-overhead blocks (CPU: fp32, bf16)
    loaded_comm: bool = False             # measure the per-call collective cost under compute load
    loaded_ends: bool = False             # ... over the smallest and the largest group only (quick)
    skew_bursts: tuple[int, ...] = ()     # longer bursts (× LOADED_BURST) for the arrival-skew probe
    window_s: float = 0.25
    comm_window_s: float = 0.1
    attn_dtype: str = "bf16"
    meta: dict = field(default_factory=dict)
    casts: list = field(default_factory=list)  # fp32 element counts of weight-cast pairs (CPU)
    # piper-train runs of PIPE_SPEC, one per schedule: [(schedule, plan JSON)] (calibrate fills
    # them in from pipeline_schedules: a plan needs the hardware spec, which make_plan lacks)
    pipeline_schedules: tuple[str, ...] = ()
    pipelines: list = field(default_factory=list)
    pipeline_steps: int = 16
    optimizer_tensors: int = 0  # parameter tensors of the eager-optimizer probe (0: skip)
    # how a GEMM point is timed: "train" = the three GEMMs training runs per linear layer
    # (forward x·Wᵀ, input gradient g·W, weight gradient gᵀ·x; grouped: the runtime's grouped_mm
    # and its backward), per GEMM; "matmul" = one a·b of row-major operands (records before
    # "train"; calibrate --check repeats whichever a record used). The layouts can differ a
    # lot: bf16 on a 2-core AVX2 host, 512x1024x512, measured 73 / 518 / 34 ms
    gemm_probe: str = "train"

    def comm_groups(self, ranks: int) -> list[int]:
        """Group sizes measured: every n ≥ 2 that divides the rank count."""
        return [n for n in range(2, ranks + 1) if ranks % n == 0]

    def loaded_groups(self, ranks: int) -> list[int]:
        """Group sizes of the loaded-collective probe (its fit takes medians over them)."""
        g = self.comm_groups(ranks)
        return sorted({g[0], g[-1]}) if self.loaded_ends and g else g

    def items(self, ranks: int) -> int:
        """Number of progress ticks a run posts."""
        comm = len(self.comm_groups(ranks)) * len(self.comm_kinds) * len(self.comm_sizes)
        loaded = (len(self.loaded_groups(ranks)) * len(LOADED_KINDS) + len(self.skew_bursts)) if self.loaded_comm else 0
        return (len(self.gemm) + len(self.stream) + len(self.attention) + comm + 2 * len(self.layers) + loaded
                + len(self.pipelines) + len(self.casts) + (len(OPT_PARTS) if self.optimizer_tensors else 0))


# Framework-overhead blocks: one dense and one MoE decoder block of piper-train at a negligible
# width (shaped like tiny-moe: GQA, SwiGLU, one shared expert, softmax top-2), so their time is
# almost all per-operation host cost; the fit subtracts the kernel model's own price of them.
LAYER_SPEC = dict(name="calibrate-block", source="piper-plan calibrate framework-overhead probe", num_layers=2,
                  hidden_size=32, num_heads=2, num_kv_heads=1, vocab_size=64, seq_len=64, ffn_size=64,
                  dense_layers=1, moe=dict(num_experts=4, top_k=2, expert_ffn_size=32, shared_experts=1,
                                           router="softmax"))
# piper-train pads each local expert's rows to this multiple on CPU ranks (written to the
# spec as accelerator.expert_row_multiple; the probe blocks run the same way)
CPU_EXPERT_ROW_MULTIPLE = 16
LAYER_SEQ = 64  # tokens: enough that expert row counts vary from call to call
# Pipeline-executor probe: piper-train itself on a 4-layer model of LAYER_SPEC's blocks, pp 2 over
# pairs of ranks (all ranks busy), PIPE_MICROBATCHES micro-batches of LAYER_SEQ tokens, under 1f1b
# (one chunk of two layers a rank) and each multi-chunk schedule (two chunks of one layer): the
# same layers and messages, so the step time the model does not explain is the executor's own
PIPE_SPEC = dict(LAYER_SPEC, name="calibrate-pipeline", num_layers=4)
PIPE_SCHEDULES = ("1f1b", "interleaved", "zbv", "dualpipev")
PIPE_MICROBATCHES = 4
# Eager-optimizer probe: piper-train's per-tensor host work (piper_runtime.optim) over small
# tensors (every 4th a 1-D norm-like one, as in a decoder block), so bytes cost nothing and the
# time is what each parameter tensor costs: 'adamw' the single-tensor AdamW step and the
# gradient's norm (per owned tensor), 'grad' the clip scale and ÷dp (per held gradient), 'copy'
# a flat collective buffer unpacked back into its tensors (per tensor reduced or gathered)
OPT_PARTS = ("adamw", "grad", "copy")
OPT_TENSORS = 64
OPT_TENSOR_SHAPE = (16, 16)
LOADED_KINDS = ("p2p", "alltoall", "allreduce")
SKEW_ITERS = 12
LOADED_BURST = 48  # 64×64 fp32 GEMMs between two calls: ~0.5 ms of work a rank, ~2 ms with 8 ranks on 2 cores


def pipeline_probes(hw, ranks: int, schedules) -> list[tuple[str, str]]:
    """[(schedule, plan JSON)] of the pipeline-executor probe on `ranks` ranks (none if odd)."""
    if ranks < 2 or ranks % 2 or not schedules:
        return []
    from .layout import Layout
    from .plan import make_plan as make_train_plan
    from .specs.model import ModelSpec

    spec, dp = ModelSpec(**PIPE_SPEC), ranks // 2
    out = []
    for s in schedules:
        lay = Layout(gpus=ranks, pp=2, dp=dp, ep=1, vpp=1 if s in ("gpipe", "1f1b") else 2, mbs=1,
                     global_batch=dp * PIPE_MICROBATCHES, seq=LAYER_SEQ, schedule=s, dtype="bf16", zero=1,
                     overlap_grad_reduce=False, fused_kernels=False)
        out.append((s, make_train_plan(spec, hw, lay).model_dump_json()))
    return out


def _expert_shapes(dtypes, ms, kn):
    return [(dt, m, n, k, 1) for dt in dtypes for (k, n) in kn for m in ms]


def make_plan(kind: str, device: str) -> BenchPlan:
    """'quick' (85-100 s with 8 ranks on 2 cores), 'full', or 'smoke' (seconds; CI)."""
    gpu = device == "cuda"
    dtypes = ("bf16",) if gpu else ("fp32", "bf16")
    if kind == "smoke":
        return BenchPlan(gemm=[(dt, m, 64, 64, 1) for dt in dtypes for m in (16, 64, 256)] + [("bf16", 32, 64, 64, 2)],
                         stream=[64, 2**14, 2**18], attention=[(1, 2, 64, 32), (1, 2, 128, 32)],
                         comm_sizes=[1024, 65536], layers=() if gpu else ("fp32",), loaded_comm=not gpu,
                         skew_bursts=() if gpu else (4,),
                         window_s=0.02, comm_window_s=0.02, meta={"kind": kind}, casts=[] if gpu else [2**12, 2**16],
                         pipeline_schedules=() if gpu else PIPE_SCHEDULES, pipeline_steps=4,
                         optimizer_tensors=8)
    if gpu:
        # H100-class shapes: expert GEMMs of DeepSeek/Mixtral widths, big squares, long sequences
        kn = [(2048, 4096), (4096, 2816), (7168, 4096)]
        ms = (16, 64, 128, 256, 512, 1024, 4096) if kind == "quick" else (16, 32, 64, 96, 128, 192, 256, 384, 512,
                                                                            1024, 2048, 4096, 8192)
        sq = (1024, 4096, 8192) if kind == "quick" else (512, 1024, 2048, 4096, 8192, 16384)
        gemm = _expert_shapes(dtypes, ms, kn) + [("bf16", s, s, s, 1) for s in sq]
        gemm += [("bf16", 128, 4096, 2048, 8), ("bf16", 512, 4096, 2048, 16)]
        stream = [1, 2**10, 2**20, 2**24, 2**27]
        attention = [(4, 16, 2048, 64), (4, 16, 2048, 128), (1, 16, 8192, 128), (8, 32, 1024, 128)]
        sizes = [2**k for k in ((10, 16, 20, 24, 28) if kind == "quick" else range(10, 30, 2))]
        return BenchPlan(gemm, stream, attention, sizes, window_s=0.1 if kind == "quick" else 0.3,
                         comm_window_s=0.05 if kind == "quick" else 0.2, meta={"kind": kind},
                         optimizer_tensors=OPT_TENSORS)
    # CPU: tiny-moe's expert GEMM (hidden 64 × 2·96 gated), a CPU-sized one (512 × 1024), squares
    kn = [(64, 192), (512, 1024)]
    if kind == "quick":
        # the largest stream is 2**23 (96 MiB a rank, 10x the cache share): 2**24 read the same DRAM
        # rate (3.6-3.8 GB/s a rank at 2**22-2**24) and took 7-9 s of the run, mostly first-touch faults
        ms, sq, st = (16, 48, 96, 128, 384, 1024, 4096), (256, 512, 1024), [1, 64, 2**16, 2**20, 2**22, 2**23]
        attention = [(1, 4, 64, 16), (2, 8, 128, 32), (1, 4, 256, 64), (1, 4, 1024, 64), (1, 4, 512, 32),
                     (1, 4, 512, 128)]
        sizes = [2**10, 2**16, 2**20, 2**22]
    else:
        ms = (16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 2048, 4096)
        sq, st = (128, 256, 512, 1024, 2048), [1, 16, 256, 2**12, 2**16, 2**20, 2**22, 2**24]
        kn = kn + [(1024, 2048)]
        attention = [(1, 4, 64, 16), (2, 8, 128, 32)] + [(1, 4, s, d) for s in (256, 512, 1024, 2048)
                                                          for d in (32, 64, 128)]
        sizes = [2**k for k in range(8, 26, 2)]
    gemm = _expert_shapes(dtypes, ms, kn) + [(dt, s, s, s, 1) for dt in dtypes for s in sq]
    gemm += [(dt, 48, 192, 64, 4) for dt in dtypes] + [(dt, 128, 1024, 512, 8) for dt in dtypes]
    # quick keeps under 2 minutes on 2 cores where a run varies by +-20 % (99-123 s measured in one
    # afternoon before these cuts): 10 pipeline-probe steps (16 took 28 s), the loaded probe over
    # the smallest and largest groups only (its fit takes medians), shorter windows
    return BenchPlan(gemm, st, attention, sizes, layers=dtypes, loaded_comm=True, pipeline_schedules=PIPE_SCHEDULES,
                     loaded_ends=kind == "quick", pipeline_steps=10 if kind == "quick" else 16,
                     skew_bursts=(16, 64) if kind == "quick" else (4, 16, 64),
                     casts=[2**16, 2**20, 2**22], optimizer_tensors=OPT_TENSORS,
                     window_s=0.25 if kind == "quick" else 0.5,
                     comm_window_s=0.2 if kind == "quick" else 0.4, meta={"kind": kind})


# ---- inside a rank ---------------------------------------------------------------------
def _dtype(torch, name):
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


class _Timer:
    def __init__(self, torch, dist, dev, window):
        self.torch, self.dist, self.dev, self.window = torch, dist, dev, window
        self.cuda = dev.type == "cuda"

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize(self.dev)

    def __call__(self, fn) -> float:
        """Seconds per call of fn, all ranks timing at once."""
        fn()
        self.sync()
        self.dist.barrier()
        if self.cuda:
            ev = lambda: self.torch.cuda.Event(enable_timing=True)  # noqa: E731
            s, e = ev(), ev()
            s.record()
            fn()
            e.record()
            e.synchronize()
            reps = int(min(10000, max(3, self.window / max(s.elapsed_time(e) / 1e3, 1e-7))))
            s.record()
            for _ in range(reps):
                fn()
            e.record()
            e.synchronize()
            return s.elapsed_time(e) / 1e3 / reps
        t0 = time.perf_counter()
        n = 0
        while True:
            fn()
            n += 1
            t = time.perf_counter() - t0
            if t >= self.window and n >= 2:
                return t / n


def _gemm_fn(torch, dev, dt, m, n, k, g, probe: str = "matmul"):
    """A callable running the GEMM point (dt, m, n, k, g) the way `probe` says (BenchPlan.gemm_probe)."""
    if probe == "train":
        return _train_gemm_fn(torch, dev, _dtype(torch, dt), m, n, k, g)
    a = torch.randn(g * m, k, device=dev).to(_dtype(torch, dt))
    if g == 1:
        b = torch.randn(k, n, device=dev).to(_dtype(torch, dt))
        return lambda: torch.matmul(a, b)
    b = torch.randn(g, k, n, device=dev).to(_dtype(torch, dt))
    offs = torch.arange(1, g + 1, device=dev, dtype=torch.int32) * m
    grouped = torch.nn.functional.grouped_mm
    grouped(a, b, offs=offs)  # raises here (not mid-timing) when this build/dtype lacks it
    return lambda: grouped(a, b, offs=offs)


def _train_gemm_fn(torch, dev, dt, m, n, k, g):
    """Forward and backward of what piper-train runs: a linear layer (weight n x k, as
    nn.Linear stores it) or, for g groups, grouped_mm over expert weights g x k x n (runtime/moe/
    experts.py); gradients returned, not accumulated. Three GEMMs of 2·g·m·n·k FLOPs each."""
    x = torch.randn(g * m, k, device=dev).to(dt).requires_grad_()
    go = torch.randn(g * m, n, device=dev).to(dt)
    grad = torch.autograd.grad
    if g == 1:
        w = torch.randn(n, k, device=dev).to(dt).requires_grad_()
        return lambda: grad(torch.nn.functional.linear(x, w), (x, w), go)
    w = torch.randn(g, k, n, device=dev).to(dt).requires_grad_()
    offs = torch.arange(1, g + 1, device=dev, dtype=torch.int32) * m
    grouped = torch.nn.functional.grouped_mm
    grad(grouped(x, w, offs=offs), (x, w), go)  # raises here (not mid-timing) when this build/dtype lacks it
    return lambda: grad(grouped(x, w, offs=offs), (x, w), go)


def _comm_fn(torch, dist, dev, kind, rank, n, sub, numel):
    base = rank // n * n
    if kind == "p2p":  # ring shift inside the group: every rank sends and receives one message
        nxt, prv = base + (rank - base + 1) % n, base + (rank - base - 1) % n
        s, r = torch.zeros(numel, device=dev), torch.empty(numel, device=dev)

        ops = [dist.P2POp(dist.isend, s, nxt), dist.P2POp(dist.irecv, r, prv)]

        def p2p():  # batched, so NCCL pairs the send and the receive in one group (no deadlock)
            for req in dist.batch_isend_irecv(ops):
                req.wait()
        return p2p
    if kind == "allreduce":
        x = torch.zeros(numel, device=dev)  # zeros stay finite however often they are summed
        return lambda: dist.all_reduce(x, group=sub)
    x, y = torch.zeros(numel, device=dev), torch.empty(numel, device=dev)
    return lambda: dist.all_to_all_single(y, x, group=sub)


def _worker(rank, world, store_path, plan_d, device, q, timeout_s):
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    plan = BenchPlan(**plan_d)
    cuda = device == "cuda"
    if not cuda:  # the allocator piper-train's CPU ranks run with (piper_runtime.host)
        from piper_runtime.host import keep_freed_pages

        keep_freed_pages()
    if cuda:
        torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", store=dist.FileStore(store_path, world), rank=rank,
                            world_size=world, timeout=timedelta(seconds=timeout_s))
    tick = (lambda label: q.put(("tick", label))) if rank == 0 else (lambda label: None)
    timer = _Timer(torch, dist, dev, plan.window_s)
    try:
        base = {}
        if not cuda:  # a CPU rank's fixed memory: the process with piper-train's modules, before any probe
            import importlib

            from piper_runtime.metrics import peak_rss_gib

            importlib.import_module("piper_runtime.train")  # what a piper-train rank imports
            base["baseline_rss_gib"] = peak_rss_gib()
        res = {**_compute(torch, dev, plan, tick, timer), **base}
        res["layers"] = _layers(torch, dev, plan, tick, timer)
        res["casts"] = _casts(torch, dev, plan, tick, timer)
        res["optimizer"] = _optimizer(torch, dev, plan, tick, timer)
        res["pipelines"] = _pipelines(dev, plan, rank, tick, timeout_s)
        res["comm"] = []
        _comm(torch, dist, dev, plan, rank, world, res["comm"], tick, timer)
        res["loaded_comm"] = []
        if plan.loaded_comm:
            _loaded_comm(torch, dist, dev, plan, rank, world, res["loaded_comm"], tick)
        q.put(("result", rank, res))
    finally:
        dist.destroy_process_group()


def _compute(torch, dev, plan, tick, timer) -> dict:
    res: dict[str, list] = {"gemm": [], "stream": [], "attention": []}
    for dt, m, n, k, g in plan.gemm:
        try:
            fn = _gemm_fn(torch, dev, dt, m, n, k, g, plan.gemm_probe)
        except (AttributeError, RuntimeError, NotImplementedError, TypeError):
            fn = None  # grouped_mm missing for this build/dtype: the same outcome on every rank
        if fn is not None:
            per = 3 if plan.gemm_probe == "train" else 1  # seconds per GEMM of the point's shape
            res["gemm"].append({"dtype": dt, "m": m, "n": n, "k": k, "groups": g, "seconds": timer(fn) / per})
        tick(f"gemm {dt} {g}×{m}×{n}×{k}")
    for numel in plan.stream:
        a, b, c = (torch.ones(numel, device=dev) for _ in range(3))
        res["stream"].append({"nbytes": 12 * numel, "seconds": timer(lambda: torch.add(a, b, out=c))})
        tick(f"stream {12 * numel} B")
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for bs, h, s, d in plan.attention:
        qkv = [torch.randn(bs, h, s, d, device=dev).to(_dtype(torch, plan.attn_dtype)).requires_grad_()
               for _ in range(3)]
        with torch.no_grad():
            t = timer(lambda: sdpa(*qkv, is_causal=True))
        grad = torch.ones(bs, h, s, d, device=dev, dtype=qkv[0].dtype)
        t_fb = timer(lambda: sdpa(*qkv, is_causal=True).backward(grad))
        # the backward alone: forward + backward less the forward (floored: noise on tiny shapes)
        res["attention"].append({"dtype": plan.attn_dtype, "batch": bs, "heads": h, "seq": s, "head_dim": d,
                                 "flops": 2.0 * bs * h * s * s * d, "seconds": t,
                                 "seconds_bwd": max(t_fb - t, 0.1 * t), "rows": bs * h * s})
        tick(f"attention s={s} d={d}")
    return res


def _layers(torch, dev, plan, tick, timer) -> list[dict]:
    """Forward + backward of one dense and one MoE block of piper-train (LAYER_SPEC, one
    sequence of LAYER_SEQ tokens, expert parallelism off) per dtype; bf16 as the runtime
    runs it (autocast over fp32 weights)."""
    if not plan.layers:
        return []
    from piper_runtime.model import Block, BuildCtx  # the runtime measured is the one the plans run

    from .specs.model import ModelSpec

    spec = ModelSpec(**LAYER_SPEC)
    out = []
    torch.manual_seed(0)
    for dt in plan.layers:
        ctx = BuildCtx(seq=LAYER_SEQ, dtype=dt, row_multiple=CPU_EXPERT_ROW_MULTIPLE if dev.type == "cpu" else 1)
        for layer, kind in ((0, "dense"), (1, "moe")):
            blk = Block(spec, layer, ctx).to(dev)
            x = torch.randn(1, LAYER_SEQ, spec.hidden_size, device=dev, requires_grad=True)

            def fb():
                # fresh activations every call, as in training: the router then hands each
                # expert a new row count, and a CPU GEMM library re-plans every new shape
                # (measured: +35% CPU for a tiny-moe MoE block against a fixed input)
                x.data.normal_()
                with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=dt == "bf16"):
                    y = blk(x)
                y.float().sum().backward()
            out.append({"kind": kind, "dtype": dt, "tokens": LAYER_SEQ, "seconds": timer(fb)})
            tick(f"{kind} block {dt}")
    return out


def _casts(torch, dev, plan, tick, timer) -> list[dict]:
    """Autocast's weight casts as piper-train runs them: an fp32 weight to a fresh bf16 copy
    (forward) and a bf16 gradient to a fresh fp32 one (backward), 12 B per element a pair,
    over six tensors in turn so no call finds its source cached."""
    out = []
    for numel in plan.casts:
        ws = [torch.randn(numel, device=dev) for _ in range(6)]
        hs = [w.to(torch.bfloat16) for w in ws]
        turn = itertools.cycle(range(6))

        def pair():
            i = next(turn)
            ws[i].to(torch.bfloat16)
            hs[i].float()
        out.append({"nbytes": 12 * numel, "seconds": timer(pair)})
        tick(f"weight casts {4 * numel} B")
    return out


def _optimizer(torch, dev, plan, tick, timer) -> list[dict]:
    """piper-train's eager optimizer work per parameter tensor (OPT_PARTS), timed on
    plan.optimizer_tensors tensors with piper_runtime.optim's own functions. The clip's norm
    is kept below max_norm so its scale is 1 and values stay normal from call to call."""
    n = plan.optimizer_tensors
    if not n:
        return []
    from torch._utils import _flatten_dense_tensors

    from piper_runtime.optim import copy_back, make_adamw, sum_squares

    torch.manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(*(OPT_TENSOR_SHAPE if i % 4 else OPT_TENSOR_SHAPE[:1]), device=dev))
          for i in range(n)]
    for p in ps:
        p.grad = torch.randn_like(p) * 1e-3
    grads = [p.grad for p in ps]
    opt = make_adamw(ps, 1e-4, 0.1)
    norm = torch.tensor(0.5, device=dev)

    def adamw():
        opt.step()
        sum_squares(grads, dev)

    def grad():
        torch.nn.utils.clip_grads_with_norm_(ps, 1.0, norm)
        for g in grads:
            g.div_(1.0)

    fns = {"adamw": adamw, "grad": grad, "copy": lambda: copy_back(grads, _flatten_dense_tensors(grads))}
    numel = sum(p.numel() for p in ps)
    out = []
    for part in OPT_PARTS:
        out.append({"part": part, "tensors": n, "numel": numel, "seconds": timer(fns[part])})
        tick(f"optimizer {part}")
    return out


def _pipelines(dev, plan, rank, tick, timeout_s: float) -> list[dict]:
    """piper-train under each probe plan: the median step wall time of the last half of
    plan.pipeline_steps steps (the first half builds GEMM kernels for new expert row counts)."""
    if not plan.pipelines:
        return []
    from piper_runtime.config import TrainConfig
    from piper_runtime.train import train

    from .plan import Plan

    out = []
    for sched, pj in plan.pipelines:
        p = Plan.model_validate_json(pj)
        recs = train(p, TrainConfig(steps=plan.pipeline_steps, log_every=0, timeout_s=timeout_s), dev)
        if rank == 0:  # rank 0 returns the records (each step's time: the slowest rank's)
            out.append({"schedule": sched, "seconds": _median([r["step_time_s"] for r in recs[len(recs) // 2:]]),
                        "microbatches": p.layout.microbatches, "vpp": p.layout.vpp})
        tick(f"pipeline {sched}")
    return out


def _loaded_comm(torch, dist, dev, plan, rank, world, out, tick):
    """Per-call cost of a small collective while every rank computes between calls, as in
    training: each rank loops [LOADED_BURST GEMMs, one call] and [the same GEMMs alone]; the
    difference per iteration (slowest rank) is the call's cost under load. Both loops run
    twice, interleaved, and the smaller of each pair is kept (other load on the machine
    only adds)."""
    a = torch.randn(64, 64, device=dev)
    b = torch.randn(64, 64, device=dev)

    def burst(times=1):
        for _ in range(LOADED_BURST * times):
            torch.mm(a, b)

    def timed(fn, iters):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        t = torch.tensor([(time.perf_counter() - t0) / iters], device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t)

    def added(op, times, iters):
        """(what `op` adds per iteration after `times` bursts, the bursts' own time): both
        loops twice, interleaved, the smaller of each kept."""
        def both():
            burst(times)
            op()
        pairs = [(timed(lambda: burst(times), iters), timed(both, iters)) for _ in range(2)]
        alone = min(p[0] for p in pairs)
        return min(p[1] for p in pairs) - alone, alone

    iters = max(10, int(plan.comm_window_s / 2e-3))
    for n in plan.loaded_groups(world):
        sub, _ = dist.new_subgroups(group_size=n)
        for kind in LOADED_KINDS:
            numel = 64 * n  # 256 B per peer: latency-bound, like the count exchange
            op = _comm_fn(torch, dist, dev, kind, rank, n, sub, numel)
            op()
            extra, alone = added(op, 1, iters)
            out.append({"kind": kind, "n": n, "nbytes": 4 * numel, "seconds": extra, "burst_s": alone})
            tick(f"{kind} n={n} under load")
    # arrival skew: the same all-to-all on every rank after longer bursts (training computes far
    # longer than LOADED_BURST between its exchanges; what a call adds grows with it)
    numel = 64 * world
    op = _comm_fn(torch, dist, dev, "alltoall", rank, world, None, numel)
    # at least SKEW_ITERS calls a long-burst row: with 4 (a 0.2-0.25 s window's share at 64x) a shared
    # VM's 100 ms hiccups decided the row (measured: 1.8 ms added after 127 ms bursts against 3.9 after
    # 2 ms, which zeroed the fitted term)
    for times in plan.skew_bursts if world > 1 else ():
        extra, alone = added(op, times, max(SKEW_ITERS, iters // times))
        out.append({"kind": "alltoall", "n": world, "nbytes": 4 * numel, "seconds": extra, "burst_s": alone,
                    "skew": True})
        tick(f"alltoall after {times}× burst")


def _comm(torch, dist, dev, plan, rank, world, out, tick, timer):
    for n in plan.comm_groups(world):
        sub, _ = dist.new_subgroups(group_size=n)
        for kind in plan.comm_kinds:
            for nbytes in plan.comm_sizes:
                numel = max(n, round(nbytes / 4 / n) * n)  # all-to-all needs a multiple of n
                op = _comm_fn(torch, dist, dev, kind, rank, n, sub, numel)
                op()
                timer.sync()
                dist.barrier()
                t0 = time.perf_counter()
                op()
                timer.sync()
                t1 = torch.tensor([time.perf_counter() - t0], device=dev)
                dist.all_reduce(t1, op=dist.ReduceOp.MAX)  # every rank gets the same count
                reps = int(min(200, max(2, plan.comm_window_s / max(float(t1), 1e-6))))
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(reps):
                    op()
                timer.sync()
                t = torch.tensor([(time.perf_counter() - t0) / reps], device=dev)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                out.append({"kind": kind, "n": n, "nbytes": 4 * numel, "seconds": float(t)})
                tick(f"{kind} n={n} {4 * numel} B")


# ---- the parent --------------------------------------------------------------------------
def _median(xs):
    xs = sorted(xs)
    h = len(xs) // 2
    return xs[h] if len(xs) % 2 else 0.5 * (xs[h - 1] + xs[h])


def _merge(per_rank: dict[int, dict]) -> dict:
    """Compute points: the harmonic mean of the ranks' times, i.e. the time per call at the
    ranks' mean rate (ranks the OS favoured ran more calls in the same window, so this is the
    fair-share rate a rank gets; the spread is kept). Comm: rank 0's, already the slowest
    rank's time (reduced inside the run)."""
    ranks = sorted(per_rank)
    out: dict = {"comm": per_rank[ranks[0]]["comm"],
                 "loaded_comm": per_rank[ranks[0]].get("loaded_comm", []),
                 "pipelines": per_rank[ranks[0]].get("pipelines", [])}
    if "baseline_rss_gib" in per_rank[ranks[0]]:  # the largest rank's
        out["baseline_rss_gib"] = max(per_rank[r]["baseline_rss_gib"] for r in ranks)
    for fam in ("gemm", "stream", "attention", "layers", "casts", "optimizer"):
        rows = []
        for i, row in enumerate(per_rank[ranks[0]].get(fam, [])):
            ts = [per_rank[r][fam][i]["seconds"] for r in ranks]
            rows.append({**row, "seconds": len(ts) / sum(1.0 / t for t in ts),
                         "seconds_min": min(ts), "seconds_max": max(ts)})
        out[fam] = rows
    return out


def run_benchmarks(plan: BenchPlan, ranks: int, device: str = "cpu", *, timeout_s: float = 60.0,
                   on_tick=None, deadline_s: float = 1800.0) -> dict:
    """Spawn `ranks` local ranks (gloo on CPU, NCCL on CUDA) and return merged measurements.

    on_tick(label) is called in this process for every finished point. A rank that fails or a
    run past deadline_s raises PiperError (one line); the ranks are stopped first."""
    import torch.multiprocessing as mp
    from piper_runtime.procs import context, start_ranks

    q = context().Queue()
    saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    os.environ.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})  # children inherit: one thread a rank
    per_rank: dict[int, dict] = {}
    with tempfile.TemporaryDirectory(prefix="piper-calibrate-") as tmp:
        try:
            pc = start_ranks(_worker, (ranks, str(Path(tmp) / "store"), asdict(plan), device, q, timeout_s), ranks)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        t_end = time.monotonic() + deadline_s

        def drain(block):
            while True:
                try:
                    msg = q.get(timeout=0.1) if block else q.get_nowait()
                except _queue.Empty:
                    return
                block = False
                if msg[0] == "tick" and on_tick:
                    on_tick(msg[1])
                elif msg[0] == "result":
                    per_rank[msg[1]] = msg[2]

        try:
            while True:
                drain(True)
                if pc.join(timeout=0.05):
                    break
                if time.monotonic() > t_end:
                    raise PiperError(f"calibrate: benchmarks ran past {deadline_s:.0f} s; stopped")
        except mp.ProcessRaisedException as e:
            lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
            raise PiperError(f"calibrate: a rank failed: {lines[-1] if lines else e}") from None
        except mp.ProcessExitedException as e:
            raise PiperError(f"calibrate: a rank exited ({e})") from None
        finally:
            for p in pc.processes:
                if p.is_alive():
                    p.terminate()
        drain(False)
    if len(per_rank) != ranks:
        raise PiperError(f"calibrate: results from {len(per_rank)} of {ranks} ranks")
    return _merge(per_rank)
