"""Helpers for the tests that train on several gloo ranks (FSDP, sharded checkpoints, elastic
restarts): one `ember pretrain` command line, launched in one process or under torchrun."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
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


# `torchrun ... SCRIPT FAULT AT RANK LIMIT ember-args`: an `ember` run on gloo ranks whose rank
# RANK meets FAULT at its sharded checkpoint save number AT (1-based):
# - "full-disk": the file-size limit (RLIMIT_FSIZE) of that rank alone is lowered to LIMIT bytes
#   just before the save, so its shard write fails with EFBIG (CPython ignores SIGXFSZ), as a full
#   disk on one machine would, while the other ranks write theirs;
# - "kill": that rank SIGKILLs itself inside the save, once the first tensor of its shard file is
#   written (a `kill -9` in the middle of a save).
_FAULT_AT_SHARDED_SAVE = """
import os, resource, signal, sys
import ember.train.loop as loop
import torch.distributed.checkpoint.filesystem as dcp_files
fault, at, rank, limit, argv = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
mine, calls = int(os.environ["RANK"]) == rank, []
original_save, original_write_item = loop.save_sharded_checkpoint, dcp_files._write_item
def save_with_a_fault(*args, **kwargs):
    calls.append(1)
    if len(calls) == at and mine and fault == "full-disk":
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return original_save(*args, **kwargs)
def write_item(*args, **kwargs):
    written = original_write_item(*args, **kwargs)
    if len(calls) == at and mine and fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    return written
loop.save_sharded_checkpoint, dcp_files._write_item = save_with_a_fault, write_item
from ember.cli import main
sys.exit(main(argv))
"""


def torchrun_with_fault_at_save(folder: Path, fault: str, at: int, rank: int, limit: int = 64 * 1024) -> list[str]:
    """A launcher for ``pretrain_command``: `torchrun` with 2 workers running `ember`, whose rank
    ``rank`` meets ``fault`` at sharded save number ``at`` (see above); the script goes in ``folder``.

    torchrun looks at its workers every 2 s instead of every 0.1 s: when one dies it SIGTERMs the
    others, and on a loaded machine that could cut a survivor off between its error and the line
    that reports it, which the tests read."""
    script = Path(folder) / "fault_at_sharded_save.py"
    script.write_text(_FAULT_AT_SHARDED_SAVE)
    return torchrun(2, "--monitor-interval=2")[:-2] + [str(script), fault, str(at), str(rank), str(limit)]


def run_bounded(cmd: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    """Run ``cmd`` (torchrun) to its end; if it is still running after ``timeout`` seconds (a rank
    waiting in a collective for one that gave up), SIGKILL it and its workers and fail: a broken
    case fails the test instead of hanging it. stdout and stderr together, as a user sees them."""
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output = proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        for worker in children(proc.pid):  # torchrun starts each worker in a session of its own
            os.kill(worker, signal.SIGKILL)
        proc.kill()
        output = proc.communicate()[0]
        pytest.fail(f"still running after {timeout} s: a rank hangs\n{output[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, output, "")
