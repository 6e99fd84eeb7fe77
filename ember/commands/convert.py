"""`ember convert`: import a Hugging Face encoder checkpoint, or export a run to HF layout."""

from __future__ import annotations

from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("convert", help="Hugging Face checkpoint <-> ember run folder",
                       description="--from-hf HF_DIR --out RUN: import a local HF checkpoint of "
                       "BERT, RoBERTa, ALBERT, ELECTRA, DistilBERT, GPT-2, OpenAI GPT, XLNet, XLM or T5 (a sentence-transformers "
                       "folder keeps its pooling) (config.json + model.safetensors or "
                       "pytorch_model.bin; tokenizer.json, vocab.txt or vocab.json + merges.txt). --to-hf RUN --out HF_DIR: export an ember run (or one of its checkpoints, RUN/checkpoints/step-N, "
                       "sharded or not) to the same layout, "
                       "loadable with transformers' from_pretrained. --long N (with --from-hf or --from-run RUN): "
                       "make the encoder long (Longformer §5): N positions copied from the trained ones, "
                       "global projections copied from the local ones, sliding-window attention of --window "
                       "tokens (docs/long.md); a long model exports (--to-hf) as a transformers Longformer. "
                       "Nothing is downloaded.")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--from-hf", metavar="HF_DIR", help="HF checkpoint folder to import")
    group.add_argument("--to-hf", metavar="RUN_DIR", help="ember run folder to export")
    group.add_argument("--from-run", metavar="RUN_DIR", help="ember run folder to make long (with --long)")
    p.add_argument("--out", required=True, help="folder to write (written whole or not at all; an existing "
                   "folder with files in it is refused without --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out folder and everything in it")
    p.add_argument("--long", type=int, metavar="N", help="make the encoder long: N positions (copied from the "
                   "trained ones) and Longformer attention, or BigBird's with --attention bigbird; with --from-hf or "
                   "--from-run")
    p.add_argument("--window", default="512", metavar="W", help="with --long: Longformer's window w (even; "
                   "w/2 tokens each side), one value or one per layer (\"256,256,512,...\"); default 512")
    p.add_argument("--global-tokens", type=int, metavar="G", help="with --long: the first G positions attend "
                   "globally unless a caller names its own (1 = [CLS], for classification); default: the model's (0)")
    p.add_argument("--attention", default="longformer", choices=("longformer", "bigbird", "reformer"),
                   help="with --long: Longformer's window (default), BigBird's block-sparse attention or "
                   "Reformer's LSH attention (shared QK from the trained queries: needs continued training)")
    p.add_argument("--block", type=int, default=64, help="with --long --attention bigbird: tokens per block (64)")
    p.add_argument("--random-blocks", type=int, default=3,
                   help="with --long --attention bigbird: random blocks per query block (3)")
    p.add_argument("--chunk", type=int, default=64, help="with --long --attention reformer: tokens per LSH chunk (64)")
    p.add_argument("--hashes", type=int, default=2, help="with --long --attention reformer: hash rounds (2)")
    p.add_argument("--buckets", type=int, default=0,
                   help="with --long --attention reformer: LSH buckets, even (0: about 2 T / chunk)")
    p.set_defaults(run=run)


def run(args) -> int:
    from ember.errors import EmberError
    from ember.fileio import atomic_folder
    from ember.interop.convert import export_hf, import_hf
    from ember.runs.folder import holds
    from ember.runs.sharded import weights_view

    long = getattr(args, "long", None)
    if getattr(args, "from_run", None) and long is None:
        raise EmberError("--from-run makes a run long: give --long N (the new number of positions)")
    if long is not None and args.to_hf:
        raise EmberError("--long makes a model long on import (--from-hf) or from a run (--from-run); export "
                         "the long run with --to-hf afterwards")
    if long is None and (args.window != "512" or args.global_tokens is not None or args.attention != "longformer"
                         or args.block != 64 or args.random_blocks != 3 or args.chunk != 64 or args.hashes != 2
                         or args.buckets):
        raise EmberError("--window, --global-tokens, --attention, --block, --random-blocks, --chunk, --hashes and "
                         "--buckets apply with --long N")
    options = {"longformer": {"window": args.window, "global_first": args.global_tokens},
               "bigbird": {"attention": "bigbird", "block": args.block, "random_blocks": args.random_blocks},
               "reformer": {"attention": "reformer", "chunk": args.chunk, "hashes": args.hashes,
                            "buckets": args.buckets}}[args.attention]
    if long is not None and long < 1:
        raise EmberError(f"--long {long}: give the number of positions of the long model (e.g. 4096)")
    source, out = Path(args.from_hf or args.to_hf or args.from_run), Path(args.out)
    if holds(out, source):
        raise EmberError(f"--out {out} would replace the folder being converted ({source}); choose another folder")
    if out.exists() and not out.is_dir():
        raise EmberError(f"--out {out} is a file; name a folder to write")
    again = args.from_hf and long is None and earlier_import_of(source, out)  # e.g. the README's import run twice: harmless
    if out.is_dir() and any(out.iterdir()) and not (args.overwrite or again):
        raise EmberError(f"--out {out} already exists and is not an empty folder; pass --overwrite to replace it "
                         "and everything in it, or choose another folder")
    # The folder is written beside --out and swapped in when complete (an interrupted or failed
    # conversion leaves the old folder, or none, never a mix of two models' files).
    with atomic_folder(out) as tmp:
        if long is not None:
            from ember.interop.long import lengthen_run

            if args.from_hf:  # imported into a scratch folder, then made long into the output
                import tempfile

                with tempfile.TemporaryDirectory(prefix="ember-long-") as scratch:
                    import_hf(args.from_hf, Path(scratch))
                    lengthen_run(Path(scratch), tmp, long, **options)
            else:
                lengthen_run(source, tmp, long, **options)
        elif args.from_hf:
            import_hf(args.from_hf, tmp)
        else:
            with weights_view(args.to_hf) as run_dir:  # a checkpoint (sharded or not) is read directly
                export_hf(run_dir, tmp)
    if long is not None:
        how = {"longformer": f"Longformer window {args.window}",
               "bigbird": f"BigBird blocks of {args.block}, {args.random_blocks} random",
               "reformer": f"Reformer LSH, chunks of {args.chunk}, {args.hashes} hash rounds"}[args.attention]
        print(f"made {source} long ({long} positions, {how}) -> ember run folder {out}")
    elif args.from_hf:
        print(f"imported {args.from_hf} -> ember run folder {out}")
    else:
        print(f"exported {args.to_hf} -> Hugging Face folder {out}")
    return 0


IMPORT_FILES = {"config.yaml", "tokenizer.json", "model.safetensors", "embedding.json"}


def earlier_import_of(source, out) -> bool:
    """Whether ``out`` holds nothing but an earlier ``--from-hf`` import of ``source`` (its weights
    record where they were imported from), which importing again replaces with the same thing."""
    from safetensors import safe_open

    weights = out / "model.safetensors"
    if not out.is_dir() or not weights.is_file() or any(p.name not in IMPORT_FILES for p in out.iterdir()):
        return False
    try:
        with safe_open(str(weights), "pt") as f:
            origin = (f.metadata() or {}).get("imported_from")
    except Exception:  # an unreadable file is not a previous import to replace silently
        return False
    return origin is not None and Path(origin).resolve() == source.resolve()
