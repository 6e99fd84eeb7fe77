"""Shared by the benchmark smoke tests: load a script of benchmarks/ as a module, and keep the
torch thread count the scripts change (they pin one thread per run)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_benchmark(name: str):
    """A script of benchmarks/ by name, from whichever room it is in (speed/, studies/, tools/, or
    common/ for the shared helpers, which the scripts find on sys.path)."""
    found = sorted(BENCHMARKS.glob(f"*/{name}.py")) + sorted(BENCHMARKS.glob(f"{name}.py"))  # headline.py: top
    assert len(found) == 1, f"benchmarks/*/{name}.py: found {found}"
    # as `python benchmarks/ROOM/NAME.py` would see them: its own folder (scripts of one room import
    # each other) and the shared helpers
    for folder in (BENCHMARKS / "common", found[0].parent):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", found[0])
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import would: dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def keep_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
