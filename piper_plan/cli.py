"""`piper-plan`: click commands only — parse, call, print (formatting lives in report.py)."""
from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import click

from .clitypes import GPU_COUNT, POSITIVE, SEQUENCE, FiniteFloat
from .errors import PiperError


def one_line_errors(fn):
    """Bad input -> one line on stderr, exit 2, no traceback."""

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except PiperError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(e.exit_code)
        except KeyError as e:  # e.g. a dtype missing from the hardware's peak table
            click.echo(f"error: {e.args[0] if e.args else e}", err=True)
            sys.exit(2)

    return wrapper


class _Group(click.Group):
    """Bare `piper-plan --model M --hardware H --gpus N` runs `search`."""

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
    from . import report
    from .specs import bundled_names
    from .specs.registry import is_hardware_spec, load_hardware, load_model, _resolve

    if name in bundled_names("hardware"):
        report.show(report.hardware_detail(load_hardware(name)))
        return
    if name in bundled_names("models") or name.endswith(".json"):
        report.show(report.model_detail(load_model(name)))
        return
    if is_hardware_spec(_resolve(name, "models")):
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
    from .plan import Migration

    return Migration(enabled=kw["migration"], period_steps=kw["migration_period"],
                     threshold=kw["migration_threshold"], planner=kw["migration_planner"],
                     window=kw["migration_window"], max_moves=kw["migration_max_moves"])



# how the training stack runs its kernels: the planner prices each (estimate and search alike)
STACK_OPTIONS = [
        click.option("--kernels", type=click.Choice(["fused", "unfused"]), default="fused", show_default=True,
                     help="fused norm/SwiGLU/routing kernels (Megatron, TE) or eager PyTorch modules (piper-train)"),
        click.option("--expert-gemm", type=click.Choice(["grouped", "multistream", "loop"]), default="grouped",
                     show_default=True, help="local experts' GEMMs as one grouped kernel, one per expert on 4 streams "
                     "(Transformer Engine's default), or one per expert in turn (a Python loop)"),
        click.option("--fp8", type=click.Choice(["none", "current", "mxfp8", "blockwise"]), default="none",
                     show_default=True, help="FP8 GEMMs with bf16 activations (Transformer Engine): per-tensor "
                     "current scaling, MXFP8 block scaling (Blackwell), or DeepSeek-V3's 1x128 / 128x128 blockwise "
                     "scaling; attention, router and LM head stay bf16"),
        click.option("--expert-probs", type=click.Choice(["combine", "activation"]), default="combine",
                     show_default=True, help="where the routing probability scales a token: at the combine, which "
                     "keeps each expert output for its gradient (DeepSpeed-MoE, piper-train), or inside the experts' "
                     "fused activation (Megatron-Core), which keeps none"),
        click.option("--a2a-overlap/--no-a2a-overlap", default=False, show_default=True,
                     help="hide each MoE all-to-all behind another micro-batch's compute (Megatron-Core "
                     "--overlap-moe-expert-parallel-comm)"),
        click.option("--attention-fp8/--no-attention-fp8", default=False, show_default=True,
                     help="fused attention in FP8 (Transformer Engine's fp8_dot_product_attention), at the hardware "
                     "spec's efficiency.attention_fp8 speed-up"),
        click.option("--tp-comm-overlap/--no-tp-comm-overlap", default=False, show_default=True,
                     help="pipeline the tensor-parallel all-gathers and reduce-scatters with the GEMMs beside them "
                     "(Megatron-Core --tp-comm-overlap, Transformer Engine's userbuffers)"),
        click.option("--a2a-sms", type=POSITIVE, default=None,
                     help="SMs an overlapped all-to-all holds (Megatron-Core --moe-hybridep-num-sms); default: the "
                     "hardware spec's efficiency.overlap_comm_units"),
        click.option("--cuda-graphs", default="none", show_default=True,
                     help="what the runtime replays as CUDA graphs, comma-separated (Megatron-Core "
                     "--cuda-graph-scope): attn, mlp, moe, moe_router, moe_preprocess, full_iteration; none: eager. "
                     "Priced on specs that give efficiency.host_op_us"),
        click.option("--pipeline-split", type=click.Choice(["balanced", "even", "account"]), default="balanced",
                     show_default=True, help="how layers split into pipeline chunks: by cost (piper), evenly "
                     "(Megatron-Core's default), or with the embedding and loss counted as one layer each "
                     "(Megatron-Core --account-for-embedding/loss-in-pipeline-split)"),
]

OFFLOAD_HELP = {
    "optimizer": "share of each rank's optimizer state (fp32 master weights, Adam moments) kept and stepped in host "
                 "memory (Megatron-Core --optimizer-cpu-offload --optimizer-offload-fraction); needs the hardware "
                 "spec's host section",
    "layers": "layers of each rank whose saved activations wait in host memory between forward and backward "
              "(Megatron-Core --cpu-offloading-num-layers, NeMo activation_offload_layers); needs the hardware spec's "
              "host section",
}


def _graph_scopes(kw) -> tuple[str, ...]:
    from .cost.batch import GRAPH_SCOPES
    from .errors import LayoutError

    text = kw["cuda_graphs"].strip()
    scopes = () if text in ("", "none") else tuple(x.strip() for x in text.split(","))
    bad = [x for x in scopes if x not in GRAPH_SCOPES]
    if bad:
        raise LayoutError("--cuda-graphs", f"got {bad[0]!r}; expected none or a comma-separated list of "
                          f"{', '.join(GRAPH_SCOPES)}")
    return scopes


