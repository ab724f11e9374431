"""Starting local ranks (piper-train's spawned ranks, calibrate's probes).

Ranks fork from a forkserver that has already imported torch and piper-train's modules.
Under "spawn" every rank imported them itself: 4.5 s of CPU each here, so 8 ranks on 2 cores
spent ~17 s before their first step. The server starts once per parent process, from a fresh
interpreter (none of the parent's threads), so forking it is safe. What spawn gave a rank
and a fork from that server does not: the parent's environment and working directory as they
are now (the server keeps those of its own start), so each rank adopts them first.
"""
from __future__ import annotations

import os

from piper_plan.errors import exception_chain

PRELOAD = ["torch", "torch.distributed", "piper_runtime.train"]


def context():
    """The multiprocessing context ranks start in (queues handed to ranks come from it)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def start_ranks(fn, args: tuple, nprocs: int):
    """torch.multiprocessing.start_processes(fn, args, nprocs, join=False) from the preloaded
    forkserver: fn(rank, *args) runs with this process's environment and working directory."""
    import torch.multiprocessing as mp

    context()  # the server's preload must be set before its first start
    return mp.start_processes(_enter, args=(fn, dict(os.environ), os.getcwd(), args), nprocs=nprocs,
                              join=False, start_method="forkserver")


def _enter(rank: int, fn, env: dict, cwd: str, args: tuple) -> None:
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    fn(rank, *args)


def timed_out(e: BaseException) -> bool:
    """Whether `e`, or what it was raised from, is a collective or transfer timing out (gloo:
    "Timed out waiting ... for recv"; NCCL's watchdog: "Watchdog caught collective operation
    timeout: ... ran for ... before timing out")."""
    for x in exception_chain(e):
        text = str(x).lower()
        if isinstance(x, (RuntimeError, TimeoutError)) and ("timed out" in text or "operation timeout" in text):
            return True
    return False


# gloo's words (transport/tcp/pair.cc) for a peer whose process is gone: "Connection closed by
# peer", "Read error ...: Connection reset by peer", "Write error ...: Broken pipe"
_LOST_PEER = ("closed by peer", "reset by peer", "read error", "write error", "broken pipe")


def lost_peer(e: BaseException) -> bool:
    """Whether `e`, or what it was raised from, is a collective or transfer failing because a
    peer's connection closed (the peer exited, crashed or was killed)."""
    return any(isinstance(x, (RuntimeError, ConnectionError)) and any(w in str(x).lower() for w in _LOST_PEER)
               for x in exception_chain(e))


# what a peer's failure reads as once DCP has gathered it into its CheckpointException (a
# BaseException, the rank's error text in its message): strict words, as a damaged file's
# message may well say "read error"
_PEER_GONE = ("closed by peer", "reset by peer", "broken pipe", "timed out")


def peer_failure(e: BaseException) -> str | None:
    """The line saying a peer stopped, hung or died where that, not this rank's own input, is
    why `e` (or what it was raised from) failed, else None: a checkpoint's gathered failure
    (DCP's CheckpointException) holds it among its ranks' tracebacks. Raised again as a
    RuntimeError of that line, timed_out or lost_peer reads it as the launcher's handler needs."""
    return next((line.strip() for x in exception_chain(e) for line in str(x).splitlines()
                 if any(w in line.lower() for w in _PEER_GONE)), None)
