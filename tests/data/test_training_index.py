"""The pre-training index (BERT's chunks, RoBERTa's packed sequences) built in numpy without
per-sentence Python lists: exactly the sequences the straightforward per-sentence loops give."""

from __future__ import annotations

import numpy as np
import pytest

from ember.data.packing import PackedSentenceDataset, pack_units, split_long_sentences
from ember.data.pairs import build_chunks


class Corpus:
    """sentence_lengths / doc_offsets / sentences() of a random corpus (tokens = running ids)."""

    def __init__(self, seed: int, docs: int = 300, long_every: int = 7, max_len: int = 40):
        rng = np.random.default_rng(seed)
        per_doc = rng.integers(0, 12, docs)  # some empty documents too
        self.doc_offsets = np.concatenate([[0], np.cumsum(per_doc)]).astype(np.int64)
        lengths = rng.integers(1, max_len, int(per_doc.sum()))
        lengths[::long_every] *= 5  # sentences longer than the packing budget
        self.sentence_lengths = lengths.astype(np.int64)
        self.ends = np.cumsum(self.sentence_lengths)

    def sentences(self, start, stop):
        begin = int(self.ends[start - 1]) if start else 0
        return np.arange(begin, int(self.ends[stop - 1]), dtype=np.int64)


def reference_chunks(corpus, max_tokens, short_seq_prob, seed):
    """BERT's create_pretraining_data grouping, one sentence at a time (the loop ember had)."""
    rng = np.random.default_rng([seed, 7919])
    lengths, offsets, chunks = corpus.sentence_lengths.tolist(), corpus.doc_offsets.tolist(), []
    for doc in range(len(offsets) - 1):
        start, end = offsets[doc], offsets[doc + 1]
        target = max_tokens if rng.random() >= short_seq_prob else int(rng.integers(2, max_tokens + 1))
        first, total = start, 0
        for s in range(start, end):
            total += lengths[s]
            if total >= target or s == end - 1:
                chunks.append((doc, first, s + 1))
                first, total = s + 1, 0
                target = max_tokens if rng.random() >= short_seq_prob else int(rng.integers(2, max_tokens + 1))
    return np.asarray(chunks, dtype=np.int64)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("max_tokens,short", [(61, 0.1), (125, 0.5), (8, 0.0)])
def test_build_chunks_equals_the_per_sentence_loop(seed, max_tokens, short):
    corpus = Corpus(seed)
    got = build_chunks(corpus, max_tokens, short, seed)
    np.testing.assert_array_equal(got, reference_chunks(corpus, max_tokens, short, seed))
    assert got.dtype == np.int64 and got.shape[1] == 3


@pytest.mark.parametrize("cross", [True, False])
@pytest.mark.parametrize("seed", [0, 3])
def test_packing_in_blocks_equals_packing_everything_at_once(cross, seed):
    corpus = Corpus(seed)
    data = PackedSentenceDataset(corpus, 34, cross_documents=cross, sep_id=-1)  # budget 32
    sent, offset, length = split_long_sentences(corpus.sentence_lengths, 32)
    doc = np.searchsorted(corpus.doc_offsets, sent, side="right") - 1
    whole = pack_units(length, doc, 32, cross)
    for block in (1, 5, 64, 1 << 22):  # tiny blocks: sequences cross many block boundaries
        np.testing.assert_array_equal(data._pack(block), whole)
    np.testing.assert_array_equal(data.bounds, whole)
    # the sparse unit map gives every unit's sentence, offset and length
    for name, expected in zip(("sent", "offset", "length"), (sent, offset, length)):
        np.testing.assert_array_equal(data._units.lookup(0, len(sent))[("sent", "offset", "length").index(name)],
                                      expected)
    # every token of the corpus once per epoch, separators where documents meet inside a sequence
    tokens = [data.example(i).tokens_a for i in range(len(data))]
    real = np.concatenate([t[t >= 0] for t in tokens])
    np.testing.assert_array_equal(real, np.arange(int(corpus.sentence_lengths.sum())))
    assert sum(len(t) for t in tokens) == data.num_tokens
    assert all(len(t) <= 32 for t in tokens)
