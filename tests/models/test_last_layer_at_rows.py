"""The encoder's last layer computed only at the rows a caller reads (ember.nn.query_rows): the
masked LM's output rows, gradients and dropout masks are those of the full computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember.config import DataConfig, ModelConfig
from ember.data.pairs import SegmentPairDataset
from ember.data.shards import TokenCorpus
from ember.models import build_backbone
from ember.models.encoder import Encoder
from ember.objectives.bert import BertPretraining


def _run(fn, seed: int = 1):
    """fn() under a fixed seed, and the next random number drawn after it (the stream's state)."""
    torch.manual_seed(seed)
    result = fn()
    return result, torch.rand(1).item()


def _grads(module: torch.nn.Module, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    module.zero_grad()
    loss.backward()
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


def _assert_rows_give_the_full_step(module: torch.nn.Module, batch: dict, metric_names: tuple[str, ...]) -> None:
    """module(batch) with its backbone's last layer everywhere and at the read rows: the same
    loss, metrics, gradients of every parameter and next random draw."""
    results = {}
    for takes_rows in (False, True):
        module.backbone.takes_rows = takes_rows
        (loss, metrics), after = _run(lambda: module(batch))
        results[takes_rows] = (loss, metrics, after, _grads(module, loss))
    (loss_f, m_f, after_f, g_f), (loss_r, m_r, after_r, g_r) = results[False], results[True]
    torch.testing.assert_close(loss_r, loss_f, atol=1e-6, rtol=1e-6)
    assert all(m_r[name] == m_f[name] for name in metric_names)
    assert after_r == after_f
    assert g_f.keys() == g_r.keys()
    for name in g_f:
        torch.testing.assert_close(g_r[name], g_f[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("pre_layer_norm", [False, True], ids=["post-ln", "pre-ln"])
@pytest.mark.parametrize("share_layers", ["none", "all"], ids=["bert", "albert-shared"])
def test_encoder_last_layer_at_rows_matches_full_layer_outputs_grads_and_dropout(pre_layer_norm, share_layers):
    cfg = ModelConfig(vocab_size=60, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                      max_position=32, dropout=0.1, attention_dropout=0.1, pre_layer_norm=pre_layer_norm,
                      share_layers=share_layers)
    torch.manual_seed(0)
    encoder = Encoder(cfg).train()
    ids = torch.randint(5, 60, (3, 17))
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0  # padding: keys masked, as in the full layer
    rows = torch.rand(3, 17) < 0.2
    rows[0, 3], rows[2] = True, False  # sequence 2 reads nothing (only its [CLS] for the pooler)

    def full():
        out = encoder(ids, mask)
        return out.last_hidden_state[rows], out.pooled

    def at_rows():
        out = encoder(ids, mask, rows=rows)
        return out.last_hidden_state, out.pooled

    (want, want_pooled), after_full = _run(full)
    (got, got_pooled), after_rows = _run(at_rows)
    assert got.shape == (int(rows.sum()), 32)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got_pooled, want_pooled, atol=1e-6, rtol=1e-5)
    assert after_rows == after_full  # the same random draws were made: later masks are unchanged
    g_full = _grads(encoder, want.square().sum() + want_pooled.sum())
    g_rows = _grads(encoder, got.square().sum() + got_pooled.sum())
    assert g_full.keys() == g_rows.keys()
    for name in g_full:
        torch.testing.assert_close(g_rows[name], g_full[name], atol=1e-5, rtol=1e-4, msg=name)


def test_encoder_last_layer_at_rows_with_a_visibility_matrix_and_a_causal_encoder():
    """A (B, T, T) visibility (K-BERT) is cut to the read queries; a causal encoder (XLM CLM)
    without padding runs its whole last layer and still returns the read rows."""
    torch.manual_seed(0)
    ids = torch.randint(5, 60, (2, 9))
    rows = torch.zeros(2, 9, dtype=torch.bool)
    rows[0, [2, 7]], rows[1, 4] = True, True
    visible = torch.rand(2, 9, 9) < 0.6
    for causal, mask in ((False, visible), (True, None)):
        cfg = ModelConfig(vocab_size=60, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                          max_position=16, causal=causal, pooler=False)
        encoder = Encoder(cfg).eval()
        with torch.no_grad():
            want = encoder(ids, mask).last_hidden_state[rows]
            got = encoder(ids, mask, rows=rows).last_hidden_state
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert not torch.equal(got, want * 0)  # the rows hold real outputs


def test_bert_pretraining_last_layer_at_masked_rows_gives_the_full_loss_on_real_text(wiki_prepared):
    """BERT pre-training (MLM + NSP) on real Wikipedia pairs, with dropout: the loss, every
    parameter's gradient and the NSP head are those of the last layer computed everywhere."""
    corpus = TokenCorpus(wiki_prepared, "train")
    pairs_data = SegmentPairDataset(corpus, max_seq_length=64, pair_mode="nsp", short_seq_prob=0.5, seed=0)
    pairs = [pairs_data.example(i, epoch=0) for i in range(16)]
    cfg = ModelConfig(vocab_size=2000, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                      max_position=64)
    special = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
    torch.manual_seed(0)
    module = BertPretraining(build_backbone(cfg), special, DataConfig(nsp=True)).train()
    assert module.backbone.takes_rows
    batch = module.make_batch(pairs, np.random.default_rng(0))
    assert bool((batch["attention_mask"] == 0).any())  # pairs of several lengths: padded rows too
    _assert_rows_give_the_full_step(module, batch, ("mlm_acc", "nsp_acc"))


def test_spanbert_last_layer_at_masked_and_boundary_rows_gives_the_full_loss_on_real_text(wiki_prepared):
    """SpanBERT (MLM + span-boundary objective) with span masking on real Wikipedia segments,
    dropout on: its last layer at the masked tokens and the spans' boundary tokens gives the loss,
    metrics, gradients and random draws of the full layer."""
    from ember.objectives.masking import build_masker
    from ember.objectives.spanbert import SpanBertPretraining

    corpus = TokenCorpus(wiki_prepared, "train")
    special = {**corpus.special_token_ids, "tokenizer_path": str(corpus.tokenizer_path)}
    data = DataConfig(masking="span", nsp=False, max_predictions=0)
    cfg = ModelConfig(vocab_size=2000, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                      max_position=64)
    torch.manual_seed(0)
    module = SpanBertPretraining(build_backbone(cfg), special, data, build_masker(data, special, 2000, seed=0)).train()
    segments = SegmentPairDataset(corpus, 64, module.pair_mode, short_seq_prob=0.5, seed=0)
    batch = module.make_batch([segments.example(i) for i in range(16)], np.random.default_rng(0))
    masked = batch["labels"] != -100
    boundaries_unmasked = ~masked.gather(1, batch["span_end"].clamp(min=0)) & masked
    assert bool(boundaries_unmasked.any())  # the SBO reads rows the MLM does not
    assert bool((batch["attention_mask"] == 0).any())
    _assert_rows_give_the_full_step(module, batch, ("mlm_acc", "sbo_acc"))


@pytest.mark.parametrize("mode", ["mlm", "clm"])
def test_xlm_last_layer_at_predicted_rows_gives_the_full_loss_on_real_en_ru(en_ru, mode):
    """XLM with language embeddings on real English and Russian streams, dropout on: MLM runs its
    last layer at the masked tokens; CLM (a causal encoder, every token predicted) falls back to
    the whole layer. Loss, per-language metrics, gradients and random draws are the full layer's."""
    import dataclasses

    from ember.config import XlmConfig, model_preset
    from ember.objectives.xlm import XlmPretraining

    corpus = TokenCorpus(en_ru, "train")
    cfg = dataclasses.replace(model_preset("xlm-mini"), vocab_size=corpus.vocab_size, hidden_size=32, num_layers=2,
                              num_heads=2, intermediate_size=64, max_position=64, num_languages=2,
                              languages="en,ru", causal=mode == "clm")
    data = DataConfig(max_seq_length=64)
    torch.manual_seed(0)
    module = XlmPretraining(build_backbone(cfg), corpus.special_token_ids, data, XlmConfig(), mode).train()
    examples = module.build_dataset(corpus, data, seed=0)
    batch = module.make_batch([examples.example(i) for i in range(12)], np.random.default_rng(0))
    assert set(batch["language_ids"].unique().tolist()) == {0, 1}  # both languages in the batch
    _assert_rows_give_the_full_step(module, batch, (f"{'lm' if mode == 'clm' else 'mlm'}_acc",))


def test_sequence_classifier_last_layer_at_cls_gives_the_full_loss_on_real_sst2():
    """Fine-tuning a classifier on real SST-2 sentences (the real MiniLM tokenizer; a small random
    encoder with its pooler, dropout on): the last layer run at [CLS] alone gives the loss,
    gradients and later random draws of the full last layer, and the same logits in eval mode."""
    from conftest import real_data
    from ember.tasks.classification import SequenceClassifier
    from ember.tasks.featurize import collate
    from ember.tokenizers import load_tokenizer

    tok = load_tokenizer(real_data("checkpoints", "all-MiniLM-L6-v2", "tokenizer.json"))
    tok.no_padding()  # the checkpoint's tokenizer pads to a fixed length; collate pads per batch
    lines = real_data("glue", "SST-2", "dev.tsv").read_text().splitlines()[1:17]
    sentences, labels = zip(*(line.rsplit("\t", 1) for line in lines))
    encodings = tok.encode_batch(list(sentences))
    features = [{"input_ids": e.ids, "token_type_ids": e.type_ids, "label": int(y)} for e, y in zip(encodings, labels)]
    batch = collate(features, pad_id=0)
    assert bool((batch["attention_mask"] == 0).any())  # sentences of several lengths
    cfg = ModelConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, num_layers=2, num_heads=2,
                      intermediate_size=64, max_position=128)
    torch.manual_seed(0)
    classifier = SequenceClassifier(build_backbone(cfg), num_labels=2, pad_id=0).train()
    _assert_rows_give_the_full_step(classifier, batch, ("accuracy",))
    classifier.eval()
    classifier.backbone.takes_rows = True
    with torch.no_grad():
        at_cls = classifier.logits(batch)
        classifier.backbone.takes_rows = False
        full = classifier.logits(batch)
    torch.testing.assert_close(at_cls, full, atol=1e-6, rtol=1e-5)


def test_int8_encoder_last_layer_at_rows_matches_its_full_layer():
    """Dynamically quantized Linear layers (`--int8`) have no weight to slice into query and
    key/value parts: the rows are taken from the whole projection instead. The outputs agree to
    int8's noise (dynamic quantization scales each product's input by its own range, which the
    read rows alone need not share); a wrong row would be off by the outputs' whole scale (~1)."""
    from torch.ao.quantization import quantize_dynamic

    cfg = ModelConfig(vocab_size=60, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_position=32)
    torch.manual_seed(0)
    encoder = quantize_dynamic(Encoder(cfg).eval(), {torch.nn.Linear}, dtype=torch.qint8)
    assert type(encoder.layers[-1].attention.qkv) is not torch.nn.Linear
    ids = torch.randint(5, 60, (2, 11))
    rows = torch.zeros(2, 11, dtype=torch.bool)
    rows[:, 0] = True
    with torch.no_grad():
        want, got = encoder(ids).last_hidden_state[rows], encoder(ids, rows=rows).last_hidden_state
    torch.testing.assert_close(got, want, atol=5e-3, rtol=0)
