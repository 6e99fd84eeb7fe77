"""Longformer parity with Hugging Face transformers (tiny random models built locally, nothing
downloaded): ember's encoder with model.attention=longformer against LongformerModel /
LongformerForMaskedLM, on padded batches whose lengths are not multiples of the windows, with
and without global positions; import, export back, and `ember convert` both ways."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hf_interop_helpers import (  # noqa: E402
    assert_close_where, load_all_but_pooler, load_hf, perturb, write_hf_folder,
)

from ember.config import DataConfig  # noqa: E402
from ember.errors import EmberError  # noqa: E402
from ember.interop import hf_longformer  # noqa: E402
from ember.interop.families import import_checkpoint, interop_for_hf_config, interop_for_model  # noqa: E402
from ember.models import build_backbone  # noqa: E402
from ember.objectives.bert import BertPretraining  # noqa: E402

SPECIAL = {"cls": 0, "pad": 1, "sep": 2, "unk": 3, "mask": 4}
TIED = ("lm_head.decoder.weight", "lm_head.decoder.bias")


def tiny_config(window=(4, 6, 8), **kw):
    return transformers.LongformerConfig(
        vocab_size=98, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=66, type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attention_window=window if isinstance(window, int) else list(window), **kw)


def batch(length=23, seed=1):
    """ids, padding mask (row 1 padded from 13), global mask: <s> everywhere, row 2 also 5 and
    length-1, row 1 also a pad position (which must stay local)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 98, (3, length), generator=g)
    mask = torch.ones(3, length, dtype=torch.long)
    mask[1, 13:] = 0
    ids[1, 13:] = SPECIAL["pad"]
    glob = torch.zeros(3, length, dtype=torch.long)
    glob[:, 0] = 1
    glob[2, [5, length - 1]] = 1
    glob[1, 15] = 1
    return ids, mask, glob


def ember_encoder(hf_model):
    cfg, state = import_checkpoint(hf_model.config.to_dict(), hf_model.state_dict())
    backbone = build_backbone(cfg).eval()
    backbone.load_state_dict({k.removeprefix("backbone."): v for k, v in state.items()})
    return backbone


@pytest.mark.parametrize("length,use_global", [(23, True), (23, False), (41, True)])
def test_longformer_hf_parity_padded_batch(length, use_global):
    hf = perturb(transformers.LongformerModel(tiny_config()), seed=0)
    ours = ember_encoder(hf)
    assert ours.config.attention == "longformer" and ours.config.attention_windows == (4, 6, 8)
    assert ours.config.max_position == 64
    ids, mask, glob = batch(length)
    glob = glob if use_global else None
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, global_attention_mask=glob, output_hidden_states=True)
        out = ours(ids, mask, global_attention_mask=glob, output_hidden_states=True)
    assert len(out.hidden_states) == len(ref.hidden_states) == 4
    for a, b in zip(out.hidden_states, ref.hidden_states, strict=True):
        assert_close_where(a, b, mask)
    torch.testing.assert_close(out.pooled, ref.pooler_output, atol=1e-5, rtol=0)


def test_longformer_hf_parity_mlm_logits_and_export_back(tmp_path):
    hf = perturb(transformers.LongformerForMaskedLM(tiny_config(window=6)), seed=2)
    cfg, state = import_checkpoint(hf.config.to_dict(), hf.state_dict())
    assert cfg.family == "roberta" and cfg.attention_window == "6"
    cfg = cfg.__class__(**{**cfg.__dict__, "attention_global": 1})  # <s> global, as the HF call below
    ours = BertPretraining(build_backbone(cfg), SPECIAL, DataConfig(), sentence_task="none").eval()
    load_all_but_pooler(ours, state)
    ids, mask, _ = batch(19, seed=3)
    glob = torch.zeros_like(ids)
    glob[:, 0] = 1
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, global_attention_mask=glob).logits
        logits, _ = ours.logits({"input_ids": ids, "attention_mask": mask})
    assert_close_where(logits, ref, mask)
    # export back: every tensor has its place in LongformerForMaskedLM, the outputs are equal
    exporter = interop_for_model(cfg)
    assert exporter is hf_longformer and exporter.hf_architecture(ours.state_dict()) == "LongformerForMaskedLM"
    folder = write_hf_folder(exporter.state_to_hf(ours.state_dict(), cfg),
                             exporter.config_to_hf(cfg, ["LongformerForMaskedLM"]), tmp_path / "hf")
    back = load_hf(transformers.LongformerForMaskedLM, folder, tied=TIED)
    with torch.no_grad():
        again = back(input_ids=ids, attention_mask=mask, global_attention_mask=glob).logits
    assert_close_where(again, ref, mask)


def test_longformer_convert_cli_round_trip(tmp_path, tiny_tokenizer_path):
    from ember.cli import main
    from ember.runs.checkpoint import load_weights
    from ember.runs.folder import load_run_config

    from ember.tokenizers import load_tokenizer

    vocab = load_tokenizer(tiny_tokenizer_path).get_vocab_size()
    hf_cfg = tiny_config(window=(4, 4, 8)).to_dict()
    hf_cfg.update(vocab_size=vocab, architectures=["LongformerModel"])
    hf = perturb(transformers.LongformerModel(transformers.LongformerConfig(**hf_cfg)), seed=4)
    src = write_hf_folder(hf.state_dict(), hf_cfg, tmp_path / "hf")
    (src / "tokenizer.json").write_bytes(tiny_tokenizer_path.read_bytes())
    assert main(["convert", "--from-hf", str(src), "--out", str(tmp_path / "run")]) == 0
    cfg = load_run_config(tmp_path / "run")
    assert (cfg.model.attention, cfg.model.attention_window) == ("longformer", "4,4,8")
    assert "backbone.layers.2.attention.value_global.weight" in load_weights(tmp_path / "run" / "model.safetensors")
    assert main(["convert", "--to-hf", str(tmp_path / "run"), "--out", str(tmp_path / "back")]) == 0
    assert json.loads((tmp_path / "back" / "config.json").read_text())["attention_window"] == [4, 4, 8]
    back = load_hf(transformers.LongformerModel, tmp_path / "back")
    ids, mask, glob = batch(21, seed=5)
    ids = ids % vocab
    ids[1, 13:] = SPECIAL["pad"]
    with torch.no_grad():
        a = hf(input_ids=ids, attention_mask=mask, global_attention_mask=glob).last_hidden_state
        b = back(input_ids=ids, attention_mask=mask, global_attention_mask=glob).last_hidden_state
    assert_close_where(a, b, mask)


def test_longformer_interop_refuses_dilation_and_short_attention():
    assert interop_for_hf_config({"model_type": "longformer"}) is hf_longformer
    hf = perturb(transformers.LongformerModel(tiny_config(window=4)), seed=0)
    cfg, state = import_checkpoint(hf.config.to_dict(), hf.state_dict())
    dilated = cfg.__class__(**{**cfg.__dict__, "attention_dilation": "2"})
    with pytest.raises(EmberError, match="no dilated windows"):
        hf_longformer.state_to_hf(state, dilated)
    full = cfg.__class__(**{**cfg.__dict__, "attention": "full"})
    with pytest.raises(EmberError, match="make it long first"):
        hf_longformer.config_to_hf(full, ["LongformerModel"])
