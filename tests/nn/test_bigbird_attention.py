"""BigBird block-sparse attention (ember.nn.bigbird) against a dense reference with the same
blocks, its random blocks in training, and the config's refusals."""

from __future__ import annotations

import pytest
import torch

from ember.config import ModelConfig
from ember.errors import EmberError
from ember.models import build_backbone
from ember.nn.bigbird import BigBirdAttention, draw_random_blocks, key_blocks
from ember.nn.longformer import LongMask


def dense_reference(attn: BigBirdAttention, x: torch.Tensor, real: torch.Tensor, random_ids: torch.Tensor):
    """O(T^2) attention where key j enters query i's softmax as many times as the block layout
    lists j's block for i's block (transformers' duplicates included), never at padding keys."""
    b, t, hs = x.shape
    h, d, bs = attn.num_heads, attn.head_dim, attn.block
    nb = -(-t // bs)
    q, k, v = attn.qkv(x).view(b, t, 3, h, d).permute(2, 0, 3, 1, 4)
    counts = torch.zeros(h, nb, nb)
    counts[:, [0, -1], :] = 1
    index, used = key_blocks(nb, random_ids)
    for head in range(h):
        for row in range(nb - 2):
            for slot in range(index.shape[2]):
                if used[row, slot]:
                    counts[head, row + 1, index[head, row, slot]] += 1
    counts = counts.repeat_interleave(bs, 1).repeat_interleave(bs, 2)[:, :t, :t]  # (h, T, T)
    scores = q @ k.transpose(-1, -2) / d ** 0.5 + counts.log()
    scores = scores.masked_fill(~real[:, None, None, :], float("-inf"))
    context = scores.softmax(-1) @ v
    return attn.out(context.transpose(1, 2).reshape(b, t, hs))


@pytest.mark.parametrize("training", [False, True])
def test_bigbird_block_sparse_matches_dense_reference_with_its_random_blocks(training):
    torch.manual_seed(0)
    attn = BigBirdAttention(16, 2, 0.0, block=3, random=2).train(training)
    x = torch.randn(2, 41, 16)  # 41 > (5 + 4) * 3: block-sparse; not a multiple of the block
    real = torch.ones(2, 41, dtype=torch.bool)
    real[1, 30:] = False
    mask = LongMask.of(real.long(), None, 2, 41, x.device)
    torch.manual_seed(7)
    with torch.no_grad():
        ours = attn(x, mask)[0]
    nb = 14
    torch.manual_seed(7)  # the module's only random draw: its random blocks
    random_ids = draw_random_blocks(nb, 2, 2, x.device, training)
    with torch.no_grad():
        ref = dense_reference(attn, x, real, random_ids)
    torch.testing.assert_close(ours[real], ref[real], atol=1e-5, rtol=0)


def test_bigbird_random_blocks_avoid_window_and_globals_and_are_drawn_anew():
    torch.manual_seed(0)
    first = draw_random_blocks(12, 4, 3, "cpu", training=True)
    second = draw_random_blocks(12, 4, 3, "cpu", training=True)
    assert first.shape == (4, 10, 3) and not torch.equal(first, second)
    rows = torch.arange(1, 11)[None, :, None]
    assert ((first - rows).abs() > 1).all() and (first > 0).all() and (first < 11).all()
    assert all(len(set(r.tolist())) == 3 for r in first.reshape(-1, 3))  # without replacement
    assert not draw_random_blocks(12, 4, 3, "cpu", training=False).any()  # eval: transformers' block 0


def test_bigbird_encoder_short_input_runs_full_attention_and_trains():
    cfg = ModelConfig(vocab_size=60, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=37,
                      max_position=128, dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    full = build_backbone(cfg).eval()
    bird = build_backbone(ModelConfig(**{**cfg.__dict__, "attention": "bigbird", "attention_block": 4,
                                         "attention_random_blocks": 1})).eval()
    bird.load_state_dict(full.state_dict())  # BigBird adds no weights
    ids = torch.randint(5, 60, (2, 28))  # 28 <= (5 + 2) * 4
    with torch.no_grad():
        torch.testing.assert_close(bird(ids).last_hidden_state, full(ids).last_hidden_state, atol=1e-5, rtol=0)
    bird.train()
    out = bird(torch.randint(5, 60, (2, 90))).last_hidden_state
    out.pow(2).mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in bird.parameters() if p.grad is not None)


@pytest.mark.parametrize("settings,message", [
    ({"attention_block": 0}, "attention_block=0 must be >= 1"),
    ({"attention_random_blocks": -1}, ">= 0"),
    ({"attention_global": 1}, "BigBird's global tokens are its first and last blocks"),
    ({"family": "t5"}, "not family 't5'"),
])
def test_bigbird_config_refuses_bad_settings_with_one_line(settings, message):
    with pytest.raises(EmberError, match=message):
        ModelConfig(**{"attention": "bigbird", **settings})


def test_bigbird_encoder_refuses_global_mask_and_attention_probabilities():
    model = build_backbone(ModelConfig(vocab_size=60, hidden_size=32, num_layers=1, num_heads=4,
                                       intermediate_size=37, attention="bigbird", attention_block=4))
    ids = torch.randint(5, 60, (1, 20))
    with pytest.raises(EmberError, match="global_attention_mask or model.attention_global is Longformer's"):
        model(ids, global_attention_mask=torch.ones(1, 20))
    with pytest.raises(EmberError, match="attention probabilities are not available with model.attention=bigbird"):
        model(ids, output_attentions=True)
