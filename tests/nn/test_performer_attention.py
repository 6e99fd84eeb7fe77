"""Performer FAVOR+ (ember.nn.performer): the estimator (unbiased; error shrinking with the
number of features on real hidden states), causal attention through prefix sums, the encoder
variant. transformers has no Performer, so there is no parity test against it: the reference
is exact softmax attention and, for the causal form, the same features applied densely."""

from __future__ import annotations

import gzip
import re

import pytest
import torch

from conftest import real_data
from ember.config import ModelConfig
from ember.errors import EmberError
from ember.models import build_backbone
from ember.nn.performer import favor_attention, orthogonal_features, positive_features


def kernel_estimate(q, k, projection):
    """phi(q).phi(k) without the stabilisers (they cancel only inside attention)."""
    m = projection.shape[0]
    fq = torch.exp(q @ projection.T - q.pow(2).sum(-1, keepdim=True) / 2) / m ** 0.5
    fk = torch.exp(k @ projection.T - k.pow(2).sum(-1, keepdim=True) / 2) / m ** 0.5
    return fq @ fk.T


@pytest.mark.parametrize("orthogonal", [False, True])
def test_performer_positive_features_are_unbiased_for_the_softmax_kernel(orthogonal):
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(n, 8, generator=g, dtype=torch.float64) * 0.25 for n in (4, 5))
    exact = torch.exp(q @ k.T)
    draws = torch.stack([kernel_estimate(q, k, orthogonal_features(64, 8, g, orthogonal, dtype=torch.float64))
                         for _ in range(400)])
    mean, spread = draws.mean(0), draws.std(0) / 400 ** 0.5
    assert ((mean - exact).abs() < 4 * spread + 1e-9).all()  # the mean of 400 draws is within 4 standard errors
    assert (spread / exact).max() < 0.03  # and the check is tight: a 10% bias would fail it


def real_hidden_states(tokens: int = 128):
    """Layer-0 queries/keys/values of all-MiniLM-L6-v2 on real Wikipedia text."""
    from ember.interop.common import read_hf_config, read_hf_weights
    from ember.interop.families import import_checkpoint
    from ember.tokenizers import load_tokenizer

    folder = real_data("checkpoints", "all-MiniLM-L6-v2")
    cfg, state = import_checkpoint(read_hf_config(folder), read_hf_weights(folder))
    model = build_backbone(cfg).eval()
    model.load_state_dict({k.removeprefix("backbone."): v for k, v in state.items()}, strict=False)
    with gzip.open(real_data("wiki-en", "AA", "wiki_00.gz"), "rt", encoding="utf-8") as fh:
        text = " ".join(re.sub(r"<[^>]+>", " ", fh.read(50_000)).split())
    ids = torch.tensor([load_tokenizer(folder / "tokenizer.json").encode(text).ids[:tokens]])
    with torch.no_grad():
        x = model.embed(ids)[0]
        att = model.layers[0].attention
        q, k, v = att.qkv(x).view(1, tokens, 3, att.num_heads, att.head_dim).permute(2, 0, 3, 1, 4)
    return q, k, v


def test_performer_error_shrinks_as_features_grow_on_real_hidden_states():
    """MiniLM's layer-0 attention is peaky (q.k/sqrt(d) up to ~40 on this text), the hard case for
    random features (Choromanski et al. 2021 §4): the error falls slowly, but it falls."""
    q, k, v = real_hidden_states()
    exact = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    errors = []
    for m in (16, 64, 256, 1024):
        per_draw = [(favor_attention(q, k, v, orthogonal_features(m, 32, torch.Generator().manual_seed(s))) - exact)
                    .norm() / v.norm() for s in range(4)]
        errors.append(float(torch.stack(per_draw).mean()))
    assert errors == sorted(errors, reverse=True), errors  # more features, smaller error
    assert errors[-1] < 0.9 * errors[0], errors


def test_performer_causal_prefix_sums_equal_dense_causal_features():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 19, 8, generator=g, dtype=torch.float64) for _ in range(3))
    projection = orthogonal_features(16, 8, g, dtype=torch.float64)
    ours = favor_attention(q, k, v, projection, causal=True)
    scale = 8 ** -0.25
    a = positive_features(q * scale, projection, True) @ positive_features(k * scale, projection, False).transpose(-1, -2)
    a = a * torch.ones(19, 19, dtype=torch.bool).tril()  # position i reads j <= i only
    dense = (a / a.sum(-1, keepdim=True)) @ v
    torch.testing.assert_close(ours, dense, atol=1e-10, rtol=0)
    later = v.clone()
    later[:, :, 10:] += 1  # changing later values leaves earlier outputs alone
    torch.testing.assert_close(favor_attention(q, k, later, projection, causal=True)[:, :, :10], ours[:, :, :10])


def tiny(**kw) -> ModelConfig:
    return ModelConfig(**{"vocab_size": 60, "hidden_size": 32, "num_layers": 2, "num_heads": 4,
                          "intermediate_size": 37, "max_position": 64, "dropout": 0.0, "attention_dropout": 0.0,
                          "attention": "performer", "attention_features": 64, **kw})


def test_performer_encoder_is_reproducible_in_eval_ignores_padding_and_trains():
    torch.manual_seed(0)
    model = build_backbone(tiny()).eval()
    ids = torch.randint(5, 60, (2, 30))
    mask = torch.ones(2, 30, dtype=torch.long)
    mask[1, 20:] = 0
    with torch.no_grad():
        a, b = model(ids, mask).last_hidden_state, model(ids, mask).last_hidden_state
        other = ids.clone()
        other[1, 20:] = 7  # what the padding holds does not reach real tokens
        c = model(other, mask).last_hidden_state
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(a[1, :20], c[1, :20], atol=1e-5, rtol=0)
    model.train()
    model(ids, mask).last_hidden_state.pow(2).mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    causal = build_backbone(tiny(family="xlm", causal=True)).eval()  # XLM's CLM, through prefix sums
    with torch.no_grad():
        full = causal(ids).last_hidden_state
        prefix = causal(ids[:, :12]).last_hidden_state
    torch.testing.assert_close(full[:, :12], prefix, atol=1e-5, rtol=0)


def test_performer_config_and_inputs_refused_with_one_line():
    with pytest.raises(EmberError, match="attention_features=0 must be >= 1"):
        tiny(attention_features=0)
    with pytest.raises(EmberError, match="not family 't5'"):
        tiny(family="t5")
    model = build_backbone(tiny())
    with pytest.raises(EmberError, match="probabilities are not available with model.attention=performer"):
        model(torch.randint(5, 60, (1, 8)), output_attentions=True)
