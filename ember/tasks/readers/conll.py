"""CoNLL-2003 column files: one token per line, a blank line between sentences.

Layout (Tjong Kim Sang & De Meulder, 2003, §2): ``word POS chunk NER`` separated by single
spaces, ``-DOCSTART- -X- -X- O`` opening each Reuters article, and a blank line ending each
sentence. Document markers are not sentences and are skipped; repeated blank lines are fine.

The original release tags entities in IOB1 (``I-`` everywhere, ``B-`` only between two
adjacent entities of one type); the shared data here is already IOB2 (every entity starts
with ``B-``; checked: no ``I-X`` in it follows anything but ``B-X``/``I-X``). ``read_conll``
recognises an IOB1 file -- some entity opens with ``I-`` and no ``B-`` ever opens one after
``O`` -- and converts it to IOB2, so models always learn and predict IOB2.

Anything malformed (wrong column count, a tag outside the label set, bad encoding) is an
``EmberError`` naming ``file:line``; no line is silently skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ember import paths
from ember.errors import EmberError
from ember.tasks.readers.glue import _lines

# Entity types of CoNLL-2003; label ids follow the Hugging Face `datasets` order so results
# and exported heads line up with the usual checkpoints.
ENTITY_TYPES = ("PER", "ORG", "LOC", "MISC")
LABELS = ("O",) + tuple(f"{p}-{t}" for t in ENTITY_TYPES for p in ("B", "I"))
COLUMNS = ("word", "pos", "chunk", "ner")
FOLDER = "conll2003"
FILES = {"train": "train.txt", "dev": "dev.txt", "test": "test.txt"}


@dataclass(frozen=True)
class Sentence:
    guid: str
    words: tuple[str, ...]
    tags: tuple[str, ...] | None  # IOB2 NER tags, None when the file has no NER column
    pos: tuple[str, ...] = ()
    chunk: tuple[str, ...] = ()
    line: int = 0  # line number of the first word, for messages


def split_path(split: str) -> Path:
    if split not in FILES:
        raise EmberError(f"CoNLL-2003 has no split {split!r}; valid: {', '.join(FILES)}")
    root = paths.data_root()
    path = root / FOLDER / FILES[split]
    if not path.is_file():
        raise EmberError(f"CoNLL-2003 {split} is missing: ember expects it at <data root>/{FOLDER}/"
                         f"{FILES[split]}; the data root is $EMBER_DATA (now {root}). Set EMBER_DATA "
                         "to the folder holding conll2003/, or pass an explicit path.")
    return path


def read_conll(path: str | Path, limit: int | None = None, require_tags: bool = True,
               labels: tuple[str, ...] | None = LABELS, any_columns: bool = False) -> list[Sentence]:
    """Sentences of a CoNLL file; with ``require_tags=False`` one-column (word only) files work too.

    Columns: 4 (word POS chunk NER), 2 (word NER) or, without ``require_tags``, 1 (word);
    ``any_columns``: any number, the word first and the tag last (a user's own tag files).
    Every line of a file must have the same number of columns. ``labels=None`` takes any tag.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    path = Path(path)
    allowed = (4, 2) if require_tags else (4, 2, 1)
    sentences: list[Sentence] = []
    rows: list[tuple[int, list[str]]] = []
    n_columns = None

    def flush() -> None:
        if rows:
            words = tuple(r[1][0] for r in rows)
            tags = tuple(r[1][-1] for r in rows) if n_columns > 1 else None
            four = n_columns == 4
            sentences.append(Sentence(f"{path.stem}-{len(sentences)}", words, tags,
                                      tuple(r[1][1] for r in rows) if four else (),
                                      tuple(r[1][2] for r in rows) if four else (), rows[0][0]))
            rows.clear()

    for lineno, line in enumerate(_lines(path), start=1):
        if limit is not None and len(sentences) >= limit:
            break
        fields = line.split()
        if not fields:
            flush()
            continue
        if fields[0] == "-DOCSTART-":
            if rows:
                raise EmberError(f"{path}:{lineno}: -DOCSTART- inside a sentence; put a blank line before it")
            continue
        if n_columns is None:
            if len(fields) not in allowed and not (any_columns and len(fields) >= min(allowed)):
                raise EmberError(f"{path}:{lineno}: expected {' or '.join(map(str, allowed))} space-separated "
                                 f"columns ({' '.join(COLUMNS)}), found {len(fields)}")
            n_columns = len(fields)
        elif len(fields) != n_columns:
            raise EmberError(f"{path}:{lineno}: expected {n_columns} columns like the lines before, "
                             f"found {len(fields)}")
        if n_columns > 1 and labels is not None and fields[-1] not in labels:
            raise EmberError(f"{path}:{lineno}: NER tag {fields[-1]!r} is not a CoNLL-2003 label; "
                             f"valid: {', '.join(labels)}")
        rows.append((lineno, fields))
    if limit is None or len(sentences) < limit:
        flush()
    if not sentences:
        raise EmberError(f"{path}: no sentences (only -DOCSTART- lines or blank lines)")
    if sentences[0].tags is not None and is_iob1([s.tags for s in sentences]):
        sentences = [Sentence(s.guid, s.words, iob1_to_iob2(s.tags), s.pos, s.chunk, s.line)
                     for s in sentences]
    return sentences


def is_iob1(tag_seqs) -> bool:
    """True when entities open with ``I-`` and ``B-`` appears only between same-type neighbours."""
    opens_with_i = False
    for tags in tag_seqs:
        prev = "O"
        for tag in tags:
            if tag != "O" and prev[2:] != tag[2:]:  # an entity opens here
                if tag.startswith("B-"):
                    return False  # an IOB1 file never needs B- after O or another type
                opens_with_i = True
            prev = tag
    return opens_with_i


def iob1_to_iob2(tags) -> tuple[str, ...]:
    """I-X that opens an entity (after O, another type, or at the start) becomes B-X."""
    out, prev = [], "O"
    for tag in tags:
        if tag.startswith("I-") and prev[2:] != tag[2:]:
            tag = "B-" + tag[2:]
        out.append(tag)
        prev = tag
    return tuple(out)


def read_split(split: str, path: str | Path | None = None, limit: int | None = None) -> list[Sentence]:
    if path is None and split not in FILES and Path(split).is_file():
        # a split given as a file in CoNLL's layout (`ember finetune --task conll2003 --dev FILE`),
        # as GLUE's reader takes one
        path = split
    return read_conll(path if path is not None else split_path(split), limit=limit)
