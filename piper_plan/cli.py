"""`piper-plan`: click commands only — parse, call, print (formatting lives in report.py)."""
from __future__ import annotations

import json
import math
import os
import re
import sys

import click

from .cli_checks import (check_grad_dtype, check_headroom, check_machine_size, check_peaks,
                         refuse_expert_options, refuse_no_ops, warn_histogram)
from .cli_stack import GRAD_DTYPE_HELP, OFFLOAD_HELP, STACK_OPTIONS
from .cli_validate import validate_cmd
from .clitypes import BATCH, GPU_COUNT, POSITIVE, SEQUENCE, FiniteFloat, OneLineUsage, one_line_errors
from .files import check_outputs, image_format


class _Group(OneLineUsage, click.Group):
    """Bare `piper-plan --model M --hardware H --gpus N` runs `search`; usage errors are one line."""

    def parse_args(self, ctx, args):
        if args and args[0].startswith("--") and args[0] not in ("--help", "--version"):
            args = ["search", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_Group)
@click.version_option(package_name="piper-moe")
def main():
    """Plan Mixture-of-Experts training layouts: estimate, search, sweep, validate."""


# ---- specs --------------------------------------------------------------------------
@main.command("list")
@click.argument("kind", type=click.Choice(["models", "hardware"]))
@one_line_errors
def list_cmd(kind):
    """List bundled models or hardware with derived figures."""
    from . import report
    from .specs import bundled_names, load_hardware, load_model

    if kind == "models":
        report.show([report.models_table([load_model(n) for n in bundled_names("models")])])
    else:
        report.show([report.hardware_table([load_hardware(n) for n in bundled_names("hardware")])])


@main.command("show-spec")
@click.argument("name")
@one_line_errors
def show_spec(name):
    """Show one model or hardware spec (bundled name or YAML path) in detail."""
    import difflib

    from . import report
    from .errors import SpecError
    from .specs import bundled_names
    from .specs.registry import hf_config, is_hardware_spec, load_hardware, load_model, _resolve

    if not name.strip():
        raise SpecError(repr(name), "<name>", "expected a bundled model or hardware name, or a spec file")
    if name in bundled_names("hardware"):
        report.show(report.hardware_detail(load_hardware(name)))
        return
    if name in bundled_names("models"):
        report.show(report.model_detail(load_model(name)))
        return
    if not os.path.lexists(name) and not name.lower().endswith((".yaml", ".yml", ".json")):  # a misspelt name
        names = bundled_names("models") + bundled_names("hardware")
        close = next(iter(difflib.get_close_matches(name, names, 1)), None)
        raise SpecError(name, "<name>", "not a file and not a bundled model or hardware" +
                        (f" (did you mean {close}?)" if close else "; `piper-plan list models` and "
                         "`piper-plan list hardware` name them"))
    path = _resolve(name, "models")
    # a Hugging Face config (a .json file or a snapshot's folder) is a model and is never read as YAML
    if hf_config(path) is None and is_hardware_spec(path):
        report.show(report.hardware_detail(load_hardware(name)))
    else:
        report.show(report.model_detail(load_model(name)))


# ---- one layout ----------------------------------------------------------------------
MIGRATION_OPTIONS = (
    click.option("--migration/--no-migration", default=False, show_default=True,
                 help="expert migration re-places experts to even out per-rank load"),
    click.option("--migration-period", type=POSITIVE, default=50, show_default=True,
                 help="re-plan every K optimizer steps"),
    click.option("--migration-threshold", type=FiniteFloat(1.0), default=1.1, show_default=True,
                 help="... or when max/mean rank load passes this"),
    click.option("--migration-planner", type=click.Choice(["swap", "lpt"]), default="lpt", show_default=True),
    click.option("--migration-window", type=POSITIVE, default=20, show_default=True,
                 help="moving-average window of per-expert loads, steps"),
    click.option("--migration-max-moves", type=click.IntRange(0), default=None, help="cap on experts moved"),
)


def _migration_from(kw):
    from .cli_checks import check_migration_settings
    from .plan import Migration

    check_migration_settings(kw)
    return Migration(enabled=kw["migration"], period_steps=kw["migration_period"],
                     threshold=kw["migration_threshold"], planner=kw["migration_planner"],
                     window=kw["migration_window"], max_moves=kw["migration_max_moves"])



def _inputs(kw) -> list:
    """The files a planning run reads, as (path, option), that no output of it may replace: a
    bundled spec's file as well as a path, and each `base:` a spec is laid over."""
    from .specs.registry import spec_files

    specs = [(str(f), opt) for kind, opt in (("models", "--model"), ("hardware", "--hardware"))
             for f in spec_files(kw[opt.lstrip("-")], kind)]
    return specs + [(kw.get("routing"), "--routing")]


def _plan_migration(kw, model, layout, output):
    """The migration settings a searched plan gets: off, with a warning, where the best layout
    has nothing to migrate (ep 1), as piper-train would refuse the plan otherwise."""
    from .plan import migration_refusal

    mig = _migration_from(kw)
    why = migration_refusal(model, layout) if mig.enabled else ""
    if why:
        click.echo(f"warning: {output}: migration.enabled: written false: {why}", err=True)
        return mig.model_copy(update={"enabled": False})
    return mig


def _no_repeats(items, option: str, text) -> None:
    """A value listed twice in one option is a typo (as --gpus and --vary hold): refused, naming it."""
    from .errors import LayoutError

    seen = set()
    for x in items:
        if x in seen:
            raise LayoutError(option, f"got {text!r}: {x!r} is listed twice; list each choice once")
        seen.add(x)


def _listed(text: str, option: str, words: tuple[str, ...]) -> tuple[str, ...]:
    """A comma-separated option value as a tuple of `words` ('none' or blank: empty); an
    unknown word raises LayoutError naming the option and the words it takes, a repeated one too."""
    from .errors import LayoutError

    text = text.strip()
    listed = () if text in ("", "none") else tuple(x.strip() for x in text.split(","))
    bad = [x for x in listed if x not in words]
    if bad:
        raise LayoutError(option, f"got {bad[0]!r}; expected none or a comma-separated list of {', '.join(words)}")
    _no_repeats(listed, option, text)
    return listed


