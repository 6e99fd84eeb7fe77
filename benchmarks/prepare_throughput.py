"""Throughput of `ember prepare` against bare `tokenizers` encoding of the same text.

    .venv/bin/python benchmarks/prepare_throughput.py --tokenizer /tmp/tok/tokenizer.json \
        [--inputs DATA/wiki-en/AA/wiki_0*.gz]

Stages measured separately (MB = decompressed UTF-8 text):
  read            stream documents only
  read+split      plus sentence splitting
  encode docs     Tokenizer.encode_batch on whole documents, text already in memory
  encode sents    Tokenizer.encode_batch on pre-split sentences, in memory
  prepare         the full pipeline, writing shards to a temporary folder
The machine is often shared: compare best-of-N runs, or CPU time, not single runs.
"""

from __future__ import annotations

import argparse
import glob
import tempfile
import time
from pathlib import Path

from ember.data.prepare import prepare_corpus
from ember.data.readers import DocumentReader
from ember.data.sentences import split_sentences
from ember.paths import data_root
from ember.tokenizers import load_tokenizer


def _timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--inputs", nargs="+",
                        default=sorted(glob.glob(str(data_root() / "wiki-en/AA/wiki_0*.gz"))))
    parser.add_argument("--repeat", type=int, default=2, help="best of N runs per stage")
    args = parser.parse_args()
    tok = load_tokenizer(args.tokenizer)

    docs = [d.text for d in DocumentReader(args.inputs)]
    mb = sum(len(d.encode("utf-8")) for d in docs) / 1e6
    sentences = [s for d in docs for s in split_sentences(d)]
    print(f"{len(args.inputs)} files, {len(docs)} docs, {len(sentences)} sentences, {mb:.1f} MB")

    def best(fn):
        return min(_timed(fn)[1] for _ in range(args.repeat))

    rows = [
        ("read", best(lambda: sum(1 for _ in DocumentReader(args.inputs)))),
        ("read+split", best(lambda: sum(len(split_sentences(d.text))
                                        for d in DocumentReader(args.inputs)))),
        ("encode docs (bare)", best(lambda: tok.encode_batch(docs, add_special_tokens=False))),
        ("encode_fast docs", best(lambda: tok.encode_batch_fast(docs, add_special_tokens=False))),
        ("encode sents (bare)", best(lambda: tok.encode_batch(sentences, add_special_tokens=False))),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        rows.append(("prepare (end to end)", best(lambda: prepare_corpus(
            args.inputs, args.tokenizer, Path(tmp) / "out", progress=False, overwrite=True))))
    for name, seconds in rows:
        print(f"{name:22s} {seconds:6.2f} s  {mb / seconds:6.2f} MB/s")


if __name__ == "__main__":
    main()
