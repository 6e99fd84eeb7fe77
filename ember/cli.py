"""`ember <verb>`: the command-line entry point.

Each verb lives in its own module under ``ember/commands/`` and exposes
``register(subparsers)``, which adds a parser whose ``run`` default is a plain function
taking the parsed arguments. Modules are imported only when the CLI starts, and heavy
libraries (torch, tokenizers) are imported inside the ``run`` functions so ``--help`` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ember.errors import EmberError

# Order here is the order `ember --help` lists the verbs.
COMMAND_MODULES = [
    "quickstart",
    "tokenizer",
    "prepare",
    "pretrain",
    "finetune",
    "evaluate",
    "predict",
    "fill_mask",
    "embed",
    "generate",
    "fewshot",
    "convert",
    "export",
    "serve",
    "report",
    "compare",
    "glue",
    "elmo_features",
    "distill",
    "sweep",
    "kg",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ember",
        description="Pre-train, fine-tune, evaluate, export and serve BERT-era language models.",
    )
    sub = parser.add_subparsers(dest="command", metavar="<verb>")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"ember.commands.{name}")
        except ModuleNotFoundError as exc:  # a verb still being written must not break the rest
            if exc.name == f"ember.commands.{name}":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        result = args.run(args)
    except EmberError as exc:
        # One write with its newline: ranks of a torchrun job share one stream, and a message
        # written apart from its newline can be split by another rank's line.
        sys.stderr.write(f"ember {args.command}: error: {exc}\n")
        sys.stderr.flush()
        return 1
    except KeyboardInterrupt:
        print(f"ember {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
