"""Checkpoints with torch.distributed.checkpoint (DCP), keyed by logical names.

Layout of DIR:  step_00000004/ (a DCP checkpoint + meta.json),  latest (text: the folder
name), experts.json (where each MoE layer's logical experts live, and expert migration's load
window: runtime/migrate.stage_state). Keys: "model.<name>" and "optim.<name>.<exp_avg|exp_avg_sq|step>", where routed
expert weights are split per logical expert ("layers.3.moe.experts.5.w1"), so a later
re-placement -- or another layout altogether -- loads them. Replicated tensors are written
once (DCP de-duplicates equal keys); ZeRO-1 state is written by its owner.

Atomicity: everything is written into a hidden temp folder; rank 0 renames it into place
and only then rewrites `latest` (atomically), so a crash at any point leaves the previous
checkpoint whole and `latest` pointing at it. Across nodes DIR must be a shared file system
(as DCP's FileSystemWriter assumes)."""
from __future__ import annotations

import errno
import json
import os
import re
import resource
import shutil
import sys
from pathlib import Path
from typing import Annotated, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator
from torch.distributed.checkpoint.api import CheckpointException

from piper_plan.errors import PiperError
from piper_plan.plan import Plan, atomic_write_text

from .data import token_dtype
from .migrate import restore_placements
from .model import EXPERT_TAG, Chunk
from .moe.placement import ExpertPlacement
from .optim import DistOptimizer
from .procs import peer_failure
from .tp import global_view

KEEP = 2  # checkpoints kept (the newest and one before it)
EXPERTS = "experts.json"


class LayerExperts(BaseModel):
    """One MoE layer's entry of experts.json (see runtime/migrate.stage_state)."""
    model_config = ConfigDict(extra="forbid")
    ep: int = Field(ge=1)
    rank_of: list[Annotated[int, Field(ge=0)]]
    slot_of: list[Annotated[int, Field(ge=0)]]
    loads: Optional[list[list[Annotated[int, Field(ge=0)]]]] = None
    since: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _a_placement(self):
        ExpertPlacement(len(self.rank_of), self.ep, self.rank_of, self.slot_of)  # ValueError says what is wrong
        if any(len(row) != len(self.rank_of) for row in self.loads or []):
            raise ValueError(f"loads: every row needs {len(self.rank_of)} entries, one per expert")
        return self


_EXPERTS_FILE = TypeAdapter(dict[str, LayerExperts])


class CheckpointError(PiperError):
    pass


def _slots(name: str, chunks: dict[int, Chunk]) -> Optional[list[int]]:
    """Logical expert id of every local slot of an expert parameter, else None."""
    if EXPERT_TAG not in name:
        return None
    layer = int(name.split(".")[1])
    for c in chunks.values():
        if str(layer) in c.layers:
            d = c.layers[str(layer)].moe.dispatcher
            return d.placement.local_experts(d.ep_rank)
    raise KeyError(name)


def _logical(name: str, e: int) -> str:
    prefix, w = name.split(EXPERT_TAG)
    return f"{prefix}{EXPERT_TAG}{e}.{w}"


def _entries(opt: DistOptimizer, chunks: dict[int, Chunk], with_optim_state: bool):
    """(key, tensor view, param-is-owned) for every checkpointed tensor of this rank."""
    owned = {id(i.param) for i in opt.owned}
    for info in opt.infos:
        p = info.param
        st = opt.state_of(p) if with_optim_state and id(p) in owned else None
        slots = _slots(info.name, chunks)
        pieces = [(info.name, lambda t: t)] if slots is None else \
            [(_logical(info.name, e), (lambda s: (lambda t: t[s]))(s)) for s, e in enumerate(slots)]
        for key, view in pieces:
            yield f"model.{key}", global_view(p, view(p.data))  # tp shards: DTensor of the whole
            if st is not None:
                yield f"optim.{key}.exp_avg", global_view(p, view(st["exp_avg"]))
                yield f"optim.{key}.exp_avg_sq", global_view(p, view(st["exp_avg_sq"]))
                yield f"optim.{key}.step", st["step"]


def latest(ckdir: str | os.PathLike) -> Optional[Path]:
    """The folder `latest` names in `ckdir`, None without the file. A name that is no folder of
    `ckdir` itself (empty, a path, one leading out of it) is a CheckpointError: a resume reads only
    what this run's folder holds."""
    d = Path(ckdir)
    f = d / "latest"
    if not f.is_file():
        return None
    name = f.read_text().strip()
    if not name or name in (".", "..") or "/" in name or os.sep in name:
        raise CheckpointError(f"{f}: expected the name of a checkpoint folder in {d}, got {name!r}")
    return d / name


