"""WordNet 3.0 -> triples (``ember kg build --wordnet DIR``).

Reads the database files of WordNet 3.0 (Miller 1995; Fellbaum 1998), as Debian's
``wordnet-base`` installs them under /usr/share/wordnet: ``index.{noun,verb,adj,adv}`` (each
lemma with its synsets, most frequent sense first) and ``data.{noun,verb,adj,adv}`` (each
synset with its words and pointers; format in wndb(5WN)). Entities are lemmas, written in
lower case with spaces for WordNet's underscores ("domestic dog"), since sentences are
matched word by word; a synset is named by its first lemma. Relations (pointer symbols of
wninput(5WN)):

* ``synonym``: another lemma of the same synset;
* ``is_a``: ``@`` hypernym ("dog is_a canine");
* ``instance_of``: ``@i`` instance hypernym ("beijing instance_of national capital");
* ``part_of``: ``#p`` part holonym ("beijing part_of china").

Lemmas are ambiguous (WordNet's senses are merged under one name, as entity linking is not
done here), so each lemma's triples are written sense by sense in WordNet's frequency order,
first senses of every part of speech first: K-BERT's "at most k triples per entity" then
takes those of the commonest senses.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

from ember.errors import EmberError
from ember.knowledge.graph import Triple

POS_FILES = (("n", "noun"), ("v", "verb"), ("a", "adj"), ("r", "adv"))
# WordNet pointer symbol -> relation name; only semantic pointers (source/target 0000) count.
POINTERS = {"@i": "instance_of", "@": "is_a", "#p": "part_of"}
RELATIONS = ("instance_of", "is_a", "part_of", "synonym")  # per sense, written in this order
_ADJ_MARKER = re.compile(r"\((?:a|p|ip)\)$")  # syntactic markers on adjectives: "galore(ip)"


def lemma_name(word: str) -> str:
    """A WordNet word as an entity name: marker stripped, lower case, spaces for underscores."""
    return _ADJ_MARKER.sub("", word).replace("_", " ").lower()


def _database(folder: Path, kind: str, pos_name: str) -> Path:
    path = folder / f"{kind}.{pos_name}"
    if not path.is_file():
        raise EmberError(f"{path} not found: --wordnet wants the folder of WordNet 3.0's database files "
                         "(index.noun, data.noun, ...), e.g. /usr/share/wordnet after "
                         "`apt-get install wordnet-base`")
    return path


def read_synsets(path: Path, pos: str) -> dict[tuple[str, int], tuple[list[str], list[tuple[str, str, int]]]]:
    """(pos, offset) -> (lemma names, [(relation, target pos, target offset)]) of a data file."""
    synsets = {}
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.startswith("  "):  # the licence header
                continue
            try:
                fields = line.split(" | ", 1)[0].split()
                offset, w_cnt = int(fields[0]), int(fields[3], 16)
                words = [lemma_name(fields[4 + 2 * i]) for i in range(w_cnt)]
                at = 4 + 2 * w_cnt
                p_cnt = int(fields[at])
                pointers = []
                for i in range(p_cnt):
                    symbol, target, target_pos, source_target = fields[at + 1 + 4 * i: at + 5 + 4 * i]
                    if symbol in POINTERS and source_target == "0000":
                        pointers.append((POINTERS[symbol], "a" if target_pos == "s" else target_pos, int(target)))
            except (IndexError, ValueError):
                raise EmberError(f"{path}:{lineno}: not a WordNet 3.0 data line; is this the database folder?") from None
            synsets[(pos, offset)] = (words, pointers)
    return synsets


def read_index(path: Path, pos: str) -> list[tuple[str, list[tuple[str, int]]]]:
    """[(lemma, its synsets most frequent first)] of an index file."""
    out = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.startswith("  "):
                continue
            fields = line.split()
            try:
                p_cnt = int(fields[3])
                synset_cnt = int(fields[2])
                offsets = [int(o) for o in fields[6 + p_cnt: 6 + p_cnt + synset_cnt]]
            except (IndexError, ValueError):
                raise EmberError(f"{path}:{lineno}: not a WordNet 3.0 index line; is this the database folder?") from None
            out.append((lemma_name(fields[0]), [(pos, o) for o in offsets]))
    return out


def wordnet_triples(folder: str | Path, heads: Iterable[str] | None = None,
                    max_per_head: int = 0) -> list[Triple]:
    """WordNet's triples (see the module docstring); ``heads``: keep only these lemmas (a
    sample), ``max_per_head`` > 0: at most that many triples per lemma."""
    folder = Path(folder)
    synsets, senses = {}, {}
    for pos, name in POS_FILES:
        synsets.update(read_synsets(_database(folder, "data", name), pos))
        for lemma, offsets in read_index(_database(folder, "index", name), pos):
            senses.setdefault(lemma, []).append(offsets)
    keep = {lemma_name(h) for h in heads} if heads is not None else None
    triples: list[Triple] = []
    for lemma in sorted(senses):
        if keep is not None and lemma not in keep:
            continue
        # Sense rank first, then part of speech: every POS's commonest sense before any second sense.
        ranked = [o for rank in range(max(map(len, senses[lemma]))) for per_pos in senses[lemma]
                  if rank < len(per_pos) for o in [per_pos[rank]]]
        seen, mine = set(), []
        for key in ranked:
            words, pointers = synsets[key]
            tails = [(rel, synsets[(p, o)][0][0]) for rel in RELATIONS[:3] for rel2, p, o in pointers if rel2 == rel]
            tails += [("synonym", w) for w in words]
            for rel, tail in tails:
                if tail != lemma and (rel, tail) not in seen:
                    seen.add((rel, tail))
                    mine.append(Triple(lemma, rel, tail))
        triples.extend(mine[:max_per_head] if max_per_head else mine)
    return triples
