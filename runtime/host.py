"""Host allocator settings for CPU ranks: keep freed memory instead of handing it back.

glibc serves every allocation above its mmap threshold (128 KiB at start, raised only when
such a block is freed) with a fresh mmap and returns it with munmap on free, and trims the
heap top above 128 KiB back to the kernel. A training step allocates and frees the same large
tensors (bf16 weight casts, their fp32 gradients, expert buffers) every micro-batch, so each
one is faulted in page by page again: measured on this repository's 2-core machine, one
small-moe-cpu MoE block (d 256, 8 experts of f 512, 128 tokens, bf16 autocast) took
3,689 minor faults and 6.9 ms of system time per forward+backward, 29% of its 23.7 ms CPU;
with the settings below, 34 faults and 17.9 ms (benchmarks/host_alloc.py repeats this).
CUDA tensors do not go through malloc (torch's caching allocator already keeps them), and
PyTorch's CPU tuning guide recommends a caching allocator (jemalloc, tcmalloc) for the same
reason; mallopt is the one that needs nothing installed.

PIPER_HOST_ALLOC=default leaves glibc as it is (for A/B runs)."""
from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc <malloc.h>
MMAP_THRESHOLD = 32 << 20  # glibc's largest mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
TRIM_THRESHOLD = 1 << 30   # keep up to 1 GiB of freed heap top rather than unmapping it


def keep_freed_pages() -> bool:
    """Raise this process's mmap and trim thresholds (glibc mallopt) so freed blocks below
    32 MiB are reused without new page faults. True if applied; False where the C library
    has no mallopt (macOS, musl) or PIPER_HOST_ALLOC=default."""
    if os.environ.get("PIPER_HOST_ALLOC", "") == "default":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
