"""Per-step metrics: gathered from every rank to rank 0, written as JSONL, shown live.

FLOP convention (brief §9): model FLOPs = ModelSpec.flops_per_token(seq) (forward +
backward, causal attention counted as half, no recompute) × tokens; TFLOPS are per GPU
(rank); MFU is that over plan.hardware.accelerator.peak_tflops[plan.layout.dtype].
Stage forward/backward times are host wall time inside each chunk; under zbv/dualpipev
the backward figure is the input-gradient pass only (the deferred weight-gradient pass
is not bracketed). All-to-all time is the count exchange and the row exchanges, forward and
backward, per rank, as the plan prices it. Migration's per-step work (the load all-reduce,
re-planning and expert transfers, after the optimizer) is part of the measured step, as the
plan's step time holds its migration share.

Closed loop (issue 8): the end summary sets the measured step time and all-to-all time per
step (slowest rank; medians over the second half of the steps, finish()) and peak resident
memory per rank (ru_maxrss, GiB: the whole process — interpreter, torch, buffers — against
the plan's peak_memory_gib, which also counts hardware.memory_overhead_gib) beside
plan.predicted, with measured/predicted ratios. `saved_tensor_bytes` counts what a forward saves for backward."""
from __future__ import annotations

import errno
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from piper_plan.errors import PiperError
from piper_plan.plan import Plan

from .model import Chunk


def _read_back(tensors: list[torch.Tensor]) -> list[list[float]]:
    """Each tensor's values as a flat list, all in one device-to-host copy (each .tolist() or
    float() of a GPU tensor is a synchronisation of its own). float64 holds the int64 counts
    exactly up to 2^53."""
    if not tensors:
        return []
    dev = tensors[0].device
    flat = torch.cat([t.detach().reshape(-1).to(dev, torch.float64) for t in tensors]).tolist()
    out, at = [], 0
    for t in tensors:
        out.append(flat[at:at + t.numel()])
        at += t.numel()
    return out


def rank_stats(groups, chunks: dict[int, Chunk], losses: list[torch.Tensor], step_s: float,
               grad_norm: float, phases: Optional[dict] = None) -> dict:
    """What this rank contributes to one step's record (small, picklable)."""
    layers = [(layer, m) for c in chunks.values() for layer, m in c.moe_layers().items()]
    stats = [t for _, m in layers for t in (m.dispatcher.tokens_per_slot, m.dispatcher.tokens_per_expert, m.aux_total)]
    values = _read_back(stats + list(losses))
    moe, a2a, aux, exchange = {}, 0.0, 0.0, None
    for i, (layer, m) in enumerate(layers):
        d = m.dispatcher
        slot, routed, total = values[3 * i: 3 * i + 3]
        exchange = type(d.exchange).__name__ if d.exchange is not None else None
        moe[layer] = dict(experts=d.placement.local_experts(d.ep_rank),
                          slot_tokens=[int(v) for v in slot], routed=[int(v) for v in routed])
        a2a += d.a2a.fwd_s + d.a2a.bwd_s
        aux += total[0]
    losses = [v[0] for v in values[3 * len(layers):]]
    return dict(rank=groups.rank, pp=groups.pp_rank, dp=groups.dp_rank, ep=groups.ep_rank, edp=groups.edp_rank,
                losses=losses, step_s=step_s, grad_norm=grad_norm, a2a_s=a2a, aux=aux,
                exchange=exchange,
                phases=phases or {},
                peak_rss_gib=peak_rss_gib(), peak_device_gib=peak_device_gib(chunks),
                chunks={c: (m.times.fwd_s, m.times.bwd_s) for c, m in chunks.items()}, moe=moe)


def reset(chunks: dict[int, Chunk]) -> None:
    for c in chunks.values():
        c.times.reset()
        for m in c.moe_layers().values():
            m.dispatcher.reset_stats()
            m.aux_total = torch.zeros((), device=m.aux_total.device)  # where the layer adds to it: no copy


