"""piper_runtime.host.keep_freed_pages: a CPU rank that frees and re-allocates a large
buffer every step stops paying page faults for it."""
import json
import os
import subprocess
import sys

import pytest

PROBE = r"""
import ctypes, ctypes.util, json, resource, sys
from piper_runtime.host import keep_freed_pages
applied = keep_freed_pages() if sys.argv[1] == "runtime" else False
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
n = 4 << 20  # 4 MiB tensors, as a small-moe-cpu layer's expert weight casts and gradients
def step():  # several alive at once, then all freed: the heap top outgrows glibc's trim threshold
    ps = [libc.malloc(n) for _ in range(4)]
    for p in ps:
        ctypes.memset(p, 1, n)
    for p in reversed(ps):
        libc.free(p)
step(); step()
r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print(json.dumps({"applied": applied, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0}))
"""


def _faults(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PIPER_HOST_ALLOC=""))
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_reallocating_a_large_buffer_faults_only_under_glibc_defaults():
    default, runtime = _faults("default"), _faults("runtime")
    assert runtime["applied"]
    # glibc's default hands the freed heap top back and faults it in again: 4 x 1,024 pages a step
    assert default["faults"] > 20 * 1000
    assert runtime["faults"] < 100


def test_default_setting_is_left_alone(monkeypatch):
    from piper_runtime.host import keep_freed_pages

    monkeypatch.setenv("PIPER_HOST_ALLOC", "default")
    assert keep_freed_pages() is False
