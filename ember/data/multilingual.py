"""A prepared corpus with language codes: monolingual streams and parallel pairs (XLM).

XLM (Lample & Conneau 2019) trains on monolingual text of several languages (CLM/MLM, §3.1-
3.2) and on parallel sentences (TLM, §3.3), every token tagged with its language.
``prepare_multilingual`` writes one ordinary prepared folder (ember.data.shards) whose
documents are grouped into *streams*, recorded in meta.json::

    "multilingual": {
      "languages": ["en", "ru"],                   # language id = index (model.languages)
      "streams": [
        {"name": "en", "kind": "mono", "languages": ["en"], "inputs": [...],
         "splits": {"train": {"docs": [0, 140], "num_sentences": ..., "num_tokens": ...},
                    "valid": {...}}},
        {"name": "en-ru", "kind": "parallel", "languages": ["en", "ru"], ...}
      ]
    }

A stream's documents are a contiguous range of each split (its shards, in order), so the
objective reads one language's text as a slice of the corpus. Monolingual streams are
prepared exactly as ``ember prepare`` does (``prepare_corpus``, each language on its own,
the same holdout); parallel ones by ``ember.data.parallel`` (each pair a two-sentence
document). Every stream is built in a temporary folder and the whole corpus is renamed
into place only when complete. The corpus stays readable by every other objective (as
one mixed-language corpus).
"""

from __future__ import annotations

import datetime
import json
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ember.errors import EmberError

_CODE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def check_code(code: str, where: str) -> str:
    if not _CODE.fullmatch(code):
        raise EmberError(f"{where}: language code {code!r} must be letters, digits or '_' "
                         "starting with a letter (e.g. en, ru, zh_hans)")
    return code


def parse_language_inputs(items: list[str]) -> dict[str, list[str]]:
    """["en=PATH", "ru=PATH", "en=PATH2"] -> {"en": [PATH, PATH2], "ru": [PATH]} (order kept)."""
    out: dict[str, list[str]] = {}
    for item in items:
        code, sep, path = item.partition("=")
        if not sep or not path:
            raise EmberError(f"--lang {item!r}: expected CODE=PATH, e.g. --lang en=data/wiki-en")
        out.setdefault(check_code(code.strip(), f"--lang {item}"), []).append(path)
    return out


def parse_parallel_inputs(items: list[str]) -> list[tuple[tuple[str, str] | None, str]]:
    """["en-ru=FILE", "FILE"] -> [(("en", "ru"), FILE), (None, FILE)]; None: four-column lines."""
    out = []
    for item in items:
        pair, sep, path = item.partition("=")
        if not sep:
            out.append((None, item))
            continue
        codes = pair.split("-")
        if len(codes) != 2 or not path:
            raise EmberError(f"--parallel {item!r}: expected SRC-TGT=FILE (e.g. en-ru=pairs.tsv) or FILE")
        src, tgt = (check_code(c.strip(), f"--parallel {item}") for c in codes)
        if src == tgt:
            raise EmberError(f"--parallel {item!r}: source and target language are both {src!r}")
        out.append(((src, tgt), path))
    return out


def language_order(mono: dict[str, list], parallel: list[tuple[tuple[str, str] | None, str]],
                   languages: list[str] | None) -> list[str]:
    """The corpus's languages in id order: ``languages`` when given (every other code must be
    in it), else first appearance among the monolingual and the coded parallel inputs."""
    named = list(mono) + [c for pair, _ in parallel if pair for c in pair]
    if languages:
        for code in languages:
            check_code(code, "--languages")
        unknown = [c for c in dict.fromkeys(named) if c not in languages]
        if unknown:
            raise EmberError(f"unknown language code(s) {', '.join(unknown)}: not in --languages "
                             f"{','.join(languages)}")
        return list(dict.fromkeys(languages))
    return list(dict.fromkeys(named))


