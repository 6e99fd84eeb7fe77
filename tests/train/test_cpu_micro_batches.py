"""CPU micro-batches chosen by ember (``train.micro_batch_tokens``): where the user set no layout
and the loss is one term per example, a batch whose forward pass would hold more tokens than the
budget runs as equal micro-batches, giving the whole batch's update in a fraction of the memory;
a resumed run keeps the layout its checkpoint was written with."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import real_data
from ember.config import ModelConfig, TrainConfig
from ember.data.in_memory import InMemoryData
from ember.errors import EmberError
from ember.train.length_groups import feature_lengths
from ember.train.loop import Trainer
from ember.train.scaling import cpu_micro_batches, effective_config


def test_cpu_micro_batches_cap_the_tokens_of_a_forward_pass():
    cfg = TrainConfig(batch_size=48)  # squad2's batch; the default budget is 12 windows of 384
    assert cfg.micro_batch_tokens == 4608
    cut = cpu_micro_batches(cfg, 1, longest=384)
    assert cut.micro_batch_size == 12 and effective_config(cut, 1).grad_accum == 4
    assert cpu_micro_batches(cfg, 1, longest=1000).micro_batch_size == 4  # the largest divisor that fits
    assert cpu_micro_batches(cfg, 2, longest=384).micro_batch_size == 12  # each rank's 24: two of 12
    assert cpu_micro_batches(TrainConfig(batch_size=35), 1, 384).micro_batch_size == 7  # 5 x 7
    assert cpu_micro_batches(TrainConfig(batch_size=48), 1, 5000).micro_batch_size == 1  # one window each
    untouched = [
        (cfg, 1, 96),  # 48 x 96 fits the budget
        (TrainConfig(batch_size=32), 1, 128),  # classification's defaults (4,096 tokens) fit too
        (cfg, 1, 0),  # a per-token loss, or data without lengths
        (dataclasses.replace(cfg, micro_batch_size=24), 1, 384),  # the user's layout wins
        (dataclasses.replace(cfg, grad_accum=2), 1, 384),
        (dataclasses.replace(cfg, device="cuda"), 1, 384),  # measured on CPUs only
        (dataclasses.replace(cfg, micro_batch_tokens=0), 1, 384),  # turned off
    ]
    for config, world, longest in untouched:
        assert cpu_micro_batches(config, world, longest) == config
    with pytest.raises(EmberError, match="micro_batch_tokens=-1 must be >= 0"):
        cpu_micro_batches(dataclasses.replace(cfg, micro_batch_tokens=-1), 1, 384)


def _real_squad2_windows(limit: int):
    """Real SQuAD 2.0 training windows (up to 384 tokens) under the real MiniLM tokenizer."""
    from ember.tasks.qa.task import SquadAdapter
    from ember.tokenizers import load_tokenizer

    real_data("squad2-dev-half")
    tok = load_tokenizer(real_data("checkpoints", "all-MiniLM-L6-v2", "tokenizer.json"))
    _, features = SquadAdapter("squad2").load("train", tok, 384, limit=limit)
    return InMemoryData(features, feature_lengths(features))


def _tiny_qa(dropout: float):
    from ember.models import build_backbone
    from ember.tasks.qa.head import QuestionAnswering

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=30522, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                      max_position=384, dropout=dropout, attention_dropout=dropout)
    return QuestionAnswering(build_backbone(cfg), pad_id=0)


def _train(data, tmp_path, name, steps, dropout=0.0, resume=False, save_every=0, lr=1e-3, dtype=torch.float32,
           **train):
    cfg = TrainConfig(batch_size=48, lr=lr, max_steps=steps, warmup_steps=0, eval_every=0,
                      save_every=save_every, log_every=1, seed=3, **train)
    trainer = Trainer(_tiny_qa(dropout).to(dtype), data, cfg, tmp_path / name, progress=False)
    trainer.train(resume=resume)
    return trainer


def test_squad2_windows_train_in_cpu_micro_batches_with_the_whole_batch_update(tmp_path, capsys):
    data = _real_squad2_windows(150)
    assert max(data.lengths()) == 384  # real contexts fill whole windows
    # One step in float64 (so summation order cannot blur it), with Adam's eps far above the
    # gradients: its first update is then lr x g / (|g| + eps), a one-to-one image of the gradient
    # (at eps 1e-6 the update is about lr x sign(g), and a near-zero gradient's sign decides it).
    one_step = dict(steps=1, lr=1.0, adam_eps=1.0, dtype=torch.float64)
    auto = _train(data, tmp_path, "auto", **one_step)
    assert (auto.cfg.grad_accum, auto.micro_batch) == (4, 12)
    assert "runs as 4 micro-batches of 12" in capsys.readouterr().err  # a note: stderr, as the others
    whole = _train(data, tmp_path, "whole", micro_batch_tokens=0, **one_step)
    assert (whole.cfg.grad_accum, whole.micro_batch) == (1, 48)
    # without dropout, the mean of 4 means of 12 windows is the mean of 48: the same update
    start = _tiny_qa(0.0).double().state_dict()
    for name, before in start.items():
        moved, expected = auto.module.state_dict()[name] - before, whole.module.state_dict()[name] - before
        assert torch.allclose(moved, expected, rtol=1e-7, atol=1e-12), name
    assert start["qa_outputs.weight"].sub(whole.module.state_dict()["qa_outputs.weight"]).abs().max() > 1e-3


def _interrupted_after_step_2(data, tmp_path, name):
    """A whole-batch run of 4 steps as if killed after its checkpoint of step 2."""
    import shutil

    _train(data, tmp_path, name, steps=4, dropout=0.1, save_every=2, micro_batch_tokens=0)
    shutil.rmtree(tmp_path / name / "checkpoints" / "step-00000004")


def test_resume_keeps_the_checkpoints_micro_batch_layout(tmp_path, capsys):
    """A run checkpointed in whole batches (as before ember chose CPU micro-batches) resumes in
    whole batches, so its dropout draws, hence its weights, are those of the uninterrupted run."""
    data = _real_squad2_windows(100)
    whole = _train(data, tmp_path, "whole", steps=4, dropout=0.1, micro_batch_tokens=0)
    _interrupted_after_step_2(data, tmp_path, "run")
    capsys.readouterr()
    resumed = _train(data, tmp_path, "run", steps=4, dropout=0.1, resume=True)
    assert "written with 1 micro-batch(es) per step" in capsys.readouterr().err
    assert (resumed.cfg.grad_accum, resumed.micro_batch, resumed.step) == (1, 48, 4)
    for (name, a), b in zip(resumed.module.state_dict().items(), whole.module.state_dict().values()):
        assert torch.equal(a, b), name
    # the same resume in 4 micro-batches (what the budget alone would choose) draws other masks
    _interrupted_after_step_2(data, tmp_path, "other")
    other = Trainer(_tiny_qa(0.1), data, TrainConfig(batch_size=48, lr=1e-3, max_steps=4, warmup_steps=0,
                                                       eval_every=0, save_every=0, log_every=1, seed=3,
                                                       micro_batch_size=12), tmp_path / "other", progress=False)
    other.train(resume=True)
    assert not torch.equal(other.module.state_dict()["qa_outputs.weight"], whole.module.state_dict()["qa_outputs.weight"])
