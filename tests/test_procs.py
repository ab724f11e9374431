"""piper_runtime.procs: ranks fork from a preloaded forkserver, yet each sees what a spawned
rank saw: this process's environment and working directory at the start call (the server keeps
those of its own first start)."""
import json
import os
import time

import pytest

torch = pytest.importorskip("torch")

from piper_runtime.procs import start_ranks  # noqa: E402


def _report(rank: int, out_dir: str) -> None:
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"env": os.environ.get("PIPER_PROCS_PROBE"), "cwd": os.getcwd()}, f)


def _run(out_dir: str) -> list[dict]:
    ctx = start_ranks(_report, (out_dir,), 2)
    deadline = time.monotonic() + 120  # a hung rank fails the test, not the suite
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("a rank did not finish within 120 s")
    return [json.load(open(os.path.join(out_dir, f"rank{r}.json"))) for r in range(2)]


def test_ranks_see_the_environment_and_folder_of_each_start(tmp_path, monkeypatch):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    monkeypatch.chdir(first)
    monkeypatch.setenv("PIPER_PROCS_PROBE", "one")
    a = _run(str(first))  # may start the server here, under "one" in first/
    monkeypatch.chdir(second)
    monkeypatch.setenv("PIPER_PROCS_PROBE", "two")
    b = _run(str(second))  # the same server: the ranks must still see "two" in second/
    assert [r["env"] for r in a] == ["one", "one"] and [r["cwd"] for r in a] == [str(first)] * 2
    assert [r["env"] for r in b] == ["two", "two"] and [r["cwd"] for r in b] == [str(second)] * 2


def test_a_timed_out_collective_is_recognised_in_gloo_s_words_and_nccl_s():
    from piper_runtime.procs import timed_out as _timed_out

    gloo = RuntimeError("[../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation")
    nccl = RuntimeError("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, "
                        "OpType=ALLREDUCE) ran for 600005 milliseconds before timing out.")
    try:
        raise ValueError("a pipeline action failed") from nccl
    except ValueError as e:
        wrapped = e
    assert _timed_out(gloo) and _timed_out(nccl) and _timed_out(wrapped)
    assert not _timed_out(RuntimeError("CUDA out of memory")) and not _timed_out(ValueError("timed out"))


def test_a_lost_peer_is_recognised_in_gloo_s_words():
    from piper_runtime.procs import lost_peer as _lost_peer, timed_out as _timed_out

    closed = RuntimeError("[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:32171. "
                          "This is typically caused by a remote worker crashing.")
    reset = RuntimeError("[../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:63132: Connection reset by peer")
    try:
        raise RuntimeError("\n [Stage 0] failed to run forward") from closed  # torch's pipelining wraps it
    except RuntimeError as e:
        wrapped = e
    assert _lost_peer(closed) and _lost_peer(reset) and _lost_peer(wrapped) and not _timed_out(closed)
    assert not _lost_peer(RuntimeError("CUDA out of memory")) and not _lost_peer(ValueError("reset by peer"))


def test_a_checkpoint_that_failed_because_a_peer_died_is_not_called_damaged():
    # DCP gathers every rank's failure into one CheckpointException; a survivor's "Connection closed
    # by peer" in it is the dead rank's doing, which the launcher names (not "damaged or incompatible")
    import traceback

    from torch.distributed.checkpoint.api import CheckpointException

    from piper_runtime.procs import lost_peer, peer_failure, timed_out
    tb = traceback.StackSummary.from_list([("dcp.py", 1, "load", "read_data()")])
    lost = CheckpointException("load", {1: (RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:7"), tb)})
    hung = CheckpointException("load", {0: (RuntimeError("[pair.cc:600] Timed out waiting 10000ms for recv"), tb)})
    damaged = CheckpointException("load", {0: (RuntimeError("PytorchStreamReader failed: read error"), tb)})
    assert lost_peer(RuntimeError(peer_failure(lost))) and timed_out(RuntimeError(peer_failure(hung)))
    assert peer_failure(damaged) is None and peer_failure(ValueError("size mismatch for w1")) is None
