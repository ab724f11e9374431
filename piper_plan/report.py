"""Rich tables for specs, estimates, search results and plans (all formatting lives here)."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .layout import degrees_label, offload_label, recompute_label
from .specs.hardware import HardwareSpec
from .specs.model import ModelSpec

import sys

# wide tables when piped (CI logs, files); the terminal width otherwise
# markup off: names, sources and ids come from the user's files ("[cs.LG]" vanished, "[/]" raised)
console = Console(width=None if sys.stdout.isatty() else 160, markup=False)
# the same on stderr, for a command whose data goes to stdout (sweep --csv /dev/stdout)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 160, markup=False)


def _b(x: float) -> str:
    """Human count: 1.23B, 45.6M."""
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.2f}{unit}"
    return f"{x:.0f}"


def models_table(specs: list[ModelSpec]) -> Table:
    t = Table(title="Bundled models")
    for c in ("name", "layers", "hidden", "experts", "top-k", "total", "active", "GFLOP/token"):
        t.add_column(c, justify="right" if c != "name" else "left")
    for m in specs:
        t.add_row(m.name, str(m.num_layers), str(m.hidden_size), str(m.moe.num_experts if m.moe else "-"),
                  str(m.moe.top_k if m.moe else "-"), _b(m.total_params), _b(m.active_params),
                  f"{m.flops_per_token() / 1e9:.1f}")
    return t


def hardware_table(specs: list[HardwareSpec]) -> Table:
    t = Table(title="Bundled hardware")
    for c in ("name", "accelerator", "GiB", "bf16 TFLOP/s", "HBM GB/s", "GPUs/node", "NIC GB/s/GPU", "levels"):
        t.add_column(c)
    for h in specs:
        t.add_row(h.name, h.accelerator.name, f"{h.accelerator.memory_gib:g}", f"{h.accelerator.peak_tflops['bf16']:g}",
                  f"{h.accelerator.memory_bandwidth_gbps:g}", str(h.gpus_per_node), f"{h.nic_gbps_per_gpu:g}",
                  " > ".join(lv.name for lv in h.topology))
    return t


def model_detail(m: ModelSpec) -> list[Table]:
    t = Table(title=f"{m.name} — {m.source}")
    t.add_column("figure")
    t.add_column("value", justify="right")
    qk, v = m.qk_v_dims
    # MLA's heads are as wide as its q·k and v dimensions say, not hidden / heads
    head = f"{qk} / {v} (q·k / v)" if m.mla is not None else str(m.hd)
    rows = [("layers (dense + MoE)", f"{m.num_layers} ({m.num_dense_layers} + {m.num_moe_layers})"),
            ("hidden / heads / kv heads / head dim", f"{m.hidden_size} / {m.num_heads} / {m.kv_heads} / {head}"),
            ("vocab / seq", f"{m.vocab_size} / {m.seq_len}"),
            ("total parameters", _b(m.total_params)),
            # both conventions: Mistral, Qwen and Meta count the input embedding, DeepSeek and OpenAI do not
            ("active parameters (without input embedding)",
             f"{_b(m.active_params)} ({_b(m.active_params - m.embedding_params)})"),
            ("model FLOPs per token (fwd+bwd, seq)", f"{sig(m.flops_per_token() / 1e9, 4)} GFLOP")]
    local = (f"sliding window of {m.sliding_window}" if m.sliding_window is not None else
             f"chunks of {m.attention_chunk}" if m.attention_chunk is not None else None)
    if local:
        rows.append(("local attention", f"{local} tokens in {m.num_layers - m.full_layers} of {m.num_layers} layers"))
    if m.moe:
        mo = m.moe
        rows.append(("experts / top-k / expert ffn / shared",
                     f"{mo.num_experts} / {mo.top_k} / {mo.expert_ffn_size} / {mo.shared_experts}"))
        rows.append(("expert state at 16 B/param (one expert)", f"{m.expert_params * 16 / 2**20:.1f} MiB"))
    for a, b in rows:
        t.add_row(a, b)
    lt = Table(title="per-layer breakdown (forward FLOPs per token)")
    for c in ("part", "count", "params each", "params total", "fwd FLOP/token each"):
        lt.add_column(c, justify="right" if c != "part" else "left")
    for r in m.layer_breakdown():
        lt.add_row(r["part"], str(r["count"]), _b(r["params"]), _b(r["params"] * r["count"]), _b(r["fwd_flops"]))
    return [t, lt]


def hardware_detail(h: HardwareSpec) -> list[Table]:
    t = Table(title=f"{h.name} — {h.source}")
    t.add_column("figure")
    t.add_column("value")
    a, e = h.accelerator, h.efficiency
    for k, v in [("accelerator", a.name), ("memory", f"{a.memory_gib:g} GiB"),
                 ("peak TFLOP/s", ", ".join(f"{k}={v:g}" for k, v in a.peak_tflops.items())),
                 ("HBM", f"{a.memory_bandwidth_gbps:g} GB/s"), ("compute units", str(a.compute_units)),
                 ("efficiency gemm/attention/memory/comm", f"{e.gemm} / {e.attention} / {e.memory} / {e.comm}"),
                 ("other efficiency figures", ", ".join(f"{k}={v}" for k, v in e.model_dump(mode="json").items()
                                                         if k not in ("gemm", "attention", "memory", "comm", "source")
                                                         and v not in ({}, 0, None))),
                 ("efficiency source", e.source),
                 ("NICs", f"{h.network.nics_per_node} × {h.network.nic_gbps:g} GB/s per node "
                          f"({h.nic_gbps_per_gpu:g} GB/s per GPU"
                          + (f"; {h.network.planes} planes: an all-to-all gets one's share" if h.network.planes > 1 else "")
                          + ")"),
                 ("collective library", h.collectives)]:
        t.add_row(k, v)
    if a.compute_capability is not None or a.gfx_arch is not None:  # what runtimes choose kernels and settings by
        t.add_row("architecture", f"compute capability {a.compute_capability:g}" if a.compute_capability is not None
                  else a.gfx_arch)
    if "fp8" in a.peak_tflops:  # what an FP8 weight keeps (Accelerator.fp8_any_layout)
        t.add_row("FP8 GEMM operand layouts", "any: one FP8 copy of a tensor-scaled weight" if a.fp8_any_layout
                  else "TN only: an FP8 weight keeps its transpose too")
    lv = Table(title="topology (fastest first)")
    for c in ("level", "GPUs", "GB/s per GPU", "latency us", "source"):
        lv.add_column(c)
    blocks = h.job_blocks
    for i, L in enumerate(h.topology):
        shared = f" (links shared with {h.topology[i + 1].name})" if L.shared_links else ""
        if L.mesh:
            shared += f" (mesh: {h.level_bandwidth_gbps(i) / (L.size - 1):g} a peer)"
        # where a job's ranks fill fewer than the domain's GPUs (Level.job_block), which the pricing reads
        gpus = str(L.size) + (f" (a job fills {blocks[i]})" if blocks[i] < L.size and i + 1 < len(blocks) else "")
        lv.add_row(L.name, gpus, f"{h.level_bandwidth_gbps(i):g}" + (" (NIC)" if L.via_nic else "") + shared,
                   f"{L.latency_us:g}", L.source)
    return [t, lv]


def estimate_tables(row: dict, title: str) -> list[Table]:
    s = Table(title=title)
    s.add_column("metric")
    s.add_column("value", justify="right")
    for k, fmt in [("step_time_s", lambda x: f"{sig(x, 4)} s"), ("tokens_per_s", "{:,.0f}"),
                   ("tflops_per_gpu", lambda x: sig(x, 4)), ("hw_tflops_per_gpu", lambda x: sig(x, 4)),
                   ("mfu", "{:.1%}"), ("peak_memory_gib", "{:.2f} GiB"),
                   ("imbalance", "{:.3f}"), ("fits", "{}")]:
        v = row.get(k)
        s.add_row(k, "-" if v is None else fmt(v) if callable(fmt) else fmt.format(v))  # "-": a plan before the field
    tt = Table(title="time per step")
    tt.add_column("component")
    tt.add_column("seconds", justify="right")
    tt.add_column("share", justify="right")
    parts = row["time_breakdown_s"]  # {}: a plan written before the breakdown was (plan.check_consistent: total > 0)
    for k, v in parts.items():
        if k != "total":
            tt.add_row(k, sig(v, 4), f"{v / parts['total']:.1%}")  # as the step time: separators, not an exponent
    mt = Table(title="memory per pipeline rank (GiB)")
    stages = row["memory_gib_per_stage"]
    comps = [k for k in stages[0] if k not in ("stage", "role")] if stages else []
    short = {"weights": "weights", "grads": "grads", "master": "master", "optimizer": "optim",
             "activations": "activ", "logits": "logits", "a2a_buffers": "a2a buf", "cp_buffers": "cp buf",
             "grad_buckets": "buckets", "weight_casts": "casts", "zero3_units": "gathered",
             "recomputed_layer": "rc layer", "overhead": "reserve",
             "total": "TOTAL"}
    mt.add_column("stage")
    for c in comps:
        mt.add_column(short.get(c, c), justify="right")
    for st in stages:
        mt.add_row(f"{st['stage']} ({st['role']})", *[f"{st[c]:.2f}" for c in comps])
    return [s, tt, mt]


def show(tables, stderr: bool = False) -> None:
    for t in tables:
        (err_console if stderr else console).print(t)


def layout_str(lay: dict) -> str:
    s = f"{degrees_label(lay)} mbs{lay['mbs']} {lay['schedule']}"
    if lay["vpp"] > 1:
        s += f" v{lay['vpp']}"
    rc = recompute_label(lay["recompute"], lay.get("recompute_modules"), lay.get("recompute_layers", 0))
    reps = lay.get("zero_replicas", 1)
    return s + f" rc={rc} z{lay['zero']}" + (f"x{reps}" if reps > 1 else "") + \
        (f" {lay['a2a']}" if lay["ep"] > 1 else "") + \
        (" spread" if lay.get("placement") == "spread" else "") + offload_label(lay)


def sig(x: float, n: int = 3) -> str:
    """n (>= 3) significant digits, trailing zeros kept so figures read evenly (18.0 beside 18.6);
    from 1,000 up, whole numbers with separators rather than an exponent."""
    return f"{x:,.0f}" if abs(x) >= 999.5 else f"{x:#.{n}g}".rstrip(".")


def search_table(rows: list[dict], title: str) -> Table:
    t = Table(title=title)
    for c in ("#", "layout", "step s", "tokens/s", "TFLOP/s/GPU", "MFU", "worst stage GiB", "dominant"):
        t.add_column(c, justify="left" if c in ("layout", "dominant") else "right")
    for k, r in enumerate(rows, 1):
        t.add_row(str(k), layout_str(r["layout"]), sig(r["step_time_s"]), f"{r['tokens_per_s']:,.0f}",
                  f"{r['tflops_per_gpu']:.1f}", f"{r['mfu']:.1%}", f"{r['peak_memory_gib']:.1f}", r["dominant"])
    return t


def show_rejections(rejected: dict, why: list[str]) -> None:
    if rejected:
        t = Table(title="rejected candidates")
        t.add_column("rule")
        t.add_column("count", justify="right")
        for k, v in sorted(rejected.items(), key=lambda kv: -kv[1]):
            t.add_row(k, f"{v:,}")
        console.print(t)
    for line in why:
        console.print(Text("• ", style="bold red") + Text(line))


def precision_str(lay) -> str:
    """The layout's dtype and FP8 settings in words: 'bf16', 'bf16, fp8 mxfp8 GEMMs, FP8 weights'."""
    parts = [lay.dtype]
    if lay.fp8 != "none":
        parts.append(f"fp8 {lay.fp8} GEMMs")
        parts.append("FP8 weights" if lay.fp8_params else "bf16 weights with cached FP8 copies")
    if lay.attention_fp8:
        parts.append("FP8 attention")
    return ", ".join(parts)