def _graph_scopes(kw) -> tuple[str, ...]:
    from .cost.batch import GRAPH_SCOPES

    return _listed(kw["cuda_graphs"], "--cuda-graphs", GRAPH_SCOPES)


def _compiled(kw) -> tuple[str, ...]:
    from typing import get_args

    from .layout import CompilePart

    return _listed(kw["compiled"], "--compile", get_args(CompilePart))


def _offload_modules(text: str, model=None) -> tuple[str, ...]:
    """One --offload-modules set as a tuple; the experts' modules refused for a model without experts."""
    from .cost.batch import OFFLOAD_MODULES
    from .errors import LayoutError

    mods = _listed(text, "--offload-modules", OFFLOAD_MODULES)
    absent = [x for x in mods if x in ("expert_fc1", "moe_act") and model is not None and model.moe is None]
    if absent:
        raise LayoutError("--offload-modules", f"{absent[0]} names a part {model.name} does not have")
    return mods


def layout_options(fn):
    opts = [
        click.option("--model", "-m", required=True, help="bundled name, model YAML or HF config.json"),
        click.option("--hardware", "-H", "hardware", required=True, help="bundled name or hardware YAML"),
        click.option("--gpus", "-n", type=GPU_COUNT, required=True, help="GPUs (or GCDs, CPU ranks) the layout uses"),
        click.option("--tp", type=POSITIVE, default=1, show_default=True),
        click.option("--cp", type=POSITIVE, default=1, show_default=True,
                     help="context parallel: ranks each sequence is split over (Megatron-Core --context-parallel-size; "
                     "how keys move: --cp-comm)"),
        click.option("--cp-comm", type=click.Choice(["p2p", "all_gather", "a2a", "a2a+p2p"]), default="p2p",
                     show_default=True,
                     help="how context parallelism moves keys (Megatron-Core --cp-comm-type): p2p, the ring behind "
                     "the kernels; all_gather, K and V gathered first (Llama 3's); a2a, Ulysses' head exchange; "
                     "a2a+p2p, a2a inside groups of --cp-a2a ranks and the ring between them"),
        click.option("--cp-a2a", type=POSITIVE, default=1, show_default=True,
                     help="with --cp-comm a2a+p2p: ranks of each all-to-all group (Megatron-Core "
                     "--hierarchical-context-parallel-sizes' first)"),
        click.option("--pp", type=POSITIVE, default=1, show_default=True),
        click.option("--ep", type=POSITIVE, default=1, show_default=True),
        click.option("--etp", type=POSITIVE, default=1, show_default=True,
                     help="expert tensor parallel: ranks each expert is split over (Megatron-Core "
                     "--expert-tensor-parallel-size; its default when unset is --tp)"),
        click.option("--dp", type=POSITIVE, default=None, help="attention data parallel (default gpus/(tp*cp*pp))"),
        click.option("--mbs", type=BATCH, default=1, show_default=True, help="micro-batch size, sequences"),
        click.option("--global-batch", type=BATCH, default=None,
                     help="sequences per step (default 4M tokens' worth, rounded down to whole dp x mbs)"),
        click.option("--seq", type=SEQUENCE, default=None, help="sequence length (default: the model's)"),
        click.option("--schedule", type=click.Choice(["gpipe", "1f1b", "interleaved", "zbv", "dualpipev"]), default="1f1b",
                     show_default=True),
        click.option("--vpp", type=POSITIVE, default=None, help="chunks per rank (interleaved; zbv/dualpipev use 2)"),
        click.option("--recompute", type=click.Choice(["none", "selective", "full"]), default="none", show_default=True),
        click.option("--recompute-layers", type=click.IntRange(min=0), default=0, show_default=True,
                     help="with --recompute full, the layers of each pipeline chunk that re-run their forward (the "
                     "first N: Megatron-Core --recompute-method block --recompute-num-layers N); 0: every layer"),
        click.option("--recompute-modules", default="core_attn", show_default=True,
                     help="what selective recompute re-runs, comma-separated (Megatron-Core --recompute-modules): "
                     "core_attn, layernorm, mla_up_proj, mlp, moe_act, moe, shared_experts; X-MoE's attn_block, "
                     "act_fc2; torchtitan's per-op policy op_sac (alone)"),
        click.option("--sequence-parallel/--no-sequence-parallel", default=True, show_default=True),
        click.option("--p2p-scatter-gather/--no-p2p-scatter-gather", default=False, show_default=True,
                     help="without sequence parallelism: each tensor-parallel rank sends 1/tp of a stage boundary's "
                     "activation and the next stage all-gathers it (Megatron-LM --scatter-gather-tensors-in-pipeline, "
                     "its default before Megatron-Core)"),
        click.option("--tp-async-dgrad/--no-tp-async-dgrad", default=True, show_default=True,
                     help="without sequence parallelism: each column-parallel layer's input-gradient all-reduce "
                     "runs beside its weight-gradient GEMM (Megatron --async-tensor-model-parallel-allreduce, "
                     "default since 2022); off: each waits in turn"),
        click.option("--zero", type=click.IntRange(0, 3), default=1, show_default=True),
        click.option("--zero-replicas", type=POSITIVE, default=1, show_default=True,
                     help="hybrid sharding: copies of each ZeRO shard, each shard over dp·cp / N neighbouring ranks "
                     "(torch fully_shard's HSDP, Megatron-Core --num-distributed-optimizer-instances); 1: ZeRO over "
                     "the whole data-parallel group"),
        click.option("--reshard-after-forward/--no-reshard-after-forward", default=True, show_default=True,
                     help="with --zero 3: free each unit's gathered parameters after forward and gather them again "
                     "for backward (torch fully_shard's reshard_after_forward), or keep them to the backward"),
        click.option("--a2a", type=click.Choice(["flat", "halo", "dedup", "fused", "auto"]), default="auto",
                     show_default=True, help="auto: flat and halo (what piper-train runs); dedup: DeepEP / HybridEP "
                     "token-level exchange; fused: Dist-MoE's exchange inside the expert GEMMs (Layout.a2a)"),
        click.option("--placement", type=click.Choice(["packed", "spread"]), default="packed", show_default=True),
        click.option("--routing", default="uniform", show_default=True,
                     help="uniform | zipf[:s] | metrics.jsonl from piper-train (its last run's per-expert loads)"),
        click.option("--dropout/--no-dropout", default=False, show_default=True),
        *STACK_OPTIONS,
        click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32"]), default="bf16", show_default=True),
        click.option("--grad-dtype", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True,
                     help=GRAD_DTYPE_HELP),
        click.option("--overlap-grad-reduce/--no-overlap-grad-reduce", default=True, show_default=True),
        click.option("--optimizer-offload", type=FiniteFloat(0.0, 1.0), default=0.0, show_default=True,
                     help=OFFLOAD_HELP["optimizer"]),
        click.option("--offload-layers", type=click.IntRange(min=0), default=0, show_default=True,
                     help=OFFLOAD_HELP["layers"]),
        click.option("--offload-modules", default="none", show_default=True, help=OFFLOAD_HELP["modules"]),
        *MIGRATION_OPTIONS,
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def _modules(text: str, option: str) -> tuple[str, ...]:
    """A comma-separated list of selective-recompute modules, checked."""
    from .cost.batch import RC_MODULES
    from .errors import LayoutError

    modules = tuple(x.strip() for x in text.split(","))
    bad = [x for x in modules if x not in RC_MODULES]
    if bad or not modules:
        raise LayoutError(option, f"got {text!r}; expected a comma-separated list of {', '.join(RC_MODULES)}")
    _no_repeats(modules, option, text)
    return modules


def _show_track_record(model, hw) -> None:
    """How far the model has been off on this model's and machine's published runs (track_record),
    where they are the bundled specs of those names (a user's edited copy has no track record)."""
    from .specs import load_hardware, load_model
    from .specs.registry import bundled_names
    from .track_record import lines

    def name_if_bundled(spec, kind, load) -> str:
        return spec.name if spec.name in bundled_names(kind) and load(spec.name) == spec else ""

    for line in lines(name_if_bundled(model, "models", load_model), name_if_bundled(hw, "hardware", load_hardware)):
        click.echo(line)


def _seq_batch(kw, model) -> tuple[int, int]:
    """--seq (default: the model's) and --global-batch (default: 4M tokens' worth of it)."""
    from .search import default_global_batch

    seq = model.seq_len if kw["seq"] is None else kw["seq"]
    return seq, default_global_batch(seq) if kw["global_batch"] is None else kw["global_batch"]


def _layout_from(kw, model):
    from .errors import LayoutError
    from .layout import Layout, absent_module_refusal

    check_grad_dtype(kw)

    gpus, tp, cp, pp = kw["gpus"], kw["tp"], kw["cp"], kw["pp"]
    dp = kw["dp"]
    if dp is None:
        if gpus % (tp * cp * pp):
            named = "tp*pp" if cp == 1 else "tp*cp*pp"  # cp named where it is used
            raise LayoutError(f"{named}*dp == gpus", f"{named} = {tp * cp * pp} does not divide {gpus} GPUs")
        dp = gpus // (tp * cp * pp)
    seq, gbs = _seq_batch(kw, model)
    if kw["global_batch"] is None:  # the default is a size, not a layout: a whole number of dp x mbs
        from .search import round_batch

        gbs = round_batch(gbs, dp * kw["mbs"])
    vpp = (2 if kw["schedule"] in ("zbv", "dualpipev", "interleaved") else 1) if kw["vpp"] is None else kw["vpp"]
    modules = _modules(kw["recompute_modules"], "--recompute-modules")
    if modules != ("core_attn",) and kw["recompute"] != "selective":  # (as --recompute-layers without full)
        raise LayoutError("--recompute-modules", f"{kw['recompute_modules']!r} chooses what selective recompute "
                          f"re-runs; --recompute is {kw['recompute']!r}")
    why = absent_module_refusal(model, modules) if kw["recompute"] == "selective" else None
    if why:
        raise LayoutError("--recompute-modules", why[1])
    return Layout(gpus=gpus, tp=tp, cp=cp, cp_comm=kw["cp_comm"], cp_a2a=kw["cp_a2a"], pp=pp, dp=dp, ep=kw["ep"],
                  etp=kw["etp"], vpp=vpp, mbs=kw["mbs"],
                  global_batch=gbs, seq=seq,
                  schedule=kw["schedule"], recompute=kw["recompute"], recompute_layers=kw["recompute_layers"],
                  sequence_parallel=kw["sequence_parallel"] and tp > 1,  # as search writes it: no-op at tp 1
                  p2p_scatter_gather=kw["p2p_scatter_gather"] and tp > 1, tp_async_dgrad=kw["tp_async_dgrad"],
                  recompute_modules=modules,
                  zero=kw["zero"], zero_replicas=kw["zero_replicas"], reshard_after_forward=kw["reshard_after_forward"],
                  fsdp2=kw["fsdp2"], grad_sync=kw["grad_sync"], wgrad_accum=kw["wgrad_accum"],
                  a2a="flat" if kw["a2a"] == "auto" else kw["a2a"], placement=kw["placement"],
                  dtype=kw["dtype"], attention_kernel=kw["attention"], dropout=kw["dropout"],
                  fused_kernels=kw["kernels"] != "unfused", native_eager=kw["kernels"] == "eager",
                  compiled=_compiled(kw), cross_entropy=kw["cross_entropy"],
                  expert_gemm=kw["expert_gemm"], a2a_overlap=kw["a2a_overlap"], a2a_sms=kw["a2a_sms"], fp8=kw["fp8"],
                  fp8_params=kw["fp8_params"], cuda_graphs=_graph_scopes(kw),
                  tp_comm_overlap=kw["tp_comm_overlap"], attention_fp8=kw["attention_fp8"],
                  p2p_overlap=kw["p2p_overlap"],
                  expert_probs=kw["expert_probs"], pipeline_split=kw["pipeline_split"], grad_dtype=kw["grad_dtype"],
                  overlap_grad_reduce=kw["overlap_grad_reduce"], optimizer_offload=kw["optimizer_offload"],
                  offload_layers=kw["offload_layers"],
                  offload_modules=_offload_modules(kw["offload_modules"], model))


@main.command()
@layout_options
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="also write plan.json for this layout")
@click.option("--runtime", type=click.Choice(["any", "piper-train"]), default="any", show_default=True,
              help="piper-train: price the layout as the bundled runtime runs it (eager modules, gradients reduced "
              "after the pipeline) and refuse what it cannot run, in one line")
