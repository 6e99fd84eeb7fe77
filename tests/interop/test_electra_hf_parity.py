"""ELECTRA parity with Hugging Face transformers: ElectraForPreTraining (discriminator) and
ElectraForMaskedLM (generator) from tiny random configs with embedding_size != hidden_size,
built locally (nothing is downloaded); export back; `ember convert` both ways."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hf_interop_helpers import assert_close_where, load_hf, padded_batch, perturb, write_hf_folder  # noqa: E402

from ember.config import DataConfig, ElectraConfig  # noqa: E402
from ember.errors import EmberError  # noqa: E402
from ember.interop import hf_electra  # noqa: E402
from ember.interop.families import import_checkpoint, interop_for_family, interop_for_hf_config  # noqa: E402
from ember.models import build_backbone  # noqa: E402
from ember.objectives.bert import BertPretraining  # noqa: E402
from ember.objectives.electra import ElectraPretraining, standalone_generator  # noqa: E402

SPECIAL = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
TIED = ("generator_lm_head.weight",)


def tiny_config(**kw):
    values = dict(vocab_size=98, embedding_size=24, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                  intermediate_size=37, max_position_embeddings=64, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0)
    return transformers.ElectraConfig(**{**values, **kw})


def inputs(seed: int):
    ids, mask = padded_batch(98, SPECIAL["pad"], seed=seed)
    types = torch.zeros_like(ids)
    types[:, 9:] = 1
    return ids, mask, types


def ember_discriminator(hf_model) -> ElectraPretraining:
    """An ember ELECTRA module holding the HF discriminator (its generator stays random)."""
    cfg, state = import_checkpoint(hf_model.config.to_dict(), hf_model.state_dict())
    module = ElectraPretraining(cfg, ElectraConfig(), SPECIAL, DataConfig(nsp=False)).eval()
    missing, unexpected = module.load_state_dict(state, strict=False)
    assert not unexpected and all(k.startswith(("generator.", "generator_head.")) for k in missing)
    return module


def ember_generator(hf_model) -> BertPretraining:
    cfg, state = import_checkpoint(hf_model.config.to_dict(), hf_model.state_dict())
    module = BertPretraining(build_backbone(cfg), SPECIAL, DataConfig(nsp=False), sentence_task="none").eval()
    module.load_state_dict(state, strict=True)
    return module


def test_electra_family_registry_and_config():
    assert interop_for_family("electra") is hf_electra
    assert interop_for_hf_config({"model_type": "electra"}) is hf_electra
    cfg = hf_electra.config_from_hf(tiny_config().to_dict())
    assert (cfg.family, cfg.embedding_size, cfg.hidden_size, cfg.pooler) == ("electra", 24, 32, False)
    back = hf_electra.config_to_hf(cfg, ["ElectraForPreTraining"])
    assert (back["model_type"], back["embedding_size"], back["hidden_size"]) == ("electra", 24, 32)
    same = hf_electra.config_from_hf(tiny_config(embedding_size=32).to_dict())
    assert same.embedding_size == 0  # E == H: no projection on either side
    with pytest.raises(EmberError, match="model_type"):
        hf_electra.config_from_hf({"model_type": "bert"})


def test_electra_hf_parity_pretraining_discriminator_logits():
    # eager attention: transformers' SDPA path returns no attention probabilities
    hf = perturb(transformers.ElectraForPreTraining(tiny_config(attn_implementation="eager")), seed=0)
    ours = ember_discriminator(hf)
    ids, mask, types = inputs(seed=1)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=types,
                 output_hidden_states=True, output_attentions=True)
        logits = ours.logits({"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
        out = ours.backbone(ids, mask, types, output_hidden_states=True, output_attentions=True)
    assert logits.shape == ref.logits.shape == (3, 17)
    assert_close_where(logits, ref.logits, mask)
    # hidden_states[0] is after the E -> H projection in both libraries
    for a, b in zip(out.hidden_states, ref.hidden_states, strict=True):
        assert_close_where(a, b, mask)
    assert len(out.attentions) == len(ref.attentions) == 3
    for a, b in zip(out.attentions, ref.attentions, strict=True):  # (B, heads, T, T), real query rows
        assert_close_where(a.transpose(1, 2), b.transpose(1, 2), mask)


def test_electra_hf_export_back_pretraining_drops_the_generator(tmp_path, capsys):
    hf = perturb(transformers.ElectraForPreTraining(tiny_config()), seed=2)
    ours = ember_discriminator(hf)
    state, cfg = ours.state_dict(), ours.backbone.config
    arch = hf_electra.hf_architecture(state)
    assert arch == "ElectraForPreTraining"
    hf_state = hf_electra.state_to_hf(state, cfg)
    assert "generator" in capsys.readouterr().out  # the note says what was left out
    assert set(hf_state) == set(hf.state_dict())
    for key, value in hf_state.items():
        torch.testing.assert_close(value, hf.state_dict()[key], atol=0, rtol=0)
    again = load_hf(transformers.ElectraForPreTraining,
                    write_hf_folder(hf_state, hf_electra.config_to_hf(cfg, [arch]), tmp_path / "hf"))
    ids, mask, types = inputs(seed=3)
    with torch.no_grad():
        assert_close_where(again(input_ids=ids, attention_mask=mask, token_type_ids=types).logits,
                           hf(input_ids=ids, attention_mask=mask, token_type_ids=types).logits, mask)


def test_electra_hf_parity_masked_lm_generator_logits():
    hf = perturb(transformers.ElectraForMaskedLM(tiny_config(hidden_size=16, num_attention_heads=2,
                                                             intermediate_size=29)), seed=4)
    ours = ember_generator(hf)
    assert ours.mlm.dense.weight.shape == (24, 16)  # generator head maps H -> E for the tied decoder
    ids, mask, types = inputs(seed=5)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
        mlm, sentence = ours.logits({"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
    assert sentence is None
    assert_close_where(mlm, ref.logits, mask)


def test_electra_hf_export_back_masked_lm(tmp_path):
    hf = perturb(transformers.ElectraForMaskedLM(tiny_config()), seed=6)
    ours = ember_generator(hf)
    cfg = ours.backbone.config
    arch = hf_electra.hf_architecture(ours.state_dict())
    assert arch == "ElectraForMaskedLM"
    hf_state = hf_electra.state_to_hf(ours.state_dict(), cfg)
    again = load_hf(transformers.ElectraForMaskedLM,
                    write_hf_folder(hf_state, hf_electra.config_to_hf(cfg, [arch]), tmp_path / "hf"), TIED)
    ids, mask, types = inputs(seed=7)
    with torch.no_grad():
        assert_close_where(again(input_ids=ids, attention_mask=mask, token_type_ids=types).logits,
                           hf(input_ids=ids, attention_mask=mask, token_type_ids=types).logits, mask)


def test_electra_run_generator_exports_as_hf_masked_lm(tmp_path):
    """An ember ELECTRA module's generator (reading the shared embeddings) == the
    ElectraForMaskedLM that standalone_generator + state_to_hf make of it."""
    from ember.config import ModelConfig

    model = ModelConfig(family="electra", vocab_size=98, hidden_size=64, num_layers=2, num_heads=4,
                        intermediate_size=96, max_position=64, embedding_size=24, pooler=False,
                        dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(8)
    module = perturb(ElectraPretraining(model, ElectraConfig(), SPECIAL, DataConfig(nsp=False)), seed=8)
    gen_cfg, gen_state = standalone_generator(module.state_dict(), model, ElectraConfig())
    assert (gen_cfg.hidden_size, gen_cfg.num_heads, gen_cfg.embedding_size) == (16, 1, 24)
    arch = hf_electra.hf_architecture(gen_state)
    assert arch == "ElectraForMaskedLM"
    hf = load_hf(transformers.ElectraForMaskedLM,
                 write_hf_folder(hf_electra.state_to_hf(gen_state, gen_cfg),
                                 hf_electra.config_to_hf(gen_cfg, [arch]), tmp_path / "gen"), TIED)
    ids, mask, types = inputs(seed=9)
    with torch.no_grad():
        shared = module.backbone.embeddings(ids, types)
        hidden = module.generator(ids, mask, types, inputs_embeds=shared).last_hidden_state
        ours = module.generator_head(hidden, module.backbone.word_embeddings)
        assert_close_where(ours, hf(input_ids=ids, attention_mask=mask, token_type_ids=types).logits, mask)


def test_electra_hf_base_model_round_trip(tmp_path):
    hf = perturb(transformers.ElectraModel(tiny_config()), seed=10)
    cfg, state = import_checkpoint(hf.config.to_dict(), hf.state_dict())
    assert all(k.startswith("backbone.") for k in state)
    backbone = build_backbone(cfg).eval()
    backbone.load_state_dict({k.removeprefix("backbone."): v for k, v in state.items()}, strict=True)
    ids, mask, types = inputs(seed=11)
    with torch.no_grad():
        assert_close_where(backbone(ids, mask, types).last_hidden_state,
                           hf(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state, mask)
    assert hf_electra.hf_architecture(state) == "ElectraModel"
    back = hf_electra.state_to_hf(state, cfg)
    assert {k.removeprefix("electra.") for k in back} == set(hf.state_dict())


def test_electra_hf_sequence_classification_is_refused_both_ways():
    hf = transformers.ElectraForSequenceClassification(tiny_config(num_labels=2))
    cfg = hf_electra.config_from_hf(hf.config.to_dict())
    with pytest.raises(EmberError, match="ElectraForSequenceClassification"):
        hf_electra.state_from_hf(hf.state_dict(), cfg)
    state = {"backbone.embeddings.word.weight": torch.zeros(98, 24), "classifier.weight": torch.zeros(2, 32)}
    with pytest.raises(EmberError, match="classifier"):
        hf_electra.state_to_hf(state, cfg)


def test_electra_convert_round_trip_through_folders(tmp_path, tiny_tokenizer_path):
    """HF ElectraForPreTraining folder -> ember run folder -> HF folder: same logits; the
    imported run fine-tunes from its discriminator."""
    from ember.interop.convert import export_hf, import_hf
    from ember.runs.init import load_init

    hf = perturb(transformers.ElectraForPreTraining(tiny_config()), seed=12)
    hf_dir = tmp_path / "hf"
    hf.save_pretrained(hf_dir)
    (hf_dir / "tokenizer.json").write_bytes(tiny_tokenizer_path.read_bytes())
    run = import_hf(hf_dir, tmp_path / "run")
    out = export_hf(run, tmp_path / "exported")
    again = load_hf(transformers.ElectraForPreTraining, out)
    ids, mask, types = inputs(seed=13)
    with torch.no_grad():
        assert_close_where(again(input_ids=ids, attention_mask=mask, token_type_ids=types).logits,
                           hf(input_ids=ids, attention_mask=mask, token_type_ids=types).logits, mask)
    for init in (run, hf_dir):  # an imported run folder and the HF folder itself
        cfg, state, _ = load_init(str(init))
        assert cfg.family == "electra" and "embed_project.weight" in state
        assert not any(k.startswith(("rtd_head", "generator")) for k in state)
