"""Feature-based transfer's fixed layer choices (BERT, Devlin et al. 2019, Table 7): each is the
hidden state(s) it names, the 4H concatenation is projected back to H, and a run with one of them
trains on real CoNLL-2003 sentences, reloads and scores the same."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import real_data
from ember.config import ModelConfig
from ember.errors import EmberError
from ember.models import build_backbone
from ember.tasks.families.feature_transfer import FeatureBackbone

SMALL = ModelConfig(vocab_size=200, hidden_size=32, num_layers=4, num_heads=2, intermediate_size=64, max_position=64)


@pytest.fixture
def encoder_and_states():
    torch.manual_seed(0)
    encoder = build_backbone(SMALL).eval()
    ids = torch.randint(5, 200, (3, 10))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    with torch.no_grad():
        out = encoder(ids, mask, None, output_hidden_states=True)
    layers = list(out.hidden_states[:-1]) + [out.last_hidden_state]
    return encoder, ids, mask, layers


@pytest.mark.parametrize("combine, expected", [
    ("embeddings", lambda L: L[0]), ("second-to-last", lambda L: L[-2]), ("last", lambda L: L[-1]),
    ("sum-last-4", lambda L: L[-1] + L[-2] + L[-3] + L[-4])])
def test_fixed_feature_choices_are_the_hidden_states_they_name(combine, expected, encoder_and_states):
    encoder, ids, mask, layers = encoder_and_states
    features = FeatureBackbone(encoder, feature_layers=0, combine=combine).eval()
    out = features(ids, mask)
    torch.testing.assert_close(out.last_hidden_state, expected(layers), rtol=1e-6, atol=1e-6)
    assert features.layer_weights() is None and not hasattr(features, "mix")


@pytest.mark.parametrize("feature_layers", [0, 1])
def test_concat_last_4_is_projected_from_4h_back_to_h(feature_layers, encoder_and_states):
    encoder, ids, mask, layers = encoder_and_states
    features = FeatureBackbone(encoder, feature_layers=feature_layers, combine="concat-last-4").eval()
    first = features.project[0]
    assert (first.in_features, first.out_features) == (4 * SMALL.hidden_size, SMALL.hidden_size)
    concat = torch.cat(layers[-4:], dim=-1)
    expected = features.project(concat)
    torch.testing.assert_close(features(ids, mask).last_hidden_state, expected)
    trainable = {n for n, p in features.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith("project.") for n in trainable)  # the encoder stays frozen


def test_feature_choices_refuse_what_cannot_work(tmp_path):
    small = build_backbone(ModelConfig(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2,
                                       intermediate_size=32, max_position=32))
    with pytest.raises(EmberError, match="needs 4 layers; this encoder has 2"):
        FeatureBackbone(small, combine="sum-last-4")
    with pytest.raises(EmberError, match="choose one of mix, embeddings"):
        FeatureBackbone(small, combine="top")
    from ember.cli import main

    with pytest.raises(SystemExit):  # argparse names the choices
        main(["finetune", "--task", "sst2", "--model", "bert-tiny", "--out", str(tmp_path / "x"),
              "--features", "--feature-combine", "top"])


def test_feature_combine_without_features_is_a_clear_error(wiki_prepared, tmp_path):
    import ember

    with pytest.raises(EmberError, match="add --features"):
        ember.finetune("sst2", tmp_path / "run", "random", model="bert-tiny",
                       tokenizer=str(wiki_prepared.parent / "tokenizer.json"), feature_combine="last",
                       train_limit=10, progress=False)
    assert not (tmp_path / "run" / "model.safetensors").exists()


def test_conll_ner_with_concat_last_4_features_trains_reloads_and_scores_the_same(wiki_prepared, tmp_path):
    import ember
    from ember.tasks.task_model import evaluate_run

    real_data("conll2003", "train.txt")
    run = tmp_path / "ner"
    result = ember.finetune("conll2003", run, "random", model="bert-mini",
                            tokenizer=str(wiki_prepared.parent / "tokenizer.json"), features=True,
                            feature_combine="concat-last-4", train_limit=300, epochs=2, lr=3e-3, max_length=64,
                            progress=False,
                            overrides=["model.hidden_size=64", "model.num_heads=2", "model.intermediate_size=128"])
    saved = json.loads((run / "results.json").read_text())
    assert saved["scalar_mix"]["combine"] == "concat-last-4" and saved["scalar_mix"]["weights"] is None
    assert result.metrics["f1"] == saved["metrics"]["f1"]
    assert evaluate_run(run)["metrics"] == pytest.approx(saved["metrics"])
