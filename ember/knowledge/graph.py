"""A knowledge graph as a triples file: one ``head<TAB>relation<TAB>tail`` per line.

The format K-BERT's knowledge graphs travel in (Liu et al. 2020, §4.1: CN-DBpedia, HowNet and
MedicalKG as subject-predicate-object triples) and the input TransE learns from (Bordes et al.
2013, §2: a training set of triplets (h, l, t)). UTF-8; blank lines and lines starting with
``#`` are skipped; every other line has exactly three non-empty tab-separated fields, and a
line that has not is refused with its file and line number. Entities are names (the words a
sentence must contain for the triple to be injected), relations are names too ("is_a",
"part_of"); K-BERT injects the relation's words and the tail's words after the head.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, NamedTuple

from ember.errors import EmberError


class Triple(NamedTuple):
    head: str
    relation: str
    tail: str


@dataclass
class KnowledgeGraph:
    """Triples in file order (the order K-BERT's "at most k per entity" takes them in)."""

    triples: list[Triple]
    source: str = ""  # where they were read from, for messages

    def relations(self) -> list[str]:
        """Relation names in order of first appearance."""
        return list(dict.fromkeys(t.relation for t in self.triples))

    def by_head(self) -> dict[str, list[Triple]]:
        """head -> its triples, in file order (heads as written; matching normalises them)."""
        out: dict[str, list[Triple]] = {}
        for t in self.triples:
            out.setdefault(t.head, []).append(t)
        return out

    def entities(self) -> list[str]:
        """Every head and tail, in order of first appearance (TransE's entity set)."""
        return list(dict.fromkeys(name for t in self.triples for name in (t.head, t.tail)))

    def __len__(self) -> int:
        return len(self.triples)


def _open_text(path: Path):
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def parse_relations(relations: str | Iterable[str] | None) -> list[str]:
    """A relation filter given as "a,b" or a list -> its names ([] = no filter)."""
    if relations is None:
        return []
    if isinstance(relations, str):
        relations = relations.split(",")
    return [r.strip() for r in relations if r and r.strip()]


def read_triples(path: str | Path, relations: str | Iterable[str] | None = None) -> KnowledgeGraph:
    """Read a triples file (plain or .gz), keeping only ``relations`` when a filter is given.

    A filter naming a relation the file does not have is refused (a typo would otherwise
    silently inject nothing), with the relations the file does have."""
    path = Path(path)
    if not path.is_file():
        raise EmberError(f"knowledge graph {path} not found; give a triples file (head<TAB>relation<TAB>tail "
                         "per line), e.g. one written by `ember kg build --wordnet /usr/share/wordnet`")
    wanted = parse_relations(relations)
    triples, seen = [], {}
    try:
        with _open_text(path) as fh:
            for lineno, line in enumerate(fh, 1):
                line = line.rstrip("\r\n")
                if not line.strip() or line.startswith("#"):
                    continue
                fields = line.split("\t")
                if len(fields) != 3 or not all(f.strip() for f in fields):
                    got = f"{len(fields)} field(s)" if len(fields) != 3 else "an empty field"
                    raise EmberError(f"{path}:{lineno}: expected head<TAB>relation<TAB>tail, got {got}: "
                                     f"{line[:80]!r}; fix or delete that line")
                head, relation, tail = (f.strip() for f in fields)
                seen.setdefault(relation, lineno)
                if not wanted or relation in wanted:
                    triples.append(Triple(head, relation, tail))
    except UnicodeDecodeError as exc:
        raise EmberError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8") from None
    except (OSError, EOFError) as exc:
        raise EmberError(f"{path}: cannot read ({exc})") from None
    unknown = [r for r in wanted if r not in seen]
    if unknown:
        have = ", ".join(f"{r} (first at line {n})" for r, n in seen.items()) or "none: the file has no triples"
        raise EmberError(f"relation filter names {', '.join(map(repr, unknown))}, which {path} does not have; "
                         f"its relations: {have}")
    if not triples:
        raise EmberError(f"{path} has no triples{' of ' + ', '.join(wanted) if wanted else ''}; a knowledge "
                         "graph needs at least one head<TAB>relation<TAB>tail line")
    return KnowledgeGraph(triples, str(path))


def format_triples(triples: Iterable[Triple]) -> str:
    """The file text of ``triples`` (tabs and newlines inside a name are not representable)."""
    lines = []
    for t in triples:
        if any("\t" in f or "\n" in f or not f.strip() for f in t):
            raise EmberError(f"triple {tuple(t)!r} has an empty field or a tab/newline inside a name")
        lines.append("\t".join(t))
    return "\n".join(lines) + "\n"


def write_triples(path: str | Path, triples: Iterable[Triple]) -> None:
    """Write a triples file atomically (never half-written)."""
    from ember.fileio import atomic_write_text

    atomic_write_text(Path(path), format_triples(triples))
