"""Language-balanced sampling for cross-lingual pre-training (XLM, Lample & Conneau 2019, §3.1).

With n_i sentences in language i, p_i = n_i / sum_k n_k, languages are sampled from the
multinomial

    q_i = p_i^alpha / sum_j p_j^alpha,    alpha = 0.5 in the paper,

which raises low-resource languages (alpha < 1 flattens the distribution; alpha = 1 keeps
the corpus proportions, alpha = 0 is uniform). The paper applies it twice, and so do we:

- to the sentences the shared BPE vocabulary is learned from
  (``LanguageBalancedSentences``, fed to ``ember.tokenizers.train_tokenizer``), so a small
  language is not split into characters by a vocabulary fitted to a large one;
- to the pre-training stream: the language of each sequence (``MixedDataset``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from ember.errors import EmberError


def language_probs(counts, alpha: float) -> np.ndarray:
    """q (K,) from sizes n (K,) (XLM §3.1); every n_i must be positive."""
    n = np.asarray(counts, dtype=np.float64)
    if not 0 <= alpha <= 1:
        raise EmberError(f"alpha={alpha}: the language-sampling exponent must be in [0, 1] "
                         "(XLM uses 0.5; 1 keeps the corpus proportions, 0 is uniform)")
    if len(n) == 0 or (n <= 0).any():
        raise EmberError(f"cannot balance languages with sizes {n.astype(int).tolist()}: every "
                         "language needs some text")
    q = (n / n.sum()) ** alpha
    return q / q.sum()


class LanguageBalancedSentences:
    """Iterable over sentences of several languages, each language's share resampled to q_i.

    ``languages`` maps a language code to its inputs (files, folders, globs; any format of
    ``ember.data.readers``). A first pass counts each language's sentences n_i (up to
    ``max_documents`` documents per language); the second yields M = sum n_i sentences in
    all, q_i M of them from language i: every sentence of language i r_i = q_i M / n_i times
    on average (floor(r_i) copies, plus one more with probability frac(r_i), drawn from a
    seeded generator), so the whole resample streams and is deterministic. Repeating a
    sentence is the same, to a BPE/WordPiece trainer, as counting its words r_i times.
    After iteration, ``counts``, ``probs`` and ``fed`` (sentences yielded per language) are set.
    """

    def __init__(self, languages: dict[str, list[str | Path] | str | Path], alpha: float = 0.5,
                 seed: int = 0, max_documents: int | None = None, fmt: str = "auto",
                 text_field: str = "text") -> None:
        if len(languages) < 1:
            raise EmberError("no languages given; pass at least one language=PATH")
        language_probs(np.ones(len(languages)), alpha)  # checks alpha before any reading
        self.languages = dict(languages)
        self.alpha, self.seed, self.max_documents = alpha, seed, max_documents
        self.fmt, self.text_field = fmt, text_field
        self.counts: dict[str, int] = {}
        self.probs: dict[str, float] = {}
        self.fed: dict[str, int] = {}

    def _sentences(self, code: str) -> Iterator[str]:
        from ember.data.readers import DocumentReader
        from ember.data.sentences import split_sentences

        reader = DocumentReader(self.languages[code], fmt=self.fmt, text_field=self.text_field)
        for i, doc in enumerate(reader):
            if self.max_documents is not None and i >= self.max_documents:
                return
            yield from split_sentences(doc.text)

    def __iter__(self) -> Iterator[str]:
        codes = list(self.languages)
        self.counts = {c: sum(1 for _ in self._sentences(c)) for c in codes}
        empty = [c for c, n in self.counts.items() if n == 0]
        if empty:
            raise EmberError(f"no text for language(s) {', '.join(empty)}: read "
                             f"{', '.join(str(self.languages[c]) for c in empty)} and found no sentences")
        q = language_probs([self.counts[c] for c in codes], self.alpha)
        total = sum(self.counts.values())
        self.probs = dict(zip(codes, q.tolist()))
        rng = np.random.default_rng([self.seed, 7331])
        for code, q_i in zip(codes, q):
            rate = q_i * total / self.counts[code]  # copies per sentence, on average
            whole, frac = int(rate), rate - int(rate)
            fed = 0
            for sentence in self._sentences(code):
                copies = whole + int(rng.random() < frac)
                fed += copies
                for _ in range(copies):
                    yield sentence
            self.fed[code] = fed

    def summary(self) -> str:
        """One line per language: sentences read, p_i, q_i and sentences fed."""
        total = sum(self.counts.values()) or 1
        return "\n".join(
            f"  {c}: {n:,} sentences, p={n / total:.3f} -> q={self.probs.get(c, 0):.3f} "
            f"(alpha {self.alpha}), {self.fed.get(c, 0):,} fed to the trainer"
            for c, n in self.counts.items())


class MixedDataset:
    """Several datasets behind one index, each position's source drawn from ``probs``.

    ``sources``: objects with ``len()`` and ``example(index, epoch)``. An epoch has
    sum(len(source)) positions; for epoch e a generator seeded with (seed, e) draws every
    position's source from the multinomial ``probs`` (XLM §3.1: the language of each
    sequence), and the positions of source k walk through fresh seeded permutations of its
    examples (a source drawn more often than its size repeats examples, a rarer one
    visits a subset). Deterministic under the seed, and a pure function of (index, epoch),
    which exact resume and DDP need (ember.train.loop).
    """

    pair_mode = "none"

    def __init__(self, sources: list, probs, seed: int) -> None:
        probs = np.asarray(probs, dtype=np.float64)
        if len(sources) == 0 or len(sources) != len(probs):
            raise EmberError(f"{len(sources)} data sources but {len(probs)} sampling weights")
        if any(len(s) == 0 for s in sources):
            raise EmberError("a data source of the language mix has no examples")
        self.sources, self.probs, self.seed = list(sources), probs / probs.sum(), seed
        self.sizes = np.array([len(s) for s in sources], dtype=np.int64)
        self._epoch, self._source, self._item = -1, None, None

    def __len__(self) -> int:
        return int(self.sizes.sum())

    def _assign(self, epoch: int) -> None:
        rng = np.random.default_rng([self.seed, epoch, 52711])
        n = len(self)
        source = rng.choice(len(self.sources), size=n, p=self.probs)  # (N,)
        item = np.zeros(n, dtype=np.int64)
        for k, size in enumerate(self.sizes.tolist()):
            where = np.flatnonzero(source == k)
            rounds = -(-len(where) // size)  # permutations needed to cover the draws
            walk = np.concatenate([rng.permutation(size) for _ in range(max(rounds, 1))])
            item[where] = walk[: len(where)]
        self._epoch, self._source, self._item = epoch, source, item

    def locate(self, index: int, epoch: int = 0) -> tuple[int, int]:
        """(source, index within it) of position ``index`` in ``epoch``."""
        if not 0 <= index < len(self):
            raise IndexError(f"example {index} out of range [0, {len(self)})")
        if epoch != self._epoch:
            self._assign(epoch)
        return int(self._source[index]), int(self._item[index])

    def example(self, index: int, epoch: int = 0):
        k, i = self.locate(index, epoch)
        return self.sources[k].example(i, epoch)
