"""DistilBERT parity with Hugging Face transformers (tiny random models built locally): MLM
logits both ways, an ember-initialised model exported to transformers, folder round trips,
fine-tuning from an HF folder, and the settings that cannot be exchanged."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hf_interop_helpers import assert_close_where, load_hf, padded_batch, perturb, write_hf_folder  # noqa: E402

from ember.config import DataConfig, RunConfig, model_preset  # noqa: E402
from ember.errors import EmberError  # noqa: E402
from ember.interop import hf_distilbert  # noqa: E402
from ember.interop.families import import_checkpoint  # noqa: E402
from ember.models import build_backbone  # noqa: E402
from ember.objectives.bert import BertPretraining  # noqa: E402
from ember.tasks.classification import SequenceClassifier  # noqa: E402

SPECIAL = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
TIED = ("vocab_projector.weight",)


def tiny_config(**kw):
    return transformers.DistilBertConfig(
        vocab_size=98, dim=32, n_layers=3, n_heads=4, hidden_dim=37, max_position_embeddings=64,
        dropout=0.0, attention_dropout=0.0, **kw)


def ember_mlm(hf_model) -> BertPretraining:
    cfg, state = import_checkpoint(hf_model.config.to_dict(), hf_model.state_dict())
    module = BertPretraining(build_backbone(cfg), SPECIAL, DataConfig(), sentence_task="none").eval()
    module.load_state_dict(state, strict=True)
    return module


def mlm_logits(model, ids, mask):
    with torch.no_grad():
        if isinstance(model, BertPretraining):
            return model.logits({"input_ids": ids, "attention_mask": mask})[0]
        return model(input_ids=ids, attention_mask=mask).logits


def test_distilbert_hf_parity_mlm_logits_and_hidden_states_on_padded_batch():
    hf = perturb(transformers.DistilBertForMaskedLM(tiny_config()), seed=0)
    ours = ember_mlm(hf)
    cfg = ours.backbone.config
    assert (cfg.type_vocab_size, cfg.pooler, cfg.layer_norm_eps) == (0, False, 1e-12)
    ids, mask = padded_batch(98, SPECIAL["pad"])
    assert_close_where(mlm_logits(ours, ids, mask), mlm_logits(hf, ids, mask), mask)
    with torch.no_grad():
        ref = hf.distilbert(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        out = ours.backbone(ids, mask, output_hidden_states=True).hidden_states
    for a, b in zip(out, ref, strict=True):
        assert_close_where(a, b, mask)


def test_distilbert_ember_model_exports_to_transformers(tmp_path):
    """An ember-initialised DistilBERT (the preset's layout, tiny sizes) -> DistilBertForMaskedLM."""
    cfg = dataclasses.replace(model_preset("distilbert"), vocab_size=98, hidden_size=32, num_layers=3,
                              num_heads=4, intermediate_size=37, max_position=64, dropout=0.0,
                              attention_dropout=0.0)
    torch.manual_seed(1)
    ours = perturb(BertPretraining(build_backbone(cfg), SPECIAL, DataConfig(), "none"), seed=1)
    arch = hf_distilbert.hf_architecture(ours.state_dict())
    assert arch == "DistilBertForMaskedLM"
    folder = write_hf_folder(hf_distilbert.state_to_hf(ours.state_dict(), cfg),
                             hf_distilbert.config_to_hf(cfg, [arch]), tmp_path / "hf")
    hf = load_hf(transformers.DistilBertForMaskedLM, folder, TIED)
    ids, mask = padded_batch(98, SPECIAL["pad"], seed=2)
    assert_close_where(mlm_logits(hf, ids, mask), mlm_logits(ours, ids, mask), mask)


def test_distilbert_convert_round_trip_through_folders(tmp_path, tiny_tokenizer_path):
    """HF folder -> ember run -> HF folder: same logits; the exported tokenizer gives no
    token_type_ids, so ``model(**tokenizer(text))`` works (DistilBERT takes none)."""
    from ember.interop.convert import export_hf, import_hf

    hf = perturb(transformers.DistilBertForMaskedLM(tiny_config()), seed=3)
    hf_dir = tmp_path / "hf"
    hf.save_pretrained(hf_dir)
    (hf_dir / "tokenizer.json").write_bytes(tiny_tokenizer_path.read_bytes())
    run = import_hf(hf_dir, tmp_path / "run")
    saved = (run / "config.yaml").read_text()
    assert "family: distilbert" in saved and "objective: mlm" in saved
    out = export_hf(run, tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["DistilBertForMaskedLM"]
    again = load_hf(transformers.DistilBertForMaskedLM, out, TIED)
    enc = transformers.AutoTokenizer.from_pretrained(out)(["the w3 w7 a", "w1"], padding=True, return_tensors="pt")
    assert set(enc) == {"input_ids", "attention_mask"}
    with torch.no_grad():
        assert_close_where(again(**enc).logits, hf(**enc).logits, enc["attention_mask"])


def test_distilbert_finetune_init_from_hf_folder_builds_a_classifier(tmp_path, tiny_tokenizer_path):
    from ember.tasks.readers.glue import get_task
    from ember.tasks.base import get_adapter
    from ember.tasks.task_model import build_task_module
    from ember.runs.init import load_init

    hf = perturb(transformers.DistilBertForMaskedLM(tiny_config()), seed=4)
    hf.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer.json").write_bytes(tiny_tokenizer_path.read_bytes())
    model_cfg, state, _ = load_init(str(tmp_path / "hf"))
    assert model_cfg.family == "distilbert" and not model_cfg.pooler
    classifier = build_task_module(RunConfig(kind="finetune", model=model_cfg), get_adapter(get_task("sst2")), state, 0).eval()
    torch.testing.assert_close(classifier.backbone.layers[2].ffn.down.weight,
                               hf.distilbert.transformer.layer[2].ffn.lin2.weight)
    ids, mask = padded_batch(98, SPECIAL["pad"], seed=5)
    with torch.no_grad():
        hidden = hf.distilbert(input_ids=ids, attention_mask=mask).last_hidden_state
        expected = classifier.classifier(hidden[:, 0])  # no pooler: the classifier reads [CLS]
        torch.testing.assert_close(classifier.logits({"input_ids": ids, "attention_mask": mask}), expected,
                                   atol=1e-5, rtol=0)


def test_distilbert_settings_without_a_counterpart_give_clear_errors():
    with pytest.raises(EmberError, match="sinusoidal"):
        hf_distilbert.config_from_hf(tiny_config(sinusoidal_pos_embds=True).to_dict())
    head = transformers.DistilBertForSequenceClassification(tiny_config())
    with pytest.raises(EmberError, match="pre_classifier"):
        import_checkpoint(head.config.to_dict(), head.state_dict())

    cfg = dataclasses.replace(model_preset("distilbert"), vocab_size=98, hidden_size=32, num_layers=2,
                              num_heads=4, intermediate_size=37, max_position=64)
    state = BertPretraining(build_backbone(cfg), SPECIAL, DataConfig(), "none").state_dict()
    with pytest.raises(EmberError, match="LayerNorm eps"):
        hf_distilbert.state_to_hf(state, dataclasses.replace(cfg, layer_norm_eps=1e-5))
    segments = dataclasses.replace(cfg, type_vocab_size=2)
    with pytest.raises(EmberError, match="no token-type"):
        hf_distilbert.state_to_hf(BertPretraining(build_backbone(segments), SPECIAL, DataConfig(), "none")
                                  .state_dict(), segments)
    with pytest.raises(EmberError, match="cannot express model.share_layers"):
        hf_distilbert.state_to_hf(state, dataclasses.replace(cfg, share_layers="all"))
    classifier = SequenceClassifier(build_backbone(cfg), 2, 0).state_dict()
    with pytest.raises(EmberError, match="pre_classifier"):
        hf_distilbert.state_to_hf(classifier, cfg)