def run_settings(cfg) -> dict:
    """What a checkpoint records of the run options (TrainConfig) that decide what its later steps
    compute: the data stream (seed, token file and its size, dtype) and the optimisation settings."""
    data = os.path.abspath(cfg.data) if cfg.data else None
    return dict(seed=cfg.seed, data=data, data_bytes=os.path.getsize(data) if data else None,
                data_dtype=token_dtype(data, cfg.data_dtype) if data else None, lr=cfg.lr,
                weight_decay=cfg.weight_decay, clip=cfg.clip,
                aux_coef=cfg.aux_coef, z_coef=cfg.z_coef, capacity_factor=cfg.capacity_factor)


# the run options a resume must repeat (they decide which tokens its steps read: the step's rows are
# drawn from the seed's stream, or read from the file) and those it may change, with a warning
_SAME_DATA = ("seed", "data_dtype")  # (the token file itself: check_run's first test)
_TUNABLE = {"lr": "--lr", "weight_decay": "--weight-decay", "clip": "--clip", "aux_coef": "--aux-loss-coef",
            "z_coef": "--z-loss-coef", "capacity_factor": "--capacity-factor"}


def check_run(p: Path, saved: dict, now: dict) -> list[str]:
    """CheckpointError where a resume would read other tokens than the saved run's next steps (its
    seed with synthetic data, another token file); the warnings for changed optimisation settings."""
    if (saved.get("data") is None) != (now["data"] is None) or saved.get("data_bytes") != now["data_bytes"]:
        was = f"{saved['data']} ({saved['data_bytes']:,} bytes)" if saved.get("data") else "synthetic tokens"
        now_s = f"--data {now['data']} ({now['data_bytes']:,} bytes)" if now["data"] else "no --data"
        raise CheckpointError(f"{p}: the run trained on {was}; {now_s} is other tokens: resume with the same data")
    for k in _SAME_DATA:
        if k == "seed" and now["data"] is not None:
            continue  # a token file is read by step, whatever the seed
        if k in saved and saved[k] != now[k]:
            opt = "--" + k.replace("_", "-")
            raise CheckpointError(f"{p}: the run trained with {opt} {saved[k]}; {opt} {now[k]} reads other tokens "
                                  "in the steps left: resume with the same")
    return [f"warning: {p}: the run trained with {opt} {saved[k]:g}, resumed with {now[k]:g}"
            for k, opt in _TUNABLE.items() if k in saved and saved[k] != now[k]
            and None not in (saved[k], now[k])]


