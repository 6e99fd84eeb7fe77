"""One-row products through numpy's OpenBLAS, on the calling thread.

A decoding step at batch 1 multiplies one row by every weight of the model, so it is bound by
how fast one core streams the weights from memory. On the AMD EPYC this project measures on (Zen
4, one thread, 12 layers' weights in 2 MiB pages, GB/s of weight read; ``sum`` is a plain
reduction over the same memory, the ceiling):

    weight (K -> N)        MKL (PyTorch)   OpenBLAS (numpy)   sum
    768 -> 2,304 (QKV)        19.2             24.6            29.0
    768 -> 768 (output)       20.6             27.4            52.5 (fits the L3)
    768 -> 3,072 (FFN in)     23.2             23.5            30.5
    3,072 -> 768 (FFN out)    18.7 (rows)      22.6 (rows)     30.4
    768 -> 50,257 (vocab)     25.5             23.1            30.4

MKL takes its generic code on AMD CPUs (``ember.nn.onednn``), and oneDNN's one-row kernel is no
faster (18-19 GB/s). numpy is already a dependency of ember and its wheels ship OpenBLAS, so
``ember.nn.onednn.row_product`` sends layer-sized weights through it: GPT-2 greedy decoding at
batch 1 went ~9% faster (BENCHMARKS.md, "Decoding speed"). Vocabulary-sized heads stay on MKL,
which leads there.

OpenBLAS runs a product on as many threads as the machine has cores. ``matmul`` sets its thread
count to 1 for the call and puts it back (the setting is process-wide while the call lasts; calls
from several threads at once share one pinning, and the last to finish restores the count),
so the product runs on the core PyTorch's own one-row product would have used (MKL does not split
a one-row product over threads either: 2 threads, no faster) and the caller's thread time is all
of its cost. Where numpy's BLAS is not an OpenBLAS whose thread count can be set (a numpy built
on MKL or Accelerate), or ``EMBER_HOST_BLAS=0``, ``available()`` is False and the products stay
in PyTorch.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from pathlib import Path

import numpy as np
import torch

# where numpy's wheels keep the libraries they bundle (Linux: numpy.libs beside the package;
# macOS: numpy/.dylibs)
_BUNDLE_DIRS = ("../numpy.libs", ".dylibs")
# OpenBLAS's names for its thread-count setters, as the wheels' builds export them
# (scipy-openblas prefixes "scipy_" and, for 64-bit integers, suffixes "64_")
_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads")
_GETTERS = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads", "openblas_get_num_threads")
# how many matmul calls are running, and the thread count the first of them found
_PINNING = {"calls": 0, "saved": 1}
_PINNING_LOCK = threading.Lock()


def _first(lib, names: tuple[str, ...]):
    for name in names:
        fn = getattr(lib, name, None)
        if fn is not None:
            return fn
    return None


@functools.cache
def _openblas() -> tuple | None:
    """(get_num_threads, set_num_threads) of the OpenBLAS numpy multiplies with, or None."""
    numpy_dir = Path(np.__file__).parent
    for folder in _BUNDLE_DIRS:
        for path in sorted((numpy_dir / folder).glob("*openblas*")):
            try:
                lib = ctypes.CDLL(str(path))  # numpy loaded it already: the same library
            except OSError:
                continue
            get, set_ = _first(lib, _GETTERS), _first(lib, _SETTERS)
            if get is not None and set_ is not None:
                get.restype, get.argtypes = ctypes.c_int, []
                set_.restype, set_.argtypes = None, [ctypes.c_int]
                return get, set_
    return None


def available() -> bool:
    """Whether ``matmul`` may run (see the module docstring)."""
    return os.environ.get("EMBER_HOST_BLAS", "").strip() != "0" and _openblas() is not None


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for 2-D fp32 CPU tensors without gradient, through numpy's OpenBLAS on one thread.
    The result is a new tensor (numpy's memory)."""
    get, set_ = _openblas()
    with _PINNING_LOCK:
        if _PINNING["calls"] == 0:
            _PINNING["saved"] = get()
            set_(1)
        _PINNING["calls"] += 1
    try:
        out = np.matmul(a.detach().numpy(), b.detach().numpy())
    finally:
        with _PINNING_LOCK:
            _PINNING["calls"] -= 1
            if _PINNING["calls"] == 0:
                set_(_PINNING["saved"])
    return torch.from_numpy(out)
