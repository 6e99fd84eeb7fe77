"""Unit-based masking shared by every MLM-style objective (``data.masking``).

A *unit* is a maximal group of tokens that is masked together. The scheme decides the units:

- ``token`` (BERT, Devlin et al. 2019 §3.1): every token is its own unit. Runs
  ``ember.objectives.mlm.mask_tokens`` unchanged.
- ``whole_word`` (BERT's whole-word-masking release): a word is a word-start token plus the
  continuation pieces after it - WordPiece ``##x`` pieces, byte-level BPE pieces not starting
  with ``Ġ``, Unigram/Metaspace pieces not starting with ``▁``. The per-vocabulary table
  ``word_continuation_table(tokenizer)`` holds that flag; special tokens never continue.
  With byte-level BPE, punctuation written without a space before it (``word,``) belongs to
  the word before it, since only a leading space marks a word start there.
- ``phrase`` (ERNIE, Sun et al. 2019 §3.2, phrase- and entity-level masking): spans found at
  ``ember prepare --phrases spans|detect`` time are stored per token as a "joins the previous
  token's unit" flag (``SegmentPair.joins_a/b``); a unit is a phrase/entity where flagged and
  a whole word elsewhere. Examples without flags are an error (see ``Masker.__call__``).
- ``span`` (SpanBERT, Joshi et al. 2020 §3.1): units are sampled spans of whole words, see
  ``select_spans``.

Budget: per sequence, round(mask_prob x maskable tokens), at least 1, at most
``max_predictions`` (``mlm.prediction_budget``), as for token masking. Never exceeded:

- whole_word / phrase follow BERT's ``create_pretraining_data.py``: units are visited in a
  random order; a unit that would overflow the budget is skipped (the next, shorter ones may
  still fit) and selection stops once the budget is reached. A sequence can therefore end
  slightly under budget, never over.
- span follows SpanBERT's sampler, which stops adding tokens when the budget is spent: the
  last span is cut to the whole words that still fit.

80/10/10 (80% [MASK], 10% a random token, 10% unchanged): for ``span`` and ``phrase`` one
draw per unit, so all its tokens are masked, replaced (each by its own random token) or kept
together (SpanBERT §3.1: "we perform this replacement at the span level"); for ``token`` and
``whole_word`` one draw per token, as BERT's code does (also with whole-word masking).

Random-number use per sequence, in order (so seeded results are reproducible by hand):
(1) unit selection - ``rng.permutation(k)`` over the k units (whole_word/phrase), or the span
loop of ``select_spans``; (2) replacement draws ``rng.random(n)`` for the n chosen units
(per unit) or chosen tokens (per token), in position order; (3) ``rng.integers(0, V, m)`` for
the m tokens that get a random replacement, in position order. Sequences of a batch draw in
row order from the batch RNG; token masking draws for the whole batch at once.

Static masks (RoBERTa, Liu et al. 2019 §4.1, ``data.static_masks: N``): the original BERT
data pipeline masked each sequence once at preparation time; RoBERTa's static baseline
duplicated the data N = 10 times so each sequence is seen with 10 different masks over 40
epochs. Here the mask RNG of one sequence is keyed by (seed, example index, epoch mod N)
from ``SegmentPair.mask_key``, instead of the batch's (seed, step, micro-batch). That is
exactly "N copies of every sequence masked once each at preparation time, copy e mod N used
in epoch e" - without writing N copies to disk, and independent of batch order and layout.
With ``pair_mode: none`` (RoBERTa, SpanBERT) a sequence's tokens are fixed per index, so its
masks repeat exactly every N epochs. With NSP/SOP segment pairs the A/B split is drawn anew
each epoch (``ember.data.pairs``), so the draw repeats but lands on a different pair.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ember.errors import EmberError
from ember.objectives.mlm import mask_tokens, prediction_budget
from ember.tokenizers import role_id

SCHEMES = ("token", "whole_word", "phrase", "span")
# One replacement draw per unit (True) or per token (False); see the module docstring.
_PER_UNIT = {"token": False, "whole_word": False, "phrase": True, "span": True}
_STATIC_TAG = 0x57A71C  # keeps the static-mask RNG stream apart from other seeded streams
# Word-start markers of the subword kinds ember trains (ember.tokenizers.train).
_WORD_START_MARKERS = {"bpe": "\u0120", "unigram": "\u2581"}  # "Ġ", "▁"


def word_continuation_table(tokenizer) -> np.ndarray:
    """bool (V,): True for vocabulary entries that continue the word before them.

    WordPiece: pieces with the model's continuing prefix (``##``). Byte-level BPE: pieces not
    starting with ``Ġ`` (the encoded space). Unigram (Metaspace): pieces not starting with
    ``▁``. Added/special tokens never continue a word.
    """
    from ember.tokenizers import tokenizer_kind

    kind = tokenizer_kind(tokenizer)
    vocab = tokenizer.get_vocab(with_added_tokens=True)  # token -> id
    table = np.zeros(max(vocab.values()) + 1, dtype=bool)
    tokens = np.array(list(vocab), dtype=object)
    ids = np.fromiter(vocab.values(), dtype=np.int64, count=len(vocab))
    if kind == "wordpiece":
        prefix = getattr(tokenizer.model, "continuing_subword_prefix", None) or "##"
        table[ids] = [t.startswith(prefix) for t in tokens]
    else:
        marker = _WORD_START_MARKERS[kind]
        starts = np.array([t.startswith(marker) for t in tokens])
        if not starts.any():
            raise EmberError(
                f"this {kind} tokenizer has no tokens starting with {marker!r}, so word starts "
                "cannot be told apart; use data.masking=token, or a tokenizer trained by "
                "`ember tokenizer train`"
            )
        table[ids] = ~starts
    table[list(tokenizer.get_added_tokens_decoder())] = False
    return table


def span_length_probs(p: float, max_span: int) -> np.ndarray:
    """float64 (max_span,): P(length = 1..max_span) of Geometric(p) truncated at max_span
    and renormalised (SpanBERT §3.1; p = 0.2, max 10 gives a mean of 3.8 words)."""
    lengths = np.arange(1, max_span + 1)
    weights = p * (1.0 - p) ** (lengths - 1)
    return weights / weights.sum()


def unit_starts(input_ids: np.ndarray, maskable: np.ndarray, scheme: str,
                continues_word: np.ndarray | None = None,
                joins: np.ndarray | None = None) -> np.ndarray:
    """bool (B, T): True at the maskable positions that start a unit of ``scheme``.

    A unit never crosses a non-maskable position ([CLS], [SEP], padding): the first maskable
    token after one starts a unit even if it is a continuation piece (a segment cut inside a
    word). For ``span`` these are the word starts that spans are built from.
    """
    glue = np.zeros(input_ids.shape, dtype=bool)  # (B, T) token belongs to its left neighbour's unit
    if scheme != "token":
        if continues_word is None:
            raise EmberError(f"data.masking={scheme} needs the tokenizer's word-continuation table")
        glue |= continues_word[input_ids]
    if scheme == "phrase" and joins is not None:
        glue |= joins.astype(bool)
    left_maskable = np.zeros_like(maskable)
    left_maskable[:, 1:] = maskable[:, :-1]
    return maskable & ~(glue & left_maskable)


def units_of_row(starts: np.ndarray, maskable: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Units of one sequence: (start, end) int64 (k,) token positions, end exclusive.

    starts, maskable: bool (T,) from ``unit_starts``. A unit runs from its start over the
    following maskable positions up to the next start or non-maskable position.
    """
    positions = np.flatnonzero(maskable)  # (n,)
    if len(positions) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    first = starts[positions]  # (n,) every run start is a unit start (see unit_starts)
    first[0] = True
    unit_first = np.flatnonzero(first)  # (k,) index into positions
    unit_last = np.append(unit_first[1:], len(positions)) - 1
    return positions[unit_first].astype(np.int64), positions[unit_last].astype(np.int64) + 1


