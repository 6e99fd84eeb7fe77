"""Memory-mapped token shards: the on-disk corpus format pre-training reads.

A prepared directory holds::

    tokenizer.json          copy of the tokenizer used (its sha256 is in meta.json)
    meta.json               format version, dtype, special token ids, per-split counts/shards
    train/ valid/           one folder per split, each with shards numbered from 0:
      shard_00000.tokens.bin     token ids, raw little-endian uint16 (uint32 if vocab > 65535)
      shard_00000.sentences.bin  int64 (S,): end offset (exclusive) of each sentence in tokens
      shard_00000.docs.bin       int64 (D,): end index (exclusive) of each doc in sentences
      shard_00000.joins.bin      optional, uint8 (N,) aligned with tokens: 1 = this token joins
                                 the previous token's phrase/entity unit (written by
                                 ``ember prepare --phrases``; meta.json "phrases" says how)

Offsets are local to the shard. Documents never cross shards, so a document's tokens are
one contiguous slice of one memmap. Raw ``.bin`` files (not ``.npy``) so the writer can
append incrementally and memory stays flat however large the corpus is.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ember.errors import EmberError

FORMAT_NAME = "ember-token-shards"
FORMAT_VERSION = 1
SPLITS = ("train", "valid")
_FILE_BUFFER = 1 << 20  # 1 MiB per open shard file; large writes, small fixed RAM


def refuse_token_shards(path: str | Path, who: str, example: str) -> None:
    """For objectives that read raw text (ELMo's words, ERNIE's entity sentences): a folder from
    `ember prepare` is the natural mistake (every other recipe wants one); say so, instead of
    reading its meta.json as a line of text."""
    meta = Path(path) / "meta.json"
    try:
        prepared = meta.is_file() and json.loads(meta.read_text()).get("format") == FORMAT_NAME
    except (OSError, ValueError):
        prepared = False
    if prepared:
        raise EmberError(f"{path} holds token shards from `ember prepare`, but {who} reads raw text: pass the "
                         f"text itself (a text/wiki file, folder or glob), e.g. --data {example}")


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 halves disk and page-cache use for every vocabulary of the BERT era."""
    return np.dtype(np.uint16) if vocab_size <= 65535 else np.dtype(np.uint32)


def shard_files(index: int, joins: bool = False) -> dict[str, str]:
    stem = f"shard_{index:05d}"
    files = {
        "tokens": f"{stem}.tokens.bin",
        "sentences": f"{stem}.sentences.bin",
        "docs": f"{stem}.docs.bin",
    }
    if joins:
        files["joins"] = f"{stem}.joins.bin"
    return files