def summarise(plan: Plan, step: int, per_rank: list[dict]) -> dict:
    """One JSONL record from all ranks' stats."""
    lay, spec = plan.layout, plan.model
    last = [r for r in per_rank if r["losses"]]
    loss = statistics.fmean(statistics.fmean(r["losses"]) for r in last) if last else float("nan")
    step_s = max(r["step_s"] for r in per_rank)
    tokens = lay.global_batch * lay.seq
    tflops = spec.flops_per_token(lay.seq) * tokens / step_s / lay.gpus / 1e12
    peak = plan.hardware.accelerator.peak_tflops.get(lay.dtype)
    stage_fwd, stage_bwd = {}, {}
    for r in per_rank:
        if r["dp"] == 0:
            for c, (f, b) in r["chunks"].items():
                stage_fwd[str(c)], stage_bwd[str(c)] = f, b
    tpe: dict[str, list[int]] = {}
    loads: dict[str, dict[str, list[int]]] = {}
    for r in per_rank:
        for layer, m in r["moe"].items():
            acc = tpe.setdefault(str(layer), [0] * len(m["routed"]))
            for e, n in enumerate(m["routed"]):
                acc[e] += n
            grp = f"pp{r['pp']}.edp{r['edp']}"
            loads.setdefault(str(layer), {}).setdefault(grp, [0] * lay.ep)[r["ep"]] = sum(m["slot_tokens"])
    balance = {}
    for layer, groups in loads.items():
        balance[layer] = {g: (max(v) / statistics.fmean(v) if sum(v) else 1.0) for g, v in groups.items()}
    return dict(step=step, loss=loss, step_time_s=step_s, tokens_per_s=tokens / step_s,
                model_tflops_per_gpu=tflops, mfu=(tflops / peak if peak else None),
                grad_norm=per_rank[0]["grad_norm"],
                # each rank's layers sum their micro-batches' balance loss (tp rank 0 alone): the
                # mean micro-batch's, over every data-parallel replica
                aux_loss=sum(r["aux"] for r in per_rank) / (lay.dp * lay.microbatches),
                a2a_time_s=max(r["a2a_s"] for r in per_rank),
                # the all-to-all the ranks ran (FlatExchange, HaloExchange; None without experts)
                a2a_exchange=sorted({str(r.get("exchange")) for r in per_rank if r.get("exchange")}) or None,
                phase_s=max(per_rank, key=lambda r: r["step_s"])["phases"],  # the slowest rank's
                cpu_s_all_ranks=sum(v for r in per_rank for k, v in r["phases"].items() if k.endswith("_cpu")),
                peak_rss_gib=max(r.get("peak_rss_gib", 0.0) for r in per_rank),
                peak_device_gib=max((r["peak_device_gib"] for r in per_rank if r.get("peak_device_gib") is not None),
                                    default=None),
                stage_fwd_s=stage_fwd, stage_bwd_s=stage_bwd,
                tokens_per_expert=tpe, ep_rank_tokens=loads, ep_max_over_mean=balance)


def migration_line(ev: dict) -> str:
    """One console line for an expert migration event (runtime/migrate.Migrator.after_step)."""
    if not ev.get("ok"):
        return f"step {ev['step'] + 1}: expert migration failed, placement unchanged ({ev.get('error')})"
    moved = sum(ev["moved"].values())
    loads = ", ".join(f"L{k} {a:.2f}->{b:.2f}" for k, (a, b) in ev.get("max_over_mean", {}).items())
    return (f"step {ev['step'] + 1}: migrated {moved} expert{'s' * (moved != 1)} in {len(ev['layers'])} layer"
            f"{'s' * (len(ev['layers']) != 1)} ({ev['trigger']}, {ev['seconds'] * 1e3:.1f} ms); "
            f"EP max/mean {loads}")


