"""Phrase and entity spans for ERNIE-style masking (Sun et al. 2019, §3.2).

ERNIE masks whole phrases and named entities instead of single tokens, so the model has to
recover them from the wider context. ``ember prepare --phrases`` stores, for every token, a
flag "this token joins the previous token's unit" (``*.joins.bin``, see
``ember.data.shards``); ``data.masking: phrase`` then masks each flagged group as one unit
(``ember.objectives.masking``). The spans come from one of two sources.

``--phrases spans``: the corpus supplies them. Input is JSONL, one document per line::

    {"text": "Barack Obama visited New York.", "spans": [[0, 12], [21, 29]]}

``spans`` is a list of ``[start, end]`` pairs of integers: 0-based character offsets into
the ``text`` string exactly as stored in the JSON (Python ``str`` indexing, i.e. Unicode
code points; ``end`` exclusive; the text is not stripped before the offsets are applied).
Spans may come in any order but must not overlap; ``0 <= start < end <= len(text)``.
Anything else stops ``ember prepare`` with the file and line. A line without ``spans`` is a
document without phrases (whole-word units only).

``--phrases detect``: a built-in detector (``PhraseDetector``) finds two kinds of phrase.
Words are maximal runs of letters/digits (any script) with inner ``'``, ``’`` or ``-``;
two words are adjacent when only spaces or tabs separate them (punctuation and newlines
break phrases). Statistics come from the first ``sample_docs`` documents of the input:

1. Collocations (frequent n-grams): an adjacent word pair (a, b), lower-cased, seen at
   least ``min_count`` times and with normalised pointwise mutual information
   NPMI(a, b) = ln(P(ab) / (P(a) P(b))) / -ln P(ab) >= ``threshold`` (Bouma 2009), both
   words containing a letter. Overlapping qualifying pairs chain: "new york" + "york city"
   gives "new york city".
2. Names (capitalised sequences, entity-like): runs of at least 2 *name words* - words
   starting with an upper-case letter that are capitalised in at least half of their
   sample occurrences (or were never seen), so sentence-initial "The" or "In" do not
   count - where one of the lower-case particles in ``NAME_PARTICLES`` ("of", "de", "von",
   ...) may stand between two name words ("Bank of England").

Runs of more than ``max_words`` words are not phrases (long capitalised runs are titles).
Overlapping phrases of the two kinds are merged. The phrase spans are then aligned to
tokens exactly like corpus spans.

Token alignment (``token_joins``): a token belongs to the span its character range overlaps
(a zero-width token at offset x counts as [x, x+1)); a token overlapping two spans belongs
to the later one. A token joins the previous token when both belong to the same span, so a
span cut inside a token grows to the whole token. Flags never cross sentence boundaries
(the first token of a sentence never joins), since sentences may end up in different
segments.
"""

from __future__ import annotations

import re

import numpy as np

from ember.data.readers import Document, DocumentReader
from ember.errors import EmberError

PHRASE_SOURCES = ("none", "spans", "detect")
SPAN_FORMAT = ('"spans" must be a list of [start, end] integer character offsets into "text" '
               "(0-based, end exclusive, non-overlapping)")
_WORD = r"[^\W_]+(?:['’\-][^\W_]+)*"
WORD_RE = re.compile(_WORD)
# Words separated by spaces/tabs only (not newlines, not punctuation).
GROUP_RE = re.compile(rf"{_WORD}(?:[^\S\n]+{_WORD})*")
NAME_PARTICLES = frozenset("of de del der den van von da di du la le".split())


def parse_spans(raw, text: str, where: str) -> np.ndarray:
    """Validate a JSONL ``spans`` value for ``text``; int64 (k, 2) sorted by start.

    ``where`` ("file:line") prefixes every error message.
    """
    if raw is None:
        return np.zeros((0, 2), dtype=np.int64)
    if not isinstance(raw, list):
        raise EmberError(f"{where}: {SPAN_FORMAT}; got {type(raw).__name__}")
    spans = []
    for i, item in enumerate(raw):
        if not (isinstance(item, (list, tuple)) and len(item) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) for v in item)):
            raise EmberError(f"{where}: span #{i} {item!r} is not a pair of integers; {SPAN_FORMAT}")
        start, end = item
        if not 0 <= start < end <= len(text):
            raise EmberError(f"{where}: span #{i} [{start}, {end}] is out of range for a text of "
                             f"{len(text)} characters (need 0 <= start < end <= {len(text)})")
        spans.append((start, end, i))
    spans.sort()
    for (s0, e0, i0), (s1, e1, i1) in zip(spans, spans[1:]):
        if s1 < e0:
            raise EmberError(f"{where}: spans #{i0} [{s0}, {e0}] and #{i1} [{s1}, {e1}] overlap; "
                             "merge them or drop one")
    return np.array([s[:2] for s in spans], dtype=np.int64).reshape(-1, 2)