class ShardWriter:
    """Append documents to the shards of one split, rotating at ``shard_tokens``.

    Batches of documents go straight to buffered files (one write per file per batch), so
    the writer holds no corpus data beyond the OS file buffers. With ``joins=True`` every
    batch also carries per-token phrase flags, written to ``*.joins.bin``.
    """

    def __init__(self, directory: str | Path, dtype: np.dtype, shard_tokens: int, joins: bool = False):
        if shard_tokens <= 0:
            raise EmberError("shard_tokens must be positive")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.dtype = np.dtype(dtype)
        self.shard_tokens = shard_tokens
        self.joins = joins
        self.shards: list[dict] = []  # finished shards' meta entries
        self.num_docs = self.num_sentences = self.num_tokens = 0
        self._files: dict | None = None
        self._tokens = self._sentences = self._docs = 0  # counts in the open shard
        self._last_doc: tuple[int, int] | None = None  # (tokens, sentences) of the last doc

    def _open_shard(self) -> None:
        self._names = shard_files(len(self.shards), self.joins)
        # w+b so that pop_last_document can read back and truncate.
        self._files = {key: open(self.directory / name, "w+b", buffering=_FILE_BUFFER)
                       for key, name in self._names.items()}
        self._tokens = self._sentences = self._docs = 0

    def _close_shard(self) -> None:
        if self._files is None:
            return
        for f in self._files.values():
            f.close()
        if self._docs == 0:  # emptied by pop_last_document
            for name in self._names.values():
                (self.directory / name).unlink()
        else:
            self.shards.append({"files": self._names, "num_docs": self._docs,
                                "num_sentences": self._sentences, "num_tokens": self._tokens})
        self._files = None

    def add_documents(self, tokens: np.ndarray, sentence_lengths: np.ndarray,
                      doc_sentences: np.ndarray, joins: np.ndarray | None = None) -> None:
        """Write a batch of documents.

        tokens: (N,) ids of all documents, concatenated.
        sentence_lengths: (S,) int64 tokens per sentence, all > 0, summing to N.
        doc_sentences: (D,) int64 sentences per document, all > 0, summing to S.
        joins: (N,) phrase flags, given exactly when the writer was made with ``joins=True``.
        """
        if (joins is not None) != self.joins:
            raise ValueError("phrase flags must be given exactly when the writer stores them")
        if len(doc_sentences) == 0:
            return
        sent_ends = np.cumsum(sentence_lengths, dtype=np.int64)  # (S,) batch-local
        doc_sent_ends = np.cumsum(doc_sentences, dtype=np.int64)  # (D,)
        doc_tok_ends = sent_ends[doc_sent_ends - 1]  # (D,)
        d0 = 0
        while d0 < len(doc_sentences):
            tok0 = int(doc_tok_ends[d0 - 1]) if d0 else 0
            sent0 = int(doc_sent_ends[d0 - 1]) if d0 else 0
            first_doc = int(doc_tok_ends[d0]) - tok0
            if self._files is not None and self._tokens and self._tokens + first_doc > self.shard_tokens:
                self._close_shard()
            if self._files is None:
                self._open_shard()
            # Documents d0..d1-1 fit in the open shard (at least one: a document longer than
            # shard_tokens gets a shard of its own; documents never cross shards).
            room = self.shard_tokens - self._tokens
            d1 = max(d0 + 1, int(np.searchsorted(doc_tok_ends, tok0 + room, side="right")))
            tok1, sent1 = int(doc_tok_ends[d1 - 1]), int(doc_sent_ends[d1 - 1])
            f = self._files
            f["tokens"].write(np.ascontiguousarray(tokens[tok0:tok1], dtype=self.dtype).tobytes())
            ends = sent_ends[sent0:sent1] - tok0 + self._tokens
            f["sentences"].write(ends.astype("<i8", copy=False).tobytes())
            docs = doc_sent_ends[d0:d1] - sent0 + self._sentences
            f["docs"].write(docs.astype("<i8", copy=False).tobytes())
            if joins is not None:
                f["joins"].write(np.ascontiguousarray(joins[tok0:tok1], dtype=np.uint8).tobytes())
            self._tokens += tok1 - tok0
            self._sentences += sent1 - sent0
            self._docs += d1 - d0
            self.num_tokens += tok1 - tok0
            self.num_sentences += sent1 - sent0
            self.num_docs += d1 - d0
            last_tok0 = int(doc_tok_ends[d1 - 2]) if d1 >= 2 else 0
            last_sent0 = int(doc_sent_ends[d1 - 2]) if d1 >= 2 else 0
            self._last_doc = (tok1 - last_tok0, sent1 - last_sent0)
            d0 = d1

    def add_document(self, ids: np.ndarray, sentence_ends: np.ndarray,
                     joins: np.ndarray | None = None) -> None:
        """Write one document: ids (n,), sentence_ends (S,) exclusive ends within ids."""
        lengths = np.diff(np.asarray(sentence_ends, dtype=np.int64), prepend=0)
        if len(lengths):
            self.add_documents(ids, lengths, np.array([len(lengths)], dtype=np.int64), joins)

    def pop_last_document(self, with_joins: bool = False) -> tuple[np.ndarray, ...]:
        """Remove the most recently written document; return its (ids, sentence_ends), plus
        its phrase flags (or None) when ``with_joins``."""
        if self._files is None or self._last_doc is None or self._docs == 0:
            raise EmberError("no document to take back from the open shard")
        n_tok, n_sent = self._last_doc
        out = {}
        parts = [("tokens", n_tok, self.dtype), ("sentences", n_sent, "<i8"), ("docs", 1, "<i8")]
        if self.joins:
            parts.append(("joins", n_tok, np.uint8))
        for key, count, dtype in parts:
            f, nbytes = self._files[key], count * np.dtype(dtype).itemsize
            f.flush()
            f.seek(-nbytes, 2)
            out[key] = np.frombuffer(f.read(nbytes), dtype=dtype)
            f.seek(-nbytes, 2)
            f.truncate()
        self._tokens -= n_tok
        self._sentences -= n_sent
        self._docs -= 1
        self.num_tokens -= n_tok
        self.num_sentences -= n_sent
        self.num_docs -= 1
        self._last_doc = None  # only one step back is supported
        doc = (out["tokens"].astype(np.int64), out["sentences"] - self._tokens)
        return doc + (out.get("joins"),) if with_joins else doc

    def close(self) -> dict:
        """Finish the last shard; return this split's meta entry."""
        self._close_shard()
        return {
            "num_docs": self.num_docs,
            "num_sentences": self.num_sentences,
            "num_tokens": self.num_tokens,
            "shards": self.shards,
        }


