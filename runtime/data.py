"""Token batches: a seeded synthetic stream (default) or a pre-tokenised file.

Batch t is a pure function of (source, seed, t), so a resumed run sees the same data as an
uninterrupted one and every data-parallel rank can cut its own rows from the global batch.
Shapes: global batch [B, S + 1] int64 (inputs = [:, :-1], targets = [:, 1:])."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import torch

from piper_plan.errors import PiperError

TOKEN_DTYPES = ("uint16", "uint32")


class DataError(PiperError):
    pass


class SyntheticTokens:
    """A learnable synthetic language: a fixed random successor table (seeded), followed
    with probability 0.75, otherwise a uniformly random token. Loss falls from ln(V) as
    the model learns the table, which makes training visibly work."""

    def __init__(self, vocab: int, seq: int, seed: int = 0):
        self.vocab, self.seq, self.seed = vocab, seq, seed
        g = torch.Generator().manual_seed(seed)
        self.succ = torch.randperm(vocab, generator=g)

    def batch(self, step: int, rows: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        out = torch.empty(rows, self.seq + 1, dtype=torch.long)
        out[:, 0] = torch.randint(self.vocab, (rows,), generator=g)
        follow = torch.rand(rows, self.seq, generator=g) < 0.75
        noise = torch.randint(self.vocab, (rows, self.seq), generator=g)
        for i in range(self.seq):
            out[:, i + 1] = torch.where(follow[:, i], self.succ[out[:, i]], noise[:, i])
        return out


class FileTokens:
    """Windows of S + 1 consecutive tokens from a uint16/uint32 array (.npy, or raw .bin
    with `dtype`). Sequence j of step t starts at ((t·B + j)·S) mod (n − S − 1)."""

    def __init__(self, path: str, vocab: int, seq: int, dtype: Optional[str] = None):
        self.path, self.seq = path, seq
        self.arr = open_tokens(path, vocab, seq, dtype)

    def batch(self, step: int, rows: int) -> torch.Tensor:
        n = len(self.arr) - self.seq - 1
        starts = ((step * rows + np.arange(rows)) * self.seq) % max(n, 1)
        win = np.stack([np.asarray(self.arr[s:s + self.seq + 1]) for s in starts])
        return torch.from_numpy(win.astype(np.int64))


def token_dtype(path: str, dtype: Optional[str] = None) -> str:
    """The dtype a token file is read as (open_tokens): the one asked for, else a .npy file's own
    and a raw .bin's uint16; so a resume that names the default reads as the run that did not."""
    if dtype:
        return dtype
    return np.load(path, mmap_mode="r", allow_pickle=False).dtype.name if Path(path).suffix == ".npy" else "uint16"


def open_tokens(path: str, vocab: int, seq: int, dtype: Optional[str] = None) -> np.ndarray:
    """Memory-map and validate a token file; every problem is a one-line DataError."""
    p = Path(path)
    try:
        if not p.is_file():  # a folder or a device exists, and is no token file
            raise DataError(f"{path}: --data: " + ("no such file" if not p.exists() else "not a regular file; "
                                                   "expected a .npy or raw .bin token file"))
    except OSError as e:  # a name stat() refuses (too long): one line, not a traceback
        raise DataError(f"{path}: --data: cannot read ({e.strerror or e})") from None
    try:
        if p.suffix == ".npy":
            arr = np.load(p, mmap_mode="r", allow_pickle=False)
            if dtype is not None and arr.dtype.name != dtype:
                raise DataError(f"{path}: dtype: expected {dtype} (--data-dtype), file holds {arr.dtype.name}")
        else:
            dt = np.dtype(dtype or "uint16")
            size = p.stat().st_size
            if size % dt.itemsize:
                raise DataError(f"{path}: size {size} bytes is not a whole number of {dt.name} tokens "
                                f"(wrong --data-dtype?)")
            arr = np.memmap(p, dtype=dt, mode="r")
    except DataError:
        raise
    except (ValueError, OSError) as e:
        raise DataError(f"{path}: cannot read tokens ({str(e).splitlines()[0]})") from None
    if arr.dtype.name not in TOKEN_DTYPES:
        raise DataError(f"{path}: dtype: expected uint16 or uint32 tokens, got {arr.dtype.name}")
    if arr.ndim != 1:
        arr = arr.reshape(-1)
    if len(arr) < seq + 2:
        raise DataError(f"{path}: {len(arr)} tokens, need at least seq + 2 = {seq + 2}")
    top = int(arr.max())
    if top >= vocab:
        raise DataError(f"{path}: token id {top} >= vocab_size {vocab} (wrong dtype or tokenizer?)")
    return arr


def make_source(vocab: int, seq: int, seed: int, path: Optional[str] = None, dtype: Optional[str] = None):
    return FileTokens(path, vocab, seq, dtype) if path else SyntheticTokens(vocab, seq, seed)


def rank_rows(batch: torch.Tensor, dp: int, dp_rank: int) -> torch.Tensor:
    """This data-parallel rank's contiguous block of the global batch."""
    per = batch.shape[0] // dp
    return batch[dp_rank * per:(dp_rank + 1) * per]
