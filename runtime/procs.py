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