def _read_meta(prepared_dir: Path) -> dict:
    meta_path = prepared_dir / "meta.json"
    if not meta_path.is_file():
        raise EmberError(
            f"{prepared_dir} is not a prepared corpus (no meta.json); "
            "create one with `ember prepare`"
        )
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise EmberError(f"{meta_path}: corrupt meta.json ({exc}); re-run `ember prepare`") from None
    if meta.get("format") != FORMAT_NAME or meta.get("format_version") != FORMAT_VERSION:
        raise EmberError(
            f"{meta_path}: format {meta.get('format')!r} version {meta.get('format_version')!r} "
            f"is not {FORMAT_NAME!r} version {FORMAT_VERSION}; re-run `ember prepare`"
        )
    return meta


def _memmap(path: Path, dtype: np.dtype, count: int) -> np.ndarray:
    """Read-only memmap of ``count`` items, checking the file size first."""
    if not path.is_file():
        raise EmberError(f"missing shard file {path}; re-run `ember prepare`")
    expected = count * dtype.itemsize
    size = path.stat().st_size
    if size != expected:
        raise EmberError(
            f"{path}: {size} bytes but meta.json says {count} items ({expected} bytes); "
            "the prepared corpus is incomplete or mismatched, re-run `ember prepare`"
        )
    if count == 0:  # mmap cannot map an empty file
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,))