def token_joins(tok_start: np.ndarray, tok_end: np.ndarray, span_start: np.ndarray,
                span_end: np.ndarray, sentence_first: np.ndarray) -> np.ndarray:
    """uint8 (N,) "joins the previous token's unit" flags.

    tok_start/tok_end (N,): token character ranges; span_start/span_end (k,): sorted,
    non-overlapping spans in the same coordinates; sentence_first (N,) bool: token starts a
    sentence. See the module docstring for the rule.
    """
    n = len(tok_start)
    if n == 0 or len(span_start) == 0:
        return np.zeros(n, dtype=np.uint8)
    end = np.maximum(tok_end, tok_start + 1)
    j = np.searchsorted(span_start, end, side="left") - 1  # (N,) last span starting before the token ends
    inside = (j >= 0) & (span_end[np.maximum(j, 0)] > tok_start)
    unit = np.where(inside, j, -1)
    joins = np.zeros(n, dtype=bool)
    joins[1:] = inside[1:] & (unit[1:] == unit[:-1])
    return (joins & ~sentence_first).astype(np.uint8)


class PhraseDetector:
    """Collocations and capitalised names from corpus statistics (see the module docstring).

    ``count(text)`` for each sample document, then ``finish()``, then ``spans(text)``.
    """

    def __init__(self, min_count: int = 5, threshold: float = 0.5, max_words: int = 6) -> None:
        if min_count < 1 or not -1 <= threshold <= 1 or max_words < 2:
            raise EmberError(f"phrase detector: need min_count >= 1, -1 <= threshold <= 1 and "
                             f"max_words >= 2 (got {min_count}, {threshold}, {max_words})")
        self.min_count, self.threshold, self.max_words = min_count, threshold, max_words
        self.vocab: dict[str, int] = {}  # lower-cased word -> id
        self._count: list[int] = []  # id -> occurrences
        self._capital: list[int] = []  # id -> occurrences starting with an upper-case letter
        self._pairs: list[np.ndarray] = []  # int64 keys a * 2**32 + b, compacted now and then
        self._pending = 0
        self.pair_keys = np.zeros(0, dtype=np.int64)
        self.pair_counts = np.zeros(0, dtype=np.int64)
        self.collocations: set[int] = set()
        self.name_like: np.ndarray | None = None  # bool per id, after finish()
        self.docs = 0

    def _id(self, word: str) -> int:
        key = word.lower()
        i = self.vocab.get(key)
        if i is None:
            i = self.vocab[key] = len(self._count)
            self._count.append(0)
            self._capital.append(0)
        return i

    def count(self, text: str) -> None:
        """Add one sample document's unigram, capitalisation and adjacent-pair counts."""
        self.docs += 1
        for group in GROUP_RE.finditer(text):
            words = WORD_RE.findall(group.group())
            ids = [self._id(w) for w in words]
            for w, i in zip(words, ids):
                self._count[i] += 1
                self._capital[i] += w[0].isupper()
            if len(ids) > 1:
                a = np.array(ids, dtype=np.int64)
                self._pairs.append((a[:-1] << 32) | a[1:])
                self._pending += len(ids) - 1
        if self._pending > 5_000_000:
            self._compact()

    def _compact(self) -> None:
        """Fold pending pair keys into (pair_keys, pair_counts): memory stays ~16 B/distinct pair."""
        if not self._pairs:
            return
        keys = np.concatenate([self.pair_keys, *self._pairs])
        weights = np.concatenate([self.pair_counts, np.ones(self._pending, dtype=np.int64)])
        self.pair_keys, inverse = np.unique(keys, return_inverse=True)
        self.pair_counts = np.bincount(inverse, weights=weights).astype(np.int64)
        self._pairs, self._pending = [], 0

    def finish(self) -> "PhraseDetector":
        """Pick the collocations and the name words from the counts."""
        self._compact()
        count = np.array(self._count, dtype=np.float64)
        capital = np.array(self._capital, dtype=np.float64)
        has_letter = np.array([any(c.isalpha() for c in w) for w in self.vocab], dtype=bool)
        self.name_like = capital >= 0.5 * count
        total_words, total_pairs = count.sum(), self.pair_counts.sum()
        keep = self.pair_counts >= self.min_count
        keys, pc = self.pair_keys[keep], self.pair_counts[keep].astype(np.float64)
        a, b = keys >> 32, keys & 0xFFFFFFFF
        p_ab = pc / max(total_pairs, 1)
        pmi = np.log(p_ab) - np.log(count[a] / total_words) - np.log(count[b] / total_words)
        with np.errstate(divide="ignore", invalid="ignore"):
            npmi = np.where(p_ab < 1, pmi / -np.log(p_ab), 1.0)
        good = (npmi >= self.threshold) & has_letter[a] & has_letter[b]
        self.collocations = set(keys[good].tolist())
        return self

    def _is_name(self, word: str) -> bool:
        if not word[0].isupper():
            return False
        i = self.vocab.get(word.lower())
        return i is None or bool(self.name_like[i])

    def spans(self, text: str) -> np.ndarray:
        """Phrase character spans of ``text``: int64 (k, 2), sorted, non-overlapping."""
        if self.name_like is None:
            raise RuntimeError("PhraseDetector.finish() must run before spans()")
        found: list[tuple[int, int]] = []
        for group in GROUP_RE.finditer(text):
            words = list(WORD_RE.finditer(text, group.start(), group.end()))
            if len(words) < 2:
                continue
            ids = [self.vocab.get(w.group().lower(), -1) for w in words]
            linked = [a >= 0 and b >= 0 and (a << 32 | b) in self.collocations
                      for a, b in zip(ids, ids[1:])]  # (n-1,) words i and i+1 form a collocation
            name = [self._is_name(w.group()) for w in words]
            # "Bank of England": a lower-case particle between two name words joins them.
            inner = [0 < i < len(words) - 1 and name[i - 1] and name[i + 1]
                     and words[i].group() in NAME_PARTICLES for i in range(len(words))]
            named = [x or y for x, y in zip(name, inner)]
            runs = _runs(linked) + _runs([x and y for x, y in zip(named, named[1:])])
            for s, e in runs:  # word range [s, e)
                if e - s <= self.max_words:
                    found.append((words[s].start(), words[e - 1].end()))
        return _merge(found)

    def summary(self) -> dict:
        """What was fitted, for meta.json."""
        return {"sample_docs": self.docs, "words": len(self.vocab), "min_count": self.min_count,
                "threshold": self.threshold, "max_words": self.max_words,
                "collocations": len(self.collocations)}


