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

Languages, for XLM (objectives xlm_mlm, xlm_clm, tlm, xlm_mlm_tlm; docs/xlm.md): instead of
INPUTs, give monolingual text per language with --lang CODE=PATH and parallel sentences with
--parallel SRC-TGT=FILE, a TSV of source<TAB>target lines (or --parallel FILE whose lines are
src_lang<TAB>tgt_lang<TAB>source<TAB>target). Language ids follow --languages en,ru when
given, else the order the codes first appear. A line with a missing side or an unknown
language code stops with its file:line.

Across machines (or job-array tasks; docs/distributed.md): --part i/N tokenizes the i-th of N
contiguous shares of the input files into its own folder (holdout and shard settings are
recorded, applied at the merge); --merge PART_DIR... --out DIR combines parts 1..N into one
corpus identical, token for token, to a single run over all the inputs.

examples:
  ember prepare ../shared/data/wiki-en --tokenizer runs/tok/tokenizer.json --out runs/wiki-prepared
  ember prepare ../shared/data/wiki-en --tokenizer runs/tok --out runs/wiki-phrases --phrases detect
  ember prepare '../shared/data/wiki-en/*/*.gz' --tokenizer runs/tok --out parts/p2 --part 2/8
  ember prepare --merge parts/p1 parts/p2 ... parts/p8 --out runs/wiki-prepared
  ember prepare --lang en=../shared/data/wiki-en --lang ru='../shared/data/ruslit/*/*.txt' --parallel en-ru=pairs.tsv \
      --tokenizer runs/xlm-tok --out runs/en-ru
