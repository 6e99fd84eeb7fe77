"""train.dropout_off_fraction: BART's "we disable dropout for the final 10% of training steps"
(Lewis et al. 2020, §5.1): the Trainer switches every dropout off from step
ceil((1 - fraction) * max_steps) on; the bart recipes ask for it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from ember.config import TrainConfig, load_yaml
from ember.errors import EmberError
from ember.nn.dropout import Dropout, switch_off_dropout
from ember.recipes import recipe_path
from ember.train import loop
from ember.train.logging import MetricsLogger


class _DropoutProbe(nn.Module):
    """A linear fit whose input goes through dropout; it logs the share of inputs dropped."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(64, 1)
        self.drop = Dropout(0.5)
        self.dropout_p = 0.5  # as ember's attention modules keep theirs

    def make_batch(self, examples, rng):
        return {"x": torch.tensor(examples, dtype=torch.float32)}

    def forward(self, batch):
        x = batch["x"] + 1.0  # no zeros of its own
        dropped = self.drop(x)
        loss = self.lin(dropped).pow(2).mean()
        n = len(x)
        return loss, {"loss": (loss.item() * n, n), "dropped": (float((dropped == 0).float().mean()) * n, n),
                      "attention_p": (self.dropout_p * n, n)}


class _Data:
    def __len__(self) -> int:
        return 16

    def example(self, index: int, epoch: int):
        return [index * 0.01] * 64


def test_dropout_is_off_for_the_last_fraction_of_the_steps(tmp_path):
    cfg = TrainConfig(max_steps=10, dropout_off_fraction=0.3, lr=1e-3, batch_size=4, log_every=1, eval_every=0,
                      save_every=0)
    assert loop.dropout_off_step(cfg) == 7  # steps 7, 8, 9 (0-based): the last 30%
    loop.Trainer(_DropoutProbe(), _Data(), cfg, tmp_path / "run", progress=False).train()
    rows = {r["step"]: r for r in MetricsLogger.read(tmp_path / "run" / "metrics.jsonl") if r["split"] == "train"}
    on, off = [rows[s] for s in range(1, 8)], [rows[s] for s in range(8, 11)]  # logged steps count from 1
    assert all(0.4 < r["dropped"] < 0.6 and r["attention_p"] == 0.5 for r in on)  # p = 0.5 over 256 inputs
    assert all(r["dropped"] == 0.0 and r["attention_p"] == 0.0 for r in off)
    # the default never switches it off
    cfg = TrainConfig(max_steps=3, lr=1e-3, batch_size=4, log_every=1, eval_every=0, save_every=0)
    loop.Trainer(_DropoutProbe(), _Data(), cfg, tmp_path / "never", progress=False).train()
    assert all(r["dropped"] > 0.4 for r in MetricsLogger.read(tmp_path / "never" / "metrics.jsonl")
               if r["split"] == "train")
    with pytest.raises(EmberError, match="dropout_off_fraction"):
        loop.Trainer(_DropoutProbe(), _Data(), TrainConfig(dropout_off_fraction=1.0), tmp_path / "bad", progress=False)


def test_switch_off_dropout_makes_a_bart_backbone_deterministic_in_training_mode():
    """Every dropout of BART's encoder-decoder (embeddings, sub-layer outputs, feed-forward
    activations, self- and cross-attention probabilities) is reached."""
    import dataclasses

    from ember.config import model_preset
    from ember.models import build_backbone

    cfg = dataclasses.replace(model_preset("bart-tiny"), vocab_size=200, hidden_size=32, num_heads=2,
                              intermediate_size=64, dropout=0.1, attention_dropout=0.1)
    torch.manual_seed(0)
    model = build_backbone(cfg).train()
    ids = torch.from_numpy(np.random.default_rng(0).integers(5, 200, (2, 12)))

    def run():
        return model(ids, torch.ones_like(ids), decoder_input_ids=model.shift_right(ids)).last_hidden_state

    assert not torch.equal(run(), run())
    assert switch_off_dropout(model) > 0
    assert torch.equal(run(), run())
    model.eval()
    torch.testing.assert_close(run(), model.train()(ids, torch.ones_like(ids),
                                                    decoder_input_ids=model.shift_right(ids)).last_hidden_state)


@pytest.mark.parametrize("name", ["bart-mini", "bart-base"])
def test_bart_recipes_switch_dropout_off_for_the_final_tenth(name):
    assert load_yaml(recipe_path(name))["train"]["dropout_off_fraction"] == 0.1
