"""Exact resume of a multi-task run: killed with SIGKILL after a checkpoint and resumed, it trains the
same task at every step with the same losses, and keeps the same best checkpoint per task, as the
uninterrupted run (the mixture schedule is a function of the seed and the step: ember.train.mixture)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import real_data
from ember.train.logging import MetricsLogger
from multitask_helpers import TINY_MODEL, glue_tokenizer
from run_helpers import env, kill_after_checkpoint

NAMES = ("rte", "stsb")


def multitask_cmd(tokenizer, run, *extra):
    cmd = [sys.executable, "-m", "ember", "finetune", "--tasks", ",".join(NAMES), "--model", "bert-tiny",
           "--tokenizer", str(tokenizer), "--out", str(run), "--train-limit", "48", "--batch-size", "8",
           "--epochs", "3", "--max-length", "48", "--lr", "1e-3", "--seed", "2", "--no-progress",
           "--mixing", "proportional", "--set", "train.save_every=5", "--set", "train.log_every=1"]
    return cmd + [a for o in TINY_MODEL for a in ("--set", o)] + list(extra)


def steps_and_losses(run) -> list[tuple[int, str, float]]:
    """(step, the step's task, its loss) of every training step logged."""
    return [(r["step"], next(n for n in NAMES if f"{n}.loss" in r), r["loss"])
            for r in MetricsLogger.read(run / "metrics.jsonl") if r["split"] == "train"]


@pytest.mark.slow
def test_multitask_resume_after_kill_matches(tmp_path):
    real_data("glue", "RTE")
    tokenizer = glue_tokenizer(tmp_path / "tokenizer.json")
    whole = tmp_path / "whole"
    subprocess.run(multitask_cmd(tokenizer, whole), env=env(), check=True, capture_output=True)
    run = tmp_path / "run"
    # 96 examples in batches of 8: 12 steps per epoch, 36 in all; killed in epoch 2, after its first evaluation
    kill_after_checkpoint(multitask_cmd(tokenizer, run), run, step=15, finished_file="results.json", timeout=300)
    done = subprocess.run(multitask_cmd(tokenizer, run, "--resume"), env=env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resumed from" in done.stdout
    expected, resumed = steps_and_losses(whole), steps_and_losses(run)
    assert len(expected) == 36 and resumed == expected  # the same task and loss, bit for bit, every step
    assert {task for _, task, _ in expected} == set(NAMES)
    for name in NAMES:
        a, b = (json.loads((r / "tasks" / name / "results.json").read_text()) for r in (whole, run))
        assert (b["metrics"], b["best_step"], b["task_steps"]) == (a["metrics"], a["best_step"], a["task_steps"])
    a, b = (json.loads((r / "summary.json").read_text()) for r in (whole, run))
    assert a == b