class TokenCorpus:
    """Read one split of a prepared directory through memmaps.

    Global sentence ids run over all shards of the split in order; doc ``d`` owns global
    sentences ``[doc_offsets[d], doc_offsets[d+1])``. Opening maps the files and builds
    only per-document offsets; per-sentence arrays are computed on first use.
    """

    def __init__(self, prepared_dir: str | Path, split: str = "train"):
        self.prepared_dir = Path(prepared_dir)
        if not self.prepared_dir.is_dir():
            raise EmberError(f"prepared corpus not found: {self.prepared_dir}")
        self.meta = _read_meta(self.prepared_dir)
        splits = self.meta.get("splits", {})
        if split not in splits:
            raise EmberError(
                f"{self.prepared_dir} has no split {split!r} (has: {', '.join(splits)})"
            )
        self.split = split
        self.tokenizer_path = self.prepared_dir / "tokenizer.json"
        if not self.tokenizer_path.is_file():
            raise EmberError(f"{self.tokenizer_path} is missing; re-run `ember prepare`")
        self.dtype = np.dtype(self.meta["dtype"])
        info = splits[split]
        directory = self.prepared_dir / split
        self._tokens: list[np.ndarray] = []
        self._joins: list[np.ndarray] = []  # per shard, uint8 (N_k,) phrase flags, if stored
        self._sent_ends: list[np.ndarray] = []  # per shard, int64 (S_k,)
        self._sent_files: list[tuple[Path, int]] = []  # per shard, (sentences.bin, S_k)
        doc_parts = [np.zeros(1, dtype=np.int64)]
        sentence_starts = [0]  # global id of each shard's first sentence
        i64 = np.dtype("<i8")
        for shard in info["shards"]:
            files = shard["files"]
            self._tokens.append(_memmap(directory / files["tokens"], self.dtype, shard["num_tokens"]))
            if "joins" in files:
                self._joins.append(_memmap(directory / files["joins"], np.dtype(np.uint8), shard["num_tokens"]))
            self._sent_ends.append(_memmap(directory / files["sentences"], i64, shard["num_sentences"]))
            self._sent_files.append((directory / files["sentences"], shard["num_sentences"]))
            docs = _memmap(directory / files["docs"], i64, shard["num_docs"])
            doc_parts.append(np.asarray(docs, dtype=np.int64) + sentence_starts[-1])
            sentence_starts.append(sentence_starts[-1] + shard["num_sentences"])
        self._shard_starts = np.array(sentence_starts, dtype=np.int64)  # (K+1,)
        self.doc_offsets = np.concatenate(doc_parts)  # int64 (num_docs+1,)
        self.num_docs = int(info["num_docs"])
        self.num_sentences = int(info["num_sentences"])
        self.num_tokens = int(info["num_tokens"])
        if self.doc_offsets.shape[0] != self.num_docs + 1 or sentence_starts[-1] != self.num_sentences:
            raise EmberError(f"{self.prepared_dir}/meta.json: split {split!r} counts do not "
                             "match its shards; re-run `ember prepare`")
        if self._joins and len(self._joins) != len(self._tokens):
            raise EmberError(f"{self.prepared_dir}/meta.json: split {split!r} has phrase flags for "
                             "only some shards; re-run `ember prepare`")
        self._lengths: np.ndarray | None = None

    @property
    def has_joins(self) -> bool:
        """True when the corpus stores phrase/entity flags (``ember prepare --phrases``)."""
        return bool(self._joins)

    @property
    def phrases(self) -> dict:
        """How the phrase flags were made (meta.json "phrases"); {"source": "none"} without."""
        return dict(self.meta.get("phrases") or {"source": "none"})

    @property
    def special_token_ids(self) -> dict[str, int]:
        return dict(self.meta["special_token_ids"])

    @property
    def vocab_size(self) -> int:
        return int(self.meta["tokenizer"]["vocab_size"])

    @property
    def sentence_lengths(self) -> np.ndarray:
        """int64 (num_sentences,): tokens per global sentence (computed once, 8 B/sentence)."""
        if self._lengths is None:
            # Read in blocks into the one output array, not through the memmaps: mapped pages
            # stay resident (and count in RSS) long after they are read, and a concatenation
            # of per-shard diffs would hold the lengths twice (benchmarks/speed/index_memory.py).
            lengths = np.empty(self.num_sentences, dtype=np.int64)
            pos, block = 0, 1 << 22
            for path, count in self._sent_files:
                previous = 0
                with open(path, "rb") as fh:
                    for done in range(0, count, block):
                        ends = np.fromfile(fh, dtype="<i8", count=min(block, count - done))
                        lengths[pos:pos + len(ends)] = np.diff(ends, prepend=previous)
                        previous, pos = int(ends[-1]), pos + len(ends)
            self._lengths = lengths
        return self._lengths

    def shard_arrays(self):
        """Per shard, in order: (tokens (N_k,), sentence ends (S_k,), document ends (D_k,) in
        sentences, phrase flags (N_k,) or None), memmapped, offsets local to the shard."""
        directory = self.prepared_dir / self.split
        for k, shard in enumerate(self.meta["splits"][self.split]["shards"]):
            docs = _memmap(directory / shard["files"]["docs"], np.dtype("<i8"), shard["num_docs"])
            yield self._tokens[k], self._sent_ends[k], docs, self._joins[k] if self._joins else None

    def _locate(self, s: int) -> tuple[int, int]:
        if not 0 <= s < self.num_sentences:
            raise IndexError(f"sentence {s} out of range [0, {self.num_sentences})")
        k = int(np.searchsorted(self._shard_starts, s, side="right")) - 1
        return k, s - int(self._shard_starts[k])

    def _span(self, k: int, first: int, last: int, arrays: list[np.ndarray] | None = None) -> np.ndarray:
        """Tokens (or another per-token array) of local sentences [first, last] (inclusive) of shard k."""
        ends = self._sent_ends[k]
        begin = int(ends[first - 1]) if first > 0 else 0
        return (self._tokens if arrays is None else arrays)[k][begin:int(ends[last])]

    def sentence(self, s: int) -> np.ndarray:
        """Token ids (stored dtype, a view of the memmap) of global sentence ``s``."""
        k, local = self._locate(s)
        return self._span(k, local, local)

    def sentences(self, start: int, stop: int) -> np.ndarray:
        """Concatenated token ids of global sentences [start, stop) of one document."""
        return self._sentences(start, stop, None, self.dtype)

    def joins(self, start: int, stop: int) -> np.ndarray | None:
        """uint8 phrase flags aligned with ``sentences(start, stop)``; None if not stored."""
        return self._sentences(start, stop, self._joins, np.uint8) if self._joins else None

    def _sentences(self, start: int, stop: int, arrays, dtype) -> np.ndarray:
        if stop <= start:
            return np.zeros(0, dtype=dtype)
        k, first = self._locate(start)
        k2, last = self._locate(stop - 1)
        if k2 != k:
            raise EmberError(f"sentences [{start}, {stop}) span two shards; stay within a document")
        return self._span(k, first, last, arrays)

    def doc_sentences(self, d: int) -> range:
        if not 0 <= d < self.num_docs:
            raise IndexError(f"document {d} out of range [0, {self.num_docs})")
        return range(int(self.doc_offsets[d]), int(self.doc_offsets[d + 1]))

    def doc_tokens(self, d: int) -> np.ndarray:
        """All token ids of document ``d`` (one contiguous memmap slice)."""
        r = self.doc_sentences(d)
        return self.sentences(r.start, r.stop)

    def __repr__(self) -> str:
        return (f"TokenCorpus({str(self.prepared_dir)!r}, split={self.split!r}: "
                f"{self.num_docs} docs, {self.num_sentences} sentences, {self.num_tokens} tokens)")
