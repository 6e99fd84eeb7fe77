"""RoBERTa input packing: FULL-SENTENCES and DOC-SENTENCES (Liu et al. 2019, §4.2).

RoBERTa drops NSP and fills every sequence with contiguous *full* sentences up to the
length budget:

- FULL-SENTENCES: sentences are taken in corpus order and may cross document boundaries;
  when one document ends and the next begins inside a sequence, an extra separator token
  (the tokenizer's [SEP] / ``</s>``) goes between them.
- DOC-SENTENCES: the same, but a sequence never crosses a document, so sequences near the
  end of a document may be shorter. RoBERTa then grows the batch dynamically to keep the
  token count per batch close to FULL-SENTENCES. We keep the batch size fixed: steps are
  keyed by (seed, step, micro-batch) for exact resume and DDP shards split a fixed number
  of sequences, and the paper found the two formats within a few tenths of a point of each
  other (Table 2). Budget sequences with ``train.batch_size`` accordingly
  (``PackedSentenceDataset.mean_length`` tells how full the sequences are).

A sentence longer than the budget is cut into budget-sized pieces (the last one shorter);
each piece is packed like a sentence, so no token is ever dropped: one epoch visits every
token of the corpus exactly once. The budget is ``max_seq_length - 2``: the objective's
``pack_pairs`` adds the outer [CLS]/<s> ... [SEP]/</s> around ``tokens_a``.

Packing is greedy and deterministic, a pure function of the corpus and the budget (no
seed), so every rank and every resumed run sees the same sequences; only their order
(the Trainer's per-epoch permutation) and their masks change between epochs. The index is
built in one vectorized pass over sentence lengths (numpy cumsum + searchsorted; ~2M
sentences take well under a second) and an example is a handful of memmap slices.
"""

from __future__ import annotations

from array import array

import numpy as np

from ember.data.pairs import SegmentPair
from ember.errors import EmberError

PACKINGS = ("segments", "full_sentences", "doc_sentences")


