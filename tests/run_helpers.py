"""Helpers shared by the tests that train: a recipe shrunk to a tiny model, a short
pre-training run, and killing a training process right after a checkpoint (exact resume)."""

from __future__ import annotations

import os
import signal
import subprocess
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