@one_line_errors
def estimate(as_json, output, runtime, **kw):
    """Estimate one layout: memory per stage, time breakdown, throughput."""
    from . import report
    from .evaluate import build_plan, estimate_layout, parse_routing
    from .layout import degrees_label
    from .errors import SpecError
    from .plan import migration_refusal, write_plan
    from .specs import load_hardware, load_model

    model, hw = load_model(kw["model"]), load_hardware(kw["hardware"])
    refuse_expert_options(model, kw)
    check_outputs([(output, "-o")], _inputs(kw))
    check_machine_size(hw, kw["hardware"], kw["gpus"])
    check_peaks(hw, kw["hardware"], kw)
    lay = _layout_from(kw, model)
    refuse_no_ops(lay, kw, hw.gpus_per_node)
    if runtime == "piper-train":
        lay = _as_piper_train_runs(lay, model)
    routing = parse_routing(kw["routing"])
    warn_histogram(model, routing, kw["routing"])
    migration = _migration_from(kw)
    if migration.enabled and (why := migration_refusal(model, lay)):
        raise SpecError("--migration", "ep" if model.moe else "model", why)
    routing.migration = migration if migration.enabled else None
    est = estimate_layout(model, hw, lay, routing)
    if kw["a2a"] == "auto" and model.moe is not None and lay.ep > 1:
        alt_lay = lay.model_copy(update={"a2a": "halo"})
        alt = estimate_layout(model, hw, alt_lay, routing)
        if alt.step_time_s[0] < est.step_time_s[0]:
            lay, est = alt_lay, alt
    if not (math.isfinite(est.step_time_s[0]) and math.isfinite(est.peak_memory_gib[0])):
        raise SpecError(kw["hardware"], "<figures>", "price this layout at a non-finite time or memory: a figure "
                        "is out of any physical range (an overhead of 1e308 us, a bandwidth of 1e-300 GB/s)")
    row = est.row(0)
    row["layout"] = lay.model_dump()
    if output:
        write_plan(build_plan(model, hw, lay, est, 0, routing, migration), output)
    if as_json:
        click.echo(json.dumps(row, indent=2))
    else:
        title = (f"{model.name} on {lay.gpus} × {hw.name}: {degrees_label(lay)} "
                 f"mbs{lay.mbs} M{lay.microbatches} {lay.schedule} recompute={lay.recompute} zero{lay.zero}"
                 + (f"x{lay.zero_replicas}" if lay.zero_replicas > 1 else "")
                 + (" grad_sync=step" if lay.grad_sync == "step" else "")
                 + (f" wgrad_accum={lay.wgrad_accum}" if lay.wgrad_accum else "") + f" a2a={lay.a2a}"
                 + (f" fp8={lay.fp8}" if lay.fp8 != "none" else ""))
        report.show(report.estimate_tables(row, title))
        _show_track_record(model, hw)
        if output:
            click.echo(f"wrote {output}")
    if output and not row["fits"]:  # written as asked (to inspect, to compare), but not silently
        where = (f"its busiest rank needs {row['peak_memory_gib']:.1f} GiB against the device's "
                 f"{hw.accelerator.memory_gib:g} GiB" if row["peak_memory_gib"] > hw.accelerator.memory_gib
                 else "its ranks' host memory exceeds the host's")
        click.echo(f"warning: {output} holds a layout that does not fit ({where}); piper-train refuses it", err=True)


