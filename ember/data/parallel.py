"""Parallel sentence pairs for XLM's translation language modelling (Lample & Conneau 2019, §3.3).

Input: a TSV file, one pair per line, in one of two layouts:

- ``source<TAB>target`` with the language codes given beside the file
  (``ember prepare --parallel en-ru=FILE``);
- ``src_lang<TAB>tgt_lang<TAB>source<TAB>target`` (``--parallel FILE``), where each line
  names its languages; a code that is not one of the corpus's languages is an error.

Blank lines are skipped; a line with a missing side, the wrong number of columns or an
unknown language code stops preparation with its file:line. Plain, .gz or .bz2.

Storage: each pair is one document of exactly two sentences (source, target), tokenized
without special tokens (the TLM objective adds them), in ordinary token shards (ember.data
.shards), one stream per language pair. ``ParallelPairs`` reads them back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from ember.errors import EmberError

ENCODE_LINES = 4096  # pairs encoded per call: enough work for both cores, small memory


@dataclass(frozen=True)
class ParallelLine:
    languages: tuple[str, str]
    source: str
    target: str
    where: str  # "file:line", for error messages


def read_parallel(path: str | Path, languages: tuple[str, str] | None,
                  known: list[str]) -> Iterator[ParallelLine]:
    """The pairs of one TSV file; ``languages`` None means four-column lines naming their own."""
    from ember.data.readers import DocumentReader

    layout = "src_lang<TAB>tgt_lang<TAB>source<TAB>target" if languages is None else "source<TAB>target"
    width = 4 if languages is None else 2
    for doc in DocumentReader(path, fmt="lines"):
        where = f"{doc.source}:{doc.line}"
        cols = doc.text.split("\t")
        if len(cols) != width:
            raise EmberError(f"{where}: expected {width} tab-separated columns ({layout}), found "
                             f"{len(cols)}; a side is missing or the text holds a tab")
        if languages is None:
            pair = (cols[0].strip(), cols[1].strip())
            for code in pair:
                if code not in known:
                    raise EmberError(f"{where}: unknown language code {code!r}; the corpus's languages "
                                     f"are {', '.join(known)} (declare more with --languages or --lang)")
            cols = cols[2:]
        else:
            pair = languages
        source, target = cols[0].strip(), cols[1].strip()
        if not source or not target:
            side = "source" if not source else "target"
            raise EmberError(f"{where}: the {side} side is empty; every line needs {layout}")
        yield ParallelLine(pair, source, target, where)


def encode_pairs(tok, lines: list[ParallelLine]) -> tuple[np.ndarray, np.ndarray]:
    """Tokenize both sides without special tokens: (tokens (N,), sentence lengths (2P,)),
    source then target for each pair. A side that tokenizes to nothing is an error."""
    texts = [t for line in lines for t in (line.source, line.target)]
    encodings = tok.encode_batch_fast(texts, add_special_tokens=False)
    lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
    empty = np.flatnonzero(lengths == 0)
    if len(empty):
        line, side = lines[empty[0] // 2], ("source", "target")[empty[0] % 2]
        raise EmberError(f"{line.where}: the {side} side has no tokens after tokenization")
    tokens = np.fromiter((i for e in encodings for i in e.ids), dtype=np.int64, count=int(lengths.sum()))
    return tokens, lengths


class PairStreamWriter:
    """Writes the pairs of one language pair into train/valid shards under ``directory``.

    Pairs are held out for validation by the same seeded hash as ``ember prepare``'s
    documents (``holdout_mask`` of the pair's ordinal); if none was picked but there are at
    least two pairs, the last one is.
    """

    def __init__(self, directory: Path, dtype: np.dtype, shard_tokens: int, valid_fraction: float,
                 seed: int) -> None:
        from ember.data.shards import ShardWriter

        self.writers = {s: ShardWriter(directory / s, dtype, shard_tokens) for s in ("train", "valid")}
        self.valid_fraction, self.seed = valid_fraction, seed
        self.pairs = 0

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        from ember.data.prepare import holdout_mask

        n = len(lengths) // 2
        valid = holdout_mask(np.arange(self.pairs, self.pairs + n), self.valid_fraction, self.seed)  # (P,)
        self.pairs += n
        sent_valid = np.repeat(valid, 2)  # (2P,)
        tok_valid = np.repeat(sent_valid, lengths)  # (N,)
        for split, doc_m, sent_m, tok_m in (("train", ~valid, ~sent_valid, ~tok_valid),
                                            ("valid", valid, sent_valid, tok_valid)):
            if doc_m.any():
                self.writers[split].add_documents(tokens[tok_m], lengths[sent_m],
                                                  np.full(int(doc_m.sum()), 2, dtype=np.int64))

    def close(self) -> dict:
        """Finish both splits; return {split: meta entry} as ShardWriter.close does."""
        train, valid = self.writers["train"], self.writers["valid"]
        if valid.num_docs == 0 and self.valid_fraction > 0 and self.pairs >= 2:
            valid.add_document(*train.pop_last_document())
        return {s: w.close() for s, w in self.writers.items()}


class ParallelPairs:
    """Index -> (source ids, target ids), int64, of the pairs in documents ``docs`` of a
    ``TokenCorpus`` split (one parallel stream, ember.data.multilingual)."""

    def __init__(self, corpus, docs: range) -> None:
        self.corpus, self.docs = corpus, docs

    def __len__(self) -> int:
        return len(self.docs)

    def example(self, index: int, epoch: int = 0) -> tuple[np.ndarray, np.ndarray]:
        sentences = self.corpus.doc_sentences(self.docs[index])
        if len(sentences) != 2:
            raise EmberError(f"{self.corpus.prepared_dir}: parallel document {self.docs[index]} has "
                             f"{len(sentences)} sentences, not 2 (source, target); re-run `ember prepare`")
        return tuple(np.asarray(self.corpus.sentence(s), dtype=np.int64) for s in sentences)
