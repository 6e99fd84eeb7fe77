"""ERNIE's information fusion (Zhang et al. 2019, eq. 4-6) on a pre-trained encoder: shapes,
exactly the encoder where no entity is aligned (eq. 6), gradients through the fusion."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import make_wordpiece
from ember.config import ModelConfig
from ember.errors import EmberError
from ember.knowledge.ernie import FusionEncoder
from ember.knowledge.inputs import KnowledgeInputs
from ember.models import build_backbone
from hf_interop_helpers import perturb

CFG = ModelConfig(vocab_size=60, hidden_size=16, num_layers=3, num_heads=2, intermediate_size=32, max_position=32,
                  dropout=0.0, attention_dropout=0.0)


def pair(cfg: ModelConfig = CFG, fusion_layers: int = 2):
    """A perturbed plain encoder and a FusionEncoder holding the same encoder weights."""
    torch.manual_seed(0)
    plain = perturb(build_backbone(cfg))
    fused = FusionEncoder(cfg, num_entities=7, entity_dim=8, fusion_layers=fusion_layers, entity_heads=2)
    missing, unexpected = fused.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and all(m.startswith(FusionEncoder.NEW_PARAMETERS) for m in missing)
    perturb(fused.fusion, seed=1)
    fused.set_entity_vectors(torch.randn(7, 8))
    return plain, fused.eval()


def batch():
    ids = torch.randint(5, 60, (2, 10), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 7:] = 0
    entities = torch.full((2, 10), -1)
    entities[0, 2], entities[0, 5], entities[1, 1] = 4, 0, 6
    return ids, mask, entities


@pytest.mark.parametrize("pre_ln", [False, True])
def test_fusion_without_entities_is_exactly_the_pretrained_encoder(pre_ln):
    cfg = dataclasses.replace(CFG, pre_layer_norm=pre_ln)
    plain, fused = pair(cfg)
    ids, mask, _ = batch()
    with torch.no_grad():
        expected = plain(ids, mask).last_hidden_state
        assert torch.equal(fused(ids, mask).last_hidden_state, expected)
        assert torch.equal(fused(ids, mask, entity_ids=torch.full_like(ids, -1)).last_hidden_state, expected)


def test_fusion_shapes_and_entities_change_only_the_top_layers():
    plain, fused = pair(fusion_layers=2)
    ids, mask, entities = batch()
    with torch.no_grad():
        out = fused(ids, mask, entity_ids=entities, output_hidden_states=True, output_attentions=True)
        ref = plain(ids, mask, output_hidden_states=True, output_attentions=True)
    assert out.last_hidden_state.shape == (2, 10, 16) and len(out.hidden_states) == 4 and len(out.attentions) == 3
    assert torch.equal(out.hidden_states[1], ref.hidden_states[1])  # layer 1: the T-Encoder, untouched
    assert not torch.allclose(out.hidden_states[2][0, 2], ref.hidden_states[2][0, 2])  # aligned token, fused
    layer = fused.layers[1]
    h = torch.randn(2, 10, 16)
    e = torch.randn(2, 10, 8) * (entities >= 0)[..., None]
    tokens, ents, _ = fused.fusion[0](layer, h, None, e, entities >= 0)
    assert tokens.shape == (2, 10, 16) and ents.shape == (2, 10, 8)
    assert (ents[entities < 0] == 0).all()  # the entity stream stays empty where nothing is aligned


def test_gradients_reach_the_fusion_the_encoder_but_not_the_fixed_entity_table():
    _, fused = pair(fusion_layers=2)
    fused.train()
    ids, mask, entities = batch()
    fused(ids, mask, entity_ids=entities).last_hidden_state.pow(2).sum().backward()
    first = fused.fusion[0]
    for name, p in first.named_parameters():  # its entity output feeds the next aggregator
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert fused.fusion[1].entity_in.weight.grad.abs().sum() > 0
    assert fused.layers[0].attention.qkv.weight.grad.abs().sum() > 0
    assert not fused.entity_vectors.requires_grad  # TransE's table stays fixed (ERNIE §4.1)


def test_entities_are_aligned_to_the_first_token_of_each_mention():
    tok = make_wordpiece("tim cook is visiting beijing now new york ##er".split())
    inputs = KnowledgeInputs(tok, entities=["beijing", "new york", "tim cook"])
    f = inputs.encode_text("Tim Cook is visiting New York and Beijing now", None, 32)
    tokens = [tok.id_to_token(i) for i in f["input_ids"]]
    aligned = {tokens[i]: row for i, row in enumerate(f["entity_ids"]) if row >= 0}
    assert aligned == {"tim": 2, "new": 1, "beijing": 0}
    assert "visible" not in f and "position_ids" not in f  # ERNIE alone: no K-BERT inputs


def test_bad_fusion_settings_are_refused():
    with pytest.raises(EmberError, match="encoder has 3 layers"):
        FusionEncoder(CFG, 5, 8, fusion_layers=4)
    with pytest.raises(EmberError, match="cannot be split into 3"):
        FusionEncoder(CFG, 5, 8, entity_heads=3)
    with pytest.raises(EmberError, match="does not fit"):
        FusionEncoder(CFG, 5, 8).set_entity_vectors(torch.zeros(6, 8))
    with pytest.raises(EmberError, match="needs a bidirectional encoder"):
        FusionEncoder(dataclasses.replace(CFG, family="gpt2"), 5, 8)
