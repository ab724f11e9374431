"""Reading a validation table, the bundled one or a user's, and the specs each row is priced on.

A table is a csv in the schema of the published measurements (validation/README.md:
id, group, model, hardware, layout columns, metric, value); the recipe columns the bundled table
adds (validation/README.md) are optional and read as blank where a table lacks them. Only
id, group, model, hardware, gpus, seq, metric and value must be present.

A row names its specs by model_spec / hardware_spec (the bundled table), or by the schema's
model / hardware: a bundled spec (or a spec file) of that name however punctuated (bundled_as:
"Llama 3.1 405B", "DGX H100"; a hardware name may be the one bundled system holding its words,
"H100"), a parenthesised remark after the name ignored ("deepseek-v3 (no MTP)"; "with MTP" takes
the -mtp variant). The architecture columns (layers, hidden, heads, ffn,
vocab, experts, topk, expert_ffn) are the row's own statement of the model, so where they are
given they override the spec they name (a range, "2560-3072", counts as not given; ffn, for a
model whose every layer is MoE, is unused). A model with no bundled spec is built from those
columns on its family's spec: the bundled names sharing the longest prefix of words and numbers
(a 64-expert gpt-oss-60b on gpt-oss-120b: its sliding windows, biases and clamp kept), else the bundled spec
of its kind nearest in those columns (for a MoE row, among the specs without conventions its
columns cannot state, unless it states one's exact shape: _template), else Megatron's GPT (gpt-175b).
With no architecture columns a name that states a size takes its family's member of that size;
a model the bundled specs do not hold is then not priced (missing_model), nor is a row on a
machine none of the bundled systems is (missing_hardware).
Every problem is one PiperError naming the table, the row and the field.
"""
from __future__ import annotations

import csv
import math
import os
import re
from difflib import SequenceMatcher
from functools import lru_cache
from pathlib import Path
from typing import get_args

import click
from pydantic import ValidationError

from .clitypes import BATCH, GPU_COUNT, SEQUENCE
from .errors import PiperError, from_validation
from .layout import (AttentionKernel, CompilePart, CpComm, CudaGraphScope, ExpertGemm, GradSync, OffloadModule,
                     RecomputeModule, WgradAccum)
from .specs import load_hardware, load_model
from .specs.model import MAX_EXPERTS, MAX_HEADS, MAX_LAYERS, MAX_VOCAB, MAX_WIDTH, ModelSpec
from .specs.registry import bundled_names, hardware_by_device, nearest_bundled

# the bundled table's columns (validation/README.md): a table lacking some reads them as blank
COLUMNS = ("id", "group", "source", "model", "layers", "hidden", "heads", "ffn", "vocab", "experts", "topk",
           "expert_ffn", "hardware", "precision", "gpus", "tp", "pp", "vpp", "ep", "dp", "mbs", "gbs", "seq",
           "recompute", "recompute_modules", "cuda_graphs", "pipeline_split", "dispatcher", "a2a_overlap", "a2a_sms",
           "tp_comm_overlap", "attention_fp8", "expert_gemm", "zero_stage", "grad_reduce", "overlap_grad_reduce",
           "metric", "value", "tokens_per_s_per_gpu", "notes", "model_spec", "hardware_spec", "fit", "fsdp", "kv_heads",
           "etp", "cp", "attention_flops", "optimizer_offload", "offload_layers", "recompute_layers",
           "reshard_after_forward", "offload_modules", "fp8_params", "attention_kernel", "cp_comm", "cp_a2a", "kernels",
           "fsdp2", "compile", "cross_entropy", "grad_sync", "wgrad_accum")
REQUIRED = ("id", "group", "model", "hardware", "gpus", "seq", "metric", "value")
# how other tables head the schema's columns (read case- and space-insensitively: "GPUs", "Seq Len")
HEADER_ALIASES = {"num_gpus": "gpus", "n_gpus": "gpus", "gpu_count": "gpus", "#gpus": "gpus", "world_size": "gpus",
                  "seq_len": "seq", "seq_length": "seq", "sequence_length": "seq", "seqlen": "seq",
                  "global_batch_size": "gbs", "global_batch": "gbs", "micro_batch_size": "mbs", "micro_batch": "mbs",
                  "tensor_parallel": "tp", "pipeline_parallel": "pp", "expert_parallel": "ep", "data_parallel": "dp",
                  "virtual_pipeline": "vpp", "vp": "vpp", "num_layers": "layers", "hidden_size": "hidden",
                  "num_heads": "heads", "num_attention_heads": "heads", "ffn_hidden_size": "ffn",
                  "num_key_value_heads": "kv_heads", "num_kv_heads": "kv_heads", "num_query_groups": "kv_heads",
                  "vocab_size": "vocab", "num_experts": "experts", "top_k": "topk", "moe_ffn_hidden_size": "expert_ffn",
                  "gpu": "hardware", "system": "hardware", "dtype": "precision", "activation_recompute": "recompute",
                  "recomputation": "recompute", "zero": "zero_stage", "context_parallel": "cp",
                  "context_parallel_size": "cp", "expert_tp": "etp", "expert_tensor_parallel": "etp",
                  "expert_tensor_parallel_size": "etp", "optimizer_offload_fraction": "optimizer_offload",
                  "cpu_offloading_num_layers": "offload_layers", "activation_offload_layers": "offload_layers",
                  "recompute_num_layers": "recompute_layers"}

METRICS = ("hw_tflops_per_gpu", "model_tflops_per_gpu", "iteration_time_s", "tokens_per_s_per_gpu",
           "activation_gib_per_gpu", "params_optimizer_gib_per_gpu", "mfu")
# how other tables name the same metrics (model FLOPs utilisation: _mfu_as_tflops)
METRIC_ALIASES = {"tokens/s/gpu": "tokens_per_s_per_gpu", "tok/s/gpu": "tokens_per_s_per_gpu",
                  "tokens_per_sec_per_gpu": "tokens_per_s_per_gpu", "tokens_per_second_per_gpu": "tokens_per_s_per_gpu",
                  "step_time_s": "iteration_time_s", "iteration_time": "iteration_time_s",
                  "seconds_per_iteration": "iteration_time_s", "model_tflops": "model_tflops_per_gpu",
                  "mfu_pct": "mfu", "mfu%": "mfu", "mfu_(%)": "mfu"}
FP8_PRECISIONS = ("fp8", "mxfp8", "fp8-blockwise")  # the precisions whose GEMMs run an FP8 recipe
PRECISIONS = ("", "bf16", "fp16", "bf16/fp16") + FP8_PRECISIONS
# how a row's TFLOPS count attention (the attention_flops column): causal, the planner's count (a
# query against the keys before it, half the square), or full, the whole square (NeMo's
# long-sequence tables: validation/README.md)
ATTENTION_FLOPS = ("", "causal", "full")
INTS = ("gpus", "tp", "pp", "vpp", "ep", "dp", "mbs", "gbs", "seq", "layers", "hidden", "heads", "ffn", "vocab",
        "experts", "topk", "expert_ffn", "a2a_sms", "zero_stage", "fsdp", "kv_heads", "etp", "cp", "offload_layers",
        "recompute_layers", "cp_a2a")
