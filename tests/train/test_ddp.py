"""DDP under torchrun (gloo on CPU): 2 ranks give the same losses as 1 process accumulating 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import TINY_MODEL
from ember.train.logging import MetricsLogger


def run_pretrain(prepared, run, launcher: list[str], *sets: str) -> tuple[dict[int, float], str]:
    """(the logged training loss per step, the command's stdout)"""
    cmd = launcher + ["pretrain", "--recipe", "bert-mini", "--data", str(prepared), "--out", str(run),
                      "--max-steps", "12", "--no-progress"]
    # the vocabulary left to the recipe: sized to the corpus tokenizer's 2,000 (and said so)
    for s in [s for s in TINY_MODEL if not s.startswith("model.vocab_size=")] + ["train.log_every=1", "train.eval_every=0", "train.save_every=6",
                           "train.batch_size=8", "model.dropout=0.0", "model.attention_dropout=0.0",
                           *sets]:
        cmd += ["--set", s]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return {r["step"]: r["loss"] for r in MetricsLogger.read(run / "metrics.jsonl") if r["split"] == "train"}, done.stdout


def test_ddp_two_ranks_match_one_process_with_grad_accumulation(wiki_prepared, tmp_path):
    single, _ = run_pretrain(wiki_prepared, tmp_path / "single", [sys.executable, "-m", "ember"],
                             "train.grad_accum=2")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                "-m", "ember"]
    ddp, printed = run_pretrain(wiki_prepared, tmp_path / "ddp", torchrun)
    assert sorted(ddp) == sorted(single) == list(range(1, 13))
    for step in single:
        assert abs(ddp[step] - single[step]) < 1e-4 * max(1.0, abs(single[step])), step
    # only rank 0 writes the run folder's logs and checkpoints
    assert (tmp_path / "ddp" / "model.safetensors").is_file()
    assert len(list((tmp_path / "ddp" / "checkpoints").glob("step-*"))) == 2
    # and rank 0 alone says what every rank did (the recipe's vocabulary sized to the corpus, the end)
    assert printed.count("the corpus tokenizer's size") == 1 and printed.count("stopped at step 12") == 1, printed


# A launcher that slows one rank down (CPU burnt after each step, so train.clock=cpu sees it)
# or delivers a stop signal to one rank only, and has every rank dump its step and weights.
RANK_SCRIPT = """
import os, signal, sys, time
import torch
from safetensors.torch import save_file
from ember.train import loop

rank, out = int(os.environ["RANK"]), sys.argv.pop(1)
train_step, train = loop.Trainer.train_step, loop.Trainer.train

def slowed(self, model):
    result = train_step(self, model)
    if rank == int(os.environ.get("SLOW_RANK", "-1")):
        end = time.process_time() + 0.05
        while time.process_time() < end:
            pass
    if rank == int(os.environ.get("SIGNAL_RANK", "-1")) and self.step == 2:  # the 3rd step is under way
        os.kill(os.getpid(), signal.SIGTERM)
    return result

def dumped(self, *args, **kwargs):
    try:
        return train(self, *args, **kwargs)
    finally:
        state = {k: v.detach().clone().contiguous() for k, v in self.module.state_dict().items()}
        save_file(state, f"{out}/rank{rank}.safetensors", {"step": str(self.step)})

loop.Trainer.train_step, loop.Trainer.train = slowed, dumped
from ember.cli import main
sys.exit(main(sys.argv[1:]))
"""


def run_two_ranks(tmp_path, name: str, sets: list[str], **env) -> tuple[int, dict, dict]:
    """(exit code, {rank: step}, {rank: weights}) of a 2-rank torchrun pre-training run."""
    from safetensors import safe_open

    script = tmp_path / "rank_script.py"
    script.write_text(RANK_SCRIPT)
    run, dumps = tmp_path / name, tmp_path / f"{name}-dumps"
    dumps.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
           str(dumps), "pretrain", "--recipe", "bert-mini", "--data", str(env.pop("prepared")), "--out", str(run),
           "--no-progress"]
    for s in TINY_MODEL + ["train.batch_size=8", "train.log_every=1", "train.eval_every=0", *sets]:
        cmd += ["--set", s]
    done = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1", **env}, capture_output=True, text=True,
                          timeout=240)
    steps, weights = {}, {}
    for rank in (0, 1):
        if not (dumps / f"rank{rank}.safetensors").is_file():
            pytest.fail(f"rank {rank} never left its training loop (exit {done.returncode}): {done.stderr[-2000:]}")
        with safe_open(str(dumps / f"rank{rank}.safetensors"), "pt") as fh:
            steps[rank] = int(fh.metadata()["step"])
            weights[rank] = {k: fh.get_tensor(k) for k in fh.keys()}
    return done.returncode, steps, weights


@pytest.mark.slow
def test_ddp_time_budget_rank0_decides_when_one_rank_is_slow(wiki_prepared, tmp_path):
    """Rank 1 burns 50 ms of CPU per step, so its own CPU clock would end a 0.5 s budget long before
    rank 0's and leave rank 0 hanging in its next all-reduce. Rank 0 decides the budget and the
    time-based learning rate for both: same last step, same weights."""
    import torch

    code, steps, weights = run_two_ranks(
        tmp_path, "budget", ["train.max_steps=1000", "train.max_time=0.5", "train.clock=cpu", "train.schedule=time",
                             "train.warmup_ratio=0.3", "train.save_every=0"], prepared=wiki_prepared, SLOW_RANK="1")
    assert code == 0
    assert steps[0] == steps[1] and 1 < steps[0] < 1000
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_ddp_stop_signal_on_one_rank_stops_both_at_the_same_step(wiki_prepared, tmp_path):
    import torch

    code, steps, weights = run_two_ranks(tmp_path, "signal", ["train.max_steps=50", "train.save_every=0"],
                                         prepared=wiki_prepared, SIGNAL_RANK="1")
    assert code == 1  # TrainingInterrupted: a stopped run is not a finished one
    assert steps[0] == steps[1] == 3  # the step under way when the signal came is finished, then both stop
    assert (tmp_path / "signal" / "checkpoints" / "step-00000003").is_dir()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
