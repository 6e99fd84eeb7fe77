"""Zero-shot cross-lingual transfer (Lample & Conneau 2019, §4.1; XNLI in §5.2): fine-tune on
English SST-2, evaluate on Russian sentiment without a single Russian label.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/studies/xlm_zero_shot.py \\
        --xlm runs/xlm-mini --english runs/bert-mini --seeds 1,2,3 \\
        --train-limit 20000 --epochs 3 --lr 1e-4 --out runs/xlm-zero-shot

For each model (the cross-lingual XLM run, and a monolingual English run for comparison) and
each seed: ``ember.finetune("sst2", ...)`` on English SST-2 (an XLM run with English language
ids), then ``ember.evaluate(RUN, task="rusentiment-binary", split="test")``: the same head on
the 794 positive/negative posts of RuSentiment's test file (with Russian language ids for
XLM). Reported per model, mean ± sample std over seeds: SST-2 dev accuracy (the English task
itself, to tell "did not learn sentiment" from "did not transfer") and the Russian accuracy
and macro F1, beside the majority-class baseline (always "positive", 67.5% of the test posts:
accuracy alone flatters a model that says positive to everything; macro F1 does not).

Writes OUT/results.md (the table and a plain reading of it), OUT/results.json and
OUT/zero_shot.png (bars, mean ± std, the baseline beside). Resumable: a finished (model, seed)
is kept (OUT/runs/<model>/seed-N/zero_shot.json), an interrupted fine-tuning resumes from its
checkpoint, and a re-run with other settings is refused (OUT/settings.json). ``--smoke``
builds two tiny random models (an en+ru XLM and an English BERT) and runs the whole path in
seconds: a check that the script works, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers

from _bench import run_cli  # noqa: E402

from ember.errors import EmberError  # noqa: E402
from ember.fileio import atomic_write_text  # noqa: E402

TARGET = ("rusentiment-binary", "test")  # the Russian evaluation: task, split
TARGET_READER = "rusentimentbinary"  # its key in ember.tasks.sentiment.SENTIMENT_TASKS
MODELS = (("xlm", "XLM (en+ru)"), ("english", "English-only"))


def parse_args(argv: list[str] | None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--xlm", help="the cross-lingual pre-training run (an XLM run with languages en,ru)")
    p.add_argument("--english", help="a monolingual English pre-training run, the comparison")
    p.add_argument("--seeds", default="1,2,3", help="fine-tuning seeds (default 1,2,3)")
    p.add_argument("--train-limit", type=int, default=None, help="SST-2 training sentences (default: all 67,349)")
    p.add_argument("--epochs", type=float, default=None, help="fine-tuning epochs (default: SST-2's 3)")
    p.add_argument("--lr", type=float, default=None, help="fine-tuning learning rate (default: SST-2's 2e-5)")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--max-length", type=int, default=None, help="tokens per input (default 128)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    p.add_argument("--out", required=True, help="folder for the runs and the report")
    p.add_argument("--smoke", action="store_true", help="tiny random models, a few steps: checks the script")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        raise EmberError(f"--seeds {args.seeds!r}: give integers separated by commas, e.g. 1,2,3") from None
    if not args.seeds or len(set(args.seeds)) != len(args.seeds):
        raise EmberError(f"--seeds {args.seeds}: give at least one seed, each once")
    if not args.smoke and not (args.xlm and args.english):
        raise EmberError("give --xlm RUN and --english RUN (or --smoke to check the script on tiny models)")
    if args.smoke:
        args.train_limit = args.train_limit or 64
        args.epochs = args.epochs or 1.0
        args.lr = args.lr or 2e-3
        args.max_length = args.max_length or 48
    return args


# -- the runs ---------------------------------------------------------------------------------

def smoke_models(folder: Path) -> dict[str, Path]:
    """Two tiny random pre-training runs: an XLM over a BPE shared by English (SST-2 sentences)
    and Russian (RuSentiment posts), and a BERT over an English WordPiece."""
    import dataclasses

    import torch

    from ember.config import DataConfig, RunConfig, model_preset
    from ember.models import build_backbone
    from ember.runs.checkpoint import save_weights
    from ember.runs.folder import write_run_files
    from ember.tasks.readers.glue import read_examples
    from ember.tasks.sentiment import read_split
    from ember.tokenizers import special_token_ids, train_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    en, ru = folder / "en.txt", folder / "ru.txt"
    en.write_text("\n".join(ex.text_a for ex in read_examples("sst2", "train", limit=2000)), encoding="utf-8")
    ru.write_text("\n".join(ex.text_a.replace("\n", " ") for ex in read_split("rusentiment", "train", limit=2000)),
                  encoding="utf-8")
    plans = {"xlm": ("xlm-mini", "xlm_mlm", {"en": [en], "ru": [ru]}, "bpe", {"num_languages": 2, "languages": "en,ru"}),
             "english": ("bert-mini", "mlm", [en], "wordpiece", {})}
    runs = {}
    for key, (preset, objective, texts, kind, extra) in plans.items():
        run = folder / key
        runs[key] = run
        if (run / "model.safetensors").is_file():
            continue
        tok = train_tokenizer(texts, kind=kind, vocab_size=1000, lowercase=kind == "wordpiece", progress=False,
                              fmt="lines")
        tok.save(str(folder / f"{key}-tokenizer.json"))
        cfg = dataclasses.replace(model_preset(preset), vocab_size=tok.get_vocab_size(), hidden_size=64, num_layers=2,
                                  num_heads=2, intermediate_size=256, max_position=64,
                                  pad_token_id=special_token_ids(tok)["pad"], **extra)
        torch.manual_seed(0)
        backbone = build_backbone(cfg)
        write_run_files(run, RunConfig(objective=objective, model=cfg, data=DataConfig(max_seq_length=64)),
                        folder / f"{key}-tokenizer.json")
        save_weights({f"backbone.{k}": v for k, v in backbone.state_dict().items()}, run / "model.safetensors")
    return runs


def settings_of(args, inits: dict[str, Path]) -> dict:
    return {"inits": {k: str(Path(v).resolve()) for k, v in inits.items()}, "train_limit": args.train_limit,
            "epochs": args.epochs, "lr": args.lr, "batch_size": args.batch_size, "max_length": args.max_length,
            "target": list(TARGET)}


def check_settings(out: Path, settings: dict) -> None:
    """A re-run must use the settings the finished runs were made with (more seeds are fine)."""
    path = out / "settings.json"
    if path.is_file():
        saved = json.loads(path.read_text())
        changed = sorted(k for k in settings if saved.get(k) != settings[k])
        if changed:
            raise EmberError(f"{out} holds runs made with other settings ({', '.join(changed)} differ); "
                             "use another --out, or the same settings to resume or add seeds")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(settings, indent=2))


def run_one(key: str, init: Path, seed: int, args, root: Path) -> tuple[dict, bool]:
    """(zero_shot.json of one model and seed, whether it was computed now)."""
    import ember
    from ember.experiments.common import prepare_folder

    run_dir = root / key / f"seed-{seed}"
    done = run_dir / "zero_shot.json"
    if done.is_file():
        return json.loads(done.read_text()), False
    if not (run_dir / "results.json").is_file():  # fine-tune (or resume an interrupted fine-tuning)
        resume = prepare_folder(run_dir)
        settings = {"lr": args.lr, "epochs": args.epochs, "batch_size": args.batch_size, "max_length": args.max_length}
        ember.finetune("sst2", run_dir, init=str(init), seeds=[seed], train_limit=args.train_limit, resume=resume,
                       progress=not args.no_progress, **{k: v for k, v in settings.items() if v is not None})
    english = json.loads((run_dir / "results.json").read_text())
    target = ember.evaluate(run_dir, split=TARGET[1], task=TARGET[0])  # Russian ids for XLM: the task's language
    record = {"model": key, "seed": seed, "init": str(init), "sst2_dev": english["metrics"],
              "target": {"task": target["task"], "split": target["split"], "metrics": target["metrics"]}}
    atomic_write_text(done, json.dumps(record, indent=2))
    return record, True


def majority_baseline() -> dict:
    """Always the larger class of the Russian test posts: its accuracy and macro F1."""
    from ember.tasks.metrics.classification import METRICS
    from ember.tasks.sentiment import read_split

    labels = np.asarray([ex.label for ex in read_split(TARGET_READER, TARGET[1])])
    majority = int(np.bincount(labels).argmax())
    preds = np.full_like(labels, majority)
    return {"label": ["negative", "positive"][majority], "posts": int(len(labels)),
            "accuracy": float(METRICS["accuracy"](preds, labels)),
            "f1_macro": float(METRICS["f1_macro"](preds, labels, classes=range(2)))}


# -- the report -------------------------------------------------------------------------------

def summarize(records: list[dict]) -> dict:
    from ember.tasks.metrics.classification import summarize_seeds

    metrics = [{"metrics": {"sst2_accuracy": r["sst2_dev"]["accuracy"], "ru_accuracy": r["target"]["metrics"]["accuracy"],
                            "ru_f1_macro": r["target"]["metrics"]["f1_macro"]}} for r in records]
    return summarize_seeds(metrics)


def cell(stat: dict) -> str:
    spread = f" ± {100 * stat['std']:.1f}" if stat["std"] is not None else ""
    return f"{100 * stat['mean']:.1f}{spread}"


def reading(rows: list[dict], baseline: dict) -> list[str]:
    """Plain sentences about the numbers: above the baseline? one model above the other, beyond
    the seeds' spread?"""
    lines = []
    for row in rows:
        f1 = row["summary"]["ru_f1_macro"]
        gap = 100 * (f1["mean"] - baseline["f1_macro"])
        where = "equal to" if abs(gap) < 0.05 else f"{abs(gap):.1f} points {'above' if gap > 0 else 'below'}"
        lines.append(f"- {row['label']}: Russian macro F1 {cell(f1)} is {where} the majority-class baseline's "
                     f"{100 * baseline['f1_macro']:.1f}; SST-2 dev accuracy {cell(row['summary']['sst2_accuracy'])}.")
    if len(rows) == 2:
        a, b = (r["summary"]["ru_f1_macro"] for r in rows)
        diff = 100 * (a["mean"] - b["mean"])
        spread = 100 * ((a["std"] or 0.0) + (b["std"] or 0.0))
        clear = abs(diff) > spread and a["std"] is not None
        lines.append(f"- {rows[0]['label']} minus {rows[1]['label']}: {diff:+.1f} points of Russian macro F1; "
                     + ("larger than the two seed spreads together." if clear else
                        "within the seeds' spread (or one seed): no difference can be claimed."))
    return lines


