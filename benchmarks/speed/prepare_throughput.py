"""Corpus preparation: `ember prepare` against bare `tokenizers` encoding of the same text.

    PYTHONPATH=. nice -n 19 .venv/bin/python benchmarks/speed/prepare_throughput.py \
        --tokenizer RUN/tokenizer.json [--files 10] [--repeats 3] [--workers 1,2]

Stages (MB = decompressed UTF-8 text of the first --files wiki-en files):
  read                  stream documents only
  read+split            plus sentence splitting
  encode docs (bare)    Tokenizer.encode_batch on whole documents, text already in memory
  encode_fast docs      Tokenizer.encode_batch_fast, same input (no offsets)
  prepare (end to end)  ember's full pipeline: read, split, encode, write shards to a temp folder
  prepare, N processes  the same with --workers N (``--workers 1,2``): splitting and encoding
                        in N worker processes, the same shards
Overhead = prepare time / bare encode_batch time - 1: what reading, splitting and writing
add on top of tokenizing. The bare encode is timed in turn with prepare (alternating
repetitions, medians), so both see the same machine load.

Peak memory: `ember prepare` runs in a fresh child process on the first N and the first 4N
files; the child reports its peak RSS (ru_maxrss) and its current RSS after imports. Flat memory means the
peak does not grow with the input (documents are processed in batches of ~2 MB of text).
"""

from __future__ import annotations

import argparse
import glob
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
from _bench import alternate, load, machine, median  # noqa: E402

from ember.data.prepare import prepare_corpus  # noqa: E402
from ember.data.readers import DocumentReader  # noqa: E402
from ember.data.sentences import split_sentences  # noqa: E402
from ember.paths import data_root  # noqa: E402
from ember.tokenizers import load_tokenizer  # noqa: E402

_CHILD = """
import os, resource, sys, json
from ember.data.prepare import prepare_corpus
base = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1024  # current RSS, KB
inputs, tok, out = json.loads(sys.argv[1])
prepare_corpus(inputs, tok, out, progress=False, overwrite=True)
print(json.dumps({"base_mb": base / 1024, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def peak_memory(inputs: list[str], tokenizer: str) -> dict:
    """Peak RSS (MB) of `prepare_corpus` over ``inputs`` in a fresh process."""
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps([inputs, tokenizer, f"{tmp}/out"])],
                             capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def text_mb(inputs: list[str]) -> float:
    return sum(len(d.text.encode("utf-8")) for d in DocumentReader(inputs)) / 1e6


def smoke_tokenizer(inputs: list[str], folder: str) -> str:
    """A small WordPiece trained on the inputs (smoke mode: no tokenizer needed)."""
    from ember.tokenizers.train import train_tokenizer

    path = Path(folder) / "tokenizer.json"
    train_tokenizer(inputs, kind="wordpiece", vocab_size=2000, max_documents=200, progress=False).save(str(path))
    return str(path)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", help="tokenizer.json (e.g. from `ember tokenizer train`)")
    parser.add_argument("--files", type=int, default=10, help="first N wiki-en files (~1 MB of text each)")
    parser.add_argument("--memory-files", type=int, default=0,
                        help="N for the peak-memory check at N and 4N files (default: --files / 4)")
    parser.add_argument("--repeats", type=int, default=3, help="alternating repetitions (medians)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--workers", default="1", help="comma-separated process counts for `prepare` "
                        "(e.g. 1,2: each timed in the same alternation; speed-up against the first)")
    parser.add_argument("--smoke", action="store_true", help="one file, a freshly trained small tokenizer (CI)")
    args = parser.parse_args(argv)
    all_files = sorted(glob.glob(str(data_root() / "wiki-en/*/wiki_*.gz")))
    if not all_files:
        sys.exit(f"no wiki-en files under {data_root()}; set EMBER_DATA")
    if args.smoke:
        args.files, args.memory_files, args.repeats = 1, 1, 1
    inputs = all_files[:args.files]
    print(machine())
    with tempfile.TemporaryDirectory() as tmp:
        if args.tokenizer is None:
            if not args.smoke:
                parser.error("--tokenizer is required (only --smoke trains its own)")
            args.tokenizer = smoke_tokenizer(inputs, tmp)
        tok = load_tokenizer(args.tokenizer)
        docs = [d.text for d in DocumentReader(inputs)]
        mb = sum(len(d.encode("utf-8")) for d in docs) / 1e6
        print(f"{len(inputs)} files, {len(docs)} docs, {mb:.1f} MB; {load()}", flush=True)

        def speed(fn):
            def run():
                start = time.perf_counter()
                fn()
                return mb / (time.perf_counter() - start)
            return run

        out = Path(tmp) / "out"
        stages = {
            "read": speed(lambda: sum(1 for _ in DocumentReader(inputs))),
            "read+split": speed(lambda: sum(len(split_sentences(d.text)) for d in DocumentReader(inputs))),
            "encode docs (bare)": speed(lambda: tok.encode_batch(docs, add_special_tokens=False)),
            "encode_fast docs": speed(lambda: tok.encode_batch_fast(docs, add_special_tokens=False)),
        }
        workers = [int(w) for w in args.workers.split(",")]
        names = {w: "prepare (end to end)" if w == 1 else f"prepare, {w} processes" for w in workers}
        for w in workers:
            stages[names[w]] = speed(lambda w=w: prepare_corpus(inputs, args.tokenizer, out, progress=False,
                                                                overwrite=True, workers=w))
        rates = alternate(stages, args.repeats)
        result = {"machine": machine(), "files": len(inputs), "mb": mb, "load_after": load(),
                  "mb_per_s": {name: median(v) for name, v in rates.items()}}
        r = result["mb_per_s"]
        first = r[names[workers[0]]]
        result["overhead_vs_encode_batch"] = r["encode docs (bare)"] / first - 1
        result["overhead_vs_encode_batch_fast"] = r["encode_fast docs"] / first - 1
        result["speedup"] = {w: r[names[w]] / first for w in workers}
        result["all_mb_per_s"] = {name: v for name, v in rates.items()}
        n = args.memory_files or max(1, args.files // 4)
        result["memory"] = []
        for count in (n, 4 * n):
            files = all_files[:count]
            result["memory"].append({"files": len(files), "mb": text_mb(files), **peak_memory(files, args.tokenizer)})
    print(f"\n{'stage':22s} {'MB/s':>7s}   ({result['load_after']})")
    for name, value in r.items():
        print(f"{name:22s} {value:7.2f}")
    for w, x in result["speedup"].items():
        print(f"prepare on {w} process(es): {x:.2f}x the first")
    print(f"overhead of prepare over bare encode_batch: {100 * result['overhead_vs_encode_batch']:+.1f}% "
          f"(over encode_batch_fast: {100 * result['overhead_vs_encode_batch_fast']:+.1f}%)")
    for m in result["memory"]:
        print(f"peak RSS preparing {m['files']:3d} files ({m['mb']:6.1f} MB): {m['peak_mb']:6.0f} MB "
              f"(after imports {m['base_mb']:.0f} MB)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