def split_long_sentences(lengths: np.ndarray, budget: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut sentences into units of at most ``budget`` tokens.

    lengths: int64 (S,) tokens per sentence, all > 0.
    Returns (unit_sentence, unit_offset, unit_length), each (U,) with U >= S: the global
    sentence of each unit, where the unit starts inside that sentence and its length.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    pieces = np.maximum(1, -(-lengths // budget))  # (S,) ceil(L / budget)
    unit_sentence = np.repeat(np.arange(len(lengths), dtype=np.int64), pieces)  # (U,)
    first_unit = np.cumsum(pieces) - pieces  # (S,) index of each sentence's first unit
    piece = np.arange(len(unit_sentence), dtype=np.int64) - np.repeat(first_unit, pieces)  # (U,)
    unit_offset = piece * budget
    unit_length = np.minimum(budget, lengths[unit_sentence] - unit_offset)
    return unit_sentence, unit_offset, unit_length


def pack_units(unit_length: np.ndarray, unit_doc: np.ndarray, budget: int,
               cross_documents: bool) -> np.ndarray:
    """Greedy packing of consecutive units into sequences of at most ``budget`` tokens.

    unit_length: int64 (U,), each in [1, budget]; unit_doc: int64 (U,), non-decreasing.
    Returns int64 (N+1,) boundaries: sequence i holds units [bounds[i], bounds[i+1]).
    With ``cross_documents`` a document change inside a sequence costs one separator token.
    """
    n = len(unit_length)
    if n == 0:
        return np.zeros(1, dtype=np.int64)
    end = _sequence_ends(np.asarray(unit_length, dtype=np.int64), unit_doc, budget, cross_documents)
    bounds = array("q", [0])
    _chase(end, 0, 0, n, bounds)
    return np.frombuffer(bounds, dtype=np.int64)


def _sequence_ends(unit_length: np.ndarray, unit_doc: np.ndarray, budget: int, cross_documents: bool) -> np.ndarray:
    """int64 (U,): one past the last unit of the greedy sequence that starts at each unit."""
    n = len(unit_length)
    new_doc = np.ones(n, dtype=bool)  # (U,) unit starts a document
    new_doc[1:] = unit_doc[1:] != unit_doc[:-1]
    # separator owed before a unit that starts a document (full sentences), but only when it
    # follows another unit of the same sequence: a sequence starting at s does not pay sep[s].
    sep = (new_doc & cross_documents).astype(np.int64)
    cum = np.zeros(n + 1, dtype=np.int64)  # (U+1,) cum[k] = cost of units [0, k)
    np.cumsum(unit_length + sep, out=cum[1:])
    # A sequence starting at s takes units [s, e) for the largest e with
    # cum[e] - cum[s] - sep[s] <= budget; one searchsorted finds e for every s at once.
    end = np.searchsorted(cum, cum[:-1] + sep + budget, side="right") - 1  # (U,)
    if not cross_documents:
        doc_first = np.flatnonzero(new_doc)  # (D,) first unit of each document
        doc_end = np.append(doc_first[1:], n)  # (D,) one past its last unit
        end = np.minimum(end, doc_end[np.cumsum(new_doc) - 1])
    return end


def _chase(end: np.ndarray, offset: int, s: int, stop: int, bounds: array) -> int:
    """Follow start -> end pointers from unit ``s`` while it is below ``stop`` (units are
    global, ``end`` covers units from ``offset``), appending each sequence's end to
    ``bounds``: a loop over sequences, not tokens or sentences. Returns the next start."""
    while s < stop:
        s = offset + int(end[s - offset])
        bounds.append(s)
    return s


class PackedSentenceDataset:
    """Index -> ``SegmentPair(tokens_a, None, 0, (index, epoch))`` of packed full sentences.

    ``corpus`` is a TokenCorpus (or anything with ``sentence_lengths``, ``doc_offsets`` and
    ``sentences(start, stop)``). ``sep_id`` is only used when ``cross_documents`` is true.
    """

    pair_mode = "none"

    def __init__(self, corpus, max_seq_length: int, cross_documents: bool, sep_id: int | None = None):
        if max_seq_length < 3:
            raise EmberError(f"data.max_seq_length={max_seq_length} leaves no room for tokens "
                             "between the two special tokens; use at least 3")
        if cross_documents and sep_id is None:
            raise EmberError("FULL-SENTENCES packing needs the tokenizer's separator id")
        self.corpus = corpus
        self.max_tokens = max_seq_length - 2  # <s> ... </s> are added by the objective
        self.cross_documents = cross_documents
        self.sep_id = sep_id
        self._lengths = np.asarray(corpus.sentence_lengths, dtype=np.int64)  # (S,)
        self._doc_offsets = np.asarray(corpus.doc_offsets, dtype=np.int64)  # (D+1,)
        self._units = UnitMap(self._lengths, self.max_tokens)
        self.bounds = self._pack()  # (N+1,)
        if len(self.bounds) < 2:
            raise EmberError("the prepared corpus has no sentences to build training examples from")
        seps = 0
        if cross_documents:  # documents started strictly inside a sequence
            d = self._doc_offsets
            starts = self._units.first_unit(d[:-1][d[:-1] < d[1:]])  # first unit of each non-empty doc
            seps = int(np.count_nonzero(~np.isin(starts[starts > 0], self.bounds)))
        self.num_tokens = int(self._lengths.sum()) + seps  # total len(tokens_a) over an epoch

    def _pack(self, block: int = 1 << 20) -> np.ndarray:
        """``pack_units`` over the whole corpus, ``block`` sentences at a time, so the per-unit
        temporaries (lengths, documents, costs, end pointers) never exist for all units at once.
        A sequence spans at most ``max_tokens`` units, so each block looks that many sentences
        ahead and the greedy chain continues exactly where the previous block left it."""
        n_sent, budget = len(self._lengths), self.max_tokens
        bounds, s = array("q", [0]), 0
        for a in range(0, n_sent, block):
            b, ahead = min(a + block, n_sent), min(a + block + budget, n_sent)
            sent, _, length = split_long_sentences(self._lengths[a:ahead], budget)  # local sentences
            doc = np.searchsorted(self._doc_offsets, sent + a, side="right") - 1
            end = _sequence_ends(length, doc, budget, self.cross_documents)
            offset, stop = (int(u) for u in self._units.first_unit(np.array([a, b])))  # global ids
            s = _chase(end, offset, s, stop, bounds)
        return np.frombuffer(bounds, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.bounds) - 1

    @property
    def mean_length(self) -> float:
        """Mean len(tokens_a): how full the sequences are (DOC-SENTENCES < FULL-SENTENCES)."""
        return self.num_tokens / len(self)

    def documents(self, index: int) -> np.ndarray:
        """Ids of the documents sequence ``index`` draws from, in order (int64 (k,))."""
        sent, _, _ = self._units.lookup(int(self.bounds[index]), int(self.bounds[index + 1]))
        return np.unique(np.searchsorted(self._doc_offsets, sent, side="right") - 1)

    def _unit_slice(self, sent, offset, length, fetch) -> np.ndarray:
        """Units of one document (their sentences, offsets, lengths) from ``fetch(start, stop)``
        (corpus.sentences or corpus.joins, both laid out like the tokens): one memmap slice."""
        first, last = int(sent[0]), int(sent[-1])
        span = fetch(first, last + 1)  # whole sentences first..last
        cut_tail = int(self._lengths[last]) - int(offset[-1]) - int(length[-1])
        return span[int(offset[0]) : len(span) - cut_tail]

    def example(self, index: int, epoch: int = 0) -> SegmentPair:
        if not 0 <= index < len(self):
            raise IndexError(f"sequence {index} out of range [0, {len(self)})")
        sent, offset, length = self._units.lookup(int(self.bounds[index]), int(self.bounds[index + 1]))
        docs = np.searchsorted(self._doc_offsets, sent, side="right") - 1  # (k,)
        cuts = (1 + np.flatnonzero(docs[1:] != docs[:-1])).tolist()  # first unit of each new doc
        # Phrase/entity flags (ERNIE masking) travel with the tokens when the corpus has them;
        # a separator never joins a phrase.
        with_joins = getattr(self.corpus, "has_joins", False)
        tokens: list[np.ndarray] = []
        joins: list[np.ndarray] = []
        for a, b in zip([0, *cuts], [*cuts, len(sent)]):
            if tokens:  # only FULL-SENTENCES sequences reach a second document
                tokens.append(np.array([self.sep_id], dtype=np.int64))
                joins.append(np.zeros(1, dtype=bool))
            units = sent[a:b], offset[a:b], length[a:b]
            tokens.append(self._unit_slice(*units, self.corpus.sentences).astype(np.int64))
            if with_joins:
                joins.append(self._unit_slice(*units, self.corpus.joins).astype(bool))
        extra = {"joins_a": np.concatenate(joins)} if with_joins else {}
        return SegmentPair(np.concatenate(tokens), None, 0, (index, epoch), **extra)


class UnitMap:
    """Packing units (sentences cut to ``budget`` tokens) without a per-unit array.

    Unit ids run over the corpus in order; a sentence of L tokens owns ceil(L / budget) of
    them. Most sentences fit the budget and own one, so only the few longer ones are stored
    (their ids, first unit and piece count: (K,) each); any unit's sentence, offset and
    length follow from those with one searchsorted. This is what keeps the index of a
    10^8-sentence corpus at the corpus's own sentence lengths plus the sequence bounds.
    """

    def __init__(self, lengths: np.ndarray, budget: int) -> None:
        self.lengths, self.budget = lengths, budget
        self.long = np.flatnonzero(lengths > budget)  # (K,) sentences cut into pieces
        pieces = -(-lengths[self.long] // budget)  # (K,)
        self.extra = np.concatenate([[0], np.cumsum(pieces - 1)])  # (K+1,) extra units before long[k], ...
        self.long_first = self.long + self.extra[:-1]  # (K,) first unit of each long sentence
        self.pieces = pieces
        self.count = len(lengths) + int(self.extra[-1])  # U

    def first_unit(self, sentences: np.ndarray) -> np.ndarray:
        """Global id of each sentence's first unit (a sentence id == len(lengths): U)."""
        return sentences + self.extra[np.searchsorted(self.long, sentences, side="left")]

    def lookup(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(sentence, offset in it, length) of units [a, b), each int64 (b-a,)."""
        u = np.arange(a, b, dtype=np.int64)
        if not len(self.long):
            sent, offset = u, np.zeros_like(u)
        else:
            k = np.searchsorted(self.long_first, u, side="right") - 1  # last long sentence starting <= u
            kk = np.maximum(k, 0)
            inside = (k >= 0) & (u < self.long_first[kk] + self.pieces[kk])
            # outside a long sentence, u is its sentence id plus the extra units of the long ones before
            sent = np.where(inside, self.long[kk], u - np.where(k >= 0, self.extra[kk + 1], 0))
            offset = np.where(inside, (u - self.long_first[kk]) * self.budget, 0)
        return sent, offset, np.minimum(self.budget, self.lengths[sent] - offset)


def build_pretraining_dataset(corpus, data_cfg, pair_mode: str, seed: int, sep_id: int):
    """The pre-training dataset ``data_cfg.packing`` asks for.

    "segments" is BERT's chunk sampler (ember.data.pairs), split into A/B for NSP/SOP;
    the packed RoBERTa formats produce single sequences and so need an objective without
    a sentence-pair task (``pair_mode == "none"``).
    """
    from ember.data.pairs import SegmentPairDataset

    packing = data_cfg.packing
    if packing not in PACKINGS:
        raise EmberError(f"data.packing={packing!r}; choose one of {', '.join(PACKINGS)}")
    if packing == "segments":
        return SegmentPairDataset(corpus, data_cfg.max_seq_length, pair_mode, data_cfg.short_seq_prob, seed)
    if pair_mode != "none":
        raise EmberError(
            f"data.packing={packing} builds single sequences of full sentences, but the objective "
            f"trains a sentence-pair task ({pair_mode.upper()}); use objective mlm, spanbert or "
            "electra (RoBERTa drops NSP), or data.packing=segments"
        )
    return PackedSentenceDataset(corpus, data_cfg.max_seq_length,
                                 cross_documents=packing == "full_sentences", sep_id=sep_id)
