"""Streaming document readers for raw corpora.

Inputs are files, folders (searched recursively, sorted, hidden entries skipped) or glob
patterns; each file may be plain, ``.gz`` or ``.bz2``. Three formats are understood:

- ``text``:  documents separated by blank lines; lines inside a document are kept as "\\n".
- ``lines``: one document per line (review corpora such as NSMC's unlabeled text, where a
  blank-line convention would turn a whole file into a single giant document).
- ``jsonl``: one JSON object per line, the text in ``text_field``. An optional ``spans``
  field (phrase/entity character spans for ``ember prepare --phrases spans``, see
  ``ember.data.phrases``) is passed through unchecked, with the text left unstripped so
  the offsets still point into it.
- ``wiki``:  WikiExtractor output, ``<doc id=.. url=.. title=..>`` … ``</doc>``; the first line
  inside a doc repeats the title and is dropped; paragraphs become lines joined by "\\n".

Files are read line by line (never whole) so memory stays flat for any corpus size. Bytes
are decoded per line ourselves, rather than through a text wrapper, so that a bad byte can be
reported with its file, line and byte offset.
"""

from __future__ import annotations

import bz2
import glob
import gzip
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterator

from ember.errors import EmberError

FORMATS = ("auto", "text", "lines", "jsonl", "wiki")


@dataclass(frozen=True)
class Document:
    """One document: its text, the file it came from and the 1-based line where it starts."""

    text: str
    source: str
    line: int
    spans: object = None  # JSONL "spans" value as read (validated by ember.data.phrases)


def _is_hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def expand_inputs(inputs: list[str | Path] | str | Path) -> list[Path]:
    """Resolve files, folders and glob patterns to a list of files, in a stable order.

    Each input must match at least one file; otherwise an EmberError names the input, so a
    typo never silently produces an empty corpus.
    """
    if isinstance(inputs, (str, Path)):
        inputs = [inputs]
    if not inputs:
        raise EmberError("no input files given")
    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_file():
            found = [path]
        elif path.is_dir():
            found = sorted(
                p for p in path.rglob("*") if p.is_file() and not _is_hidden(p, path)
            )
        elif glob.has_magic(str(item)):
            found = sorted(
                Path(p) for p in glob.glob(str(item), recursive=True) if os.path.isfile(p)
            )
        else:
            raise EmberError(f"input not found: {item} (not a file, folder or glob pattern)")
        if not found:
            raise EmberError(f"no input files matched {item!s}; check the path or pattern")
        files.extend(found)
    return files


class _LineSource:
    """Binary line iterator over a (possibly compressed) file that tracks positions.

    ``disk_pos`` is the position in the file on disk (compressed bytes), used for progress
    bars whose total is the on-disk size; ``text_bytes`` counts decompressed bytes.
    """

    def __init__(self, path: Path):
        self.path = path
        self._raw: IO[bytes] = open(path, "rb")
        suffix = path.suffix.lower()
        if suffix == ".gz":
            self._stream: IO[bytes] = gzip.GzipFile(fileobj=self._raw, mode="rb")
        elif suffix == ".bz2":
            self._stream = bz2.BZ2File(self._raw, mode="rb")
        else:
            self._stream = self._raw
        self.text_bytes = 0

    @property
    def disk_pos(self) -> int:
        return self._raw.tell()

    def lines(self) -> Iterator[tuple[int, str]]:
        """Yield (1-based line number, decoded line without its newline)."""
        try:
            for number, raw in enumerate(self._stream, start=1):
                offset = self.text_bytes
                self.text_bytes += len(raw)
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise EmberError(
                        f"{self.path}:{number}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at "
                        f"byte offset {offset + exc.start} of the decompressed file); "
                        "re-encode the file as UTF-8, e.g. `iconv -f latin1 -t utf-8`"
                    ) from None
                if number == 1 and line.startswith("\ufeff"):  # UTF-8 byte-order mark
                    line = line[1:]
                yield number, line.rstrip("\r\n")
        except (OSError, EOFError) as exc:  # truncated gzip, bad bz2 stream, ...
            raise EmberError(f"{self.path}: cannot read ({exc}); is the file complete?") from None

    def close(self) -> None:
        self._stream.close()
        self._raw.close()


def _strip_compression(name: str) -> str:
    lower = name.lower()
    for ext in (".gz", ".bz2"):
        if lower.endswith(ext):
            return lower[: -len(ext)]
    return lower


def detect_format(path: Path) -> str:
    """Guess a file's format: by extension (.jsonl/.json), else by its first non-empty line."""
    name = _strip_compression(path.name)
    if name.endswith((".jsonl", ".json", ".ndjson")):
        return "jsonl"
    source = _LineSource(path)
    try:
        for _, line in source.lines():
            stripped = line.strip()
            if not stripped:
                continue
            if stripped.startswith("<doc "):
                return "wiki"
            if stripped.startswith("{"):
                try:
                    if isinstance(json.loads(stripped), dict):
                        return "jsonl"
                except ValueError:
                    pass
            return "text"
    finally:
        source.close()
    return "text"  # an empty file: any reader yields nothing