# 0: none (a dense model's experts; ZeRO off; NeMo's FSDP column: data-parallel, not fully sharded)
MAY_BE_ZERO = ("ffn", "experts", "topk", "expert_ffn", "zero_stage", "fsdp", "offload_layers", "recompute_layers")
FLOATS = ("value", "tokens_per_s_per_gpu")
# every integer column's bound: the CLI's on the same figure (clitypes; SEQUENCE is the model spec's
# MAX_SEQ) or the model spec's (MAX_LAYERS, MAX_WIDTH, ...). A degree spans at most every GPU; chunks
# per rank (vpp) and counts of layers at most a model's layers; ZeRO stages end at 3. Past them a cell
# is a typo's extra digits, priced at +4e20 % or overflowing numpy, not a run.
MAXIMA = {"gpus": GPU_COUNT.max, "seq": SEQUENCE.max, "mbs": BATCH.max, "gbs": BATCH.max,
          **dict.fromkeys(("tp", "pp", "ep", "dp", "etp", "cp", "fsdp", "cp_a2a"), GPU_COUNT.max),
          **dict.fromkeys(("vpp", "layers", "offload_layers", "recompute_layers"), MAX_LAYERS),
          **dict.fromkeys(("hidden", "ffn", "expert_ffn"), MAX_WIDTH), "heads": MAX_HEADS, "kv_heads": MAX_HEADS,
          "vocab": MAX_VOCAB, "experts": MAX_EXPERTS, "topk": MAX_EXPERTS, "zero_stage": 3,
          "a2a_sms": 1 << 20}  # (a2a_sms: the hardware spec's bound on compute_units)
assert set(MAXIMA) == set(INTS)
_ASCII_INT = re.compile("[0-9]+")  # not str.isdigit(): it takes '2²' (int() then raises) and reads '١٢' as 12
# architecture column -> ModelSpec field (moe.* inside the MoE block)
ARCH = {"layers": "num_layers", "hidden": "hidden_size", "heads": "num_heads", "ffn": "ffn_size",
        "vocab": "vocab_size", "experts": "moe.num_experts", "topk": "moe.top_k", "expert_ffn": "moe.expert_ffn_size",
        "kv_heads": "num_kv_heads"}  # kv_heads: an optional column (GQA's key/value heads; Llama 2 13B has 40 of 40)
RANGE_CELL = re.compile(r"\d+-\d+")  # an architecture figure the source leaves open ("2560-3072")
# a model text that says it trains with multi-token prediction, not "no MTP" / "w/o MTP" / "without"
# a model cell that names the MTP module as run ("with MTP"), not as left out ("no MTP", "MTP off")
_MTP = re.compile(r"(?<!no)(?<!no[ -])(?<!w/o )(?<!without )\bmtp\b"
                  r"(?![\s:=-]*(?:off|disabled|excluded|removed|none|no|0)\b)", re.IGNORECASE)
# the phrase a model cell says it with, which names no model ("DeepSeek-V3 w/o MTP": deepseek-v3)
_MTP_PHRASE = re.compile(r"[,+]?\s*(?:\b(?:with|without|no)[\s-]*|\bw/o?\s*)?(?<![a-z])mtp\b"
                         r"(?:[\s:=-]*(?:off|on|disabled|enabled|excluded|removed|none|no|yes|\d+)\b)?", re.IGNORECASE)
GENERIC = "gpt-175b"  # Megatron's GPT: the template of a model with no family among the bundled specs
EXACT = 0.05  # Σ |log ratio| under which a row's columns are taken to state a spec's own shape


def _plain(m: ModelSpec) -> bool:
    """Whether a MoE spec has none of the conventions a table's columns cannot state: MLA, shared
    experts, leading dense or interleaved layers, sliding windows, expert biases or clamps,
    2-matrix (non-gated) experts (X-MoE's and Piper's synthetic families). Mixtral and Qwen3 are
    plain: GQA attention over gated experts, every layer MoE."""
    mo = m.moe
    return (mo is not None and m.mla is None and not mo.shared_experts and not m.dense_layers and mo.every == 1
            and m.sliding_window is None and m.attention_chunk is None and not mo.expert_bias and mo.glu_clamp is None
            and mo.gated)


def _column(header: str) -> str:
    """A table's column heading as the schema writes it (HEADER_ALIASES)."""
    h = re.sub(r"[\s-]+", "_", header.strip().lower())
    return HEADER_ALIASES.get(h, h)


class TableError(PiperError):
    def __init__(self, path, row: str | None, field: str, expected: str):
        where = f"{path}: row {row}" if row else str(path)
        super().__init__(f"{where}: {field}: {expected}")


