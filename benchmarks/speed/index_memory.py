"""Pre-training start-up: peak memory and time of building the training index at scale.

    PYTHONPATH=. nice -n 19 .venv/bin/python benchmarks/speed/index_memory.py --sentences 1e6,1e7,1e8

For each size, a synthetic prepared corpus in ember's shard format is written to a temporary
folder: sentence lengths drawn like Wikipedia's (mean ~25 tokens, 1 in ~200 longer than the
126-token packing budget), ~30 sentences per document, in shards of 5*10^7 sentences (as
`ember prepare` rotates them). Only the sentence and document offsets hold data (8 B per
sentence); the token files are sparse, since building the index never reads a token.

Then, in a fresh process per (size, packing), ``TokenCorpus`` opens it and the dataset a
pre-training run builds before its first step is constructed:
  segments        BERT's chunks (SegmentPairDataset, build_chunks), max_seq_length 128
  full_sentences  RoBERTa's packed sequences (PackedSentenceDataset, pack_units), 128
Reported: seconds, peak RSS (ru_maxrss, which counts resident memmap pages too) and RSS
after imports, as a table and JSON (--out). Target (issue 22): peak RSS under 2 GB at 10^8
sentences, time linear in the corpus size.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

BLOCK = 1 << 22
SHARD_SENTENCES = 50_000_000

_CHILD = """
import json, os, resource, sys, time
import numpy as np
import ember
from ember.data.shards import TokenCorpus
from ember.data.packing import build_pretraining_dataset
from ember.config import DataConfig
base = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
folder, packing = sys.argv[1], sys.argv[2]
started = time.perf_counter()
corpus = TokenCorpus(folder)
data = build_pretraining_dataset(corpus, DataConfig(max_seq_length=128, packing=packing),
                                 "nsp" if packing == "segments" else "none", seed=0, sep_id=3)
seconds = time.perf_counter() - started
example = data.example(len(data) // 2)  # the index answers: one example from the middle
print(json.dumps({"seconds": seconds, "examples": len(data), "base_mb": base, "ember": os.path.dirname(ember.__file__),
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def write_corpus(folder: Path, n_sentences: int, seed: int = 0) -> None:
    """A prepared corpus of ``n_sentences`` with real offsets and sparse token files."""
    rng = np.random.default_rng(seed)
    train = folder / "train"
    train.mkdir(parents=True)
    shards, total_docs, total_tokens = [], 0, 0
    for k, first in enumerate(range(0, n_sentences, SHARD_SENTENCES)):
        count = min(SHARD_SENTENCES, n_sentences - first)
        names = {"tokens": f"shard_{k:05d}.tokens.bin", "sentences": f"shard_{k:05d}.sentences.bin",
                 "docs": f"shard_{k:05d}.docs.bin"}
        tokens = docs = 0
        with open(train / names["sentences"], "wb") as ends, open(train / names["docs"], "wb") as doc_ends:
            for done in range(0, count, BLOCK):
                n = min(BLOCK, count - done)
                lengths = np.minimum(1 + rng.geometric(1 / 24, n), 600)  # mean ~25, a tail past 126
                (tokens + np.cumsum(lengths)).astype("<i8").tofile(ends)
                tokens += int(lengths.sum())
                # documents: ~30 sentences each, never crossing a block (so never a shard)
                cuts = np.flatnonzero(rng.random(n) < 1 / 30)
                cuts = np.append(cuts[cuts > 0], n) + done
                cuts.astype("<i8").tofile(doc_ends)
                docs += len(cuts)
        with open(train / names["tokens"], "wb") as fh:
            fh.truncate(tokens * 2)  # uint16 ids, sparse: never read while indexing
        shards.append({"files": names, "num_docs": docs, "num_sentences": count, "num_tokens": tokens})
        total_docs, total_tokens = total_docs + docs, total_tokens + tokens
    (folder / "tokenizer.json").write_text("{}")
    meta = {"format": "ember-token-shards", "format_version": 1, "dtype": "uint16",
            "tokenizer": {"file": "tokenizer.json", "vocab_size": 30522},
            "special_token_ids": {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4},
            "splits": {"train": {"num_docs": total_docs, "num_sentences": n_sentences, "num_tokens": total_tokens,
                                 "shards": shards}}}
    (folder / "meta.json").write_text(json.dumps(meta))


def measure(folder: Path, packing: str) -> dict:
    # cwd: the corpus folder, so `-c`'s sys.path[0] (the cwd) cannot shadow PYTHONPATH's ember
    # (comparing against an older checkout by PYTHONPATH=that/checkout)
    done = subprocess.run([sys.executable, "-c", _CHILD, str(folder), packing], capture_output=True, text=True,
                          check=False, cwd=folder)
    if done.returncode:
        raise SystemExit(f"{packing} on {folder} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sentences", default="1e6,1e7,1e8", help="corpus sizes, comma-separated")
    p.add_argument("--packings", default="segments,full_sentences")
    p.add_argument("--tmp", default=None, help="folder for the synthetic corpora (8 B per sentence on disk)")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args()
    rows = []
    for size in [int(float(s)) for s in args.sentences.split(",")]:
        with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
            write_corpus(Path(tmp) / "corpus", size)
            for packing in args.packings.split(","):
                row = {"sentences": size, "packing": packing, **measure(Path(tmp) / "corpus", packing)}
                row["ns_per_sentence"] = 1e9 * row["seconds"] / size
                rows.append(row)
                print(f"{size:>12,} sentences  {packing:<15} {row['seconds']:8.1f} s  "
                      f"{row['ns_per_sentence']:6.0f} ns/sentence  peak RSS {row['peak_mb']:7.0f} MB  "
                      f"(after imports {row['base_mb']:.0f} MB)  {row['examples']:,} examples  [{row['ember']}]",
                      flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