def _as_piper_train_runs(lay, model):
    """`lay` priced as piper-train runs it (eager modules, the reduction after the pipeline), or a
    one-line refusal of what it cannot run (runtimes.layout_refusal, the table its launch reads);
    options given on the command line that it would run otherwise are refused, not overridden."""
    from click.core import ParameterSource

    from .errors import PiperError
    from .runtimes import PRICED_AS, layout_refusal, tp_refusal

    ctx = click.get_current_context()
    given = {"fused_kernels": ctx.params.get("kernels") == "fused",
             "overlap_grad_reduce": ctx.params.get("overlap_grad_reduce")}
    for field, what, _, option in PRICED_AS:
        name = "kernels" if field == "fused_kernels" else field
        if given[field] and ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE:
            raise PiperError(f"--runtime piper-train: layout.{field}: piper-train does not run {what}; use {option}")
    # piper-train reduces fp32 gradients (its launch refuses a plan priced for bf16 ones), so the
    # price is fp32's
    grad = ctx.params.get("grad_dtype")
    if grad != "fp32" and ctx.get_parameter_source("grad_dtype") == ParameterSource.COMMANDLINE:
        raise PiperError("--runtime piper-train: layout.grad_dtype: piper-train reduces fp32 gradients; use "
                         "--grad-dtype fp32")
    lay = lay.model_copy(update={"fused_kernels": False, "overlap_grad_reduce": False, "grad_dtype": "fp32"})
    why = tp_refusal(lay, model) or layout_refusal(lay, model)
    if why:
        raise PiperError(f"--runtime piper-train: {why}")
    return lay


