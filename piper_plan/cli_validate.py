"""piper-plan validate: the command and its answers' tables (issue 4). The pricing is
piper_plan/validate*.py; this module parses the options, picks the one question a call asks and
prints or writes its answer."""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import click

from .clitypes import one_line_errors


@click.command("validate")
@click.option("--table", "table_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="a csv of your own measurements in the published table's schema (validation/README.md "
              "of this project: id, group, model, hardware, gpus, seq, metric, value and the layout columns); a model "
              "without a bundled spec is built from its architecture columns (piper_plan/validate_rows.py). "
              "Default: the bundled validation/published.csv")
@click.option("--layer-table", "layer_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="a csv of single-layer times you measured (validation/layer_korthikanti_table4.csv's schema: "
              "experiment, model_spec, hardware_spec, tp, mbs, seq, recompute, sequence_parallel, forward_ms, "
              "backward_ms; optional attention, dropout, dtype, async_allreduce): each layer priced as the step "
              "model prices it, beside your figures")
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
              help="also draw the priced rows to this image (PNG, or the format its suffix names): predicted "
              "against published with the ±20 / ±35 % "
              "bands, and the signed throughput errors of the dense and MoE rows")
@one_line_errors
def validate_cmd(table_path, layer_path, group, as_json, explain_id, sensitivity, batch_scan, blind, residuals, output,
                 plot_path):
    """Predicted vs published measurements, with errors per group."""
    from rich.table import Table

    from . import report
    from .files import check_outputs, image_format
    from .validate import check_group, run, summary
    from .validate_explain import explain

    # one answer a call: a mode other than the plain pass, and --blind / --plot only beside that pass
    modes = [flag for flag, on in (("--explain", explain_id), ("--sensitivity", sensitivity),
                                   ("--batch-scan", batch_scan), ("--residuals", residuals),
                                   ("--layer-table", layer_path)) if on]
    if len(modes) > 1:
        raise click.UsageError(f"{' and '.join(modes)}: one of them a call")
    if blind and (table_path or modes):
        raise click.UsageError(f"--blind prices the bundled table on its own: not with {(modes or ['--table'])[0]}")
    if explain_id and group is not None:  # (the row had been explained whatever group it is in)
        raise click.UsageError("--explain names one row: not with --group")
    if plot_path is not None and modes:
        raise click.UsageError(f"--plot draws the plain pass over the table: not with {modes[0]}")
    if output is not None and not as_json:
        raise click.UsageError("-o writes the JSON output: give --json with it")
    check_outputs([(output, "-o"), (plot_path, "--plot")], [(table_path, "--table"), (layer_path, "--layer-table")])
    if plot_path is not None:
        image_format(plot_path)
    emit = functools.partial(_emit_json, output=output)
    if layer_path is not None:
        if table_path or group or blind or plot_path:
            raise click.UsageError("--layer-table prices its own table: not with --table, --group, --blind or --plot")
        from .validate_kernels import layer_time_check

        rows = layer_time_check(layer_path)
        if as_json:
            emit(rows)
        else:
            report.show([_layer_table(rows, f"layer model vs {layer_path}: forward and backward ms")])
        return
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
        if d.get("not_priced"):  # nothing to break down
            click.echo(f"{explain_id}: {d['metric']} published {d['published']:g}, {d['not_priced']}")
            return
        t = Table(title=f"{explain_id}{' (fit)' if d['fit'] else ''}: {d['metric']} published {d['published']:g}, "
                        f"predicted {d['predicted']:.4g}")
        t.add_column("item")
        t.add_column("value")
        for k, v in d.get("layout", {}).items():
            t.add_row(f"layout.{k}", str(v))
        for k, v in d.get("time_breakdown_s", {}).items():
            t.add_row(f"time.{k} (s)", f"{v:.4g}")
        for k, v in d.get("memory_first_stage_gib", {}).items():
            t.add_row(f"memory.{k} (GiB, first stage)", f"{v:.4g}")
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
    peers = None
    if table_path is None:  # other planners' predictions of the bundled rows (validation/peers.csv)
        from .validate_peers import beside

        peers = beside(res)
    if plot_path is not None:
        from .validate_plot import plot

        plot(res, plot_path, f"piper-plan validate{' --blind' if blind else ''}: {table_path or 'bundled table'}"
                             f"{f', group {group}' if group else ''}")
    if as_json:
        extra = {"no_recipe_inferred": bare} if blind else {}
        nan = lambda x: None if x != x else x  # noqa: E731  (nothing fits: JSON has no NaN)
        emit({"rows": [dict(r.__dict__, predicted=nan(r.predicted), error_pct=nan(r.error_pct)) for r in res],
              **summ, **(checks or {}), **extra, **({"peers": peers} if peers is not None else {})})
        return
    # the error is the metric's own (predicted / published - 1): on a time row - means too fast;
    # the missed column is signed one way on every row (+: the model missed time, too fast)
    t = Table(title="predicted vs published", caption="error: predicted / published - 1, so on iteration_time_s "
              "rows - means the model is too fast, on the others +; missed: + the model is too fast")
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
    report.show([t, g, k, *([_peer_table(peers)] if peers and peers["rows"] else [])])
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
    the bundled measurement tables (validate_kernels, validate_attention, validate_bounds), as validate --json has
    them."""
    from .validate_attention import bundled as attention_bundled
    from .validate_bounds import full_model_bounds
    from .validate_kernels import (a2a_check, b200_gemm_checks, gemm_check, implied_gemm, layer_time_check,
                                   moe_layer_check, rccl_node_check, te_gemm_check)

    return {"gemm_h100_xla": gemm_check(), "gemm_b200_xla": b200_gemm_checks(), "gemm_te_b300": te_gemm_check(),
            "a2a_mcore_table7": a2a_check(), "a2a_rccl_mi250x_node": rccl_node_check(),
            "moe_layer_piper_frontier": {"rows": moe_layer_check(), "implied_gemm": implied_gemm()},
            "layer_korthikanti_table4": layer_time_check(),
            "full_models_piper_frontier": full_model_bounds(), "attention_cudnn": attention_bundled()}


def _layer_table(rows: list[dict], title: str):
    """validate_kernels.layer_time_check's rows as a table: measured and predicted ms each way."""
    from rich.table import Table

    t = Table(title=title)
    for c in ("experiment", "measured fwd", "predicted fwd", "measured bwd", "predicted bwd", "error (fwd+bwd)"):
        t.add_column(c)
    for r in rows:
        meas, pred = r["measured_fwd_ms"] + r["measured_bwd_ms"], r["predicted_fwd_ms"] + r["predicted_bwd_ms"]
        t.add_row(r["experiment"], f"{r['measured_fwd_ms']:g}", f"{r['predicted_fwd_ms']:.2f}",
                  f"{r['measured_bwd_ms']:g}", f"{r['predicted_bwd_ms']:.2f}", f"{100 * (pred / meas - 1):+.1f}%")
    return t