def layout_options(fn):
    opts = [
        click.option("--model", "-m", required=True, help="bundled name, model YAML or HF config.json"),
        click.option("--hardware", "-H", "hardware", required=True, help="bundled name or hardware YAML"),
        click.option("--gpus", "-n", type=GPU_COUNT, required=True),
        click.option("--tp", type=POSITIVE, default=1, show_default=True),
        click.option("--cp", type=POSITIVE, default=1, show_default=True,
                     help="context parallel: ranks each sequence is split over (Megatron-Core --context-parallel-size, "
                     "ring attention)"),
        click.option("--pp", type=POSITIVE, default=1, show_default=True),
        click.option("--ep", type=POSITIVE, default=1, show_default=True),
        click.option("--etp", type=POSITIVE, default=1, show_default=True,
                     help="expert tensor parallel: ranks each expert is split over (Megatron-Core "
                     "--expert-tensor-parallel-size; its default when unset is --tp)"),
        click.option("--dp", type=POSITIVE, default=None, help="attention data parallel (default gpus/(tp*cp*pp))"),
        click.option("--mbs", type=POSITIVE, default=1, show_default=True, help="micro-batch size, sequences"),
        click.option("--global-batch", type=POSITIVE, default=None, help="sequences per step (default 4M tokens' worth)"),
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
                     "core_attn, layernorm, mla_up_proj, mlp, moe_act, moe, shared_experts"),
        click.option("--sequence-parallel/--no-sequence-parallel", default=True, show_default=True),
        click.option("--zero", type=click.IntRange(0, 3), default=1, show_default=True),
        click.option("--a2a", type=click.Choice(["flat", "halo", "dedup", "auto"]), default="auto", show_default=True,
                     help="auto: flat and halo (what piper-train runs); dedup: DeepEP / HybridEP token-level exchange"),
        click.option("--placement", type=click.Choice(["packed", "spread"]), default="packed", show_default=True),
        click.option("--routing", default="uniform", show_default=True,
                     help="uniform | zipf[:s] | metrics.jsonl from piper-train"),
        click.option("--attention", type=click.Choice(["flash", "eager"]), default="flash", show_default=True),
        click.option("--dropout/--no-dropout", default=False, show_default=True),
        *STACK_OPTIONS,
        click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32"]), default="bf16", show_default=True),
        click.option("--grad-dtype", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True),
        click.option("--overlap-grad-reduce/--no-overlap-grad-reduce", default=True, show_default=True),
        click.option("--optimizer-offload", type=FiniteFloat(0.0, 1.0), default=0.0, show_default=True,
                     help=OFFLOAD_HELP["optimizer"]),
        click.option("--offload-layers", type=click.IntRange(min=0), default=0, show_default=True,
                     help=OFFLOAD_HELP["layers"]),
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
    return modules


def _warn_histogram(model, routing, source: str) -> None:
    """Say so where a measured histogram is not this model's own: the run's summary names another
    model spec, or it has another count of MoE layers (a routing shape borrowed from another run,
    averaged over its layers)."""
    from .cost.migration import metrics_model
    from .plan import spec_hash

    h = routing.histogram
    ran = metrics_model(source) if h is not None else None
    own = spec_hash(model) if ran is not None else None
    if ran is not None and ran[1] != own:
        click.echo(f"warning: {source}: model_hash: the run trained {ran[0] or 'another spec'} "
                   f"({ran[1]}), not this {model.name} ({own}); its routing is another model's", err=True)
    if h is not None and model.moe is not None and len(h) != model.num_moe_layers and \
            len(h[0]) == model.moe.num_experts:  # (another expert count is an error, raised where it is priced)
        click.echo(f"warning: {source}: tokens_per_expert: {len(h)} MoE layer(s) measured, {model.name} has "
                   f"{model.num_moe_layers}; their average popularity is applied to every layer", err=True)


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


def _check_machine_size(hw, source: str, gpus: int) -> None:
    """Say so where -n is beyond the machine the spec describes (its max_gpus). A warning, not an
    error: a larger machine of the same parts is a fair question (the topology's top level prices it)."""
    if hw.max_gpus and gpus > hw.max_gpus:
        click.echo(f"warning: {source}: max_gpus: the machine has {hw.max_gpus} GPUs; -n {gpus} is priced as a "
                   "larger machine of the same parts", err=True)


def _seq_batch(kw, model) -> tuple[int, int]:
    """--seq (default: the model's) and --global-batch (default: 4M tokens' worth of it)."""
    from .search import default_global_batch

    seq = model.seq_len if kw["seq"] is None else kw["seq"]
    return seq, default_global_batch(seq) if kw["global_batch"] is None else kw["global_batch"]


def _layout_from(kw, model):
    from .errors import LayoutError
    from .layout import Layout

    gpus, tp, cp, pp = kw["gpus"], kw["tp"], kw["cp"], kw["pp"]
    dp = kw["dp"]
    if dp is None:
        if gpus % (tp * cp * pp):
            named = "tp*pp" if cp == 1 else "tp*cp*pp"  # cp named where it is used
            raise LayoutError(f"{named}*dp == gpus", f"{named} = {tp * cp * pp} does not divide {gpus} GPUs")
        dp = gpus // (tp * cp * pp)
    seq, gbs = _seq_batch(kw, model)
    vpp = (2 if kw["schedule"] in ("zbv", "dualpipev", "interleaved") else 1) if kw["vpp"] is None else kw["vpp"]
    modules = _modules(kw["recompute_modules"], "--recompute-modules")
    absent = [x for x, has in (("mla_up_proj", model.mla is not None), ("moe", model.moe is not None),
                               ("moe_act", model.moe is not None),
                               ("shared_experts", bool(model.moe and model.moe.shared_experts))) if x in modules and not has]
    if kw["recompute"] == "selective" and absent:
        raise LayoutError("--recompute-modules", f"{absent[0]} names a part {model.name} does not have")
    return Layout(gpus=gpus, tp=tp, cp=cp, pp=pp, dp=dp, ep=kw["ep"], etp=kw["etp"], vpp=vpp, mbs=kw["mbs"],
                  global_batch=gbs, seq=seq,
                  schedule=kw["schedule"], recompute=kw["recompute"], recompute_layers=kw["recompute_layers"],
                  sequence_parallel=kw["sequence_parallel"],
                  recompute_modules=modules,
                  zero=kw["zero"], a2a="flat" if kw["a2a"] == "auto" else kw["a2a"], placement=kw["placement"],
                  dtype=kw["dtype"], attention_kernel=kw["attention"], dropout=kw["dropout"],
                  fused_kernels=kw["kernels"] == "fused", expert_gemm=kw["expert_gemm"],
                  a2a_overlap=kw["a2a_overlap"], a2a_sms=kw["a2a_sms"], fp8=kw["fp8"], cuda_graphs=_graph_scopes(kw),
                  tp_comm_overlap=kw["tp_comm_overlap"], attention_fp8=kw["attention_fp8"],
                  expert_probs=kw["expert_probs"], pipeline_split=kw["pipeline_split"], grad_dtype=kw["grad_dtype"],
                  overlap_grad_reduce=kw["overlap_grad_reduce"], optimizer_offload=kw["optimizer_offload"],
                  offload_layers=kw["offload_layers"])


