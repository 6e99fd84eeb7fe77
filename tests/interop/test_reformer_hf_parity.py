"""Reformer parity with Hugging Face transformers (tiny random ReformerConfig built locally, nothing
downloaded): ember's LSH attention layer against transformers' LSHSelfAttention + output, and
ember's reversible stack of LSH layers (model.attention=reformer, model.reversible=true) against
ReformerModel's encoder, forward and backward, on padded batches whose lengths are not multiples
of the chunk.

What cannot match. ReformerModel's embeddings are not ember's: its position embeddings are
axial (factorised) by default and it has no embedding LayerNorm, so the whole model is compared
from the embeddings on: the same (B, T, H) input goes into both stacks (transformers' position
table set to zero), and ember's two reversible streams go through transformers' final LayerNorm
over their concatenation (ember's own encoder averages them instead, so its heads read H-wide
states). transformers' layers have no biases; ember's are set to zero.

Rotations. With ``hash_seed`` transformers calls torch.manual_seed(hash_seed) and draws the
rotations with randn before every LSH layer; ember's eval-mode rotations come from a generator
seeded with the layer's ``seed`` - the same numbers when seed = hash_seed. In training ember draws
fresh rotations (transformers, given a hash_seed, reuses the seeded ones), so the backward
comparison gives ember's layers the seeded rotations explicitly.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers.models.reformer.modeling_reformer import ReformerAttention  # noqa: E402

from ember.config import ModelConfig  # noqa: E402
from ember.models import build_backbone  # noqa: E402
from ember.nn.longformer import LongMask  # noqa: E402
from ember.nn.lsh import LSHAttention  # noqa: E402
from ember.nn.reversible import layer_blocks, reversible_stack  # noqa: E402

HASH_SEED = 7


def hf_config(**kw):
    return transformers.ReformerConfig(**{
        "vocab_size": 60, "hidden_size": 32, "num_attention_heads": 4, "attention_head_size": 8,
        "attn_layers": ["lsh", "lsh", "lsh"], "lsh_attn_chunk_length": 8, "num_buckets": 4, "num_hashes": 3,
        "hash_seed": HASH_SEED, "lsh_num_chunks_before": 1, "lsh_num_chunks_after": 0, "is_decoder": False,
        "feed_forward_size": 37, "hidden_act": "gelu", "lsh_attention_probs_dropout_prob": 0.0,
        "hidden_dropout_prob": 0.0, "max_position_embeddings": 64, "axial_pos_embds": False,
        "layer_norm_eps": 1e-12, "chunk_size_feed_forward": 0, **kw})


def ember_config(**kw) -> ModelConfig:
    return ModelConfig(**{"vocab_size": 60, "hidden_size": 32, "num_layers": 3, "num_heads": 4,
                          "intermediate_size": 37, "max_position": 64, "dropout": 0.0, "attention_dropout": 0.0,
                          "attention": "reformer", "attention_chunk": 8, "attention_buckets": 4,
                          "attention_hashes": 3, "reversible": True, "pre_layer_norm": True, "ffn_chunk": 5, **kw})


def copy_lsh(ours: LSHAttention, hf: ReformerAttention) -> None:
    with torch.no_grad():
        ours.query_key.weight.copy_(hf.self_attention.query_key.weight)
        ours.value.weight.copy_(hf.self_attention.value.weight)
        ours.out.weight.copy_(hf.output.dense.weight)
        for lin in (ours.query_key, ours.value, ours.out):
            if lin.bias is not None:
                lin.bias.zero_()
    ours.seed = HASH_SEED


def padded(length: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, length, 32, generator=g)
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, length - 9:] = 0
    return x, mask


@pytest.mark.parametrize("length", [40, 7])  # 5 chunks; within one chunk (transformers: full attention)
def test_reformer_lsh_attention_layer_hf_parity(length):
    torch.manual_seed(0)
    hf = ReformerAttention(hf_config()).eval()
    ours = LSHAttention(32, 4, 0.0, buckets=4, rounds=3, chunk=8, bias=False).eval()
    copy_lsh(ours, hf)
    x, mask = padded(length)
    with torch.no_grad():
        h = hf.layer_norm(x)
        ref = hf.output(hf.self_attention(h, attention_mask=mask).hidden_states)
        mine = ours(h, LongMask.of(mask, None, 2, length, x.device))[0]
    torch.testing.assert_close(mine[mask.bool()], ref[mask.bool()], atol=1e-5, rtol=0)


def paired_models(**hf_kw):
    """transformers' ReformerModel and ember's reversible reformer encoder with the same weights."""
    torch.manual_seed(0)
    hf = transformers.ReformerModel(hf_config(**hf_kw))
    with torch.no_grad():
        hf.embeddings.position_embeddings.embedding.weight.zero_()  # ember's stack is fed the embeddings
    ours = build_backbone(ember_config())
    for ember_layer, hf_layer in zip(ours.layers, hf.encoder.layers):
        copy_lsh(ember_layer.attention, hf_layer.attention)
        ff = hf_layer.feed_forward
        for mine, theirs in ((ember_layer.attention_norm, hf_layer.attention.layer_norm), (ember_layer.ffn_norm,
                             ff.layer_norm), (ember_layer.ffn.up, ff.dense.dense), (ember_layer.ffn.down, ff.output.dense)):
            mine.load_state_dict(theirs.state_dict())
    return hf, ours


def ember_stack(ours, x, mask):
    """ember's two streams through transformers' final LayerNorm over their concatenation."""
    _, msk, _ = ours.embed(None, mask, inputs_embeds=x)
    y1, y2 = reversible_stack(x, layer_blocks(ours.layer_sequence(), msk, ours.config.ffn_chunk))
    return torch.cat([y1, y2], dim=-1)


@pytest.mark.parametrize("length", [37, 48])  # padded internally (as ReformerModel pads), and whole chunks
def test_reformer_reversible_lsh_stack_hf_parity(length):
    hf, ours = paired_models()
    hf.eval(), ours.eval()
    x, mask = padded(length, seed=1)
    with torch.no_grad():
        ref = hf(inputs_embeds=x, attention_mask=mask).last_hidden_state  # (B, T, 2H)
        mine = hf.encoder.layer_norm(ember_stack(ours, x, mask))
    keep = mask.bool()
    torch.testing.assert_close(mine[keep], ref[keep], atol=2e-5, rtol=0)


def test_reformer_reversible_lsh_stack_gradients_hf_parity():
    """Backward through both reversible stacks (transformers' _ReversibleFunction recomputes its
    layers too): the same parameter and input gradients to float32 tolerance (both reconstruct
    inputs by subtraction, rounding differently)."""
    hf, ours = paired_models()
    hf.train(), ours.train()  # dropout is 0; transformers' backward pass runs in training mode only
    seeded = torch.randn(4, 8, 3, 2, generator=torch.Generator().manual_seed(HASH_SEED))
    for layer in ours.layers:
        layer.attention.rotations = lambda *_: seeded  # transformers' seeded rotations (module docstring)
    x, mask = padded(48, seed=2)
    x_hf, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    weights = torch.randn(2, 48, 64, generator=torch.Generator().manual_seed(3))
    (hf(inputs_embeds=x_hf, attention_mask=mask).last_hidden_state * weights).sum().backward()
    (hf.encoder.layer_norm(ember_stack(ours, x_ours, mask)) * weights).sum().backward()
    torch.testing.assert_close(x_ours.grad, x_hf.grad, atol=1e-4, rtol=1e-4)
    for ember_layer, hf_layer in zip(ours.layers, hf.encoder.layers):
        pairs = ((ember_layer.attention.query_key.weight, hf_layer.attention.self_attention.query_key.weight),
                 (ember_layer.attention.out.weight, hf_layer.attention.output.dense.weight),
                 (ember_layer.ffn.up.weight, hf_layer.feed_forward.dense.dense.weight),
                 (ember_layer.attention_norm.weight, hf_layer.attention.layer_norm.weight))
        for mine, theirs in pairs:
            torch.testing.assert_close(mine.grad, theirs.grad, atol=1e-4, rtol=1e-4)
