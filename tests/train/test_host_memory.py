"""ember.host_memory: with freed memory kept, a step's large tensors reuse the previous
step's pages instead of faulting in fresh ones (counted as minor page faults, in a fresh process
because the setting is process-wide), and the Trainer applies it on the CPU unless told not to."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ember import host_memory

pytestmark = pytest.mark.skipif(host_memory._glibc() is None, reason="needs Linux with glibc's mallopt")

# Steps that each allocate, fill and free a 64 MB, a 48 MB and a 48 MB tensor (above glibc's
# largest mmap threshold, 32 MB), as a training step does with its activations; reports the minor
# page faults and the resident-size growth of the last three of fifteen steps. (posix_memalign's
# alignment slack means a freed block does not fit the next same-size request at once: the heap
# settles after a few steps.)
PROBE = """
import json, resource, sys, torch
from ember.host_memory import keep_freed_host_memory
applied = keep_freed_host_memory() if sys.argv[1] == "keep" else False
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def resident():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
def step():
    a = torch.empty(16 * 2**20).fill_(1.0)
    b = torch.empty(12 * 2**20).fill_(2.0)
    return float((a[: 12 * 2**20] + b)[0])
for _ in range(12):
    step()
start, size = faults(), resident()
for _ in range(3):
    step()
print(json.dumps({"applied": applied, "faults": faults() - start, "growth": resident() - size}))
"""

PAGES_PER_STEP = (64 + 48 + 48) * 2**20 // 4096


def _probe(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_kept_host_memory_reuses_freed_large_tensors_without_page_faults():
    system = _probe("system")
    kept = _probe("keep")
    assert system["faults"] > 3 * PAGES_PER_STEP // 2  # glibc maps fresh pages at every step
    assert kept["applied"]
    assert kept["faults"] < 3 * PAGES_PER_STEP // 20  # the earlier steps' pages are reused
    assert kept["growth"] < 8 * 2**20  # and the process does not grow from step to step


def test_trainer_keeps_host_memory_on_the_cpu_unless_told_not_to(monkeypatch, tmp_path):
    from torch import nn

    from ember.config import TrainConfig
    from ember.train import loop

    calls = []
    monkeypatch.setattr(loop, "keep_freed_host_memory", lambda: calls.append(1) or True)
    module = nn.Linear(2, 2)
    loop.Trainer(module, [0], TrainConfig(max_steps=1), tmp_path / "a", progress=False)
    assert calls == [1]
    loop.Trainer(module, [0], TrainConfig(max_steps=1, keep_host_memory=False), tmp_path / "b", progress=False)
    assert calls == [1]
