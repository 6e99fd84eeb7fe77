"""Dai & Le 2015's LSTM pre-training (objectives lstm_lm and seq_autoencoder): both losses by hand,
the autoencoder's decoder starting from the encoder's final state, learning on real NSMC reviews,
exact resume after a kill, the recipes."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from lstm_helpers import TINY_LSTM, lstm_by_hand, nsmc_prepared, tiny_lstm_config

PIECES = [np.array([3, 4, 5]), np.array([6])]  # two documents' tokens; framed [1] ... [2]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return nsmc_prepared(tmp_path_factory.mktemp("nsmc"))


def _objective(cls):
    from ember.models import build_backbone

    torch.manual_seed(0)
    module = cls(build_backbone(tiny_lstm_config()), prefix=[1], suffix=[2], pad_id=0)
    with torch.no_grad():  # a softmax whose logits differ a lot, so the losses differ from log V
        module.softmax.weight.mul_(8.0)
    return module.eval()


def _nll_by_hand(module, hidden: torch.Tensor, targets: list[int]) -> list[torch.Tensor]:
    logits = hidden @ module.softmax.weight.T + module.softmax.bias  # (n, V)
    return [-logits[i].log_softmax(-1)[t] for i, t in enumerate(targets)]


def test_lstm_lm_loss_is_next_token_nll_by_hand_over_framed_documents():
    from ember.objectives.dai_le import LstmLanguageModel

    module = _objective(LstmLanguageModel)
    batch = module.make_batch(PIECES, np.random.default_rng(0))
    assert batch["input_ids"].tolist() == [[1, 3, 4, 5, 2], [1, 6, 2, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    with torch.no_grad():
        loss, metrics = module(batch)
        terms = []
        for row in ([1, 3, 4, 5, 2], [1, 6, 2]):
            top, _ = lstm_by_hand(module.backbone.lstm.layers, module.backbone.embeddings.weight[row])
            terms += _nll_by_hand(module, top[:-1], row[1:])  # position t predicts t + 1
    assert len(terms) == 6 and metrics["lm_loss"][1] == 6
    torch.testing.assert_close(loss, torch.stack(terms).mean(), atol=1e-5, rtol=0)
    assert module.derived_metrics({"lm_loss": 2.0}) == {"ppl": pytest.approx(math.exp(2.0))}


def test_seq_autoencoder_loss_by_hand_decoder_reads_end_then_text_from_the_encoders_state():
    from ember.objectives.dai_le import SequenceAutoencoder

    module = _objective(SequenceAutoencoder)
    batch = module.make_batch(PIECES, np.random.default_rng(0))
    assert batch["decoder_input_ids"].tolist() == [[2, 3, 4, 5], [2, 6, 0, 0]]
    assert batch["labels"].tolist() == [[3, 4, 5, 2], [6, 2, -100, -100]]
    with torch.no_grad():
        loss, metrics = module(batch)
        terms = []
        layers, emb = module.backbone.lstm.layers, module.backbone.embeddings.weight
        for framed, piece in (([1, 3, 4, 5, 2], [3, 4, 5]), ([1, 6, 2], [6])):
            _, state = lstm_by_hand(layers, emb[framed])  # encoder: zeros -> final (h, c) per layer
            top, _ = lstm_by_hand(layers, emb[[2] + piece], state)  # decoder: the same LSTM, from there
            terms += _nll_by_hand(module, top, piece + [2])
    assert len(terms) == 6 and metrics["rec_loss"][1] == 6
    torch.testing.assert_close(loss, torch.stack(terms).mean(), atol=1e-5, rtol=0)


def test_seq_autoencoder_decoder_starts_from_the_encoders_final_state():
    """Fig. 1 of the paper as one LSTM: the decoder's states equal the encoder's LSTM carried on
    over the decoder's input; started from zeros, or after another document, they differ."""
    from ember.objectives.dai_le import SequenceAutoencoder

    module = _objective(SequenceAutoencoder)
    batch = module.make_batch(PIECES, np.random.default_rng(0))
    captured = []
    handle = module.backbone.register_forward_hook(lambda m, args, kwargs_out: captured.append(kwargs_out))
    with torch.no_grad():
        module(batch)
        handle.remove()
        decoded = captured[1].last_hidden_state  # (B, n + 1, H)
        for row, framed in enumerate(([1, 3, 4, 5, 2], [1, 6, 2])):
            dec = batch["decoder_input_ids"][row][batch["decoder_attention_mask"][row].bool()].tolist()
            one_lstm = module.backbone(torch.tensor([framed + dec])).last_hidden_state[0, len(framed):]
            torch.testing.assert_close(decoded[row, : len(dec)], one_lstm, atol=1e-6, rtol=0)
            from_zeros = module.backbone(torch.tensor([dec])).last_hidden_state[0]
            assert not torch.allclose(from_zeros, one_lstm, atol=1e-3)
        other = module.backbone(torch.tensor([[1, 5, 5, 5, 2] + [2, 3, 4, 5]])).last_hidden_state[0, 5:]
        assert not torch.allclose(other, decoded[0], atol=1e-3)  # another document, another reconstruction


