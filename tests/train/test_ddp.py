"""DDP under torchrun (gloo on CPU): 2 ranks give the same losses as 1 process accumulating 2."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import TINY_MODEL
from ember.train.logging import MetricsLogger


def run_pretrain(prepared, run, launcher: list[str], *sets: str) -> dict[int, float]:
    cmd = launcher + ["pretrain", "--recipe", "bert-mini", "--data", str(prepared), "--out", str(run),
                      "--max-steps", "12", "--no-progress"]
    for s in TINY_MODEL + ["train.log_every=1", "train.eval_every=0", "train.save_every=6",
                           "train.batch_size=8", "model.dropout=0.0", "model.attention_dropout=0.0",
                           *sets]:
        cmd += ["--set", s]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return {r["step"]: r["loss"] for r in MetricsLogger.read(run / "metrics.jsonl") if r["split"] == "train"}


def test_ddp_two_ranks_match_one_process_with_grad_accumulation(wiki_prepared, tmp_path):
    single = run_pretrain(wiki_prepared, tmp_path / "single", [sys.executable, "-m", "ember"],
                          "train.grad_accum=2")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                "-m", "ember"]
    ddp = run_pretrain(wiki_prepared, tmp_path / "ddp", torchrun)
    assert sorted(ddp) == sorted(single) == list(range(1, 13))
    for step in single:
        assert abs(ddp[step] - single[step]) < 1e-4 * max(1.0, abs(single[step])), step
    # only rank 0 writes the run folder's logs and checkpoints
    assert (tmp_path / "ddp" / "model.safetensors").is_file()
    assert len(list((tmp_path / "ddp" / "checkpoints").glob("step-*"))) == 2
