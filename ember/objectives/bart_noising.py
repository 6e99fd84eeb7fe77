"""BART's document corruptions (Lewis et al. 2020, §2.2 and Figure 2), on numpy token arrays.

Each function takes a document body - the tokens between <s> and </s>, which no noise touches
(fairseq's DenoisingDataset keeps both in place) - and a ``np.random.Generator``:

  token_masking        "Following BERT, random tokens are sampled and replaced with [MASK]":
                       ceil(ratio * L) distinct positions become the mask token.
  token_deletion       "Random tokens are deleted from the input": the same positions, removed,
                       so the model must find where input is missing.
  text_infilling       "A number of text spans are sampled, with span lengths drawn from a
                       Poisson distribution (λ = 3). Each span is replaced with a single [MASK]
                       token. 0-length spans correspond to the insertion of [MASK] tokens."
                       Lengths are drawn until they cover ceil(ratio * L) tokens and the last
                       is cut to the budget (fairseq's add_whole_word_mask), so exactly that
                       many tokens are masked (§5.1: 30%); the spans are laid out without
                       overlap in a uniformly random order among the kept tokens.
  sentence_permutation "A document is divided into sentences based on full stops, and these
                       sentences are shuffled in a random order": ember's corpora store the
                       sentence boundaries; ``ratio`` of the sentences change places (fairseq's
                       permute_sentences; 1.0 in §5.1).
  document_rotation    "A token is chosen uniformly at random, and the document is rotated so
                       that it begins with that token": never the first token, so a rotation
                       always moves something (fairseq's add_rolling_noise).

Masks may become a random ordinary token instead (``random_ratio``; fairseq's --mask-random,
off in the paper). The unit of masking, deletion and spans is the token, or with ``starts`` (bool
(L,), True where a unit begins: word starts from the tokenizer, ``noising.unit: word``) the whole
word, as fairseq's released pre-training counts them (--mask-length span-poisson with whole-word
masks): ceil(ratio * words) words, every token of a masked word masked (token masking) or one
mask per span of words (infilling).
"""

from __future__ import annotations

import math

import numpy as np

from ember.errors import EmberError

TOKEN_KINDS = ("mask", "delete", "infill")  # at most one per objective, as fairseq's replace_length
ORDER_KINDS = ("permute", "rotate")
KINDS = TOKEN_KINDS + ORDER_KINDS


def parse_kinds(kinds: str) -> tuple[str, ...]:
    """``noising.kinds`` ("infill,permute") -> the kinds in application order, checked."""
    names = [k.strip() for k in kinds.split(",") if k.strip()]
    unknown = [k for k in names if k not in KINDS]
    if unknown or not names:
        raise EmberError(f"noising.kinds={kinds!r}: choose from {', '.join(KINDS)} (comma-separated, e.g. "
                         "infill,permute as BART's final model)")
    if sum(k in TOKEN_KINDS for k in names) > 1:
        raise EmberError(f"noising.kinds={kinds!r} combines {' and '.join(k for k in names if k in TOKEN_KINDS)}; "
                         "pick one of mask, delete, infill (each replaces the same sampled tokens differently)")
    return tuple(k for k in ("permute", *TOKEN_KINDS, "rotate") if k in names)


def _with_random(out: np.ndarray, where: np.ndarray, mask_id: int, random_ratio: float,
                 ordinary: np.ndarray | None, rng: np.random.Generator) -> np.ndarray:
    """Put the mask at positions ``where`` (int64), a random ordinary token at a ``random_ratio``
    share of them."""
    out[where] = mask_id
    if random_ratio > 0 and len(where):
        pick = where[rng.random(len(where)) < random_ratio]
        out[pick] = rng.choice(ordinary, size=len(pick))
    return out


def unit_bounds(length: int, starts: np.ndarray | None) -> np.ndarray:
    """int64 (U + 1,): token offset of each unit's start, then ``length``; every token is a unit
    without ``starts``, and the first token always starts one."""
    if starts is None:
        return np.arange(length + 1, dtype=np.int64)
    starts = np.asarray(starts, dtype=bool).copy()
    if length:
        starts[0] = True
    return np.append(np.flatnonzero(starts), length).astype(np.int64)


def _expand(bounds: np.ndarray, units: np.ndarray) -> np.ndarray:
    """Token positions (int64, sorted) of the given unit indices."""
    parts = [np.arange(bounds[u], bounds[u + 1]) for u in units.tolist()]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


def sample_positions(length: int, ratio: float, rng: np.random.Generator, starts: np.ndarray | None = None) -> np.ndarray:
    """The token positions of ceil(ratio * U) distinct units of a body of U units, sorted."""
    bounds = unit_bounds(length, starts)
    u = len(bounds) - 1
    n = min(u, math.ceil(u * ratio))
    return _expand(bounds, np.sort(rng.choice(u, size=n, replace=False)))


