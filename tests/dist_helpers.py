"""Helpers for the tests that train on several gloo ranks (FSDP, sharded checkpoints, elastic
restarts): one `ember pretrain` command line, launched in one process or under torchrun."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from conftest import TINY_MODEL
from run_helpers import env, train_losses, wait_for_checkpoint

ONE_PROCESS = [sys.executable, "-m", "ember"]


def torchrun(ranks: int, *options: str) -> list[str]:
    """`torchrun` on this machine with ``ranks`` local workers running `ember`."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
            *options, "-m", "ember"]


def pretrain_command(launcher: list[str], prepared: Path, run: Path, steps: int, *sets: str,
                     recipe: str = "bert-mini", resume: bool = False) -> list[str]:
    """A tiny, dropout-free pre-training run: global batch 8 as micro-batches of 4 (the same
    micro-batches on 1 or 2 ranks, so the same losses), a checkpoint every 3 steps."""
    cmd = launcher + ["pretrain", "--recipe", recipe, "--data", str(prepared), "--out", str(run),
                      "--max-steps", str(steps), "--no-progress"] + (["--resume"] if resume else [])
    for s in TINY_MODEL + ["train.log_every=1", "train.eval_every=0", "train.save_every=3",
                           "train.batch_size=8", "train.micro_batch_size=4", "train.grad_accum=1", "train.lr=3e-3",
                           "train.warmup_ratio=0.1",
                           "model.dropout=0.0", "model.attention_dropout=0.0", *sets]:
        cmd += ["--set", s]
    return cmd


def run_ok(cmd: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def pretrain(launcher: list[str], prepared: Path, run: Path, steps: int, *sets: str, recipe: str = "bert-mini",
             resume: bool = False) -> dict[int, float]:
    """Run ``pretrain_command`` to the end; the logged training loss per step."""
    run_ok(pretrain_command(launcher, prepared, run, steps, *sets, recipe=recipe, resume=resume))
    return train_losses(run)


def assert_same_losses(got: dict[int, float], want: dict[int, float], rel: float = 1e-5) -> None:
    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    for step in want:
        assert abs(got[step] - want[step]) <= rel * max(1.0, abs(want[step])), (step, got[step], want[step])


def children(pid: int) -> list[int]:
    """The processes ``pid`` started (torchrun's workers), from /proc."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def kill_one_rank_after_checkpoint(cmd: list[str], run: Path, step: int, timeout: float = 180) -> subprocess.Popen:
    """Start ``cmd`` (torchrun with 2 workers), wait for the checkpoint of ``step``, then SIGKILL
    one worker: the way a machine or a process dies. Returns torchrun's finished process."""
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for_checkpoint(proc, run, step, timeout)
    workers = children(proc.pid)
    assert len(workers) == 2, workers
    os.kill(workers[-1], signal.SIGKILL)
    proc.output = proc.communicate(timeout=timeout)[0]
    return proc
