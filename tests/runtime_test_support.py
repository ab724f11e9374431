"""Shared by the runtime tests: toy model specs, gloo workers that report failures through a
file (a spawned rank's assertion would otherwise only show as an exit code), and reading a
torch.distributed.checkpoint directory back as one state dict."""
from __future__ import annotations

import traceback
from contextlib import contextmanager

from piper_plan.specs.model import ModelSpec

MLA = ModelSpec(name="mla-toy", num_layers=2, hidden_size=64, num_heads=4, vocab_size=128, seq_len=16, ffn_size=96,
                dense_layers=1, mla=dict(q_lora_rank=32, kv_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8,
                                         v_head_dim=16),
                moe=dict(num_experts=4, top_k=2, expert_ffn_size=32, shared_experts=2, router="sigmoid"))
GELU2 = ModelSpec(name="gelu2", num_layers=3, hidden_size=32, num_heads=2, vocab_size=64, seq_len=16, ffn_size=64,
                  ffn_gated=False, linear_bias=True, norm="layernorm", tied_embeddings=True,
                  moe=dict(num_experts=4, top_k=1, expert_ffn_size=16, gated=False, every=2))


@contextmanager
def report_failures(errfile: str):
    """Yields a list for a worker's failure messages; an exception is added as its traceback,
    and any messages are appended to `errfile` on the way out."""
    failures: list[str] = []
    try:
        yield failures
    except Exception:
        failures.append(traceback.format_exc())
    finally:
        if failures:
            with open(errfile, "a") as f:
                f.write("\n".join(failures) + "\n")


def spawn_and_check(worker, tmp_path, nprocs: int) -> None:
    """Run worker(rank, store_path, errfile) on `nprocs` processes; fail with what they reported."""
    import torch.multiprocessing as mp

    err = tmp_path / "errors.txt"
    mp.spawn(worker, args=(str(tmp_path / "store"), str(err)), nprocs=nprocs, join=True)
    assert not err.exists(), err.read_text()


def read_checkpoint(path) -> dict:
    """A torch.distributed.checkpoint directory as one torch.load'ed dict (written beside it)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = path.parent / (path.name + ".pt")
    dcp_to_torch_save(str(path), str(out))
    return torch.load(out)
