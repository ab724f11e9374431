"""`piper-train --plan plan.json`: run a plan.

Not under torchrun: spawns plan.layout.gpus local processes (gloo on CPU, NCCL when CUDA
is present; rendezvous through a FileStore in a temp folder, so no port can clash).
Under torchrun (RANK/WORLD_SIZE set): joins, so the same plan runs across nodes.
Every input problem is found before any process starts where possible, and reported as
one line with exit status 2; a problem only a worker can see (a damaged checkpoint shard)
is reported the same way, and collective timeouts stop a rank that would otherwise hang."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import signal
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Optional

import click

from piper_plan.clitypes import POSITIVE, FiniteFloat, OneLineCommand
from piper_plan.errors import PiperError, error_line
from piper_plan.files import check_outputs, check_writable_folder
from piper_plan.plan import Plan, priced_refusal, read_plan
from piper_plan.runtimes import layout_refusal

from .config import check_tp
from .host import keep_freed_pages
from .procs import lost_peer, start_ranks, timed_out


def check_supported(plan: Plan, world: int, source: str = "plan") -> None:
    """What this runtime cannot run, as one-line errors naming `source` (the plan's file) and
    the field (before any process starts).

    Layout fields that change no mathematics are accepted and not modelled exactly:
    attention_kernel flash or eager (torch's scaled_dot_product_attention picks the kernel; fa2,
    priced at a kernel the installed torch may not run, is refused), placement (taken from
    plan.rank_map as written). A plan priced for bf16 gradients (grad_dtype) is refused:
    piper-train reduces fp32 ones, which the price would misstate. What it runs of the rest is
    the table piper_plan.runtimes.PIPER_TRAIN
    (which `piper-plan search --runtime piper-train` reads too); runtime features of other stacks
    that the planner can price, and model features its modules do not build (runtimes.model_refusal:
    multi-token prediction, sliding windows, learned positions, expert biases, a clamped SwiGLU,
    group-limited routing), are refused: the comparison with the prediction would not hold; so are
    plans priced with fused kernels or an overlapped gradient reduction (gradients are reduced after
    the pipeline step, ZeRO-2's inside each micro-batch's backward, blocking it: never overlapped),
    which search --runtime piper-train never writes."""
    lay = plan.layout
    if world != lay.gpus:
        raise PiperError(f"{source}: layout.gpus: the plan is for {lay.gpus} ranks, this launch has {world}")
    check_tp(plan, source)
    why = layout_refusal(lay, plan.model)
    if why:
        raise PiperError(f"{source}: {why}")


def preflight(plan: Plan, cfg, world: int, source: str = "plan") -> int:
    """Every check that needs no process group (imports torch only where needed); `source`
    names the plan's file in its errors. Returns the step a --resume starts from (0 without)."""
    check_supported(plan, world, source)
    why = priced_refusal(plan)  # after check_supported: what this runtime cannot run says so first
    if why:
        raise PiperError(f"{source}: {why}")
    p, hw = plan.predicted, plan.hardware
    if p is not None and not p.fits:  # the planner's own verdict: the run would run out of memory
        raise PiperError(f"{source}: predicted.fits = false: the planner prices the busiest rank at "
                         f"{p.peak_memory_gib:.2f} GiB against {hw.accelerator.memory_gib:g} GiB on {hw.name} "
                         "(or its host memory); plan a layout that fits")
    if cfg.steps < 1:
        raise PiperError(f"--steps: expected >= 1, got {cfg.steps}")
    _check_options(plan, cfg)
    if cfg.metrics:  # checked before training: a run must not end by losing what it measured
        check_outputs([(cfg.metrics, "--metrics")], [(source, "--plan"), (cfg.data, "--data")], make_parents=True)
    if cfg.checkpoint:
        check_writable_folder(cfg.checkpoint, "--checkpoint")
        held = _held_checkpoint(cfg.checkpoint)
        if held and not cfg.resume:  # a fresh run's saves would replace it, re-point `latest` and prune it
            raise PiperError(f"--checkpoint {cfg.checkpoint}: holds a checkpoint already ({held}); add --resume "
                             "to continue it, or give a new folder")
    if cfg.data:
        from .data import open_tokens

        tokens = len(open_tokens(cfg.data, plan.model.vocab_size, plan.layout.seq, cfg.data_dtype))
        need = plan.layout.global_batch * (plan.layout.seq + 1)
        if tokens < need:  # it trains, on windows that overlap within every step: said, not refused
            click.echo(f"warning: {cfg.data}: {tokens:,} tokens, fewer than one step's global_batch x (seq + 1) = "
                       f"{need:,}: each step's sequences overlap", err=True)
    if cfg.resume:
        from .checkpoint import CheckpointError, validate

        if not cfg.checkpoint:
            raise PiperError("--resume needs --checkpoint DIR")
        step = validate(cfg.checkpoint, plan, cfg)
        if step > cfg.steps:
            raise CheckpointError(f"{cfg.checkpoint}: checkpoint is at step {step}, beyond --steps {cfg.steps}")
        return step
    return 0


def _check_options(plan: Plan, cfg) -> None:
    """Options that would do nothing as given are one line, not a run that silently ignores them:
    saves every N steps with nowhere to save, a token dtype with no token file, and the routing
    losses and capacity of a model without routed experts."""
    from .config import TrainConfig

    if cfg.checkpoint_every and not cfg.checkpoint:
        raise PiperError(f"--checkpoint-every {cfg.checkpoint_every} needs --checkpoint DIR (nothing is saved "
                         "without it)")
    if cfg.data_dtype and not cfg.data:
        raise PiperError(f"--data-dtype {cfg.data_dtype} needs --data FILE (the synthetic tokens have no file)")
    if plan.model.moe is None:
        dflt = TrainConfig()
        for opt, val, off in (("--capacity-factor", cfg.capacity_factor, dflt.capacity_factor),
                              ("--aux-loss-coef", cfg.aux_coef, dflt.aux_coef),
                              ("--z-loss-coef", cfg.z_coef, dflt.z_coef)):
            if val != off:
                raise PiperError(f"{opt} {val:g}: {plan.model.name} has no routed experts, whose router it sets; "
                                 "leave it out for a dense model")


def _held_checkpoint(ckdir: str) -> Optional[str]:
    """The checkpoint a --checkpoint folder holds (what `latest` names, else its newest step_*
    folder), or None (torch-free: checked before any rank starts)."""
    d = Path(ckdir)
    try:
        if (d / "latest").is_file():
            return (d / "latest").read_text().strip() or "latest"
        steps = sorted(p.name for p in d.glob("step_*") if p.is_dir())
    except OSError:
        return None
    return steps[-1] if steps else None


def _init(rank: int, world: int, timeout_s: float, store_path: Optional[str]):
    """Process group (FileStore when spawned, env:// under torchrun) and this rank's device."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
        keep_freed_pages()  # a CPU step re-allocates its large tensors every micro-batch (host.py)
    backend = "nccl" if cuda else "gloo"
    kw = dict(backend=backend, timeout=timedelta(seconds=timeout_s))
    if store_path is not None:
        kw.update(store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    if cuda:
        kw["device_id"] = device
    dist.init_process_group(**kw)
    return device


def run_rank(rank: int, world: int, plan: Plan, cfg, store_path: Optional[str], threads: int) -> list[dict]:
    """One rank, start to end (process group created and destroyed here)."""
    import torch
    import torch.distributed as dist

    from .train import train

    torch.set_num_threads(threads)
    device = _init(rank, world, cfg.timeout_s, store_path)
    try:
        return train(plan, cfg, device)
    finally:
        dist.destroy_process_group()


def _spawned(rank: int, world: int, jobs_json: list[tuple[str, object]], store_path: str, tmp: str,
             threads: int, launcher: int, sigint_ignored: bool = False) -> None:
    """Entry point of a spawned rank: runs each (plan, config) job in turn on one process
    group. PiperError -> error file + exit 2; a collective that timed out, or a peer's connection
    lost -> a one-line record (.timeout, .lost) + exit 1; anything else -> traceback, .crash record
    + exit 1 (spawn_jobs then stops the other ranks, so nobody waits for a dead peer)."""
    import torch.distributed as dist

    from .train import train

    # Ctrl-C reaches every rank of the terminal's process group: die at once and quietly (a rank
    # that raised KeyboardInterrupt printed its traceback, one per rank); the launcher reports it.
    # A launcher started with SIGINT ignored (nohup-like shielding) keeps its ranks shielded too
    signal.signal(signal.SIGINT, signal.SIG_IGN if sigint_ignored else signal.SIG_DFL)
    threading.Thread(target=_exit_with, args=(launcher,), daemon=True).start()
    # torch's pipelining runtime logs the whole action table (a line an action) after the line
    # naming the action that failed, on every rank: the launcher reports the failure once
    logging.getLogger("torch.distributed.pipelining.schedules").addFilter(
        lambda r: r.levelno < logging.ERROR or "\n" not in r.getMessage())
    try:
        import torch

        torch.set_num_threads(threads)
        device = _init(rank, world, jobs_json[0][1].timeout_s, store_path)
        for j, (plan_json, cfg) in enumerate(jobs_json):
            recs = train(Plan.model_validate_json(plan_json), cfg, device)
            if rank == 0:
                Path(tmp, f"job{j:04d}.json").write_text(json.dumps(recs))
        dist.destroy_process_group()
    except PiperError as e:
        Path(tmp, "err", f"rank{rank:05d}.err").write_text(str(e))
        sys.exit(e.exit_code)
    except BaseException as e:
        if isinstance(e, SystemExit):
            raise
        # a peer stopped, hung or died: every survivor's traceback would say only that, and bury the
        # failing rank's own (spawn_jobs reports the cause ahead of these records)
        if timed_out(e):
            Path(tmp, "err", f"rank{rank:05d}.timeout").write_text(
                f"rank {rank}: no reply from a peer within --timeout {jobs_json[0][1].timeout_s:g} s (a rank "
                f"stopped or hung): {error_line(e)}")
            sys.exit(1)
        if lost_peer(e):
            Path(tmp, "err", f"rank{rank:05d}.lost").write_text(
                f"rank {rank}: lost the connection to a peer (a rank exited or was killed): {error_line(e)}")
            sys.exit(1)
        traceback.print_exc()
        Path(tmp, "err", f"rank{rank:05d}.crash").write_text(f"rank {rank}: {error_line(e)}")
        sys.exit(1)


def _exit_with(launcher: int, every_s: float = 1.0) -> None:
    """A rank's watchdog: exit once the launcher is gone. A launcher killed outright (SIGKILL, an
    OOM kill) runs no handler, and its ranks, the forkserver's children, trained on to --steps,
    writing checkpoints and metrics nobody waited for (and a --resume started meanwhile would
    race them)."""
    while True:
        time.sleep(every_s)
        try:
            os.kill(launcher, 0)
        except ProcessLookupError:
            os._exit(1)
        except PermissionError:  # the pid now belongs to another user's process: ours is gone
            os._exit(1)


class RankFailed(RuntimeError):
    """A rank crashed or was killed (not an input error); a rank's own exception printed its
    traceback to stderr."""


def spawn_jobs(jobs: list[tuple[Plan, object]], threads: int = 1, grace_s: float = 5.0) -> list[list[dict]]:
    """Run (plan, TrainConfig) jobs one after another on the same plan.layout.gpus local
    processes (one process start for several runs: tests and benchmarks). Returns rank 0's
    per-step records of each job. Raises PiperError (a rank's input error) or RankFailed naming
    the rank that failed. Once one fails, the others get `grace_s` after SIGTERM, then SIGKILL
    (torch's join waits 30 s: a frozen rank held the job that long past the timeout)."""
    n = jobs[0][0].layout.gpus
    if any(p.layout.gpus != n for p, _ in jobs):
        raise ValueError("all jobs of one spawn need the same world size")
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    with tempfile.TemporaryDirectory(prefix="piper-train-") as tmp:
        os.mkdir(os.path.join(tmp, "err"))
        payload = [(p.model_dump_json(), c) for p, c in jobs]
        ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        with _sigint_held() as held:  # a Ctrl-C before start_ranks returns would leave ranks nobody stops
            ctx = start_ranks(_spawned, (n, payload, os.path.join(tmp, "store"), tmp, threads, os.getpid(), ignored),
                              n)
        try:
            if held:
                raise KeyboardInterrupt
            failed = _failed(ctx.processes)
        except KeyboardInterrupt:  # the ranks are the forkserver's children: stop them before leaving
            _stop(ctx.processes, grace_s)
            raise
        if failed:
            sent = _stop(ctx.processes, grace_s)
            errs = sorted(Path(tmp, "err").glob("*.err"))
            if errs:
                raise PiperError(errs[0].read_text().strip()) from None
            raise RankFailed(_cause(Path(tmp, "err"), ctx.processes, sent, ctx.error_files))
        return [json.loads(Path(tmp, f"job{j:04d}.json").read_text()) for j in range(len(jobs))]


@contextlib.contextmanager
def _sigint_held():
    """Hold a SIGINT that arrives inside the block until it ends: the block yields a list that
    is not empty where one came (the caller raises KeyboardInterrupt then, where it can stop what
    the block started). A Python-level handler, not the signal mask, which the forkserver started
    inside the block would keep for good. Outside the main thread, or where SIGINT is ignored,
    nothing changes."""
    got: list = []
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield got
        return
    prev = signal.signal(signal.SIGINT, lambda *_: got.append(True))
    try:
        yield got
    finally:
        signal.signal(signal.SIGINT, prev)


def _failed(procs) -> bool:
    """Wait for the ranks until every one exited 0 (False) or one failed (True, at once)."""
    from multiprocessing.connection import wait

    left = {p.sentinel: i for i, p in enumerate(procs)}
    while left:
        for s in wait(list(left)):
            p = procs[left.pop(s)]
            p.join()
            if p.exitcode:
                return True
    return False


def _cause(errs: Path, procs, sent: dict[int, set[int]], error_files: list) -> str:
    """One line naming the rank that failed, ahead of the ranks that only lost it: a rank's own
    exception (its .crash record, or the traceback torch kept where our handler never ran), a rank
    ended by a signal _stop did not send it, a peer that stopped answering (.timeout), a lost
    connection (.lost)."""
    def first(suffix: str) -> Optional[str]:
        found = sorted(errs.glob(f"*.{suffix}"))
        return found[0].read_text().strip() if found else None

    codes = {i: p.exitcode for i, p in enumerate(procs)}
    for i, code in codes.items():  # raised before _spawned's handler (torch's wrapper kept the trace)
        if code and code > 0 and error_files[i] and os.access(error_files[i], os.R_OK):
            with open(error_files[i], "rb") as fh:
                trace = [ln.strip() for ln in pickle.load(fh).splitlines() if ln.strip()]
            return f"rank {i}: {trace[-1] if trace else 'failed'}"
    if (crash := first("crash")) is not None:
        return crash
    for i, code in codes.items():
        if code and code < 0 and -code not in sent.get(i, ()):  # killed from outside (a user, the OOM killer)
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"rank {i}: process terminated with signal {name}"
    for suffix in ("timeout", "lost"):
        if (rec := first(suffix)) is not None:
            return rec
    i, code = next((i, c) for i, c in codes.items() if c)
    return f"rank {i}: process exited with code {code}"


def _stop(procs, grace_s: float = 5.0) -> dict[int, set[int]]:
    """Terminate the ranks still running (SIGTERM, then SIGKILL after grace_s) and reap them.
    Returns the signals sent to each rank (a rank's death by another is not ours)."""
    sent: dict[int, set[int]] = {}
    for i, p in enumerate(procs):
        if p.is_alive():
            p.terminate()
            sent[i] = {signal.SIGTERM}
            try:  # a rank frozen by SIGSTOP (a debugger, kill -STOP) would act on SIGTERM only after grace_s
                os.kill(p.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    end = time.monotonic() + grace_s
    for i, p in enumerate(procs):
        p.join(max(0.0, end - time.monotonic()))
        if p.is_alive():
            p.kill()
            sent.setdefault(i, set()).add(signal.SIGKILL)
            p.join()
    return sent


# the CPUs this process may run on (a container's or taskset's share, not the machine's)
_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@click.command(cls=OneLineCommand, context_settings=dict(help_option_names=["-h", "--help"]))
@click.option("--plan", "plan_path", required=True, help="plan.json written by piper-plan")
@click.option("--steps", type=POSITIVE, default=10, show_default=True, help="optimizer steps (total, also when resuming)")
@click.option("--seed", type=click.IntRange(0, (1 << 63) - 1), default=0, show_default=True,
              help="initialisation and synthetic-data seed")
@click.option("--metrics", "metrics_path", default=None, help="append per-step JSONL records here")
@click.option("--checkpoint", "ckdir", default=None, help="checkpoint folder (saved at the end, see --checkpoint-every)")
@click.option("--checkpoint-every", type=click.IntRange(min=0), default=0, show_default=True, help="also save every N steps (0: only at the end)")
@click.option("--resume", is_flag=True, help="continue from the latest checkpoint in --checkpoint")
@click.option("--data", default=None, help="pre-tokenised uint16/uint32 tokens (.npy, or raw .bin)")
@click.option("--data-dtype", type=click.Choice(["uint16", "uint32"]), default=None,
              help="token dtype of a raw .bin (default uint16); for .npy, the dtype it must have")
@click.option("--log-every", type=click.IntRange(min=0), default=1, show_default=True, help="console update every N steps (0: silent)")
@click.option("--lr", type=FiniteFloat(0, 1e38), default=3e-4, show_default=True,
              help="0: a run that measures speed only")  # (past float32's range the optimizer cannot apply it)
@click.option("--weight-decay", type=FiniteFloat(0), default=0.1, show_default=True)
@click.option("--clip", type=FiniteFloat(0), default=1.0, show_default=True, help="global gradient-norm clip (0: off)")
@click.option("--aux-loss-coef", type=FiniteFloat(0), default=1e-2, show_default=True,
              help="MoE balance loss coefficient")
@click.option("--z-loss-coef", type=FiniteFloat(0), default=0.0, show_default=True, help="router z-loss coefficient")
@click.option("--capacity-factor", type=FiniteFloat(0, min_open=True), default=None,
              help="expert capacity factor (default: dropless)")
@click.option("--timeout", "timeout_s", type=FiniteFloat(0, min_open=True), default=120.0, show_default=True,
              help="collective timeout, seconds")
@click.option("--threads", type=click.IntRange(1, _CPUS), default=1, show_default=True,
              help="CPU threads per rank, at most the CPUs this process may run on")
def main(plan_path, steps, seed, metrics_path, ckdir, checkpoint_every, resume, data, data_dtype, log_every,
         lr, weight_decay, clip, aux_loss_coef, z_loss_coef, capacity_factor, timeout_s, threads):
    """Train with the layout of PLAN: pipelined (torch.distributed.pipelining) expert-parallel MoE."""
    from .config import TrainConfig

    cfg = TrainConfig(steps=steps, seed=seed, lr=lr, weight_decay=weight_decay, clip=clip, aux_coef=aux_loss_coef,
                      z_coef=z_loss_coef, capacity_factor=capacity_factor, metrics=metrics_path, checkpoint=ckdir,
                      checkpoint_every=checkpoint_every, resume=resume, data=data, data_dtype=data_dtype,
                      log_every=log_every, timeout_s=timeout_s)
    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    try:
        plan = read_plan(plan_path)
        world = int(os.environ["WORLD_SIZE"]) if under_torchrun else plan.layout.gpus
        if preflight(plan, cfg, world, plan_path) == cfg.steps:  # a resume with nothing left to run
            click.echo(f"{cfg.checkpoint}: the checkpoint is at step {cfg.steps} already; nothing to train "
                       "(raise --steps to continue)")
            return
        if not under_torchrun:
            _check_devices(plan, plan_path)
            spawn_jobs([(plan, cfg)], threads)
        else:
            run_rank(int(os.environ["RANK"]), world, plan, cfg, None, threads)
    except PiperError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(e.exit_code)
    except RankFailed as e:
        click.echo(f"error: a rank failed: {e}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        held = _held_checkpoint(cfg.checkpoint) if cfg.checkpoint else None
        kept = f"; {cfg.checkpoint} holds {held} (--resume continues from it)" if held else ""
        click.echo(f"error: interrupted, every rank stopped{kept}", err=True)
        sys.exit(130)


def _check_devices(plan: Plan, source: str) -> None:
    """Whether this machine can hold the plan's ranks, before any starts: one GPU each, or on the
    CPU one process each whose resident memory, at least a bare rank's, sums within the host's."""
    import torch

    n = plan.layout.gpus
    if torch.cuda.is_available():
        if torch.cuda.device_count() < n:
            raise PiperError(f"{source}: layout.gpus: the plan needs {n} local GPUs, "
                             f"this machine has {torch.cuda.device_count()} (use torchrun across nodes)")
        return
    hw = plan.hardware
    if hw.collectives != "gloo":  # priced as a GPU machine: the run measures another one
        click.echo(f"warning: {source}: priced on {hw.name} ({hw.accelerator.name}, {hw.collectives}), run on "
                   "this host's CPU ranks over gloo: the measured-vs-predicted comparison compares two machines; "
                   "plan on a CPU spec (cpu-local, or piper-plan calibrate --quick) for one that holds", err=True)
    avail = host_available_gib()
    if avail is None:
        return
    per_rank = max(_peak_gib(plan), _bare_rank_gib())
    if n * per_rank > avail:
        raise PiperError(f"{source}: layout.gpus: {n} local ranks of {per_rank:.2f} GiB each need "
                         f"{n * per_rank:,.1f} GiB, this host has {avail:.1f} GiB available; run the plan on "
                         "the hardware it was planned for (torchrun across nodes)")


def _peak_gib(plan: Plan) -> float:
    """The busiest rank's predicted memory, GiB: the plan's own price, else (a plan assembled without
    one, or with it deleted) its layout priced now, so the host check never waves a plan through."""
    if plan.predicted is not None:
        return plan.predicted.peak_memory_gib
    from piper_plan.evaluate import estimate_layout

    return float(estimate_layout(plan.model, plan.hardware, plan.layout).peak_memory_gib[0])


def host_available_gib() -> Optional[float]:
    """Memory the host can give new processes, GiB (Linux MemAvailable; else free pages; None if unknown)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


def _bare_rank_gib() -> float:
    """A rank's resident memory once it has imported torch and joined the gloo group, before any
    model: hardware/cpu-local.yaml's memory_overhead_gib, measured on this project's CPU host."""
    from piper_plan.specs import load_hardware

    return load_hardware("cpu-local").memory_overhead_gib


if __name__ == "__main__":
    main()
