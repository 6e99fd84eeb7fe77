"""The clock that times training steps (``train.clock``), for ``max_time`` and the logged ``elapsed``."""

from __future__ import annotations

import time
from typing import Callable

from ember.errors import EmberError


def step_clock(name: str) -> Callable[[], float]:
    """'wall' (elapsed time) or 'cpu' (this process's CPU time: on a busy shared machine wall time
    mostly measures the scheduler)."""
    clocks = {"wall": "perf_counter", "cpu": "process_time"}
    if name not in clocks:
        raise EmberError(f"train.clock={name!r}; choose 'wall' (elapsed time) or 'cpu' (this process's CPU time)")
    return getattr(time, clocks[name])
