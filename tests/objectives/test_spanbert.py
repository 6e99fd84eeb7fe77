"""SpanBERT (Joshi et al. 2020): the span-boundary objective's inputs, shapes and loss, the
batches it trains on, and learning on real text with the spanbert-mini recipe."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ember.config import DataConfig, ModelConfig
from ember.data.pairs import SegmentPairDataset
from ember.data.shards import TokenCorpus
from ember.models import build_backbone
from ember.objectives.masking import build_masker
from ember.objectives.spanbert import SpanBertPretraining
from run_helpers import SHORT_RUN, recipe_config, short_run

SPECIAL = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}


def tiny_spanbert(embedding_size: int = 0, vocab: int = 120) -> SpanBertPretraining:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=vocab, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                      max_position=40, dropout=0.0, attention_dropout=0.0, embedding_size=embedding_size)
    return SpanBertPretraining(build_backbone(cfg), SPECIAL, DataConfig(nsp=False))


def hand_batch():
    """Two rows; row 0 has spans [2, 5) and [7, 8), row 1 has [1, 3)."""
    ids = torch.tensor([[2, 10, 4, 4, 4, 11, 12, 4, 13, 3],
                        [2, 4, 4, 14, 15, 16, 3, 0, 0, 0]])
    labels = torch.full_like(ids, -100)
    start, end = torch.full_like(ids, -1), torch.full_like(ids, -1)
    for row, s, e, originals in ((0, 2, 5, [20, 21, 22]), (0, 7, 8, [23]), (1, 1, 3, [24, 25])):
        labels[row, s:e] = torch.tensor(originals)
        start[row, s:e], end[row, s:e] = s, e
    return {"input_ids": ids, "attention_mask": (ids != 0).long(), "token_type_ids": torch.zeros_like(ids),
            "labels": labels, "span_start": start, "span_end": end}


def test_spanbert_sbo_predicts_each_span_token_from_its_boundaries_and_offset():
    """Paper §3.2: y_i = LN(GeLU(W2 LN(GeLU(W1 [x_{s-1}; x_{e+1}; p_{i-s+1}])))), decoded by the
    tied embeddings; recomputed by hand for each of the 6 targets."""
    module = tiny_spanbert().eval()
    batch = hand_batch()
    loss, metrics = module(batch)
    with torch.no_grad():
        x = module.backbone(batch["input_ids"], batch["attention_mask"]).last_hidden_state  # (2, 10, 32)
        sbo, emb = module.sbo, module.backbone.word_embeddings
        targets = [(0, 2, 2, 5, 20), (0, 3, 2, 5, 21), (0, 4, 2, 5, 22), (0, 7, 7, 8, 23),
                   (1, 1, 1, 3, 24), (1, 2, 1, 3, 25)]  # (row, i, s, e_exclusive, original id)
        losses = []
        for row, i, s, e, original in targets:
            h0 = torch.cat([x[row, s - 1], x[row, e], sbo.position.weight[i - s]])  # (96,)
            h1 = F.layer_norm(F.gelu(h0 @ sbo.dense.weight.T + sbo.dense.bias), (32,),
                              sbo.norm.weight, sbo.norm.bias, 1e-12)
            out = sbo.output
            y = F.layer_norm(F.gelu(h1 @ out.dense.weight.T + out.dense.bias), (32,),
                             out.norm.weight, out.norm.bias, 1e-12)
            logits = emb @ y + out.bias  # (V,)
            losses.append(F.cross_entropy(logits[None], torch.tensor([original])))
            module_logits = sbo(x[row, s - 1][None], x[row, e][None], torch.tensor([i - s]), emb)  # (1, V)
            torch.testing.assert_close(module_logits[0], logits, atol=1e-5, rtol=1e-5)
        expected_sbo = torch.stack(losses).mean()
    sbo_sum, n = metrics["sbo_loss"]
    assert n == 6 and metrics["mlm_loss"][1] == 6
    torch.testing.assert_close(torch.tensor(sbo_sum / n), expected_sbo, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss, torch.tensor(metrics["mlm_loss"][0] / 6 + sbo_sum / 6), atol=1e-5, rtol=1e-5)
    assert {"mlm_acc", "sbo_acc", "loss"} <= set(metrics) and not any(k.startswith("nsp") for k in metrics)


def test_spanbert_sbo_gradients_reach_boundaries_positions_and_tied_embeddings():
    module = tiny_spanbert(embedding_size=16)  # factorized: the SBO output is E-dimensional
    module.zero_grad()
    loss, _ = module(hand_batch())
    loss.backward()
    used_offsets = module.sbo.position.weight.grad.abs().sum(-1)  # offsets 0, 1, 2 are used
    assert (used_offsets[:3] > 0).all() and (used_offsets[3:] == 0).all()
    assert module.sbo.output.dense.weight.shape == (16, 32)
    embedding_grads = [p.grad for n, p in module.backbone.named_parameters() if "word" in n]
    assert embedding_grads and embedding_grads[0].abs().sum() > 0


def test_spanbert_batches_are_single_segments_with_whole_word_spans(wiki_prepared):
    from ember.tokenizers import load_tokenizer
    from ember.objectives.masking import word_continuation_table

    corpus = TokenCorpus(wiki_prepared, "train")
    special = {**corpus.special_token_ids, "tokenizer_path": str(corpus.tokenizer_path)}
    data = DataConfig(masking="span", nsp=False, max_predictions=0)
    cfg = ModelConfig(vocab_size=2000, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                      max_position=64)
    module = SpanBertPretraining(build_backbone(cfg), special, data, build_masker(data, special, 2000, seed=0))
    assert module.pair_mode == "none" and module.nsp is None and module.sop is None
    dataset = SegmentPairDataset(corpus, 64, module.pair_mode, seed=0)
    batch = module.make_batch([dataset.example(i) for i in range(32)], np.random.default_rng(0))
    assert "sentence_label" not in batch and (batch["token_type_ids"] == 0).all()
    continues = word_continuation_table(load_tokenizer(corpus.tokenizer_path))
    original = batch["input_ids"].clone()
    labels, start, end = batch["labels"], batch["span_start"], batch["span_end"]
    original[labels != -100] = labels[labels != -100]
    masked = labels != -100
    assert (masked == (start >= 0)).all()
    for row in range(32):
        spans = {(int(s), int(e)) for s, e in zip(start[row], end[row]) if s >= 0}
        assert masked[row].sum() == round(0.15 * int((batch["attention_mask"][row]).sum() - 2))
        for s, e in spans:
            assert masked[row, s:e].all() and (start[row, s:e] == s).all()
            assert not continues[int(original[row, s])]  # a span starts at a word start ...
            assert e == len(original[row]) or not continues[int(original[row, e])]  # ... ends at a word end
            assert batch["attention_mask"][row, e] == 1  # the right boundary is a real token


def test_spanbert_recipe_loss_goes_down_on_real_text(wiki_prepared, tmp_path):
    cfg = recipe_config("spanbert-mini", wiki_prepared, *SHORT_RUN)
    assert (cfg.objective, cfg.data.masking, cfg.data.span_p, cfg.data.max_span) == ("spanbert", "span", 0.2, 10)
    records = short_run(cfg, tmp_path / "run")
    train = [r for r in records if r["split"] == "train"]
    for name in ("mlm_loss", "sbo_loss"):
        values = [r[name] for r in train]
        assert np.mean(values[-8:]) < np.mean(values[:5]) - 0.5, name
    evals = [r for r in records if r["split"] == "eval"]
    assert evals and {"mlm_loss", "sbo_loss", "sbo_acc"} <= set(evals[-1])
