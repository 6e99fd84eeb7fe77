"""`ember tokenizer train`: train a WordPiece / byte-level BPE / Unigram tokenizer."""

from __future__ import annotations

import argparse

HELP = """\
Train a subword tokenizer on raw text and save it as a single tokenizer.json.

  wordpiece  BERT style: [CLS] A [SEP] B [SEP], '##' marks word continuations
  bpe        RoBERTa / GPT-2 style byte-level BPE: <s> A </s></s> B </s>, no unknown characters
  unigram    SentencePiece style (T5): '▁' marks word starts; T5's layout <pad>=0 </s>=1 <unk>=2,
             100 sentinels <extra_id_99>..<extra_id_0> last, '</s>' appended (for ALBERT's
             [CLS]/[SEP] template pass --special-tokens [PAD] [UNK] [CLS] [SEP] [MASK])

Lower-casing keeps accents and Hangul intact (no NFD accent stripping).

A shared multilingual vocabulary (XLM, Lample & Conneau 2019 §3.1): give each language's
text with --lang CODE=PATH instead of INPUTs. Sentences are then resampled so language i
has the share q_i = p_i^alpha / sum_j p_j^alpha of the text the trainer sees (p_i: its
share of the sentences; alpha 0.5 by default), so a smaller language keeps whole words.

examples:
  ember tokenizer train ../shared/data/wiki-en/AA --vocab-size 30522 --out runs/tok/tokenizer.json
  ember tokenizer train --kind bpe --lang en=../shared/data/wiki-en --lang ru='../shared/data/ruslit/*/*.txt' \
      --alpha 0.5 --vocab-size 16000 --no-lowercase --out runs/xlm-tok
"""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "tokenizer", help="train a subword tokenizer",
        description="Tokenizer tools. See `ember tokenizer train --help`.",
    )
    sub = parser.add_subparsers(dest="tokenizer_command", metavar="<action>")
    train = sub.add_parser(
        "train", help="train a tokenizer on text files", description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument("inputs", nargs="*", metavar="INPUT",
                       help="text files, folders (searched recursively) or glob patterns; "
                            "plain, .gz or .bz2 (or use --lang for a multilingual vocabulary)")
    train.add_argument("--lang", action="append", default=[], metavar="CODE=PATH",
                       help="one language's text for a shared multilingual vocabulary; repeat per "
                            "language (and per path); sentences are balanced with --alpha")
    train.add_argument("--alpha", type=float, default=0.5,
                       help="--lang: language-sampling exponent, q_i ~ p_i^alpha (default: 0.5, XLM's)")
    train.add_argument("--seed", type=int, default=0, help="--lang: seed of the sentence resample (default: 0)")
    train.add_argument("--kind", choices=["wordpiece", "bpe", "unigram"], default="wordpiece",
                       help="tokenizer model (default: wordpiece)")
    train.add_argument("--vocab-size", type=int, default=30522,
                       help="vocabulary size including special tokens (default: 30522, BERT's)")
    train.add_argument("--no-lowercase", dest="lowercase", action="store_false",
                       help="keep case (cased models); default lower-cases the text")
    train.add_argument("--special-tokens", nargs="+", metavar="TOKEN",
                       help="the full list of special tokens, given ids 0, 1, ... in order; must "
                            "include pad, unk, cls, sep and mask tokens, cls and mask only without "
                            "sentinels (default: [PAD] [UNK] [CLS] [SEP] [MASK]; for bpe: <s> <pad> "
                            "</s> <unk> <mask> <|endoftext|>; for unigram: T5's <pad> </s> <unk>)")
    train.add_argument("--sentinels", type=int, metavar="N",
                       help="T5 sentinel tokens <extra_id_0>..<extra_id_N-1> at the end of the "
                            "vocabulary, counted in --vocab-size (default: 100 for unigram, as T5; "
                            "0 otherwise); span corruption needs them")
    train.add_argument("--min-frequency", type=int, default=2,
                       help="ignore merges seen fewer times than this (wordpiece/bpe; default: 2)")
    train.add_argument("--max-documents", "--max-docs", dest="max_documents", type=int, metavar="N",
                       help="train on the first N non-empty documents only (default: all; --max-docs, as "
                            "ember prepare spells it, works too)")
    train.add_argument("--format", dest="fmt", default="auto",
                       choices=["auto", "text", "lines", "jsonl", "wiki"],
                       help="input format: text = blank-line separated documents, lines = one "
                            "document per line, jsonl = JSON objects, wiki = WikiExtractor "
                            "<doc> blocks; auto guesses per file (default)")
    train.add_argument("--text-field", default="text",
                       help="JSONL field holding the text (default: text)")
    train.add_argument("--out", required=True, metavar="PATH",
                       help="where to write the tokenizer: a .json file, or a folder that "
                            "receives tokenizer.json")
    train.add_argument("--no-progress", action="store_true", help="no progress bars (for logs)")
    train.set_defaults(run=run_train)
    parser.set_defaults(run=lambda args: parser.print_help() or 2)


def run_train(args) -> int:
    from pathlib import Path

    from ember.data.language_mix import LanguageBalancedSentences
    from ember.data.multilingual import parse_language_inputs
    from ember.errors import EmberError
    from ember.tokenizers.train import special_token_ids, tokenizer_kind, train_tokenizer

    out = Path(args.out)
    if out.suffix != ".json":
        out = out / "tokenizer.json"
    if bool(args.inputs) == bool(args.lang):
        raise EmberError("give either INPUT paths or --lang CODE=PATH options (a multilingual "
                         "vocabulary), not both and not neither")
    source = args.inputs
    if args.lang:
        source = LanguageBalancedSentences(parse_language_inputs(args.lang), args.alpha, args.seed,
                                           args.max_documents, args.fmt, args.text_field)
    tok = train_tokenizer(
        source, kind=args.kind, vocab_size=args.vocab_size, lowercase=args.lowercase,
        special_tokens=args.special_tokens, min_frequency=args.min_frequency,
        max_documents=args.max_documents, progress=not args.no_progress,
        fmt=args.fmt, text_field=args.text_field, sentinels=args.sentinels,
    )
    if args.lang:
        print("language-balanced sentences (XLM §3.1):\n" + source.summary())
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out))
    ids = ", ".join(f"{k}={v}" for k, v in special_token_ids(tok).items())
    print(f"saved {tokenizer_kind(tok)} tokenizer, {tok.get_vocab_size()} tokens ({ids}) → {out}")
    return 0
