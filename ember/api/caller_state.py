"""What a library call leaves as it found it: torch's global random state and its thread count.

A notebook is one long process. Training seeds torch's global generator (``train.seed``, so runs
reproduce), building a model draws initial weights from it, and ``train.num_threads`` /
``threads=`` set torch's process-wide thread count. Left so, ``torch.manual_seed(123); ember.load(run);
torch.rand(1)`` gave another number than without the load, and one ``finetune(num_threads=1)``
slowed every later cell to one core. Each public function runs inside ``keeps_caller_state``, which
puts both back when it returns or raises; inside, everything is as before (the same seeds, so the
same runs).
"""

from __future__ import annotations

import contextlib
import functools

import torch


@contextlib.contextmanager
def caller_state_kept():
    threads = torch.get_num_threads()
    # CUDA generators too, once a call may have used them (asking an uninitialised CUDA would start it)
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


def keeps_caller_state(function):
    """Decorator: ``function`` runs inside ``caller_state_kept``."""
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with caller_state_kept():
            return function(*args, **kwargs)
    return wrapper