def render_markdown(result: dict) -> str:
    b = result["baseline"]
    lines = [f"# Zero-shot English → Russian sentiment ({result['date']})", "",
             f"Fine-tuned on English SST-2 ({result['settings']['train_limit'] or 'all'} sentences), evaluated on "
             f"{b['posts']} positive/negative RuSentiment test posts with no Russian labels; mean ± std over "
             f"seeds, in %.", "",
             "| model | seeds | SST-2 dev acc (en) | RuSentiment acc (ru) | RuSentiment macro F1 (ru) |",
             "|---|---|---|---|---|"]
    for row in result["models"]:
        s = row["summary"]
        lines.append(f"| {row['label']} | {len(row['seeds'])} | {cell(s['sst2_accuracy'])} | {cell(s['ru_accuracy'])} | "
                     f"{cell(s['ru_f1_macro'])} |")
    lines.append(f"| majority class (always {b['label']}) | — | — | {100 * b['accuracy']:.1f} | {100 * b['f1_macro']:.1f} |")
    lines += ["", "## Reading", "", *result["reading"], ""]
    return "\n".join(lines)


def write_chart(result: dict, path: Path) -> None:
    """Russian accuracy and macro F1 per model (mean ± std), the majority-class baseline beside."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = (("ru_accuracy", "accuracy", "RuSentiment accuracy"), ("ru_f1_macro", "f1_macro", "RuSentiment macro F1"))
    bars = [(row["label"], [row["summary"][m] for m, _, _ in metrics]) for row in result["models"]]
    x = np.arange(len(metrics))
    width = 0.8 / (len(bars) + 1)
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (label, stats) in enumerate(bars):
        drawn = ax.bar(x - 0.4 + width * (i + 0.5), [100 * s["mean"] for s in stats], width, label=label,
                       yerr=[100 * (s["std"] or 0.0) for s in stats], capsize=4)
        ax.bar_label(drawn, [f"{100 * s['mean']:.1f}" for s in stats], padding=2, fontsize=8)
    base = result["baseline"]
    drawn = ax.bar(x - 0.4 + width * (len(bars) + 0.5), [100 * base[b] for _, b, _ in metrics], width,
                   color="lightgray", label=f"majority class ({base['label']})")
    ax.bar_label(drawn, [f"{100 * base[b]:.1f}" for _, b, _ in metrics], padding=2, fontsize=8)
    ax.set_xticks(x, [name for _, _, name in metrics])
    ax.set_ylabel("% (mean ± std over seeds)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title("Zero-shot transfer: fine-tuned on English SST-2, tested on Russian")
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")  # no half-written chart on a crash
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    out = Path(args.out)
    inits = smoke_models(out / "smoke-models") if args.smoke else {"xlm": Path(args.xlm), "english": Path(args.english)}
    for key, init in inits.items():  # both checked before hours of fine-tuning the first
        if not (init / "config.yaml").is_file() and not (init / "config.json").is_file():
            raise EmberError(f"--{key} {init}: not an ember pre-training run (config.yaml) nor a Hugging Face "
                             "checkpoint (config.json); pre-train one first (docs/xlm.md)")
    check_settings(out, settings_of(args, inits))
    baseline = majority_baseline()
    ran, models = 0, []
    for key, label in MODELS:
        records = []
        for seed in args.seeds:
            record, fresh = run_one(key, inits[key], seed, args, out / "runs")
            ran += fresh
            records.append(record)
            shown = record["target"]["metrics"]
            print(f"{label} seed {seed}: SST-2 dev acc {record['sst2_dev']['accuracy']:.4f}; Russian acc "
                  f"{shown['accuracy']:.4f}, macro F1 {shown['f1_macro']:.4f}", flush=True)
        models.append({"key": key, "label": label, "init": str(inits[key]), "seeds": args.seeds, "runs": records,
                       "summary": summarize(records)})
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "settings": settings_of(args, inits), "smoke": args.smoke,
              "baseline": baseline, "models": models, "ran": ran}
    result["reading"] = reading(models, baseline)
    markdown = render_markdown(result)
    atomic_write_text(out / "results.md", markdown)
    atomic_write_text(out / "results.json", json.dumps(result, indent=2))
    write_chart(result, out / "zero_shot.png")
    print("\n" + markdown + f"\nwrote {out / 'results.md'}, results.json, zero_shot.png")
    return result


if __name__ == "__main__":
    run_cli(main)