def prepare_multilingual(
    mono: dict[str, list[str | Path]],
    parallel: list[tuple[tuple[str, str] | None, str | Path]],
    tokenizer_path: str | Path,
    out_dir: str | Path,
    languages: list[str] | None = None,
    fmt: str = "auto",
    text_field: str = "text",
    valid_fraction: float = 0.01,
    shard_tokens: int = 50_000_000,
    max_docs: int | None = None,
    seed: int = 0,
    progress: bool = True,
    overwrite: bool = False,
) -> dict:
    """Tokenize monolingual corpora (code -> inputs) and parallel TSV files into one prepared
    folder with language streams (see the module docstring); return its stats.

    ``max_docs`` caps documents per monolingual language and pairs per parallel file.
    """
    from ember.data.prepare import _check_out_dir, _move_into_place, prepare_corpus
    from ember.data.shards import FORMAT_NAME, FORMAT_VERSION, token_dtype
    from ember.fileio import sha256_file
    from ember.tokenizers.train import load_tokenizer, special_token_ids, tokenizer_kind

    if not mono and not parallel:
        raise EmberError("no input: give monolingual text (--lang CODE=PATH) and/or parallel "
                         "files (--parallel SRC-TGT=FILE)")
    codes = language_order(mono, parallel, languages)
    if not codes:
        raise EmberError("--parallel FILE lines name their own languages; declare the corpus's languages "
                         "(in id order) with --languages, e.g. --languages en,ru")
    out_dir, tokenizer_path = Path(out_dir), Path(tokenizer_path)
    if tokenizer_path.is_dir():
        tokenizer_path = tokenizer_path / "tokenizer.json"
    tok = load_tokenizer(tokenizer_path)
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    dtype = token_dtype(vocab_size)
    _check_out_dir(out_dir, overwrite)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{out_dir.name}.tmp-", dir=out_dir.parent))
    tmp.chmod(0o755)
    try:
        parts: list[tuple[dict, Path, dict]] = []  # (stream meta, part folder, {split: meta})
        for code, inputs in mono.items():
            part = tmp / "parts" / f"mono-{code}"
            stats = prepare_corpus(inputs, tokenizer_path, part, fmt=fmt, text_field=text_field,
                                   valid_fraction=valid_fraction, shard_tokens=shard_tokens,
                                   max_docs=max_docs, seed=seed, progress=progress)
            meta = json.loads((part / "meta.json").read_text(encoding="utf-8"))
            stream = {"name": code, "kind": "mono", "languages": [code], "inputs": [str(i) for i in inputs]}
            parts.append((stream, part, meta["splits"]))
            for warning in stats["warnings"]:
                print(f"ember prepare: warning: {warning}")
        parts += _prepare_parallel(parallel, codes, tok, tmp / "parts", dtype, shard_tokens,
                                   valid_fraction, seed, max_docs)
        splits, streams = _merge_parts(parts, tmp)
        shutil.copyfile(tokenizer_path, tmp / "tokenizer.json")
        meta = {
            "format": FORMAT_NAME, "format_version": FORMAT_VERSION,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "tokenizer": {"file": "tokenizer.json", "sha256": sha256_file(tmp / "tokenizer.json"),
                          "kind": tokenizer_kind(tok), "vocab_size": vocab_size, "source": str(tokenizer_path)},
            "dtype": dtype.name, "special_token_ids": special_token_ids(tok),
            "inputs": [i for s in streams for i in s["inputs"]], "text_field": text_field,
            "valid_fraction": valid_fraction, "seed": seed, "max_docs": max_docs,
            "shard_tokens": shard_tokens, "phrases": {"source": "none"}, "splits": splits,
            "multilingual": {"languages": codes, "streams": streams},
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        shutil.rmtree(tmp / "parts")
        _move_into_place(tmp, out_dir, overwrite)
    except BaseException:  # includes KeyboardInterrupt: never leave a partial tmp dir
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"out_dir": str(out_dir), "languages": codes, "streams": streams, "splits": splits}