def read_rows(path: Path) -> list[dict]:
    """The table's rows as dicts of strings, every column of the bundled schema present (blank
    where the table lacks it), each row's numbers and names checked (TableError on the first
    bad one)."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            sep = _delimiter(f)
            # skipinitialspace: a "comma and space" file's quoted cell ( "9,000") is one cell
            reader = csv.DictReader(f, delimiter=sep, skipinitialspace=True)
            header = [_column(h) for h in (reader.fieldnames or [])]
            missing = [c for c in REQUIRED if c not in header]
            if missing:
                raise TableError(path, None, "header", f"columns {', '.join(missing)} are missing "
                                 f"(a table needs {', '.join(REQUIRED)})")
            unknown = [c for c in header if c and c not in COLUMNS]
            if unknown:  # a misspelt optional column would otherwise be dropped without a word
                click.echo(f"warning: {path}: column(s) {', '.join(unknown)} not in the schema, ignored (its "
                           f"columns: {', '.join(COLUMNS)})", err=True)
            # blank headings are a spreadsheet's empty trailing columns, not one column twice
            twice = sorted({c for c in header if c and header.count(c) > 1})
            if twice:
                raise TableError(path, None, "header", f"columns {', '.join(twice)} appear twice "
                                 "(as written or by another name for them)")
            blank = dict.fromkeys(COLUMNS, "")
            rows, lines = [], []
            for r in reader:
                cells = _cells(path, reader, r)
                if not any((v or "").strip() for v in cells.values()):
                    continue  # a spreadsheet's empty trailing rows (",,,,")
                _headed(path, reader, cells)
                rows.append({**blank, **{_column(k): (v or "").strip() for k, v in cells.items() if k}})
                lines.append(reader.line_num)
    except OSError as e:
        raise TableError(path, None, "file", f"cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:  # a spreadsheet's "CSV" in its own code page (cp1252) or UTF-16
        raise TableError(path, None, "file", f"expected UTF-8 text (byte 0x{e.object[e.start]:02x} is not); a "
                         "spreadsheet saves it as \"CSV UTF-8\"") from None
    except csv.Error as e:
        raise TableError(path, None, "file", f"not a readable csv ({e})") from None
    if not rows:
        raise TableError(path, None, "rows", "the table has no rows")
    seen = set()
    for n, r in zip(lines, rows):
        rid = r.get("id") or f"at line {n}"
        for c in REQUIRED:
            if not r.get(c):
                raise TableError(path, rid, c, "blank; every row needs it")
        if r["id"] in seen:
            raise TableError(path, rid, "id", "appears twice; ids must be unique")
        seen.add(r["id"])
        _unambiguous(path, rid, r, sep)
        _normalise(r, decimal_comma=sep != ",")
        _beside_table(path, r)
        _check_row(path, rid, r)
        if r["metric"] == "mfu" and not missing_hardware(r):
            _mfu_as_tflops(path, r)
    return rows


# a number whose one separator has three digits after it: a thousand in one locale, a decimal in
# another ("3,000" in an English export, 3.0 in a French one; "3.000" the other way round)
_GROUPED = {";": re.compile(r"[1-9]\d{0,2}(?:\.\d{3})+"), "\t": re.compile(r"[1-9]\d{0,2}(?:,\d{3})+")}


def _unambiguous(path, rid: str, r: dict, sep: str) -> None:
    """Refuse a number a semicolon or tab table holds in a form its locale cannot tell
    (_GROUPED): a semicolon export's locale writes decimals with a comma, so its "3.000" is three
    thousand or three; a tab-separated copy may come from either kind of locale, so its "3,000" is
    a thousand or three (its "1.500", a decimal point in any locale that groups with a comma, or
    Python's own output, reads as 1.5). A comma table's "3,000" (quoted) is a thousand, a semicolon
    table's "1,420" 1.42 (_normalise)."""
    pattern = _GROUPED.get(sep)
    if pattern is None:
        return
    for c in (*INTS, *FLOATS):
        v = r.get(c, "")
        if pattern.fullmatch(v):
            whole = v.replace(",", "").replace(".", "")
            raise TableError(path, rid, c, f"{v!r} reads as {whole} in one locale and as {v.replace(',', '.')} in "
                             f"another; write the number without grouping ({whole}) or with a decimal point")


def _delimiter(f) -> str:
    """The table's separator: a comma, or where the header holds none, the semicolon or tab a
    spreadsheet in a decimal-comma locale exports with (csv.Sniffer reads it off the header)."""
    first = f.readline()
    f.seek(0)
    if "," in first:
        return ","
    try:
        return csv.Sniffer().sniff(first, delimiters=";\t").delimiter
    except csv.Error:  # one column: the header check names what is missing
        return ","


def _cells(path, reader: csv.DictReader, r: dict) -> dict:
    """A row as read, refused where it holds more cells than the header has columns: an unquoted
    comma inside a cell ("Mixtral 8x7B, 2 nodes") shifts every cell after it, and what spills past
    the last column would otherwise be dropped without a word."""
    spill = r.get(None)  # DictReader's cells beyond the header
    if spill:
        width = len(reader.fieldnames)
        rid = _raw_id(reader, r)
        sep = {",": "comma", ";": "semicolon", "\t": "tab"}.get(reader.reader.dialect.delimiter, "separator")
        raise TableError(path, rid, "cells", f"{width + len(spill)} cells where the header has {width} columns; a "
                         f"cell holding a {sep} must be quoted")
    return r


def _raw_id(reader: csv.DictReader, cells: dict) -> str:
    """A row's id as read (any heading the schema reads as id), or its line in the file."""
    return next((v.strip() for k, v in cells.items() if k and _column(k) == "id" and v and v.strip()),
                f"at line {reader.line_num}")


def _headed(path, reader: csv.DictReader, cells: dict) -> None:
    """Refuse a value under a blank heading: empty trailing columns are a spreadsheet's, but a
    figure there is a shifted row or a column someone forgot to name, which would be dropped."""
    stray = [v.strip() for k, v in cells.items() if k is not None and not k.strip() and v and v.strip()]
    if stray:
        raise TableError(path, _raw_id(reader, cells), "cells", f"{stray[0]!r} sits under a column with no "
                         "heading; name the column or move the value")


def _beside_table(path, r: dict) -> None:
    """Spec paths a row gives relative to its table's folder, where they name no file from the
    working directory (a table and its specs moved together), made so in place."""
    folder = Path(path).parent
    for c in ("model_spec", "hardware_spec", "model", "hardware"):
        v = r.get(c, "")
        if v and (c.endswith("_spec") or _path_like(v)) and not os.path.isabs(os.path.expanduser(v)) \
                and not os.path.exists(v) and (folder / v).is_file():
            r[c] = str(folder / v)


def _mfu_as_tflops(path, r: dict) -> None:
    """A model-FLOPs-utilisation row read as the model TFLOPS per GPU it states, in place: MFU
    (a fraction, or a percentage where above 1) times the accelerator's dense bf16 peak, the
    peak PaLM's definition and the tables that publish MFU beside TFLOPS divide by (Piper:
    191.5 per MI250X GCD, brief §2), whatever the run's precision; the notes say so."""
    hw = row_hardware(path, r)
    peak = hw.accelerator.peak_tflops.get("bf16") or hw.accelerator.peak_tflops.get("fp16")
    if not peak:
        raise TableError(path, r["id"], "metric", f"mfu needs a bf16 peak and {hw.name} states none")
    v = float(r["value"])
    frac = v / 100.0 if v > 1.0 else v
    said = f"read from MFU {r['value']} against {hw.name}'s dense bf16 peak {peak:g} TFLOPS"
    r.update(metric="model_tflops_per_gpu", value=f"{frac * peak:.6g}", notes=f"{r['notes']}; {said}".lstrip("; "))


# how tables spell precisions the bundled table writes one way (Megatron-Bridge's own tables
# write FP8-CS for Transformer Engine's current scaling and FP8-MX for MXFP8)
PRECISION_ALIASES = {"fp8-cs": "fp8", "fp8-current": "fp8", "fp8-mx": "mxfp8", "fp8-block": "fp8-blockwise",
                     "fp16/bf16": "bf16/fp16"}
_FP8_WORDS = re.compile(r"fp8|float8|e4m3|e5m2")
_FINE_SCALING = re.compile(r"block|deepseek|\bds\b|rowwise|row-wise|per-row|1x128|128x128")


def _precision(text: str) -> str:
    """A table's precision as the schema writes it: the bundled spellings and aliases as they
    are; else read by its words, ignoring "mixed", "precision" and the like: MX block scaling
    (MXFP8) -> mxfp8; FP8 with finer-than-tensor scaling (DeepSeek's 1x128 / 128x128 blocks,
    torchao's rowwise) -> fp8-blockwise; other FP8 (Transformer Engine's delayed or current
    tensorwise scaling, "hybrid" E4M3/E5M2) -> fp8; bf16 / bfloat16 -> bf16; fp16 / half ->
    fp16. Anything else stays as written (_check_row names it)."""
    p = re.sub(r"[\s_]+", "-", text.strip().lower())
    p = PRECISION_ALIASES.get(p, p)
    if p in PRECISIONS:
        return p
    if "mx" in p and _FP8_WORDS.search(p):
        return "mxfp8"
    if _FP8_WORDS.search(p):
        return "fp8-blockwise" if _FINE_SCALING.search(p) else "fp8"
    if re.search(r"fp32|tf32|float32", p):
        return p  # not modelled (the planner prices bf16/fp16 matmuls and FP8): an error names it
    half = ("bf16" in p or "bfloat16" in p), bool(re.search(r"fp16|(?<!b)float16|half", p))
    return {(True, False): "bf16", (False, True): "fp16", (True, True): "bf16/fp16"}.get(half, p)


# the csv's dispatcher column -> Layout.a2a: Megatron's alltoall dispatcher exchanges every routed
# copy (flat); its flex dispatcher with DeepEP or HybridEP exchanges tokens once per node (dedup);
# torchtitan's DistMoE backend exchanges inside its expert GEMM kernels (fused)
DISPATCHER_A2A = {"": "flat", "alltoall": "flat", "hybridep": "dedup", "deepep": "dedup", "distmoe": "fused"}
# the words of the recipe columns (validation/README.md): one word, or several joined by "+"; attention_kernel's,
# cp_comm's, kernels', cross_entropy's, grad_sync's and wgrad_accum's too, though they are no recipe columns
# (validate_recipes.RECIPE: a row stating one still inherits its recipe)
RECIPE_WORDS = {"expert_gemm": get_args(ExpertGemm), "grad_reduce": ("fp32", "bf16", "fp16"),
                "dispatcher": tuple(k for k in DISPATCHER_A2A if k), "attention_kernel": get_args(AttentionKernel),
                "cp_comm": get_args(CpComm), "kernels": ("fused", "eager"), "cross_entropy": ("fused", "eager"),
                "grad_sync": get_args(GradSync), "wgrad_accum": get_args(WgradAccum)}
RECIPE_LISTS = {"recompute_modules": get_args(RecomputeModule), "cuda_graphs": get_args(CudaGraphScope),
                "compile": get_args(CompilePart),
                "offload_modules": get_args(OffloadModule)}
# columns a row answers with yes or no (blank: the reading its source's stack implies)
YES_NO = ("a2a_overlap", "tp_comm_overlap", "attention_fp8", "overlap_grad_reduce", "reshard_after_forward", "fit",
          "fp8_params", "fsdp2")
_YES_NO_WORDS = {"yes": "yes", "true": "yes", "on": "yes", "1": "yes", "no": "no", "false": "no", "off": "no", "0": "no"}
_THOUSANDS = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_DECIMAL_COMMA = re.compile(r"\d+,\d+")


def _normalise(r: dict, decimal_comma: bool = False) -> None:
    """Spellings a table may use for what the schema writes one way, in place: thousands
    separators in numbers ("1,024"), or in a semicolon or tab file (a decimal-comma locale's
    export, _delimiter) the decimal comma ("1,42"), precision by its words (_precision), zero_stage "ZeRO-3",
    yes / no columns and fsdp said as true / false, on / off or 1 / 0, metric names
    (METRIC_ALIASES) and recompute words (_RECOMPUTE_WORDS) in any case."""
    for c in (*INTS, *FLOATS):
        v = r.get(c, "")
        if decimal_comma and _DECIMAL_COMMA.fullmatch(v):
            r[c] = v.replace(",", ".")
        elif not decimal_comma and _THOUSANDS.fullmatch(v):
            r[c] = v.replace(",", "")
    r["precision"] = _precision(r.get("precision", ""))
    stage = re.fullmatch(r"(?:zero|z|stage)[-_\s]?([0-3])", r.get("zero_stage", "").strip().lower())
    if stage:  # "ZeRO-3", "stage 2"
        r["zero_stage"] = stage[1]
    for c in YES_NO:
        said = r.get(c, "").strip().lower()
        r[c] = _YES_NO_WORDS.get(said, r.get(c, ""))
    fsdp = _YES_NO_WORDS.get(r.get("fsdp", "").strip().lower())
    r["fsdp"] = {"yes": "1", "no": "0"}.get(fsdp, r.get("fsdp", ""))
    metric = re.sub(r"\s+", "_", r["metric"].lower())
    r["metric"] = METRIC_ALIASES.get(metric, metric)
    rc = r.get("recompute", "")
    xmoe = "x-moe recipe"  # keeps its remark as written: "X-MoE recipe (TP8 ZeRO)"
    r["recompute"] = "X-MoE recipe" + rc[len(xmoe):] if rc.lower().startswith(xmoe) else _recompute(rc.lower())


# how tables say whether activations were recomputed ("activation checkpointing: yes", "SAC")
_RECOMPUTE_WORDS = {"yes": "full", "true": "full", "on": "full", "1": "full", "ac": "full", "full-ac": "full",
                    "activation-checkpointing": "full", "no": "none", "false": "none", "off": "none", "0": "none",
                    "-": "none", "sac": "selective", "selective-ac": "selective"}


def _recompute(rc: str) -> str:
    """A recompute cell as the schema writes it (_RECOMPUTE_WORDS); others as written."""
    word = re.sub(r"[\s_]+", "-", rc.strip())
    return _RECOMPUTE_WORDS.get(word, rc)


def listed(row: dict, column: str) -> tuple[str, ...]:
    """A recipe list cell (RECIPE_LISTS: words joined by "+"; blank or none: empty) as a tuple."""
    return tuple(x for x in row.get(column, "").split("+") if x and x != "none")


def _check_compile(path, rid: str, r: dict) -> None:
    """The compile cell (Layout.compiled) where it cannot be priced: a part twice, a compiled model
    beside the block run without torch.compile (kernels eager), Megatron-Core's graph scopes, or a
    Megatron-LM 2021-22 row (layout.check_stack's rules, which a published layout is not put through)."""
    from .validate_recipes import MEGATRON_2021

    parts = listed(r, "compile")
    why = parts and ((len(set(parts)) < len(parts) and "model and loss each once")
                     or ("model" in parts and r.get("kernels") == "eager"
                         and "no model beside kernels eager, the block run without torch.compile")
                     or (r.get("cuda_graphs", "") not in ("", "none") and "blank beside Megatron-Core's cuda_graphs")
                     or (r.get("group", "").startswith(MEGATRON_2021) and "blank on a Megatron-LM 2021-22 row"))
    if why:
        raise TableError(path, rid, "compile", f"expected {why}, got {r['compile']!r}")


def _check_row(path, rid: str, r: dict) -> None:
    if r.get("zero_stage", "") not in ("", "0", "1", "2", "3"):
        raise TableError(path, rid, "zero_stage", f"expected 0, 1, 2 or 3 (or blank), got {r['zero_stage']!r}")
    for c in INTS:
        v = r.get(c, "")
        if c in ARCH and RANGE_CELL.fullmatch(v):
            continue  # a range the source leaves open ("2560-3072"): unknown, the named spec's value holds
        if v and not (_ASCII_INT.fullmatch(v) and (int(v) > 0 or c in MAY_BE_ZERO)):
            what = "a whole number" if c in MAY_BE_ZERO else "a positive whole number"
            raise TableError(path, rid, c, f"expected {what} in ASCII digits, got {v!r}")
        if v and int(v) > MAXIMA[c]:  # a typo's extra digits: no run is that large
            raise TableError(path, rid, c, f"expected at most {MAXIMA[c]:,} (the planner's bound), got {v!r}")
    for c in FLOATS:
        _check_number(path, rid, r, c, lambda x: x > 0, "a positive number")
    _check_number(path, rid, r, "optimizer_offload", lambda x: 0.0 <= x <= 1.0,
                  "a fraction from 0 to 1 (Megatron-Core --optimizer-offload-fraction)")
    if r["metric"] == "mfu" and float(r["value"]) > 100.0:
        raise TableError(path, rid, "value", f"expected an MFU as a fraction or a percentage, got {r['value']!r}")
    if r["metric"] not in METRICS:
        raise TableError(path, rid, "metric", f"expected one of {', '.join(METRICS)}, got {r['metric']!r}")
    if r["metric"] == "iteration_time_s" and not r.get("gbs"):  # a rate holds near a default batch; a step's time not
        click.echo(f"warning: {path}: row {rid}: gbs: blank on an iteration time, which grows with the batch: priced "
                   "at the planner's default batch (4M tokens), so its error says little; give the batch it ran",
                   err=True)
    rc = r.get("recompute", "")
    if not (rc in ("", "none", "full", "per recipe", "planner's choice") or rc.startswith(("selective", "X-MoE recipe"))):
        raise TableError(path, rid, "recompute", "expected none, full, selective (e.g. selective+seqpar), per recipe "
                         f"(with recompute_modules), planner's choice or X-MoE recipe, got {rc!r}")
    if r.get("precision", "") not in PRECISIONS:
        raise TableError(path, rid, "precision", f"expected one of {', '.join(p for p in PRECISIONS if p)} "
                         f"(or blank), got {r['precision']!r}")
    for c, words in RECIPE_WORDS.items():
        if r.get(c, "") not in ("", *words):
            raise TableError(path, rid, c, f"expected one of {', '.join(words)} (or blank), got {r[c]!r}")
    if r.get("cp_comm", "") and int(r.get("cp") or 1) <= 1:  # cp: a whole number by now
        raise TableError(path, rid, "cp_comm", f"{r['cp_comm']} needs a cp column above 1 (how context parallelism "
                         f"moves keys), got cp {r.get('cp') or 'blank'}")
    if (r.get("cp_comm", "") == "a2a+p2p") != bool(r.get("cp_a2a")):
        raise TableError(path, rid, "cp_a2a", "expected the all-to-all group size of cp_comm a2a+p2p (and only "
                         f"there; Megatron-Core --hierarchical-context-parallel-sizes' first), got {r.get('cp_a2a')!r} "
                         f"with cp_comm {r.get('cp_comm') or 'blank'}")
    for c, words in RECIPE_LISTS.items():
        wrong = [x for x in r.get(c, "").split("+") if x not in ("", "none", *words)]
        if wrong:
            raise TableError(path, rid, c, f"expected none or {', '.join(words)} joined by '+', got {wrong[0]!r}")
    _check_compile(path, rid, r)
    for c in YES_NO:
        if r.get(c, "") not in ("", "yes", "no"):
            raise TableError(path, rid, c, f"expected yes or no (or blank), got {r[c]!r}")
    if r.get("fp8_params") == "yes" and r.get("precision", "") not in FP8_PRECISIONS:
        fp8s = f"{', '.join(FP8_PRECISIONS[:-1])} or {FP8_PRECISIONS[-1]}"
        raise TableError(path, rid, "fp8_params", f"yes needs an FP8 precision ({fp8s}) to keep the weights in; "
                         f"the row's precision is {r.get('precision') or 'blank'}")
    if r.get("attention_flops", "") not in ATTENTION_FLOPS:
        raise TableError(path, rid, "attention_flops", "expected causal (the planner's count: a query attends to "
                         f"the keys before it) or full (every key), or blank, got {r['attention_flops']!r}")



def _check_number(path, rid: str, r: dict, column: str, ok, expected: str) -> None:
    """Raise TableError unless the row's `column` is blank or a number `ok` accepts."""
    v = r.get(column, "")
    try:
        good = not v or (math.isfinite(float(v)) and ok(float(v)))  # no column holds an infinity
    except ValueError:
        good = False
    if not good:
        raise TableError(path, rid, column, f"expected {expected}, got {v!r}")


def table_name(text: str) -> str:
    """A table's model or hardware name as the bundled specs spell theirs: without a
    parenthesised remark, and, unless it is a file, lower case with spaces and underscores as
    '-' ("DeepSeek-V3 (no MTP)" -> deepseek-v3, "Mixtral 8x7B" -> mixtral-8x7b)."""
    name = text.split("(")[0].strip()
    if os.path.isfile(name):  # (not Path.is_file: a cell too long for a file name raises there)
        return name
    return re.sub(r"[\s_]+", "-", name.lower())


def _tokens(name: str) -> tuple[str, ...]:
    """A name's words and numbers, however it is punctuated ("Llama 3.1 405B" and
    "llama3.1-405b" -> llama, 3.1, 405b; "H100" -> h, 100)."""
    return tuple(re.findall(r"[a-z]+|\d+(?:\.\d+)*[a-z]*", name.lower()))


_VENDOR = ("nvidia", "dgx", "hgx", "amd", "instinct")  # words a system's name may carry that a bundled name need not
_CAPACITY = re.compile(r"(\d+)\s*gb\b", re.I)


def bundled_as(name: str, kind: str) -> str | None:
    """The bundled spec of `kind` ("models", "hardware") a table's name means: the one of the
    same words and numbers however punctuated (llama-3.1-405b: llama3.1-405b; X-MoE Small:
    xmoe-small); for hardware, where exactly one bundled system answers (_hardware_as), the
    system named by the name's words or holding them, else the one whose GPU the name's model
    number names; else None."""
    want = _tokens(name)
    toks = {b: _tokens(b) for b in bundled_names(kind)}
    same = [b for b, t in toks.items() if "".join(t) == "".join(want)]  # X-MoE Small: xmoe-small
    if same or kind != "hardware" or not want:
        return same[0] if same else None
    return _hardware_as(name, want, toks)


def _hardware_as(name: str, want: tuple[str, ...], toks: dict) -> str | None:
    """The one bundled system (toks: its name's words) a table's hardware name means, tried in
    turn: the system whose name holds the name's words in a row, with or without NVIDIA, DGX or
    HGX (H100: dgx-h100, DGX-GB200: gb200-nvl72); the system whose own words but those sit in
    the name in order, the most specific where several do (H100 SXM5 80GB: dgx-h100,
    A100-SXM4-80GB: dgx-a100-80gb, OLCF Frontier: frontier, Frontier ROCm 5.7: frontier-rocm57);
    the system whose accelerator the name's model number names (registry.hardware_by_device;
    MI250X: frontier, the base of the systems that share that GPU; 8x H100: dgx-h100). A capacity
    the name states must be the accelerator's (A100 40GB is none), and so must its form factor: a
    PCIe card or an H100 / H200 NVL (a PCIe pair; "GB200 NVL" is the rack) is none of the bundled
    SXM systems (other clocks, power and links)."""
    pair = want[:1] == ("h",) or "h" in want  # H100 NVL, H200 NVL: PCIe pairs; GB200 NVL is the rack
    if "pcie" in want or (pair and any(w == "nvl" and not (i + 1 < len(want) and want[i + 1].isdigit())
                                       for i, w in enumerate(want))):
        return None
    for words in (want, tuple(w for w in want if w not in _VENDOR)):  # DGX-GB200: gb200-nvl72
        k = len(words)
        holds = [b for b, t in toks.items() if k and any(t[i:i + k] == words for i in range(len(t) - k + 1))]
        if len(holds) == 1:
            return holds[0]
    core = {b: tuple(w.replace(".", "") for w in t if w not in _VENDOR) for b, t in toks.items()}
    within = [b for b, c in core.items() if _in_order(c, tuple(w.replace(".", "") for w in want))]
    within = [b for b in within if len(core[b]) == max((len(core[x]) for x in within), default=0)]  # the most specific
    cands = within if len(within) == 1 else hardware_by_device(name)
    base = [b for b in cands if all(c.startswith(b) for c in cands)]  # frontier, not frontier-rocm57
    if len(base) != 1:
        return None
    cap = _CAPACITY.search(name)
    if cap and (have := _CAPACITY.search(load_hardware(base[0]).accelerator.name)) and cap[1] != have[1]:
        return None  # another part of that GPU (A100 40GB, H100 NVL 94GB)
    return base[0]


def _in_order(words: tuple[str, ...], within: tuple[str, ...]) -> bool:
    """All of `words`, in their order, among `within` (not necessarily adjacent)."""
    it = iter(within)
    return bool(words) and all(w in it for w in words)


def _named(name: str, kind: str) -> str:
    """A table's name as the spec to load: a file or bundled name as it is, else bundled_as."""
    if name in bundled_names(kind) or os.path.isfile(name):
        return name
    return bundled_as(name, kind) or name


def missing_hardware(row: dict) -> str | None:
    """Why a row has no hardware spec to be priced on, or None: its hardware column names
    neither a spec file nor a bundled system (bundled_as) and no hardware_spec is given. A
    table may hold runs on machines Piper has no spec for; those rows are reported, not priced,
    and the others still are. A name that looks like a file (a '/' or a .yaml suffix) but is
    none stays an error (row_hardware): that is a mistyped path, not another machine."""
    name = table_name(row["hardware"])
    if row.get("hardware_spec") or "/" in name or name.endswith((".yaml", ".yml")):
        return None
    if _named(name, "hardware") in bundled_names("hardware") or os.path.isfile(name):
        return None
    return (f"no hardware spec: {row['hardware']!r} is none of the bundled systems "
            f"({', '.join(bundled_names('hardware'))});{_did_you_mean(name, 'hardware')} name a spec file in a "
            "hardware_spec column")


def _did_you_mean(name: str, kind: str) -> str:
    """" did you mean X?" where a bundled name is close to a table's (a misspelling is otherwise
    read as a machine or model Piper has no spec for, and only not priced); else ""."""
    close = nearest_bundled(name, kind)
    return f" did you mean {close}?" if close else ""


def model_name(row: dict) -> str:
    """A row's model name as a spec's (table_name), without what it says of an MTP module (row_model
    reads that: "DeepSeek-V3 w/o MTP" is deepseek-v3, "DeepSeek-V3 MTP" deepseek-v3 and its module)."""
    name = table_name(row["model"])
    if _named(name, "models") in bundled_names("models") or os.path.isfile(name):
        return name  # deepseek-v3-mtp as written
    return table_name(_MTP_PHRASE.sub(" ", row["model"]).strip())


def _path_like(name: str) -> bool:
    """Whether a table's model name is written as a spec file's path (a YAML or a Hugging Face
    config.json), which must then exist; a repository id such as meta-llama/Llama-3.1-8B is a name."""
    return name.startswith(("/", "./", "../", "~")) or Path(name).suffix in (".yaml", ".yml", ".json")


def row_hardware(path, row: dict):
    """The row's hardware spec: hardware_spec, else the hardware column's file or bundled
    system (bundled_as: "DGX H100", "H100", "GB200")."""
    ref = row.get("hardware_spec") or _named(table_name(row["hardware"]), "hardware")
    try:
        return load_hardware(ref)
    except PiperError as e:
        raise TableError(path, row["id"], "hardware_spec" if row.get("hardware_spec") else "hardware",
                         str(e)) from None


def row_model(path, row: dict) -> ModelSpec:
    """The row's model spec (module docstring): model_spec as it is, else the named or
    family spec with the architecture columns laid over it."""
    if row.get("model_spec"):
        try:
            return load_model(row["model_spec"])
        except PiperError as e:
            raise TableError(path, row["id"], "model_spec", str(e)) from None
    name = model_name(row)
    base_name = _base_name(name, row)
    if base_name is None:
        raise TableError(path, row["id"], "model", missing_model(row))
    if _MTP.search(row["model"]) and f"{base_name}-mtp" in bundled_names("models"):
        base_name += "-mtp"  # "DeepSeek-V3 (with MTP)": the variant that prices the MTP module
    try:
        base = load_model(base_name)
    except PiperError as e:
        raise TableError(path, row["id"], "model", str(e)) from None
    return _overlaid(path, row, name, base_name, base)


_BUILT = "the row's architecture columns on"


def built_on(m: ModelSpec) -> str | None:
    """The spec a table row's model was built on (row_model), or None for a spec as it is."""
    return m.source.rsplit(_BUILT, 1)[1].strip() if _BUILT in m.source else None


_SIZE = re.compile(r"(\d+(?:\.\d+)?)([bmt])")
_SCALE = {"m": 1e6, "b": 1e9, "t": 1e12}
SIZE_TOLERANCE = 1.5  # names round their sizes: Llama 3 8B holds 8.03B, Mixtral 8x7B 46.7B of its 8 x 7


def _size_at(parts: tuple[str, ...]) -> int | None:
    """Where a name's words hold its first size ("8b", "1.3b", "1t"), or None."""
    return next((i for i, t in enumerate(parts) if _SIZE.fullmatch(t)), None)


def stated_size(parts: tuple[str, ...]) -> float | None:
    """The parameter count a model's name states (_tokens: "llama-3.1-8b" 8e9, "mixtral-8x7b"
    5.6e10, "qwen3-30b-a3b" 3e10: the first size, not the active one), or None."""
    for i, t in enumerate(parts):
        hit = _SIZE.fullmatch(t)
        if hit:
            times = re.fullmatch(r"(\d+)x", parts[i - 1]) if i else None
            return float(hit[1]) * _SCALE[hit[2]] * (int(times[1]) if times else 1)
    return None


def total_size(parts: tuple[str, ...]) -> float | None:
    """The whole model's size a name states (stated_size), or None where its size may be a part's:
    a name that marks a MoE (_moe_named: Qwen1.5-MoE-A2.7B's active size, GPT-MoE-1.3B-64E's dense
    base, Llama-4-Scout-17B-16E's active parameters; Mixtral 8x7B's experts times size is the
    whole's, near enough) or states two sizes (OLMoE-1B-7B). Llama 4 Maverick 17B names its
    active size with no mark: its columns' build is checked only where the name's size fits."""
    sizes = [t for t in parts if _SIZE.fullmatch(t)]
    if len(sizes) != 1 or (_moe_named(parts) and not any(re.fullmatch(r"\d+x", t) for t in parts)):
        return None
    return stated_size(parts)


def _of_size(m: ModelSpec, size: float) -> bool:
    return 1.0 / SIZE_TOLERANCE <= m.total_params / size <= SIZE_TOLERANCE


def missing_model(row: dict) -> str | None:
    """Why a row has no model to be priced on, or None: no model_spec, a name that is no
    bundled spec or file, no architecture columns, and no bundled spec it could mean
    (_template: none of its family of the size its name states, or no family at all). Such a
    row is reported, not priced: an 8B run priced as its family's 405B, or any unknown model as
    Megatron's GPT-175B, would be another run's figure."""
    if row.get("model_spec"):
        return None
    name = model_name(row)
    if _base_name(name, row):
        return None
    size = total_size(_tokens(name))
    said = f" of {size / 1e9:g}B parameters" if size else ""
    return (f"no model spec: {row['model']!r} is no bundled model{said} and the "
            f"row gives no architecture columns (layers, hidden, heads, ffn, vocab, experts, topk, expert_ffn) to "
            f"build it from" + (f";{hint}" if (hint := _did_you_mean(name, "models")) else ""))


def _base_name(name: str, row: dict) -> str | None:
    """The spec a row's model (table_name `name`, no model_spec) is built on: the bundled spec or
    file it names, else _template's; None where there is none (missing_model)."""
    base = _named(name, "models")
    if base in bundled_names("models") or os.path.isfile(base) or _path_like(base):
        return base  # a path that is no file: load_model names it (row_model), not a model to leave unpriced
    return _template(name, row)


@lru_cache(maxsize=None)
def _bundled_model(name: str) -> ModelSpec:
    """A bundled model spec read once a process: _template compares a row with every bundled
    spec, for each row of a table (the returned spec is only read)."""
    return load_model(name)


def _template(name: str, row: dict) -> str | None:
    """The bundled spec a model with none of its own is built on: its family, the bundled names
    sharing the longest prefix of words and numbers with `name` (_tokens), and among them the one nearest in shape
    (_shape_distance; deepseek-v3.1 on deepseek-v3); else the bundled spec of the row's kind (MoE
    or dense) nearest in shape; else GENERIC. A MoE row takes a spec with conventions its columns
    cannot state (not _plain: DeepSeek's MLA and shared experts, Llama 4's shared expert, GPT-OSS's
    windows and biases, X-MoE's 2-matrix experts) only where its columns state that spec's shape
    (within EXACT: "X-MoE Small"); otherwise the nearest plain one: a conventional MoE is a guess
    the columns cannot refute, another family's peculiarities are not; a family met by one word
    lends none of its own attention or expert code (_own_code). Where the name states the whole
    model's size (total_size), a member the columns build to another size is not the family's, and
    among the nearest-shape candidates the size counts as four columns. With no columns the spec is
    the model: where the name states the whole model's size, the member of its family (its first
    word and every word before the size) of that size within SIZE_TOLERANCE and of its kind
    (_same_kind_by_name), sharing the longest prefix, then the nearest in spelling (Llama 3.1 8B:
    llama3-8b, not llama3.1-405b); else a bundled model it names a release of (_release_of); None
    where there is none (missing_model)."""
    # not the CPU test models, nor a spec's MTP variant, which row_model takes where the row says MTP
    names = [b for b in bundled_names("models") if not b.startswith("tiny-") and not b.endswith("-mtp")]
    given = {c: int(row[c]) for c in ARCH if c != "vocab" and _ASCII_INT.fullmatch(row.get(c, "")) and int(row[c]) > 0}
    # the row's kind where its columns say: experts given, or stated 0 (a dense model)
    moe = "experts" in given
    kind = True if moe else False if row.get("experts", "").strip() == "0" else None
    parts = _tokens(name)
    size = total_size(parts)  # a part's size (Llama-4-Scout-17B-16E's active 17B) picks no member
    if not given and size:
        # its family: every word (not number) its name has before the size (GPT-OSS 20B is no GPT)
        words = {t for t in parts[:_size_at(parts)] if t.isalpha()}
        pool = [b for b in names if _tokens(b)[:1] == parts[:1] and words <= set(_tokens(b))
                and _of_size(_bundled_model(b), size) and _same_kind_by_name(parts, b)]
        if not pool:
            return None

        def shared(b):
            t = _tokens(b)
            return next((i for i, (x, y) in enumerate(zip(t, parts)) if x != y), min(len(t), len(parts)))
        return max(pool, key=lambda b: (shared(b), SequenceMatcher(None, name, b).ratio()))
    if not given:
        # the name alone says the model: a release of a bundled one (_release_of), the nearest in spelling
        releases = [b for b in names if _release_of(parts, _tokens(b))]
        return max(releases, key=lambda b: SequenceMatcher(None, name, b).ratio()) if releases else None
    # with a size in its name, a spec the columns turn into a model of another size is the wrong
    # one (Qwen3-32B's columns on qwen3-235b-a22b build a 201B MoE)
    built = lru_cache(maxsize=None)(lambda b: _built(name, row, b))  # the family's and the fallback's candidates
    fits = (lambda b: _of_size(built(b), size)) if size else (lambda b: True)
    for k in range(len(parts) - 1, 0, -1):
        family = {b: _bundled_model(b) for b in names if _tokens(b)[:k] == parts[:k]}
        # one word in common lends no attention or expert code of a family's own (Llama 4's chunks,
        # GPT-OSS's windows and biases: Llama-3-MoE is no Llama 4); a DeepSeek's shared experts and
        # dense first layers are its MoE family's (DeepSeek-MoE-16B on deepseek-v2)
        same = [b for b, m in family.items() if (kind is None or (m.moe is not None) == kind) and fits(b)
                and not (k == 1 and _own_code(m))]
        if same:  # the family; within it, the member nearest in shape (deepseek-v3.1 on deepseek-v3)
            return min(same, key=lambda b: (_shape_distance(family[b], given), -SequenceMatcher(None, name, b).ratio()))
    if not given:
        return None  # no family and no shape: nothing to build it on (missing_model)
    best, best_d = GENERIC, float("inf")
    for b in names:
        m = _bundled_model(b)
        if (m.moe is not None) != moe:
            continue
        d = _shape_distance(m, given)
        if moe and d > EXACT and not _plain(m):
            continue
        if size:  # the build's size against the name's, the one figure of the whole model a row states,
            # counted as four columns: it tells SwiGLU from GELU where the widths cannot (Qwen3-32B's
            # FFN is 5 d wide, GELU's width, yet its columns build 30.5B on Llama and 24.3B on GPT)
            d += 4.0 * abs(math.log(built(b).total_params / size))
        if d < best_d:
            best, best_d = b, d
    return best


def _built(name: str, row: dict, base_name: str) -> ModelSpec:
    """The model a row's architecture columns build on `base_name` (_overlaid); the spec itself
    where they cannot (a column the spec refuses)."""
    base = _bundled_model(base_name)
    try:
        return _overlaid("", row, name, base_name, base)
    except TableError:
        return base


# words a name adds that make it another model than the bundled one it otherwise spells: another
# size or modality of a family (DeepSeek-V2-Lite, GLM-4.5-Air, Qwen3-VL)
_VARIANT_WORDS = frozenset({"lite", "mini", "small", "tiny", "nano", "micro", "flash", "air", "medium", "large", "xl",
                            "pro", "max", "plus", "ultra", "turbo", "light", "next", "vl", "vision", "omni", "audio"})


def _release_of(parts: tuple[str, ...], spec: tuple[str, ...]) -> bool:
    """Whether a name (no columns, no size) names a release of the bundled spec whose words and
    numbers are `spec`: all of them, in order, from its first; a number may differ from the spec's
    below its major version (DeepSeek-V3.1 and GLM-4.6 are releases of deepseek-v3 and glm-4.5,
    DeepSeek-V4 and Kimi K3 not of V2 or K2); words beyond them name a release (Instruct,
    Thinking, Terminus, LLM, a date), not another size or modality (_VARIANT_WORDS)."""
    if len(parts) < len(spec) or len(spec) < 2:
        return False
    major = lambda t: t.split(".")[0]  # noqa: E731
    for a, b in zip(parts, spec):
        if a != b and not (a[:1].isdigit() and b[:1].isdigit() and major(a) == major(b)):
            return False
    return not any(t in _VARIANT_WORDS for t in parts[len(spec):])


def _own_code(m: ModelSpec) -> bool:
    """A spec's attention or expert code no other family runs: sliding windows, chunked attention,
    expert biases or clamps, 2-matrix experts (GPT-OSS, Llama 4, X-MoE and Piper's synthetics)."""
    mo = m.moe
    return (m.sliding_window is not None or m.attention_chunk is not None
            or (mo is not None and (mo.expert_bias or mo.glu_clamp is not None or not mo.gated)))


def _moe_named(parts: tuple[str, ...]) -> bool:
    """Whether a name's words mark a MoE model: an active size (_active_named), experts times size
    (Mixtral 8x7B's "8x"), an expert count (Llama-4-Scout-17B-16E's "16e"), or MoE."""
    return _active_named(parts) or any(t == "moe" or re.fullmatch(r"\d+x|\d+e", t) for t in parts)


def _active_named(parts: tuple[str, ...]) -> bool:
    """Whether a name states its active size (Qwen3-30B-A3B's "a", "3b"): a MoE's own naming."""
    return any(t == "a" and i + 1 < len(parts) and _SIZE.fullmatch(parts[i + 1]) for i, t in enumerate(parts))


def _same_kind_by_name(parts: tuple[str, ...], spec: str) -> bool:
    """A bundled spec a name with no columns may mean by its stated size: not a MoE for a name that
    marks one (_moe_named) where the spec has no experts, and not a spec whose name states an active
    size for a name that states none (Qwen3-32B, dense, is no Qwen3-30B-A3B; Qwen2.5-72B no
    Qwen2-57B-A14B) unless the two state the same size (Qwen3 235B: qwen3-235b-a22b). A spec whose
    name says nothing of its kind (kimi-k2, deepseek-v3) may be meant either way ("Kimi K2 1T MoE")."""
    toks = _tokens(spec)
    if _moe_named(parts) and _bundled_model(spec).moe is None:
        return False
    if _active_named(toks) and not _active_named(parts):
        i, j = _size_at(parts), _size_at(toks)
        return i is not None and j is not None and parts[i] == toks[j]
    return True


def _shape_distance(m: ModelSpec, given: dict) -> float:
    """Σ |log ratio| between a row's architecture columns and a spec's (0 for none given), plus
    twice that of the FFN-to-hidden width ratio: the FFN's width over d tells its kind, 4 for
    GELU's two matrices (GPT), about 2.7-3.5 for SwiGLU's three."""
    have = {c: _arch(m, c) for c in given}
    d = sum(abs(math.log(v / have[c])) for c, v in given.items() if have[c])
    width = "expert_ffn" if "experts" in given else "ffn"
    if width in given and "hidden" in given and have[width]:
        d += 2.0 * abs(math.log(given[width] / given["hidden"] / (have[width] / have["hidden"])))
    return d


def _arch(m: ModelSpec, column: str) -> int:
    """A spec's value for an architecture column (0 where it has none)."""
    field = ARCH[column]
    if field.startswith("moe."):
        return getattr(m.moe, field[4:]) if m.moe else 0
    return getattr(m, field) or 0


def _overlaid(path, row: dict, name: str, base_name: str, base: ModelSpec) -> ModelSpec:
    given = {c: int(row[c]) for c in ARCH if _ASCII_INT.fullmatch(row.get(c, ""))}
    top = {ARCH[c]: v for c, v in given.items() if not ARCH[c].startswith("moe.")}
    moe = {ARCH[c][4:]: v for c, v in given.items() if ARCH[c].startswith("moe.")}
    data = base.model_dump(exclude_none=True)
    # experts "0" (or, without an experts column, top-k and expert width 0): a dense model, whatever the spec
    dense = moe.get("num_experts") == 0 or (bool(moe) and not any(moe.values()))
    if base.moe is not None and not dense and not base.dense_layers and base.moe.every == 1:
        top.pop("ffn_size", None)  # every layer is MoE: the row's ffn (a config's dense width) is unused
    changed = {k: v for k, v in top.items() if data.get(k) != v}
    data.update(top)
    if "num_heads" in changed and "kv_heads" not in given:
        kv = data.get("num_kv_heads")
        if kv and data["num_heads"] % kv:
            data.pop("num_kv_heads")  # the family's GQA grouping does not divide the row's heads
    if dense:
        if data.pop("moe", None) is not None:
            changed["moe"] = None
    elif moe:
        # a MoE row on a dense template: its experts are the template's FFN kind (gated or not)
        old = data.get("moe") or {"gated": base.ffn_gated}
        new = {**old, **moe}
        if new != old:
            changed["moe"] = moe
        data["moe"] = new
    if not changed and name == base_name:
        return base
    data.update(name=name, source=f"{path} row {row['id']}: {_BUILT} {base_name}")
    try:
        return ModelSpec.model_validate(data)
    except ValidationError as e:
        raise TableError(path, row["id"], "model", str(from_validation(f"{name} on {base_name}", e))) from None

