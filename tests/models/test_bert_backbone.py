"""BERT backbone: presets with the published sizes, input checks, device/dtype parameters."""

from __future__ import annotations

import pytest
import torch

from ember.config import MODEL_PRESETS, ModelConfig, model_preset
from ember.errors import EmberError
from ember.models import build_backbone
from ember.train.precision import autocast_context


@pytest.mark.parametrize("name,layers,hidden,params_m", [
    ("bert-tiny", 2, 128, 4.4), ("bert-mini", 4, 256, 11.2), ("bert-small", 4, 512, 28.8),
    ("bert-medium", 8, 512, 41.4), ("bert-base", 12, 768, 109.5), ("bert-large", 24, 1024, 335.1),
])
def test_bert_presets_have_published_sizes(name, layers, hidden, params_m):
    cfg = model_preset(name)
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.intermediate_size) == \
        (layers, hidden, hidden // 64, 4 * hidden)
    with torch.device("meta"):  # count parameters without allocating bert-large
        model = build_backbone(cfg)
    total = sum(p.numel() for p in model.parameters()) / 1e6
    # Google's released checkpoints (30522 vocab, with pooler): 4.4M, 11.2M, 28.8M, 41.4M, 109.5M, 335.1M
    assert total == pytest.approx(params_m, abs=0.1)


def test_sequence_longer_than_positions_is_a_clear_error():
    model = build_backbone(ModelConfig(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2,
                                       intermediate_size=32, max_position=8))
    with pytest.raises(EmberError, match="longer than the model's 8 positions"):
        model(torch.ones(1, 9, dtype=torch.long))


def test_unknown_preset_lists_known_ones():
    with pytest.raises(EmberError, match="bert-mini"):
        model_preset("bert-giant")
    assert "bert-base" in MODEL_PRESETS


def test_bfloat16_autocast_runs_the_backbone_when_asked():
    model = build_backbone(ModelConfig(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2,
                                       intermediate_size=32, max_position=8))
    with autocast_context("cpu", "bfloat16"):
        out = model(torch.ones(2, 5, dtype=torch.long))
    assert out.pooled.dtype == torch.bfloat16  # linear layers ran in bf16 (LayerNorm stays fp32)
    assert torch.isfinite(out.last_hidden_state).all()
    with pytest.raises(EmberError, match="dtype"):
        autocast_context("cpu", "int8")
