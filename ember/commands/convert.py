"""`ember convert`: import a Hugging Face encoder checkpoint, or export a run to HF layout."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("convert", help="Hugging Face checkpoint <-> ember run folder",
                       description="--from-hf HF_DIR --out RUN: import a local HF checkpoint of "
                       "BERT, RoBERTa, ALBERT, ELECTRA, DistilBERT, GPT-2, OpenAI GPT, XLNet, XLM or T5 (a sentence-transformers "
                       "folder keeps its pooling) (config.json + model.safetensors or "
                       "pytorch_model.bin; tokenizer.json, vocab.txt or vocab.json + merges.txt). --to-hf RUN --out HF_DIR: export an ember run (or one of its checkpoints, RUN/checkpoints/step-N, "
                       "sharded or not) to the same layout, "
                       "loadable with transformers' from_pretrained. Nothing is downloaded.")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--from-hf", metavar="HF_DIR", help="HF checkpoint folder to import")
    group.add_argument("--to-hf", metavar="RUN_DIR", help="ember run folder to export")
    p.add_argument("--out", required=True, help="folder to write")
    p.set_defaults(run=run)


def run(args) -> int:
    from ember.interop.convert import export_hf, import_hf
    from ember.runs.sharded import weights_view

    if args.from_hf:
        out = import_hf(args.from_hf, args.out)
        print(f"imported {args.from_hf} -> ember run folder {out}")
    else:
        with weights_view(args.to_hf) as run_dir:  # a checkpoint (sharded or not) is read directly
            out = export_hf(run_dir, args.out)
        print(f"exported {args.to_hf} -> Hugging Face folder {out}")
    return 0
