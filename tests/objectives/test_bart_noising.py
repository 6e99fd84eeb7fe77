"""BART's noising functions (Lewis et al. 2020, §2.2) on real Wikipedia sentences: fixed seeds,
the corrupted sequence's structure checked against an independent rebuild and the paper's
numbers (30% masked, Poisson(3) spans, 0-length spans insert a mask, permutations of sentences,
rotations of documents)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ember.data.sentence_blocks import SentenceBlockDataset
from ember.errors import EmberError
from ember.objectives import bart_noising as N

MASK = 4  # <mask> in ember's byte-level BPE (RoBERTa's / BART's ids 0-4)


@pytest.fixture(scope="module")
def blocks(wiki_bpe):
    """Blocks of whole real sentences (<= 126 tokens, room for <s> and </s>) of 54 articles."""
    from ember.data.shards import TokenCorpus

    corpus = TokenCorpus(wiki_bpe, "train")
    data = SentenceBlockDataset(corpus, 126)
    return corpus, data, [data.example(i) for i in range(len(data))]


def test_bart_sentence_blocks_keep_real_sentences_whole(blocks):
    corpus, data, examples = blocks
    assert data.max_sentences > 1 and all(len(b.tokens) <= 126 for b in examples)
    docs = np.concatenate([corpus.doc_tokens(d) for d in range(corpus.num_docs)]).astype(np.int64)
    np.testing.assert_array_equal(np.concatenate([b.tokens for b in examples]), docs)  # every token once, in order
    sent_ends = set(np.cumsum(corpus.sentence_lengths).tolist())
    pos = 0
    for b in examples:
        assert b.sentence_ends[-1] == len(b.tokens) and (np.diff(b.sentence_ends) > 0).all()
        # a boundary inside a block is a real sentence end; a block ends at one unless a sentence was cut
        assert all(pos + int(e) in sent_ends for e in b.sentence_ends[:-1])
        pos += len(b.tokens)


def _rebuild_infilling(tokens: np.ndarray, spans: np.ndarray, starts: np.ndarray) -> list[int]:
    """The paper's description, token by token: each span (start, length) becomes one mask."""
    out, covered = [], np.zeros(len(tokens), dtype=bool)
    by_start = {}
    for s, n in zip(starts.tolist(), spans.tolist()):
        by_start.setdefault(s, []).append(n)
        covered[s:s + n] = True
    for i in range(len(tokens) + 1):
        for n in sorted(by_start.get(i, [])):  # a 0-length span sorts before a span starting there
            out.append(MASK)
        if i < len(tokens) and not covered[i]:
            out.append(int(tokens[i]))
    return out


def test_bart_text_infilling_golden_on_real_sentences(blocks):
    """Seeded: the output is the independent rebuild from the drawn spans; exactly ceil(30%) of
    the tokens are masked; one mask per span, also for 0-length spans."""
    _, _, examples = blocks
    body = examples[3].tokens
    out = N.text_infilling(body, 0.3, 3.0, MASK, np.random.default_rng(7))
    rng = np.random.default_rng(7)  # the same draws, step by step
    spans = N.infilling_spans(len(body), 0.3, 3.0, rng)
    starts = N.layout_spans(len(body), spans, rng)
    assert out.tolist() == _rebuild_infilling(body, spans, starts)
    assert spans.sum() == math.ceil(0.3 * len(body))
    assert len(out) == len(body) - spans.sum() + len(spans) and (out == MASK).sum() == len(spans)
    assert (np.diff(starts) >= spans[:-1]).all()  # no overlap
    kept = np.ones(len(body), dtype=bool)
    for s, n in zip(starts, spans):
        kept[s:s + n] = False
    np.testing.assert_array_equal(out[out != MASK], body[kept])  # the rest in order, untouched
    assert (body != MASK).all()


def test_bart_text_infilling_spans_follow_poisson_3_and_mask_30_percent(blocks):
    _, _, examples = blocks
    rng = np.random.default_rng(0)
    lengths, inserts, totals = [], 0, 0
    for b in examples:
        spans = N.infilling_spans(len(b.tokens), 0.3, 3.0, rng)
        assert spans.sum() == math.ceil(0.3 * len(b.tokens))  # the budget, exactly
        lengths += spans[:-1].tolist()  # the last one is cut to the budget
        totals += len(spans)
    lengths = np.array(lengths)
    assert len(lengths) > 1000
    assert abs(lengths.mean() - 3.0) < 0.15  # Poisson(3): mean 3, P(0) = e^-3 = 0.050
    assert abs((lengths == 0).mean() - math.exp(-3)) < 0.02
    body = examples[0].tokens
    for seed in range(40):  # a 0-length span shows as a mask between two kept tokens
        rng = np.random.default_rng(seed)
        spans = N.infilling_spans(len(body), 0.3, 3.0, rng)
        if (spans == 0).any():
            starts = N.layout_spans(len(body), spans, rng)
            out = N.text_infilling(body, 0.3, 3.0, MASK, np.random.default_rng(seed))
            assert (out == MASK).sum() == len(spans) > (spans > 0).sum()
            assert out.tolist() == _rebuild_infilling(body, spans, starts)
            break
    else:
        pytest.fail("no 0-length span in 40 seeds")


