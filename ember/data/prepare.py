"""Raw corpus → sentence-split, tokenized, memory-mapped shards (see ``ember.data.shards``).

Pipeline: stream documents → split sentences → tokenize without special tokens → append to
shards. Memory stays flat: documents are processed in batches and written as they come.

Speed: encoding dominates, and the ``tokenizers`` library spends a fixed cost per input
string (~12 µs here) on top of the per-character work, so encoding 80k sentences one by one is
~40% slower than encoding the 650 documents they came from. We therefore encode each
document once with its sentences joined by the sep special token (special tokens split the
input before normalization and pre-tokenization, so every sentence is tokenized exactly as
alone) and cut the ids at the sep positions. If a document's text itself contains that
token the count does not match and we fall back to encoding its sentences one by one.
Measured on 10 MB of wiki-en (CPU seconds, all threads): whole documents 3.19, sep-joined
documents 3.28, separate sentences 3.97.

Everything after encoding is vectorized per batch (``EncodedBatch`` is ragged: no per-
document arrays, one write per shard file per batch): with one-line documents (512k Korean
reviews) per-document numpy calls and writes had cost as much as the encoding itself.

With one process, reading and splitting stay in the main thread: a background reader/splitter
thread measured no faster on 2 cores (+5% CPU from GIL hand-offs). Python-side work is ~20%
of the CPU time and holds the GIL, so ``workers`` > 1 moves splitting and encoding into worker
processes instead (``ember.data.prepare_pool``; same output byte for byte).

The output is built in ``<out>.tmp-XXXX`` and renamed into place only when complete, so an
interrupted or failed run never leaves a partial directory or destroys an earlier one.

Phrases (``phrases="spans"|"detect"``, for ERNIE-style masking): each document's phrase or
entity character spans - from the JSONL ``spans`` field or the built-in detector, formats
and rules in ``ember.data.phrases`` - become per-token "joins the previous token" flags,
stored in ``*.joins.bin`` next to the tokens. Aligning spans needs each token's character
offsets, which the sep-joined fast path cannot give exactly (byte-level BPE reports the
first token after a special token one character short), so this mode encodes sentence by
sentence with offsets (``encode_batch``): same tokens, ~1.5x the encoding CPU time (4 MB
of wiki-en: 2.5 s against 1.5-1.9 s on a busy 2-core machine). ``detect`` also reads the
first ``phrase_sample_docs`` documents once more beforehand to fit the detector (~0.25 s
per MB) and runs it on every document (~0.4 s per MB, pure Python).
"""

from __future__ import annotations

import datetime
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Iterator

import numpy as np

from ember.data.phrases import PHRASE_SOURCES, phrase_source, token_joins
from ember.data.prepare_pool import encoded_batches
from ember.data.readers import Document, DocumentReader
from ember.data.sentences import split_sentences
from ember.data.shards import FORMAT_NAME, FORMAT_VERSION, ShardWriter, token_dtype
from ember.errors import EmberError
from ember.fileio import sha256_file

BATCH_CHARS = 2_000_000  # ~2 MB of text per encode call: enough work for both cores
# A whole novel is ~20k sentences; far more usually means a one-item-per-line file read
# with --format text, which makes the whole file a single document.
HUGE_DOC_SENTENCES = 200_000
MAX_PIECE_CHARS = 100_000  # longest single string handed to the encoder


def holdout_mask(ordinals: np.ndarray, valid_fraction: float, seed: int) -> np.ndarray:
    """Deterministic holdout: bool (D,), True for documents that go to the valid split.

    splitmix64 of (seed, document ordinal) mapped to [0, 1): a fixed, platform-independent
    hash, vectorized so it costs nothing per document.
    """
    if valid_fraction <= 0:
        return np.zeros(len(ordinals), dtype=bool)
    x = np.asarray(ordinals, dtype=np.uint64) + np.uint64(seed % 2**32) * np.uint64(2**32)
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / 2.0**53 < valid_fraction


