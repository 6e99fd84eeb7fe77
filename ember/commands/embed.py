"""`ember embed`: a file of texts -> a .npy of sentence vectors (thin over ``ember.embed_file``)."""

from __future__ import annotations

import argparse

from ember.commands.common import add_backend_options, backend_of


def register(sub) -> None:
    p = sub.add_parser(
        "embed", help="write sentence vectors for a file of texts (.npy)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Embed every text of --input with an encoder run (a pre-training run, an imported "
        "checkpoint, a fine-tuned run, or an `ember export` folder) and write an (N, H) float32 array "
        "to --out, row i for the i-th text. Input: .txt (one text per line), .jsonl (one object per "
        "line; the text under --column, default \"text\"), .tsv or .csv (a header row; --column, "
        "default text or sentence). Texts are sorted by length and run in batches; the vectors are the same "
        "as `ember serve`'s /embed. Pooling, normalisation and max length default to the run's "
        "RUN/embedding.json (written by `ember convert --from-hf` for a sentence-transformers "
        "folder), else mean pooling, unnormalised, the run's max length.\n\n"
        "example:\n  ember convert --from-hf ../shared/data/checkpoints/all-MiniLM-L6-v2 --out runs/minilm\n"
        "  ember embed runs/minilm --input texts.txt --out vectors.npy\n"
        "  python -c \"import numpy; v = numpy.load('vectors.npy'); print(v.shape, v[0] @ v[1])\"")
    p.add_argument("run_dir", help="encoder run folder, or an export folder (onnx, int8, onnx-int8)")
    p.add_argument("--input", required=True, help="texts: .txt (one per line), .jsonl, .tsv or .csv (a header row; --column names the text column)")
    p.add_argument("--out", required=True, help="vectors file to write (.npy)")
    p.add_argument("--column", help="the text's key (.jsonl) or column (.tsv, .csv)")
    p.add_argument("--pooling", choices=["mean", "cls"], help="default: the run's (else mean)")
    p.add_argument("--layer", type=int, help="hidden layer to pool: 0 = embeddings, -1 = last (default)")
    norm = p.add_mutually_exclusive_group()
    norm.add_argument("--normalize", dest="normalize", action="store_true", default=None,
                      help="L2-normalise each vector (default: the run's)")
    norm.add_argument("--no-normalize", dest="normalize", action="store_false", help="do not normalise")
    p.add_argument("--max-length", type=int, help="tokens per text before truncation (default: the run's)")
    add_backend_options(p)
    p.add_argument("--batch-size", type=int, default=32, help="texts per forward pass (default 32)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (default: all)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run)


def run(args) -> int:
    from ember.api import embed_file

    summary = embed_file(args.run_dir, args.input, args.out, column=args.column, pooling=args.pooling,
                         layer=args.layer, normalize=args.normalize, max_length=args.max_length, backend=backend_of(args) or "torch",
                         batch_size=args.batch_size, threads=args.threads, progress=not args.no_progress)
    note = f"; {summary['truncated']} truncated to {summary['max_length']} tokens" if summary["truncated"] else ""
    print(f"wrote {summary['texts']} x {summary['dimension']} vectors to {summary['out']} ({summary['backend']}, "
          f"{summary['pooling']} pooling of layer {summary['layer']}, "
          f"{'normalised' if summary['normalize'] else 'unnormalised'}{note})")
    return 0
