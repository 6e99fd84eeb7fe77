"""Length-sorted inference batches (ember.tasks.batching): the order every inference loop runs
its rows in, and the progress bar `ember evaluate` / `ember predict` show over them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import real_data
from tokenizers import Tokenizer

from ember.tasks.batching import inference_progress, length_sorted_batches


class RecordedBar:
    """Stands in for tqdm: what a loop asked its bar to show."""

    made: list["RecordedBar"] = []

    def __init__(self, total, desc, unit, **_):
        self.total, self.desc, self.unit, self.n, self.closed = total, desc, unit, 0, False
        RecordedBar.made.append(self)

    def update(self, k):
        self.n += k

    def close(self):
        self.closed = True


@pytest.fixture
def bars(monkeypatch):
    RecordedBar.made = []
    monkeypatch.setattr("tqdm.tqdm", RecordedBar)
    return RecordedBar.made


def test_length_sorted_batches_are_a_stable_sort_cut_into_chunks():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 12, size=103).tolist()  # many ties
    chunks = list(length_sorted_batches(lengths, 16))
    assert [len(c) for c in chunks] == [16] * 6 + [7]
    assert sum(chunks, []) == np.argsort(lengths, kind="stable").tolist()  # ties keep input order
    pairs = [(a, b) for a, b in zip(lengths, rng.integers(1, 5, size=103).tolist())]
    assert sum(length_sorted_batches(pairs, 10), []) == sorted(range(103), key=lambda i: pairs[i])
    assert list(length_sorted_batches([], 4)) == []
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        next(length_sorted_batches([3], 0))


def test_length_sorted_batches_with_a_token_budget_take_long_rows_a_few_at_a_time():
    """A budget of padded tokens per chunk (a long model's whole-article windows): rows stay in
    ascending order, a chunk never holds more than the budget (one row always fits), and with rows
    short enough the chunks are the plain ones."""
    lengths = [300, 9000, 120, 16000, 384, 5000, 16000, 40]
    chunks = list(length_sorted_batches(lengths, 4, max_tokens=4 * 512))
    assert [i for c in chunks for i in c] == sorted(range(len(lengths)), key=lengths.__getitem__)
    for c in chunks:
        assert len(c) <= 4 and (len(c) == 1 or len(c) * max(lengths[i] for i in c) <= 4 * 512)
    assert chunks == [[7, 2, 0, 4], [5], [1], [3], [6]]
    short = [5, 3, 9, 1, 7, 7]
    assert list(length_sorted_batches(short, 4, max_tokens=4 * 512)) == list(length_sorted_batches(short, 4))


def test_inference_progress_draws_one_bar_for_the_outermost_loop_only(bars):
    for _ in length_sorted_batches([1, 2, 3], 2):
        pass
    assert bars == []  # no bar outside inference_progress (training's evaluations, the server)
    with inference_progress("evaluating dev", unit="text"):
        for chunk in length_sorted_batches(list(range(10)), 4):
            for _ in length_sorted_batches([5] * len(chunk), 2):  # a loop inside each batch: no bar of its own
                pass
    assert [(b.desc, b.unit, b.total, b.n, b.closed) for b in bars] == [("evaluating dev", "text", 10, 10, True)]
    with inference_progress("off", enabled=False):
        list(length_sorted_batches([1, 2], 1))
    with inference_progress("broken"), pytest.raises(RuntimeError):
        for _ in length_sorted_batches([1, 2, 3], 1):
            raise RuntimeError("a failed batch")
    assert len(bars) == 2 and bars[1].closed  # closed even when a batch fails, so the next loop can draw
    with inference_progress("again"):
        list(length_sorted_batches([1], 1))
    assert [b.desc for b in bars] == ["evaluating dev", "broken", "again"]


def test_classifier_logits_on_real_sst2_keep_input_order_with_a_progress_bar(bars):
    """A tiny random BERT classifier over 200 real SST-2 dev sentences (the MiniLM checkpoint's
    WordPiece tokenizer): the bar counts every sentence once, and each row's logits are those of
    the sentence run alone (length-sorted batches put it back in its place)."""
    from ember.models import build_backbone
    from ember.config import model_preset
    from ember.tasks.featurize import encode_examples
    from ember.tasks.readers.glue import read_examples
    from ember.tasks.classification import SequenceClassifier

    checkpoint = real_data("checkpoints", "all-MiniLM-L6-v2")
    real_data("glue", "SST-2")
    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    examples = read_examples("sst2", "dev", limit=200)
    features, _ = encode_examples(examples, tokenizer, 64)
    torch.manual_seed(0)
    cfg = model_preset("bert-tiny")
    model = SequenceClassifier(build_backbone(dataclasses.replace(cfg, vocab_size=tokenizer.get_vocab_size())),
                               2, 0).eval()
    with inference_progress("evaluating dev"):
        logits = model.predict(features, batch_size=32)
    assert [(b.total, b.n, b.closed) for b in bars] == [(200, 200, True)]
    assert len({len(f["input_ids"]) for f in features}) > 10  # real, varied lengths: the order matters
    alone = np.concatenate([model.predict([f], batch_size=1) for f in features[:20]])
    np.testing.assert_allclose(logits[:20], alone, atol=1e-5)