def _peer_table(peers: dict):
    """validate_peers.beside as a table: each row a peer predicted, its error and Piper's."""
    from rich.table import Table

    cap = "; ".join(f"{n}: mean |error| {_pct(d['peer_mape'])}, max {_pct(d['peer_max_abs_pct'])} against "
                    f"Piper's {_pct(d['mape'])}, max {_pct(d['max_abs_pct'])} over the same {d['rows']} rows"
                    for n, d in peers["peers"].items())
    t = Table(title="other planners' predictions of the same rows (validation/peers.csv; how each was run: its "
                    "source column)", caption=cap)
    for c in ("id", "peer", "metric", "published", "peer predicted", "peer error", "Piper predicted", "Piper error"):
        t.add_column(c)
    for r in peers["rows"]:
        t.add_row(r["id"], r["peer"], r["metric"], f"{r['published']:g}", f"{r['peer_predicted']:.4g}",
                  _pct(r["peer_error_pct"], "+"), f"{r['predicted']:.4g}", _pct(r["error_pct"], "+"))
    return t


def _pct(x, sign: str = "") -> str:
    """A percentage for the tables; "-" where there is none (no priced row, nothing fits)."""
    return "-" if x is None or x != x else f"{x:{sign}.1f}%"


def _attention_table(att: dict):
    """validate_attention's summary as a table: mean |error| of each pass per spec and mask, and
    a layer's attention time error at each length."""
    from rich.table import Table

    seqs = sorted({s for v in att["summary"].values() for s in v["time_error_pct"]})
    t = Table(title="attention model (the plateau measured causal at 4k, with the kernel's block costs fitted to the "
                    "no-mask rows at 4k-16k) vs cuDNN 9.19's SDPA sweep (cudnn-frontend): + the model is slower; "
                    "windows of 1,024 tokens (the benchmark's; GPT-OSS's own is 128), heads of 64")
    for col in ("spec / mask", "forward mean |error|", "backward", *(f"time error {s // 1024}k" for s in seqs)):
        t.add_column(col)
    for k, v in att["summary"].items():
        t.add_row(k, _pct(v["forward_mape"]), _pct(v["backward_mape"]),
                  *(_pct(v["time_error_pct"].get(s), "+") for s in seqs))
    return t


def _show_bundled_checks(c: dict) -> None:
    from rich.table import Table

    from . import report

    gemm, b200, te_gemm, a2a = c["gemm_h100_xla"], c["gemm_b200_xla"], c["gemm_te_b300"], c["a2a_mcore_table7"]
    rccl, layer, bounds = c["a2a_rccl_mi250x_node"], c["moe_layer_piper_frontier"], c["full_models_piper_frontier"]
    kt, att = c["layer_korthikanti_table4"], c["attention_cudnn"]
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
    kl = _layer_table(kt, "layer model vs Korthikanti 2022 Table 4: one layer of their 22B GPT on 8 A100s (TP 8, "
                          "micro-batch 4 of 2,048 tokens), forward and backward ms")
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
    report.show([x, b, _attention_table(att), a, rc, kl, ml])
    click.echo(f"GEMM plateau at which those rates agree on average: {layer['implied_gemm']:.3f} of peak "
               f"(the spec: {layer['rows'][0]['gemm']:g}; validation/README.md, Frontier's two GEMM sources)")
    report.show([fb])


def _emit_json(obj, output=None) -> None:
    """Print a JSON answer, or write it to `output` atomically (a failed write leaves the old file)."""
    text = json.dumps(_finite(obj), indent=2, allow_nan=False)
    if output is None:
        click.echo(text)
        return
    from .files import atomic_write_text

    atomic_write_text(output, text + "\n", "-o")
    click.echo(f"wrote {output}")


def _finite(obj):
    """`obj` with every non-finite float as null: JSON has no NaN or Infinity, and a strict parser
    refuses the words json.dumps writes for them."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


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
    if not rows:  # (as --residuals: one line, not an empty table)
        click.echo("no planner's-choice rows (their layout left to the search) to price at other batches: "
                   "nothing to scan")
        return

    def cell(pred, pub):
        return "nothing fits" if pred is None else f"{pred:.1f} ({100 * (pred / pub - 1):+.0f}%)"

    t = Table(title="planner's-choice rows at other global batches (each in its row's metric, error against the "
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