# ---- search ---------------------------------------------------------------------------
def search_options(fn):
    opts = [
        click.option("--model", "-m", required=True, help="bundled name, model YAML or HF config.json"),
        click.option("--hardware", "-H", "hardware", required=True, help="bundled name or hardware YAML"),
        click.option("--global-batch", type=BATCH, default=None,
                     help="sequences per step (default 4M tokens' worth, rounded down to a multiple of the GPU count, "
                     "each GPU count in a sweep, and at least one sequence a GPU)"),
        click.option("--seq", type=SEQUENCE, default=None, help="sequence length (default: the model's)"),
        click.option("--routing", default="uniform", show_default=True,
                     help="uniform | zipf[:s] | metrics.jsonl from piper-train (its last run's per-expert loads)"),
        click.option("--a2a", type=click.Choice(["flat", "halo", "dedup", "fused", "auto"]), default="auto",
                     show_default=True, help="auto: flat and halo (what piper-train runs); dedup: DeepEP / HybridEP "
                     "token-level exchange; fused: Dist-MoE's exchange inside the expert GEMMs (Layout.a2a)"),
        *MIGRATION_OPTIONS,
        click.option("--headroom-gib", type=FiniteFloat(0.0), default=0.0, show_default=True,
                     help="memory kept free on top of the hardware's reserve"),
        click.option("--ep-in-domain", default=None, help="keep each EP group inside this topology level (paper rule)"),
        click.option("--cp", "cps", default="auto", show_default=True,
                     help="context-parallel degrees to try, comma-separated (e.g. 1,2,4): each sequence split over "
                     "cp ranks (--cp-comm: how keys move); auto: 1, 2, 4 and 8 from 8K-token sequences on (1 below, "
                     "for piper-train, which keeps sequences whole, and with --selective op_sac, priced at cp 1)"),
        click.option("--cp-comm", "cp_comms", default="p2p,all_gather,a2a,a2a+p2p", show_default=True,
                     help="how context parallelism may move keys, comma-separated, each a choice where cp > 1 "
                     "(Megatron-Core --cp-comm-type): p2p, all_gather, a2a, a2a+p2p (once for each all-to-all "
                     "group size that divides cp)"),
        click.option("--etp", "etps", default="1", show_default=True,
                     help="expert-tensor-parallel degrees to try, comma-separated (e.g. 1,2,4); 1 keeps experts "
                     "whole, as piper-train runs them"),
        click.option("--optimizer-offload", default="0", show_default=True,
                     help="shares to try, comma-separated (e.g. 0,1), each a choice: " + OFFLOAD_HELP["optimizer"]),
        click.option("--offload-layers", default="0", show_default=True,
                     help="counts to try, comma-separated (e.g. 0,20,40), each a choice: " + OFFLOAD_HELP["layers"]),
        click.option("--offload-modules", "offload_modules", multiple=True, default=("none",), show_default=True,
                     help="repeat to try several sets, each a choice of its own (e.g. --offload-modules none "
                     "--offload-modules expert_fc1,moe_act): " + OFFLOAD_HELP["modules"]),
        click.option("--recompute-layers", "recompute_layers", default="0", show_default=True,
                     help="layers of each pipeline chunk that full recompute re-runs, comma-separated, each a choice "
                     "(e.g. 0,1,2,4; Megatron-Core --recompute-method block --recompute-num-layers); 0: every layer"),
        click.option("--schedules", default="gpipe,1f1b,interleaved,zbv,dualpipev", show_default=True,
                     help="pipeline schedules to try, comma-separated (zbv and dualpipev: two chunks a rank in a V)"),
        click.option("--zero", "zeros", default=None,
                     help="ZeRO stages to try, comma-separated (e.g. 1,3); default 0,1,2,3 (0-2 under "
                     "--runtime piper-train, which implements those)"),
        click.option("--hsdp/--no-hsdp", default=False, show_default=True,
                     help="also try each ZeRO stage hybrid-sharded: sharded inside the scale-up domain (a node, an "
                     "NVL72 rack) and replicated across domains, the copies all-reducing once a step (Layout."
                     "zero_replicas)"),
        click.option("--selective", "selective", multiple=True, default=("core_attn",), show_default=True,
                     help="a set of modules selective recompute re-runs, comma-separated (Megatron-Core "
                     "--recompute-modules: core_attn, layernorm, mla_up_proj, mlp, moe_act, moe, shared_experts; "
                     "X-MoE's attn_block, act_fc2; torchtitan's op_sac, alone); repeat to try several sets, each a "
                     "choice of its own (piper-train runs core_attn only)"),
        click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32"]), default="bf16", show_default=True),
        click.option("--grad-dtype", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True,
                     help=GRAD_DTYPE_HELP),
        click.option("--runtime", type=click.Choice(["any", "piper-train"]), default="any", show_default=True,
                     help="piper-train: only plans the bundled runtime runs, priced as it runs them (eager modules, "
                     "ZeRO 0-2, gradients reduced after the pipeline)"),
        *STACK_OPTIONS,
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def _ints(text: str, option: str, least: int = 1, most: int = GPU_COUNT.max) -> tuple[int, ...]:
    """A comma-separated list of distinct integers from `least` to `most` (degrees: 1 to the most GPUs
    -n takes, no group spans more ranks than there are; counts of layers: 0 to MAX_LAYERS), checked
    (numpy overflowed on 1e23)."""
    from .errors import LayoutError

    parts = [x.strip() for x in text.split(",")]
    # ASCII digits only: str.isdigit() takes '2²', which int() refuses, and Arabic-Indic digits
    if not all(re.fullmatch("[0-9]+", x) and least <= int(x) <= most for x in parts):
        what = "positive integers" if least >= 1 else "whole numbers"
        raise LayoutError(option, f"got {text!r}; expected a comma-separated list of {what} up to {most:,}")
    _no_repeats([int(x) for x in parts], option, text)
    return tuple(sorted({int(x) for x in parts}))


def _fractions(text: str, option: str) -> tuple[float, ...]:
    """A comma-separated list of fractions from 0 to 1, checked."""
    from .errors import LayoutError

    try:
        listed = [float(x) for x in text.split(",")]
    except ValueError:
        listed = []
    if not listed or not all(0.0 <= v <= 1.0 for v in listed):
        raise LayoutError(option, f"got {text!r}; expected a comma-separated list of fractions from 0 to 1")
    _no_repeats(listed, option, text)
    return tuple(sorted(listed))


def _cps(kw, seq: int, selective=()) -> tuple[int, ...]:
    """--cp's degrees: as listed, or auto (search.auto_cps; 1 alone for piper-train, and where a
    `selective` set is torchtitan's per-op policy, which is priced at cp 1 only)."""
    from .search import auto_cps

    if kw["cps"].strip() == "auto":
        one = kw.get("runtime") == "piper-train" or any("op_sac" in mods for mods in selective)
        return (1,) if one else auto_cps(seq)
    return _ints(kw["cps"], "--cp")


def _cp_comms(kw) -> tuple[str, ...]:
    """--cp-comm's ways of moving keys, at least one (Layout.cp_comm's words)."""
    from .cost.batch import CP_COMMS
    from .errors import LayoutError

    listed = _listed(kw["cp_comms"], "--cp-comm", CP_COMMS)
    if not listed:
        raise LayoutError("--cp-comm", f"got {kw['cp_comms']!r}; expected a comma-separated list of "
                          f"{', '.join(CP_COMMS)}")
    return listed


def _module_sets(texts, option: str, parse) -> tuple[tuple[str, ...], ...]:
    """A repeatable option's module sets (`parse` reads one), each once: the same set given twice
    is a typo, as a module twice in one."""
    sets = tuple(parse(t) for t in texts)
    _no_repeats([",".join(sorted(s)) or "none" for s in sets], option, " ".join(texts))
    return sets


def _space(kw, model, gpus):
    from .search import SearchSpace, for_runtime
    from .specs.model import MAX_LAYERS  # (no chunk holds more layers than a model may have)

    from .errors import SpecError
    from .layout import attention_conflict

    check_grad_dtype(kw)
    why = attention_conflict(kw["attention"], kw["attention_fp8"])  # (estimate's layout check says it too)
    if why:
        raise SpecError("--attention-fp8", f"with --attention {kw['attention']}", f"expected --attention flash: {why}")

    seq, gbs = _seq_batch(kw, model)
    a2as = ("flat", "halo") if kw["a2a"] == "auto" else (kw["a2a"],)
    selective = _module_sets(kw["selective"], "--selective", lambda t: _modules(t, "--selective"))
    sp = SearchSpace(selective=selective, gpus=gpus, global_batch=gbs, seq=seq, dtype=kw["dtype"], a2as=a2as,
                     schedules=tuple(s.strip() for s in kw["schedules"].split(",") if s.strip()),
                     ep_in_domain=kw["ep_in_domain"], fused_kernels=kw["kernels"] != "unfused",
                     native_eager=kw["kernels"] == "eager", fsdp2=kw["fsdp2"], compiled=_compiled(kw),
                     cross_entropy=kw["cross_entropy"], grad_sync=kw["grad_sync"], wgrad_accum=kw["wgrad_accum"],
                     etps=_ints(kw["etps"], "--etp"), cps=_cps(kw, seq, selective),
                     cp_comms=_cp_comms(kw), expert_gemm=kw["expert_gemm"],
                     a2a_overlap=kw["a2a_overlap"], a2a_sms=kw["a2a_sms"],
                     tp_comm_overlap=kw["tp_comm_overlap"], attention_fp8=kw["attention_fp8"],
                     attention_kernel=kw["attention"], p2p_overlap=kw["p2p_overlap"],
                     fp8=kw["fp8"], fp8_params=kw["fp8_params"], expert_probs=kw["expert_probs"],
                     cuda_graphs=_graph_scopes(kw), pipeline_split=kw["pipeline_split"], grad_dtype=kw["grad_dtype"],
                     optimizer_offload=_fractions(kw["optimizer_offload"], "--optimizer-offload"),
                     offload_layers=_ints(kw["offload_layers"], "--offload-layers", 0, MAX_LAYERS),
                     offload_modules=_module_sets(kw["offload_modules"], "--offload-modules",
                                                  lambda t: _offload_modules(t, model)),
                     recompute_layers=_ints(kw["recompute_layers"], "--recompute-layers", 0, MAX_LAYERS),
                     hsdp=kw["hsdp"], **_zeros(kw))
    return for_runtime(sp, kw.get("runtime", "any"), model)


def _zeros(kw) -> dict:
    """--zero's stages, where given (search.for_runtime refuses a list piper-train cannot run and
    cuts the default, every stage, to the ones it runs)."""
    return {} if kw.get("zeros") is None else {"zeros": _ints(kw["zeros"], "--zero", 0, 3)}


def _load_for_search(kw):
    from .errors import SpecError
    from .evaluate import parse_routing
    from .specs import load_hardware, load_model

    model, hw = load_model(kw["model"]), load_hardware(kw["hardware"])
    refuse_expert_options(model, kw)
    if kw["ep_in_domain"] and kw["ep_in_domain"] not in [lv.name for lv in hw.topology]:
        raise SpecError(kw["hardware"], "topology", f"no level named {kw['ep_in_domain']!r} for --ep-in-domain")
    bad = [s.strip() for s in kw["schedules"].split(",") if s.strip() not in
           ("gpipe", "1f1b", "interleaved", "zbv", "dualpipev")]
    if bad:
        raise SpecError("--schedules", repr(bad[0]), "expected a comma-separated list of gpipe, 1f1b, interleaved, "
                        "zbv or dualpipev")
    _no_repeats([s.strip() for s in kw["schedules"].split(",") if s.strip()], "--schedules", kw["schedules"])
    routing = parse_routing(kw["routing"])
    warn_histogram(model, routing, kw["routing"])
    migration = _migration_from(kw)
    routing.migration = migration if migration.enabled else None
    return model, hw, routing


@main.command("search")
@search_options
@click.option("--gpus", "-n", type=GPU_COUNT, required=True,
              help="GPUs (or GCDs, CPU ranks) the layouts use, all of them")
@click.option("--objective", type=click.Choice(["throughput", "mfu", "memory"]), default="throughput",
              show_default=True,
              help="rank by tokens/s, by model FLOPs utilisation, or by the lowest peak memory among the fitting")
@click.option("--top", "top_k", type=POSITIVE, default=10, show_default=True, help="layouts shown (and in --json)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object: counts, rejections, the top layouts")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="write the best layout as plan.json")
@one_line_errors
def search_cmd(gpus, objective, top_k, as_json, output, **kw):
    """Find the best layouts for a model on N GPUs of a machine."""
    import time

    from . import report
    from .evaluate import build_plan
    from .plan import write_plan
    from .diagnose import diagnose
    from .search import search
    from .track_record import memory_margin_line

    t0 = time.perf_counter()
    model, hw, routing = _load_for_search(kw)
    check_outputs([(output, "-o")], _inputs(kw))
    check_machine_size(hw, kw["hardware"], gpus)
    check_headroom(hw, kw["headroom_gib"])
    sp = _space(kw, model, gpus)  # before the peaks: a runtime that cannot run the options says so first
    check_peaks(hw, kw["hardware"], kw)
    if kw["global_batch"] is None:  # the default is a size, not a layout: sweep's rounding (run_sweep)
        from dataclasses import replace

        from .search import round_batch

        size, sp = sp.global_batch, replace(sp, global_batch=round_batch(sp.global_batch, gpus))
        _warn_default_batch(size, [gpus])  # raised, where sweep raises it too
    res = search(model, hw, sp, routing, objective, kw["headroom_gib"], keep=top_k)  # bounded memory
    wall = time.perf_counter() - t0
    rows = []
    for i in res.order[:top_k]:
        r = res.est.row(int(i))
        r["layout"] = res.batch.layout(int(i)).model_dump()
        r["dominant"] = str(res.est.dominant()[int(i)])
        rows.append(r)
    why = [] if rows else diagnose(model, hw, sp, res, routing, kw["headroom_gib"])
    if output and rows:
        i = res.best
        write_plan(build_plan(model, hw, res.batch.layout(i), res.est, i, routing,
                              _plan_migration(kw, model, res.batch.layout(i), output)), output)
    # a best plan fuller than any published run the memory model was checked on says so
    note = (memory_margin_line(rows[0]["peak_memory_gib"], hw.accelerator.memory_gib,
                               float(res.est.peak_memory_gib[res.order].min())) if rows else None)
    if as_json:
        click.echo(json.dumps({"evaluated": res.evaluated, "priced": res.priced, "fitting": res.fitting,
                               "rejected": res.rejected, "wall_s": wall, "search_cpu_s": res.cpu_s, "top": rows,
                               "infeasible": why, "memory_note": note}, indent=2))
    else:
        title = f"{model.name} on {gpus} × {hw.name} — {res.evaluated:,} layouts evaluated in {wall:.2f} s, " \
                f"{res.fitting:,} fit" + (f", fp8 {kw['fp8']} GEMMs" if kw["fp8"] != "none" else "")
        if rows:
            report.show([report.search_table(rows, title)])
        else:  # no empty table: the rejections and the diagnosis below say why
            click.echo(title)
        report.show_rejections(res.rejected, why)
        _show_track_record(model, hw)
        if note:
            click.echo(note)
        if output and rows:
            click.echo(f"wrote {output}")
    if not rows:
        sys.exit(1)


