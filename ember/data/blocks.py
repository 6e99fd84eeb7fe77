"""Fixed-length token blocks for causal-LM pre-training (GPT-2, Radford et al. 2019).

The split is read as one stream, every document followed by the end-of-text token
(``doc0 <|endoftext|> doc1 <|endoftext|> ...``), and cut into consecutive blocks of
``block_size`` tokens; the last partial block is dropped. No padding, no token lost between
blocks, and the model learns from the separator where a document ends and a new one starts.
With ``eot_id=None`` documents are joined with nothing between them, as T5's span corruption
packs its pre-training text (``reduce_concat_tokens`` then ``split_tokens``, Raffel et al. 2020).

``DocumentSegmentDataset`` instead cuts each document on its own into segments of at most
``segment_length`` tokens (the last one of a document shorter), never crossing documents: T5's
``split_tokens`` without concatenation, which its prefix-LM objective uses.

The index is only the stream offset of each document (one cumsum over sentence lengths);
a block is a few memmap slices, so memory stays flat however large the corpus. The stream
itself (``TokenStream``) also serves XLNet's segment pairs with memory (ember.data.memory_pairs).
"""

from __future__ import annotations

import numpy as np

from ember.errors import EmberError


class TokenStream:
    """One split read as ``doc0 <eot> doc1 <eot> ...`` (``eot_id=None``: ``doc0 doc1 ...``, T5's
    concatenation): ``slice(start, stop)`` gives int64 token ids of any stream range. ``corpus``
    is a ``TokenCorpus``."""

    def __init__(self, corpus, eot_id: int | None):
        self.corpus, self.eot_id = corpus, eot_id
        self._sent_lengths = np.asarray(corpus.sentence_lengths, dtype=np.int64)  # (S,)
        self._doc_offsets = np.asarray(corpus.doc_offsets, dtype=np.int64)  # (D+1,) in sentences
        sent_ends = np.cumsum(self._sent_lengths)  # (S,)
        doc_ends = np.concatenate([[0], sent_ends])[self._doc_offsets]  # (D+1,)
        doc_lengths = np.diff(doc_ends) + (eot_id is not None)  # (D,) tokens (+ the end-of-text token)
        self._doc_starts = np.concatenate([[0], np.cumsum(doc_lengths)])  # (D+1,) stream offsets
        self.num_tokens = int(self._doc_starts[-1])

    def sentence_boundaries(self) -> np.ndarray:
        """int64 (S,) sorted stream offsets just after each sentence; after a document's last
        sentence that is after its end-of-text token (where the next document starts)."""
        ends = np.cumsum(self._sent_lengths)  # (S,) without the end-of-text tokens
        sentences_per_doc = np.diff(self._doc_offsets)  # (D,)
        if self.eot_id is None:
            return ends
        ends = ends + np.repeat(np.arange(len(sentences_per_doc)), sentences_per_doc)  # earlier eots
        last = self._doc_offsets[1:][sentences_per_doc > 0] - 1  # last sentence of each document
        ends[last] += 1
        return ends

    def slice(self, start: int, stop: int) -> np.ndarray:
        """int64 (stop - start,) tokens of stream positions [start, stop)."""
        if not 0 <= start <= stop <= self.num_tokens:
            raise IndexError(f"stream range [{start}, {stop}) outside [0, {self.num_tokens}]")
        d = int(np.searchsorted(self._doc_starts, start, side="right")) - 1  # doc holding `start`
        parts, pos = [np.zeros(0, dtype=np.int64)], start
        while pos < stop:
            doc_start, doc_stop = int(self._doc_starts[d]), int(self._doc_starts[d + 1])
            doc = np.asarray(self.corpus.doc_tokens(d), dtype=np.int64)
            if self.eot_id is not None:
                doc = np.append(doc, self.eot_id)
            parts.append(doc[pos - doc_start : min(stop, doc_stop) - doc_start])
            pos, d = min(stop, doc_stop), d + 1
        return np.concatenate(parts)


class TokenBlockDataset:
    """Index -> int64 (block_size,) token ids. ``corpus`` is a ``TokenCorpus``."""

    pair_mode = "none"

    def __init__(self, corpus, block_size: int, eot_id: int | None):
        if block_size < 2:
            raise EmberError(f"data.max_seq_length={block_size}: a causal-LM block needs at least 2 tokens")
        self.corpus, self.block_size, self.eot_id = corpus, block_size, eot_id
        self.stream = TokenStream(corpus, eot_id)
        self.num_tokens = self.stream.num_tokens
        if self.num_tokens < block_size:
            raise EmberError(f"{corpus!r} has {self.num_tokens} tokens (with any end-of-text tokens), "
                             f"fewer than one block of {block_size}; use more documents or a "
                             "smaller data.max_seq_length")

    def __len__(self) -> int:
        return self.num_tokens // self.block_size

    def example(self, index: int, epoch: int = 0) -> np.ndarray:
        if not 0 <= index < len(self):
            raise IndexError(f"block {index} out of range [0, {len(self)})")
        return self.stream.slice(index * self.block_size, (index + 1) * self.block_size)


class DocumentSegmentDataset:
    """Index -> int64 (<= segment_length,) ids: consecutive pieces of one document each."""

    pair_mode = "none"

    def __init__(self, corpus, segment_length: int):
        if segment_length < 1:
            raise EmberError(f"segment length {segment_length} must be at least 1 token")
        self.corpus, self.segment_length = corpus, segment_length
        sent_ends = np.cumsum(np.asarray(corpus.sentence_lengths, dtype=np.int64))  # (S,)
        doc_ends = np.concatenate([[0], sent_ends])[np.asarray(corpus.doc_offsets, dtype=np.int64)]  # (D+1,)
        pieces = -(-np.diff(doc_ends) // segment_length)  # (D,) ceil(doc length / segment length)
        self._doc = np.repeat(np.arange(len(pieces)), pieces)  # (N,) document of each segment
        first = np.concatenate([[0], np.cumsum(pieces)])[:-1]  # (D,) index of a doc's first segment
        self._start = (np.arange(len(self._doc)) - first[self._doc]) * segment_length  # (N,) token offset
        if len(self._doc) == 0:
            raise EmberError(f"{corpus!r} has no tokens to cut into segments")

    def __len__(self) -> int:
        return len(self._doc)

    def example(self, index: int, epoch: int = 0) -> np.ndarray:
        if not 0 <= index < len(self):
            raise IndexError(f"segment {index} out of range [0, {len(self)})")
        start = int(self._start[index])
        doc = self.corpus.doc_tokens(int(self._doc[index]))
        return np.asarray(doc[start : start + self.segment_length], dtype=np.int64)