def token_masking(tokens: np.ndarray, ratio: float, mask_id: int, rng: np.random.Generator,
                  random_ratio: float = 0.0, ordinary: np.ndarray | None = None,
                  starts: np.ndarray | None = None) -> np.ndarray:
    out = np.array(tokens, dtype=np.int64)
    return _with_random(out, sample_positions(len(out), ratio, rng, starts), mask_id, random_ratio, ordinary, rng)


def token_deletion(tokens: np.ndarray, ratio: float, rng: np.random.Generator,
                   starts: np.ndarray | None = None) -> np.ndarray:
    keep = np.ones(len(tokens), dtype=bool)
    keep[sample_positions(len(tokens), ratio, rng, starts)] = False
    return np.asarray(tokens, dtype=np.int64)[keep]


def infilling_spans(length: int, ratio: float, lam: float, rng: np.random.Generator) -> np.ndarray:
    """int64 (k,) span lengths for a body of ``length`` tokens: Poisson(lam) draws until they
    cover ceil(ratio * length) tokens, the last cut to that budget; zeros are insertions."""
    budget = min(length, math.ceil(length * ratio))
    if budget == 0:
        return np.zeros(0, dtype=np.int64)
    lengths = rng.poisson(lam, size=budget)
    while lengths.sum() < budget:
        lengths = np.concatenate([lengths, rng.poisson(lam, size=budget)])
    last = int(np.searchsorted(np.cumsum(lengths), budget))  # the first span reaching the budget
    lengths = lengths[: last + 1].astype(np.int64)
    lengths[-1] = budget - lengths[:-1].sum()
    return lengths


def layout_spans(length: int, spans: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """int64 (k,) start of each span (in span order) laid out without overlap: the k spans and
    the length - sum(spans) kept tokens are put in a uniformly random order."""
    kept, k = length - int(spans.sum()), len(spans)
    slots = np.sort(rng.choice(kept + k, size=k, replace=False))  # which items of the order are spans
    # a span's start = kept tokens before it + tokens of the spans before it
    kept_before = slots - np.arange(k)
    return kept_before + np.concatenate([[0], np.cumsum(spans)[:-1]]).astype(np.int64)


def text_infilling(tokens: np.ndarray, ratio: float, lam: float, mask_id: int, rng: np.random.Generator,
                   random_ratio: float = 0.0, ordinary: np.ndarray | None = None,
                   starts: np.ndarray | None = None) -> np.ndarray:
    tokens = np.asarray(tokens, dtype=np.int64)
    bounds = unit_bounds(len(tokens), starts)  # spans are counted and laid out in units
    spans = infilling_spans(len(bounds) - 1, ratio, lam, rng)
    if len(spans) == 0:
        return tokens.copy()
    first = layout_spans(len(bounds) - 1, spans, rng)  # (k,) first unit of each span
    pieces, pos, where, size = [], 0, [], 0
    for u, n in zip(first.tolist(), spans.tolist()):
        start = int(bounds[u])
        pieces.append(tokens[pos:start])
        size += start - pos
        where.append(size)  # the mask's position in the output
        pieces.append(np.array([mask_id], dtype=np.int64))  # one mask per span, also for n = 0
        size += 1
        pos = int(bounds[u + n])
    pieces.append(tokens[pos:])
    out = np.concatenate(pieces)
    return _with_random(out, np.array(where, dtype=np.int64), mask_id, random_ratio, ordinary, rng)


def sentence_permutation(tokens: np.ndarray, sentence_ends: np.ndarray, rng: np.random.Generator,
                         ratio: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(tokens with ceil(ratio * S) of the S sentences shuffled among their places, the new
    sentence ends)."""
    ends = np.asarray(sentence_ends, dtype=np.int64)
    starts = np.concatenate([[0], ends[:-1]])
    order = np.arange(len(ends))
    n = math.ceil(len(ends) * ratio)
    moved = rng.permutation(len(ends))[:n]
    order[moved] = moved[rng.permutation(n)]
    tokens = np.asarray(tokens, dtype=np.int64)
    out = np.concatenate([tokens[starts[i]:ends[i]] for i in order]) if len(order) else tokens.copy()
    return out, np.cumsum(ends[order] - starts[order])


def document_rotation(tokens: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The body rotated to begin at a uniformly drawn token other than the first (unchanged when
    it has fewer than 2 tokens)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    if len(tokens) < 2:
        return tokens.copy()
    k = int(rng.integers(1, len(tokens)))
    return np.concatenate([tokens[k:], tokens[:k]])
