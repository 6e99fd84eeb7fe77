"""Exact resume: a pre-training process killed with SIGKILL continues with the same losses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TINY_MODEL
from run_helpers import env, kill_after_checkpoint, train_losses, wait_for_checkpoint

STEPS = 240


def pretrain_cmd(prepared: Path, run: Path, *extra: str) -> list[str]:
    sets = TINY_MODEL + ["train.save_every=20", "train.log_every=1", "train.eval_every=0",
                         "train.batch_size=8", "train.lr=1e-3"]
    cmd = [sys.executable, "-m", "ember", "pretrain", "--recipe", "bert-mini", "--data", str(prepared),
           "--out", str(run), "--max-steps", str(STEPS), "--no-progress"]
    for s in sets:
        cmd += ["--set", s]
    return cmd + list(extra)


@pytest.fixture(scope="module")
def uninterrupted(wiki_prepared, tmp_path_factory):
    run = tmp_path_factory.mktemp("uninterrupted") / "run"
    subprocess.run(pretrain_cmd(wiki_prepared, run), env=env(), check=True, capture_output=True)
    losses = train_losses(run)
    assert sorted(losses) == list(range(1, STEPS + 1))
    return losses


def test_resume_after_kill_matches_uninterrupted_losses(wiki_prepared, uninterrupted, tmp_path):
    run = tmp_path / "run"
    kill_after_checkpoint(pretrain_cmd(wiki_prepared, run), run, step=60)
    done = subprocess.run(pretrain_cmd(wiki_prepared, run, "--resume"), env=env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resumed from" in done.stdout
    resumed = train_losses(run)
    assert sorted(resumed) == list(range(1, STEPS + 1))  # no duplicated or missing steps
    assert resumed == uninterrupted  # bit-for-bit the same losses


def test_resume_skips_a_corrupt_checkpoint_and_still_matches(wiki_prepared, uninterrupted, tmp_path):
    run = tmp_path / "run"
    kill_after_checkpoint(pretrain_cmd(wiki_prepared, run), run, step=80)
    newest = sorted((run / "checkpoints").glob("step-*"))[-1]
    weights = newest / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a torn write
    (run / "checkpoints" / ".step-00000100.abc.tmp").mkdir()  # a half-written checkpoint folder
    done = subprocess.run(pretrain_cmd(wiki_prepared, run, "--resume"), env=env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"checkpoint {newest} is damaged" in done.stderr
    assert train_losses(run) == uninterrupted
    assert not list((run / "checkpoints").glob(".step-*.tmp"))  # the next save cleared the half-written one


def test_resume_with_only_damaged_checkpoints_is_a_clear_error(wiki_prepared, tmp_path):
    run = tmp_path / "run"
    kill_after_checkpoint(pretrain_cmd(wiki_prepared, run), run, step=20)
    for manifest in (run / "checkpoints").glob("step-*/manifest.json"):
        manifest.unlink()
    done = subprocess.run(pretrain_cmd(wiki_prepared, run, "--resume"), env=env(), capture_output=True, text=True)
    assert done.returncode == 1
    assert "no intact checkpoint" in done.stderr and "Traceback" not in done.stderr


def test_sigterm_stops_with_a_checkpoint_and_no_final_weights_then_resume_matches(
        wiki_prepared, uninterrupted, tmp_path):
    """SIGTERM (a scheduler's or `kill`) finishes the step, saves, and exits as *interrupted*:
    no final model.safetensors that a script could take for a finished run."""
    run = tmp_path / "run"
    proc = subprocess.Popen(pretrain_cmd(wiki_prepared, run), env=env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    wait_for_checkpoint(proc, run, 40, timeout=120)  # fails with the process's stderr if it ended first
    os.kill(proc.pid, signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr[-2000:]
    assert "stopped by a signal" in stderr and "--resume" in stderr and "Traceback" not in stderr
    assert not (run / "model.safetensors").exists()
    steps = [int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("step-*")]
    assert steps and max(steps) < STEPS
    done = subprocess.run(pretrain_cmd(wiki_prepared, run, "--resume"), env=env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert train_losses(run) == uninterrupted
