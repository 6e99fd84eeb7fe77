"""ALBERT parity with Hugging Face transformers (tiny random models built locally): MLM and
sentence-order logits, shared and unshared layer layouts, factorized embeddings, folder
round trips, fine-tuning from an HF folder, and the layouts that cannot be exchanged."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hf_interop_helpers import ATOL, assert_close_where, load_hf, padded_batch, perturb, write_hf_folder  # noqa: E402

from ember.config import DataConfig, ModelConfig, RunConfig  # noqa: E402
from ember.errors import EmberError  # noqa: E402
from ember.interop import hf_albert  # noqa: E402
from ember.interop.families import import_checkpoint  # noqa: E402
from ember.models import build_backbone  # noqa: E402
from ember.objectives.bert import BertPretraining  # noqa: E402
from ember.tasks.classification import SequenceClassifier  # noqa: E402

SPECIAL = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}  # conftest's WordPiece order
TIED = ("predictions.decoder.weight", "predictions.decoder.bias")


def tiny_config(groups: int = 1, embedding: int = 16, **kw):
    return transformers.AlbertConfig(
        vocab_size=98, embedding_size=embedding, hidden_size=32, num_hidden_layers=3, num_hidden_groups=groups,
        num_attention_heads=4, intermediate_size=37, max_position_embeddings=64,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0, **kw)


def batch(seed: int = 1):
    ids, mask = padded_batch(98, SPECIAL["pad"], seed=seed)
    types = torch.zeros_like(ids)
    types[:, 9:] = 1  # a second segment, as SOP inputs have
    return ids, mask, types


def ember_pretraining(hf_model) -> BertPretraining:
    cfg, state = import_checkpoint(hf_model.config.to_dict(), hf_model.state_dict())
    module = BertPretraining(build_backbone(cfg), SPECIAL, DataConfig(), sentence_task="sop").eval()
    module.load_state_dict(state, strict=True)
    return module


def assert_pretraining_parity(ours: BertPretraining, hf, seed: int) -> None:
    ids, mask, types = batch(seed)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
        mlm, sop = ours.logits({"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
    assert_close_where(mlm, ref.prediction_logits, mask)
    torch.testing.assert_close(sop, ref.sop_logits, atol=ATOL, rtol=0)


def test_albert_hf_parity_mlm_and_sop_logits_with_shared_layers():
    hf = perturb(transformers.AlbertForPreTraining(tiny_config(attn_implementation="eager")), seed=0)
    ours = ember_pretraining(hf)
    cfg = ours.backbone.config
    assert (cfg.share_layers, cfg.embedding_size, len(ours.backbone.layers)) == ("all", 16, 1)
    assert_pretraining_parity(ours, hf, seed=1)
    ids, mask, types = batch(seed=2)
    with torch.no_grad():
        ref = hf.albert(input_ids=ids, attention_mask=mask, token_type_ids=types,
                        output_hidden_states=True, output_attentions=True)
        out = ours.backbone(ids, mask, types, output_hidden_states=True, output_attentions=True)
    # HF's first hidden state is after embedding_hidden_mapping_in, like ember's (B, T, H).
    for a, b in zip(out.hidden_states, ref.hidden_states, strict=True):
        assert_close_where(a, b, mask)
    for a, b in zip(out.attentions, ref.attentions, strict=True):  # (B, heads, T, T), by query
        assert_close_where(a.transpose(1, 2), b.transpose(1, 2), mask)


def test_albert_hf_parity_one_group_per_layer_is_unshared():
    hf = perturb(transformers.AlbertForPreTraining(tiny_config(groups=3)), seed=3)
    ours = ember_pretraining(hf)
    assert ours.backbone.config.share_layers == "none" and len(ours.backbone.layers) == 3
    assert_pretraining_parity(ours, hf, seed=4)
    back = hf_albert.state_to_hf(ours.state_dict(), ours.backbone.config)
    config = hf_albert.config_to_hf(ours.backbone.config, ["AlbertForPreTraining"])
    assert config["num_hidden_groups"] == 3
    again = transformers.AlbertForPreTraining(transformers.AlbertConfig(**config)).eval()
    missing, unexpected = again.load_state_dict(back, strict=False)
    assert not unexpected and set(missing) <= set(TIED)
    again.tie_weights()
    assert_pretraining_parity(ours, again, seed=5)


def test_albert_convert_round_trip_through_folders_and_fill_mask(tmp_path, tiny_tokenizer_path):
    """HF folder -> ember run (objective albert, SOP head) -> HF folder: same logits; the
    imported run serves fill-mask; AutoTokenizer gives segment ids."""
    from ember.interop.convert import export_hf, import_hf
    from ember.tasks.inference.fill_mask import FillMask

    from tokenizers import Tokenizer

    hf = perturb(transformers.AlbertForPreTraining(tiny_config()), seed=6)
    hf_dir = tmp_path / "hf"
    hf.save_pretrained(hf_dir)
    tok = Tokenizer.from_file(str(tiny_tokenizer_path))
    tok.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])  # so "[MASK]" is one token
    tok.save(str(hf_dir / "tokenizer.json"))
    run = import_hf(hf_dir, tmp_path / "run")
    assert "objective: albert" in (run / "config.yaml").read_text()
    predictions = FillMask(run)("the w3 [MASK] w7", top_k=3)
    assert len(predictions) == 1 and len(predictions[0]) == 3
    ids = torch.tensor([tok.encode("the w3 [MASK] w7").ids])
    with torch.no_grad():
        probs = hf(input_ids=ids).prediction_logits[0, 3].softmax(-1)
    assert predictions[0][0][0] == tok.id_to_token(probs.argmax().item())
    assert predictions[0][0][1] == pytest.approx(probs.max().item(), abs=1e-5)

    out = export_hf(run, tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["AlbertForPreTraining"] and config["embedding_size"] == 16
    again = load_hf(transformers.AlbertForPreTraining, out, TIED)
    assert_pretraining_parity(ember_pretraining(hf), again, seed=7)
    enc = transformers.AutoTokenizer.from_pretrained(out)("the w3", "w7 a")
    assert enc["token_type_ids"] == [0, 0, 0, 0, 1, 1, 1]


def test_albert_equal_embedding_and_hidden_size_exports_an_identity_projection(tmp_path):
    """E == H: ember has no E -> H projection, transformers always has one - the identity."""
    cfg = ModelConfig(family="albert", vocab_size=98, hidden_size=32, num_layers=3, num_heads=4,
                      intermediate_size=37, max_position=64, hidden_act="gelu_new", share_layers="all",
                      dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    ours = perturb(BertPretraining(build_backbone(cfg), SPECIAL, DataConfig(), "sop"), seed=8)
    assert ours.backbone.embed_project is None
    hf_state = hf_albert.state_to_hf(ours.state_dict(), cfg)
    torch.testing.assert_close(hf_state["albert.encoder.embedding_hidden_mapping_in.weight"], torch.eye(32))
    folder = write_hf_folder(hf_state, hf_albert.config_to_hf(cfg, ["AlbertForPreTraining"]), tmp_path / "hf")
    hf = load_hf(transformers.AlbertForPreTraining, folder, TIED)
    assert_pretraining_parity(ours, hf, seed=9)
    assert_pretraining_parity(ember_pretraining(hf), hf, seed=10)  # the identity imports back

    trained = perturb(transformers.AlbertForPreTraining(tiny_config(embedding=32)), seed=11)
    with pytest.raises(EmberError, match="embedding_hidden_mapping_in"):
        ember_pretraining(trained)


def test_albert_sequence_classifier_parity_and_finetune_init_from_hf_folder(tmp_path, tiny_tokenizer_path):
    from ember.tasks.base import get_adapter
    from ember.tasks.task_model import build_task_module
    from ember.runs.init import load_init

    hf = perturb(transformers.AlbertForSequenceClassification(tiny_config(num_labels=3)), seed=12)
    cfg, state = import_checkpoint(hf.config.to_dict(), hf.state_dict())
    ours = SequenceClassifier(build_backbone(cfg), 3, SPECIAL["pad"]).eval()
    ours.load_state_dict(state, strict=True)
    ids, mask, types = batch(seed=13)
    with torch.no_grad():
        torch.testing.assert_close(ours.logits({"input_ids": ids, "attention_mask": mask, "token_type_ids": types}),
                                   hf(input_ids=ids, attention_mask=mask, token_type_ids=types).logits,
                                   atol=ATOL, rtol=0)
    assert hf_albert.hf_architecture(state) == "AlbertForSequenceClassification"
    back = hf_albert.state_to_hf(ours.state_dict(), cfg)
    for key, value in hf.state_dict().items():
        if key not in TIED:
            torch.testing.assert_close(back[key], value, atol=0, rtol=0)

    # `ember finetune --init HF_FOLDER` with a pre-training checkpoint: backbone from HF, new head.
    pre = perturb(transformers.AlbertForPreTraining(tiny_config()), seed=14)
    pre.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer.json").write_bytes(tiny_tokenizer_path.read_bytes())
    model_cfg, backbone_state, tokenizer = load_init(str(tmp_path / "hf"))
    assert model_cfg.family == "albert" and tokenizer.name == "tokenizer.json"
    classifier = build_task_module(RunConfig(kind="finetune", model=model_cfg), get_adapter("rte"), backbone_state, 0)
    torch.testing.assert_close(classifier.backbone.layers[0].ffn.up.weight,
                               pre.albert.encoder.albert_layer_groups[0].albert_layers[0].ffn.weight)
    torch.testing.assert_close(classifier.backbone.pooler.dense.weight, pre.albert.pooler.weight)
    assert classifier.logits({"input_ids": ids, "attention_mask": mask, "token_type_ids": types}).shape == (3, 2)


def test_albert_layouts_without_a_counterpart_give_clear_errors():
    cfg = ModelConfig(family="albert", vocab_size=98, hidden_size=32, num_layers=3, num_heads=4,
                      intermediate_size=37, max_position=64, embedding_size=16, share_layers="attention")
    for mode in ("attention", "ffn"):
        mode_cfg = dataclasses.replace(cfg, share_layers=mode)
        state = BertPretraining(build_backbone(mode_cfg), SPECIAL, DataConfig(), "sop").state_dict()
        with pytest.raises(EmberError, match=f"share_layers='{mode}' shares only the {mode}"):
            hf_albert.state_to_hf(state, mode_cfg)
    with pytest.raises(EmberError, match="num_hidden_groups=2"):
        hf_albert.config_from_hf(tiny_config(groups=2).to_dict())
    with pytest.raises(EmberError, match="inner_group_num=2"):
        hf_albert.config_from_hf(tiny_config(inner_group_num=2).to_dict())
    shared = dataclasses.replace(cfg, share_layers="all")
    nsp = BertPretraining(build_backbone(shared), SPECIAL, DataConfig(), "nsp").state_dict()
    with pytest.raises(EmberError, match="no ALBERT counterpart.*nsp"):
        hf_albert.state_to_hf(nsp, shared)
