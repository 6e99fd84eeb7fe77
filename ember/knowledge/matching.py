"""Finding a knowledge graph's entities in a sentence: longest match over words.

K-BERT's knowledge layer first "selects all the entity names involved in a sentence" (Liu et
al. 2020, §3.2, K-Query); its released code segments the sentence with the entity names added
to the segmenter's dictionary, so a longer name wins over a shorter one inside it. Here the
sentence is a list of words and matching is greedy forward longest match: at each word, the
longest run of words (up to the longest entity name) that names an entity is taken and
matching continues after it; otherwise the next word is tried. So "new york city" matches as
one entity, not as "new york" then "city".

Matching is case-insensitive (names and words are lower-cased). A word that matches no name
is tried again in its base form ("films" -> "film", "visiting" -> "visit"): WordNet's morphy
detachment rules (wnintro(3WN), "morphy"), without its exception lists. Function words
("a", "it", "in", ...) are never matched: WordNet names a vitamin "a", a technology "it" and
an inch "in", and injecting those into every sentence is the knowledge noise K-BERT warns of
(§1, "too much knowledge incorporation may divert the sentence from its correct meaning").
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterable, NamedTuple

# Closed-class English words: articles, pronouns, auxiliaries, prepositions, conjunctions.
STOPWORDS = frozenset("""
a an the this that these those it its it's he him his she her hers they them their theirs we us our
ours you your yours i me my mine who whom whose which what where when why how there here
is are was were be been being am do does did done doing have has had having will would shall
should can could may might must ought 's 're 've 'd 'll n't not no nor
of in on at to from by with about as into onto upon over under up down out off for than then
and or but if so because while though although yet also too very just only
all any both each few more most other some such own same
one two three four five six seven eight nine ten
""".split())

# morphy's detachment rules (suffix, replacement) per part of speech, all tried in turn.
_RULES = (("s", ""), ("ses", "s"), ("xes", "x"), ("zes", "z"), ("ches", "ch"), ("shes", "sh"),
          ("men", "man"), ("ies", "y"), ("es", "e"), ("es", ""), ("ed", "e"), ("ed", ""),
          ("ing", "e"), ("ing", ""), ("er", ""), ("est", ""), ("er", "e"), ("est", "e"))


def normalize(text: str) -> tuple[str, ...]:
    """A name or a phrase as the tuple of its lower-cased words."""
    return tuple(text.lower().split())


@lru_cache(maxsize=1 << 16)
def base_forms(word: str) -> tuple[str, ...]:
    """Candidate base forms of a lower-cased word (morphy's detachment rules), longest first."""
    out = []
    for suffix, repl in _RULES:
        if word.endswith(suffix) and len(word) > len(suffix) + 1:
            out.append(word[: -len(suffix)] + repl)
    return tuple(sorted(set(out), key=lambda w: (-len(w), w)))


class Match(NamedTuple):
    start: int  # first word
    end: int  # one past the last word
    name: str  # the entity's name as the index knows it


class EntityIndex:
    """Entity names -> longest-match lookup over a sentence's words."""

    def __init__(self, names: Iterable[str], stopwords: frozenset[str] = STOPWORDS) -> None:
        self.names: dict[tuple[str, ...], str] = {}
        for name in names:
            key = normalize(name)
            if key and not (len(key) == 1 and (key[0] in stopwords or not any(c.isalpha() for c in key[0]))):
                self.names.setdefault(key, name)
        # Every proper prefix of a name: a run of words can only grow into a name through them.
        self.prefixes = {key[:j] for key in self.names for j in range(1, len(key))}
        self.stopwords = stopwords

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, name: str) -> bool:
        return normalize(name) in self.names

    def _lookup(self, words: tuple[str, ...]) -> str | None:
        name = self.names.get(words)
        if name is None and words[-1] not in self.stopwords:
            # The last word inflected ("new york cities" is rare; "films" is common).
            for base in base_forms(words[-1]):
                name = self.names.get(words[:-1] + (base,))
                if name is not None:
                    break
        return name

    def match(self, words: list[str]) -> list[Match]:
        """Non-overlapping entity mentions, left to right, each the longest at its start."""
        lower = [w.lower() for w in words]
        out, i = [], 0
        while i < len(lower):
            n_max = 1  # the longest run that can still be a name
            while i + n_max < len(lower) and tuple(lower[i: i + n_max]) in self.prefixes:
                n_max += 1
            for n in range(n_max, 0, -1):
                if n == 1 and lower[i] in self.stopwords:
                    continue
                name = self._lookup(tuple(lower[i: i + n]))
                if name is not None:
                    out.append(Match(i, i + n, name))
                    i += n
                    break
            else:
                i += 1
        return out
