"""A user's labelled file as rows of named fields: CSV, TSV, JSON Lines (and `datasets` folders).

Custom tasks (``ember.tasks.custom``) read their data through ``read_table``. Every row keeps
where it came from (``file:line``, the line where a CSV record starts), so any later complaint
about a cell names its place. Formats, chosen by the file's suffix:

* ``.csv`` - comma-separated with a header row; quoted fields may hold commas, doubled quotes
  and newlines (the way pandas, spreadsheets and ``datasets`` write CSV).
* ``.tsv`` / ``.tab`` - the same with tabs; a file whose quotes do not follow CSV's rules but
  whose lines all split into the header's number of fields is read as plain tab-separated text
  with its quotes kept (the GLUE files' layout: a sentence may start with an unmatched ").
* ``.jsonl`` / ``.ndjson`` / ``.json`` - one JSON object per line, or one JSON array of
  objects (the two layouts ``datasets``' ``load_dataset("json")`` reads); the keys are the columns.
* a folder written by ``datasets``' ``save_to_disk`` (``ember.tasks.readers.hf_datasets``).

Readers never skip a row: a malformed one is an ``EmberError`` naming ``file:line``.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from ember.errors import EmberError
from ember.tasks.readers.glue import _lines

# A CSV record longer than this is almost surely a quote that was never closed.
MAX_RECORD_CHARS = 20_000
FORMATS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}


@dataclass(frozen=True)
class Table:
    """Rows of one file: ``rows[i] = (where, {column: value})``; CSV/TSV values are strings,
    JSONL values whatever JSON holds."""

    source: str
    columns: tuple[str, ...]
    rows: list[tuple[str, dict]]


def table_format(path: str | Path) -> str:
    """csv, tsv, jsonl or datasets (a ``save_to_disk`` folder)."""
    path = Path(path)
    if path.is_dir():
        return "datasets"
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise EmberError(f"{path}: cannot tell the format from the suffix {path.suffix!r}; name the file "
                         ".csv, .tsv or .jsonl (or pass a folder saved with datasets' save_to_disk)")
    return fmt


def read_table(path: str | Path) -> Table:
    path = Path(path)
    if not path.exists():
        raise EmberError(f"file not found: {path}")
    fmt = table_format(path)
    if fmt == "datasets":
        from ember.tasks.readers.hf_datasets import read_dataset_folder

        return Table(str(path), *read_dataset_folder(path))
    if fmt == "jsonl":
        return _read_jsonl(path)
    records = csv_records(path, "," if fmt == "csv" else "\t")
    header_line, header = next(records, (1, None))
    if header is None:
        raise EmberError(f"{path}: file is empty")
    header = [h.strip() for h in header]
    dupes = sorted({h for h in header if header.count(h) > 1})
    if dupes or not all(header):
        raise EmberError(f"{path}:{header_line}: the header row {header} must name every column once "
                         f"(repeated: {dupes}, empty names: {header.count('')})")
    sep = "comma" if fmt == "csv" else "tab"
    rows = []
    for line, fields in records:
        if len(fields) != len(header):
            raise EmberError(f"{path}:{line}: expected {len(header)} {sep}-separated fields "
                             f"({', '.join(header)}), found {len(fields)}")
        rows.append((f"{path}:{line}", dict(zip(header, fields))))
    return Table(str(path), tuple(header), rows)


def _read_jsonl(path: Path) -> Table:
    lines = _lines(path)
    if lines[0].lstrip().startswith("["):  # one JSON array of objects (datasets' to_json(lines=False))
        return _read_json_array(path, "\n".join(lines))
    columns: dict[str, None] = {}
    rows = []
    for line, row in jsonl_objects(path, lines):
        columns.update(dict.fromkeys(row))
        rows.append((f"{path}:{line}", row))
    return Table(str(path), tuple(columns), rows)


def jsonl_objects(path: Path, lines: list[str] | None = None):
    """(line number, object) of each line of a JSON Lines file; anything else is an error."""
    for line, text in enumerate(_lines(path) if lines is None else lines, 1):
        if not text.strip():
            raise EmberError(f"{path}:{line}: blank line inside the file")
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            raise EmberError(f"{path}:{line}: not valid JSON ({exc.msg}); write one object per line") from None
        if not isinstance(row, dict):
            raise EmberError(f"{path}:{line}: expected a JSON object ({{\"text\": ..., \"label\": ...}}), "
                             f"got a JSON {type(row).__name__}")
        yield line, row


def _read_json_array(path: Path, text: str) -> Table:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EmberError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    columns: dict[str, None] = {}
    rows = []
    for i, row in enumerate(data):
        if not isinstance(row, dict):
            raise EmberError(f"{path}[{i}]: expected a JSON object, got a JSON {type(row).__name__}")
        columns.update(dict.fromkeys(row))
        rows.append((f"{path}[{i}]", row))
    return Table(str(path), tuple(columns), rows)


def csv_records(path: Path, delimiter: str = ","):
    """(start line, fields) of a delimited file whose quoted fields may span lines. Tab-separated
    text is read as quoted TSV when it is, else as plain tab-split lines when every line has the
    header's number of fields (``_plain_tab_records``); else the quoting error stands."""
    if delimiter != "\t":
        return _quoted_records(path, delimiter)
    try:
        return iter(list(_quoted_records(path, delimiter)))
    except EmberError:
        plain = _plain_tab_records(path)
        if plain is None:
            raise
        return iter(plain)


