"""Helpers shared by the tests that train: a recipe shrunk to a tiny model, a short
pre-training run, and killing a training process right after a checkpoint (exact resume)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TINY_MODEL
from ember.train.logging import MetricsLogger


def recipe_config(recipe: str, prepared, *extra):
    """A recipe shrunk to a tiny model (conftest.TINY_MODEL) on ``prepared``."""
    from ember.recipes import load_recipe

    return load_recipe(recipe, TINY_MODEL + [f"data.prepared={prepared}", *extra])


def short_run(cfg, run_dir) -> list[dict]:
    """Pre-train ``cfg`` in ``run_dir``; return the logged metric records."""
    from ember.train.pretrain import run_pretraining

    run_pretraining(cfg, run_dir, progress=False)
    return MetricsLogger.read(run_dir / "metrics.jsonl")


SHORT_RUN = ["train.max_steps=40", "train.lr=2e-3", "train.log_every=1", "train.eval_every=40",
             "train.save_every=40", "train.batch_size=16", "train.warmup_ratio=0.1"]


def env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def train_losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in MetricsLogger.read(run / "metrics.jsonl") if r["split"] == "train"}


def kill_after_checkpoint(cmd: list[str], run: Path, step: int, finished_file: str = "model.safetensors",
                          timeout: float = 120) -> None:
    """Start training, wait until the checkpoint of ``step`` exists, then SIGKILL it.

    ``finished_file`` is what only a finished run holds (a fine-tuning run writes best-so-far
    weights while training, so it passes "results.json"): its absence proves the kill came mid-run.
    """
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for_checkpoint(proc, run, step, timeout)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (run / finished_file).exists()  # really killed mid-run


def wait_for_checkpoint(proc: subprocess.Popen, run: Path, step: int, timeout: float) -> None:
    """Poll until a checkpoint of ``step`` or later exists in ``run``; fail if ``proc`` ends first.

    "Or later": with ``train.keep_checkpoints`` the checkpoint of ``step`` is deleted once newer
    ones are saved, so on a busy machine a poller that wakes late would never see it."""
    deadline = time.time() + timeout
    while not saved_steps(run) or max(saved_steps(run)) < step:
        if proc.poll() is not None:
            output = proc.stderr if proc.stderr is not None else proc.stdout
            pytest.fail(f"training ended before step {step}: {str(output.read())[-2000:]}")
        if time.time() > deadline:
            proc.kill()
            pytest.fail("training too slow to reach the checkpoint")
        time.sleep(0.005)


def saved_steps(run: Path) -> list[int]:
    """Steps of the finished checkpoints in ``run`` (folders are renamed into place when complete)."""
    return [int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("step-*") if p.name.split("-")[1].isdigit()]


# Runs `python -m ember ARGS` with a fault at checkpoint save number AT (1-based):
# - "full-disk": the file-size limit (RLIMIT_FSIZE) is lowered to LIMIT bytes just before the save,
#   so every write past it fails with EFBIG (CPython ignores SIGXFSZ), as a disk filling up would;
# - "kill": the process SIGKILLs itself inside the save, after the weights file and before the
#   optimizer state are written (a `kill -9` in the middle of a save).
_FAULT_AT_SAVE = """
import os, resource, signal, sys
import ember.runs.checkpoint as checkpoint
fault, at, limit, argv = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
original_save, original_torch_save, calls = checkpoint.save_checkpoint, checkpoint.torch_save, []
def save_with_a_fault(*args, **kwargs):
    calls.append(1)
    if len(calls) == at and fault == "full-disk":
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return original_save(*args, **kwargs)
def optimizer_save(*args, **kwargs):
    if len(calls) == at and fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    return original_torch_save(*args, **kwargs)
checkpoint.save_checkpoint, checkpoint.torch_save = save_with_a_fault, optimizer_save
from ember.cli import main
sys.exit(main(argv))
"""


def run_with_fault_at_save(ember_args: list[str], at: int, fault: str = "full-disk",
                           limit: int = 64 * 1024) -> subprocess.CompletedProcess:
    """`ember ARGS` whose checkpoint save number ``at`` meets ``fault`` (see above)."""
    return subprocess.run([sys.executable, "-c", _FAULT_AT_SAVE, fault, str(at), str(limit), *ember_args],
                          env=env(), capture_output=True, text=True)


def assert_failed_save_kept_the_last_checkpoint(done: subprocess.CompletedProcess, run: Path, step: int,
                                                kept: int) -> None:
    """The run stopped with one line naming the cause, the failed save left nothing behind, and
    the checkpoint before it is complete and verifies against its manifest."""
    from ember.runs.checkpoint import list_checkpoints, verify_checkpoint

    assert done.returncode == 1, done.stderr[-2000:]
    assert f"could not write the checkpoint of step {step}" in done.stderr, done.stderr[-2000:]
    assert "file-size limit" in done.stderr and f"step-{kept:08d} is intact" in done.stderr
    assert "Traceback" not in done.stderr
    assert [p.name for p in list_checkpoints(run)] == [f"step-{kept:08d}"]
    assert verify_checkpoint(list_checkpoints(run)[0]) is None
    assert not list((run / "checkpoints").glob(".step-*"))  # the half-written save was removed
    assert not (run / "model.safetensors").exists()
