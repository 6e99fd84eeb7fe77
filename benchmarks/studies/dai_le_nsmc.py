"""Dai & Le 2015 on Korean movie reviews: does pre-training an LSTM on unlabeled reviews (as a
language model, LM-LSTM, or a sequence autoencoder, SA-LSTM) make it a better NSMC classifier
than the same LSTM from random init, and than bag-of-words, as labels get scarce?

    PYTHONPATH=. nice -n 19 .venv/bin/python benchmarks/studies/dai_le_nsmc.py --out runs/dai-le \
        --pretrain-budget 1h --labels 1000,5000,150000 --seeds 1,2,3

Stages (each kept in OUT and skipped when done, so an interrupted run continues where it stopped;
a pre-training run interrupted mid-way resumes from its checkpoint):
  1. a WordPiece tokenizer (--vocab-size) trained on nsmc/unlabeled.txt.gz (512k reviews, one per
     line) and those reviews prepared as token shards (1% held out for perplexity);
  2. `ember.pretrain` with the lm-lstm and sa-lstm recipes (lstm-mini: 1 layer, 512 cells, 256-wide
     embeddings), each for --pretrain-budget seconds of this process's CPU time on one thread,
     the learning rate warmed up and decayed over that budget (train.schedule=time);
  3. `ember.finetune --task nsmc` on the first N labelled training reviews for every N in
     --labels (150000 = all 142,469 left after the 7,531 carved out as dev), from each pre-trained
     LSTM and from the same LSTM randomly initialised, one run per seed; best epoch on dev,
     accuracy on the 50k test reviews;
  4. logistic regression on the same tokens' counts (benchmarks/common/_bow.py; l2 picked on dev);
  5. OUT/results.md (table), OUT/results.json, OUT/accuracy_vs_labels.png, OUT/perplexity.png.
--smoke runs every stage on a few thousand real reviews with a tiny LSTM in about a minute (CI).

--task sst2 asks the same question in English: the only movie-review text in the data folder
is SST-2's own training set (67,349 Rotten Tomatoes sentences and phrases), so its sentences,
without their labels, are the unlabeled text (Dai & Le 2015, §4.3, also pre-trained on the
task's own reviews before adding unlabeled ones). Labels: the first N training sentences
(67349 = all); SST-2's dev set is split in two by a hash of each sentence, one half for the best
epoch, the other scored once (SST-2's test labels are not public).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
from _bench import load, machine, sst2_dev_halves  # noqa: E402

import ember  # noqa: E402
from ember.durations import parse_duration  # noqa: E402
from ember.fileio import atomic_write_text  # noqa: E402
from ember.paths import data_root  # noqa: E402

OBJECTIVES = {"lm": "lm-lstm", "sa": "sa-lstm"}
CURVES = {"lm": ("lm_loss", "ppl"), "sa": ("rec_loss", "rec_ppl")}
SMOKE_MODEL = ["model.embedding_size=32", "model.hidden_size=64", "data.max_seq_length=64", "data.eval_examples=64"]


def default_epochs(n_labels: int) -> float:
    """More passes over fewer labels (~20k examples seen at least), at least 2: 1k -> 20, 5k -> 4."""
    return float(max(2, min(20, 20000 // max(1, n_labels))))


@contextmanager
def data_root_at(path: Path):
    """Point ember's data root (``$EMBER_DATA``, read on every use) at ``path`` for a while."""
    old = os.environ.get("EMBER_DATA")
    os.environ["EMBER_DATA"] = str(path)
    try:
        yield
    finally:
        if old is None:
            del os.environ["EMBER_DATA"]
        else:
            os.environ["EMBER_DATA"] = old


def smoke_data(source: Path, out: Path) -> Path:
    """A data root holding the first 3,000 unlabeled, 2,000 training and 400 test NSMC reviews."""
    import gzip

    folder = out / "nsmc"
    if (folder / "ratings_test.txt").is_file():
        return out
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(source / "unlabeled.txt.gz", "rt", encoding="utf-8") as fh:
        lines = [next(fh) for _ in range(3000)]
    with gzip.open(folder / "unlabeled.txt.gz", "wt", encoding="utf-8") as fh:
        fh.writelines(lines)
    for name, rows in (("ratings_train.txt", 2001), ("ratings_test.txt", 401)):
        with open(source / name, encoding="utf-8", newline="") as fh:  # keep bare \r inside rows
            text = fh.read().split("\n")[:rows]
        (folder / name).write_text("\n".join(text) + "\n", encoding="utf-8", newline="")
    return out


