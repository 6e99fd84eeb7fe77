"""Fine-tuning cost: `ember finetune` of a real checkpoint vs a plain transformers loop with
dynamic padding, at equal dev accuracy.

    HF_HUB_OFFLINE=1 PYTHONPATH=. .venv/bin/python benchmarks/speed/finetune_throughput.py \
        --hf ../shared/data/checkpoints/all-MiniLM-L6-v2 --run runs/minilm --cpu-time \
        [--tasks sst2 mrpc] [--train-limit 2000] [--seeds 1 2 3]

(`--run` is the checkpoint imported with `ember convert --from-hf`.) Both sides fine-tune on
the first ``--train-limit`` training rows for one epoch with BERT's recipe (Devlin et al.
2019, App. A.3: AdamW, batch 32, 10% linear warm-up then linear decay, weight decay 0.01,
gradient clipping 1.0, max length 128) at lr 1e-4 (``--lr``; with one short epoch BERT's 2e-5
leaves this 384-wide checkpoint at chance on SST-2: 51.0% measured) and score the full dev set
once at the end (and, where the task has a labelled test split, MRPC's, that too: ember's run scores
it with the best-on-dev weights, so the transformers side scores it as well).

  ember         ember.finetune(task, init=RUN, train_limit, epochs=1): what `ember finetune` runs
  ember-full-last-layer  (--full-last-layer) the same with the last layer at every position
                (ember runs it at [CLS] alone, the only row a classifier reads: ember.nn.query_rows)
  transformers  BertForSequenceClassification.from_pretrained(HF folder) (a fresh classifier),
                torch AdamW, each batch padded to its longest row (DataCollatorWithPadding's
                dynamic padding), a seeded shuffle; dev in batches of 64, also padded per batch

The two run in turn, seed by seed, in one process. Time: the whole run (data, training,
evaluation; not the imports), in CPU seconds of the process on one thread with ``--cpu-time``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
from _bench import _CLOCK, clock, clock_name, load, machine, median  # noqa: E402

from ember.tasks.base import get_adapter  # noqa: E402
from ember.tasks.readers.glue import get_task, read_examples  # noqa: E402

RECIPE = {"lr": 1e-4, "batch": 32, "warmup": 0.1, "weight_decay": 0.01, "max_length": 128}


def ember_run(task: str, run: str, limit: int, seed: int, out: Path) -> float:
    """Dev accuracy of one `ember finetune` run (x100)."""
    import ember

    result = ember.finetune(task, out, init=run, seeds=[seed], train_limit=limit, epochs=1, progress=False,
                            lr=RECIPE["lr"], batch_size=RECIPE["batch"], max_length=RECIPE["max_length"],
                            overwrite=True)
    return 100 * result.metrics["accuracy"]


def ember_full_last_layer_run(task: str, run: str, limit: int, seed: int, out: Path) -> float:
    """``ember_run`` with the encoder's last layer computed at every position (the lever's A/B)."""
    from ember.models.encoder import Encoder

    Encoder.takes_rows = False
    try:
        return ember_run(task, run, limit, seed, out)
    finally:
        Encoder.takes_rows = True


def _encode(tokenizer, examples, rows):
    a = [examples[i].text_a for i in rows]
    b = [examples[i].text_b for i in rows] if examples[rows[0]].text_b is not None else None
    enc = tokenizer(a, b, truncation=True, max_length=RECIPE["max_length"], padding="longest", return_tensors="pt")
    return enc, torch.tensor([int(examples[i].label) for i in rows])


def transformers_run(task: str, hf: str, limit: int, seed: int) -> float:
    """Dev accuracy of one plain transformers fine-tuning run (x100)."""
    import transformers

    train = read_examples(task, "train", limit=limit)
    dev = read_examples(task, "dev")
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf, local_files_only=True)
    torch.manual_seed(seed)
    model = transformers.BertForSequenceClassification.from_pretrained(
        hf, num_labels=len(get_task(task).labels), local_files_only=True)
    decay = [p for n, p in model.named_parameters() if "bias" not in n and "LayerNorm" not in n]
    rest = [p for n, p in model.named_parameters() if "bias" in n or "LayerNorm" in n]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": RECIPE["weight_decay"]},
                                   {"params": rest, "weight_decay": 0.0}], lr=RECIPE["lr"], eps=1e-8)
    steps = -(-len(train) // RECIPE["batch"])
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, int(RECIPE["warmup"] * steps), steps)
    order = np.random.default_rng(seed).permutation(len(train))
    model.train()
    for s in range(steps):
        enc, labels = _encode(tokenizer, train, order[s * RECIPE["batch"]:(s + 1) * RECIPE["batch"]])
        model(**enc, labels=labels).loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    accuracy = _accuracy(model, tokenizer, dev)
    if "test" in get_adapter(task).report_splits:
        _accuracy(model, tokenizer, read_examples(task, "test"))  # the same work: ember's run scores MRPC's test too
    return accuracy


def _accuracy(model, tokenizer, examples) -> float:
    correct = 0
    with torch.no_grad():
        for first in range(0, len(examples), 64):
            enc, labels = _encode(tokenizer, examples, list(range(first, min(first + 64, len(examples)))))
            correct += int((model(**enc).logits.argmax(-1) == labels).sum())
    return 100 * correct / len(examples)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf", required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("--tasks", nargs="+", default=["sst2", "mrpc"])
    parser.add_argument("--train-limit", type=int, default=2000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--lr", type=float, default=RECIPE["lr"])
    parser.add_argument("--cpu-time", action="store_true", help="one thread, CPU seconds of the process")
    parser.add_argument("--full-last-layer", action="store_true",
                        help="also time ember with its last layer at every position (ember-full-last-layer)")
    parser.add_argument("--json")
    parser.add_argument("--smoke", action="store_true", help="64 rows, one seed (CI)")
    args = parser.parse_args(argv)
    RECIPE["lr"] = args.lr
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.cpu_time:
        torch.set_num_threads(1)
        _CLOCK.update(fn=time.process_time, name="cpu (process, 1 thread)")
    if args.smoke:
        args.train_limit, args.seeds = 64, args.seeds[:1]
    print(f"{machine()}; clock: {clock_name()}; {load()}", flush=True)
    results = {"clock": clock_name(), "train_limit": args.train_limit, "recipe": dict(RECIPE), "load_before": load(), "tasks": {}}
    with tempfile.TemporaryDirectory(prefix="ember-ft-bench-") as tmp:
        for task in args.tasks:
            rows = {"ember": [], "transformers": []} | ({"ember-full-last-layer": []} if args.full_last_layer else {})
            for k, seed in enumerate(args.seeds):
                sides = [("ember", lambda s=seed, t=task: ember_run(t, args.run, args.train_limit, s, Path(tmp) / t)),
                         ("transformers", lambda s=seed, t=task: transformers_run(t, args.hf, args.train_limit, s))]
                if args.full_last_layer:
                    sides.insert(1, ("ember-full-last-layer", lambda s=seed, t=task: ember_full_last_layer_run(
                        t, args.run, args.train_limit, s, Path(tmp) / t)))
                for name, fn in (sides if k % 2 == 0 else sides[::-1]):  # alternate who goes first
                    start = clock()
                    accuracy = fn()
                    rows[name].append({"seed": seed, "seconds": clock() - start, "accuracy": accuracy})
                    print(f"  {task} seed {seed} {name}: {rows[name][-1]['seconds']:.1f} s, "
                          f"dev accuracy {accuracy:.2f}; {load()}", flush=True)
            summary = {name: {"seconds": median([r["seconds"] for r in runs]),
                              "accuracy": float(np.mean([r["accuracy"] for r in runs])), "runs": runs}
                       for name, runs in rows.items()}
            summary["ratio"] = summary["transformers"]["seconds"] / summary["ember"]["seconds"]
            summary["ratio_each"] = [t["seconds"] / e["seconds"] for e, t in zip(rows["ember"], rows["transformers"])]
            if args.full_last_layer:  # what running the last layer at [CLS] alone saves, per seed
                summary["last_layer_ratio_each"] = [f["seconds"] / e["seconds"]
                                                    for e, f in zip(rows["ember"], rows["ember-full-last-layer"])]
            results["tasks"][task] = summary
    results["load_after"] = load()
    for task, s in results["tasks"].items():
        print(f"{task}: ember {s['ember']['seconds']:.1f} s (acc {s['ember']['accuracy']:.2f}), transformers "
              f"{s['transformers']['seconds']:.1f} s (acc {s['transformers']['accuracy']:.2f}); ember "
              f"{s['ratio']:.2f}x faster (each seed: {', '.join(f'{x:.2f}' for x in s['ratio_each'])})")
        if "last_layer_ratio_each" in s:
            print(f"  ember-full-last-layer {s['ember-full-last-layer']['seconds']:.1f} s (acc "
                  f"{s['ember-full-last-layer']['accuracy']:.2f}); the last layer at [CLS] alone: "
                  f"{', '.join(f'{x:.2f}' for x in s['last_layer_ratio_each'])}x per seed")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