@main.command()
@layout_options
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="also write plan.json for this layout")
@one_line_errors
def estimate(as_json, output, **kw):
    """Estimate one layout: memory per stage, time breakdown, throughput."""
    from . import report
    from .evaluate import build_plan, estimate_layout, parse_routing
    from .layout import degrees_label
    from .plan import write_plan
    from .specs import load_hardware, load_model

    model, hw = load_model(kw["model"]), load_hardware(kw["hardware"])
    _check_machine_size(hw, kw["hardware"], kw["gpus"])
    lay = _layout_from(kw, model)
    routing = parse_routing(kw["routing"])
    _warn_histogram(model, routing, kw["routing"])
    migration = _migration_from(kw)
    routing.migration = migration if migration.enabled else None
    est = estimate_layout(model, hw, lay, routing)
    if kw["a2a"] == "auto" and model.moe is not None and lay.ep > 1:
        alt_lay = lay.model_copy(update={"a2a": "halo"})
        alt = estimate_layout(model, hw, alt_lay, routing)
        if alt.step_time_s[0] < est.step_time_s[0]:
            lay, est = alt_lay, alt
    row = est.row(0)
    row["layout"] = lay.model_dump()
    if output:
        write_plan(build_plan(model, hw, lay, est, 0, routing, migration), output)
    if as_json:
        click.echo(json.dumps(row, indent=2))
        return
    title = (f"{model.name} on {lay.gpus} × {hw.name}: {degrees_label(lay)} "
             f"mbs{lay.mbs} M{lay.microbatches} {lay.schedule} recompute={lay.recompute} zero{lay.zero} a2a={lay.a2a}")
    report.show(report.estimate_tables(row, title))
    _show_track_record(model, hw)