def sst2_unlabeled(out: Path) -> Path:
    """SST-2's training sentences, one per line, labels dropped (the English unlabeled text)."""
    from ember.tasks.readers.glue import read_examples

    path = out / "data" / "sst2-train-sentences.txt"
    if not path.is_file():
        atomic_write_text(path, "".join(e.text_a + "\n" for e in read_examples("sst2", "train")))
    return path


def prepare(text: Path, out: Path, vocab_size: int, max_docs: int | None) -> Path:
    """Stage 1: tokenizer and token shards of the unlabeled text, one review per line (kept in OUT)."""
    from ember.data.prepare import prepare_corpus
    from ember.tokenizers import train_tokenizer

    tok = out / "tokenizer" / "tokenizer.json"
    if not tok.is_file():
        tok.parent.mkdir(parents=True, exist_ok=True)
        tokenizer = train_tokenizer([text], vocab_size=vocab_size, fmt="lines",
                                    max_documents=max_docs, progress=False)
        tokenizer.save(str(tok.with_suffix(".tmp")))
        tok.with_suffix(".tmp").replace(tok)
    prepared = out / "prepared"
    if not (prepared / "meta.json").is_file():
        prepare_corpus([text], tok, prepared, fmt="lines", max_docs=max_docs,
                       valid_fraction=0.01, progress=False, overwrite=True)
    return prepared


def pretrain(name: str, prepared: Path, out: Path, budget: float, overrides: list[str]) -> Path:
    """Stage 2: one pre-training run under a CPU-time budget (resumed when interrupted)."""
    run = out / f"pretrain-{name}"
    if (run / "model.safetensors").is_file():
        return run
    sets = overrides + ["train.clock=cpu", "train.num_threads=1", f"train.max_time={budget}",
                        "train.schedule=time", "train.max_steps=100000000"]
    resume = (run / "checkpoints").is_dir()
    ember.pretrain(OBJECTIVES[name], run, data=prepared, overrides=sets, resume=resume, overwrite=not resume,
                   progress=False)
    return run


def finetune(init, label: str, n_labels: int, seed: int, out: Path, args, halves=None) -> dict:
    """Stage 3: one seed of one fine-tuning (reused when its record.json exists). NSMC scores its
    test file itself; for SST-2 the selection half of dev picks the epoch and the held-out half is
    scored once with those weights (``halves``), recorded as the run's test split."""
    run = out / "finetune" / f"{label}-{n_labels}" / f"seed-{seed}"
    done = run / ("record.json" if halves else "results.json")
    if done.is_file():
        return json.loads(done.read_text())
    sets = ["train.clock=cpu", "train.num_threads=1"] + args.finetune_set
    resume = (run / "checkpoints").is_dir()
    extra = {"eval_split": str(halves[0])} if halves else {}
    ember.finetune(args.task, run, init, seeds=[seed], train_limit=n_labels, overrides=sets, resume=resume,
                   overwrite=not resume, progress=False, epochs=args.epochs or default_epochs(n_labels),
                   lr=args.lr, batch_size=args.batch_size, max_length=args.max_length,
                   max_time=args.finetune_budget or None, **extra)
    record = json.loads((run / "results.json").read_text())
    if halves:
        record.setdefault("other_splits", {})["test"] = ember.evaluate(run, file=halves[1])["metrics"]
        atomic_write_text(done, json.dumps(record, indent=2))  # a cut write must not look done
    return record


def labelled_split(task: str, split: str, halves=None) -> list:
    """The labelled examples of a split: NSMC's train/carved dev/test; SST-2's train and dev halves."""
    from ember.tasks.readers.glue import read_examples
    from ember.tasks.sentiment import read_split

    if task == "nsmc":
        return read_split("nsmc", split)
    if split == "train":
        return read_examples("sst2", "train")
    return read_examples("sst2", "dev", path=halves[0 if split == "dev" else 1])


def bag_of_words(tokenizer_path: Path, labels: list[int], out: Path, task: str = "nsmc", halves=None) -> dict:
    """Stage 4: logistic regression on token counts for each N (deterministic; cached)."""
    from _bow import fit_on_dev, token_counts

    from ember.tokenizers import load_tokenizer

    path = out / "bow.json"
    done = json.loads(path.read_text()) if path.is_file() else {"by_labels": {}}
    if all(str(n) in done["by_labels"] for n in labels):
        return done
    tok = load_tokenizer(tokenizer_path)

    def encode(split):
        examples = labelled_split(task, split, halves)
        ids = [e.ids for e in tok.encode_batch([x.text_a for x in examples], add_special_tokens=False)]
        return ids, np.array([x.label for x in examples])

    (train, y_train), (dev, y_dev), (test, y_test) = encode("train"), encode("dev"), encode("test")
    v = tok.get_vocab_size()
    x_dev, x_test = token_counts(dev, v), token_counts(test, v)
    done["test_examples"] = len(test)
    for n in labels:
        model, dev_scores = fit_on_dev(token_counts(train[:n], v), y_train[:n], x_dev, y_dev, 2)
        done["by_labels"][str(n)] = {
            "train_examples": min(n, len(train)), "l2": model.l2, "dev_accuracy": dev_scores[model.l2],
            "dev_by_l2": {f"{k:g}": v for k, v in dev_scores.items()},
            "test_accuracy": float((model.predict(x_test) == y_test).mean())}
        path.write_text(json.dumps(done, indent=2))
    return done


