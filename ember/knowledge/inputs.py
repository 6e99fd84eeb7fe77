"""Text + a knowledge graph -> model inputs, for any tokenizer.json.

Two ways of putting knowledge into an encoder, usable alone or together:

* **K-BERT** (Liu et al. 2020, ``ember.knowledge.kbert``): up to k triples of each entity
  found in the sentence are injected as token branches; the features get ``position_ids``
  (soft positions) and ``visible`` (the (n, n) visible matrix the encoder takes as its
  attention mask);
* **ERNIE** (Zhang et al. 2019, §3.1 and §4.2): each entity mention is aligned to its first
  token; the features get ``entity_ids`` (n,), the entity's row in the entity embedding table
  at that token and -1 elsewhere (``ember.knowledge.ernie`` fuses them into the top layers).

The sentence is encoded with the tokenizer's own template ([CLS] a [SEP] b [SEP], <s> a </s>
...), truncated to ``max_length`` first; words are read back from the encoding (word ids and
offsets), so entity matching sees the words the tokenizer saw. Branches are then added while
they fit in ``max_length``: knowledge never pushes the sentence's own words out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from tokenizers import Tokenizer

from ember.errors import EmberError
from ember.knowledge.graph import KnowledgeGraph, Triple
from ember.knowledge.kbert import Mention, flatten_tree
from ember.knowledge.matching import EntityIndex, normalize

IGNORE = -1  # entity_ids where no entity is aligned


def relation_words(relation: str) -> list[str]:
    """A relation name as injected words: "is_a" -> ["is", "a"]."""
    return relation.replace("_", " ").split()


class KnowledgeBase:
    """A graph's triples by head, for K-Inject: at most ``k`` branches per entity (§3.2: "at
    most k triples", the first k in the graph's order; the released code's max_entities = 2)."""

    def __init__(self, graph: KnowledgeGraph, k: int = 2) -> None:
        if k < 1:
            raise EmberError(f"K-BERT injects at most k triples per entity; k={k} must be at least 1")
        self.k, self.graph = k, graph
        self.triples: dict[tuple[str, ...], list[Triple]] = {}
        for t in graph.triples:
            mine = self.triples.setdefault(normalize(t.head), [])
            if len(mine) < k:
                mine.append(t)
        self.index = EntityIndex(graph.by_head())

    def branches(self, name: str) -> list[list[str]]:
        """The words of each branch of entity ``name``: relation words + tail words."""
        return [relation_words(t.relation) + t.tail.split() for t in self.triples.get(normalize(name), [])]


@dataclass
class KnowledgeStats:
    """What the knowledge did to a set of sentences (for the log and results.json)."""

    sentences: int = 0
    with_knowledge: int = 0  # sentences with at least one injected token or aligned entity
    injected_tokens: int = 0
    branches: int = 0
    dropped_branches: int = 0  # did not fit max_length
    entities: int = 0  # ERNIE: aligned mentions

    def since(self, earlier: "KnowledgeStats") -> "KnowledgeStats":
        """What was counted after ``earlier`` (a copy taken before)."""
        return KnowledgeStats(*(getattr(self, f) - getattr(earlier, f) for f in
                                ("sentences", "with_knowledge", "injected_tokens", "branches", "dropped_branches",
                                 "entities")))

    def line(self) -> str:
        n = max(self.sentences, 1)
        parts = [f"{self.with_knowledge}/{self.sentences} sentences with knowledge"]
        if self.branches or self.dropped_branches:
            parts.append(f"{self.branches / n:.2f} triples and {self.injected_tokens / n:.1f} tokens injected "
                         f"per sentence, {self.dropped_branches} triples left out for length")
        if self.entities:
            parts.append(f"{self.entities / n:.2f} aligned entities per sentence")
        return "; ".join(parts)


