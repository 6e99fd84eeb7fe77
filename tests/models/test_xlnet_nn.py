"""XLNet / Transformer-XL building blocks (ember.nn): relative positions and their shift,
two-stream masks, segment differences and memory, against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from ember.errors import EmberError
from ember.nn.relative_attention import segment_difference
from ember.nn.relative_position import rel_shift, relative_distances, relative_positions, sinusoid_table
from ember.nn.two_stream import two_stream_masks, update_memory


def test_xlnet_relative_distances_cover_every_key_from_the_farthest():
    # 1 memory position + 2 queries: keys at absolute 0, 1, 2, queries at 1, 2.
    assert relative_distances(2, 3, "bi").tolist() == [3, 2, 1, 0, -1]
    assert relative_distances(2, 3, "uni").tolist() == [3, 2, 1, 0]
    with pytest.raises(EmberError, match="attention type"):
        relative_distances(2, 3, "left")


def test_xlnet_relative_positions_clamp_and_mirror_for_bidirectional_data():
    table = relative_positions(2, 3, 4, clamp_len=1, bi_data=True)
    assert table.shape == (2, 5, 4)
    torch.testing.assert_close(table[0], sinusoid_table(torch.tensor([1.0, 1, 1, 0, -1]), 4))
    torch.testing.assert_close(table[1], sinusoid_table(torch.tensor([-1.0, -1, -1, 0, 1]), 4))


def test_xlnet_sinusoids_are_sines_then_cosines_of_the_distance():
    # dim 4: frequencies 1/10000^(0/4) = 1 and 1/10000^(2/4) = 0.01
    table = sinusoid_table(torch.tensor([0.0, 1.0, -2.0]), 4)
    expected = torch.tensor([[0, 0, 1, 1],
                             [math.sin(1), math.sin(0.01), math.cos(1), math.cos(0.01)],
                             [math.sin(-2), math.sin(-0.02), math.cos(-2), math.cos(-0.02)]])
    torch.testing.assert_close(table, expected)


def test_xlnet_rel_shift_aligns_each_query_with_its_distances():
    # M = 1, T = 2, K = 3, table rows = distances [3, 2, 1, 0, -1]. Query 0 (absolute 1) sees
    # keys 0, 1, 2 at distances 1, 0, -1 -> rows 2, 3, 4; query 1 (absolute 2) at 2, 1, 0 -> rows 1, 2, 3.
    x = torch.tensor([[float(10 * i + p) for p in range(5)] for i in range(2)])  # x[i, p] = 10 i + p
    assert rel_shift(x[None, None], 3)[0, 0].tolist() == [[2, 3, 4], [11, 12, 13]]


def test_xlnet_rel_shift_matches_its_definition_on_random_scores():
    b, n, t, m = 2, 3, 5, 4
    x = torch.randn(b, n, t, m + 2 * t)
    shifted = rel_shift(x, m + t)
    for i in range(t):
        for j in range(m + t):
            torch.testing.assert_close(shifted[..., i, j], x[..., i, j + t - i])


def test_xlnet_two_stream_masks_golden():
    # T = 3 tokens after 1 memory position; token 2 is padding; perm_mask: 0 may not see 1.
    perm = torch.tensor([[[0, 1, 0], [0, 0, 0], [0, 0, 0]]])
    content, query = two_stream_masks(3, 1, perm, torch.tensor([[1, 1, 0]]))
    #                 mem  t0  t1  t2
    assert query[0].int().tolist() == [[1, 1, 0, 0],
                                       [1, 1, 1, 0],
                                       [1, 1, 1, 0]]
    assert content[0].int().tolist() == [[1, 1, 0, 0],
                                         [1, 1, 1, 0],
                                         [1, 1, 1, 1]]  # a padded query still sees itself


def test_xlnet_two_stream_masks_causal_and_none():
    assert two_stream_masks(3, 0) == (None, None)
    assert two_stream_masks(3, 0, attention_mask=torch.ones(1, 3)) == (None, None)
    content, query = two_stream_masks(2, 1, causal=True)
    assert query[0].int().tolist() == [[1, 1, 0], [1, 1, 1]]
    assert torch.equal(content, query)  # the causal pattern already lets a token see itself


def test_xlnet_segment_difference_treats_memory_as_segment_zero():
    diff = segment_difference(torch.tensor([[0, 1, 2]]), mlen=1)
    assert diff[0].int().tolist() == [[0, 0, 1, 1],
                                      [1, 1, 0, 1],
                                      [1, 1, 1, 0]]
    assert segment_difference(None, 2) is None


def test_xlnet_memory_keeps_the_last_mem_len_inputs_without_gradient():
    previous = torch.arange(2.0).view(1, 2, 1)
    current = torch.arange(10.0, 13.0).view(1, 3, 1).requires_grad_()
    kept = update_memory(previous, current, mem_len=4)
    assert kept.flatten().tolist() == [1, 10, 11, 12] and not kept.requires_grad
    assert update_memory(previous, current, mem_len=4, reuse_len=2).flatten().tolist() == [0, 1, 10, 11]
    assert update_memory(None, current, mem_len=2).flatten().tolist() == [11, 12]


@pytest.mark.parametrize("attn_type", ["bi", "uni"])
@pytest.mark.parametrize("bi_data", [False, True])
@pytest.mark.parametrize("clamp_len", [-1, 0, 7])
def test_xlnet_relative_positions_hf_parity(attn_type, bi_data, clamp_len):
    """The position table equals transformers' XLNetModel.relative_positional_encoding from a tiny
    random config, for every attention type, with and without XLNet's bidirectional data and
    clamping (clamp_len <= 0 means no clamp). d_model 64 and distances up to 300 so that every
    frequency and every base constant of the sinusoid shows in the table."""
    transformers = pytest.importorskip("transformers")
    config = transformers.XLNetConfig(vocab_size=8, d_model=64, n_layer=1, n_head=2, d_inner=8,
                                      attn_type=attn_type, bi_data=bi_data, clamp_len=clamp_len)
    hf = transformers.XLNetModel(config).eval()
    qlen, klen = 40, 300  # 260 memory positions
    expected = hf.relative_positional_encoding(qlen, klen, bsz=None)  # (P, D, dim)
    ours = relative_positions(qlen, klen, 64, attn_type=attn_type, clamp_len=clamp_len, bi_data=bi_data)
    # the same float32 formulas on both sides, but transformers forms the outer product with einsum
    # (another kernel): 1e-5 absolute, 100x below what a base of 10001 instead of 10000 changes
    torch.testing.assert_close(ours, expected.permute(1, 0, 2), rtol=0, atol=1e-5)


def test_xlnet_relative_positions_default_to_transformers_default_config():
    """Without options: XLNet's defaults (bidirectional attention, no clamp, one table)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.XLNetConfig(vocab_size=8, d_model=16, n_layer=1, n_head=2, d_inner=8)
    expected = transformers.XLNetModel(config).relative_positional_encoding(3, 9)
    torch.testing.assert_close(relative_positions(3, 9, 16), expected.permute(1, 0, 2), rtol=0, atol=1e-5)


def test_xlnet_rel_shift_hf_parity():
    transformers = pytest.importorskip("transformers")
    x = torch.randn(2, 3, 5, 4 + 2 * 5)  # (batch, heads, T queries, P = K + T), K = 4 memory + 5
    # a reshape and a slice on both sides, no arithmetic: exact
    expected = transformers.models.xlnet.modeling_xlnet.XLNetRelativeAttention.rel_shift_bnij(x, klen=9)
    assert torch.equal(rel_shift(x, 9), expected)