def merge_migrations(events: list[dict]) -> Optional[dict]:
    """One record of the migrations the pipeline's stages ran after a step, each on its own
    layers (runtime/migrate.Migrator.after_step): their layers, moves and loads together, ok only
    if every stage's committed, the slowest stage's seconds; None where none ran."""
    if len(events) <= 1:
        return events[0] if events else None
    errors = [e["error"] for e in events if e.get("error")]
    checksums = [e.get("checksum") for e in events]
    return dict(ok=all(e["ok"] for e in events), error="; ".join(errors) or None, step=events[0]["step"],
                trigger="period" if any(e["trigger"] == "period" for e in events) else "threshold",
                seconds=max(e["seconds"] for e in events), plan_s=max(e.get("plan_s", 0.0) for e in events),
                layers=sorted(k for e in events for k in e["layers"]),
                moved={k: v for e in events for k, v in e["moved"].items()},
                max_over_mean={k: v for e in events for k, v in e.get("max_over_mean", {}).items()},
                bytes_sent=sum(e.get("bytes_sent", 0) for e in events),
                checksum=",".join(checksums) if all(checksums) else None)


class Reporter:
    """Rank 0: append records to JSONL, show a rich live table, print the end summary."""

    def __init__(self, plan: Plan, path: Optional[str], log_every: int = 1):
        self.plan, self.log_every = plan, log_every  # 0: no console output at all
        self.rank0 = dist.get_rank() == 0
        self.path = Path(path) if path else None
        self.records: list[dict] = []
        self.live = None
        if self.rank0:
            from rich.console import Console
            self.console = Console(soft_wrap=True, markup=False)  # one record per line, never wrapped
            if self.path:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fh = open_records(self.path)
            if self.console.is_terminal and log_every > 0:
                from rich.live import Live
                self.live = Live(console=self.console, refresh_per_second=4)
                self.live.start()

    def _write(self, line: str) -> None:
        """Append one record whole or not at all (a full disk, a file-size limit: the run's one-line
        error, not a trace). Part of a record left behind would glue the next run's first record
        to it, and readers (`piper-plan search --routing`) refuse the file at that line."""
        fd, data = self._fh.fileno(), memoryview(line.encode())
        start = os.fstat(fd).st_size  # where an appended record lands
        try:
            while data:
                n = self._fh.write(data)  # unbuffered: a write may take part of it
                if not n:
                    raise OSError(errno.EIO, "the file took none of a record")
                data = data[n:]
        except OSError as e:
            try:
                os.ftruncate(fd, start)
            except OSError:
                pass
            raise PiperError(f"{self.path}: --metrics: cannot write a record ({e.strerror or e})") from None

    def step(self, step: int, stats: dict) -> Optional[dict]:
        """Collective: gather every rank's stats; rank 0 records them, with the expert migrations
        the stages ran after the step (runtime/migrate.py; stats["migration"], one rank a stage),
        where any ran."""
        out: Optional[list] = [None] * dist.get_world_size() if self.rank0 else None
        dist.gather_object(stats, out, dst=0)
        if not self.rank0:
            return None
        events = [ev for r in out if (ev := r.pop("migration", None)) is not None]
        rec = summarise(self.plan, step, out)
        if events:
            rec["migration"] = merge_migrations(events)
            if self.log_every > 0:  # a run's only sign that experts moved, beside the load figures
                for ev in events:  # a line a stage: one's failure leaves another's moves standing
                    self.console.print(migration_line(ev), highlight=False)
        self.records.append(rec)
        if self.path:
            self._write(json.dumps(rec) + "\n")
        if self.log_every > 0 and (step + 1) % self.log_every == 0:
            self._show(rec)
        return rec

    def _show(self, rec: dict) -> None:
        if self.live is not None:
            from rich.table import Table
            t = Table(title=f"piper-train  {self.plan.model.name}  step {rec['step'] + 1}")
            for k in ("loss", "step_time_s", "tokens_per_s", "model_tflops_per_gpu", "mfu", "a2a_time_s", "grad_norm"):
                v = rec[k]
                t.add_row(k, "-" if v is None else f"{v:.4g}")
            for layer, g in rec["ep_max_over_mean"].items():
                t.add_row(f"EP max/mean L{layer}", " ".join(f"{v:.2f}" for v in g.values()))
            self.live.update(t)
        else:
            mfu = "-" if rec["mfu"] is None else f"{100 * rec['mfu']:.2f}%"
            self.console.print(f"step {rec['step'] + 1:>5}  loss {rec['loss']:.4f}  {rec['step_time_s'] * 1e3:8.1f} ms  "
                               f"{rec['tokens_per_s']:9.0f} tok/s  MFU {mfu}  a2a {rec['a2a_time_s'] * 1e3:.1f} ms",
                               highlight=False)

    def finish(self) -> Optional[dict]:
        """Measured step time vs the plan's steady-state prediction: the median over the second
        half of the steps (never the first step, when there are more): the first steps build
        kernels for new GEMM shapes (a CPU's bf16 library: ~1 ms a shape, benchmarks/
        closed_loop.py) and a shared machine's spikes would move a mean."""
        if not self.rank0:
            return None
        if self.live is not None:
            self.live.stop()
        times = [r["step_time_s"] for r in self.records]
        if not times:
            return None
        first = max(1, len(times) // 2) if len(times) > 1 else 0
        use = self.records[first:]
        meas = statistics.median(r["step_time_s"] for r in use)
        a2a = statistics.median(r["a2a_time_s"] for r in use)
        rss = max(r.get("peak_rss_gib", 0.0) for r in self.records)
        dev_peaks = [r["peak_device_gib"] for r in self.records if r.get("peak_device_gib") is not None]
        device_gib = max(dev_peaks) if dev_peaks else None  # on a GPU its memory, not the host's, is planned
        mem = device_gib if device_gib is not None else rss
        # every MoE layer's EP groups, every step; none to compare at ep 1, where max/mean is 1 by definition
        loads = [v for r in use for g in r["ep_max_over_mean"].values() for v in g.values()]
        load = statistics.median(loads) if loads and self.plan.layout.ep > 1 else None
        # migration runs every few steps: its mean a step over the measured steps, as the plan amortises it
        migrating = self.plan.migration.enabled and self.plan.layout.ep > 1
        mig = statistics.fmean(r["phase_s"].get("migration", 0.0) for r in use) if migrating else None
        p = self.plan.predicted
        pred = p.step_time_s if p else None
        p_a2a = p.a2a_time_s if p else None
        p_mem = p.peak_memory_gib if p else None
        ratio = lambda a, b: (a / b if b else None)  # noqa: E731
        p_mig = p.time_breakdown_s.get("migration") if p and migrating else None
        summary = dict(summary=True, model=self.plan.model.name, model_hash=self.plan.model_hash,
                       hardware=self.plan.hardware.name, hardware_hash=self.plan.hardware_hash,
                       steps=len(times), measured_steps=[use[0]["step"] + 1, use[-1]["step"] + 1],
                       measured_step_time_s=meas, predicted_step_time_s=pred,
                       measured_over_predicted=ratio(meas, pred),
                       measured_a2a_time_s=a2a, predicted_a2a_time_s=p_a2a, a2a_measured_over_predicted=ratio(a2a, p_a2a),
                       measured_peak_rss_gib=rss, measured_peak_device_gib=device_gib, predicted_peak_memory_gib=p_mem,
                       memory_measured_over_predicted=ratio(mem, p_mem),
                       measured_ep_max_over_mean=load,
                       predicted_ep_max_over_mean=p.ep_load_step if p and load is not None else None,
                       measured_migration_s_per_step=mig, predicted_migration_s_per_step=p_mig,
                       migration_measured_over_predicted=ratio(mig, p_mig) if mig is not None else None)
        if self.path:
            self._write(json.dumps(summary) + "\n")
            self._fh.close()
        if self.log_every <= 0:
            pass
        elif pred:
            a, b = summary["measured_steps"]  # 1-based step numbers of the run (a resumed run's start past 1)
            # one step run: the only one measured is the launch's first, which carries its start-up
            warm = "; it is this launch's first, start-up included: 3 steps or more measure past it" * (len(times) == 1)
            self.console.print(f"step time: measured {meas * 1e3:.1f} ms (median of steps {a}-{b}{warm}), "
                               f"predicted {pred * 1e3:.1f} ms, "
                               f"ratio {meas / pred:.2f}", highlight=False)
            r_a2a = "-" if summary["a2a_measured_over_predicted"] is None else f"{summary['a2a_measured_over_predicted']:.2f}"
            self.console.print(f"all-to-all: measured {a2a * 1e3:.1f} ms/step, predicted {(p_a2a or 0) * 1e3:.1f} ms, "
                               f"ratio {r_a2a}", highlight=False)
            what = ("peak device memory {:.3f} GiB per rank (the caching allocator's, max_memory_reserved)"
                    .format(device_gib) if device_gib is not None else f"peak RSS {rss:.3f} GiB per rank (whole process)")
            r_mem = summary["memory_measured_over_predicted"]
            fixed = self.plan.hardware.memory_overhead_gib
            self.console.print(f"memory: {what}, predicted peak {p_mem:.3f} GiB ({p_mem - fixed:.3f} modelled, "
                               f"{fixed:g} the spec's fixed memory_overhead_gib), "
                               f"ratio {'-' if r_mem is None else f'{r_mem:.2f}'}", highlight=False)
            if mig is not None:
                r_mig = summary["migration_measured_over_predicted"]
                self.console.print(f"migration: measured {mig * 1e3:.2f} ms/step (mean of steps {a}-{b}: load "
                                   f"all-reduce, re-planning, transfers), predicted {(p_mig or 0) * 1e3:.2f} ms, "
                                   f"ratio {'-' if r_mig is None else f'{r_mig:.2f}'}", highlight=False)
            if load is not None:
                planned = ("the plan records none" if p.ep_load_step is None
                           else f"predicted {p.ep_load_step:.3f} for {_routing_words(self.plan)}")
                self.console.print(f"EP load: measured max/mean {load:.3f} (median over MoE layers and steps), "
                                   f"{planned}", highlight=False)
                hint = routing_hint(self.plan, load, self.path)
                if hint:
                    self.console.print(hint, highlight=False)
            hint = machine_hint(self.plan, meas / pred)
            if hint:
                self.console.print(hint, highlight=False)
        else:
            self.console.print(f"step time: measured {meas * 1e3:.1f} ms; the plan has no prediction "
                               f"(plan.predicted is empty)", highlight=False)
        return summary


def open_records(path: Path):
    """`path` opened to append JSONL records (unbuffered, binary), its end made a record's first:
    a last line without its newline is a record a killed or failed run was writing when it
    stopped. It is dropped where it starts as a record does but does not parse (it was never a
    whole record, and a reader would stop at it) and ended with its newline otherwise (a record
    only missing that, or text that is no record of ours: `--metrics /dev/stdout >> log`)."""
    try:
        fh = open(path, "ab", buffering=0)
        size = os.fstat(fh.fileno()).st_size
        if size:
            with open(path, "rb") as f:
                at, tail = size, b""
                while at > 0 and b"\n" not in tail:  # back to the last newline, a block at a time
                    step = min(at, 1 << 16)
                    at -= step
                    f.seek(at)
                    tail = f.read(step) + tail
            if not tail.endswith(b"\n"):
                cut = tail.rfind(b"\n") + 1
                try:
                    json.loads(tail[cut:])
                    whole = True
                except (ValueError, RecursionError):
                    whole = False
                if whole or not tail[cut:].lstrip().startswith(b"{"):
                    fh.write(b"\n")
                else:
                    os.ftruncate(fh.fileno(), at + cut)
        return fh
    except OSError as e:
        raise PiperError(f"{path}: --metrics: cannot append to it ({e.strerror or e})") from None


def _routing_words(plan: Plan) -> str:
    r = plan.routing
    words = {"uniform": "uniform routing", "zipf": f"Zipf routing (s={r.zipf_s:g})",
             "histogram": "the measured routing it was planned with"}[r.distribution]
    return words + (f" with {plan.migration.planner} migration" if plan.migration.enabled else "")


def routing_hint(plan: Plan, measured: float, metrics: Optional[Path], tolerance: float = 0.05) -> Optional[str]:
    """What to run when the EP groups were measured more unevenly loaded than the plan assumed:
    plan again with this run's per-expert loads (`--routing` reads a piper-train metrics file)."""
    p = plan.predicted
    if p is None or p.ep_load_step is None or measured <= p.ep_load_step * (1 + tolerance):
        return None
    src = str(metrics) if metrics else "metrics.jsonl (piper-train --metrics)"
    return (f"the EP groups ran {measured / p.ep_load_step - 1:.0%} more unevenly than planned: "
            f"`piper-plan search ... --routing {src}` prices this run's per-expert loads")


def machine_hint(plan: Plan, ratio: float, tolerance: float = 1.5) -> Optional[str]:
    """What to run when measured/predicted step time is off by more than `tolerance`: a spec
    that `piper-plan calibrate` measured can be checked against this machine (the usual cause
    is another host: a CPU without bf16 instructions runs bf16 GEMMs tens of times slower)."""
    if 1 / tolerance <= ratio <= tolerance:
        return None
    hw = plan.hardware
    if "piper-plan calibrate" in hw.source:
        return (f"the plan was priced with {hw.name}, measured on a machine by `piper-plan calibrate`: "
                f"`piper-plan calibrate --check {hw.name}` (or the spec's path) tells whether this is that machine")
    return (f"the plan was priced with {hw.name}'s efficiencies; on this machine `piper-plan calibrate --quick -o "
            "my.yaml` measures its own")


class PhaseClock:
    """Wall and this process's CPU seconds per named phase of a step. On CUDA the wall times
    of phases are host-side (only the step total is synchronised by the caller). CPU seconds
    matter where ranks share cores: a waiting rank costs none, so the step is bounded by
    the ranks' summed CPU over the cores."""

    def __init__(self):
        self._t0 = self._t = time.perf_counter()
        self._c = time.process_time()
        self.phases: dict[str, float] = {}

    def mark(self, name: str) -> None:
        t, c = time.perf_counter(), time.process_time()
        self.phases[name] = t - self._t
        self.phases[f"{name}_cpu"] = c - self._c
        self._t, self._c = t, c

    @property
    def total_s(self) -> float:
        return self._t - self._t0


def peak_device_gib(chunks: dict[int, Chunk]) -> Optional[float]:
    """Peak GPU memory the caching allocator held for this rank's device, GiB (what the plan's
    per-rank memory is compared with on a GPU); None off CUDA."""
    dev = next((p.device for c in chunks.values() for p in c.parameters()), None)
    if dev is None or dev.type != "cuda":
        return None
    return torch.cuda.max_memory_reserved(dev) / 2**30


def peak_rss_gib() -> float:
    """Peak resident set size of this process, GiB (ru_maxrss: KiB on Linux, bytes on macOS)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / (2**30 if sys.platform == "darwin" else 2**20)


def saved_tensor_bytes(fn, exclude: list[torch.Tensor] = ()) -> tuple[object, int, list[tuple]]:
    """Run fn() recording every tensor autograd saves for backward (saved_tensors_hooks).
    Bytes count each storage once (views and repeated saves share one), leaving out the
    storages of `exclude` (parameters, buffers: state, not activations). Returns (fn's
    result, bytes, [(shape, dtype, storage bytes, creator)] of the counted storages)."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, tuple] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in skip and st.data_ptr() not in seen:
            seen[st.data_ptr()] = (tuple(t.shape), str(t.dtype).replace("torch.", ""), st.nbytes(),
                                   type(t.grad_fn).__name__ if t.grad_fn is not None else "input")
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(v[2] for v in seen.values()), list(seen.values())