# ---- search ---------------------------------------------------------------------------
def search_options(fn):
    opts = [
        click.option("--model", "-m", required=True, help="bundled name, model YAML or HF config.json"),
        click.option("--hardware", "-H", "hardware", required=True, help="bundled name or hardware YAML"),
        click.option("--global-batch", type=POSITIVE, default=None, help="sequences per step (default 4M tokens' worth)"),
        click.option("--seq", type=SEQUENCE, default=None, help="sequence length (default: the model's)"),
        click.option("--routing", default="uniform", show_default=True, help="uniform | zipf[:s] | metrics.jsonl"),
        click.option("--a2a", type=click.Choice(["flat", "halo", "dedup", "auto"]), default="auto", show_default=True,
                     help="auto: flat and halo (what piper-train runs); dedup: DeepEP / HybridEP token-level exchange"),
        *MIGRATION_OPTIONS,
        click.option("--headroom-gib", type=FiniteFloat(0.0), default=0.0, show_default=True,
                     help="memory kept free on top of the hardware's reserve"),
        click.option("--ep-in-domain", default=None, help="keep each EP group inside this topology level (paper rule)"),
        click.option("--cp", "cps", default="auto", show_default=True,
                     help="context-parallel degrees to try, comma-separated (e.g. 1,2,4): each sequence split over "
                     "cp ranks (ring attention); auto: 1, 2, 4 and 8 from 8K-token sequences on (1 below, and for "
                     "piper-train, which keeps sequences whole)"),
        click.option("--etp", "etps", default="1", show_default=True,
                     help="expert-tensor-parallel degrees to try, comma-separated (e.g. 1,2,4); 1 keeps experts "
                     "whole, as piper-train runs them"),
        click.option("--optimizer-offload", default="0", show_default=True,
                     help="shares to try, comma-separated (e.g. 0,1), each a choice: " + OFFLOAD_HELP["optimizer"]),
        click.option("--offload-layers", default="0", show_default=True,
                     help="counts to try, comma-separated (e.g. 0,20,40), each a choice: " + OFFLOAD_HELP["layers"]),
        click.option("--recompute-layers", "recompute_layers", default="0", show_default=True,
                     help="layers of each pipeline chunk that full recompute re-runs, comma-separated, each a choice "
                     "(e.g. 0,1,2,4; Megatron-Core --recompute-method block --recompute-num-layers); 0: every layer"),
        click.option("--schedules", default="gpipe,1f1b,interleaved,zbv,dualpipev", show_default=True),
        click.option("--selective", "selective", multiple=True, default=("core_attn",), show_default=True,
                     help="a set of modules selective recompute re-runs, comma-separated (Megatron-Core "
                     "--recompute-modules: core_attn, layernorm, mla_up_proj, mlp, moe_act, moe, shared_experts); "
                     "repeat to try several sets, each a choice of its own (piper-train runs core_attn only)"),
        click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32"]), default="bf16", show_default=True),
        click.option("--runtime", type=click.Choice(["any", "piper-train"]), default="any", show_default=True,
                     help="piper-train: only plans the bundled runtime runs, priced as it runs them (eager modules, "
                     "ZeRO 0-2, gradients reduced after the pipeline)"),
        *STACK_OPTIONS,
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def _ints(text: str, option: str, least: int = 1) -> tuple[int, ...]:
    """A comma-separated list of integers of at least `least` (1: degrees; 0: counts), checked."""
    from .errors import LayoutError

    parts = [x.strip() for x in text.split(",")]
    if not all(x.isdigit() and int(x) >= least for x in parts):
        what = "positive integers" if least >= 1 else "whole numbers"
        raise LayoutError(option, f"got {text!r}; expected a comma-separated list of {what}")
    return tuple(sorted({int(x) for x in parts}))


def _fractions(text: str, option: str) -> tuple[float, ...]:
    """A comma-separated list of fractions from 0 to 1, checked."""
    from .errors import LayoutError

    try:
        vals = tuple(sorted({float(x) for x in text.split(",")}))
    except ValueError:
        vals = ()
    if not vals or not all(0.0 <= v <= 1.0 for v in vals):
        raise LayoutError(option, f"got {text!r}; expected a comma-separated list of fractions from 0 to 1")
    return vals


def _cps(kw, seq: int) -> tuple[int, ...]:
    """--cp's degrees: as listed, or auto (search.auto_cps; 1 alone for piper-train)."""
    from .search import auto_cps

    if kw["cps"].strip() == "auto":
        return (1,) if kw.get("runtime") == "piper-train" else auto_cps(seq)
    return _ints(kw["cps"], "--cp")


def _space(kw, model, gpus):
    from .search import SearchSpace, for_runtime

    seq, gbs = _seq_batch(kw, model)
    a2as = ("flat", "halo") if kw["a2a"] == "auto" else (kw["a2a"],)
    selective = tuple(_modules(text, "--selective") for text in kw["selective"])
    sp = SearchSpace(selective=selective, gpus=gpus, global_batch=gbs, seq=seq, dtype=kw["dtype"], a2as=a2as,
                     schedules=tuple(s.strip() for s in kw["schedules"].split(",") if s.strip()),
                     ep_in_domain=kw["ep_in_domain"], fused_kernels=kw["kernels"] == "fused",
                     etps=_ints(kw["etps"], "--etp"), cps=_cps(kw, seq), expert_gemm=kw["expert_gemm"],
                     a2a_overlap=kw["a2a_overlap"], a2a_sms=kw["a2a_sms"],
                     tp_comm_overlap=kw["tp_comm_overlap"], attention_fp8=kw["attention_fp8"],
                     fp8=kw["fp8"], expert_probs=kw["expert_probs"],
                     cuda_graphs=_graph_scopes(kw), pipeline_split=kw["pipeline_split"],
                     optimizer_offload=_fractions(kw["optimizer_offload"], "--optimizer-offload"),
                     offload_layers=_ints(kw["offload_layers"], "--offload-layers", least=0),
                     recompute_layers=_ints(kw["recompute_layers"], "--recompute-layers", least=0))
    return for_runtime(sp, kw.get("runtime", "any"), model)


def _load_for_search(kw):
    from .errors import SpecError
    from .evaluate import parse_routing
    from .specs import load_hardware, load_model

    model, hw = load_model(kw["model"]), load_hardware(kw["hardware"])
    if kw["ep_in_domain"] and kw["ep_in_domain"] not in [lv.name for lv in hw.topology]:
        raise SpecError(kw["hardware"], "topology", f"no level named {kw['ep_in_domain']!r} for --ep-in-domain")
    bad = [s.strip() for s in kw["schedules"].split(",") if s.strip() not in
           ("gpipe", "1f1b", "interleaved", "zbv", "dualpipev")]
    if bad:
        raise SpecError("--schedules", repr(bad[0]), "expected a comma-separated list of gpipe, 1f1b, interleaved, "
                        "zbv or dualpipev")
    routing = parse_routing(kw["routing"])
    _warn_histogram(model, routing, kw["routing"])
    migration = _migration_from(kw)
    routing.migration = migration if migration.enabled else None
    return model, hw, routing


@main.command("search")
@search_options
@click.option("--gpus", "-n", type=GPU_COUNT, required=True)
@click.option("--objective", type=click.Choice(["throughput", "mfu", "memory"]), default="throughput", show_default=True)
@click.option("--top", "top_k", type=POSITIVE, default=10, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="write the best layout as plan.json")
@one_line_errors
def search_cmd(gpus, objective, top_k, as_json, output, **kw):
    """Find the best layouts for a model on N GPUs of a machine."""
    import time

    from . import report
    from .evaluate import build_plan
    from .plan import write_plan
    from .search import diagnose, search

    t0 = time.perf_counter()
    model, hw, routing = _load_for_search(kw)
    _check_machine_size(hw, kw["hardware"], gpus)
    sp = _space(kw, model, gpus)
    res = search(model, hw, sp, routing, objective, kw["headroom_gib"])
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
        write_plan(build_plan(model, hw, res.batch.layout(i), res.est, i, routing, _migration_from(kw)), output)
    if as_json:
        click.echo(json.dumps({"evaluated": res.evaluated, "fitting": int(len(res.order)), "rejected": res.rejected,
                               "wall_s": wall, "search_cpu_s": res.cpu_s, "top": rows, "infeasible": why}, indent=2))
    else:
        report.show([report.search_table(rows, f"{model.name} on {gpus} × {hw.name} — {res.evaluated:,} layouts "
                                               f"evaluated in {wall:.2f} s, {len(res.order):,} fit")])
        report.show_rejections(res.rejected, why)
        _show_track_record(model, hw)
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
    from .plan import read_plan

    report.show(report.plan_tables(read_plan(plan_path)))


@main.command("schema")
def schema_cmd():
    """Print plan.json's JSON Schema."""
    from .plan import json_schema

    click.echo(json.dumps(json_schema(), indent=2))


@main.command("sweep")
@search_options
@click.option("--gpus", "-n", required=True, help="comma-separated GPU counts, e.g. 256,512,1024")
@click.option("--vary", multiple=True, help="FIELD=v1,v2 (dotted hardware path or alias nic_gbps, hbm_gib, ...)")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), help="write the table as CSV")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="write the table as JSON")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="PNG of throughput and MFU")
@one_line_errors
def sweep_cmd(gpus, vary, csv_path, json_path, plot_path, **kw):
    """What-if: best plan per hardware scenario and GPU count."""
    import csv
    import io

    from rich.progress import Progress
    from rich.table import Table

    from . import report
    from .errors import SpecError
    from .plan import atomic_write_text
    from .sweep import plot, run_sweep, parse_vary

    model, hw, routing = _load_for_search(kw)
    parts = [x.strip() for x in gpus.split(",")]
    if not all(x.isdigit() and 1 <= int(x) <= GPU_COUNT.max for x in parts) or len(set(map(int, parts))) != len(parts):
        raise SpecError("--gpus", repr(gpus), "expected a comma-separated list of distinct positive GPU counts")
    counts = [int(x) for x in parts]
    vary_d = parse_vary(list(vary))
    space = _space(kw, model, counts[0])
    n = len(counts)
    for v in vary_d.values():
        n *= len(v)
    with Progress(transient=True, disable=n < 4) as prog:
        task = prog.add_task("sweeping", total=n)
        rows = run_sweep(model, hw, counts, vary_d, space, routing, lambda: prog.advance(task))
    keys = ["gpus", *vary_d]
    t = Table(title=f"{model.name} on {hw.name}: best plan per scenario")
    for c in keys + ["tokens/s", "MFU", "layout"]:
        t.add_column(c)
    for r in rows:
        t.add_row(*[f"{r[k]:g}" for k in keys], f"{r['tokens_per_s']:,.0f}", f"{r['mfu']:.1%}", r["layout"])
    report.show([t])
    if csv_path:
        buf = io.StringIO()
        fields = sorted({k for r in rows for k in r}, key=lambda k: (k not in keys, k))
        w = csv.DictWriter(buf, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
        atomic_write_text(csv_path, buf.getvalue())
    if json_path:
        atomic_write_text(json_path, json.dumps(rows, indent=2))
    if plot_path:
        plot(rows, list(vary_d), plot_path)


@main.command("validate")
@click.option("--table", "table_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="a csv of your own measurements in the published table's schema (../shared/validation/"
              "README.md: id, group, model, hardware, gpus, seq, metric, value and the layout columns); a model "
              "without a bundled spec is built from its architecture columns (piper_plan/validate_rows.py). "
              "Default: the bundled validation/published.csv")
@click.option("--group", default=None, help="only this group (e.g. narayanan2021-table1)")
@click.option("--json", "as_json", is_flag=True)
@click.option("--explain", "explain_id", default=None, help="one row in full: its settings, predicted breakdown "
              "and what the model misses per layer and micro-batch")
@click.option("--sensitivity", is_flag=True, help="the errors per kind again with each family of hardware "
              "efficiencies (and host and launch costs) scaled x0.8 and x1.25, and with all compute efficiencies "
              "scaled together (about 16 passes over the rows)")
@click.option("--batch-scan", is_flag=True, help="the planner's-choice rows again at 1, 2, 4, 8 and 16 sequences "
              "per GPU: how far the global batch their sources do not publish moves each prediction")
@click.option("--blind", is_flag=True, help="the bundled rows priced as a table that states no recipe and no spec "
              "would be: each row's recipe inferred from the rows of other setups only (piper_plan/"
              "validate_blind.py), and beside it the errors with no recipe at all")
@click.option("--residuals", is_flag=True, help="where the errors cluster: the throughput rows' signed errors by "
              "one recipe setting at a time (and by model crossed with one), rows of one setup counted once, each "
              "level t-tested for a bias at a 5 % false-discovery rate (piper_plan/validate_residuals.py)")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="with --json: write the JSON to this file (atomically) instead of printing it")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="also draw the priced rows to this PNG: predicted against published with the ±20 / ±35 %% "
              "bands, and the signed throughput errors of the dense and MoE rows")