@main.command("show")
@click.argument("plan_path", type=click.Path(dir_okay=False))
@one_line_errors
def show_plan(plan_path):
    """Render a plan.json."""
    from . import report
    from .plan import priced_refusal, read_plan

    plan = read_plan(plan_path)
    report.show(report.plan_tables(plan))
    if why := priced_refusal(plan):  # shown, to inspect the edit; piper-train refuses it
        click.echo(f"warning: {plan_path}: {why}", err=True)


@main.command("schema")
def schema_cmd():
    """Print plan.json's JSON Schema."""
    from .plan import json_schema

    click.echo(json.dumps(json_schema(), indent=2))


@main.command("sweep")
@search_options
@click.option("--gpus", "-n", required=True, help="comma-separated GPU counts, e.g. 256,512,1024")
@click.option("--vary", multiple=True, help="FIELD=v1,v2: a numeric field of the hardware spec by dotted path "
              "(topology.0.bandwidth_gbps, efficiency.comm) or alias: nic_gbps (per NIC, network.nic_gbps), "
              "hbm_gib / memory_gib, hbm_gbps, peak_bf16, gemm_eff, sustained, host_op_us, host_link_gbps, "
              "host_gib; repeat --vary for a grid")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), help="write the table as CSV")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="write the table as JSON")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="image of throughput and MFU: PNG, or the format its suffix names (.pdf, .svg)")