def test_template_ids_read_the_tokenizers_sentence_framing(tmp_path):
    from conftest import make_wordpiece
    from ember.objectives.dai_le import template_ids

    assert template_ids(make_wordpiece(["a", "b"])) == ([2], [3])  # [CLS] ... [SEP]


def test_lstm_objectives_refuse_a_transformer_backbone():
    from ember.config import RunConfig, model_preset
    from ember.errors import EmberError
    from ember.objectives import build_objective

    for objective in ("lstm_lm", "seq_autoencoder"):
        with pytest.raises(EmberError, match="model family lstm.*lm-lstm or sa-lstm"):
            build_objective(RunConfig(objective=objective, model=model_preset("bert-tiny")), {"pad": 0})


def test_lm_and_sa_lstm_recipes_are_the_papers_lstm_scaled_down():
    from ember.recipes import load_recipe

    for name, objective in (("lm-lstm", "lstm_lm"), ("sa-lstm", "seq_autoencoder")):
        cfg = load_recipe(name)
        assert cfg.objective == objective and cfg.model.family == "lstm"
        assert (cfg.model.num_layers, cfg.model.hidden_size, cfg.model.embedding_size) == (1, 512, 256)
        assert cfg.train.max_grad_norm == 1.0 and cfg.train.num_threads == 1  # clipped gradients (§4)
        assert cfg.data.max_seq_length == 128


@pytest.mark.parametrize("recipe, metric", [("lm-lstm", "lm_loss"), ("sa-lstm", "rec_loss")])
def test_lstm_pretraining_on_real_nsmc_reviews_lowers_the_held_out_loss(recipe, metric, prepared, tmp_path):
    from run_helpers import short_run

    from ember.recipes import load_recipe

    cfg = load_recipe(recipe, TINY_LSTM + [f"data.prepared={prepared}", "train.max_steps=60", "train.batch_size=16",
                                           "train.lr=1e-2", "train.schedule=constant", "train.warmup_steps=5",
                                           "train.eval_every=20", "train.save_every=60", "train.log_every=10"])
    records = short_run(cfg, tmp_path / "run")
    evals = [r for r in records if r["split"] == "eval"]
    assert [r["step"] for r in evals] == [20, 40, 60]
    losses = [r[metric] for r in evals]  # the same held-out reviews each time
    assert losses[0] > losses[1] > losses[2]
    assert losses[-1] < math.log(3000) - 1.0  # 1 nat below a uniform guess over the 3k vocabulary (8.0)
    derived = "ppl" if metric == "lm_loss" else "rec_ppl"
    assert evals[-1][derived] == pytest.approx(math.exp(evals[-1][metric]), rel=1e-6)


@pytest.mark.slow  # three training processes (~40 s on a loaded machine)
def test_sa_lstm_resume_after_kill_matches_the_uninterrupted_losses(prepared, tmp_path):
    from run_helpers import env, kill_after_checkpoint, train_losses

    def cmd(run):
        sets = TINY_LSTM + ["train.save_every=10", "train.log_every=1", "train.eval_every=0", "train.batch_size=8"]
        return [sys.executable, "-m", "ember", "pretrain", "--recipe", "sa-lstm", "--data", str(prepared),
                "--out", str(run), "--max-steps", "40", "--no-progress"] + [a for s in sets for a in ("--set", s)]

    whole = tmp_path / "whole"
    subprocess.run(cmd(whole), env=env(), check=True, capture_output=True)
    killed = tmp_path / "killed"
    kill_after_checkpoint(cmd(killed), killed, step=20)
    done = subprocess.run(cmd(killed) + ["--resume"], env=env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resumed from" in done.stdout
    expected = train_losses(whole)
    assert sorted(expected) == list(range(1, 41))
    assert train_losses(killed) == expected  # bit for bit: same batches, same dropout, same steps