def _prepare_parallel(parallel, codes: list[str], tok, root: Path, dtype, shard_tokens: int,
                      valid_fraction: float, seed: int, max_docs: int | None) -> list:
    """Write every parallel file's pairs, one stream per language pair (in first-seen order)."""
    from ember.data.parallel import ENCODE_LINES, PairStreamWriter, encode_pairs, read_parallel

    writers: dict[tuple[str, str], PairStreamWriter] = {}
    inputs: dict[tuple[str, str], list[str]] = {}

    def flush(lines):
        by_pair: dict[tuple[str, str], list] = {}
        for line in lines:
            by_pair.setdefault(line.languages, []).append(line)
        for pair, group in by_pair.items():
            if pair not in writers:
                writers[pair] = PairStreamWriter(root / f"parallel-{pair[0]}-{pair[1]}", dtype,
                                                 shard_tokens, valid_fraction, seed)
            writers[pair].add(*encode_pairs(tok, group))

    for pair, path in parallel:
        lines, count = [], 0
        for line in read_parallel(path, pair, codes):
            if max_docs is not None and count >= max_docs:
                break
            count += 1
            lines.append(line)
            inputs.setdefault(line.languages, [])
            if str(path) not in inputs[line.languages]:
                inputs[line.languages].append(str(path))
            if len(lines) >= ENCODE_LINES:
                flush(lines)
                lines = []
        flush(lines)
        if count == 0:
            raise EmberError(f"--parallel {path}: no sentence pairs in the file")
    parts = []
    for pair, writer in writers.items():
        stream = {"name": f"{pair[0]}-{pair[1]}", "kind": "parallel", "languages": list(pair),
                  "inputs": inputs[pair]}
        parts.append((stream, root / f"parallel-{pair[0]}-{pair[1]}", writer.close()))
    return parts


def _merge_parts(parts: list, tmp: Path) -> tuple[dict, list]:
    """Move every part's shards into ``tmp/<split>/``, renumbered in part order; return the
    merged split meta and the streams with their document ranges."""
    from ember.data.shards import shard_files

    splits = {s: {"num_docs": 0, "num_sentences": 0, "num_tokens": 0, "shards": []} for s in ("train", "valid")}
    streams = []
    for stream, part, part_splits in parts:
        stream = {**stream, "splits": {}}
        for split, merged in splits.items():
            info = part_splits[split]
            (tmp / split).mkdir(exist_ok=True)
            first = merged["num_docs"]
            for shard in info["shards"]:
                names = shard_files(len(merged["shards"]))
                for key, name in shard["files"].items():
                    (part / split / name).rename(tmp / split / names[key])
                merged["shards"].append({**shard, "files": {k: names[k] for k in shard["files"]}})
            for key in ("num_docs", "num_sentences", "num_tokens"):
                merged[key] += info[key]
            stream["splits"][split] = {"docs": [first, merged["num_docs"]],
                                       "num_sentences": info["num_sentences"], "num_tokens": info["num_tokens"]}
        streams.append(stream)
    return splits, streams


@dataclass(frozen=True)
class Stream:
    """One stream of a split: its kind ("mono" or "parallel"), language codes and documents."""

    name: str
    kind: str
    languages: tuple[str, ...]
    docs: range
    num_sentences: int


def corpus_streams(corpus) -> tuple[list[str], list[Stream]]:
    """(language codes in id order, streams of ``corpus``'s split) from its meta.json."""
    info = corpus.meta.get("multilingual")
    if not info:
        raise EmberError(f"{corpus.prepared_dir} was prepared without language codes; prepare it with "
                         "`ember prepare --lang en=PATH --lang ru=PATH [--parallel en-ru=FILE] ...`")
    streams = []
    for s in info["streams"]:
        split = s["splits"][corpus.split]
        streams.append(Stream(s["name"], s["kind"], tuple(s["languages"]), range(*split["docs"]),
                              int(split["num_sentences"])))
    return list(info["languages"]), streams


class SentenceView:
    """Documents ``docs`` of a TokenCorpus seen as one document per sentence: with
    ``TokenBlockDataset`` it yields XLM's text streams, sentences joined by a separator
    (``s1 </s> s2 </s> ...``, Lample & Conneau 2019 §3.2) cut into fixed-length blocks."""

    def __init__(self, corpus, docs: range) -> None:
        self.corpus = corpus
        self.first = int(corpus.doc_offsets[docs.start]) if len(docs) else 0
        stop = int(corpus.doc_offsets[docs.stop]) if len(docs) else 0
        self.sentence_lengths = np.asarray(corpus.sentence_lengths[self.first:stop], dtype=np.int64)
        self.doc_offsets = np.arange(len(self.sentence_lengths) + 1, dtype=np.int64)

    def doc_tokens(self, d: int) -> np.ndarray:
        return self.corpus.sentence(self.first + d)

    def __repr__(self) -> str:
        return f"{self.corpus!r}[{len(self.sentence_lengths)} sentences]"
