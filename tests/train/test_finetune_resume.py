"""Exact resume of `ember finetune` with the transfer options: a run killed with SIGKILL and
resumed reproduces the uninterrupted run's losses and results (STLR, layer-wise lr decay and
gradual unfreezing are pure functions of the step; early-stopping state is checkpointed)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import real_data
from run_helpers import env, kill_after_checkpoint, train_losses

OPTIONS = {
    "ulmfit": ["--layer-lr-decay", "0.8", "--schedule", "stlr", "--gradual-unfreeze"],
    "features": ["--features", "--schedule", "stlr", "--patience", "1"],
}


def finetune_cmd(tokenizer, run, options, *extra):
    cmd = [sys.executable, "-m", "ember", "finetune", "--task", "sst2", "--model", "bert-tiny", "--tokenizer",
           str(tokenizer), "--out", str(run), "--train-limit", "240", "--batch-size", "8", "--epochs", "3",
           "--max-length", "64", "--lr", "1e-3", "--seed", "2", "--no-progress",
           "--set", "train.save_every=10", "--set", "train.log_every=1", "--set", "train.group_by_length=true"]
    return cmd + OPTIONS[options] + list(extra)


@pytest.mark.slow
@pytest.mark.parametrize("options", sorted(OPTIONS))
def test_finetune_resume_after_kill_reproduces_losses_and_results(options, wiki_prepared, tmp_path):
    real_data("glue", "SST-2")
    tokenizer = wiki_prepared / "tokenizer.json"
    whole = tmp_path / "whole"
    subprocess.run(finetune_cmd(tokenizer, whole, options), env=env(), check=True, capture_output=True)
    run = tmp_path / "run"
    # in epoch 2 (30 steps per epoch); a fine-tuning run holds best-so-far weights, results.json only at the end
    kill_after_checkpoint(finetune_cmd(tokenizer, run, options), run, step=40, finished_file="results.json",
                          timeout=300)
    done = subprocess.run(finetune_cmd(tokenizer, run, options, "--resume"), env=env(), capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resumed from" in done.stdout
    expected, resumed = train_losses(whole), train_losses(run)
    assert len(expected) >= 60 and resumed == expected  # bit-for-bit, every step
    a, b = (json.loads((r / "results.json").read_text()) for r in (whole, run))
    assert (b["metrics"], b["best_step"], b["steps"], b["stopped_early"]) == \
        (a["metrics"], a["best_step"], a["steps"], a["stopped_early"])
    assert b.get("scalar_mix") == a.get("scalar_mix")
    # asked for length-grouped batches (classification's default is shuffled), and the checkpoints say so
    states = [json.loads(p.read_text()) for p in run.glob("**/trainer_state.json")]
    assert states and {s["data_order"] for s in states} == {"length-grouped-spread"}
    # a resume that changes a setting is refused and the saved config.yaml is left as it was
    saved = (run / "config.yaml").read_text()
    changed = subprocess.run(finetune_cmd(tokenizer, run, options, "--resume", "--lr", "5e-3"), env=env(),
                             capture_output=True, text=True)
    assert changed.returncode == 1 and "changes ['train.lr']" in changed.stderr, changed.stderr[-2000:]
    assert (run / "config.yaml").read_text() == saved