# Layout fields the rows above already print (layout_str, precision_str, the batch row)
_SHOWN = {"gpus", "tp", "cp", "cp_comm", "cp_a2a", "pp", "dp", "ep", "etp", "vpp", "mbs", "global_batch", "seq",
          "schedule", "recompute", "recompute_modules", "recompute_layers", "zero", "zero_replicas", "a2a",
          "placement", "dtype", "fp8", "fp8_params", "attention_fp8", "optimizer_offload", "offload_layers",
          "offload_modules"}


def stack_settings(lay) -> str:
    """Every other setting of a Layout that differs from its default, as field=value: each
    changes what the plan is priced at (kernels, overlap, graphs, ...), so `show` must not hide
    one ("" where none differs)."""
    out = []
    for k, f in type(lay).model_fields.items():
        v = getattr(lay, k)
        if k not in _SHOWN and v != f.default and not (k == "sequence_parallel" and lay.tp == 1):  # no-op at tp 1
            v = ",".join(map(str, v)) if isinstance(v, (list, tuple)) else v
            out.append(f"{k}={v}")
    return " ".join(out)


def plan_tables(plan) -> list[Table]:
    lay = plan.layout.model_dump()
    t = Table(title=f"plan: {plan.model.name} on {plan.layout.gpus} × {plan.hardware.name} (schema {plan.schema_version})")
    t.add_column("field")
    t.add_column("value")
    t.add_row("layout", layout_str(lay))
    t.add_row("global batch / seq / micro-batches", f"{plan.layout.global_batch} / {plan.layout.seq} / {plan.layout.microbatches}")
    t.add_row("precision", precision_str(plan.layout))
    t.add_row("stack settings off their defaults", stack_settings(plan.layout) or "none")
    t.add_row("routing", plan.routing.distribution + (f" s={plan.routing.zipf_s}" if plan.routing.distribution == "zipf" else ""))
    t.add_row("migration", "on" if plan.migration.enabled else "off")
    t.add_row("partition (layers per chunk)", " ".join(str(len(c)) for c in plan.partition))
    t.add_row("model / hardware hash", f"{plan.model_hash} / {plan.hardware_hash}")
    out = [t]
    if plan.predicted:
        out += estimate_tables(plan.predicted.model_dump(), "predicted")
    return out
