"""`ember export`: write a run as HF layout, ONNX, int8 (PyTorch) or int8 ONNX, verified."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser(
        "export", help="export a run to HF / ONNX / int8 and verify it",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Export a fine-tuned (or MLM pre-trained) run and check the export against the "
        "original on real inputs: the task's dev split from EMBER_DATA, or --verify-file. Reports the "
        "max absolute logit difference, prediction agreement, inputs/s of both, and sizes on disk "
        "(also saved in OUT/export.json). The folder is written atomically.\n\n"
        "  hf         Hugging Face layout (as `ember convert --to-hf`); verified with transformers\n"
        "  onnx       model.onnx, dynamic batch and sequence axes (ONNX Runtime)\n"
        "  int8       PyTorch dynamic int8 quantization of the Linear layers\n"
        "  onnx-int8  ONNX Runtime dynamic int8 quantization of model.onnx\n\n"
        "example:\n  ember export runs/sst2 --format onnx --out runs/sst2-onnx\n"
        "  ember serve runs/sst2-onnx")
    p.add_argument("run_dir", help="fine-tuned or pre-training run folder, or one of its checkpoints "
                   "(RUN/checkpoints/step-N, sharded or not)")
    p.add_argument("--format", required=True, choices=["hf", "onnx", "int8", "onnx-int8"], help="what to write")
    p.add_argument("--out", required=True, help="folder to write (must not exist unless --overwrite)")
    p.add_argument("--verify-file", help="inputs in the task's format (GLUE TSV, CoNLL, SQuAD JSON; "
                   "plain sentences for a pre-training run) instead of the dev split")
    p.add_argument("--limit", type=int, default=1000, help="verify on at most N inputs (default 1000; 0 = all)")
    p.add_argument("--batch-size", type=int, default=32, help="batch size of the verification pass (default 32)")
    p.add_argument("--tolerance", type=float, default=1e-3,
                   help="largest logit difference accepted for fp32 formats (hf, onnx; default 1e-3)")
    p.add_argument("--no-verify", action="store_true", help="skip verification (not recommended)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out folder")
    p.set_defaults(run=run)


def run(args) -> int:
    from ember.errors import EmberError
    from ember.runs.sharded import weights_view
    from ember.serve.export import export_run, format_report

    if args.batch_size < 1 or args.limit < 0:
        raise EmberError("--batch-size must be >= 1 and --limit >= 0")
    with weights_view(args.run_dir) as run_dir:  # a checkpoint (sharded or not) is read directly
        report = export_run(run_dir, args.format, args.out, verify=not args.no_verify,
                            verify_file=args.verify_file, limit=args.limit or None, batch_size=args.batch_size,
                            tolerance=args.tolerance, overwrite=args.overwrite, source=args.run_dir)
    print(f"exported {args.run_dir} -> {args.out}")
    print(format_report(report))
    return 0