def validate(ckdir: str | os.PathLike, plan: Plan, cfg=None) -> int:
    """Check the latest checkpoint before any process starts; returns its step. With `cfg` (the
    run's TrainConfig) also that the resume reads the tokens the saved run would have (check_run),
    its warnings printed."""
    p = latest(ckdir)
    if p is None:
        raise CheckpointError(f"{ckdir}: no checkpoint to resume from (missing 'latest')")
    try:
        meta = json.loads((p / "meta.json").read_text())
        step = meta["step"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{p}: meta.json unreadable or corrupted ({type(e).__name__})") from None
    named = re.fullmatch(r"step_(\d{8})", p.name)
    if not isinstance(step, int) or isinstance(step, bool) or step < 0 or (named and int(named[1]) != step):
        raise CheckpointError(f"{p}: meta.json: step: expected the folder's step as a whole number, got {step!r}")
    if meta.get("model_hash") != plan.model_hash:
        raise CheckpointError(f"{p}: model_hash: checkpoint holds model {meta.get('model_name')!r} "
                              f"({meta.get('model_hash')}), plan has {plan.model.name!r} ({plan.model_hash})")
    if meta.get("experts") and not (p / EXPERTS).is_file():  # where the saved run's experts were placed
        raise CheckpointError(f"{p}: {EXPERTS}: missing, and the run saved one (where each layer's experts were)")
    _check_stream(p, meta.get("layout"), plan)
    if cfg is not None and isinstance(meta.get("run"), dict):  # (checkpoints written before it: not checked)
        for line in check_run(p, meta["run"], run_settings(cfg)):
            print(line, file=sys.stderr)
    read_experts(p)
    try:
        dcp.FileSystemReader(str(p)).read_metadata()
    except (Exception, CheckpointException) as e:  # DCP raises pickle/EOF/OSError variants for a damaged .metadata
        raise CheckpointError(f"{p}: .metadata unreadable or corrupted ({type(e).__name__})") from None
    return step


def _check_stream(p: Path, saved, plan: Plan) -> None:
    """CheckpointError where the plan's global batch or sequence length differs from the saved
    run's: a step's rows are read by step, batch and length (data.FileTokens: sequence j of step t
    at (t·B + j)·S), so another B or S re-reads windows the run trained on, or skips others. The
    layout may change (its degrees, micro-batches, schedule); the tokens a step holds may not."""
    if not isinstance(saved, dict):  # (a checkpoint written without its layout: not checked)
        return
    for key, opt in (("global_batch", "--global-batch"), ("seq", "--seq")):
        was, now = saved.get(key), getattr(plan.layout, key)
        if isinstance(was, int) and was != now:
            raise CheckpointError(f"{p}: layout.{key}: the run trained at {was:,}, the plan runs {now:,}, which "
                                  f"reads other tokens in the steps left: plan with {opt} {was} to resume")


def read_experts(p: Path) -> dict[str, dict]:
    """Checkpoint folder p's experts.json as {layer id: LayerExperts fields}; {} where there is
    none (a dense model, or a checkpoint written before the file existed)."""
    f = p / EXPERTS
    if not f.is_file():
        return {}
    try:
        got = _EXPERTS_FILE.validate_json(f.read_bytes())
    except ValidationError as e:
        err = e.errors()[0]
        where = "layer " + ".".join(str(x) for x in err["loc"]) if err["loc"] else "(top level)"
        raise CheckpointError(f"{f}: {where}: {err['msg']}") from None
    except OSError as e:
        raise CheckpointError(f"{f}: unreadable ({e.strerror or type(e).__name__})") from None
    return {k: v.model_dump() for k, v in got.items()}


def _gather_experts(experts: dict[str, dict]) -> dict[str, dict]:
    """Every stage's experts state on rank 0 ({} elsewhere). The ranks of one stage hold the
    same state (migration plans from stage-wide counts), so a layer's entries agree and one rank
    a stage need send it (the others pass {}: at 1,024 ranks and 256 experts every rank's copy
    would be a gigabyte on rank 0)."""
    parts = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(experts, parts, dst=0)
    out: dict[str, dict] = {}
    for part in parts or []:
        out.update(part)
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def save(ckdir: str | os.PathLike, step: int, plan: Plan, opt: DistOptimizer, chunks: dict[int, Chunk],
         experts: Optional[dict[str, dict]] = None, run: Optional[dict] = None) -> Path:
    """Write checkpoint `step` (the number of optimizer steps done), with this rank's MoE
    layers' `experts` state (runtime/migrate.stage_state; None: nothing to keep) and the run's
    options (run_settings), which a resume checks. Collective."""
    d = Path(ckdir)
    final = d / f"step_{step:08d}"
    tmp = d / f".step_{step:08d}.tmp"
    rank = dist.get_rank()
    if rank == 0:
        d.mkdir(parents=True, exist_ok=True)
        for stale in d.glob(".step_*.tmp"):  # this save's, or one an interrupted run left (a step it never reached again)
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
    dist.barrier()
    state = {k: v.detach().clone() for k, v in _entries(opt, chunks, True)}
    try:
        dcp.save(state, checkpoint_id=str(tmp))
    except (CheckpointException, OSError) as e:  # every rank raises (DCP gathers the failures)
        if (peer := peer_failure(e)) is not None:  # a peer died or hung mid-save: the launcher names it
            raise RuntimeError(peer) from e
        why = _first_os_error(e)
        if not _is_os_reason(why, e):  # the OSError was lost on the way (below): say what the disk says
            need = sum(v.numel() * v.element_size() for v in state.values())
            why = _space_left(tmp, need) or _file_size_limit(tmp, need) or why
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)  # the previous checkpoint and `latest` stay as they were
        raise CheckpointError(f"{d}: cannot write checkpoint step {step} ({why}); the previous "
                              "checkpoint is kept") from None
    dist.barrier()
    kept = _gather_experts(experts or {})
    if rank == 0:
        if kept:
            atomic_write_text(tmp / EXPERTS, json.dumps(kept, separators=(",", ":")))
        meta = dict(step=step, model_name=plan.model.name, model_hash=plan.model_hash,
                    layout=plan.layout.model_dump(mode="json"), experts=bool(kept), run=run)
        atomic_write_text(tmp / "meta.json", json.dumps(meta, indent=1))
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        atomic_write_text(d / "latest", final.name + "\n")
        for old in _older_saves(d, step)[:-(KEEP - 1) or None]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def _older_saves(d: Path, step: int) -> list[Path]:
    """The folders this runtime saved before `step` in `d`, oldest first: named step_NNNNNNNN by
    save() with a step below it. A folder of another name (a copy the user kept as step_best) and
    a later step (left by a run this one resumed from an earlier step) are not this run's to prune."""
    named = ((re.fullmatch(r"step_(\d{8})", p.name), p) for p in d.iterdir() if p.is_dir())
    return [p for s, p in sorted((int(m[1]), p) for m, p in named if m) if s < step]


