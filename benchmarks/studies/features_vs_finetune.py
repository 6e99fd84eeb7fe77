"""Feature-based vs fine-tuning on CoNLL-2003 NER from a real checkpoint (BERT, Devlin et al.
2019, §5.3 and Table 7): the whole encoder fine-tuned, against the frozen encoder's features —
the embedding output, the second-to-last or last hidden layer, the sum or concatenation of the
last four, or a learned scalar mix of all layers (ELMo) — with a small trained head on top.

    PYTHONPATH=. OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python benchmarks/studies/features_vs_finetune.py \\
        --out runs/features-vs-finetune --seeds 1,2,3 --train-limit 4000

Every run is ``ember.finetune("conll2003", ...)`` from the imported checkpoint (``ember convert
--from-hf``; default ``DATA/checkpoints/all-MiniLM-L6-v2``): best epoch on CoNLL-2003 dev, that
epoch's weights scored once on test (entity F1, conlleval's definition). Fine-tuning uses BERT's
recipe at ``--lr`` (5e-5); the feature variants train only their head (``--feature-layers``
per-token GELU layers and the tagger's linear layer) at ``--feature-lr`` (1e-3), because a head
alone on frozen features needs a larger step. BERT's own Table 7 put a two-layer 768-wide BiLSTM
on the features; this head is smaller, so the gap to fine-tuning is, if anything, overstated.

Each run is kept in OUT/runs/VARIANT/seed-N and skipped when done (re-running resumes).
OUT/table.md, table.json and features_vs_finetune.png hold the result (``_seed_table``).
--smoke: a random 4-layer model, a few sentences, seconds (CI).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
import _seed_table  # noqa: E402
from _bench import load, machine, run_cli  # noqa: E402
from _checkpoint_study import choices, prepare_init, start_study  # noqa: E402

import ember  # noqa: E402
from ember.fileio import atomic_write_text  # noqa: E402
from ember.tasks.families.feature_transfer import FEATURE_COMBINES  # noqa: E402

VARIANTS = ("finetune",) + FEATURE_COMBINES
NAMES = {"finetune": "fine-tuning", "mix": "scalar mix (all)", "embeddings": "embeddings",
         "second-to-last": "second-to-last", "last": "last hidden", "sum-last-4": "sum last 4",
         "concat-last-4": "concat last 4"}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--checkpoint", help="HF checkpoint folder (default: DATA/checkpoints/all-MiniLM-L6-v2)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--train-limit", type=int, default=4000, help="training sentences (0 = all 14,041)")
    p.add_argument("--epochs", type=float, default=2.0)
    p.add_argument("--lr", type=float, default=5e-5, help="fine-tuning learning rate")
    p.add_argument("--feature-lr", type=float, default=1e-3, help="learning rate of the heads on frozen features")
    p.add_argument("--feature-layers", type=int, default=1, help="per-token GELU layers under the tagger")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--smoke", action="store_true", help="a random small model and a few sentences (CI)")
    args = p.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    args.variants = choices(args.variants, VARIANTS, "variant")
    return args


def run_one(variant: str, seed: int, init: str, args, out: Path) -> dict:
    run = out / "runs" / variant / f"seed-{seed}"
    record_path = run / "record.json"
    if record_path.is_file():
        return json.loads(record_path.read_text())
    settings = {"lr": args.lr}
    if variant != "finetune":
        settings = {"features": True, "feature_combine": variant, "feature_layers": args.feature_layers,
                    "lr": args.feature_lr}
    smoke = {"model": "bert-mini", "tokenizer": args.smoke_tokenizer,
             "overrides": ["model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64"]} if args.smoke else {}
    resume = (run / "checkpoints").is_dir()
    start = time.process_time()
    result = ember.finetune("conll2003", run, init, seeds=[seed], train_limit=args.train_limit or None,
                            epochs=args.epochs, batch_size=args.batch_size, max_length=args.max_length,
                            resume=resume, overwrite=not resume, progress=False, **settings, **smoke)
    record = {"task": "conll2003", "variant": variant, "seed": seed, "run": str(run),
              "scores": {"dev": result.metrics["f1"], "test": result.result["other_splits"]["test"]["f1"]},
              "cpu_seconds": time.process_time() - start,
              "layer_weights": result.result.get("scalar_mix", {}).get("weights")}
    atomic_write_text(record_path, json.dumps(record, indent=2))
    print(f"{variant} seed {seed}: dev F1 {record['scores']['dev']:.4f} test F1 {record['scores']['test']:.4f} "
          f"({record['cpu_seconds']:.0f} CPU s; {load()})", flush=True)
    return record


def render(result: dict) -> str:
    meta = result["meta"]
    lines = [f"# Feature-based vs fine-tuning on CoNLL-2003: {meta['checkpoint']}", "",
             f"{meta['machine']}. Seeds {', '.join(map(str, meta['seeds']))}; first {meta['train_limit'] or 'all'} "
             f"training sentences, {meta['epochs']} epoch(s); fine-tuning lr {meta['lr']}, feature heads lr "
             f"{meta['feature_lr']} with {meta['feature_layers']} GELU layer(s). Entity F1 x 100 (best epoch on "
             "dev; test scored once with it), mean ± sample std over seeds; Δ = paired difference to "
             "fine-tuning ± its std (seeds won).", ""]
    lines += _seed_table.table_lines(result["table"], meta["variants"], NAMES)
    weights = [r["layer_weights"] for r in result["records"] if r["variant"] == "mix" and r["layer_weights"]]
    if weights:
        mean = torch.tensor(weights).mean(0).tolist()
        lines += ["", "Learned scalar-mix weights (embeddings first, mean over seeds): "
                  + " ".join(f"{w:.3f}" for w in mean)]
    lines += ["", "BERT-base's Table 7 (dev F1): fine-tuning 96.4; embeddings 91.0, second-to-last 95.6, last "
              "94.9, weighted sum last four 95.9, concat last four 96.1, weighted sum all 95.5.", ""]
    if meta["smoke"]:
        lines += ["(smoke run: a random small model; these are not measurements)", ""]
    return "\n".join(lines)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.smoke:
        args.seeds, args.train_limit, args.epochs, args.max_length = args.seeds[:1], 24, 1.0, 48
    out = start_study(args)
    init = prepare_init(args, out)
    records = [run_one(v, s, init, args, out) for v in args.variants for s in args.seeds]
    meta = {"checkpoint": "random (smoke)" if args.smoke else Path(args.checkpoint or "all-MiniLM-L6-v2").name,
            "machine": machine(), "load_after": load(), "seeds": args.seeds, "variants": args.variants,
            "train_limit": args.train_limit, "epochs": args.epochs, "lr": args.lr, "feature_lr": args.feature_lr,
            "feature_layers": args.feature_layers, "smoke": args.smoke}
    result = {"meta": meta, "records": records, "table": _seed_table.summarize(records, reference="finetune")}
    atomic_write_text(out / "table.json", json.dumps(result, indent=2))
    text = render(result)
    atomic_write_text(out / "table.md", text)
    _seed_table.bar_chart(result["table"], args.variants, NAMES, out / "features_vs_finetune.png",
                          f"CoNLL-2003 entity F1 from {meta['checkpoint']} ({len(args.seeds)} seeds)", "entity F1 (x100)")
    print(text)
    return result


if __name__ == "__main__":
    run_cli(main)