def select_units(start: np.ndarray, end: np.ndarray, budget: int,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """BERT's whole-word selection: visit units in a random order, skip one that would
    overflow the budget, stop when the budget is reached. Returns the chosen (start, end),
    sorted by position."""
    length = (end - start).tolist()
    chosen, taken = [], 0
    for u in rng.permutation(len(start)).tolist():
        if taken >= budget:
            break
        if taken + length[u] > budget:
            continue
        chosen.append(u)
        taken += length[u]
    chosen.sort()
    return start[chosen], end[chosen]


def _free_stretch(free: np.ndarray, joined: np.ndarray) -> np.ndarray:
    """int64 (W,): how many consecutive free words start at each word (0 if it is taken).

    joined[w]: word w+1 directly follows word w inside one maskable run.
    """
    n = len(free)
    nxt_free = np.append(free[1:], False)
    stop = ~free | ~joined | ~nxt_free  # (W,) a free stretch ends at word w
    last = np.flatnonzero(stop)
    stretch_end = last[np.searchsorted(last, np.arange(n))]  # (W,) last word of w's stretch
    return np.where(free, stretch_end - np.arange(n) + 1, 0)


def select_spans(word_start: np.ndarray, word_end: np.ndarray, budget: int,
                 rng: np.random.Generator, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """SpanBERT span sampling (Joshi et al. 2020 §3.1) over the words of one sequence.

    Until ``budget`` tokens are masked: draw a length l in words from ``probs``
    (``span_length_probs``) by inverse CDF of one ``rng.random()``; choose the start word
    uniformly (``rng.integers``) among the free words whose next l words are free and in the
    same maskable run (spans never overlap, never cross [SEP]) and whose first word fits the
    remaining budget; take those l words, cutting the span at the last whole word that fits.
    If no stretch of l free words exists, l is first clipped to the longest one. Stops when no
    free word fits the remaining budget. Returns spans (start, end) int64, sorted.
    """
    cdf = np.cumsum(probs)
    length = word_end - word_start  # (W,) tokens per word
    joined = np.append(word_end[:-1] == word_start[1:], False)  # (W,)
    free = np.ones(len(word_start), dtype=bool)
    remaining = int(budget)
    spans = []
    while remaining > 0:
        fits = free & (length <= remaining)
        if not fits.any():
            break
        stretch = _free_stretch(free, joined)
        ell = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")) + 1
        ell = min(ell, len(probs), int(stretch[fits].max()))
        candidates = np.flatnonzero(fits & (stretch >= ell))
        w = int(candidates[rng.integers(len(candidates))])
        last, tokens = w, int(length[w])
        while last + 1 < w + ell and tokens + int(length[last + 1]) <= remaining:
            last += 1
            tokens += int(length[last])
        free[w : last + 1] = False
        remaining -= tokens
        spans.append((int(word_start[w]), int(word_end[last])))
    spans.sort()
    out = np.array(spans, dtype=np.int64).reshape(-1, 2)
    return out[:, 0], out[:, 1]


@dataclass
class MaskedBatch:
    """A corrupted batch. Positions are token indices into the (B, T) arrays."""

    input_ids: np.ndarray  # (B, T) int64 after corruption
    labels: np.ndarray  # (B, T) int64 original ids where predicted, -100 elsewhere
    unit_start: np.ndarray  # (B, T) int64 first position of a predicted token's unit, -1 elsewhere
    unit_end: np.ndarray  # (B, T) int64 one past its last position, -1 elsewhere


class Masker:
    """Corrupts packed batches according to one masking scheme (see the module docstring)."""

    def __init__(self, scheme: str, mask_id: int, vocab_size: int, mask_prob: float = 0.15,
                 max_predictions: int = 0, continues_word: np.ndarray | None = None,
                 span_p: float = 0.2, max_span: int = 10, static_masks: int = 0, seed: int = 0) -> None:
        if scheme not in SCHEMES:
            raise EmberError(f"data.masking={scheme!r}; choose one of {', '.join(SCHEMES)}")
        if not 0 < mask_prob < 1:
            raise EmberError(f"data.mask_prob={mask_prob} must be between 0 and 1")
        if scheme == "span" and not (0 < span_p <= 1 and max_span >= 1):
            raise EmberError(f"data.span_p={span_p} must be in (0, 1] and data.max_span={max_span} "
                             "at least 1 (SpanBERT: 0.2 and 10)")
        if static_masks < 0:
            raise EmberError(f"data.static_masks={static_masks}: use 0 (dynamic) or N > 0 fixed masks")
        if scheme != "token" and continues_word is None:
            raise EmberError(f"data.masking={scheme} needs the tokenizer to find word boundaries")
        self.scheme, self.mask_id, self.vocab_size = scheme, mask_id, vocab_size
        self.mask_prob, self.max_predictions = mask_prob, max_predictions
        self.static_masks, self.seed = static_masks, seed
        self.span_probs = span_length_probs(span_p, max_span)
        self.continues_word = None
        if continues_word is not None:  # pad to the model's vocabulary: unknown ids start words
            self.continues_word = np.zeros(max(vocab_size, len(continues_word)), dtype=bool)
            self.continues_word[: len(continues_word)] = continues_word

    def row_rngs(self, keys: list[tuple[int, int]] | None, n: int,
                 rng: np.random.Generator) -> list[np.random.Generator]:
        """One generator per sequence: the batch's (dynamic) or keyed by (seed, index,
        epoch mod N) (static)."""
        if not self.static_masks:
            return [rng] * n
        if keys is None or len(keys) != n:
            raise EmberError("static masks need each example's mask_key (index, epoch)")
        return [np.random.default_rng([self.seed, int(i), int(e) % self.static_masks, _STATIC_TAG])
                for i, e in keys]

    def __call__(self, input_ids: np.ndarray, maskable: np.ndarray, rng: np.random.Generator,
                 joins: np.ndarray | None = None,
                 keys: list[tuple[int, int]] | None = None) -> MaskedBatch:
        """input_ids (B, T) int64, maskable (B, T) bool, joins (B, T) bool or None,
        keys: each row's ``SegmentPair.mask_key`` (needed for static masks)."""
        b, t = input_ids.shape
        if self.scheme == "phrase" and joins is None:
            # Silently falling back to whole words would mislabel the experiment.
            raise EmberError("data.masking=phrase, but the training examples carry no phrase flags "
                             "(SegmentPair.joins_a/b); prepare the corpus with "
                             "`ember prepare --phrases spans|detect`")
        rngs = self.row_rngs(keys, b, rng)
        if self.scheme == "token":
            if self.static_masks:
                rows = [mask_tokens(input_ids[i : i + 1], maskable[i : i + 1], rngs[i], self.mask_id,
                                    self.vocab_size, self.mask_prob, self.max_predictions) for i in range(b)]
                corrupted = np.concatenate([r[0] for r in rows]).reshape(b, t)
                labels = np.concatenate([r[1] for r in rows]).reshape(b, t)
            else:
                corrupted, labels = mask_tokens(input_ids, maskable, rng, self.mask_id, self.vocab_size,
                                                self.mask_prob, self.max_predictions)
            chosen = labels != -100
            start = np.where(chosen, np.arange(t)[None, :], -1)
            return MaskedBatch(corrupted, labels, start, np.where(chosen, start + 1, -1))

        starts = unit_starts(input_ids, maskable, self.scheme, self.continues_word, joins)
        budget = prediction_budget(maskable.sum(axis=1), self.mask_prob, self.max_predictions)
        out = MaskedBatch(input_ids.copy(), np.full_like(input_ids, -100),
                          np.full_like(input_ids, -1), np.full_like(input_ids, -1))
        for i in range(b):
            unit_start, unit_end = units_of_row(starts[i], maskable[i])
            if self.scheme == "span":
                s, e = select_spans(unit_start, unit_end, int(budget[i]), rngs[i], self.span_probs)
            else:
                s, e = select_units(unit_start, unit_end, int(budget[i]), rngs[i])
            self._corrupt_row(input_ids[i], s, e, rngs[i], out, i)
        return out

    def _corrupt_row(self, ids: np.ndarray, start: np.ndarray, end: np.ndarray,
                     rng: np.random.Generator, out: MaskedBatch, row: int) -> None:
        """Apply 80/10/10 to the chosen units (start, end) (k,) of row ``row``."""
        lengths = end - start  # (k,)
        unit = np.repeat(np.arange(len(start)), lengths)  # (n,) unit of each chosen token
        pos = start[unit] + np.arange(len(unit)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        action = rng.random(len(start))[unit] if _PER_UNIT[self.scheme] else rng.random(len(pos))
        out.labels[row, pos] = ids[pos]
        out.unit_start[row, pos] = start[unit]
        out.unit_end[row, pos] = end[unit]
        out.input_ids[row, pos[action < 0.8]] = self.mask_id
        random_pos = pos[(action >= 0.8) & (action < 0.9)]
        out.input_ids[row, random_pos] = rng.integers(0, self.vocab_size, size=len(random_pos))


def build_masker(data, special_ids: dict, vocab_size: int, seed: int = 0) -> Masker:
    """The ``Masker`` a DataConfig asks for. Schemes other than ``token`` read word
    boundaries from the tokenizer at ``special_ids["tokenizer_path"]`` (set by
    ``ember.train.pretrain``)."""
    continues = None
    if data.masking != "token":
        path = special_ids.get("tokenizer_path")
        if not path:
            raise EmberError(f"data.masking={data.masking} needs the tokenizer to find word "
                             "boundaries; pass special_ids['tokenizer_path'] to the objective")
        from ember.tokenizers import load_tokenizer

        continues = word_continuation_table(load_tokenizer(path))
    mask_id = role_id(special_ids, "mask", f"masking tokens (data.masking={data.masking})")
    return Masker(data.masking, mask_id, vocab_size, data.mask_prob, data.max_predictions,
                  continues, data.span_p, data.max_span, data.static_masks, seed)
