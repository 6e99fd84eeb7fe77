"""RoBERTa FULL-SENTENCES / DOC-SENTENCES packing (Liu et al. 2019, §4.2): invariants on the
real Wikipedia shards, a golden example worked out by hand, speed, and the pretrain wiring."""

from __future__ import annotations

import time

import numpy as np
import pytest

from ember.config import DataConfig
from ember.data.packing import PackedSentenceDataset, build_pretraining_dataset
from ember.data.pairs import SegmentPairDataset
from ember.data.shards import TokenCorpus
from ember.errors import EmberError

SEP = 3


class ArrayCorpus:
    """The three things packing reads from a TokenCorpus, over in-memory arrays."""

    def __init__(self, sentence_lengths, doc_sentences, first_token: int = 100):
        self.sentence_lengths = np.asarray(sentence_lengths, dtype=np.int64)
        self.doc_offsets = np.concatenate([[0], np.cumsum(doc_sentences)]).astype(np.int64)
        self._ends = np.cumsum(self.sentence_lengths)
        self.first_token = first_token

    def sentences(self, start: int, stop: int) -> np.ndarray:
        # Token k of the corpus is first_token + k, made on demand (no N-token array).
        begin = int(self._ends[start - 1]) if start else 0
        return np.arange(begin, int(self._ends[stop - 1])) + self.first_token


def all_sequences(data) -> list[np.ndarray]:
    return [data.example(i, 0).tokens_a for i in range(len(data))]


def corpus_stream(corpus: TokenCorpus) -> tuple[np.ndarray, np.ndarray]:
    """Every token of the corpus in order (int64 (N,)) and each document's end offset (D,)."""
    docs = [corpus.doc_tokens(d).astype(np.int64) for d in range(corpus.num_docs)]
    return np.concatenate(docs), np.cumsum([len(d) for d in docs])


@pytest.fixture(scope="module")
def wiki(wiki_prepared):
    corpus = TokenCorpus(wiki_prepared, "train")
    sep = corpus.special_token_ids["sep"]
    stream, _ = corpus_stream(corpus)
    # Separators in the packed output can only be ours if the text itself never holds one.
    assert not (stream == sep).any()
    return corpus, sep


def test_full_sentences_golden_packing_worked_by_hand():
    # Documents: D0 = sentences of 2 and 1 tokens, D1 = one of 1 token, D2 = 3 and 7 tokens.
    # max_seq_length 7 -> budget 5 (two specials). Greedy FULL-SENTENCES:
    #   [s0 s1 SEP s2]  2 + 1 + 1 + 1 = 5; adding SEP + s3 would make 9
    #   [s3]            3; s4's first piece (5 tokens) does not fit beside it
    #   [s4[:5]]        the 7-token sentence is cut at the budget ...
    #   [s4[5:]]        ... and its 2-token tail starts the next sequence
    corpus = ArrayCorpus([2, 1, 1, 3, 7], [2, 1, 2])  # tokens 100..113
    full = PackedSentenceDataset(corpus, 7, cross_documents=True, sep_id=SEP)
    assert [t.tolist() for t in all_sequences(full)] == [
        [100, 101, 102, SEP, 103], [104, 105, 106], [107, 108, 109, 110, 111], [112, 113]]
    np.testing.assert_array_equal(full.bounds, [0, 3, 4, 5, 6])
    assert full.num_tokens == 14 + 1 and full.documents(0).tolist() == [0, 1]
    # DOC-SENTENCES never crosses a document: D0 and D1 become separate, shorter sequences.
    doc = PackedSentenceDataset(corpus, 7, cross_documents=False)
    assert [t.tolist() for t in all_sequences(doc)] == [
        [100, 101, 102], [103], [104, 105, 106], [107, 108, 109, 110, 111], [112, 113]]
    assert doc.mean_length == 14 / 5 < full.mean_length


