"""Real Wikipedia sentences holding a polysemous word, each labelled with a sense by a
transparent context rule (for benchmarks/studies/word_senses.py).

The rule, per word: two senses, each with a list of cue words. A sentence is a candidate if it
holds the word exactly once as a whole word in that exact form (case-insensitive; the plural
and other forms are left out so that every occurrence is the same word piece(s) at the input),
has 6-60 words, and contains none of the word's excluded phrases (fixed expressions of a third
sense, e.g. "West Bank", "blood bank"). It is labelled sense A if its other words include at
least one cue of A and no cue of B; sentences with cues of both senses or of neither are
dropped. Cues are whole lower-cased words, so "riverside" is not "river". The word capitalised
mid-sentence is part of a name (World Bank, Dogger Bank, Robert Plant, Lance Bass): dropped, as
names mix the senses (a sandbank and a lender are both "... Bank"). The rule is
deliberately simple so a reader can judge it: it labels the *context*, not the word, and will
mislabel a sentence whose cue belongs to another clause ("the bank financed a bridge over the
river" counts as both and is dropped; "a bank on the river front" with no cue is dropped too).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

from ember.errors import EmberError

# word -> (sense name, cue words), (sense name, cue words), excluded phrases
SENSES: dict[str, dict] = {
    "bank": {
        "senses": {
            "river": """river rivers stream streams creek brook shore shores shoreline water waters flood floods
                        flooded flooding canal lake lakes estuary tributary erosion mud sand swamp marsh bridge
                        ferry upstream downstream""",
            "finance": """money loan loans lending lender financial finance finances banking banker bankers credit
                          deposit deposits depositors investment investments account accounts savings mortgage
                          currency interest capital shares shareholders debt cash funds fund reserve monetary
                          central commercial assets bankruptcy""",
        },
        # proper names (capitalised: "the west bank of the Nile" stays) and fixed phrases of other senses
        "exclude": ["West Bank", "Left Bank", "South Bank", "food bank", "blood bank", "seed bank", "data bank",
                    "memory bank", "bank holiday", "bank shot", "gene bank", "sperm bank"],
    },
    "plant": {
        "senses": {
            "botany": """flower flowers flowering leaf leaves species seed seeds grow grows grown growing genus root
                         roots stem stems botanical garden gardens herb herbs shrub shrubs tree trees fruit fruits
                         cultivated perennial annual petals foliage soil bloom blooms""",
            "industry": """power factory factories nuclear manufacturing industrial electricity workers employees
                           steel coal gas facility assembly reactor reactors megawatts mw
                           refinery company automobile cars""",
        },
        # "to plant (trees)" is the verb, not either noun sense
        "exclude": ["to plant", "plant trees", "plant a tree"],
    },
    "bass": {
        "senses": {
            "music": """guitar guitars guitarist drums drummer vocals vocalist band bands album albums singer
                        keyboard keyboards keyboardist music musician song songs recorded recording tenor
                        baritone soprano choir clef amplifier lineup played plays""",
            "fish": """fish fishes fishing trout angler anglers anglers catch caught striped largemouth smallmouth
                       perch freshwater pike salmon carp walleye bluegill sunfish spawning bait""",
        },
        "exclude": ["bass drum", "drum and bass", "bass strait", "bass rock"],
    },
}

MIN_WORDS, MAX_WORDS = 6, 60
WORDS = re.compile(r"[a-z]+")


@dataclass(frozen=True)
class Occurrence:
    text: str  # the sentence as Wikipedia has it
    start: int  # character span of the word in it
    end: int
    sense: str
    where: str  # file:line where its article starts, so a reader can look the sentence up


def rule(word: str) -> dict:
    """The word's senses -> sorted cue words, and its excluded phrases."""
    if word not in SENSES:
        raise EmberError(f"no sense rule for {word!r}; words with a rule: {', '.join(SENSES)}")
    spec = SENSES[word]
    return {"senses": {name: sorted(set(cues.split())) for name, cues in spec["senses"].items()},
            "exclude": list(spec["exclude"])}


