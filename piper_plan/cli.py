"""`piper-plan`: click commands only — parse, call, print (formatting lives in report.py)."""
from __future__ import annotations

import functools
import json
import sys

import click

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
    from .specs.registry import load_hardware, load_model, read_yaml, _resolve

    if name in bundled_names("hardware"):
        report.show(report.hardware_detail(load_hardware(name)))
        return
    if name in bundled_names("models") or name.endswith(".json"):
        report.show(report.model_detail(load_model(name)))
        return
    data = read_yaml(_resolve(name, "models"))
    report.show(report.hardware_detail(load_hardware(name)) if "accelerator" in data
                else report.model_detail(load_model(name)))


# ---- one layout ----------------------------------------------------------------------
def layout_options(fn):
    opts = [
        click.option("--model", "-m", required=True, help="bundled name, model YAML or HF config.json"),
        click.option("--hardware", "-H", "hardware", required=True, help="bundled name or hardware YAML"),
        click.option("--gpus", "-n", type=int, required=True),
        click.option("--tp", type=int, default=1, show_default=True),
        click.option("--pp", type=int, default=1, show_default=True),
        click.option("--ep", type=int, default=1, show_default=True),
        click.option("--dp", type=int, default=None, help="attention data parallel (default gpus/(tp*pp))"),
        click.option("--mbs", type=int, default=1, show_default=True, help="micro-batch size, sequences"),
        click.option("--global-batch", type=int, default=None, help="sequences per step (default 4M tokens' worth)"),
        click.option("--seq", type=int, default=None, help="sequence length (default: the model's)"),
        click.option("--schedule", type=click.Choice(["gpipe", "1f1b", "interleaved", "zbv", "dualpipev"]), default="1f1b",
                     show_default=True),
        click.option("--vpp", type=int, default=None, help="chunks per rank (interleaved; zbv/dualpipev use 2)"),
        click.option("--recompute", type=click.Choice(["none", "selective", "full"]), default="none", show_default=True),
        click.option("--sequence-parallel/--no-sequence-parallel", default=True, show_default=True),
        click.option("--zero", type=click.IntRange(0, 3), default=1, show_default=True),
        click.option("--a2a", type=click.Choice(["flat", "halo", "auto"]), default="auto", show_default=True),
        click.option("--placement", type=click.Choice(["packed", "spread"]), default="packed", show_default=True),
        click.option("--routing", default="uniform", show_default=True,
                     help="uniform | zipf[:s] | metrics.jsonl from piper-train"),
        click.option("--attention", type=click.Choice(["flash", "eager"]), default="flash", show_default=True),
        click.option("--dropout/--no-dropout", default=False, show_default=True),
        click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32"]), default="bf16", show_default=True),
        click.option("--grad-dtype", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True),
        click.option("--overlap-grad-reduce/--no-overlap-grad-reduce", default=True, show_default=True),
        click.option("--migration/--no-migration", default=False, show_default=True,
                     help="expert migration keeps the placement balanced"),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def _layout_from(kw, model):
    from .errors import LayoutError
    from .layout import Layout

    gpus, tp, pp = kw["gpus"], kw["tp"], kw["pp"]
    dp = kw["dp"]
    if dp is None:
        if gpus % (tp * pp):
            raise LayoutError("tp*pp*dp == gpus", f"tp*pp = {tp * pp} does not divide {gpus} GPUs")
        dp = gpus // (tp * pp)
    seq = kw["seq"] or model.seq_len
    gbs = kw["global_batch"] or max(1, (4 * 2**20) // seq)
    vpp = kw["vpp"] or (2 if kw["schedule"] in ("zbv", "dualpipev", "interleaved") else 1)
    return Layout(gpus=gpus, tp=tp, pp=pp, dp=dp, ep=kw["ep"], vpp=vpp, mbs=kw["mbs"], global_batch=gbs, seq=seq,
                  schedule=kw["schedule"], recompute=kw["recompute"], sequence_parallel=kw["sequence_parallel"],
                  zero=kw["zero"], a2a="flat" if kw["a2a"] == "auto" else kw["a2a"], placement=kw["placement"],
                  dtype=kw["dtype"], attention_kernel=kw["attention"], dropout=kw["dropout"],
                  grad_dtype=kw["grad_dtype"], overlap_grad_reduce=kw["overlap_grad_reduce"])


@main.command()
@layout_options
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="also write plan.json for this layout")
@one_line_errors
def estimate(as_json, output, **kw):
    """Estimate one layout: memory per stage, time breakdown, throughput."""
    from . import report
    from .evaluate import build_plan, estimate_layout, parse_routing
    from .plan import Migration, write_plan
    from .specs import load_hardware, load_model

    model, hw = load_model(kw["model"]), load_hardware(kw["hardware"])
    lay = _layout_from(kw, model)
    routing = parse_routing(kw["routing"])
    routing.balanced = kw["migration"]
    est = estimate_layout(model, hw, lay, routing)
    if kw["a2a"] == "auto" and model.moe is not None and lay.ep > 1:
        alt_lay = lay.model_copy(update={"a2a": "halo"})
        alt = estimate_layout(model, hw, alt_lay, routing)
        if alt.step_time_s[0] < est.step_time_s[0]:
            lay, est = alt_lay, alt
    row = est.row(0)
    row["layout"] = lay.model_dump()
    if output:
        write_plan(build_plan(model, hw, lay, est, 0, routing, Migration(enabled=kw["migration"])), output)
    if as_json:
        click.echo(json.dumps(row, indent=2))
        return
    title = (f"{model.name} on {lay.gpus} × {hw.name}: tp{lay.tp} pp{lay.pp} dp{lay.dp} ep{lay.ep} "
             f"mbs{lay.mbs} M{lay.microbatches} {lay.schedule} recompute={lay.recompute} zero{lay.zero} a2a={lay.a2a}")
    report.show(report.estimate_tables(row, title))


if __name__ == "__main__":  # pragma: no cover
    main()