class KnowledgeInputs:
    """Featurizes text with a K-BERT graph (``base``) and/or an ERNIE entity vocabulary."""

    def __init__(self, tokenizer: Tokenizer, base: KnowledgeBase | None = None,
                 entities: Sequence[str] | None = None) -> None:
        if base is None and entities is None:
            raise ValueError("KnowledgeInputs needs a knowledge base, an entity vocabulary or both")
        self.base = base
        self.entity_index = EntityIndex(entities) if entities is not None else None
        self.entity_row = {normalize(name): row for row, name in enumerate(entities or [])}
        self._tokenizer = Tokenizer.from_str(tokenizer.to_str())  # private copy: own truncation
        self._tokenizer.no_padding()
        self._max_length = None
        self._branch_ids: dict[tuple[str, ...], list[int]] = {}
        self.stats = KnowledgeStats()

    def _tok(self, max_length: int) -> Tokenizer:
        if self._max_length != max_length:
            for pair in (False, True):
                if max_length <= self._tokenizer.num_special_tokens_to_add(pair) + 1:
                    raise EmberError(f"max_length={max_length} leaves no room for text after the "
                                     "tokenizer's special tokens")
            self._tokenizer.enable_truncation(max_length)
            self._max_length = max_length
        return self._tokenizer

    def _piece_ids(self, words: list[str]) -> list[int]:
        key = tuple(words)
        if key not in self._branch_ids:
            enc = self._tokenizer.encode(words, is_pretokenized=True, add_special_tokens=False)
            self._branch_ids[key] = enc.ids
        return self._branch_ids[key]

    def encode_text(self, text_a: str, text_b: str | None, max_length: int) -> dict:
        """A sentence (pair) of raw text -> features (see the module docstring)."""
        enc = self._tok(max_length).encode(text_a, text_b)
        return self._featurize(enc, self._words(enc, texts=(text_a, text_b)), max_length)

    def encode_words(self, words: Sequence[str], max_length: int) -> dict:
        """Pre-split words (a tagging sentence) -> features, with ``word_starts`` (hard positions)."""
        enc = self._tok(max_length).encode(list(words), is_pretokenized=True)
        return self._featurize(enc, self._words(enc, words=words), max_length)

    def _featurize(self, enc, sequences: dict, max_length: int) -> dict:
        kbert_mentions, entity_at = [], {}
        for seq, (words, token_spans) in sequences.items():
            if self.base is not None:
                for m in self.base.index.match(words):
                    span = _token_span(token_spans, m.start, m.end)
                    if span is not None:
                        ids = [self._piece_ids(b) for b in self.base.branches(m.name)]
                        kbert_mentions.append(Mention(span[0], span[1], ids))
            if self.entity_index is not None:
                for m in self.entity_index.match(words):
                    span = _token_span(token_spans, m.start, m.end)
                    if span is not None:
                        entity_at[span[0]] = self.entity_row[normalize(m.name)]
        kbert_mentions.sort(key=lambda m: m.start)
        flat = flatten_tree(list(range(len(enc.ids))), kbert_mentions, max_length)
        ids, types = [], []
        for token, source_index in zip(flat.tokens, flat.source):
            if source_index >= 0:
                ids.append(enc.ids[token])
                types.append(enc.type_ids[token])
            else:  # an injected token: its entity's segment
                ids.append(token)
                types.append(types[-1])
        feature = {"input_ids": ids, "token_type_ids": types}
        if self.base is not None:
            feature["position_ids"] = flat.soft_positions
            feature["visible"] = flat.visible
        hard = {s: h for h, s in enumerate(flat.source) if s >= 0}  # sentence token -> hard position
        if self.entity_index is not None:
            feature["entity_ids"] = [IGNORE] * len(ids)
            for token, row in entity_at.items():
                feature["entity_ids"][hard[token]] = row
        # Where each word of the first sequence starts (hard position), -1 when truncated away.
        feature["word_starts"] = [hard[span[0]] if span else -1 for span in sequences.get(0, ([], []))[1]]
        feature["truncated"] = bool(enc.overflowing)
        self._count(flat, len(entity_at))
        return feature

    @staticmethod
    def _words(enc, texts: tuple | None = None, words: Sequence[str] | None = None) -> dict:
        """sequence -> (its words, each word's token span [first, last + 1), None if cut off).

        Words are the tokenizer's own: pre-split ``words`` as given, raw ``texts`` cut at the
        offsets of each word's tokens."""
        out: dict[int, tuple[list[str], list]] = {}
        for t, (seq, w) in enumerate(zip(enc.sequence_ids, enc.word_ids)):
            if seq is None or w is None:
                continue
            found, spans = out.setdefault(seq, ([], []))
            while len(spans) <= w:
                spans.append(None)
                found.append("")
            spans[w] = (spans[w][0] if spans[w] else t, t + 1)
            if texts is not None:
                found[w] = texts[seq][enc.offsets[spans[w][0]][0]: enc.offsets[t][1]]
        if words is not None:
            found, spans = out.setdefault(0, ([], []))
            spans.extend([None] * (len(words) - len(spans)))  # words truncated away entirely
            found[:] = list(words)
        return out

    def _count(self, flat, n_entities: int) -> None:
        s = self.stats
        s.sentences += 1
        s.injected_tokens += flat.injected
        s.branches += len(set(b for b in flat.branch if b))
        s.dropped_branches += flat.dropped
        s.entities += n_entities
        s.with_knowledge += bool(flat.injected or n_entities)


def _token_span(token_spans: list, start: int, end: int) -> tuple[int, int] | None:
    """Token range of words [start, end), or None when a word of it was cut off."""
    spans = token_spans[start:end]
    if len(spans) < end - start or any(s is None for s in spans):
        return None
    return spans[0][0], spans[-1][1]