@one_line_errors
def sweep_cmd(gpus, vary, csv_path, json_path, plot_path, **kw):
    """What-if: best plan per hardware scenario and GPU count."""
    import csv
    import io

    from rich.progress import Progress
    from rich.table import Table

    from . import report
    from .errors import SpecError
    from .files import is_stdout
    from .plan import atomic_write_text
    from .sweep import CSV_COLUMNS, MAX_SEARCHES, fmt, parse_vary, plot, run_sweep, scenarios

    model, hw, routing = _load_for_search(kw)
    parts = [x.strip() for x in gpus.split(",")]
    # ASCII digits only (as _ints): str.isdigit() takes '²', which int() refuses
    if not all(re.fullmatch("[0-9]+", x) and 1 <= int(x) <= GPU_COUNT.max for x in parts) or \
            len(set(map(int, parts))) != len(parts):
        raise SpecError("--gpus", repr(gpus), "expected a comma-separated list of distinct GPU counts, each "
                        f"1..{GPU_COUNT.max:,}")
    counts = [int(x) for x in parts]
    vary_d = parse_vary(list(vary))
    n = len(counts)
    for v in vary_d.values():
        n *= len(v)
    if n > MAX_SEARCHES:  # each a full search; their specs are built before the first
        raise SpecError("--vary", f"{n:,} searches", f"expected at most {MAX_SEARCHES:,} (GPU counts x each "
                        "field's values): sweep fewer values, or split the sweep")
    space = _space(kw, model, counts[0])
    check_peaks(hw, kw["hardware"], kw)
    # before the sweep: a path that cannot be written would lose it, or leave half the outputs
    check_outputs([(csv_path, "--csv"), (json_path, "--json"), (plot_path, "--plot")], _inputs(kw))
    if plot_path:
        image_format(plot_path)
    said: set = set()
    specs = scenarios(hw, vary_d)  # every value checked before the first search
    # the headroom against the largest memory a scenario has: refused where it leaves every one nothing
    check_headroom(max(specs.values(), key=lambda h: h.accelerator.memory_gib), kw["headroom_gib"])
    for h in specs.values():  # a varied max_gpus or topology is the scenario's machine
        for c in counts:
            check_machine_size(h, kw["hardware"], c, said)
    _check_scenarios(model, space, specs, list(vary_d))
    warned = _warn_unread_vary(vary_d, space, kw["hardware"])
    if kw["global_batch"] is None:
        _warn_default_batch(space.global_batch, counts)
    with Progress(transient=True, disable=n < 4) as prog:
        task = prog.add_task("sweeping", total=n)
        rows = run_sweep(model, hw, counts, vary_d, space, routing, lambda: prog.advance(task), kw["headroom_gib"],
                         batch_given=kw["global_batch"] is not None, specs=specs)
    keys = ["gpus", *vary_d]
    t = Table(title=f"{model.name} on {hw.name}: best plan per scenario")
    for c in keys + ["global batch", "tokens/s", "MFU", "layout"]:
        t.add_column(c)
    for r in rows:  # (the batch: the default's rounds to each GPU count, so say which each row priced)
        t.add_row(*[fmt(r[k]) for k in keys], str(r["global_batch"]), f"{r['tokens_per_s']:,.0f}", f"{r['mfu']:.1%}",
                  r["layout"])
    report.show([t], stderr=is_stdout(csv_path) or is_stdout(json_path))  # the data alone on stdout
    if csv_path:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=[*keys, *CSV_COLUMNS])  # the scenario, then its answer, as the table
        w.writeheader()
        w.writerows(rows)
        atomic_write_text(csv_path, buf.getvalue(), "--csv")
    if json_path:
        atomic_write_text(json_path, json.dumps(rows, indent=2), "--json")
    if plot_path:
        plot(rows, list(vary_d), plot_path)
    _warn_alike(rows, [k for k in keys if k not in warned], kw["hardware"])
    if not any(r["fits"] for r in rows):  # as search: an answer with no plan in it is a failure to a script
        click.echo("nothing fits in any scenario; `piper-plan search` says why, on the spec or on a copy of it "
                   "with the varied fields set", err=True)
        sys.exit(1)


