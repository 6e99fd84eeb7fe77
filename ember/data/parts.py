"""Preparing one corpus on several machines: ``ember prepare --part i/N`` and ``--merge``.

Part i of N tokenizes a deterministic, contiguous share of the input files (in the order a
single run reads them; shares balanced by bytes on disk, each at least one file) into an
ordinary prepared folder whose ``train`` split holds all its documents in input order (no
holdout yet) and whose meta.json records the part (``part``: index, count, its files, and the
holdout and shard settings the final corpus will use).

The merge reads the parts in order 1..N and routes every document exactly as a single run
would: the holdout draws by the document's global ordinal (``holdout_mask``), shards rotate
by the same rule, and a tiny corpus with no valid document still gives its last one. The
token, sentence and document files are therefore byte for byte those of one
``ember prepare`` over all the inputs (tests/data/test_prepare_parts.py). Both steps read
and write in bounded chunks, so memory stays flat, and both build their output in a
temporary folder renamed into place when complete; the parts are only read.
"""

from __future__ import annotations

import datetime
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

from ember.data.prepare import (
    _check_out_dir,
    _move_into_place,
    holdout_mask,
    prepare_corpus,
)
from ember.data.readers import expand_inputs
from ember.data.shards import ShardWriter, TokenCorpus
from ember.errors import EmberError

CHUNK_DOCS = 8192  # documents routed per write at merge time


def parse_part(text: str) -> tuple[int, int]:
    """"i/N" -> (i, N), with 1 <= i <= N."""
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise EmberError(f"--part {text!r}: write it as i/N, e.g. --part 2/8 for the second of 8 parts") from None
    if count < 1 or not 1 <= index <= count:
        raise EmberError(f"--part {text}: i must be in 1..N (here 1..{max(count, 1)}); parts are numbered from 1")
    return index, count


def part_files(files: list[Path], index: int, count: int) -> list[Path]:
    """The contiguous share of ``files`` that part ``index`` of ``count`` reads: each boundary at
    the file start nearest to k/N of the bytes on disk, moved so that every part has a file.
    (The first start at or past k/N gave 3 + 1 of four near-equal files.)"""
    if count > len(files):
        raise EmberError(f"--part {index}/{count}: the input has only {len(files)} file(s) and parts split it "
                         f"by files; use at most {len(files)} parts (or split the input into more files)")
    sizes = np.array([f.stat().st_size for f in files], dtype=np.float64)
    starts = np.cumsum(sizes) - sizes
    total = max(float(sizes.sum()), 1.0)
    bounds = [0]
    for k in range(1, count):
        target = k * total / count
        raw = int(np.searchsorted(starts, target, side="left"))  # the first start at or past the target
        if raw > 0 and (raw == len(files) or target - starts[raw - 1] < starts[raw] - target):
            raw -= 1  # the start before it is nearer
        bounds.append(max(bounds[-1] + 1, min(raw, len(files) - (count - k))))
    bounds.append(len(files))
    return files[bounds[index - 1]:bounds[index]]


def prepare_part(inputs, tokenizer_path, out_dir, part: str, valid_fraction: float = 0.01, seed: int = 0,
                 shard_tokens: int = 50_000_000, max_docs: int | None = None, phrases: str = "none",
                 **options) -> dict:
    """Tokenize part ``part`` ("i/N") of ``inputs`` into ``out_dir`` (see the module docstring)."""
    index, count = parse_part(part)
    if max_docs is not None:
        raise EmberError("--max-docs counts documents over the whole input; it cannot be split into --part runs "
                         "(take a subset of the files instead)")
    if phrases == "detect":
        raise EmberError("--phrases detect fits its detector on the first documents of the whole input; with "
                         "--part use --phrases spans (JSONL with spans) or prepare on one machine")
    if not 0 <= valid_fraction < 1:
        raise EmberError(f"valid_fraction must be in [0, 1), got {valid_fraction}")
    files = expand_inputs(inputs)
    mine = part_files(files, index, count)
    record = {"index": index, "count": count, "files": [str(f) for f in mine], "input_files": len(files),
              "inputs": [str(i) for i in ([inputs] if isinstance(inputs, (str, Path)) else inputs)],
              "valid_fraction": valid_fraction, "seed": seed, "shard_tokens": shard_tokens}
    # all documents to "train", in input order: the holdout is drawn at merge time
    return prepare_corpus(mine, tokenizer_path, out_dir, valid_fraction=0.0, seed=seed, shard_tokens=shard_tokens,
                          phrases=phrases, extra_meta={"part": record}, **options)


