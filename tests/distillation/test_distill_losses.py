"""Distillation losses against hand computations (Hinton KD, DistilBERT, TinyBERT, Patient KD)."""

from __future__ import annotations

import math

import pytest
import torch

from ember.distillation.losses import (
    attention_mse, cosine_hidden_loss, logit_mse, masked_mse, patience_loss, pkd_layer_map,
    soft_cross_entropy, uniform_layer_map,
)
from ember.errors import EmberError


def test_kd_soft_cross_entropy_matches_hinton_formula_with_t_squared():
    s = torch.tensor([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]])
    t = torch.tensor([[2.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    T = 3.0
    total = 0.0
    for i in range(2):  # written out with math, not torch
        zt = [math.exp(v / T) for v in t[i].tolist()]
        zs = [math.exp(v / T) for v in s[i].tolist()]
        p = [z / sum(zt) for z in zt]
        q = [z / sum(zs) for z in zs]
        total += -sum(pi * math.log(qi) for pi, qi in zip(p, q))
    expected = total / 2 * T * T
    assert soft_cross_entropy(s, t, T).item() == pytest.approx(expected, rel=1e-6)


def test_kd_soft_cross_entropy_has_kl_gradients_and_t_squared_keeps_their_scale():
    torch.manual_seed(0)
    s = torch.randn(4, 5, requires_grad=True)
    t = torch.randn(4, 5)
    T = 4.0
    soft_cross_entropy(s, t, T).backward()
    ours = s.grad.clone()
    s.grad = None
    kl = torch.nn.functional.kl_div(torch.log_softmax(s / T, -1), torch.softmax(t / T, -1),
                                    reduction="batchmean") * T * T
    kl.backward()
    assert torch.allclose(ours, s.grad, atol=1e-6)
    # d/ds of T^2 CE(p_T, q_T) = T (q_T - p_T) / B
    expected = T * (torch.softmax(s.detach() / T, -1) - torch.softmax(t / T, -1)) / 4
    assert torch.allclose(ours, expected, atol=1e-6)


def test_logit_mse_is_mean_square():
    s, t = torch.tensor([[1.0, 2.0]]), torch.tensor([[0.0, 4.0]])
    assert logit_mse(s, t).item() == pytest.approx((1 + 4) / 2)


def test_distilbert_cosine_loss_by_hand_ignores_padding():
    s = torch.tensor([[[1.0, 0.0], [1.0, 1.0], [5.0, 5.0]]])
    t = torch.tensor([[[0.0, 1.0], [2.0, 2.0], [-1.0, 0.0]]])
    mask = torch.tensor([[1, 1, 0]])
    # token 0: orthogonal -> 1 - 0 = 1; token 1: parallel -> 0; token 2 is padding.
    assert cosine_hidden_loss(s, t, mask).item() == pytest.approx(0.5, abs=1e-6)
    with pytest.raises(EmberError):
        cosine_hidden_loss(s, torch.zeros(1, 3, 4))


def test_tinybert_uniform_layer_map_follows_g_m_equals_m_n_over_m():
    assert uniform_layer_map(4, 12) == [0, 3, 6, 9, 12]  # TinyBERT-4 from BERT-base (paper §4.2)
    assert uniform_layer_map(2, 4) == [0, 2, 4]
    assert uniform_layer_map(3, 3) == [0, 1, 2, 3]
    with pytest.raises(EmberError):
        uniform_layer_map(5, 12)


def test_pkd_layer_maps_skip_and_last_as_in_the_paper():
    # BERT_6 from BERT_12 (Sun et al. 2019, Fig. 1): skip {2,4,6,8,10}, last {7,8,9,10,11}.
    assert pkd_layer_map(6, 12, "skip") == [(1, 2), (2, 4), (3, 6), (4, 8), (5, 10)]
    assert pkd_layer_map(6, 12, "last") == [(1, 7), (2, 8), (3, 9), (4, 10), (5, 11)]
    assert pkd_layer_map(2, 4, "skip") == [(1, 2)]
    assert pkd_layer_map(2, 4, "last") == [(1, 3)]
    with pytest.raises(EmberError):
        pkd_layer_map(1, 4, "skip")


def test_pkd_patience_loss_normalises_cls_states():
    s = torch.tensor([[[3.0, 4.0]], [[1.0, 0.0]]])  # (L=2, B=1, H=2)
    t = torch.tensor([[[6.0, 8.0]], [[0.0, 2.0]]])
    # layer 1: same direction -> 0; layer 2: (1,0) vs (0,1) -> squared diffs 1 and 1.
    assert patience_loss(s, t).item() == pytest.approx((0 + 0 + 1 + 1) / 4)
    # scale invariance: multiplying the student's states changes nothing
    assert patience_loss(10 * s, t).item() == pytest.approx(patience_loss(s, t).item())


def test_tinybert_masked_and_attention_mse_skip_padding_and_average_heads():
    s = torch.zeros(1, 3, 2)
    t = torch.ones(1, 3, 2)
    t[0, 2] = 100.0  # padding position: must not count
    assert masked_mse(s, t, torch.tensor([[1, 1, 0]])).item() == pytest.approx(1.0)
    a_s = torch.full((1, 2, 3, 3), 0.5)
    a_t = torch.zeros(1, 2, 3, 3)
    a_t[..., 2] = 9.0  # attention to the padding key
    a_t[:, :, 2] = 9.0  # and from the padding query
    assert attention_mse(a_s, a_t, torch.tensor([[1, 1, 0]])).item() == pytest.approx(0.25)
    # different head counts: compare head-averaged maps
    a_t4 = torch.zeros(1, 4, 3, 3)
    a_t4[:, :2] = 1.0  # mean over heads 0.5 = student's mean
    assert attention_mse(a_s, a_t4).item() == pytest.approx(0.0)
