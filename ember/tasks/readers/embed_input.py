"""Texts to embed, read from a file: one text per line (.txt and anything else), one JSON object
per line (.jsonl), or a TSV or CSV with a header (.tsv, .csv: quoted CSV fields may hold commas
and newlines, as ``ember.tasks.readers.table_files`` reads them).

The texts come back in file order, one per row, so row i of ``ember embed``'s output is the
i-th text. The column of a JSONL, TSV or CSV file is ``column`` if given, else ``text`` (TSV/CSV:
else ``sentence``, or the only column). Nothing is skipped: a blank line, a missing key or column,
an empty text or a malformed line is an ``EmberError`` naming ``file:line``.
"""

from __future__ import annotations

import json
from pathlib import Path

from ember.errors import EmberError

DEFAULT_COLUMNS = ("text", "sentence")


def read_texts(path: str | Path, column: str | None = None) -> list[str]:
    path = Path(path)
    if not path.is_file():
        raise EmberError(f"{path}: no such file; pass a .txt (one text per line), .jsonl, .tsv or .csv file")
    if not path.read_bytes().strip():
        raise EmberError(f"{path}:1: the file is empty; write one text per line (or a JSONL/TSV file of texts)")
    from ember.tasks.readers.glue import _lines  # strict UTF-8 with file:line errors; a BOM and CRLF are fine

    lines = _lines(path)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _jsonl(path, lines, column or "text")
    if suffix == ".tsv":
        return _tsv(path, lines, column)
    if suffix == ".csv":  # read as a table (a header line read as a text was the old behaviour)
        return _csv(path, column)
    if column:
        raise EmberError(f"--column {column!r} applies to .jsonl, .tsv and .csv files; {path} is read as plain text, "
                         "one text per line")
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            raise EmberError(f"{path}:{lineno}: blank line; write one text per line (row i of the output is "
                             "line i, so no line is skipped)")
    return lines


def _jsonl(path: Path, lines: list[str], key: str) -> list[str]:
    texts = []
    for lineno, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EmberError(f"{path}:{lineno}: not valid JSON ({exc.msg}); write one object per line, "
                             f'e.g. {{"{key}": "a fine film"}}') from None
        if not isinstance(row, dict):
            raise EmberError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
        if key not in row:
            raise EmberError(f"{path}:{lineno}: no {key!r} key (keys: {', '.join(sorted(row)) or 'none'}); "
                             "name the text's key with --column")
        texts.append(_text(row[key], path, lineno, key))
    return texts


def _tsv(path: Path, lines: list[str], column: str | None) -> list[str]:
    header = lines[0].split("\t")
    column = _text_column(path, header, column, rows=len(lines) - 1)
    index = header.index(column)
    texts = []
    for lineno, line in enumerate(lines[1:], 2):
        fields = line.split("\t")
        if len(fields) != len(header):
            raise EmberError(f"{path}:{lineno}: {len(fields)} tab-separated fields, the header has {len(header)}")
        texts.append(_text(fields[index], path, lineno, column))
    return texts


def _csv(path: Path, column: str | None) -> list[str]:
    from ember.tasks.readers.table_files import read_table

    table = read_table(path)
    column = _text_column(path, list(table.columns), column, rows=len(table.rows))
    return [_text(row[column], path, int(where.rsplit(":", 1)[1]), column) for where, row in table.rows]


def _text_column(path: Path, header: list[str], column: str | None, rows: int) -> str:
    """The column holding the texts: ``column``, else text / sentence / the only one."""
    if column is None:
        found = [c for c in DEFAULT_COLUMNS if c in header]
        column = found[0] if found else header[0] if len(header) == 1 else None
    if column is None or column not in header:
        wanted = repr(column) if column else "'text' or 'sentence'"
        raise EmberError(f"{path}:1: no {wanted} column in the header ({', '.join(header)}); the first line "
                         "names the columns; choose the text's column with --column")
    if not rows:
        raise EmberError(f"{path}:2: no rows after the header")
    return column


def _text(value, path: Path, lineno: int, name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise EmberError(f"{path}:{lineno}: {name!r} must be a non-empty string, got {value!r}")
    return value