def _read_parts(part_dirs: list[Path]) -> list[tuple[Path, dict]]:
    """The parts' (folder, meta) in part order, after checking that they make one corpus."""
    parts = []
    for d in part_dirs:
        meta = TokenCorpus(d, "train").meta  # checks the format and the shard files' sizes
        if "part" not in meta:
            raise EmberError(f"{d} is a prepared corpus but not a part (no \"part\" in its meta.json); "
                             "--merge takes the folders written by `ember prepare --part i/N`")
        parts.append((Path(d), meta))
    parts.sort(key=lambda p: p[1]["part"]["index"])
    first_dir, first = parts[0]
    count = first["part"]["count"]
    have = [m["part"]["index"] for _, m in parts]
    if have != list(range(1, count + 1)):
        missing = sorted(set(range(1, count + 1)) - set(have))
        extra = sorted({i for i in have if have.count(i) > 1})
        raise EmberError(f"--merge needs parts 1..{count} once each; "
                         + (f"missing part(s) {missing}" if missing else f"part(s) {extra} given twice"))
    for d, meta in parts[1:]:
        if meta["tokenizer"]["sha256"] != first["tokenizer"]["sha256"]:
            raise EmberError(
                f"part {meta['part']['index']} ({d}) was tokenized with {meta['tokenizer']['source']} "
                f"(sha256 {meta['tokenizer']['sha256'][:12]}), part 1 ({first_dir}) with "
                f"{first['tokenizer']['source']} (sha256 {first['tokenizer']['sha256'][:12]}); every part must use "
                "the same tokenizer: prepare that part again with part 1's --tokenizer")
        for key in ("count", "input_files", "inputs", "valid_fraction", "seed", "shard_tokens"):
            if meta["part"][key] != first["part"][key]:
                raise EmberError(f"part {meta['part']['index']} ({d}) has {key}={meta['part'][key]!r}, part 1 "
                                 f"({first_dir}) {first['part'][key]!r}: the parts come from different "
                                 "`ember prepare --part` commands; run every part with the same inputs and options")
        if meta.get("text_field") != first.get("text_field") or \
                meta.get("phrases", {}).get("source") != first.get("phrases", {}).get("source"):
            raise EmberError(f"part {meta['part']['index']} ({d}) was prepared with another --text-field or "
                             f"--phrases than part 1 ({first_dir}); run every part with the same options")
    return parts


def _route(corpus: TokenCorpus, writers: dict, ordinal: int, valid_fraction: float, seed: int) -> int:
    """Write ``corpus``'s documents to the train/valid writers in order; the next ordinal."""
    for tokens, sent_ends, doc_ends, joins in corpus.shard_arrays():
        for a in range(0, len(doc_ends), CHUNK_DOCS):
            b = min(a + CHUNK_DOCS, len(doc_ends))
            s0, s1 = (int(doc_ends[a - 1]) if a else 0), int(doc_ends[b - 1])
            t0, t1 = (int(sent_ends[s0 - 1]) if s0 else 0), int(sent_ends[s1 - 1])
            doc_sents = np.diff(np.asarray(doc_ends[a:b], dtype=np.int64), prepend=s0)  # (D,)
            sent_lens = np.diff(np.asarray(sent_ends[s0:s1], dtype=np.int64), prepend=t0)  # (S,)
            toks = np.asarray(tokens[t0:t1])
            flags = None if joins is None else np.asarray(joins[t0:t1])
            valid = holdout_mask(np.arange(ordinal, ordinal + len(doc_sents)), valid_fraction, seed)
            ordinal += len(doc_sents)
            sent_valid = np.repeat(valid, doc_sents)
            tok_valid = np.repeat(sent_valid, sent_lens)
            for split, doc_m, sent_m, tok_m in (("train", ~valid, ~sent_valid, ~tok_valid),
                                                ("valid", valid, sent_valid, tok_valid)):
                if doc_m.any():
                    writers[split].add_documents(toks[tok_m], sent_lens[sent_m], doc_sents[doc_m],
                                                 None if flags is None else flags[tok_m])
    return ordinal


def merge_parts(part_dirs: list[str | Path], out_dir: str | Path, overwrite: bool = False) -> dict:
    """Combine the folders of ``prepare_part`` into one prepared corpus in ``out_dir``; its meta."""
    if not part_dirs:
        raise EmberError("--merge needs the part folders written by `ember prepare --part i/N`")
    parts = _read_parts([Path(p) for p in part_dirs])
    out_dir = Path(out_dir)
    _check_out_dir(out_dir, overwrite)
    first_dir, first = parts[0]
    settings = first["part"]
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{out_dir.name}.tmp-", dir=out_dir.parent))
    tmp.chmod(0o755)
    try:
        joins = first.get("phrases", {}).get("source", "none") != "none"
        writers = {s: ShardWriter(tmp / s, np.dtype(first["dtype"]), settings["shard_tokens"], joins=joins)
                   for s in ("train", "valid")}
        ordinal = 0
        for d, _ in parts:
            ordinal = _route(TokenCorpus(d, "train"), writers, ordinal, settings["valid_fraction"], settings["seed"])
        if writers["valid"].num_docs == 0 and settings["valid_fraction"] > 0 and ordinal >= 2:
            writers["valid"].add_document(*writers["train"].pop_last_document(with_joins=True))  # as one run does
        splits = {s: w.close() for s, w in writers.items()}
        shutil.copyfile(first_dir / "tokenizer.json", tmp / "tokenizer.json")
        meta = {k: v for k, v in first.items() if k != "part"}
        total = lambda key: sum(m.get(key) or 0 for _, m in parts)  # noqa: E731
        meta.update({
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "inputs": settings["inputs"], "num_files": total("num_files"),
            "formats": sorted({f for _, m in parts for f in m.get("formats", [])}),
            "valid_fraction": settings["valid_fraction"], "seed": settings["seed"],
            "shard_tokens": settings["shard_tokens"], "empty_docs_skipped": total("empty_docs_skipped"),
            "text_bytes": total("text_bytes"), "seconds": round(total("seconds"), 3),
            "merged_from": [str(d) for d, _ in parts], "splits": splits,
        })
        if joins:
            meta["phrases"] = {**first["phrases"],
                               "joined_tokens": sum(m["phrases"].get("joined_tokens", 0) for _, m in parts)}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        _move_into_place(tmp, out_dir, overwrite)
    except BaseException:  # never leave a partial folder; the parts are untouched
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta
