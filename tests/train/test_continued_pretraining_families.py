"""`ember pretrain --init RUN` (ember.api.continued) for every pre-training family: a GPT-1, a
GPT-2, a T5, a BART, a MASS run, an XLNet and an XLM, each pre-trained here for a few steps on
real text (Wikipedia; English + Russian for XLM) and continued with its own objective on the same
shards, tokenized with the init's tokenizer. The MLM encoders are in test_continued_pretraining.py."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import real_data
from ember.cli import main
from ember.runs.checkpoint import load_weights
from ember.runs.folder import load_run_config
from run_helpers import env, kill_after_checkpoint, train_losses

# 2 layers x 32 (4H feed-forward), 64 positions, blocks of 32 tokens: every family steps in well under a second
SHAPE = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=128",
         "model.max_position=64"]
STEPS = ["data.max_seq_length=32", "data.eval_examples=8", "train.batch_size=4", "train.grad_accum=1",
         "train.log_every=1", "train.eval_every=0", "train.save_every=0", "train.num_threads=1"]
NO_DROPOUT = ["model.dropout=0", "model.attention_dropout=0"]  # settings the init leaves free: losses comparable

# family -> (the init's recipe, its corpus fixture, model settings beyond SHAPE, the objective it continues with)
FAMILIES = {
    "gpt2": ("gpt2-mini", "wiki_bpe", [], "clm"),
    "gpt": ("gpt1-mini", "wiki_bpe", [], "clm"),
    "t5": ("t5-mini", "wiki_t5_prepared", ["model.head_dim=16"], "span_corruption"),
    "bart": ("bart-mini", "wiki_bpe", [], "bart"),
    "mass": ("mass-mini", "wiki_bpe", [], "mass"),  # a BART-shaped run pre-trained with MASS
    "xlnet": ("xlnet-mini", "wiki_prepared", ["model.mem_len=16"], "plm"),
    "xlm": ("xlm-mini", "en_ru", [], "xlm_mlm"),
}


def sets(*items: str) -> list[str]:
    return [a for s in items for a in ("--set", s)]


@pytest.fixture(scope="module")
def inits(request, tmp_path_factory):
    """family -> (init run, its prepared corpus): made on first use, 3 steps of its own recipe."""
    made = {}

    def get(family: str):
        if family not in made:
            recipe, corpus, model, _ = FAMILIES[family]
            prepared = request.getfixturevalue(corpus)
            run = tmp_path_factory.mktemp(family) / "init"
            assert main(["pretrain", "--recipe", recipe, "--data", str(prepared), "--out", str(run), "--max-steps",
                         "3", "--lr", "1e-3", "--no-progress", *sets(*SHAPE, *model, *STEPS)]) == 0
            made[family] = run, prepared
        return made[family]

    return get


def continued_setup(init, prepared, out, *overrides):
    """The objective module `ember pretrain --init` trains, before its first step."""
    from ember.api.pretrain import pretrain_config
    from ember.objectives.setup import setup_pretraining

    cfg = pretrain_config(None, out, prepared, list(overrides), init=init)
    torch.manual_seed(cfg.train.seed)
    return cfg, setup_pretraining(cfg, out, False, False)


def init_loss_on_first_batch(init: Path, run: Path, scratch: Path) -> float:
    """The loss of the init's own weights on the continued run's first batch: the run's objective
    built afresh from its saved settings (random weights, no --init), then every tensor of the
    init's model.safetensors loaded strictly, and one training step's forward on the batch the
    trainer draws first (its order, its corruption seed)."""
    from ember.objectives.setup import setup_pretraining
    from ember.train.loop import Trainer

    cfg = load_run_config(run)
    setup = setup_pretraining(dataclasses.replace(cfg, init=""), scratch, False, False)
    setup.module.load_state_dict(load_weights(init / "model.safetensors"))  # strict: heads included
    trainer = Trainer(setup.module, setup.train_data, setup.cfg.train, scratch, progress=False)
    metrics, _ = trainer.train_step(trainer.module)
    return metrics["loss"]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_continued_pretraining_starts_from_the_init_exactly_and_continues_its_own_objective(
        family, inits, tmp_path):
    init, prepared = inits(family)
    objective = FAMILIES[family][3]
    cfg, setup = continued_setup(init, prepared, tmp_path / "probe")
    init_cfg, state = load_run_config(init), load_weights(init / "model.safetensors")
    assert (cfg.objective, cfg.model, cfg.init) == (objective, init_cfg.model, str(init))
    assert cfg.data.max_seq_length == 64  # the family recipe's 128 or 256 tokens, cut to the init's 64 positions
    own = setup.module.state_dict()
    assert set(own) == set(state)  # the same objective: its heads (lm.bias, final_logits_bias, ...) all come along
    for name, tensor in own.items():
        assert torch.equal(tensor, state[name]), name  # exact: the init's tensors themselves
    run = tmp_path / "run"
    assert main(["pretrain", "--init", str(init), "--data", str(prepared), "--out", str(run), "--max-steps", "8",
                 "--lr", "5e-3", "--no-progress", *sets(*STEPS, *NO_DROPOUT, "train.warmup_steps=1")]) == 0
    saved = load_run_config(run)
    assert saved.objective == objective and saved.model == dataclasses.replace(init_cfg.model, dropout=0.0,
                                                                               attention_dropout=0.0)
    assert json.loads((run / "recipe.json").read_text())["recipe"] == FAMILIES[family][0]
    losses = [loss for _, loss in sorted(train_losses(run).items())]
    assert len(losses) == 8 and all(loss == loss for loss in losses)
    # the first step's forward is the init model on the run's first batch: the same module code, batch,
    # seeds and thread count on both sides, so the same float operations in the same order
    assert losses[0] == init_loss_on_first_batch(init, run, tmp_path / "scratch")
    # it trains on: held-out loss below the init's, on the same held-out examples with the same masks
    # (both runs evaluate data.eval_examples of 32 tokens at their end; 3 steps from random is far from the floor)
    assert held_out_loss(run) < held_out_loss(init)


def held_out_loss(run: Path) -> float:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
            if json.loads(line)["split"] == "eval"][-1]["loss"]
