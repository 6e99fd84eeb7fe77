"""Factorisation orders, prediction targets and attention masks of XLNet's permutation LM
(Yang et al. 2019 §2.2-2.3), after the released data pipeline (``_sample_mask`` and
``_local_perm`` of the original XLNet code).

Per sequence of T tokens, with the random numbers drawn in this order:

1. **Targets** (``sample_targets``): spans of whole words. Repeatedly draw a span length of
   n <= max_span words with P(n) proportional to 1/n, skip a uniform number l in [0, n*K)
   of words, take the next n words' tokens, skip the other n*K - l words, until
   ``num_predict`` tokens are targets (a span is cut at the token that reaches it). Random
   single tokens then make up any shortfall, so every sequence has exactly num_predict =
   T/K targets: partial prediction (§2.3) with cutting point c = T - T/K. This is the
   original ``_sample_mask`` (context n * mask_alpha / mask_beta, alpha/beta = K = 6): spans
   alone cover about 1/(K+1) of the words, spread over the whole sequence, and the top-up
   (uniform) completes 1/K without favouring its start.
2. **Order** (``factorization_ranks``): a uniformly random permutation of the positions. Every
   token that is neither a target nor a structure token (<sep>, <cls>) gets rank -1: it comes
   first, all such tokens see each other and none of them sees a target - they are the
   context x_{z<=c}. Targets and structure tokens keep their random ranks: the order is the
   context, then the targets with the three structure tokens shuffled among them, so only the
   last 1/K of the order is predicted (the structure tokens are inputs, never targets).
3. **Masks** (``permutation_mask``): ``blocked[i, j]`` (True: i may not attend to j) when j is a
   target or structure token and i does not come after j in the order - except that a
   structure token sees itself. A target never sees itself there: that is the query stream's
   mask (g_{z_t} sees x_{z<t}); the backbone unblocks the diagonal for the content stream
   (h_{z_t} sees x_{z<=t}). Structure tokens are never predicted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ember.errors import EmberError
from ember.objectives.masking import unit_starts, units_of_row


def ngram_length_probs(max_span: int) -> np.ndarray:
    """float64 (max_span,): P(n words) proportional to 1/n, n = 1..max_span (XLNet's n-grams)."""
    weights = 1.0 / np.arange(1, max_span + 1)
    return weights / weights.sum()


def sample_targets(word_start: np.ndarray, word_end: np.ndarray, candidates: np.ndarray,
                   num_predict: int, k: float, probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """bool (T,): the targets of one sequence (step 1 of the module docstring).

    word_start/word_end: int64 (W,) token spans of the words, in order; candidates: bool (T,)
    positions that may be predicted (every word token is one).
    """
    if int(candidates.sum()) < num_predict:
        raise EmberError(f"a sequence has {int(candidates.sum())} predictable tokens, fewer than "
                         f"plm.num_predict={num_predict}; lower plm.num_predict or raise plm.k")
    target = np.zeros(len(candidates), dtype=bool)
    cdf = np.cumsum(probs)
    n_words, w, taken = len(word_start), 0, 0
    while w < n_words and taken < num_predict:
        n = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")) + 1  # span length in words
        context = int(n * k)  # words of context around the span (XLNet: n * alpha / beta)
        left = int(rng.integers(context)) if context > 0 else 0
        begin = w + left
        if begin >= n_words:
            break
        end = min(begin + n, n_words)
        # the words' own tokens: consecutive words may straddle a <sep>, which is not taken
        tokens = np.concatenate([np.arange(word_start[u], word_end[u]) for u in range(begin, end)])
        tokens = tokens[: num_predict - taken]
        target[tokens] = True
        taken += len(tokens)
        w = end + context - left
    if taken < num_predict:  # top up with single tokens, as XLNet's sampler does
        free = np.flatnonzero(candidates & ~target)
        target[rng.choice(free, num_predict - taken, replace=False)] = True
    return target


def factorization_ranks(target: np.ndarray, structure: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """int64 (T,): each position's place in the factorisation order; -1 for the context
    (neither target nor structure token), which precedes everything else (step 2)."""
    ranks = rng.permutation(len(target)).astype(np.int64)
    return np.where(target | structure, ranks, -1)


def permutation_mask(ranks: np.ndarray, target: np.ndarray) -> np.ndarray:
    """bool (T, T): True where position i may not attend to position j (step 3); the query
    stream's mask, XLNet's ``perm_mask``."""
    ordered = ranks >= 0  # targets and structure tokens: seen only by later positions
    own = np.where(target, ranks, ranks + 1)  # a non-target also sees itself
    return (own[:, None] <= ranks[None, :]) & ordered[None, :]


def order_of(ranks: np.ndarray) -> np.ndarray:
    """int64 (T,): positions in factorisation order - the context (in position order, all at
    once), then targets and structure tokens by rank."""
    return np.argsort(ranks, kind="stable")


@dataclass
class SequencePlan:
    ranks: np.ndarray  # (T,) int64, -1 = context
    target: np.ndarray  # (T,) bool
    perm_mask: np.ndarray  # (T, T) bool, True = may not attend
    positions: np.ndarray  # (num_predict,) int64 target positions, ascending


def plan_sequence(input_ids: np.ndarray, structure: np.ndarray, num_predict: int, k: float,
                  probs: np.ndarray, rng: np.random.Generator,
                  continues_word: np.ndarray | None = None) -> SequencePlan:
    """Targets, order and mask of one sequence (T,). ``structure``: bool (T,) <sep>/<cls>
    positions; ``continues_word``: bool (V,) word-continuation table
    (ember.objectives.masking.word_continuation_table), None = every token is a word."""
    candidates = ~structure
    scheme = "token" if continues_word is None else "whole_word"
    starts = unit_starts(input_ids[None], candidates[None], scheme, continues_word)[0]
    word_start, word_end = units_of_row(starts, candidates)
    target = sample_targets(word_start, word_end, candidates, num_predict, k, probs, rng)
    ranks = factorization_ranks(target, structure, rng)
    return SequencePlan(ranks, target, permutation_mask(ranks, target), np.flatnonzero(target))