@one_line_errors
def validate_cmd(table_path, group, as_json, explain_id, sensitivity, batch_scan, blind, residuals, output,
                 plot_path):
    """Predicted vs published measurements, with errors per group."""
    from rich.table import Table

    from . import report
    from .files import check_writable
    from .validate import check_group, explain, run, summary

    # one answer a call: a mode other than the plain pass, and --blind / --plot only beside that pass
    modes = [flag for flag, on in (("--explain", explain_id), ("--sensitivity", sensitivity),
                                   ("--batch-scan", batch_scan), ("--residuals", residuals)) if on]
    if len(modes) > 1:
        raise click.UsageError(f"{' and '.join(modes)}: one of them a call")
    if blind and (table_path or modes):
        raise click.UsageError(f"--blind prices the bundled table on its own: not with {(modes or ['--table'])[0]}")
    if plot_path is not None and modes:
        raise click.UsageError(f"--plot draws the plain pass over the table: not with {modes[0]}")
    if output is not None and not as_json:
        raise click.UsageError("-o writes the JSON output: give --json with it")
    for path, what in ((output, "-o"), (plot_path, "--plot")):
        if path is not None:
            check_writable(path, what)
    emit = functools.partial(_emit_json, output=output)
    if group is not None:
        check_group(group, table_path)
    if residuals:
        _show_residuals(group, as_json, table_path, emit)
        return
    if sensitivity:
        _show_sensitivity(group, as_json, table_path, emit)
        return
    if batch_scan:
        _show_batch_scan(group, as_json, table_path, emit)
        return
    if explain_id:
        d = explain(explain_id, table_path)
        if as_json:
            emit(d)
            return
        t = Table(title=f"{explain_id}: {d['metric']} published {d['published']:g}, predicted {d['predicted']:.4g}")
        t.add_column("item")
        t.add_column("value")
        for k, v in d.get("layout", {}).items():
            t.add_row(f"layout.{k}", str(v))
        for k, v in d.get("time_breakdown_s", {}).items():
            t.add_row(f"time.{k} (s)", f"{v:.4g}")
        for k in ("measured_step_time_s", "predicted_ms_per_layer_microbatch", "missing_ms_per_layer_microbatch"):
            if k in d:
                t.add_row(k, f"{d[k]:.4g}")
        t.add_row("source", d["source"])
        report.show([t])
        click.echo(f"notes: {d['notes']}")
        return

    if blind:
        from .validate_blind import blind_run

        res, bare = blind_run(group)[0], summary(blind_run(group, infer=False)[0])["kinds"]
        summ, checks = summary(res), None
    else:
        res, bare = run(group, table_path), None
        summ = summary(res)
        checks = _bundled_checks() if table_path is None else None  # they check the bundled specs, not a table
    if plot_path is not None:
        from .validate_plot import plot

        plot(res, plot_path, f"piper-plan validate{' --blind' if blind else ''}: {table_path or 'bundled table'}"
                             f"{f', group {group}' if group else ''}")
    if as_json:
        extra = {"no_recipe_inferred": bare} if blind else {}
        nan = lambda x: None if x != x else x  # noqa: E731  (nothing fits: JSON has no NaN)
        emit({"rows": [dict(r.__dict__, predicted=nan(r.predicted), error_pct=nan(r.error_pct)) for r in res],
              **summ, **(checks or {}), **extra})
        return
    t = Table(title="predicted vs published")
    for c in ("id", "metric", "published", "predicted", "error", "missed ms/layer·µb", "layout"):
        t.add_column(c)
    for r in res:
        gap = r.missing_ms_per_layer_microbatch
        t.add_row(r.id + (" (fit)" if r.fit else ""), r.metric, f"{r.published:g}",
                  "-" if r.predicted != r.predicted else f"{r.predicted:.4g}", _pct(r.error_pct, "+"),
                  "" if gap is None else f"{gap:+.2f}", r.layout)
    g = Table(title="per group (out-of-sample)")
    for c in ("group", "rows", "MAPE", "max |err|", "Kendall tau"):
        g.add_column(c)
    for name, d in summ["groups"].items():
        g.add_row(name, str(d["rows"]), _pct(d["mape"]), _pct(d["max_abs_pct"]),
                  ", ".join(f"{k} {v:.2f}" for k, v in d.get("kendall_tau", {}).items()))
    k = Table(title="against the targets")
    for c in ("kind", "rows", "MAPE", "target", "max |err|", "target"):
        k.add_column(c)
    labels = {"moe": "moe (all rows)", "moe_named_sources": "moe: Megatron-Bridge, X-MoE, Piper",
              "dense": "dense (all rows)", "dense_named_sources": "dense: Narayanan, Korthikanti (A100)"}
    for name, d in summ["kinds"].items():
        k.add_row(labels.get(name, name), str(d["rows"]), _pct(d["mape"]), f"≤{d['target_mape']:g}%",
                  _pct(d["max_abs_pct"]), f"≤{d['target_max']:g}%")
    report.show([t, g, k])
    fitted = [r for r in res if r.fit]
    if fitted:
        click.echo("in-sample (a hardware figure was set from the row or its run; kept out of the group and target "
                   "figures): " + ", ".join(f"{r.id} {_pct(r.error_pct, '+')}" for r in fitted))
    for field, said in (("built_on", "models built from the table's architecture columns on"),
                        ("hardware_as", "hardware read as the bundled")):
        by_spec = {}
        for r in res:
            if getattr(r, field):
                by_spec.setdefault(getattr(r, field), []).append(r.id)
        for spec, ids in by_spec.items():
            click.echo(f"{said} {spec}: rows {', '.join(ids)}")
    taken = [f"{r.id} <- {r.recipe_from}" for r in res if r.recipe_from]
    if taken:
        click.echo("recipe columns (dispatcher, overlap, graphs, recompute modules, split, ...) taken from the "
                   "nearest bundled row of the same software stack (its twin of the same setup, else the same "
                   "system, publication, model, precision, release: piper_plan/validate_recipes.py): "
                   + ", ".join(taken))
    if bare is not None:
        click.echo("blind: every bundled row without its recipe and spec columns, its recipe inferred from the rows "
                   "of other setups only. With no recipe at all: " + "; ".join(
                       f"{labels.get(k, k)} MAPE {_pct(d['mape'])}, {d['within_target_max']} of {d['rows']} within "
                       f"{d['target_max']:g}%" for k, d in bare.items()))
    if plot_path is not None:
        click.echo(f"wrote {plot_path}")
    for name, d in summ["kinds"].items():  # the rows a target's max misses, by name
        if d["beyond_target_max"]:
            worst_first = sorted(d["beyond_target_max"].items(), key=lambda x: -abs(x[1]))
            rows = ", ".join(f"{i} {e:+.1f}%" for i, e in worst_first)
            click.echo(f"beyond the {d['target_max']:g}% max, {labels.get(name, name)}: {rows}")
        if d["unpriced"]:
            click.echo(f"not priced (nothing fits though the source ran it, or no model or hardware spec: the "
                       f"layout column says which), {labels.get(name, name)}: "
                       f"{', '.join(d['unpriced'])}")
    if checks is not None:
        _show_bundled_checks(checks)
    for size, d in summ["fig13_ratio"].items():
        click.echo(f"Fig. 13 {size}: predicted Piper/X-MoE {d['predicted']:.2f} (paper {d['paper']:.2f})")
    mem = summ["published_runs_memory"]
    if mem["rows"]:
        over = "; ".join(f"{o['id']} {o['peak_gib']:.1f} > {o['device_gib']:g} GiB" for o in mem["over"])
        click.echo(f"Memory of the published runs: {mem['rows'] - len(mem['over'])} of {mem['rows']} layouts fit "
                   f"the device as predicted (each of them ran)" + (f"; over: {over}" if over else ""))