def label(sentence: str, word: str, rules: dict, named: bool = False) -> tuple[str | None, str]:
    """(sense or None, why): the context rule of the module docstring applied to one sentence;
    ``named``: the word is capitalised mid-sentence, a name, dropped."""
    if named:
        return None, "capitalised name"
    lower = sentence.lower()
    # an excluded phrase with a capital is a proper name, matched as written; others in any case
    if any(p in (sentence if p != p.lower() else lower) for p in rules["exclude"]):
        return None, "excluded phrase"
    words = set(WORDS.findall(lower)) - {word}
    hits = [name for name, cues in rules["senses"].items() if words & set(cues)]
    if len(hits) == 1:
        return hits[0], "labelled"
    return None, "both senses" if hits else "no cue"


def wiki_files(root: Path, max_files: int | None) -> list[Path]:
    files = sorted(root.glob("*/wiki_*.gz"))
    if not files:
        raise EmberError(f"no WikiExtractor files (*/wiki_*.gz) under {root}; set EMBER_DATA or pass --wiki")
    return files[:max_files] if max_files else files


def collect(word: str, files: list[Path]) -> tuple[list[Occurrence], dict]:
    """Every labelled occurrence in ``files`` (deduplicated sentences) and the counts of what was kept
    and dropped, by reason."""
    from ember.data.readers import iter_documents
    from ember.data.sentences import split_sentences

    rules = rule(word)
    pattern = re.compile(rf"\b{re.escape(word)}\b", re.IGNORECASE)
    counts = {"sentences with the word": 0, "not once, or in capitals": 0, "length": 0, "excluded phrase": 0, "capitalised name": 0,
              "both senses": 0, "no cue": 0, "duplicate": 0, "labelled": 0}
    seen: set[str] = set()
    found: list[Occurrence] = []
    for doc in iter_documents(files, fmt="wiki"):
        if not pattern.search(doc.text):
            continue
        where = f"{Path(doc.source).parent.name}/{Path(doc.source).name}:{doc.line}"
        for sentence in split_sentences(doc.text):
            matches = list(pattern.finditer(sentence))
            if not matches:
                continue
            counts["sentences with the word"] += 1
            if len(matches) != 1 or not matches[0].group(0).islower() and not matches[0].group(0).istitle():
                counts["not once, or in capitals"] += 1
                continue
            if not MIN_WORDS <= len(sentence.split()) <= MAX_WORDS:
                counts["length"] += 1
                continue
            named = matches[0].start() > 0 and matches[0].group(0).istitle()
            sense, why = label(sentence, word, rules, named)
            if sense is None:
                counts[why] += 1
                continue
            if sentence in seen:
                counts["duplicate"] += 1
                continue
            seen.add(sentence)
            counts["labelled"] += 1
            found.append(Occurrence(sentence, matches[0].start(), matches[0].end(), sense, where))
    return found, counts


def by_sense(found: list[Occurrence], word: str) -> dict[str, list[Occurrence]]:
    groups = {name: [] for name in SENSES[word]["senses"]}
    for occ in found:
        groups[occ.sense].append(occ)
    return groups


def balanced_sample(groups: dict[str, list[Occurrence]], per_sense: int, seed: int) -> list[Occurrence]:
    """``per_sense`` occurrences of each sense (fewer if a sense has fewer: all senses get the size
    of the smallest), drawn with ``seed``, in a seeded shuffled order."""
    n = min([per_sense] + [len(v) for v in groups.values()])
    if n < 2:
        sizes = ", ".join(f"{k} {len(v)}" for k, v in groups.items())
        raise EmberError(f"too few labelled sentences for a balanced sample ({sizes}); read more files")
    rng = random.Random(seed)
    sample = [occ for name in sorted(groups) for occ in rng.sample(groups[name], n)]
    rng.shuffle(sample)
    return sample