def is_valid_doc(ordinal: int, valid_fraction: float, seed: int) -> bool:
    """Scalar form of ``holdout_mask``."""
    return bool(holdout_mask(np.array([ordinal]), valid_fraction, seed)[0])


def _pieces(sentences: list[str], sep: str) -> Iterator[tuple[list[str], int]]:
    """Group a document's sentences into pieces of at most MAX_PIECE_CHARS characters.

    Yields (sentences, characters). A longer sentence is a piece of its own.
    """
    group: list[str] = []
    size = 0
    for sent in sentences:
        if group and size + len(sent) > MAX_PIECE_CHARS:
            yield group, size
            group, size = [], 0
        group.append(sent)
        size += len(sent) + len(sep)
    if group:
        yield group, size


@dataclass
class EncodedBatch:
    """Tokenized documents in ragged form (no per-document arrays, so no per-document cost).

    tokens: (N,) int64 ids without special tokens, all documents concatenated.
    sentence_lengths: (S,) int64 tokens per sentence, all > 0 (empty sentences dropped).
    doc_sentences: (D,) int64 sentences per input document; 0 for a document with no tokens.
    joins: (N,) uint8 phrase flags (``ember.data.phrases``), or None without phrases.
    """

    tokens: np.ndarray
    sentence_lengths: np.ndarray
    doc_sentences: np.ndarray
    joins: np.ndarray | None = None

    def document(self, d: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids (n,), sentence_ends (S,)) of document ``d``, for tests and inspection."""
        sent_ends = np.cumsum(self.sentence_lengths)
        s0, s1 = int(self.doc_sentences[:d].sum()), int(self.doc_sentences[: d + 1].sum())
        t0 = int(sent_ends[s0 - 1]) if s0 else 0
        return self.tokens[t0:int(sent_ends[s1 - 1]) if s1 else t0], sent_ends[s0:s1] - t0


def _encode_pieces_separately(tok, pieces: list[list[str]]):
    """Slow path, for pieces whose text contains the sep token itself: per-sentence ids."""
    ids: list[int] = []
    lengths: list[int] = []
    for piece in pieces:
        for enc in tok.encode_batch_fast(piece, add_special_tokens=False):
            ids.extend(enc.ids)
            lengths.append(len(enc.ids))
    return np.array(ids, dtype=np.int64), np.array(lengths, dtype=np.int64)


def _encode_joined(tok, pieces: list[list[str]], sep: str, sep_id: int):
    """Encode sep-joined pieces; return (tokens (N,), sentence lengths (S,) incl. zeros)."""
    encodings = tok.encode_batch_fast([sep.join(p) for p in pieces], add_special_tokens=False)
    id_lists = [e.ids for e in encodings]
    piece_len = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
    flat = np.fromiter(chain.from_iterable(id_lists), dtype=np.int64, count=int(piece_len.sum()))
    piece_end = np.cumsum(piece_len)  # (P,) exclusive end of each piece in ``flat``
    sep_pos = np.flatnonzero(flat == sep_id)
    seps_per_piece = np.bincount(np.searchsorted(piece_end, sep_pos, side="right"),
                                 minlength=len(pieces))
    if not np.array_equal(seps_per_piece, [len(p) - 1 for p in pieces]):
        return _encode_pieces_separately(tok, pieces)
    # Sentence ends are the seps and the piece ends, in order (a piece end sorts before a
    # sep at the same position: that sep starts the next piece). A sentence after a sep
    # starts one past it; after a piece end, at it.
    positions = np.concatenate([piece_end, sep_pos])
    is_sep = np.concatenate([np.zeros(len(piece_end), bool), np.ones(len(sep_pos), bool)])
    order = np.lexsort((is_sep, positions))
    ends, is_sep = positions[order], is_sep[order]
    starts = np.concatenate([[0], ends[:-1] + is_sep[:-1]])
    return np.delete(flat, sep_pos), ends - starts


def _encode_with_joins(tok, texts: list[str], spans: list[np.ndarray]) -> EncodedBatch:
    """Phrase mode of ``encode_documents``: sentence by sentence, with character offsets.

    spans: per document, int64 (k, 2) sorted non-overlapping character spans of its text.
    Offsets are put in one batch-wide coordinate system (document d's text starts at the
    sum of the earlier texts' lengths + 1) so one vectorized ``token_joins`` call aligns all.
    """
    sentences: list[str] = []
    starts: list[int] = []  # batch-wide character offset of each sentence
    sentence_doc: list[int] = []
    base = 0
    for d, text in enumerate(texts):
        cursor = 0
        for sent in split_sentences(text):  # stripped substrings of ``text``, in order
            at = text.find(sent, cursor)
            sentences.append(sent)
            starts.append(base + at)
            sentence_doc.append(d)
            cursor = at + len(sent)
        spans[d] = spans[d] + base
        base += len(text) + 1
    lengths: list[int] = []
    id_parts, offset_parts = [], []
    for i in range(0, len(sentences), 4096):  # arrays per chunk: Encoding objects are large
        encodings = tok.encode_batch(sentences[i : i + 4096], add_special_tokens=False)
        chunk = [len(e.ids) for e in encodings]
        n = sum(chunk)
        lengths.extend(chunk)
        id_parts.append(np.fromiter(chain.from_iterable(e.ids for e in encodings), np.int64, n))
        offset_parts.append(np.fromiter(chain.from_iterable(chain.from_iterable(e.offsets for e in encodings)),
                                        np.int64, 2 * n).reshape(n, 2))  # (n, 2) within each sentence
    ids = np.concatenate(id_parts) if id_parts else np.zeros(0, np.int64)
    offs = np.concatenate(offset_parts) if offset_parts else np.zeros((0, 2), np.int64)
    length = np.array(lengths, dtype=np.int64)  # (S incl. empty,)
    shift = np.repeat(np.array(starts, dtype=np.int64), length)  # (N,)
    first = np.zeros(len(ids), dtype=bool)
    first[(np.cumsum(length) - length)[length > 0]] = True
    all_spans = np.concatenate(spans) if spans else np.zeros((0, 2), np.int64)
    joins = token_joins(offs[:, 0] + shift, offs[:, 1] + shift, all_spans[:, 0], all_spans[:, 1], first)
    keep = length > 0
    return EncodedBatch(
        tokens=ids,
        sentence_lengths=length[keep],
        doc_sentences=np.bincount(np.array(sentence_doc, dtype=np.int64)[keep],
                                  minlength=len(texts)).astype(np.int64),
        joins=joins,
    )


def encode_documents(tok, texts: list[str], sep: str, sep_id: int,
                     spans: list[np.ndarray] | None = None) -> EncodedBatch:
    """Split ``texts`` into sentences and tokenize them without special tokens.

    With ``spans`` (per document, int64 (k, 2) character spans) the result also carries the
    phrase flags (see the module docstring).

    Each document is encoded once with its sentences joined by the sep special token, then
    cut at the seps (see the module docstring). Long documents are cut into pieces of at
    most MAX_PIECE_CHARS and pieces are encoded in groups of about BATCH_CHARS: the Rust
    side keeps ~100 bytes of alignment data per input character, so a whole file read as
    one document (45 MB of reviews) would otherwise take 4 GB, on one core.
    """
    if spans is not None:
        return _encode_with_joins(tok, texts, list(spans))
    pieces: list[list[str]] = []
    sizes: list[int] = []
    piece_doc: list[int] = []  # document of each piece; a document's pieces are consecutive
    for d, text in enumerate(texts):
        for group, size in _pieces(split_sentences(text), sep):
            pieces.append(group)
            sizes.append(size)
            piece_doc.append(d)
    tokens, lengths = [], []
    start = 0
    while start < len(pieces):
        stop, chars = start, 0
        while stop < len(pieces) and (stop == start or chars + sizes[stop] <= BATCH_CHARS):
            chars += sizes[stop]
            stop += 1
        t, n = _encode_joined(tok, pieces[start:stop], sep, sep_id)
        tokens.append(t)
        lengths.append(n)
        start = stop
    empty = np.zeros(0, dtype=np.int64)
    lengths_all = np.concatenate(lengths) if lengths else empty  # (S incl. empty,)
    sentence_doc = np.repeat(np.array(piece_doc, dtype=np.int64),
                             [len(p) for p in pieces])  # (S incl. empty,)
    keep = lengths_all > 0
    return EncodedBatch(
        tokens=np.concatenate(tokens) if tokens else empty,
        sentence_lengths=lengths_all[keep],
        doc_sentences=np.bincount(sentence_doc[keep], minlength=len(texts)).astype(np.int64),
    )


def _batches(reader: DocumentReader, max_docs: int | None,
             batch_docs: int) -> Iterator[list[Document]]:
    """Groups of documents of at most ``batch_docs`` docs or ~BATCH_CHARS characters."""
    batch: list[Document] = []
    chars = 0
    for i, doc in enumerate(reader):
        if max_docs is not None and i >= max_docs:
            break
        batch.append(doc)
        chars += len(doc.text)
        if len(batch) >= batch_docs or chars >= BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _check_out_dir(out_dir: Path, overwrite: bool) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise EmberError(f"output {out_dir} exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise EmberError(
            f"output directory {out_dir} already exists and is not empty; "
            "pass --overwrite (overwrite=True) to replace it, or choose another --out"
        )


def _remove_leftovers(out_dir: Path) -> None:
    """The half-built ``<out>.tmp-XXXX`` folders of earlier runs into the same --out that were
    killed (an interrupted run cannot clean up; each held up to a whole corpus of shards)."""
    for stale in out_dir.parent.glob(f"{out_dir.name}.tmp-*"):
        if stale.is_dir():
            print(f"note: removing {stale}, left by an interrupted `ember prepare` into {out_dir}", file=sys.stderr)
            shutil.rmtree(stale, ignore_errors=True)


def _move_into_place(tmp: Path, out_dir: Path, overwrite: bool) -> None:
    """Rename the finished tmp dir to out_dir; an old out_dir is removed only afterwards."""
    _check_out_dir(out_dir, overwrite)  # another process may have written it meanwhile
    old = None
    if out_dir.exists():
        old = Path(tempfile.mkdtemp(prefix=f"{out_dir.name}.old-", dir=out_dir.parent))
        old.rmdir()
        out_dir.rename(old)
    tmp.rename(out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def prepare_corpus(
    inputs: list[str | Path] | str | Path,
    tokenizer_path: str | Path,
    out_dir: str | Path,
    fmt: str = "auto",
    text_field: str = "text",
    valid_fraction: float = 0.01,
    shard_tokens: int = 50_000_000,
    batch_docs: int = 8192,
    max_docs: int | None = None,
    seed: int = 0,
    progress: bool = True,
    overwrite: bool = False,
    phrases: str = "none",
    phrase_min_count: int = 5,
    phrase_threshold: float = 0.5,
    phrase_sample_docs: int = 5000,
    workers: int = 1,
    extra_meta: dict | None = None,
) -> dict:
    """Tokenize ``inputs`` into a prepared directory ``out_dir``; return its stats.

    Documents are held out for validation by a hash of (seed, ordinal) with probability
    ``valid_fraction``; if none was picked but there are ≥ 2 documents, the last one is.
    ``phrases`` ("none", "spans" or "detect") also stores phrase/entity flags for ERNIE-style
    masking; the ``phrase_*`` options tune the detector (``ember.data.phrases``).
    ``workers`` > 1 splits and tokenizes on that many processes (``ember.data.prepare_pool``),
    with the same output byte for byte. ``extra_meta``: more meta.json entries (a part of a
    corpus prepared across machines, ``ember.data.parts``).
    """
    from tqdm import tqdm

    from ember.tokenizers.train import load_tokenizer, special_token_ids, tokenizer_kind

    if not 0 <= valid_fraction < 1:
        raise EmberError(f"valid_fraction must be in [0, 1), got {valid_fraction}")
    if max_docs is not None and max_docs <= 0:
        raise EmberError("max_docs must be positive")
    if phrases not in PHRASE_SOURCES:
        raise EmberError(f"phrases={phrases!r}; choose one of {', '.join(PHRASE_SOURCES)}")
    out_dir = Path(out_dir)
    tokenizer_path = Path(tokenizer_path)
    if tokenizer_path.is_dir():
        tokenizer_path = tokenizer_path / "tokenizer.json"
    tok = load_tokenizer(tokenizer_path)
    specials = special_token_ids(tok)
    sep = tok.id_to_token(specials["sep"])
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    dtype = token_dtype(vocab_size)
    _check_out_dir(out_dir, overwrite)
    reader = DocumentReader(inputs, fmt=fmt, text_field=text_field)
    phrase_spans, phrase_meta = phrase_source(phrases, reader, inputs, fmt, text_field, max_docs,
                                               phrase_min_count, phrase_threshold, phrase_sample_docs)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(out_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f"{out_dir.name}.tmp-", dir=out_dir.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the result is an ordinary shared folder
    bar = None
    try:
        writers = {s: ShardWriter(tmp / s, dtype, shard_tokens, joins=phrase_spans is not None)
                   for s in ("train", "valid")}
        # The bar advances over input files as stored on disk (compressed), so its total
        # and ETA are known up front; the postfix shows decompressed text read.
        bar = tqdm(total=round(reader.disk_total / 1e6, 2), unit="MB", desc="prepare",
                   disable=not progress, dynamic_ncols=True,
                   bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} MB on disk [{elapsed}<{remaining}{postfix}]")
        start = time.perf_counter()
        ordinal = 0  # documents with tokens so far: the holdout hash input
        total_tokens = 0
        no_tokens = 0
        warnings: list[str] = []
        for batch, enc in encoded_batches(_batches(reader, max_docs, batch_docs), encode_documents, tok,
                                          tokenizer_path, sep, specials["sep"], phrase_spans, workers):
            if enc.joins is not None:
                phrase_meta["joined_tokens"] += int(enc.joins.sum())
            for d in np.flatnonzero(enc.doc_sentences > HUGE_DOC_SENTENCES)[:5 - len(warnings)]:
                warnings.append(
                    f"{batch[d].source}:{batch[d].line}: one document of "
                    f"{enc.doc_sentences[d]:,} sentences; if each line is its own document "
                    "(e.g. reviews), use --format lines"
                )
            has_text = enc.doc_sentences > 0
            no_tokens += int((~has_text).sum())
            doc_sents = enc.doc_sentences[has_text]  # (D',) documents with tokens
            valid = holdout_mask(np.arange(ordinal, ordinal + len(doc_sents)), valid_fraction, seed)
            ordinal += len(doc_sents)
            total_tokens += len(enc.tokens)
            # Route documents by expanding the per-document mask to sentences and tokens.
            sent_valid = np.repeat(valid, doc_sents)  # (S,)
            tok_valid = np.repeat(sent_valid, enc.sentence_lengths)  # (N,)
            for split, doc_m, sent_m, tok_m in (("train", ~valid, ~sent_valid, ~tok_valid),
                                                ("valid", valid, sent_valid, tok_valid)):
                if doc_m.any():
                    writers[split].add_documents(enc.tokens[tok_m], enc.sentence_lengths[sent_m],
                                                 doc_sents[doc_m],
                                                 None if enc.joins is None else enc.joins[tok_m])
            if progress:
                rate = total_tokens / max(time.perf_counter() - start, 1e-9)
                bar.set_postfix(text=f"{reader.text_bytes / 1e6:.0f}MB", docs=ordinal,
                                tok_per_s=f"{rate / 1e3:.0f}k", refresh=False)
                bar.update(round(reader.disk_bytes / 1e6, 2) - bar.n)
        if writers["valid"].num_docs == 0 and valid_fraction > 0 and ordinal >= 2:
            # Nothing was drawn for valid (tiny corpus): move the last train document there.
            writers["valid"].add_document(*writers["train"].pop_last_document(with_joins=True))
        splits = {s: w.close() for s, w in writers.items()}
        if progress:
            bar.update(bar.total - bar.n)
        bar.close()
        seconds = time.perf_counter() - start
        if ordinal == 0:
            raise EmberError(
                f"no text in the input: read {reader.describe_inputs()} and found no "
                f"non-empty documents ({reader.empty_skipped} empty ones skipped); check "
                "--format and --text-field"
            )
        shutil.copyfile(tokenizer_path, tmp / "tokenizer.json")
        meta = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "tokenizer": {
                "file": "tokenizer.json",
                "sha256": sha256_file(tmp / "tokenizer.json"),
                "kind": tokenizer_kind(tok),
                "vocab_size": vocab_size,
                "source": str(tokenizer_path),
            },
            "dtype": dtype.name,
            "special_token_ids": specials,
            "inputs": reader.inputs,
            "num_files": len(reader.files),
            "formats": sorted(set(reader.formats.values())),
            "text_field": text_field,
            "valid_fraction": valid_fraction,
            "seed": seed,
            "max_docs": max_docs,
            "shard_tokens": shard_tokens,
            "empty_docs_skipped": reader.empty_skipped + no_tokens,
            "text_bytes": reader.text_bytes,
            "seconds": round(seconds, 3),
            "phrases": phrase_meta,
            "splits": splits,
            **(extra_meta or {}),
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n",
                                       encoding="utf-8")
        _move_into_place(tmp, out_dir, overwrite)
    except BaseException:  # includes KeyboardInterrupt: never leave a partial tmp dir
        if bar is not None:
            bar.close()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {
        "out_dir": str(out_dir),
        "docs": ordinal,
        "sentences": sum(s["num_sentences"] for s in splits.values()),
        "tokens": sum(s["num_tokens"] for s in splits.values()),
        "splits": {s: {k: v for k, v in d.items() if k != "shards"} for s, d in splits.items()},
        "empty_docs_skipped": meta["empty_docs_skipped"],
        "text_mb": reader.text_bytes / 1e6,
        "seconds": seconds,
        "mb_per_s": reader.text_bytes / 1e6 / max(seconds, 1e-9),
        "warnings": warnings,
        "phrases": phrase_meta,
    }


def format_summary(stats: dict) -> str:
    tr, va = stats["splits"]["train"], stats["splits"]["valid"]
    return (
        f"prepared {stats['docs']:,} docs, {stats['sentences']:,} sentences, "
        f"{stats['tokens']:,} tokens (train {tr['num_docs']:,} docs / {tr['num_tokens']:,} tokens, "
        f"valid {va['num_docs']:,} docs / {va['num_tokens']:,} tokens) from "
        f"{stats['text_mb']:.1f} MB of text in {stats['seconds']:.1f} s "
        f"({stats['mb_per_s']:.2f} MB/s) → {stats['out_dir']}"
    ) + _phrase_summary(stats.get("phrases") or {}, stats["tokens"])


def _phrase_summary(phrases: dict, tokens: int) -> str:
    if phrases.get("source", "none") == "none":
        return ""
    found = f", {phrases['collocations']:,} collocations" if "collocations" in phrases else ""
    return (f"; phrases ({phrases['source']}{found}): {phrases['joined_tokens']:,} tokens "
            f"({phrases['joined_tokens'] / max(tokens, 1):.1%}) join a phrase unit")