def _bundled_checks() -> dict:
    """The kernel, all-to-all, MoE-layer and full-model checks of the bundled specs against
    the bundled measurement tables (validate_kernels, validate_bounds), as validate --json has them."""
    from .validate_bounds import full_model_bounds
    from .validate_kernels import (a2a_check, b200_gemm_checks, gemm_check, implied_gemm, moe_layer_check,
                                   rccl_node_check, te_gemm_check)

    return {"gemm_h100_xla": gemm_check(), "gemm_b200_xla": b200_gemm_checks(), "gemm_te_b300": te_gemm_check(),
            "a2a_mcore_table7": a2a_check(), "a2a_rccl_mi250x_node": rccl_node_check(),
            "moe_layer_piper_frontier": {"rows": moe_layer_check(), "implied_gemm": implied_gemm()},
            "full_models_piper_frontier": full_model_bounds()}


def _pct(x, sign: str = "") -> str:
    """A percentage for the tables; "-" where there is none (no priced row, nothing fits)."""
    return "-" if x is None or x != x else f"{x:{sign}.1f}%"


def _show_bundled_checks(c: dict) -> None:
    from rich.table import Table

    from . import report

    gemm, b200, te_gemm, a2a = c["gemm_h100_xla"], c["gemm_b200_xla"], c["gemm_te_b300"], c["a2a_mcore_table7"]
    rccl, layer, bounds = c["a2a_rccl_mi250x_node"], c["moe_layer_piper_frontier"], c["full_models_piper_frontier"]
    x = Table(title="GEMM kernel model vs measured GEMMs (OpenXLA's matmul tables, 375 shapes each: "
                    "H100 bf16; B200 bf16 and FP8)")
    for c in ("GPU", "dtype", "measured time", "shapes", "predicted/measured median", "10-90%",
              "sum predicted/sum measured"):
        x.add_column(c)
    for gpu, dt, table in (("H100", "bf16", gemm), ("B200", "bf16", b200["bf16"]), ("B200", "fp8", b200["fp8"])):
        for label, d in table.items():
            x.add_row(gpu, dt, label, str(d["shapes"]), f"{d['median']:.2f}", f"{d['p10']:.2f}-{d['p90']:.2f}",
                      f"{d['sum_ratio']:.2f}")
    b = Table(title="GEMM kernel model vs Transformer Engine's B300 GEMM benchmark (hidden 4096, FFN 16384, "
                    "15,872 tokens; the Blackwell plateaus are set from its kernel-only layer totals)")
    for c in ("GEMM", "pass", "recipe", "timed", "measured ms", "predicted ms", "error"):
        b.add_column(c)
    for r in te_gemm:
        b.add_row(r["op"], r["pass"], r["recipe"], "kernel only" if r["mode"] == "prequant" else "autocast (no quant)",
                  f"{r['measured_ms']:.3f}", f"{r['predicted_ms']:.3f}", f"{100 * (r['ratio'] - 1):+.0f}%")
    a = Table(title="all-to-all model vs Megatron-Core's measured dispatch (MoE report Table 7: DeepSeek-V3 "
                    "shapes, 4096 bf16 tokens a rank assumed)")
    for c in ("hardware", "dispatcher", "EP", "scale-up domains", "measured dispatch us", "predicted us", "error"):
        a.add_column(c)
    for r in a2a:
        a.add_row(r["hardware"], "NCCL all-to-all (flat)" if r["backend"] == "nccl" else "HybridEP (token-level)",
                  str(r["ep"]), f"{r['domains']:g}", f"{r['dispatch_us']:g}", f"{r['predicted_us']:.0f}",
                  f"{100 * (r['predicted_us'] / r['dispatch_us'] - 1):+.0f}%")
    rc = Table(title="all-to-all model vs RCCL's all-to-all on one MI250X node (8 GCDs of LUMI-G, Frontier's node; "
                     "OSU osu_xccl_alltoall, median of 5 runs)")
    for c in ("bytes to each peer", "measured us", "range", "predicted us", "error"):
        rc.add_column(c)
    for r in rccl:
        rc.add_row(f"{r['bytes_per_peer']:,.0f}", f"{r['measured_us']:g}", f"{r['min_us']:g}-{r['max_us']:g}",
                   f"{r['predicted_us']:.1f}", f"{100 * (r['predicted_us'] / r['measured_us'] - 1):+.0f}%")
    ml = Table(title="MoE block model vs Piper's single MoE layer on one Frontier node (brief §5: router, experts "
                     "and the node's all-to-all, EP 8, 4096 tokens a GCD assumed)")
    for c in ("model", "published TFLOPS", "predicted", "error", "plateau fit"):
        ml.add_column(c)
    for r in layer["rows"]:
        p = r["predicted"]
        ml.add_row(r["model"], f"{r['published']:g}", "no bundled spec" if p is None else f"{p:.1f}",
                   "" if p is None else f"{100 * (p / r['published'] - 1):+.0f}%",
                   "" if p is None else "in-sample" if r["fit"] else "out-of-sample")
    fb = Table(title="Piper's full-model runs on Frontier (brief §5; GPU counts and layouts not published) against "
                     "the model's best plan over 8-1,024 GCDs in Piper's PP x EP mesh: a run reached each figure, so "
                     "the best plan must")
    for c in ("model", "published TFLOPS", "best predicted", "GCDs", "layout", "reaches"):
        fb.add_column(c)
    for r in bounds:
        fb.add_row(r["model"], f"{r['published']:g}", f"{r['best_predicted']:.1f}", str(r["gcds"]), r["layout"],
                   "yes" if r["reaches"] else "NO")
    report.show([x, b, a, rc, ml])
    click.echo(f"GEMM plateau at which those rates agree on average: {layer['implied_gemm']:.3f} of peak "
               f"(the spec: {layer['rows'][0]['gemm']:g}; validation/README.md, Frontier's two GEMM sources)")
    report.show([fb])


