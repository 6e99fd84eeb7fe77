"""Segment-pair examples for sentence-level pre-training objectives.

Follows BERT's ``create_pretraining_data`` (Devlin et al. 2019, §3.1 and App. A.2):
consecutive sentences of a document are grouped into chunks of about ``max_seq_length - 3``
tokens (10% of chunks get a shorter random target length, so the model sees short inputs);
each time a chunk is drawn it is split at a random sentence boundary into segment A and B.
For NSP, B is the true continuation half the time and a span from a random other document
otherwise. SOP (ALBERT) reuses the same split and swaps A and B instead. The pair is then
trimmed to fit, one token at a time from the longer segment, at its front or back at random.

Chunk boundaries are fixed once (seeded); the split, the random-next choice and the masks
are drawn fresh every time an example is seen, from an RNG keyed by (seed, epoch, index),
so data order and content are a pure function of the step: that is what makes resume exact.

When the corpus stores phrase/entity flags (``ember prepare --phrases``), each segment
carries them too (``joins_a``/``joins_b``: bool, aligned with the tokens and cut the same
way by every split and trim), for ERNIE-style masking (``ember.objectives.masking``).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from ember.errors import EmberError

PAIR_MODES = ("nsp", "sop", "none")


@dataclass
class SegmentPair:
    tokens_a: np.ndarray  # (La,) token ids, no special tokens
    tokens_b: np.ndarray | None  # (Lb,) or None when the objective uses single segments
    label: int  # NSP: 0 = B follows A, 1 = B is random (the HF convention); SOP: 1 = swapped
    mask_key: tuple[int, int] = (0, 0)  # (index, epoch) this example was drawn for; static masking keys on it
    joins_a: np.ndarray | None = None  # (La,) bool: token joins the previous token's phrase unit
    joins_b: np.ndarray | None = None  # (Lb,) bool, same for B; None when the corpus has no flags


def build_chunks(corpus, max_tokens: int, short_seq_prob: float, seed: int) -> np.ndarray:
    """Group each document's sentences into chunks of about ``max_tokens`` tokens.

    Returns int64 (num_chunks, 3): (doc, first sentence, end sentence) per chunk.

    A chunk closes at the first sentence that brings it to its target length (or at the end
    of the document); a target is drawn at each document start and after each chunk, as in
    BERT's create_pretraining_data. The loop runs once per chunk, not per sentence, on a
    per-document running sum, and the chunks go to a flat int64 buffer: memory is the
    output (24 B per chunk) plus one document, so a corpus of 10^8-10^9 sentences indexes
    without Python lists of every sentence (benchmarks/speed/index_memory.py).
    """
    rng = np.random.default_rng([seed, 7919])
    lengths = corpus.sentence_lengths  # int64 (S,)
    offsets = np.asarray(corpus.doc_offsets, dtype=np.int64)  # (D+1,)

    def draw() -> int:  # the same draws, in the same order, as one per sentence loop made
        return max_tokens if rng.random() >= short_seq_prob else int(rng.integers(2, max_tokens + 1))

    out = array("q")  # flat (doc, first, end) triples; 8 B per number, grown in place
    for doc in range(len(offsets) - 1):
        start, end = int(offsets[doc]), int(offsets[doc + 1])
        target = draw()
        if start == end:
            continue
        cum = list(accumulate(lengths[start:end].tolist()))  # tokens of sentences start..start+k
        first, before = start, 0  # tokens of the document before sentence `first`
        while first < end:
            # the first sentence s >= first whose running total reaches the target, else the last
            s = min(bisect_left(cum, before + target) + start, end - 1)
            out.extend((doc, first, s + 1))
            before, first = cum[s - start], s + 1
            target = draw()
    if not out:
        raise EmberError("the prepared corpus has no sentences to build training examples from")
    return np.frombuffer(out, dtype=np.int64).reshape(-1, 3)


class SegmentPairDataset:
    """Index -> ``SegmentPair``, drawn fresh per (epoch, index)."""

    def __init__(self, corpus, max_seq_length: int, pair_mode: str = "nsp",
                 short_seq_prob: float = 0.1, seed: int = 0) -> None:
        if pair_mode not in PAIR_MODES:
            raise EmberError(f"pair mode {pair_mode!r} is not one of {PAIR_MODES}")
        self.corpus = corpus
        self.pair_mode = pair_mode
        # [CLS] A [SEP] B [SEP] takes 3 special tokens; a single segment takes 2.
        self.max_tokens = max_seq_length - (3 if pair_mode != "none" else 2)
        self.seed = seed
        self.chunks = build_chunks(corpus, self.max_tokens, short_seq_prob, seed)

    def __len__(self) -> int:
        return len(self.chunks)

    def _tokens(self, first: int, end: int) -> np.ndarray:
        return self.corpus.sentences(first, end).astype(np.int64)  # one contiguous memmap slice

    def _joins(self, first: int, end: int) -> np.ndarray | None:
        """Phrase flags of sentences [first, end), aligned with ``_tokens``; None if absent."""
        joins = self.corpus.joins(first, end) if getattr(self.corpus, "has_joins", False) else None
        return None if joins is None else joins.astype(bool)

    def example(self, index: int, epoch: int = 0) -> SegmentPair:
        rng = np.random.default_rng([self.seed, epoch, index])
        doc, first, end = (int(v) for v in self.chunks[index])
        n = end - first
        if self.pair_mode == "none":
            return SegmentPair(self._tokens(first, end)[: self.max_tokens], None, 0, (index, epoch),
                               _cut(self._joins(first, end), 0, self.max_tokens))
        a_end = first + (int(rng.integers(1, n)) if n >= 2 else 1)
        tokens_a, joins_a = self._tokens(first, a_end), self._joins(first, a_end)
        if self.pair_mode == "sop":
            # ALBERT (Lan et al. 2020, §3.2): both segments from the same document; negatives
            # swap their order. A one-sentence chunk is split in the middle of its tokens.
            if n >= 2:
                tokens_b, joins_b = self._tokens(a_end, end), self._joins(a_end, end)
            else:
                cut = max(1, len(tokens_a) // 2)
                tokens_a, tokens_b = tokens_a[:cut], tokens_a[cut:]
                joins_a, joins_b = _cut(joins_a, 0, cut), _cut(joins_a, cut, None)
            label = int(rng.random() < 0.5)
            if label:
                tokens_a, tokens_b = tokens_b, tokens_a
                joins_a, joins_b = joins_b, joins_a
        else:
            label = int(n == 1 or rng.random() < 0.5)
            if label:
                tokens_b, joins_b = self._random_segment(rng, doc, self.max_tokens - len(tokens_a))
            else:
                tokens_b, joins_b = self._tokens(a_end, end), self._joins(a_end, end)
        a_lo, a_hi, b_lo, b_hi = trim_bounds(len(tokens_a), len(tokens_b), self.max_tokens, rng)
        return SegmentPair(tokens_a[a_lo:a_hi], tokens_b[b_lo:b_hi], label, (index, epoch),
                           _cut(joins_a, a_lo, a_hi), _cut(joins_b, b_lo, b_hi))

    def _random_segment(self, rng: np.random.Generator, avoid_doc: int,
                        target: int) -> tuple[np.ndarray, np.ndarray | None]:
        offsets = self.corpus.doc_offsets
        num_docs = len(offsets) - 1
        doc = avoid_doc
        for _ in range(10):  # BERT retries to find a different document
            doc = int(rng.integers(num_docs))
            if doc != avoid_doc or num_docs == 1:
                break
        start, end = int(offsets[doc]), int(offsets[doc + 1])
        s = first = int(rng.integers(start, end))
        total = 0
        while s < end and total < max(target, 1):
            total += len(self.corpus.sentence(s))
            s += 1
        return self._tokens(first, s), self._joins(first, s)


def _cut(joins: np.ndarray | None, lo: int, hi: int | None) -> np.ndarray | None:
    return None if joins is None else joins[lo:hi]


def truncate_pair(a: np.ndarray, b: np.ndarray, max_tokens: int, rng: np.random.Generator):
    """Trim the longer segment until len(a) + len(b) <= max_tokens, at a random end each time."""
    a_lo, a_hi, b_lo, b_hi = trim_bounds(len(a), len(b), max_tokens, rng)
    return a[a_lo:a_hi], b[b_lo:b_hi]


def trim_bounds(len_a: int, len_b: int, max_tokens: int,
                rng: np.random.Generator) -> tuple[int, int, int, int]:
    """The (a_lo, a_hi, b_lo, b_hi) kept by ``truncate_pair``, so aligned arrays (phrase
    flags) can be cut the same way."""
    a_lo, a_hi, b_lo, b_hi = 0, len_a, 0, len_b
    while (a_hi - a_lo) + (b_hi - b_lo) > max_tokens:
        if (a_hi - a_lo) > (b_hi - b_lo):
            if rng.random() < 0.5:
                a_lo += 1
            else:
                a_hi -= 1
        else:
            if rng.random() < 0.5:
                b_lo += 1
            else:
                b_hi -= 1
    return a_lo, a_hi, b_lo, b_hi