def test_full_sentences_visits_every_token_once_with_separators_exactly_at_document_boundaries(wiki):
    corpus, sep = wiki
    data = PackedSentenceDataset(corpus, 64, cross_documents=True, sep_id=sep)
    stream, doc_ends = corpus_stream(corpus)
    seqs = all_sequences(data)
    assert all(0 < len(s) <= 62 for s in seqs)  # budget: max_seq_length - <s> - </s>
    assert sum(len(s) for s in seqs) == data.num_tokens
    # Dropping our separators gives back the corpus, in order: every token exactly once.
    np.testing.assert_array_equal(np.concatenate([s[s != sep] for s in seqs]), stream)
    # Where the separators sit, in corpus-stream coordinates: exactly the document ends that
    # fall strictly inside a sequence (a document ending at a sequence end needs none).
    seq_starts, sep_at, pos = set(), [], 0
    for s in seqs:
        seq_starts.add(pos)
        where = np.flatnonzero(s == sep)
        sep_at += (pos + where - np.arange(len(where))).tolist()  # corpus tokens before each sep
        pos += int((s != sep).sum())
        assert len(where) == len(data.documents(len(seq_starts) - 1)) - 1
    inside = [int(e) for e in doc_ends[:-1] if int(e) not in seq_starts]
    assert sep_at == inside and len(inside) >= 5  # some sequences do cross documents
    # FULL-SENTENCES fills sequences: only sentence granularity leaves room unused.
    assert data.mean_length > 0.7 * 62


def test_doc_sentences_never_mixes_documents_and_keeps_every_token(wiki):
    corpus, sep = wiki
    full = PackedSentenceDataset(corpus, 64, cross_documents=True, sep_id=sep)
    data = PackedSentenceDataset(corpus, 64, cross_documents=False, sep_id=sep)
    stream, doc_ends = corpus_stream(corpus)
    seqs = all_sequences(data)
    assert all(0 < len(s) <= 62 for s in seqs)
    assert not any((s == sep).any() for s in seqs)
    np.testing.assert_array_equal(np.concatenate(seqs), stream)
    assert all(len(data.documents(i)) == 1 for i in range(len(data)))
    # every document end is a sequence end
    seq_ends = set(np.cumsum([len(s) for s in seqs]).tolist())
    assert set(doc_ends.tolist()) <= seq_ends
    # sequences near the end of a document are shorter: more of them, less full on average
    assert len(data) > len(full) and data.mean_length < full.mean_length


def test_sentence_longer_than_the_budget_is_cut_into_budget_sized_pieces(wiki):
    corpus, sep = wiki
    data = PackedSentenceDataset(corpus, 32, cross_documents=True, sep_id=sep)
    lengths = corpus.sentence_lengths
    longest = int(np.argmax(lengths))
    assert lengths[longest] > 2 * 30  # the real corpus has sentences of several budgets
    sentence = corpus.sentence(longest).astype(np.int64)
    seqs = all_sequences(data)
    assert all(len(s) <= 30 for s in seqs)
    # its first piece fills a sequence on its own, the next pieces follow in order
    first = next(i for i, s in enumerate(seqs) if np.array_equal(s, sentence[:30]))
    np.testing.assert_array_equal(seqs[first + 1], sentence[30:60])
    full_pieces, rest = divmod(len(sentence), 30)
    if rest:  # the short tail starts the next sequence, which may go on with more sentences
        np.testing.assert_array_equal(seqs[first + full_pieces][:rest], sentence[-rest:])


def test_packing_is_a_pure_function_of_the_corpus(wiki):
    corpus, sep = wiki
    a = PackedSentenceDataset(corpus, 64, cross_documents=True, sep_id=sep)
    b = PackedSentenceDataset(TokenCorpus(corpus.prepared_dir, "train"), 64, cross_documents=True, sep_id=sep)
    np.testing.assert_array_equal(a.bounds, b.bounds)
    for i in (0, 17, len(a) - 1):
        x, y = a.example(i, 0), b.example(i, 5)  # the epoch changes only the masking key
        np.testing.assert_array_equal(x.tokens_a, y.tokens_a)
        assert (x.tokens_b, x.label, x.mask_key, y.mask_key) == (None, 0, (i, 0), (i, 5))


