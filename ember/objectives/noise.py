"""T5's corruption building blocks (Raffel et al. 2020, §3.3, and the T5 code's
``t5/data/preprocessors.py``, whose names these functions keep).

Every unsupervised objective of the paper is three choices over a raw token sequence (L,):

* a **noise mask** (L,) bool: which tokens are corrupted - random spans (span corruption,
  §3.3.4), i.i.d. tokens (§3.3.2), the suffix after a random split point (prefix LM), or all;
* an **inputs encoding**: what the encoder sees - each noise span replaced by one unique
  sentinel, noise tokens dropped, each noise token masked (or, BERT-style, sometimes a random
  token), noise tokens permuted;
* a **targets encoding**: what the decoder predicts - the noise spans each after its
  sentinel, only the noise tokens, or the full original text.

End-of-sequence tokens are appended afterwards by the caller (T5's features add EOS to both).
Randomness comes from one ``np.random.Generator``, so a seeded batch is reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ember.errors import EmberError


# -- lengths ----------------------------------------------------------------------------------

def span_counts(length: int, noise_density: float, mean_noise_span_length: float) -> tuple[int, int]:
    """(noise tokens, noise spans) of a sequence of ``length`` raw tokens, as the T5 code's
    ``random_spans_noise_mask`` fixes them: round(length * density) tokens (at least 1, at
    most length - 1) in round(noise tokens / mean span length) spans (at least 1). Python's
    round, like tf.round, rounds halves to even. The span count is also capped so that both
    noise and non-noise tokens can fill that many spans (only binds for densities near 1)."""
    num_noise = min(max(round(length * noise_density), 1), length - 1)
    num_spans = max(round(num_noise / mean_noise_span_length), 1)
    return num_noise, min(num_spans, num_noise, length - num_noise)


def random_spans_lengths(inputs_length: int, noise_density: float = 0.15,
                         mean_noise_span_length: float = 3.0) -> tuple[int, int]:
    """(raw tokens per example, targets length) so that span corruption gives exactly
    ``inputs_length`` encoder tokens: T5's ``random_spans_helper``. Inputs hold the non-noise
    tokens, one sentinel per noise span and EOS; targets the noise tokens, one sentinel per
    span and EOS. The largest raw length whose inputs still fit is taken; for 512 inputs at
    density 0.15 and mean span 3 that is 568 raw tokens (85 noise tokens in 28 spans:
    483 + 28 + 1 = 512 inputs, 85 + 28 + 1 = 114 targets)."""

    def lengths(tokens: int) -> tuple[int, int]:
        num_noise = round(tokens * noise_density)
        num_spans = round(num_noise / mean_noise_span_length)
        return tokens - num_noise + num_spans + 1, num_noise + num_spans + 1

    if inputs_length < 2:
        raise EmberError(f"data.max_seq_length={inputs_length}: span corruption needs at least 2 input tokens")
    tokens = inputs_length - 1
    while lengths(tokens + 1)[0] <= inputs_length:
        tokens += 1
    targets = lengths(tokens)[1]
    if noise_density == 0.5 and targets > inputs_length:  # T5's tweak: targets no longer than inputs
        tokens, targets = tokens - 1, targets - 1
    return tokens, targets


# -- noise masks: (length, rng) -> (L,) bool ---------------------------------------------------

def random_segmentation(num_items: int, num_segments: int, rng: np.random.Generator) -> np.ndarray:
    """Lengths (num_segments,) >= 1 summing to num_items, every such composition equally
    likely: segment starts are a uniform random subset of the num_items - 1 inner gaps."""
    starts = np.sort(rng.choice(num_items - 1, num_segments - 1, replace=False)) + 1
    return np.diff(np.concatenate([[0], starts, [num_items]]))


def random_spans_noise_mask(length: int, noise_density: float, mean_noise_span_length: float,
                            rng: np.random.Generator) -> np.ndarray:
    """Noise spans and non-noise spans alternate, starting with non-noise (so the sequence
    ends with a noise span); counts from ``span_counts``, span lengths from two independent
    random segmentations. A single token is never noise (T5 pads to 2, then trims)."""
    if length < 2:
        return np.zeros(length, dtype=bool)
    num_noise, num_spans = span_counts(length, noise_density, mean_noise_span_length)
    noise_lengths = random_segmentation(num_noise, num_spans, rng)  # (K,)
    nonnoise_lengths = random_segmentation(length - num_noise, num_spans, rng)  # (K,)
    interleaved = np.stack([nonnoise_lengths, noise_lengths], axis=1).reshape(-1)  # (2K,)
    return np.repeat(np.tile([False, True], num_spans), interleaved)


def iid_noise_mask(length: int, noise_density: float, rng: np.random.Generator) -> np.ndarray:
    """Each token independently noise with probability ``noise_density`` (§3.3.2)."""
    return rng.random(length) < noise_density


def random_prefix_noise_mask(length: int, rng: np.random.Generator) -> np.ndarray:
    """Prefix LM: the encoder keeps a prefix of uniformly random length in [1, length - 1]
    (T5's ``random_prefix_noise_mask`` at density 0.5); the rest is noise, to be predicted."""
    num_prefix = int(rng.integers(min(1, length - 1), length))
    return np.arange(length) >= num_prefix


# -- encodings: (tokens (L,), noise (L,), vocab, rng) -> ids ------------------------------------

@dataclass(frozen=True)
class NoiseVocab:
    """The ids an encoding may write: sentinels in order (``<extra_id_0>`` first), the mask
    token (T5 masks with its first sentinel, the code's ``sentinel_id``), the pool random
    replacements are drawn from, and how often BERT-style corruption draws one."""

    sentinels: np.ndarray  # (S,) int64
    random_ids: np.ndarray  # (R,) int64: ordinary pieces, no special tokens or sentinels
    random_token_prob: float = 0.1

    @property
    def mask_id(self) -> int:
        return int(self.sentinels[0])


def noise_span_to_unique_sentinel(tokens, noise, vocab: NoiseVocab, rng=None) -> np.ndarray:
    """Each run of noise tokens becomes one sentinel, numbered in order of appearance."""
    previous = np.concatenate([[False], noise[:-1]])
    first = noise & ~previous  # (L,) first token of each noise span
    num_spans = int(first.sum())
    if num_spans > len(vocab.sentinels):
        raise EmberError(f"a sequence has {num_spans} corrupted spans but the tokenizer only "
                         f"{len(vocab.sentinels)} sentinels; retrain it with --sentinels {num_spans} "
                         "or more, or lower data.max_seq_length")
    out = tokens.copy()
    out[first] = vocab.sentinels[:num_spans]
    return out[~(noise & previous)]


def nonnoise_span_to_unique_sentinel(tokens, noise, vocab: NoiseVocab, rng=None) -> np.ndarray:
    """The targets of span corruption: sentinel, its span, next sentinel, ... (the sentinels
    stand in for the kept text, aligned with those of the inputs)."""
    return noise_span_to_unique_sentinel(tokens, ~noise, vocab)


def drop_noise_tokens(tokens, noise, vocab=None, rng=None) -> np.ndarray:
    return tokens[~noise]


def drop_nonnoise_tokens(tokens, noise, vocab=None, rng=None) -> np.ndarray:
    return tokens[noise]


def keep_all_tokens(tokens, noise=None, vocab=None, rng=None) -> np.ndarray:
    """The original sequence: the target of the BERT-style, MASS-style and deshuffling objectives."""
    return tokens.copy()


def noise_token_to_sentinel(tokens, noise, vocab: NoiseVocab, rng=None) -> np.ndarray:
    """Every noise token becomes the mask token (MASS-style, Table 4)."""
    return np.where(noise, vocab.mask_id, tokens)


def noise_token_to_random_token_or_sentinel(tokens, noise, vocab: NoiseVocab,
                                            rng: np.random.Generator) -> np.ndarray:
    """BERT-style (§3.3.1): each noise token becomes a random token with probability
    ``random_token_prob`` (10%), otherwise the mask token (90%)."""
    use_random = rng.random(len(tokens)) < vocab.random_token_prob
    random_tokens = vocab.random_ids[rng.integers(0, len(vocab.random_ids), size=len(tokens))]
    return np.where(noise & use_random, random_tokens, np.where(noise, vocab.mask_id, tokens))


def permute_noise_tokens(tokens, noise, vocab=None, rng: np.random.Generator = None) -> np.ndarray:
    """The noise tokens shuffled among their own positions (deshuffling, §3.3.1, with all
    tokens noise)."""
    out = tokens.copy()
    out[noise] = rng.permutation(tokens[noise])
    return out
