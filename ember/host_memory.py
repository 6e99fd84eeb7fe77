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
Kept blocks help only when the next step allocates the same sizes. When the sizes change every
step (a masked LM's masked-row count, oneDNN's working memory sized by it, batches padded to
their longest row) freed blocks often fit no later request and the heap grows: a continued
4 x 1,024-token MiniLM run went from 3.7 GB after its first step to 11.5 GB after 20.
``KeptMemoryCap`` bounds that: when what the process holds grows past 1.5 times what one step
needed, the free pages go back to the OS (``return_freed_host_memory``) and the next step
faults in what it uses again.

A server wants the opposite: its requests come in every shape, so blocks freed by one batch
rarely fit the next, and the heap fragments and grows (a served MiniLM: 349 -> 970 MB over 200
`/embed` requests of real text). ``return_freed_host_memory`` hands the free pages back
(glibc's ``malloc_trim``) after each batch; ``ember serve`` calls it.

Reading a weight that does not fit the caches (a decoding step at batch 1: every weight once per
token) is bound by memory bandwidth, and 4 KiB pages cost there: each page needs its own address
translation, ~120,000 TLB misses (page walks) per token for GPT-2's 500 MB against ~250 with
2 MiB pages. ``huge_page_empty`` gives a
tensor in memory the kernel is asked to back with 2 MiB pages (``madvise(MADV_HUGEPAGE)``, which
Linux honours in its default transparent-huge-page mode ``madvise``); ember's one-row weight
copies (``ember.nn.onednn.row_copy``) live there. Measured on an AMD EPYC (Zen 4, one thread):
summing 512 MB 24.6 -> 20.4 ms, GPT-2-small greedy decoding at batch 1 ~10% faster
(BENCHMARKS.md, "Decoding speed").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
import mmap
import os
import sys

import torch

M_TRIM_THRESHOLD = -1  # glibc malloc.h: the heap top is returned to the OS above this many free bytes
M_MMAP_MAX = -4  # glibc malloc.h: at most this many blocks served by mmap (0: none)
NEVER_TRIM = 2**31 - 1  # mallopt takes an int
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
HUGE_PAGE_BYTES = 2 << 20  # x86-64's and arm64's transparent huge page
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


def resident_bytes() -> int | None:
    """This process's resident memory (Linux's /proc/self/statm), or None where it is unknown."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return None


class KeptMemoryCap:
    """Hands the heap's free pages back when a training process holds more than ``factor`` times
    (plus ``slack`` bytes) what it held after a step that followed the last trim (see the module
    docstring). Call ``after_step()`` once per optimizer step; it reads /proc, ~20 us."""

    def __init__(self, factor: float = 1.5, slack: int = 256 * 2**20, resident=resident_bytes, trim=None):
        self.factor, self.slack = factor, slack
        self.resident = resident
        self.trim = trim or return_freed_host_memory
        self.baseline: int | None = None  # held after the first step since the last trim
        self.trims = 0

    def after_step(self) -> bool:
        """Trim if the process outgrew its baseline; returns whether it trimmed."""
        held = self.resident()
        if held is None:
            return False
        if self.baseline is None:  # the step after a trim faulted its working set in again
            self.baseline = held
            return False
        if held <= self.baseline * self.factor + self.slack:
            return False
        self.trim()
        self.trims += 1
        self.baseline = None
        return True


def huge_page_empty(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialised CPU tensor in a private mapping aligned to 2 MiB and advised
    ``MADV_HUGEPAGE`` (see the module docstring); the mapping goes when the tensor does. Where that
    cannot apply (not Linux, under one huge page) an ordinary ``torch.empty``."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes < HUGE_PAGE_BYTES or not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty(shape, dtype=dtype)
    size = -(-nbytes // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    region = mmap.mmap(-1, size + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = ctypes.c_char.from_buffer(region)  # only to read the mapping's address
    start = (-ctypes.addressof(view)) % HUGE_PAGE_BYTES
    del view
    region.madvise(mmap.MADV_HUGEPAGE, start, size)
    # frombuffer keeps ``region`` alive as long as the tensor (and its views) are
    flat = torch.frombuffer(region, dtype=torch.uint8, count=nbytes, offset=start)
    return flat.view(dtype).view(shape)