def _emit_json(obj, output=None) -> None:
    """Print a JSON answer, or write it to `output` atomically (a failed write leaves the old file)."""
    text = json.dumps(obj, indent=2)
    if output is None:
        click.echo(text)
        return
    from .files import atomic_write_text

    atomic_write_text(output, text + "\n")
    click.echo(f"wrote {output}")


def _show_sensitivity(group, as_json, path=None, emit=_emit_json):
    from rich.table import Table

    from . import report
    from .validate_sensitivity import COMPUTE, compute_scan, sensitivity

    rows = sensitivity(group=group, path=path)
    # the scan's x1 is the unscaled specs, priced already as the first row
    rows += compute_scan(factors=(0.6, 0.7, 0.8, 0.9), group=group, path=path) + [{**rows[0], "family": "+".join(COMPUTE)}]
    if as_json:
        emit(rows)
        return
    kinds = [k for k in ("dense", "dense_named_sources", "memory", "moe", "moe_named_sources") if k in rows[0]]
    t = Table(title="errors with the hardware efficiencies scaled (factor > 1: faster kernels / links)")
    for c in ("efficiencies", "factor", *(f"{k} MAPE / max / within" for k in kinds)):
        t.add_column(c)
    for r in rows:
        t.add_row(r["family"], f"{r['factor']:g}", *(f"{_pct(r[k]['mape'])} / {_pct(r[k]['max_abs_pct'])} / "
                                                     f"{r[k]['within_target_max']} of {r[k]['rows']}" for k in kinds))
    report.show([t])


