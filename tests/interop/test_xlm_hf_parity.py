"""XLM parity with Hugging Face transformers (tiny random models built locally, weights
perturbed off their init): XLMWithLMHeadModel with language embeddings, padding, restarted
positions (the TLM layout), the causal and sinusoidal variants, the classifier head, and
`ember convert` both ways."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hf_interop_helpers import ATOL, assert_close_where, load_hf, padded_batch, perturb, write_hf_folder  # noqa: E402

from ember.config import DataConfig, XlmConfig  # noqa: E402
from ember.errors import EmberError  # noqa: E402
from ember.interop import hf_xlm  # noqa: E402
from ember.interop.families import import_checkpoint, interop_for_family, interop_for_hf_config  # noqa: E402
from ember.models import build_backbone  # noqa: E402
from ember.objectives.xlm import XlmPretraining  # noqa: E402

PAD = 2  # XLM's <pad> (transformers' XLMConfig default)
SPECIAL = {"cls": 0, "sep": 1, "pad": PAD, "unk": 3, "mask": 5}
TIED = ("pred_layer.proj.weight",)
VOCAB = 99


def tiny_config(**kw):
    values = dict(vocab_size=VOCAB, emb_dim=32, n_layers=3, n_heads=4, n_langs=3, dropout=0.0,
                  attention_dropout=0.0, max_position_embeddings=40, pad_token_id=PAD,
                  id2lang={0: "de", 1: "en", 2: "ru"}, lang2id={"de": 0, "en": 1, "ru": 2})
    values.update(kw)
    return transformers.XLMConfig(**values)


def ember_lm(hf_model, mode: str = "mlm") -> XlmPretraining:
    cfg, state = import_checkpoint(hf_model.config.to_dict(), hf_model.state_dict())
    module = XlmPretraining(build_backbone(cfg), SPECIAL, DataConfig(), XlmConfig(), mode).eval()
    module.load_state_dict(state, strict=True)
    return module


def languages_and_positions(ids: torch.Tensor, seed: int = 3):
    """Language ids per token and TLM-style positions that restart mid-row (row 0 at 7)."""
    g = torch.Generator().manual_seed(seed)
    langs = torch.randint(0, 3, ids.shape, generator=g)
    positions = torch.arange(ids.shape[1]).repeat(ids.shape[0], 1)
    positions[0, 7:] = torch.arange(ids.shape[1] - 7)
    return langs, positions


def compare(hf, ours, ids, mask, langs=None, positions=None):
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, langs=langs, position_ids=positions, output_hidden_states=True)
        batch = {"input_ids": ids, "attention_mask": mask, "language_ids": langs, "position_ids": positions}
        hidden = ours.backbone(ids, mask, position_ids=positions, language_ids=langs,
                               output_hidden_states=True).hidden_states
        logits = ours.logits(batch)
    assert len(hidden) == len(ref.hidden_states) == 4
    for a, b in zip(hidden, ref.hidden_states, strict=True):
        assert_close_where(a, b, mask)
    assert_close_where(logits, ref.logits, mask)


def test_xlm_family_registry_and_config_mapping():
    assert interop_for_family("xlm") is hf_xlm
    assert interop_for_hf_config({"model_type": "xlm"}) is hf_xlm
    cfg = hf_xlm.config_from_hf(tiny_config().to_dict())
    assert (cfg.family, cfg.num_languages, cfg.language_codes) == ("xlm", 3, ["de", "en", "ru"])
    assert (cfg.intermediate_size, cfg.type_vocab_size, cfg.pooler, cfg.pad_token_id) == (128, 0, False, PAD)
    assert cfg.language_id("ru") == 2
    with pytest.raises(EmberError, match="'fr' is not one of this model's languages \\(de, en, ru\\)"):
        cfg.language_id("fr")
    assert hf_xlm.config_from_hf(tiny_config(n_langs=1).to_dict()).num_languages == 0
    assert hf_xlm.config_from_hf(tiny_config(gelu_activation=False).to_dict()).hidden_act == "relu"


def test_xlm_hf_parity_lm_logits_with_languages_padding_and_restarted_positions():
    hf = perturb(transformers.XLMWithLMHeadModel(tiny_config()), seed=0)
    ours = ember_lm(hf)
    ids, mask = padded_batch(VOCAB, PAD, first_real=6, length=17)
    langs, positions = languages_and_positions(ids)
    compare(hf, ours, ids, mask, langs, positions)
    compare(hf, ours, ids, mask)  # no language ids: no language embedding, on both sides


def test_xlm_language_embedding_changes_outputs():
    """The language table is really used: the same tokens in another language differ."""
    ours = ember_lm(perturb(transformers.XLMWithLMHeadModel(tiny_config()), seed=1))
    ids, mask = padded_batch(VOCAB, PAD, first_real=6)
    with torch.no_grad():
        en = ours.logits({"input_ids": ids, "attention_mask": mask, "language_ids": torch.ones_like(ids)})
        ru = ours.logits({"input_ids": ids, "attention_mask": mask, "language_ids": torch.full_like(ids, 2)})
    assert (en - ru).abs().max() > 1e-2


def test_xlm_hf_parity_causal_clm_model_on_padded_batch():
    hf = perturb(transformers.XLMWithLMHeadModel(tiny_config(causal=True)), seed=2)
    ours = ember_lm(hf, mode="clm")
    assert ours.backbone.config.causal
    ids, mask = padded_batch(VOCAB, PAD, first_real=6)
    langs, _ = languages_and_positions(ids, seed=4)
    compare(hf, ours, ids, mask, langs)
    full = torch.ones_like(mask)  # no padding: SDPA's built-in causal path
    compare(hf, ours, ids, full, langs)


def test_xlm_hf_parity_sinusoidal_positions_and_relu():
    hf = perturb(transformers.XLMWithLMHeadModel(tiny_config(sinusoidal_embeddings=True, gelu_activation=False)),
                 seed=5)
    ours = ember_lm(hf)
    table = ours.backbone.embeddings.position.weight
    assert not table.requires_grad and "backbone.embeddings.position.weight" in ours.state_dict()
    ids, mask = padded_batch(VOCAB, PAD, first_real=6)
    langs, positions = languages_and_positions(ids, seed=6)
    compare(hf, ours, ids, mask, langs, positions)


def test_xlm_fresh_sinusoidal_table_matches_transformers():
    """ember's own sin/cos table (not loaded from HF) equals the one XLMModel builds."""
    from ember.nn.embeddings import sinusoidal_table

    hf = transformers.XLMModel(tiny_config(sinusoidal_embeddings=True))
    torch.testing.assert_close(sinusoidal_table(40, 32), hf.position_embeddings.weight.detach(), atol=1e-6, rtol=0)


