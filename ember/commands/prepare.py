"""`ember prepare`: tokenize a raw corpus into memory-mapped shards for pre-training."""

from __future__ import annotations

import argparse

HELP = """\
Read raw text, split it into documents and sentences, tokenize it (without special tokens)
and write memory-mapped token shards plus meta.json and a copy of the tokenizer to --out.
A fraction of documents is held out as the valid split. The output is written to a
temporary folder and renamed into place only when complete.

Phrases, for ERNIE-style masking (data.masking: phrase): --phrases stores per token whether
it joins the previous token's phrase/entity unit.
  --phrases spans   JSONL input, one document per line, with character spans:
                      {"text": "Barack Obama visited New York.", "spans": [[0, 12], [21, 29]]}
                    [start, end] are 0-based offsets into the "text" string as stored in the
                    JSON (Unicode code points, end exclusive), non-overlapping, any order; a
                    line without "spans" has no phrases. Bad spans stop with file:line.
  --phrases detect  a built-in detector fitted on the first --phrase-sample-docs documents:
                    collocations (adjacent word pairs seen >= --phrase-min-count times with
                    normalised PMI >= --phrase-threshold, chained into n-grams) and
                    capitalised name sequences ("New York", "Bank of England"); full rules
                    in ember/data/phrases.py.
A token belongs to a span its characters overlap; units never cross sentences.

examples:
  ember prepare data/wiki-en --tokenizer runs/tok/tokenizer.json --out runs/wiki-prepared
  ember prepare data/wiki-en --tokenizer runs/tok --out runs/wiki-phrases --phrases detect
"""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "prepare", help="tokenize a corpus into shards for pre-training", description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("inputs", nargs="+", metavar="INPUT",
                        help="text files, folders (searched recursively) or glob patterns; "
                             "plain, .gz or .bz2")
    parser.add_argument("--tokenizer", required=True, metavar="PATH",
                        help="tokenizer.json (or a folder holding one) from `ember tokenizer train`")
    parser.add_argument("--out", required=True, metavar="DIR", help="output folder")
    parser.add_argument("--format", dest="fmt", default="auto",
                        choices=["auto", "text", "lines", "jsonl", "wiki"],
                        help="input format: text = blank-line separated documents, lines = one "
                             "document per line, jsonl = JSON objects, wiki = WikiExtractor "
                             "<doc> blocks; auto guesses per file (default)")
    parser.add_argument("--text-field", default="text",
                        help="JSONL field holding the text (default: text)")
    parser.add_argument("--valid-fraction", type=float, default=0.01,
                        help="fraction of documents held out as the valid split, chosen by a "
                             "seeded hash; 0 for none (default: 0.01)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the holdout hash (default: 0)")
    parser.add_argument("--max-docs", type=int, metavar="N",
                        help="stop after N non-empty documents (default: all)")
    parser.add_argument("--shard-tokens", type=int, default=50_000_000, metavar="N",
                        help="start a new shard after about N tokens (default: 50,000,000)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing non-empty --out (only once the new one is complete)")
    parser.add_argument("--phrases", default="none", choices=["none", "spans", "detect"],
                        help="store phrase/entity units for ERNIE masking: from JSONL spans or "
                             "the built-in detector (see above; default: none)")
    parser.add_argument("--phrase-min-count", type=int, default=5, metavar="N",
                        help="detect: a collocation is seen at least N times (default: 5)")
    parser.add_argument("--phrase-threshold", type=float, default=0.5, metavar="X",
                        help="detect: minimum normalised PMI of a collocation, in [-1, 1] (default: 0.5)")
    parser.add_argument("--phrase-sample-docs", type=int, default=5000, metavar="N",
                        help="detect: documents read to fit the detector (default: 5000)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (for logs)")
    parser.set_defaults(run=run)


def run(args) -> int:
    import sys

    from ember.data.prepare import format_summary, prepare_corpus

    stats = prepare_corpus(
        args.inputs, args.tokenizer, args.out, fmt=args.fmt, text_field=args.text_field,
        valid_fraction=args.valid_fraction, shard_tokens=args.shard_tokens,
        max_docs=args.max_docs, seed=args.seed, progress=not args.no_progress,
        overwrite=args.overwrite, phrases=args.phrases, phrase_min_count=args.phrase_min_count,
        phrase_threshold=args.phrase_threshold, phrase_sample_docs=args.phrase_sample_docs,
    )
    for warning in stats["warnings"]:
        print(f"ember prepare: warning: {warning}", file=sys.stderr)
    print(format_summary(stats))
    return 0
