"""The LM losses that never form their (rows x vocabulary) logits (ember.nn.lm_loss over
ember.nn.linear_cross_entropy) equal F.cross_entropy over the backbone's own ``lm_logits``:
GPT's next-token loss on real Wikipedia blocks (with and without padding), and every backbone's
``lm_projection`` (GPT's tied head, T5's scaled tied head and untied head, XLNet's biased head)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ember.config import model_preset
from ember.models import build_backbone
from ember.nn.lm_loss import token_loss


def _grads(loss, params):
    return torch.autograd.grad(loss, params, allow_unused=True)


def _assert_same_grads(got, want):
    assert [g is None for g in got] == [g is None for g in want]
    for a, b in zip(got, want):
        if b is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("padded", [False, True])
def test_gpt_next_token_loss_on_real_text_equals_cross_entropy_of_its_logits(wiki_bpe, padded):
    from ember.data.blocks import TokenBlockDataset
    from ember.data.shards import TokenCorpus
    from ember.objectives.clm import CausalLM
    from ember.tokenizers import load_tokenizer

    vocab = load_tokenizer(wiki_bpe / "tokenizer.json").get_vocab_size()
    torch.manual_seed(0)
    model = CausalLM(build_backbone(dataclasses.replace(model_preset("gpt2-tiny"), vocab_size=vocab,
                                                        dropout=0.0, attention_dropout=0.0)), 5)
    data = TokenBlockDataset(TokenCorpus(wiki_bpe, "train"), 64, eot_id=5)
    batch = model.make_batch([data.example(i) for i in range(4)], np.random.default_rng(0))
    if padded:  # right padding on two rows: those positions are never targets
        batch["attention_mask"][0, 40:] = 0
        batch["attention_mask"][2, 10:] = 0
    params = list(model.parameters())
    loss, metrics = model(batch)
    got = _grads(loss, params)

    ids, mask = batch["input_ids"], batch["attention_mask"]
    logits = model.logits(ids, mask if padded else None)[:, :-1]  # (B, T-1, V)
    targets = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
    ref = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1), ignore_index=-100)
    where = targets != -100
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    assert metrics["lm_acc"] == (int((logits.argmax(-1)[where] == targets[where]).sum()), int(where.sum()))
    assert metrics["lm_acc"][1] == (4 * 63 - (63 - 39) - (63 - 9) if padded else 4 * 63)
    _assert_same_grads(got, _grads(ref, params))


@pytest.mark.parametrize("preset", ["gpt2-tiny", "t5-tiny", "t5-v1_1-small", "xlnet-mini"],
                         ids=["gpt-tied", "t5-tied-scaled", "t5-untied", "xlnet-bias"])
def test_token_loss_over_lm_projection_equals_cross_entropy_of_lm_logits(preset):
    torch.manual_seed(0)
    cfg = dataclasses.replace(model_preset(preset), vocab_size=211)
    if preset == "t5-v1_1-small":  # the untied head at a test-sized width
        cfg = dataclasses.replace(cfg, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    backbone = build_backbone(cfg)
    assert (getattr(backbone, "lm_head", None) is not None) == (preset == "t5-v1_1-small")
    with torch.no_grad():  # XLNet's bias starts at zero: give it values that matter
        for name, p in backbone.named_parameters():
            if name.endswith("lm_bias"):
                p.normal_()
    hidden = torch.randn(37, cfg.hidden_size, requires_grad=True)
    targets = torch.randint(0, 211, (37,))
    params = [hidden] + [p for p in backbone.parameters() if p.requires_grad]
    loss, metrics = token_loss(*backbone.lm_projection(hidden), targets, "lm")
    got = _grads(loss, params)
    logits = backbone.lm_logits(hidden)
    ref = F.cross_entropy(logits, targets)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    assert metrics["lm_acc"] == (int((logits.argmax(-1) == targets).sum()), 37)
    _assert_same_grads(got, _grads(ref, params))
