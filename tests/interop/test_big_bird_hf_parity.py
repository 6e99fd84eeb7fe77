"""BigBird parity with Hugging Face transformers' BigBirdModel in block_sparse mode (tiny random
models built locally, nothing downloaded), eval mode: padded batches, lengths not multiples of
the block, the short-input fallback to full attention, the MLM head and the export back."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hf_interop_helpers import (  # noqa: E402
    assert_close_where, load_all_but_pooler, load_hf, padded_batch, perturb, write_hf_folder,
)

from ember.config import DataConfig  # noqa: E402
from ember.errors import EmberError  # noqa: E402
from ember.interop import hf_big_bird  # noqa: E402
from ember.interop.families import import_checkpoint, interop_for_model  # noqa: E402
from ember.models import build_backbone  # noqa: E402
from ember.objectives.bert import BertPretraining  # noqa: E402

SPECIAL = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
TIED = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")


def tiny_config(**kw):
    return transformers.BigBirdConfig(
        vocab_size=98, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=128, block_size=4, num_random_blocks=2, attention_type="block_sparse",
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=0, **kw)


def ember_encoder(hf_model):
    cfg, state = import_checkpoint(hf_model.config.to_dict(), hf_model.state_dict())
    backbone = build_backbone(cfg).eval()
    backbone.load_state_dict({k.removeprefix("backbone."): v for k, v in state.items()})
    return backbone


@pytest.mark.parametrize("length", [37, 50, 30])  # 30 <= (5 + 2*2) * 4 = 36: the full-attention fallback
def test_big_bird_hf_parity_padded_batch_block_sparse(length):
    hf = perturb(transformers.BigBirdModel(tiny_config()), seed=0)
    ours = ember_encoder(hf)
    assert (ours.config.attention, ours.config.attention_block, ours.config.attention_random_blocks) == ("bigbird", 4, 2)
    ids, mask = padded_batch(98, SPECIAL["pad"], length=length)
    mask[2, length - 3:] = 0  # a second padded row, padded inside the last block
    ids[2, length - 3:] = SPECIAL["pad"]
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        out = ours(ids, mask, output_hidden_states=True)
    if length > 36:
        assert hf.config.attention_type == "block_sparse"  # transformers did not fall back either
    for a, b in zip(out.hidden_states, ref.hidden_states, strict=True):
        assert_close_where(a, b[:, :length], mask)  # transformers keeps its block padding in hidden_states
    assert_close_where(out.last_hidden_state, ref.last_hidden_state, mask)
    torch.testing.assert_close(out.pooled, ref.pooler_output, atol=1e-5, rtol=0)


def test_big_bird_hf_parity_mlm_logits_and_export_back(tmp_path):
    hf = perturb(transformers.BigBirdForMaskedLM(tiny_config()), seed=1)
    cfg, state = import_checkpoint(hf.config.to_dict(), hf.state_dict())
    assert cfg.family == "bert" and cfg.hidden_act == "gelu_new"
    ours = BertPretraining(build_backbone(cfg), SPECIAL, DataConfig(), sentence_task="none").eval()
    load_all_but_pooler(ours, state)
    ids, mask = padded_batch(98, SPECIAL["pad"], length=45)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask).logits
        logits, _ = ours.logits({"input_ids": ids, "attention_mask": mask})
    assert_close_where(logits, ref, mask)
    exporter = interop_for_model(cfg)
    assert exporter is hf_big_bird and exporter.hf_architecture(ours.state_dict()) == "BigBirdForMaskedLM"
    folder = write_hf_folder(exporter.state_to_hf(ours.state_dict(), cfg),
                             exporter.config_to_hf(cfg, ["BigBirdForMaskedLM"]), tmp_path / "hf")
    back = load_hf(transformers.BigBirdForMaskedLM, folder, tied=TIED)
    with torch.no_grad():
        again = back(input_ids=ids, attention_mask=mask).logits
    assert_close_where(again, ref, mask)


def test_big_bird_interop_refuses_what_ember_cannot_reproduce():
    with pytest.raises(EmberError, match="rescale_embeddings"):
        hf_big_bird.config_from_hf({**tiny_config().to_dict(), "rescale_embeddings": True})
    full = hf_big_bird.config_from_hf({**tiny_config().to_dict(), "attention_type": "original_full"})
    assert full.attention == "full"
    cls = perturb(transformers.BigBirdForSequenceClassification(tiny_config()), seed=0)
    with pytest.raises(EmberError, match="BigBirdForSequenceClassification"):
        import_checkpoint(cls.config.to_dict(), cls.state_dict())