"""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "prepare", help="tokenize a corpus into shards for pre-training", description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("inputs", nargs="*", metavar="INPUT",
                        help="text files, folders (searched recursively) or glob patterns; "
                             "plain, .gz or .bz2 (or --lang/--parallel for a multilingual corpus)")
    parser.add_argument("--lang", action="append", default=[], metavar="CODE=PATH",
                        help="monolingual text of one language (XLM); repeat per language or path")
    parser.add_argument("--parallel", action="append", default=[], metavar="[SRC-TGT=]FILE",
                        help="parallel sentences for TLM: a TSV of source<TAB>target lines in "
                             "languages SRC and TGT, or FILE of src_lang<TAB>tgt_lang<TAB>source<TAB>target")
    parser.add_argument("--languages", metavar="CODES",
                        help="with --lang/--parallel: all language codes in id order, e.g. en,ru "
                             "(default: the order they first appear); any other code is an error")
    parser.add_argument("--part", metavar="I/N",
                        help="tokenize only the I-th of N shares of the input files (1 <= I <= N), "
                             "into --out, for a later --merge")
    parser.add_argument("--merge", action="store_true",
                        help="INPUTs are the N folders of --part runs: combine them into --out")
    parser.add_argument("--tokenizer", metavar="PATH",
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
    parser.add_argument("--max-docs", "--max-documents", dest="max_docs", type=int, metavar="N",
                        help="stop after N non-empty documents (default: all; --max-documents, as "
                             "ember tokenizer train spells it, works too)")
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
    parser.add_argument("--workers", type=int, metavar="N",
                        help="processes that split and tokenize (default: the cores this process may use; "
                        "1 = in this process); the output is the same for any N. Plain INPUTs only: --part and "
                        "--lang/--parallel run in one process")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (for logs)")
    parser.set_defaults(run=run)


def run(args) -> int:
    import sys

    from ember.data.prepare import format_summary, prepare_corpus
    from ember.data.prepare_pool import default_workers
    from ember.errors import EmberError

    if args.merge:
        return run_merge(args)
    if not args.tokenizer:
        raise EmberError("--tokenizer is required (tokenizer.json from `ember tokenizer train`)")
    if args.part:
        return run_part(args)
    if args.lang or args.parallel:
        if args.inputs:
            raise EmberError("give either INPUT paths or --lang/--parallel (a multilingual corpus), not both")
        return run_multilingual(args)
    if args.workers is not None and args.workers < 1:
        raise EmberError(f"--workers {args.workers}: give at least 1 process")
    if not args.inputs:
        raise EmberError("no input: give INPUT paths, or --lang CODE=PATH / --parallel SRC-TGT=FILE")

    stats = prepare_corpus(
        args.inputs, args.tokenizer, args.out, fmt=args.fmt, text_field=args.text_field,
        valid_fraction=args.valid_fraction, shard_tokens=args.shard_tokens,
        max_docs=args.max_docs, seed=args.seed, progress=not args.no_progress,
        overwrite=args.overwrite, phrases=args.phrases, phrase_min_count=args.phrase_min_count,
        phrase_threshold=args.phrase_threshold, phrase_sample_docs=args.phrase_sample_docs,
        workers=default_workers() if args.workers is None else args.workers,
    )
    for warning in stats["warnings"]:
        print(f"ember prepare: warning: {warning}", file=sys.stderr)
    print(format_summary(stats))
    return 0


def run_multilingual(args) -> int:
    from ember.data.multilingual import parse_language_inputs, parse_parallel_inputs, prepare_multilingual
    from ember.errors import EmberError

    if args.phrases != "none":
        raise EmberError("--phrases is not available with --lang/--parallel (XLM masks single tokens)")
    stats = prepare_multilingual(
        parse_language_inputs(args.lang), parse_parallel_inputs(args.parallel), args.tokenizer, args.out,
        languages=[c.strip() for c in args.languages.split(",")] if args.languages else None,
        fmt=args.fmt, text_field=args.text_field, valid_fraction=args.valid_fraction,
        shard_tokens=args.shard_tokens, max_docs=args.max_docs, seed=args.seed,
        progress=not args.no_progress, overwrite=args.overwrite,
    )
    print(f"prepared {len(stats['streams'])} streams in languages {', '.join(stats['languages'])} "
          f"(ids 0..{len(stats['languages']) - 1}) -> {stats['out_dir']}")
    for s in stats["streams"]:
        tr, va = s["splits"]["train"], s["splits"]["valid"]
        unit = "pairs" if s["kind"] == "parallel" else "docs"
        print(f"  {s['name']:>8} {s['kind']:<8} train {tr['docs'][1] - tr['docs'][0]:,} {unit} / "
              f"{tr['num_tokens']:,} tokens, valid {va['docs'][1] - va['docs'][0]:,} {unit} / "
              f"{va['num_tokens']:,} tokens")
    return 0


def run_part(args) -> int:
    """`ember prepare INPUT... --part i/N`: one share of the inputs (ember.data.parts)."""
    from ember.data.parts import prepare_part
    from ember.data.prepare import format_summary
    from ember.errors import EmberError

    if args.lang or args.parallel or not args.inputs:
        raise EmberError("--part splits INPUT files (not --lang/--parallel); give the same INPUTs on every part")
    stats = prepare_part(
        args.inputs, args.tokenizer, args.out, args.part, valid_fraction=args.valid_fraction, seed=args.seed,
        shard_tokens=args.shard_tokens, max_docs=args.max_docs, phrases=args.phrases, fmt=args.fmt,
        text_field=args.text_field, progress=not args.no_progress, overwrite=args.overwrite)
    print(format_summary(stats) + f" (part {args.part}; combine the parts with `ember prepare --merge`)")
    return 0


def run_merge(args) -> int:
    """`ember prepare --merge PART_DIR... --out DIR`."""
    from ember.data.parts import merge_parts

    meta = merge_parts(args.inputs, args.out, overwrite=args.overwrite)
    tr, va = meta["splits"]["train"], meta["splits"]["valid"]
    print(f"merged {len(meta['merged_from'])} parts: train {tr['num_docs']:,} docs / {tr['num_tokens']:,} tokens, "
          f"valid {va['num_docs']:,} docs / {va['num_tokens']:,} tokens -> {args.out}")
    return 0