def test_xlm_hf_export_back_loads_into_transformers(tmp_path):
    hf = perturb(transformers.XLMWithLMHeadModel(tiny_config(causal=True)), seed=7)
    ours = ember_lm(hf, mode="clm")
    cfg = ours.backbone.config
    state = ours.state_dict()
    assert hf_xlm.hf_architecture(state) == "XLMWithLMHeadModel"
    hf_config = hf_xlm.config_to_hf(cfg, ["XLMWithLMHeadModel"])
    assert hf_config["id2lang"] == {"0": "de", "1": "en", "2": "ru"} and hf_config["causal"] is True
    again = load_hf(transformers.XLMWithLMHeadModel,
                    write_hf_folder(hf_xlm.state_to_hf(state, cfg), hf_config, tmp_path / "hf"), TIED)
    assert again.config.lang2id == {"de": 0, "en": 1, "ru": 2}
    ids, mask = padded_batch(VOCAB, PAD, first_real=6, seed=8)
    langs, _ = languages_and_positions(ids, seed=9)
    with torch.no_grad():
        assert_close_where(again(input_ids=ids, attention_mask=mask, langs=langs).logits,
                           hf(input_ids=ids, attention_mask=mask, langs=langs).logits, mask)


def test_xlm_hf_parity_sequence_classifier_reads_first_token():
    """XLMForSequenceClassification's summary (first token -> linear) == ember's classifier
    on the first token of a pooler-less backbone."""
    from ember.tasks.classification import SequenceClassifier

    hf = perturb(transformers.XLMForSequenceClassification(tiny_config(num_labels=3)), seed=10)
    cfg, state = import_checkpoint(hf.config.to_dict(), hf.state_dict())
    ours = SequenceClassifier(build_backbone(cfg), 3, PAD).eval()
    ours.load_state_dict(state, strict=True)
    ids, mask = padded_batch(VOCAB, PAD, first_real=6, seed=11)
    with torch.no_grad():
        torch.testing.assert_close(ours.logits({"input_ids": ids, "attention_mask": mask}),
                                   hf(input_ids=ids, attention_mask=mask).logits, atol=ATOL, rtol=0)
    assert hf_xlm.hf_architecture(ours.state_dict()) == "XLMForSequenceClassification"
    back = hf_xlm.state_to_hf(ours.state_dict(), cfg)
    assert set(back) == {k for k in hf.state_dict() if not k.endswith("position_ids")}


