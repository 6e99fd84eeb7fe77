"""T5's relative position buckets (ember.nn.relative_bias) against transformers' own bucketing
(T5Attention._relative_position_bucket, a static function: no model, nothing downloaded) over
every offset up to well past max_distance, both directions, and bucket settings other than the
paper's 32 / 128; and the bias module's (query, key) layout during cached decoding."""

from __future__ import annotations

import pytest
import torch
from transformers.models.t5.modeling_t5 import T5Attention

from ember.nn.relative_bias import RelativePositionBias, relative_position_bucket


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 40), (8, 20), (64, 300)])
def test_t5_relative_position_buckets_match_transformers(bidirectional, num_buckets, max_distance):
    rel = torch.arange(-3 * max_distance, 3 * max_distance + 1)[:, None]  # (N, 1) key - query
    ours = relative_position_bucket(rel, bidirectional, num_buckets, max_distance)
    theirs = T5Attention._relative_position_bucket(rel, bidirectional, num_buckets, max_distance)
    assert ours.dtype == theirs.dtype == torch.long  # ids that index an embedding table
    assert torch.equal(ours, theirs)  # integer bucket ids: the same computation, exactly
    assert ours.min() >= 0 and ours.max() == num_buckets - 1  # every bucket id is in range


def test_t5_relative_position_bias_reads_key_minus_query_for_cached_decoding():
    # A decoder step at position 5 over 7 cached keys: its row equals row 5 of the full square.
    torch.manual_seed(0)
    bias = RelativePositionBias(num_heads=2, bidirectional=False, num_buckets=8, max_distance=20)
    full = bias(7, 7)  # (1, 2, 7, 7)
    step = bias(1, 7, query_offset=5)  # (1, 2, 1, 7)
    assert step.shape == (1, 2, 1, 7) and torch.equal(step[0, :, 0], full[0, :, 5])
    buckets = relative_position_bucket(torch.arange(7)[None, :] - torch.arange(7)[:, None], False, 8, 20)
    assert torch.equal(full[0].permute(1, 2, 0), bias.embedding.weight[buckets])


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_relative_position_bias_defaults_are_the_papers_32_buckets_up_to_128(bidirectional):
    # Raffel et al. 2020, §2.1: 32 embeddings, logarithmic ranges up to an offset of 128
    bias = RelativePositionBias(num_heads=3, bidirectional=bidirectional)
    assert bias.embedding.num_embeddings == 32
    rel = torch.arange(-300, 301)[:, None]
    expected = T5Attention._relative_position_bucket(rel, bidirectional, 32, 128)
    assert torch.equal(relative_position_bucket(rel, bidirectional, bias.num_buckets, bias.max_distance), expected)
    out = bias(5, 9)  # (1, heads, T, L), encoder (bidirectional) or decoder
    assert out.shape == (1, 3, 5, 9)