def main(argv: list[str] | None = None) -> dict:
    from _dai_le_report import perplexity_curves, write_report

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for every stage and the report")
    parser.add_argument("--task", choices=["nsmc", "sst2"], default="nsmc",
                        help="nsmc (Korean, 512k unlabeled reviews) or sst2 (English, its own sentences as unlabeled text)")
    parser.add_argument("--data-root", default=None, help="folder holding nsmc/ or glue/SST-2 (default: $EMBER_DATA)")
    parser.add_argument("--pretrain-budget", type=parse_duration, default="1h",
                        help="CPU time of each pre-training run, one thread (default 1h)")
    parser.add_argument("--objectives", default="lm,sa", help="pre-trainings to compare: lm, sa or both")
    parser.add_argument("--labels", default="1000,5000,150000", help="labelled training reviews (first N)")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--max-unlabeled", type=int, default=0, help="unlabeled reviews to read (0: all 512k)")
    parser.add_argument("--epochs", type=float, default=0, help="fine-tuning epochs (0: 20000/N within [2, 20])")
    parser.add_argument("--lr", type=float, default=None, help="fine-tuning lr (default: the LSTM's 1e-3)")
    parser.add_argument("--batch-size", type=int, default=None, help="fine-tuning batch (default 32)")
    parser.add_argument("--max-length", type=int, default=128, help="fine-tuning tokens per review")
    parser.add_argument("--finetune-budget", type=parse_duration, default="0",
                        help="CPU-time cap of each fine-tuning run (0: epochs only)")
    parser.add_argument("--set", dest="pretrain_set", action="append", default=[],
                        help="pre-training recipe override (both recipes), section.key=value")
    parser.add_argument("--finetune-set", action="append", default=[], help="fine-tuning override")
    parser.add_argument("--smoke", action="store_true", help="tiny model, a few thousand reviews (CI)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    root = Path(args.data_root) if args.data_root else data_root()
    labels = [int(n) for n in args.labels.split(",") if n.strip()]
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    objectives = [o.strip() for o in args.objectives.split(",") if o.strip()]
    budget, max_docs = float(args.pretrain_budget), args.max_unlabeled or None
    overrides = ["train.eval_every=500", "train.save_every=500"] + list(args.pretrain_set)  # the user's win
    if args.smoke and args.task == "nsmc":
        root = smoke_data(root / "nsmc", out / "smoke-data")
    if args.smoke:
        labels, seeds, budget, args.vocab_size, max_docs = [200, 400], [1], 4.0, 3000, None
        args.epochs = args.epochs or 2
        overrides = SMOKE_MODEL + ["train.eval_every=10", "train.save_every=10", "train.batch_size=16",
                                   "train.warmup_steps=2", "train.lr=5e-3"] + list(args.pretrain_set)
    print(f"{machine()}; {load()}", flush=True)
    with data_root_at(root):
        halves = sst2_dev_halves(out) if args.task == "sst2" else None
        text = sst2_unlabeled(out) if args.task == "sst2" else root / "nsmc" / "unlabeled.txt.gz"
        prepared = prepare(text, out, args.vocab_size, max_docs)
        runs = {name: pretrain(name, prepared, out, budget, overrides) for name in objectives}
        from ember.runs.init import Init, load_init

        start = {name: load_init(run) for name, run in runs.items()}
        any_run = next(iter(start.values()))
        # The same LSTM (shape, vocabulary, dropout) with nothing pre-trained.
        inits = {"random": Init(any_run.model, None, any_run.tokenizer), **start}
        results = {label: {n: [finetune(init, label, n, s, out, args, halves) for s in seeds] for n in labels}
                   for label, init in inits.items()}
        bow = bag_of_words(any_run.tokenizer, labels, out, args.task, halves)
    report = {"task": args.task, "machine": machine(), "load_after": load(), "labels": labels, "seeds": seeds,
              "pretrain_budget_cpu_s": budget, "pretraining": perplexity_curves(runs, CURVES),
              "finetune": {label: {str(n): rs for n, rs in by_n.items()} for label, by_n in results.items()},
              "bag_of_words": bow, "smoke": args.smoke}
    write_report(report, out)
    return report


if __name__ == "__main__":
    main()
