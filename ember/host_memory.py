"""Keep freed host memory for reuse instead of handing it back to the OS after every step.

glibc's malloc serves a large block (over 32 MB at most, its mmap threshold) with a fresh
``mmap`` and returns it with ``munmap`` when freed. A training step on the CPU frees and
re-allocates the same large tensors every step (activations, the MLM head's (rows x
vocabulary) logits: 74 MB at bert-mini), so every step pays the kernel to zero and map those
pages again on first touch: measured here, a fresh 74 MB tensor costs ~29 ms to fill against
~2.4 ms for a reused one, and a whole bert-mini step took 1,040 ms against 801 ms with
freed memory kept (one thread, BENCHMARKS.md). PyTorch's CPU tuning guide gets the same
effect by preloading jemalloc or tcmalloc; this does it in-process with glibc's own
``mallopt``: no mmap'd blocks (everything from the heap) and no trimming of the heap's top,
so a freed block is reused by the next step's allocation of the same size.

The cost: the process keeps its peak footprint until it exits instead of shrinking between
steps, which is what a training process does anyway. ``train.keep_host_memory: false`` opts out.

A server wants the opposite: its requests come in every shape, so blocks freed by one batch
rarely fit the next, and the heap fragments and grows (a served MiniLM: 349 -> 970 MB over 200
`/embed` requests of real text). ``return_freed_host_memory`` hands the free pages back
(glibc's ``malloc_trim``) after each batch; ``ember serve`` calls it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

M_TRIM_THRESHOLD = -1  # glibc malloc.h: the heap top is returned to the OS above this many free bytes
M_MMAP_MAX = -4  # glibc malloc.h: at most this many blocks served by mmap (0: none)
NEVER_TRIM = 2**31 - 1  # mallopt takes an int
_STATE = {"applied": False}


@functools.cache
def _glibc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    # musl and other C libraries have no mallopt (or ignore it); glibc says its version
    return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt") else None


def keep_freed_host_memory() -> bool:
    """Make this process's malloc keep freed large blocks for reuse (see the module docstring).
    Returns whether it applies (Linux with glibc); elsewhere it does nothing. Idempotent."""
    if _STATE["applied"]:
        return True
    libc = _glibc()
    if libc is None:
        return False
    applied = libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, NEVER_TRIM) == 1
    _STATE["applied"] = applied
    return applied


def return_freed_host_memory() -> bool:
    """Give the heap's free pages back to the OS (glibc ``malloc_trim(0)``, which also releases
    free pages inside the heap, not only at its top). Returns whether it ran (Linux with glibc)."""
    libc = _glibc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    libc.malloc_trim(0)
    return True