def test_packing_indexes_two_million_sentences_quickly():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 80, size=2_000_000)  # includes sentences over the budget
    docs = rng.integers(1, 40, size=120_000)
    docs = docs[: np.searchsorted(np.cumsum(docs), len(lengths))]
    docs = np.append(docs, len(lengths) - docs.sum())
    corpus = ArrayCorpus(lengths, docs)
    for cross in (True, False):
        start = time.perf_counter()
        data = PackedSentenceDataset(corpus, 64, cross_documents=cross, sep_id=SEP)
        elapsed = time.perf_counter() - start
        assert elapsed < 5.0, f"indexing took {elapsed:.1f}s"  # ~0.5 s measured on 2 busy cores
        separators = data.num_tokens - int(lengths.sum())
        assert 0 < separators < len(docs) if cross else separators == 0
        last = data.example(len(data) - 1)
        assert last.tokens_a[-1] == corpus.first_token + lengths.sum() - 1


def test_phrase_flags_travel_with_the_packed_tokens():
    class FlaggedCorpus(ArrayCorpus):
        has_joins = True

        def joins(self, start, stop):  # a made-up flag per token: "token id divisible by 3"
            return (self.sentences(start, stop) % 3 == 0).astype(np.uint8)

    corpus = FlaggedCorpus([2, 1, 1, 3, 7], [2, 1, 2])  # the golden corpus above
    data = PackedSentenceDataset(corpus, 7, cross_documents=True, sep_id=SEP)
    for i in range(len(data)):
        pair = data.example(i)
        expected = (pair.tokens_a % 3 == 0) & (pair.tokens_a != SEP)  # a separator joins nothing
        np.testing.assert_array_equal(pair.joins_a, expected)
    assert data.example(0).joins_a.tolist() == [False, False, True, False, False]  # 100 101 102 SEP 103


def test_pretraining_dataset_factory_and_objective_check(wiki):
    corpus, sep = wiki
    seg = build_pretraining_dataset(corpus, DataConfig(max_seq_length=64), "sop", 0, sep)
    assert isinstance(seg, SegmentPairDataset) and seg.pair_mode == "sop"
    full = build_pretraining_dataset(corpus, DataConfig(max_seq_length=64, packing="full_sentences"),
                                     "none", 0, sep)
    doc = build_pretraining_dataset(corpus, DataConfig(max_seq_length=64, packing="doc_sentences"),
                                    "none", 0, sep)
    assert (full.cross_documents, doc.cross_documents, full.pair_mode) == (True, False, "none")
    with pytest.raises(EmberError, match="objective mlm"):
        build_pretraining_dataset(corpus, DataConfig(packing="full_sentences"), "nsp", 0, sep)
    with pytest.raises(EmberError, match="full_sentences"):
        build_pretraining_dataset(corpus, DataConfig(packing="full"), "none", 0, sep)


def test_packed_sequences_become_cls_tokens_sep_batches(wiki):
    from ember.objectives.bert import pack_pairs

    corpus, sep = wiki
    special = corpus.special_token_ids
    data = PackedSentenceDataset(corpus, 64, cross_documents=True, sep_id=sep)
    crossing = next(i for i in range(len(data)) if len(data.documents(i)) > 1)
    pairs = [data.example(crossing), data.example(0)]
    ids, types, attention, maskable = pack_pairs(pairs, special["cls"], sep, special["pad"])
    assert ids.shape[1] <= 64
    row, n = ids[0], len(pairs[0].tokens_a)
    assert row[0] == special["cls"] and row[n + 1] == sep and attention[0].sum() == n + 2
    assert (row[1 : n + 1] == sep).sum() == 1  # one document separator inside the sequence
    assert not types.any()
    # the separator is maskable like any text token, as in fairseq's RoBERTa masking
    assert maskable[0, 1 : n + 1].all()