def _read_text(src: _LineSource) -> Iterator[tuple[int, str]]:
    lines: list[str] = []
    start = 0
    for number, line in src.lines():
        if line.strip():
            if not lines:
                start = number
            lines.append(line.strip())
        elif lines:
            yield start, "\n".join(lines)
            lines = []
    if lines:
        yield start, "\n".join(lines)


def _read_lines(src: _LineSource) -> Iterator[tuple[int, str]]:
    for number, line in src.lines():
        yield number, line.strip()


def _read_jsonl(src: _LineSource, text_field: str) -> Iterator[tuple[int, str, object]]:
    for number, line in src.lines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise EmberError(f"{src.path}:{number}: malformed JSON line ({exc})") from None
        if not isinstance(obj, dict):
            raise EmberError(f"{src.path}:{number}: expected a JSON object, got {type(obj).__name__}")
        if text_field not in obj:
            keys = ", ".join(sorted(obj)[:10])
            raise EmberError(
                f"{src.path}:{number}: no field {text_field!r} in this JSON object "
                f"(fields: {keys}); choose the field with --text-field"
            )
        text = obj[text_field]
        if text is None:
            text = ""
        if not isinstance(text, str):
            raise EmberError(f"{src.path}:{number}: field {text_field!r} is not a string")
        spans = obj.get("spans")
        yield number, (text if spans is not None else text.strip()), spans


def _read_wiki(src: _LineSource) -> Iterator[tuple[int, str]]:
    start = 0  # line of the open <doc>, 0 when outside a doc
    paragraphs: list[str] = []
    title_pending = False
    for number, line in src.lines():
        stripped = line.strip()
        if stripped.startswith("<doc ") or stripped == "<doc>":
            if start:
                raise EmberError(
                    f"{src.path}:{start}: <doc> opened here is not closed before the next "
                    f"<doc> at line {number}"
                )
            start, paragraphs, title_pending = number, [], True
        elif stripped == "</doc>":
            if not start:
                raise EmberError(f"{src.path}:{number}: </doc> without a matching <doc>")
            yield start, "\n".join(paragraphs)
            start = 0
        elif not stripped:
            continue
        elif not start:
            raise EmberError(
                f"{src.path}:{number}: text outside <doc>…</doc>; is this WikiExtractor "
                "output? Pass --format text for plain text"
            )
        elif title_pending:  # WikiExtractor repeats the title as the first line
            title_pending = False
        else:
            paragraphs.append(stripped)
    if start:
        raise EmberError(f"{src.path}:{start}: <doc> opened here is never closed (file ends)")


class DocumentReader:
    """Iterate documents over many inputs while counting what was read.

    Attributes updated during iteration: ``files`` (resolved input files), ``documents``
    (non-empty documents yielded), ``empty_skipped``, ``text_bytes`` (decompressed bytes
    read), ``disk_bytes`` (on-disk bytes consumed; compare with ``disk_total``).
    """

    def __init__(self, inputs: list[str | Path] | str | Path, fmt: str = "auto",
                 text_field: str = "text"):
        if fmt not in FORMATS:
            raise EmberError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
        self.inputs = [str(i) for i in ([inputs] if isinstance(inputs, (str, Path)) else inputs)]
        self.files = expand_inputs(inputs)
        self.fmt = fmt
        self.text_field = text_field
        self.disk_total = sum(f.stat().st_size for f in self.files)
        self.documents = 0
        self.empty_skipped = 0
        self.text_bytes = 0
        self.disk_bytes = 0
        self.formats: dict[str, str] = {}  # file → format actually used

    def __iter__(self) -> Iterator[Document]:
        done_text = done_disk = 0
        for path in self.files:
            fmt = detect_format(path) if self.fmt == "auto" else self.fmt
            self.formats[str(path)] = fmt
            src = _LineSource(path)
            try:
                if fmt == "jsonl":
                    docs = _read_jsonl(src, self.text_field)
                elif fmt == "wiki":
                    docs = _read_wiki(src)
                elif fmt == "lines":
                    docs = _read_lines(src)
                else:
                    docs = _read_text(src)
                for line, text, *spans in docs:  # JSONL also yields its "spans" value
                    self.text_bytes = done_text + src.text_bytes
                    self.disk_bytes = done_disk + src.disk_pos
                    if not text.strip():
                        self.empty_skipped += 1
                        continue
                    self.documents += 1
                    yield Document(text, str(path), line, spans[0] if spans else None)
                done_text += src.text_bytes
                done_disk += path.stat().st_size
                self.text_bytes, self.disk_bytes = done_text, done_disk
            finally:
                src.close()

    def describe_inputs(self) -> str:
        """A short description of what was read, for error messages."""
        shown = ", ".join(str(f) for f in self.files[:5])
        more = f" and {len(self.files) - 5} more" if len(self.files) > 5 else ""
        return f"{len(self.files)} file(s): {shown}{more}"


def iter_documents(inputs: list[str | Path] | str | Path, fmt: str = "auto",
                   text_field: str = "text") -> Iterator[Document]:
    """Stream the non-empty documents of ``inputs`` (see the module docstring for formats)."""
    return iter(DocumentReader(inputs, fmt=fmt, text_field=text_field))