def _runs(links: list[bool]) -> list[tuple[int, int]]:
    """Word ranges [s, e) joined by consecutive True links (links[i]: word i ~ word i+1)."""
    runs, start = [], None
    for i, link in enumerate(links + [False]):
        if link and start is None:
            start = i
        elif not link and start is not None:
            runs.append((start, i + 1))
            start = None
    return runs


def _merge(spans: list[tuple[int, int]]) -> np.ndarray:
    """Sort spans and merge the overlapping ones: int64 (k, 2)."""
    merged: list[list[int]] = []
    for s, e in sorted(spans):
        if merged and s < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return np.array(merged, dtype=np.int64).reshape(-1, 2)


def fit_detector(texts, sample_docs: int, **options) -> PhraseDetector:
    """A ``PhraseDetector`` fitted on the first ``sample_docs`` of ``texts``."""
    detector = PhraseDetector(**options)
    for i, text in enumerate(texts):
        if i >= sample_docs:
            break
        detector.count(text)
    return detector.finish()


def phrase_source(phrases: str, reader: DocumentReader, inputs, fmt: str, text_field: str,
                  max_docs: int | None, min_count: int, threshold: float, sample_docs: int):
    """For ``ember prepare``: (Document -> int64 (k, 2) phrase spans, or None when
    ``phrases`` is "none"; the meta.json "phrases" entry, updated with counts by the caller).

    ``reader`` is the DocumentReader being prepared (its ``formats`` tell JSONL files); the
    detector is fitted on a second reader over the same inputs."""
    meta = {"source": phrases}
    if phrases == "none":
        return None, meta
    meta["joined_tokens"] = 0
    if phrases == "spans":
        def from_corpus(doc: Document) -> np.ndarray:
            if doc.spans is None and reader.formats.get(doc.source) != "jsonl":
                raise EmberError(f"{doc.source}: --phrases spans reads phrase spans from JSONL "
                                 'input ({"text": ..., "spans": [[start, end], ...]}); this file '
                                 f"is read as {reader.formats.get(doc.source)}; pass JSONL files or "
                                 "use --phrases detect")
            return parse_spans(doc.spans, doc.text, f"{doc.source}:{doc.line}")

        return from_corpus, meta
    if sample_docs <= 0:
        raise EmberError("phrase_sample_docs must be positive")
    limit = sample_docs if max_docs is None else min(sample_docs, max_docs)
    sample = (d.text for d in DocumentReader(inputs, fmt=fmt, text_field=text_field))
    detector = fit_detector(sample, limit, min_count=min_count, threshold=threshold)
    meta.update(detector.summary())
    return (lambda doc: detector.spans(doc.text)), meta
