"""The trainer's CUDA path: bf16 autocast, fused AdamW, checkpoints that resume anywhere (and
the same bf16 path on CPUs with AMX).

The GPU tests skip on a machine without CUDA (this one); they run as they are on a GPU machine
(`pytest tests/train/test_cuda_path.py`). What can be checked without a GPU is checked here too:
the optimizer choice on CPU (fused there too) and the CPU-mapping of checkpoint state.
"""

from __future__ import annotations

import math
import shutil

import pytest
import torch

from conftest import real_data
from run_helpers import SHORT_RUN, recipe_config, short_run, train_losses
from ember.config import TrainConfig
from ember.runs.checkpoint import load_weights, read_checkpoint
from ember.train.precision import cpu_has_fast_bf16

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_amx = pytest.mark.skipif(not cpu_has_fast_bf16(), reason="bf16 on a CPU without AMX is ~100x slower than fp32")
# Each GPU test also runs on CPU in fp32, so the test code itself is exercised on every machine,
# and in bf16 on CPUs with AMX (Intel Xeon 4th gen+), where CPU bf16 training is the fast choice.
DEVICES = [pytest.param(["train.device=cpu", "train.dtype=float32"], id="cpu-fp32"),
           pytest.param(["train.device=cpu", "train.dtype=bfloat16"], id="cpu-bf16", marks=needs_amx),
           pytest.param(["train.device=cuda", "train.dtype=bfloat16"], id="cuda-bf16", marks=needs_cuda)]


def _optimizer_for(device: str):
    from ember.train.optim import build_optimizer

    module = torch.nn.Linear(4, 4).to(device)
    return build_optimizer(module, TrainConfig(device=device))


def test_adamw_is_fused_on_cpu_and_updates_as_the_foreach_kernel_does():
    groups = _optimizer_for("cpu").param_groups
    assert all(g["fused"] for g in groups)
    torch.manual_seed(0)
    fused, looped = torch.nn.Linear(16, 8), torch.nn.Linear(16, 8)
    looped.load_state_dict(fused.state_dict())
    optimizers = [torch.optim.AdamW(fused.parameters(), lr=1e-2, fused=True),
                  torch.optim.AdamW(looped.parameters(), lr=1e-2, foreach=True)]
    x = torch.randn(32, 16)
    for _ in range(5):
        for module, opt in zip((fused, looped), optimizers):
            module(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(fused.parameters(), looped.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


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


@pytest.mark.parametrize("device", DEVICES)
def test_bert_resume_on_the_device_reproduces_the_logged_losses(device, wiki_prepared, tmp_path):
    """Steps 21-40 retrained from the step-20 checkpoint give the losses first logged for them:
    the same seeds give the same batches and dropout masks after a resume (on a GPU to 1e-4:
    cuBLAS and the embedding gradient's atomics are not bit-deterministic; in bf16 to 1e-2)."""
    from ember.train.pretrain import run_pretraining

    cfg = recipe_config("bert-mini", wiki_prepared, *SHORT_RUN, *device, "train.save_every=20")
    run = tmp_path / "run"
    short_run(cfg, run)
    logged = train_losses(run)
    shutil.rmtree(run / "checkpoints" / "step-00000040")
    (run / "model.safetensors").unlink()
    run_pretraining(cfg, run, resume=True, progress=False)
    again = train_losses(run)  # the resumed records come last, so they are the ones kept per step
    tolerance = 1e-2 if "train.dtype=bfloat16" in device else 1e-4
    assert sorted(again) == list(range(1, 41))
    for step in range(21, 41):
        assert again[step] == pytest.approx(logged[step], rel=tolerance), step


@pytest.mark.parametrize("device", DEVICES)
def test_sst2_finetuning_on_the_device_scores_the_real_dev_set(device, wiki_prepared, tmp_path):
    import ember

    real_data("glue", "SST-2")
    result = ember.finetune("sst2", tmp_path / "ft", "random", model="bert-tiny", train_limit=3000, epochs=3,
                            lr=1e-3, progress=False, overrides=device,
                            tokenizer=str(wiki_prepared.parent / "tokenizer.json"))
    assert result.metrics["accuracy"] > 0.6  # above the majority class (50.9%): it learned on the device
    assert (tmp_path / "ft" / "model.safetensors").is_file()