def _plain_tab_records(path: Path) -> list | None:
    """Lines split at tabs, quotes kept as text; None when the lines disagree on their number of fields."""
    records = [(n, line.split("\t") if line else []) for n, line in enumerate(_lines(path), 1)]
    widths = {len(fields) for _, fields in records if fields}
    return records if len(widths) == 1 else None


def _quoted_records(path: Path, delimiter: str):
    lines = _lines(path)  # strict UTF-8 with file:line errors; BOM, CRLF, trailing blanks handled
    reader = csv.reader((line + "\n" for line in lines), delimiter=delimiter, strict=True)
    while True:
        start = reader.line_num + 1
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            where = "" if reader.line_num == start else f" (the record starting at line {start})"
            raise EmberError(f"{path}:{reader.line_num}: bad CSV quoting{where}: {err}; a quote inside "
                             'a quoted text must be doubled ("")') from None
        if sum(map(len, fields)) > MAX_RECORD_CHARS:
            raise EmberError(f"{path}:{start}: a record of {reader.line_num - start + 1} lines and over "
                             f"{MAX_RECORD_CHARS} characters starts here; is a quote left unclosed?")
        yield start, fields


# -- cells ------------------------------------------------------------------------------------


def text_cell(row: dict, column: str, where: str) -> str:
    value = row.get(column)
    if not isinstance(value, str) or not value.strip():
        what = ("missing" if column not in row else "empty" if value is None or isinstance(value, str)
                else f"not text ({value!r})")
        raise EmberError(f"{where}: the {column!r} cell is {what}; every row needs a non-empty text")
    return value


def label_cell(row: dict, column: str, where: str) -> str | None:
    """The label as a string (JSON numbers and booleans as JSON writes them); None when absent."""
    value = row.get(column)
    if value is None:
        return None
    if isinstance(value, str):
        return value.strip() or None
    if isinstance(value, (bool, int, float)):
        return json.dumps(value)
    raise EmberError(f"{where}: the {column!r} cell holds a JSON {type(value).__name__}; a label is a "
                     "string or a number")


def pick_column(table: Table, given: str | None, candidates: tuple[str, ...], option: str,
                what: str) -> str:
    """``given`` if the table has it, else the first default name it has; else a message listing
    the table's columns."""
    if given:
        if given not in table.columns:
            raise EmberError(f"{table.source}: no column {given!r} ({option}); its columns are: "
                             f"{', '.join(table.columns) or '(none)'}")
        return given
    for name in candidates:
        if name in table.columns:
            return name
    raise EmberError(f"{table.source}: no {what} column among the usual names ({', '.join(candidates)}); "
                     f"its columns are: {', '.join(table.columns) or '(none)'}; name one with {option}")