def _warn_default_batch(size: int, counts: list[int]) -> None:
    """Say where the default global batch (a size, not a layout) is raised to one sequence a GPU."""
    under = [c for c in counts if size > 0 and c > size]
    if under:
        shown = ", ".join(f"{c:,}" for c in under)
        at = f"{under[0]:,} (one a GPU)" if len(under) == 1 else "one a GPU there"
        click.echo(f"warning: --global-batch: the default, {size:,} sequences (4M tokens), is under one a GPU "
                   f"on {shown} GPUs; searched at {at}; state the batch you will run", err=True)


def _check_scenarios(model, space, specs: dict, keys: list[str]) -> None:
    """Each scenario's spec asked, before the first search, what the search refuses of a whole space
    (search.check_space: MXFP8 below compute capability 10, --a2a-sms over the compute units): one
    line naming the scenario, where the sweep had stopped after pricing the scenarios before it."""
    from .errors import PiperError, SpecError
    from .search import check_space
    from .sweep import fmt

    for vals, h in specs.items():
        try:
            check_space(model, h, space)
        except PiperError as e:
            if not keys:
                raise
            label = ", ".join(f"{k}={fmt(v)}" for k, v in zip(keys, vals))
            raise SpecError("--vary", label, f"this scenario cannot run the options asked: {e}") from None


def _warn_unread_vary(vary: dict, space, source: str) -> set:
    """Say so, before the sweep, where a varied host field cannot change any scenario: the search
    tries no host offloading, the one thing that reads the host's link and memory. The fields said."""
    host = [k for k in vary if k.startswith("host.")]
    offloads = (max(space.optimizer_offload) > 0 or max(space.offload_layers) > 0
                or any(space.offload_modules))
    if host and not offloads:
        click.echo(f"warning: {source}: --vary {host[0]}: the search tries no host offloading (--optimizer-offload, "
                   "--offload-layers, --offload-modules), so every scenario prices alike", err=True)
        return set(host)
    return set()


def _warn_alike(rows: list[dict], keys: list[str], source: str) -> None:
    """Say so where every value of a varied field prices alike at each GPU count and every other
    field's value: nothing the search prices reads it for these options (a peak of a dtype the
    layouts do not run, an FP8 rate without --fp8), or a step bound elsewhere (the host)."""
    for k in keys[1:]:  # (keys[0]: the GPU count)
        groups: dict = {}
        for r in rows:
            groups.setdefault(tuple(r[j] for j in keys if j != k), set()).add((r["tokens_per_s"], r["layout"]))
        if any(r["fits"] for r in rows) and all(len(g) == 1 for g in groups.values()):
            click.echo(f"warning: {source}: --vary {k}: every value prices the same best plan at the same "
                       "throughput; nothing these options price reads it, or the step is bound elsewhere", err=True)


def _register_optional():
    try:
        from .calibrate import calibrate_cmd
    except ImportError:  # calibrate lands with its own issue
        return
    main.add_command(calibrate_cmd, "calibrate")


main.add_command(validate_cmd, "validate")
_register_optional()

if __name__ == "__main__":  # pragma: no cover
    main()
