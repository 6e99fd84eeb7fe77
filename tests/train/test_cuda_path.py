"""The trainer's CUDA path: bf16 autocast, fused AdamW, checkpoints that resume anywhere.

The GPU tests skip on a machine without CUDA (this one); they run as they are on a GPU machine
(`pytest tests/train/test_cuda_path.py`). What can be checked without a GPU is checked here too:
the optimizer choice on CPU and the CPU-mapping of checkpoint state.
"""

from __future__ import annotations

import math

import pytest
import torch

from conftest import real_data
from run_helpers import SHORT_RUN, recipe_config, short_run, train_losses
from ember.config import TrainConfig
from ember.runs.checkpoint import load_weights, read_checkpoint

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
# Each GPU test also runs on CPU in fp32 (bf16 is ~100x slower on this CPU), so the test code
# itself is exercised on every machine; the CUDA case is the one that skips without a GPU.
DEVICES = [pytest.param(["train.device=cpu", "train.dtype=float32"], id="cpu-fp32"),
           pytest.param(["train.device=cuda", "train.dtype=bfloat16"], id="cuda-bf16", marks=needs_cuda)]


def _optimizer_for(device: str):
    from ember.train.optim import build_optimizer

    module = torch.nn.Linear(4, 4).to(device)
    return build_optimizer(module, TrainConfig(device=device))


def test_adamw_is_foreach_on_cpu():
    groups = _optimizer_for("cpu").param_groups
    assert all(g["foreach"] and not g["fused"] for g in groups)


@needs_cuda
def test_adamw_is_fused_on_cuda():
    groups = _optimizer_for("cuda").param_groups
    assert all(g["fused"] for g in groups)


def test_checkpoint_optimizer_state_is_read_onto_the_cpu(wiki_prepared, tmp_path):
    """read_checkpoint maps tensors to the CPU, so a GPU checkpoint resumes on a CPU machine
    (on this machine the state was written on CPU: the mapping is checked, not the device)."""
    cfg = recipe_config("bert-mini", wiki_prepared, *SHORT_RUN, "train.max_steps=2", "train.save_every=2")
    short_run(cfg, tmp_path / "run")
    _, optimizer_state, _ = read_checkpoint(next((tmp_path / "run" / "checkpoints").iterdir()))
    tensors = [v for s in optimizer_state["state"].values() for v in s.values() if torch.is_tensor(v)]
    assert tensors and all(t.device.type == "cpu" for t in tensors)


@pytest.mark.parametrize("device", DEVICES)
def test_bert_pretraining_on_the_device_learns_and_its_checkpoint_resumes_on_cpu(device, wiki_prepared, tmp_path):
    cfg = recipe_config("bert-mini", wiki_prepared, *SHORT_RUN, *device)
    records = short_run(cfg, tmp_path / "gpu")
    losses = [r["loss"] for r in records if r["split"] == "train"]
    assert all(math.isfinite(x) for x in losses)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5  # it learns in bf16
    weights = load_weights(tmp_path / "gpu" / "model.safetensors")
    assert all(t.device.type == "cpu" and t.dtype == torch.float32 for t in weights.values())  # fp32 master weights
    # the run's step-40 checkpoint continues on CPU for 10 more steps
    from ember.train.pretrain import run_pretraining

    cpu = recipe_config("bert-mini", wiki_prepared, *SHORT_RUN, "train.max_steps=50")
    run_pretraining(cpu, tmp_path / "gpu", resume=True, progress=False)
    assert max(train_losses(tmp_path / "gpu")) == 50


@needs_cuda
def test_bert_resume_on_cuda_reproduces_the_uninterrupted_losses(wiki_prepared, tmp_path):
    """fp32 on the GPU: the same seeds give the same dropout masks and batches after a resume
    (to 1e-4: cuBLAS and the embedding gradient's atomics are not bit-deterministic)."""
    from ember.train.pretrain import run_pretraining

    sets = [*SHORT_RUN, "train.device=cuda", "train.save_every=20"]
    whole = short_run(recipe_config("bert-mini", wiki_prepared, *sets), tmp_path / "whole")
    short_run(recipe_config("bert-mini", wiki_prepared, *sets, "train.max_steps=20"), tmp_path / "split")
    run_pretraining(recipe_config("bert-mini", wiki_prepared, *sets), tmp_path / "split", resume=True,
                    progress=False)
    expected = {r["step"]: r["loss"] for r in whole if r["split"] == "train"}
    resumed = train_losses(tmp_path / "split")
    assert sorted(resumed) == sorted(expected)
    for step, loss in expected.items():
        assert resumed[step] == pytest.approx(loss, rel=1e-4), step


@pytest.mark.parametrize("device", DEVICES)
def test_sst2_finetuning_on_the_device_scores_the_real_dev_set(device, wiki_prepared, tmp_path):
    import ember

    real_data("glue", "SST-2")
    result = ember.finetune("sst2", tmp_path / "ft", "random", model="bert-tiny", train_limit=3000, epochs=3,
                            lr=1e-3, progress=False, overrides=device,
                            tokenizer=str(wiki_prepared.parent / "tokenizer.json"))
    assert result.metrics["accuracy"] > 0.6  # above the majority class (50.9%): it learned on the device
    assert (tmp_path / "ft" / "model.safetensors").is_file()
