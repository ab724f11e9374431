"""`piper-plan calibrate`: measure this machine and write a fitted hardware YAML.

Runs the micro-benchmarks of calibrate_bench on N local ranks at once, fits the hardware
model (calibrate_fit) and writes a HardwareSpec YAML. With -o PATH the measurements, the fit
and its residuals go to PATH's sibling `<stem>.calibration.json`, which the YAML's `source`
strings name (the schema is strict, so the YAML itself carries only summary figures).
torch is imported lazily: importing this module (and so `piper_plan.cli`) does not load it.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import click
import yaml

from .calibrate_bench import (CPU_EXPERT_ROW_MULTIPLE, OPT_TENSORS, BenchPlan, make_plan, pipeline_probes,
                              run_benchmarks)
from .calibrate_fit import (best_rates, fit_attention_bwd, fit_cast, fit_collective_overhead, fit_collective_skew,
                            fit_comm, fit_compute, fit_layer_overhead, fit_optimizer_tensor, fit_pipeline_chunk,
                            fit_stream_cache, proposals, rated_spec, split_comm, split_compute)
from .clitypes import FiniteFloat
from .errors import PiperError, SpecError
from .files import atomic_write_bytes, atomic_write_text, check_outputs
from .specs.hardware import HardwareSpec
from .specs.registry import _resolve, device_tokens, hardware_by_device, load_hardware, parse

CPU_TILES = [(16, 16), (32, 32), (64, 64), (128, 128)]
GPU_TILES = [(64, 64), (128, 64), (128, 128), (128, 256), (256, 128)]
OS_RESERVE_GIB = 4.0  # left to the OS and page cache before the rest is split among ranks


# ---- the machine ----------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def ram_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def match_bundled(device_name: str) -> str | None:
    """The bundled hardware spec whose accelerator shares the most model tokens with the device
    (the first by name where several do)."""
    best = hardware_by_device(device_name)
    return best[0] if best else None


# ---- the spec ---------------------------------------------------------------------------
def _pct(res: dict) -> str:
    return ", ".join(f"{f} {r['median_abs_pct']:.1f}/{r['max_abs_pct']:.1f}%" for f, r in res.items())


def _rescale_topology(d: dict, ranks: int) -> None:
    """Make the node `ranks` wide (CPU: one machine of N ranks); levels above keep their node
    multiples, levels inside keep only sizes dividing N."""
    g0 = d["gpus_per_node"]
    if g0 == ranks:
        return
    levels = []
    for lv in d["topology"]:
        if lv["size"] < g0:
            if ranks % lv["size"] == 0 and lv["size"] < ranks:
                levels.append(lv)
        elif lv["size"] == g0:
            levels.append({**lv, "size": ranks})
        else:
            levels.append({**lv, "size": lv["size"] // g0 * ranks})
            if lv.get("job_block"):  # the nodes a job fills of each domain, as many as before
                levels[-1]["job_block"] = lv["job_block"] // g0 * ranks
    d["topology"] = levels
    d["gpus_per_node"] = ranks
    if d.get("max_gpus"):
        d["max_gpus"] = max(ranks, d["max_gpus"] // g0 * ranks)
    if d["network"].get("nic_affinity") is not None:
        d["network"]["nic_affinity"] = None


def build_spec(base: HardwareSpec, *, name: str, ranks: int, device: dict, comp: dict, comp_res: dict,
               comm: dict | None, comm_res: dict | None, stamp: str, record: str, datasheet: bool) -> HardwareSpec:
    """The fitted HardwareSpec (validated). comp/comm: split_compute / split_comm output."""
    d = base.model_dump(mode="json")
    d["name"] = name
    d["source"] = (f"measured by `piper-plan calibrate` {stamp} on {device['name']} with {ranks} local rank(s) "
                   f"(torch {device['torch']}); {record}; fields not measured come from hardware spec '{base.name}'")
    acc = d["accelerator"]
    peaks = comp["peak_tflops"]
    acc.update(peak_tflops=peaks, memory_bandwidth_gbps=round(comp["memory_bandwidth_gbps"], 4))
    if datasheet:
        raised = " (raised where a measurement exceeded them)" if peaks != base.accelerator.peak_tflops else ""
        acc["source"] = acc.get("source", "") + f"; calibrate {stamp}: datasheet peaks kept{raised}"
    else:
        acc.update(name=device["accelerator_name"], memory_gib=round(device["memory_gib"], 2),
                   compute_units=device["compute_units"])
        acc["source"] = (f"calibrate {stamp}: one accelerator = one rank of {ranks} running at once, each one "
                         f"thread, sharing {device['cores']} cores — so every rate is per rank under full load. "
                         "peak_tflops: highest measured GEMM rate per dtype, scaled so peak·gemm = the fitted "
                         "plateau; memory_bandwidth_gbps: highest per-rank c=a+b streaming rate; memory_gib: "
                         f"(RAM {device['ram_gib']:.1f} GiB − {OS_RESERVE_GIB:g} GiB OS) / {ranks}")
        if "baseline_rss_gib" in device:  # what piper-train's memory report compares with its RSS
            d["memory_overhead_gib"] = round(device["baseline_rss_gib"], 3)
            acc["source"] += ("; memory_overhead_gib: a rank's resident memory (ru_maxrss, largest rank) once it "
                              "has joined the gloo group and imported piper_runtime, before any probe")
    eff = d["efficiency"]
    eff.update(gemm=round(comp["gemm"], 4), gemm_tile=comp["gemm_tile"], memory=round(comp["memory"], 4),
               kernel_overhead_us=round(comp["kernel_overhead_us"], 3),
               gemm_overhead_us={k: round(v, 3) for k, v in comp.get("gemm_overhead_us", {}).items()},
               layer_overhead_us=dict(comp.get("layer_overhead_us", {})),
               optimizer_tensor_us=dict(comp.get("optimizer_tensor_us", {})),
               pipeline_chunk_us={},  # measured against this spec's own prediction: with_pipeline_chunk
               collective_overhead_us=round(comp.get("collective_overhead_us", 0.0), 2),
               collective_step_us=round(comp.get("collective_step_us", 0.0), 2),
               collective_skew_us=round(comp.get("collective_skew_us", 0.0), 2),
               collective_skew_base_ms=round(comp.get("collective_skew_base_ms", 0.0), 3))
    d["collectives"] = "nccl" if device["kind"] == "cuda" else "gloo"  # what the probes and piper-train run on
    if device["kind"] == "cpu":  # what this run's ranks had, not the base spec's: ranks_per_core 1 when each had a core
        acc["ranks_per_core"] = round(max(1.0, ranks / device["cores"]), 4)
    if device["kind"] == "cpu":
        acc["expert_row_multiple"] = CPU_EXPERT_ROW_MULTIPLE
    if "attention" in comp:
        eff["attention"] = round(comp["attention"], 4)
        # the probes fit one rate at their lengths (flash_attention_time): the base's block costs,
        # measured on another kernel, would re-price the fitted plateau at every other length
        eff["attention_blocks"] = None
    if "cache_mib" in comp:
        acc["cache_mib"] = float(f"{comp['cache_mib']:.4g}")  # significant figures: a small cache is not 0
        eff["memory_dram"] = round(comp["memory_dram"], 4)
    else:  # no knee fitted (too few sizes, no drop): one rate, not the base's knee beside this run's rate
        acc["cache_mib"] = None
        eff["memory_dram"] = None
    if "cast" in comp:
        eff["cast"] = round(comp["cast"], 4)
    if "attention_bwd" in comp:
        eff["attention_bwd"] = round(comp["attention_bwd"], 4)
        eff["attention_bwd_row_us"] = round(comp["attention_bwd_row_us"], 4)
    clip = "; attention rate exceeded the bf16 peak, clipped to 1" if comp.get("attention_clipped") else ""
    eff["source"] = (f"fitted {stamp} by scipy least_squares on log time against piper_plan.cost.kernels "
                     f"(gemm_time, stream_time, flash_attention_time; causal SDPA forward counted as "
                     f"2·b·h·s²·d FLOPs; its backward timed alone and fitted by scipy nnls to "
                     f"flash_attention_bwd_time: 2.5× those FLOPs at attention_bwd plus attention_bwd_row_us per "
                     f"query row and head; streams: memory up to accelerator.cache_mib of working set, "
                     f"memory_dram beyond it, fitted by scipy least_squares to the stream points with the cache rate "
                     f"the highest measured); model error median/max: {_pct(comp_res)}{clip}"
                     " (grouped_*: grouped GEMMs, held out of the fit); gemm_overhead_us: per-dtype extra fixed "
                     "cost per GEMM call, fitted jointly; layer_overhead_us: a piper-train dense / MoE block "
                     "(d 32, 64 tokens, a fresh input each call so expert GEMM shapes vary as in training) forward+backward "
                     "under full load minus the kernel model's price of it; "
                     "cast: fp32->bf16 and bf16->fp32 copies into fresh tensors, cycling six sources, "
                     "against the stream model for the same bytes (median ratio); "
                     "optimizer_tensor_us: piper-train's eager optimizer functions (piper_runtime.optim) over "
                     f"{OPT_TENSORS} small tensors under full load, less the stream model's price of their bytes, "
                     "per tensor; "
                     "collective_overhead_us: median added time per small p2p / all-to-all call between GEMM "
                     "bursts on every rank, minus the α-β time of the call; collective_step_us: the same for "
                     "small all-reduces, less that floor, per ring step (2(n−1) a call); collective_skew_us: "
                     "the same all-to-all over every rank after bursts 16-64× longer, least squares of the added "
                     "time on √(burst ms) through the short burst (collective_skew_base_ms)")
    if comm is not None:
        eff["comm"] = round(comm["comm"], 4)
        eff["source"] += f"; comm from the α-β fit of the node level ({_pct(comm_res)})"
    if not datasheet:
        _rescale_topology(d, ranks)
    if comm is not None:
        j = [lv["size"] for lv in d["topology"]].index(d["gpus_per_node"])
        backend = "NCCL" if device["kind"] == "cuda" else "gloo"
        for own in ("comm", "a2a_comm"):  # the base's own fractions for the level would outrank the fit
            d["topology"][j].pop(own, None)
        d["topology"][j].update(
            bandwidth_gbps=round(comm["bandwidth_gbps"], 4), latency_us=round(comm["latency_us"], 3),
            source=(f"calibrate {stamp}: α-β fit over {backend} p2p (ring shift), ring all-reduce and all-to-all, "
                    f"groups of n | {ranks} ranks, all groups at once; bandwidth = highest per-rank rate measured, "
                    f"comm = fitted/that; message model t = steps·(α + B/n/(bw·comm))"))
    return parse(HardwareSpec, d, f"calibrated spec {name}")


def with_pipeline_chunk(spec: HardwareSpec, chunk_us: dict[str, float], stamp: str) -> HardwareSpec:
    """`spec` with efficiency.pipeline_chunk_us set and its source saying how it was measured."""
    from .calibrate_bench import PIPE_MICROBATCHES

    src = spec.efficiency.source + (
        f"; pipeline_chunk_us: piper-train on a 4-layer model of the probe blocks, pp 2 on every pair of ranks, "
        f"{PIPE_MICROBATCHES} micro-batches, under 1f1b (a chunk of 2 layers a rank) and each multi-chunk schedule "
        f"(2 chunks of 1 layer): (measured − predicted step difference from 1f1b) per extra chunk and micro-batch, "
        f"{stamp}")
    return spec.model_copy(update={"efficiency": spec.efficiency.model_copy(update={
        "pipeline_chunk_us": chunk_us, "source": src})})


def kept_from_base(spec: HardwareSpec, base: HardwareSpec, ranks: int, no_pipeline: bool,
                   warn: bool = True) -> HardwareSpec:
    """What this run could not measure, kept from the base spec and said (in the source, and as a
    warning): one rank runs no collective (collective_*), and the pipeline probe needs pp 2 on
    pairs of ranks (pipeline_chunk_us, under an odd rank count; a CUDA run has no probe). An empty
    or zero field would price those costs at nothing."""
    keep, why = {}, []
    if ranks < 2:
        keep.update({k: getattr(base.efficiency, k) for k in ("collective_overhead_us", "collective_step_us",
                                                               "collective_skew_us", "collective_skew_base_ms")})
        why.append("collective_*: not measured (one rank runs no collective)")
    if no_pipeline and base.efficiency.pipeline_chunk_us:
        keep["pipeline_chunk_us"] = dict(base.efficiency.pipeline_chunk_us)
        why.append("pipeline_chunk_us: not measured (" + (f"its probe runs pp 2 on pairs of ranks; --ranks {ranks} "
                   "is not even)" if ranks % 2 else "no pipeline probe on this device)"))
    if not keep:
        return spec
    said = "; ".join(why) + f": kept from the base spec '{base.name}'"
    if warn:
        click.echo(f"warning: calibrate: {said}", err=True)
    return spec.model_copy(update={"efficiency": spec.efficiency.model_copy(update={
        **keep, "source": spec.efficiency.source + "; " + said})})


def to_yaml(spec: HardwareSpec, header: list[str]) -> str:
    body = yaml.safe_dump(spec.model_dump(mode="json", exclude_defaults=False), sort_keys=False,
                          allow_unicode=True, width=120)
    return "".join(f"# {h}\n" for h in header) + body


# ---- the command -------------------------------------------------------------------------
def _device(choice: str) -> dict:
    import torch

    cuda = torch.cuda.is_available()
    if choice == "cuda" and not cuda:
        raise PiperError("calibrate: --device cuda: no CUDA device is available")
    kind = "cuda" if (choice == "cuda" or (choice == "auto" and cuda)) else "cpu"
    info = {"kind": kind, "torch": torch.__version__, "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1), "ram_gib": ram_gib()}
    if kind == "cuda":
        p = torch.cuda.get_device_properties(0)
        info.update(name=p.name, accelerator_name=p.name, memory_gib=p.total_memory / 2**30,
                    compute_units=p.multi_processor_count, count=torch.cuda.device_count())
    else:
        # the vector ISA decides whether bf16 GEMMs run natively (calibrate --check prints it)
        info.update(name=cpu_model(), compute_units=1, count=None,
                    cpu_capability=torch.backends.cpu.get_cpu_capability())
    return info


def _progress():
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(SpinnerColumn(), TextColumn("{task.description:<34}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=Console(stderr=True, markup=False), transient=False)


def _summary(spec: HardwareSpec, residuals: dict, wall: float) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"calibrated {spec.name} in {wall:.0f} s")
    t.add_column("family")
    t.add_column("points", justify="right")
    t.add_column("median |err| %", justify="right")
    t.add_column("max |err| %", justify="right")
    for f, r in residuals.items():
        t.add_row(f, str(r["points"]), f"{r['median_abs_pct']:.1f}", f"{r['max_abs_pct']:.1f}")
    c = Console(stderr=True, markup=False)
    c.print(t)
    a, e, lv = spec.accelerator, spec.efficiency, spec.topology[spec.node_level]
    c.print(f"peak_tflops {a.peak_tflops}  gemm {e.gemm}  tile {list(e.gemm_tile)}  memory_bw "
            f"{a.memory_bandwidth_gbps} GB/s × {e.memory}  overhead {e.kernel_overhead_us} us  attention "
            f"{e.attention}  node link {lv.bandwidth_gbps} GB/s × comm {e.comm}, latency {lv.latency_us} us")


def calibrate(*, output: str | None, base: str | None, ranks: int | None, device: str, kind: str,
              name: str | None, timeout: float, plan: BenchPlan | None = None, show_progress: bool = True) -> dict:
    """Measure, fit, write. Returns {'spec', 'yaml', 'record', 'wall_s'}; raises PiperError."""
    t0 = time.monotonic()
    hw = load_hardware(base) if base else None  # a bad --base fails before torch loads
    dev = _device(device)
    dev["loadavg_before"] = os.getloadavg()
    if dev["kind"] == "cuda":
        ranks = ranks or dev["count"]
        if ranks > dev["count"]:
            raise PiperError(f"calibrate: --ranks {ranks}: only {dev['count']} CUDA device(s)")
        base = base or match_bundled(dev["name"]) or "cpu-local"
    else:
        ranks = ranks or 8
        base = base or "cpu-local"
        dev["accelerator_name"] = (f"CPU rank (1/{ranks} of a {dev['cores']}-core {dev['name']}, "
                                   f"{ranks} ranks per machine)")
        dev["memory_gib"] = max(0.1, (dev["ram_gib"] - OS_RESERVE_GIB) / ranks)
    hw = hw or load_hardware(base)
    # a CUDA device matched to a bundled data sheet keeps its peaks; a CPU rank has none
    datasheet = dev["kind"] == "cuda" and base != "cpu-local" and bool(device_tokens(dev["name"])
                                                                       & device_tokens(hw.accelerator.name))
    plan = plan or make_plan(kind, dev["kind"])
    if plan.pipeline_schedules and not plan.pipelines:
        plan.pipelines = pipeline_probes(hw, ranks, plan.pipeline_schedules)
    out = Path(output) if output else None
    if out:  # before minutes of measuring: a result that cannot be written would be lost
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SpecError(str(out), "-o", f"cannot create its folder ({e.strerror or e})") from None
        # (not over the --base spec it reads, nor the two onto one file: check_outputs)
        check_outputs([(out, "-o"), (out.with_name(out.stem + ".calibration.json"), "-o (its .calibration.json)")],
                      [(_resolve(base, "hardware"), "--base")])
    name = name or (out.stem if out else hw.name)

    total = plan.items(ranks)
    if show_progress:
        prog = _progress()
        with prog:
            task = prog.add_task(f"starting {ranks} rank(s)", total=total)
            meas = run_benchmarks(plan, ranks, dev["kind"], timeout_s=timeout,
                                  on_tick=lambda lbl: prog.update(task, advance=1, description=lbl))
            prog.update(task, description="fitting")
            fit = _fit(hw, meas, plan, dev, datasheet)
            prog.update(task, description="done")
    else:
        meas = run_benchmarks(plan, ranks, dev["kind"], timeout_s=timeout)
        fit = _fit(hw, meas, plan, dev, datasheet)

    if "baseline_rss_gib" in meas:  # a device fact, not a timing
        dev["baseline_rss_gib"] = meas.pop("baseline_rss_gib")
    dev["loadavg_after"] = os.getloadavg()
    stamp = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    rec_path = out.with_name(out.stem + ".calibration.json") if out else None
    record = (f"measurements, fit and residuals in {rec_path.name} beside this file" if rec_path
              else "measurements not saved (run with -o PATH to keep PATH's .calibration.json)")
    residuals = {**fit["compute"].residuals, **(fit["comm"].residuals if fit["comm"] else {})}
    spec = build_spec(hw, name=name, ranks=ranks, device=dev, comp=fit["comp"], comp_res=fit["compute"].residuals,
                      comm=fit["comm_split"], comm_res=fit["comm"].residuals if fit["comm"] else None,
                      stamp=stamp, record=record, datasheet=datasheet)
    if meas.get("pipelines"):  # what the model does not explain of a multi-chunk schedule's step
        chunk_us, fit["proposals"]["pipeline_chunk"] = fit_pipeline_chunk(spec, plan.pipelines, meas["pipelines"])
        spec = with_pipeline_chunk(spec, chunk_us, stamp)
    spec = kept_from_base(spec, hw, ranks, not meas.get("pipelines"), warn=show_progress)
    wall = time.monotonic() - t0
    header = [f"{name}: calibrated by `piper-plan calibrate{'' if kind == 'full' else ' --' + kind}` at {stamp} "
              f"in {wall:.0f} s ({ranks} rank(s), {dev['kind']}, base '{hw.name}')",
              "fit error |model/measured − 1| by family, median/max: " + _pct(residuals),
              f"1-min load average before the run: {dev['loadavg_before'][0]:.2f} on {dev['cores']} cores "
              "(other processes sharing the CPU lower and scatter the rates)"]
    text = to_yaml(spec, header)
    rec = {"timestamp": stamp, "wall_s": round(wall, 2), "argv": sys.argv, "ranks": ranks, "base": hw.name,
           "device": dev, "plan": asdict(plan), "measurements": meas, "residuals": residuals,
           "fit": {"compute_rates": asdict(fit["compute"].rates), "tile_costs": fit["compute"].tile_costs,
                   "comm": asdict(fit["comm"]) if fit["comm"] else None, "split": fit["comp"],
                   "comm_split": fit["comm_split"], "datasheet_mode": datasheet},
           "proposals": fit["proposals"],
           "spec": spec.model_dump(mode="json")}
    if out:  # (its folder was made before measuring)
        write_pair(rec_path, json.dumps(rec, indent=1), out, text)
        load_hardware(str(out))  # the file as written must load
    if show_progress:
        _summary(spec, residuals, wall)
        if dev["kind"] == "cpu" and dev["loadavg_before"][0] > 0.5 * dev["cores"]:
            click.echo(f"warning: load average {dev['loadavg_before'][0]:.1f} on {dev['cores']} cores before the "
                       "run: other processes shared the CPU, so the rates are low and noisy", err=True)
    return {"spec": spec, "yaml": text, "record": rec, "wall_s": wall}


def write_pair(rec_path, record: str, out, spec_text: str) -> None:
    """Write a spec and its calibration record as a pair: both atomic (a failed write leaves the
    old file whole); the record first, so a spec on disk never names measurements that were not
    written, and put back where the spec's write fails, so an old spec keeps its own record
    (--check repeats its probes)."""
    rec_path = Path(rec_path)
    old = rec_path.read_bytes() if rec_path.is_file() else None
    atomic_write_text(rec_path, record, "-o (its .calibration.json)")
    try:
        atomic_write_text(out, spec_text, "-o")
    except Exception:
        if old is None:
            rec_path.unlink(missing_ok=True)
        else:
            atomic_write_bytes(rec_path, old, "-o (its .calibration.json)")
        raise


def _fit(hw: HardwareSpec, meas: dict, plan: BenchPlan, dev: dict, datasheet: bool) -> dict:
    if not datasheet:  # wave quantisation must see the device's own unit count during the fit
        acc = hw.accelerator.model_copy(update={"compute_units": dev["compute_units"]})
        hw = hw.model_copy(update={"accelerator": acc})
    tiles = GPU_TILES if dev["kind"] == "cuda" else CPU_TILES
    comp_fit = fit_compute(hw, meas, tiles, plan.attn_dtype)
    ds = (hw.accelerator.peak_tflops, hw.accelerator.memory_bandwidth_gbps) if datasheet else None
    comp = split_compute(comp_fit.rates, best_rates(meas), ds, plan.attn_dtype)
    comm_fit = fit_comm(meas["comm"]) if meas.get("comm") else None
    rated = rated_spec(hw, comp_fit.rates, plan.attn_dtype)
    bwd, bwd_res = fit_attention_bwd(comp["peak_tflops"][plan.attn_dtype], comp["kernel_overhead_us"],
                                     meas.get("attention", []))
    comp.update(bwd)
    comp_fit.residuals.update(bwd_res)
    if bwd:  # the rated copy's peak is the raw GEMM rate: the same backward rate, rescaled
        peak = comp["peak_tflops"][plan.attn_dtype]
        raw = rated.peak_flops(plan.attn_dtype) / 1e12
        rated = rated.model_copy(update={"efficiency": rated.efficiency.model_copy(update={
            "attention_bwd": bwd["attention_bwd"] * peak / raw, "attention_bwd_row_us": bwd["attention_bwd_row_us"]})})
    cache, cache_res = (fit_stream_cache(meas.get("stream", []), comp["kernel_overhead_us"])
                        if dev["kind"] == "cpu" else ({}, {}))
    if cache:  # a CPU rank's cache share streams faster than DRAM: two rates, one knee
        hbm = max(comp["memory_bandwidth_gbps"], cache["cache_gbps"])
        comp.update(memory_bandwidth_gbps=hbm, memory=cache["cache_gbps"] / hbm,
                    memory_dram=cache["dram_gbps"] / hbm, cache_mib=cache["cache_mib"])
        comp_fit.residuals.update(cache_res)
        rated = rated.model_copy(update={
            "accelerator": rated.accelerator.model_copy(update={"memory_bandwidth_gbps": cache["cache_gbps"],
                                                                "cache_mib": cache["cache_mib"]}),
            "efficiency": rated.efficiency.model_copy(update={
                "memory": 1.0, "memory_dram": cache["dram_gbps"] / cache["cache_gbps"]})})
    cast, cast_res = fit_cast(rated, meas.get("casts", []))
    if cast:  # the blocks' price below must see the casts at their measured rate
        comp.update(cast)
        comp_fit.residuals.update(cast_res)
        rated = rated.model_copy(update={"efficiency": rated.efficiency.model_copy(update=cast)})
    comp["layer_overhead_us"], layer_detail = fit_layer_overhead(rated, meas.get("layers", []))
    comp["optimizer_tensor_us"], opt_detail = fit_optimizer_tensor(rated, meas.get("optimizer", []))
    co_res = {}
    if comm_fit and meas.get("loaded_comm"):
        comp["collective_overhead_us"], comp["collective_step_us"], co_res = fit_collective_overhead(
            meas["loaded_comm"], comm_fit.latency_us, comm_fit.bandwidth_gbps)
        comp["collective_skew_us"], comp["collective_skew_base_ms"], skew_res = fit_collective_skew(
            meas["loaded_comm"])
        co_res.update(skew_res)
    comp_fit.residuals.update(co_res)
    prop = proposals(hw, comp_fit, meas, tiles)
    prop["layer_overhead"] = layer_detail
    prop["optimizer_tensor"] = opt_detail
    if comm_fit:  # one α-β pair per collective, to show what a single pair per level costs
        kinds = sorted({c["kind"] for c in meas["comm"]})
        prop["comm_per_kind"] = {k: asdict(fit_comm([c for c in meas["comm"] if c["kind"] == k])) for k in kinds}
    return {"compute": comp_fit, "comp": comp, "comm": comm_fit, "proposals": prop,
            "comm_split": split_comm(comm_fit, meas["comm"]) if comm_fit else None}


@click.command("calibrate")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="hardware YAML to write (and <stem>.calibration.json beside it); default: YAML to stdout")
@click.option("--base", default=None, help="hardware spec for the fields not measured (bundled name or YAML); "
              "default cpu-local, or on CUDA the bundled spec matching the device")
@click.option("--ranks", type=click.IntRange(1, 1024), default=None,
              help="local ranks measured at once (CPU default 8, sharing the cores; CUDA: the GPU count)")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--quick", is_flag=True, help="fewer shapes and shorter windows (under 2 minutes with 8 ranks on 2 cores)")
@click.option("--smoke", is_flag=True, hidden=True, help="seconds-long subset for tests; the fit is rough")
@click.option("--name", default=None, help="spec name (default: the output file's stem, else the base's)")
@click.option("--timeout", type=FiniteFloat(1, 3600), default=60.0, show_default=True,
              help="collective timeout per rank, s (a deadlock fails after this)")
@click.option("--check", "check_spec", default=None, metavar="SPEC",
              help="measure nothing new: re-run a sample of SPEC's recorded probes (a spec written by calibrate -o, "
                   "e.g. cpu-local) and compare; exit 1 when this machine differs from the one it was measured on")
def calibrate_cmd(output, base, ranks, device, quick, smoke, name, timeout, check_spec):
    """Micro-benchmark this machine (GEMM, streaming, attention, collectives) and fit a hardware YAML."""
    kind = "smoke" if smoke else "quick" if quick else "full"
    if check_spec is not None:
        from .calibrate_check import check, report
        if ranks is not None or output or base or quick or name or device != "auto":
            click.echo("error: --check SPEC repeats SPEC's recorded probes with its own rank count, base and "
                       "device: --ranks, -o, --base, --quick, --name and --device do not apply", err=True)
            sys.exit(2)
        try:
            r = check(check_spec, timeout=timeout)
        except PiperError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(e.exit_code)
        report(r)
        sys.exit(0 if r["ok"] else 1)
    try:
        r = calibrate(output=output, base=base, ranks=ranks, device=device, kind=kind, name=name, timeout=timeout)
    except PiperError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(e.exit_code)
    if not output:
        click.echo(r["yaml"], nl=False)
    else:
        click.echo(f"wrote {output}", err=True)