def _first_os_error(e: BaseException) -> str:
    """The reason a checkpoint write failed, in a few words: the first OSError among DCP's
    per-rank failures (CheckpointException.failures: rank -> (exception, traceback)), nested ones
    (a phase that gathers another's failures) and the causes and contexts of each; else an
    "[Errno N] reason" in the text (a writer that re-raises it as a RuntimeError)."""
    queue, seen = [e], set()
    while queue:
        x = queue.pop(0)
        if not isinstance(x, BaseException) or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, OSError) and (x.strerror or str(x)):
            return x.strerror or str(x)
        queue += [v[0] if isinstance(v, tuple) else v for v in (getattr(x, "failures", None) or {}).values()]
        queue += [x.__cause__, x.__context__]
    found = re.search(r"\[Errno \d+\] ([^:\n'\"]+)", str(e))
    return found.group(1).strip() if found else type(e).__name__


def _is_os_reason(why: str, e: BaseException) -> bool:
    """Whether _first_os_error found an OS error (else it fell back to the exception's name)."""
    return why != type(e).__name__


def _space_left(folder: Path, need: int) -> Optional[str]:
    """"No space left on device" with the figures, where the file system holds less than this
    rank's share of the checkpoint (`need` bytes); None where it does. DCP gathers every rank's
    failure by pickling it, which drops the OSError torch.save's RuntimeError ("unexpected pos")
    carries as its context, so a full disk could read as a bare CheckpointException."""
    try:
        free = shutil.disk_usage(folder if folder.exists() else folder.parent).free
    except OSError:
        return None
    if free >= need:
        return None
    return f"No space left on device: {free / 2**20:.1f} MiB free there, a rank's share is {need / 2**20:.1f} MiB"


def _file_size_limit(folder: Path, need: int) -> Optional[str]:
    """"File too large" with the limit, where this process may write files of at most
    RLIMIT_FSIZE bytes (ulimit -f) and a file of this save stopped at it, or this rank's share
    (`need` bytes, one file a rank) is past it; None otherwise. The write's EFBIG is lost as the
    disk's ENOSPC is (_space_left)."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit == resource.RLIM_INFINITY:
        return None
    try:
        biggest = max((f.stat().st_size for f in folder.iterdir() if f.is_file()), default=0)
    except OSError:
        biggest = 0
    if biggest < limit and need <= limit:
        return None
    return (f"{os.strerror(errno.EFBIG)}: files may hold {limit / 2**20:.1f} MiB here (ulimit -f), "
            f"a rank's share is {need / 2**20:.1f} MiB")


def load(ckdir: str | os.PathLike, opt: DistOptimizer, chunks: dict[int, Chunk]) -> int:
    """Load the latest checkpoint into parameters and owned optimizer state, each MoE layer's
    experts placed where the saved run had them where the layout allows. Collective."""
    p = latest(ckdir)
    if p is None:
        raise CheckpointError(f"{ckdir}: no checkpoint to resume from (missing 'latest')")
    restore_placements(chunks, read_experts(p))
    entries = list(_entries(opt, chunks, True))
    state = {k: torch.empty_like(v) for k, v in entries}
    try:
        dcp.load(state, checkpoint_id=str(p))
    except (Exception, CheckpointException) as e:  # the latter derives from BaseException
        if (peer := peer_failure(e)) is not None:  # a peer died or hung mid-load, not a damaged checkpoint
            raise RuntimeError(peer) from e
        lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
        why = lines[-1] if lines else type(e).__name__
        if len(why) > 140:  # torch's long hints: cut at a word, and said to be cut
            why = why[:140].rsplit(" ", 1)[0] + " ..."
        raise CheckpointError(f"{p}: cannot load, damaged or incompatible ({why})") from None
    with torch.no_grad():
        for k, v in entries:
            v.copy_(state[k])
    return int(json.loads((p / "meta.json").read_text())["step"])