def test_xlm_convert_cli_round_trip(tmp_path, tiny_tokenizer_path):
    """HF folder -> `ember convert --from-hf` (objective from `causal`) -> `--to-hf` ->
    transformers: same logits with language ids; a base XLMModel exports without a prefix."""
    from ember.cli import main
    from ember.interop.convert import export_hf
    from ember.runs.checkpoint import load_weights, save_weights
    from ember.runs.folder import load_run_config

    hf = perturb(transformers.XLMWithLMHeadModel(tiny_config()), seed=12)
    hf_dir = tmp_path / "hf"
    hf.save_pretrained(hf_dir)
    (hf_dir / "tokenizer.json").write_bytes(tiny_tokenizer_path.read_bytes())
    assert main(["convert", "--from-hf", str(hf_dir), "--out", str(tmp_path / "run")]) == 0
    cfg = load_run_config(tmp_path / "run")
    assert (cfg.objective, cfg.model.family, cfg.model.languages) == ("xlm_mlm", "xlm", "de,en,ru")
    assert main(["convert", "--to-hf", str(tmp_path / "run"), "--out", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == ["XLMWithLMHeadModel"]
    again = load_hf(transformers.XLMWithLMHeadModel, tmp_path / "out", TIED)
    ids, mask = padded_batch(VOCAB, PAD, first_real=6, seed=13)
    langs, positions = languages_and_positions(ids, seed=14)
    with torch.no_grad():
        assert_close_where(again(input_ids=ids, attention_mask=mask, langs=langs, position_ids=positions).logits,
                           hf(input_ids=ids, attention_mask=mask, langs=langs, position_ids=positions).logits, mask)
    # Without the LM head the run exports as a base XLMModel with unprefixed names.
    state = {k: v for k, v in load_weights(tmp_path / "run" / "model.safetensors").items() if k != "lm.bias"}
    save_weights(state, tmp_path / "run" / "model.safetensors")
    base = load_hf(transformers.XLMModel, export_hf(tmp_path / "run", tmp_path / "base"))
    with torch.no_grad():
        assert_close_where(base(input_ids=ids, attention_mask=mask, langs=langs).last_hidden_state,
                           hf.transformer(input_ids=ids, attention_mask=mask, langs=langs).last_hidden_state, mask)


def test_xlm_interop_bad_inputs_give_clear_errors():
    with pytest.raises(EmberError, match="adaptive softmax"):
        hf_xlm.config_from_hf(tiny_config(asm=True).to_dict())
    cfg = hf_xlm.config_from_hf(tiny_config().to_dict())
    import dataclasses

    with pytest.raises(EmberError, match="4 x hidden"):
        hf_xlm.config_to_hf(dataclasses.replace(cfg, intermediate_size=100), ["XLMModel"])
    hf = perturb(transformers.XLMWithLMHeadModel(tiny_config()), seed=15)
    state = dict(hf.state_dict())
    state["pred_layer.proj.weight"] = state["pred_layer.proj.weight"] + 1
    with pytest.raises(EmberError, match="not tied"):
        hf_xlm.state_from_hf(state, cfg)
    with pytest.raises(EmberError, match="num_languages=1"):
        dataclasses.replace(cfg, num_languages=1, languages="")
    with pytest.raises(EmberError, match="names 2 languages"):
        dataclasses.replace(cfg, languages="en,ru")