def test_bart_token_masking_and_deletion_on_real_sentences(blocks):
    _, _, examples = blocks
    body = examples[5].tokens
    n = math.ceil(0.3 * len(body))
    masked = N.token_masking(body, 0.3, MASK, np.random.default_rng(1))
    where = N.sample_positions(len(body), 0.3, np.random.default_rng(1))
    assert len(masked) == len(body) and (masked == MASK).sum() == n == len(where)
    assert (masked[where] == MASK).all()
    keep = np.setdiff1d(np.arange(len(body)), where)
    np.testing.assert_array_equal(masked[keep], body[keep])
    deleted = N.token_deletion(body, 0.3, np.random.default_rng(1))
    np.testing.assert_array_equal(deleted, body[keep])  # the same draws, removed instead of masked
    randomised = N.token_masking(body, 0.3, MASK, np.random.default_rng(1), random_ratio=1.0,
                                 ordinary=np.arange(5, 1000))
    assert (randomised == MASK).sum() == 0 and (randomised[keep] == body[keep]).all()


def test_bart_sentence_permutation_is_a_permutation_of_real_sentences(blocks):
    _, _, examples = blocks
    block = max(examples, key=lambda b: len(b.sentence_ends))
    assert len(block.sentence_ends) >= 3

    def sentences(tokens, ends):
        starts = np.concatenate([[0], ends[:-1]])
        return [tuple(tokens[s:e].tolist()) for s, e in zip(starts, ends)]

    before = sentences(block.tokens, block.sentence_ends)
    changed = False
    for seed in range(5):
        out, ends = N.sentence_permutation(block.tokens, block.sentence_ends, np.random.default_rng(seed))
        after = sentences(out, ends)
        assert sorted(after) == sorted(before) and len(out) == len(block.tokens)
        changed |= after != before
    assert changed
    half, _ = N.sentence_permutation(block.tokens, block.sentence_ends, np.random.default_rng(0), ratio=0.0)
    np.testing.assert_array_equal(half, block.tokens)  # ratio 0: nothing moves


def test_bart_document_rotation_is_a_rotation(blocks):
    _, _, examples = blocks
    body = examples[2].tokens
    seen = set()
    for seed in range(20):
        out = N.document_rotation(body, np.random.default_rng(seed))
        k = [k for k in range(1, len(body)) if np.array_equal(out, np.roll(body, -k))]
        assert len(k) >= 1  # a rotation by k in 1..L-1, never the identity
        seen.add(k[0])
    assert len(seen) > 10  # the start is drawn uniformly, not fixed


def test_bart_noising_kinds_are_checked_and_ordered():
    assert N.parse_kinds("rotate, infill,permute") == ("permute", "infill", "rotate")
    with pytest.raises(EmberError, match="choose from mask, delete, infill, permute, rotate"):
        N.parse_kinds("infill,shuffle")
    with pytest.raises(EmberError, match="combines mask and infill"):
        N.parse_kinds("mask,infill")


def test_bart_whole_word_infilling_and_masking_on_real_sentences(blocks, wiki_bpe):
    """noising.unit=word (fairseq's span-poisson masks whole words): spans are counted and laid out
    in words of the BPE's word starts, exactly ceil(30%) of the words; token masking masks every
    token of a chosen word or none of it."""
    from ember.objectives.masking import word_continuation_table
    from ember.tokenizers import load_tokenizer

    _, _, examples = blocks
    table = word_continuation_table(load_tokenizer(wiki_bpe / "tokenizer.json"))
    body = max(examples[:20], key=lambda b: len(b.tokens)).tokens
    starts = ~table[body]
    bounds = N.unit_bounds(len(body), starts)
    words = len(bounds) - 1
    assert words < len(body)  # some words are several pieces: the test means something
    out = N.text_infilling(body, 0.3, 3.0, MASK, np.random.default_rng(3), starts=starts)
    rng = np.random.default_rng(3)
    spans = N.infilling_spans(words, 0.3, 3.0, rng)
    first = N.layout_spans(words, spans, rng)
    assert spans.sum() == math.ceil(0.3 * words)
    token_starts, token_lengths = bounds[first], bounds[first + spans] - bounds[first]
    assert out.tolist() == _rebuild_infilling(body, token_lengths, token_starts)

    masked = N.token_masking(body, 0.3, MASK, np.random.default_rng(4), starts=starts)
    per_word = [masked[bounds[w]:bounds[w + 1]] == MASK for w in range(words)]
    assert all(m.all() or not m.any() for m in per_word)
    assert sum(m.all() for m in per_word) == math.ceil(0.3 * words)
