"""Blocks of whole sentences of one document, with their sentence boundaries: the data of BART's
pre-training (Lewis et al. 2020; fairseq's ``complete_doc`` token blocks, which never cross a
document) and of MASS (Song et al. 2019).

Each document's sentences are packed greedily into blocks of at most ``block_size`` tokens; a
sentence longer than that is cut into ``block_size`` pieces, each a sentence of its own. The
boundaries travel with the tokens (``SentenceBlock.sentence_ends``) because sentence
permutation shuffles exactly those units: ember's corpora store them (`ember prepare` splits
sentences), where fairseq had to look for full stops.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ember.errors import EmberError


@dataclass(frozen=True)
class SentenceBlock:
    tokens: np.ndarray  # int64 (L,)
    sentence_ends: np.ndarray  # int64 (S,): offset after each sentence, increasing, the last = L


class SentenceBlockDataset:
    """Index -> ``SentenceBlock``. ``corpus`` is a ``TokenCorpus`` (sentence_lengths, doc_offsets,
    doc_tokens)."""

    pair_mode = "none"

    def __init__(self, corpus, block_size: int) -> None:
        if block_size < 1:
            raise EmberError(f"block size {block_size} must be at least 1 token")
        self.corpus, self.block_size = corpus, block_size
        lengths = np.asarray(corpus.sentence_lengths, dtype=np.int64)  # (S,)
        offsets = np.asarray(corpus.doc_offsets, dtype=np.int64)  # (D+1,)
        docs, starts, stops, counts = [], [], [], []
        for d in range(len(offsets) - 1):
            pos, start, n = 0, 0, 0  # token offset in the document, the open block's start, its sentences
            for length in lengths[offsets[d]:offsets[d + 1]].tolist():
                if n and pos + length - start > block_size:  # the sentence does not fit: close the block
                    docs.append(d), starts.append(start), stops.append(pos), counts.append(n)
                    start, n = pos, 0
                while pos + length - start > block_size:  # a sentence longer than a block: whole pieces
                    docs.append(d), starts.append(start), stops.append(start + block_size), counts.append(1)
                    length -= start + block_size - pos
                    pos = start = start + block_size
                pos, n = pos + length, n + 1
            if n:
                docs.append(d), starts.append(start), stops.append(pos), counts.append(n)
        if not docs:
            raise EmberError(f"{corpus!r} has no tokens to cut into blocks")
        self._doc, self._start, self._stop = np.array(docs), np.array(starts), np.array(stops)
        self.max_sentences = int(max(counts))  # 1: no block has a sentence boundary inside it
        self._ends = {}  # document -> its sentence ends (int64), for the blocks' boundaries

    def __len__(self) -> int:
        return len(self._doc)

    def _doc_ends(self, d: int) -> np.ndarray:
        if d not in self._ends:
            offsets, lengths = self.corpus.doc_offsets, self.corpus.sentence_lengths
            self._ends = {d: np.cumsum(np.asarray(lengths[offsets[d]:offsets[d + 1]], dtype=np.int64))}
        return self._ends[d]

    def example(self, index: int, epoch: int = 0) -> SentenceBlock:
        if not 0 <= index < len(self):
            raise IndexError(f"block {index} out of range [0, {len(self)})")
        d, start, stop = int(self._doc[index]), int(self._start[index]), int(self._stop[index])
        tokens = np.asarray(self.corpus.doc_tokens(d)[start:stop], dtype=np.int64)
        ends = self._doc_ends(d)
        inside = ends[(ends > start) & (ends < stop)] - start  # boundaries strictly inside the block
        return SentenceBlock(tokens, np.append(inside, stop - start))