def _show_residuals(group, as_json, path=None, emit=_emit_json):
    from rich.table import Table

    from . import report
    from .validate import run_with_rows
    from .validate_residuals import BIAS_PCT, MAX_Q, MIN_SETUPS, residuals

    d = residuals(*run_with_rows(group, path))
    if as_json:
        emit(d)
        return
    if not d["setups"]:
        click.echo("no priced throughput rows (memory rows and in-sample rows are left out): nothing to group")
        return
    shown = [s for s in d["levels"] if s["q"] < 4 * MAX_Q]
    t = Table(title=f"where the errors cluster: {d['setups']} setups ({d['rows']} rows), mean error "
                    f"{_pct(d['overall_pct'], '+')}; {len(d['levels'])} levels of {MIN_SETUPS}+ setups tested, those "
                    f"with q < {4 * MAX_Q:g} shown (+: the model too fast)")
    for c in ("setting", "level", "setups (rows)", "mean error", "spread (1 sd)", "q", f"bias (q < {MAX_Q:g}, "
              f"|mean| > {BIAS_PCT:g}%)"):
        t.add_column(c)
    for s in shown:
        t.add_row(s["factor"], s["level"], f"{s['setups']} ({s['rows']})", _pct(s["mean_pct"], "+"),
                  _pct(s["sd_pct"]), f"{s['q']:.3f}", "yes" if s["bias"] else "")
    report.show([t])
    if d["trends"]:
        tr = Table(title="trends: Spearman's rho of the setups' errors against a numeric setting (+: the model "
                         "grows too fast as it grows)")
        for c in ("setting", "setups", "rho", "q", f"trend (q < {MAX_Q:g})"):
            tr.add_column(c)
        for x in d["trends"]:
            tr.add_row(x["setting"], str(x["setups"]), f"{x['rho']:+.2f}", f"{x['q']:.3f}", "yes" if x["trend"] else "")
        report.show([tr])
    for s in d["levels"]:  # the setups behind each bias, by their first row (all in --json)
        if s["bias"]:
            more = f" and {len(s['ids']) - 6} more" if len(s["ids"]) > 6 else ""
            click.echo(f"{s['level']}: {', '.join(s['ids'][:6])}{more}")


def _show_batch_scan(group, as_json, path=None, emit=_emit_json):
    from rich.table import Table

    from . import report
    from .validate_batch import PER_GPU, batch_scan

    rows = batch_scan(group=group, path=path)
    if as_json:
        emit(rows)
        return

    def cell(pred, pub):
        return "nothing fits" if pred is None else f"{pred:.1f} ({100 * (pred / pub - 1):+.0f}%)"

    t = Table(title="planner's-choice rows at other global batches (model TFLOPS per GPU, error against the "
                    "published figure; the sources publish no batch, validate uses the default 4M tokens)")
    for c in ("id", "GPUs", "published", "default batch", *(f"{k} seq/GPU" for k in PER_GPU), "published in range"):
        t.add_column(c)
    for r in rows:
        d = r["default"]
        t.add_row(r["id"], str(r["gpus"]), f"{r['published']:g}",
                  f"{d['global_batch']}: {cell(d['predicted'], r['published'])}",
                  *(cell(s["predicted"], r["published"]) for s in r["scan"]), "yes" if r["inside"] else "no")
    tables = [t]
    rel = [r for r in rows if "relative" in r]
    if rel:
        w = Table(title="weak scaling: each run's TFLOPS per GPU over its series' smallest run's, at the same "
                        "sequences per GPU (the batch the runs share cancels)")
        for c in ("id", "GPUs", "over", "published", *(f"{k} seq/GPU" for k in PER_GPU)):
            w.add_column(c)
        for r in rel:
            x = r["relative"]
            w.add_row(r["id"], str(r["gpus"]), x["to"], f"{x['published']:.3f}",
                      *("-" if v is None else f"{v:.3f} ({100 * (v / x['published'] - 1):+.0f}%)"
                        for v in x["predicted"]))
        tables.append(w)
    report.show(tables)


def _register_optional():
    try:
        from .calibrate import calibrate_cmd
    except ImportError:  # calibrate lands with its own issue
        return
    main.add_command(calibrate_cmd, "calibrate")


_register_optional()

if __name__ == "__main__":  # pragma: no cover
    main()
