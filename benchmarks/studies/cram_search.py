"""A CPU cramming recipe search (`bert-cram-cpu`, issue 18 item 5): the shape, vocabulary, sequence
length, batch, peak lr, warm-up, pre-/post-LN and dropout with the lowest held-out MLM loss after
30 and 60 CPU-minutes, searched as Geiping & Goldstein (2022, "Cramming") did for one GPU-day.

    PYTHONPATH=. nice -n 10 .venv/bin/python benchmarks/studies/cram_search.py --out runs/cram \\
        --screen-budget 5m --budgets 30m,60m --top 2 --workers 2 --finetune

A trial is `ember.pretrain("bert-mini", ...)` with `objective=mlm` (MLM only; a top-level key that
apply_overrides sets like any other) and the knobs as overrides, on one thread, its budget in CPU
seconds of training steps (train.clock=cpu) with train.schedule=time: warm-up and the linear decay
to zero laid over the budget, as in cramming, so each budget is a run of its own. (1) Screening:
the baseline (bert-mini's recipe as it is) and a coordinate search, one knob at a time in --knobs
order around the current best, each value a --screen-budget trial (--workers at once), a change
kept only when it lowers the ranking metric; (2) --top screened configurations at each of
--budgets: the best of each shape first (a short screening favours small shapes), then the next
best; (3) the winner (lowest at the longest budget) as OUT/bert-cram-cpu.yaml, a recipe for
`ember pretrain --recipe OUT/bert-cram-cpu.yaml --data ...`, OUT/table.md and table.json (every
trial), OUT/curves.png (held-out MLM loss against CPU-minutes of the full-budget runs);
(4) --finetune: the winner and a random init of its shape on SST-2 and CoLA over --seeds.

The ranking metric (benchmarks/common/_cram_eval.py). MLM loss per masked token compares neither across vocabularies (a bigger
vocabulary's tokens are longer: harder to guess, more text each) nor across sequence lengths (more
context, other text). So every trial's final weights are scored by one protocol: the whole
held-out split (or --eval-examples sequences) cut into --eval-length tokens (default: the shortest
length searched, so no model meets positions it never trained), fixed masks (the seeds of ember's
held-out evaluation), and the masked tokens' cross-entropy per character of their text: bits/char
= sum of CE (nats) / ln 2 / sum of characters, each masked target decoded to its vocabulary entry
with WordPiece's '##' (or a BPE/Unigram word mark) stripped, spaces not counted. Every vocabulary
tokenizes the same held-out documents, so the number does not depend on the tokenizer (though 15%
of the tokens hide somewhat more text under a bigger vocabulary). Within one vocabulary the masked
tokens are the same in every trial: the characters are a constant, and bits/char ranks exactly as
the protocol's cross-entropy does. The table keeps each run's own held-out MLM loss and accuracy
too (ember's evaluation at the trial's length, data.eval_examples); the curves plot those.

Vocabularies: a WordPiece tokenizer and token shards per size, made once by ember's library from
--corpus (default $EMBER_DATA/wiki-en) into OUT/corpora/vocab-N, or --data N=PATH. A trial is the
folder OUT/trials/NAME: its run in run/ and record.json, written atomically when done (then its
checkpoints are removed). A rerun skips finished trials and continues an interrupted one from its
checkpoint. --smoke: tiny space, model and corpus, seconds-long budgets, fine-tuning included (CI).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
import _cram_report  # noqa: E402
from _bench import load, machine, run_cli  # noqa: E402
from _checkpoint_study import choices  # noqa: E402
from _cram_eval import heldout_eval, predictions  # noqa: E402
from time_to_accuracy import SMOKE_MODEL, recipe_config  # noqa: E402

import ember  # noqa: E402
from ember.durations import format_duration, parse_duration  # noqa: E402
from ember.errors import EmberError  # noqa: E402
from ember.fileio import atomic_write_text  # noqa: E402
from ember.paths import data_root  # noqa: E402

RECIPE = "bert-mini"
BASE = ["objective=mlm", "data.nsp=false"]  # MLM only, as cramming and RoBERTa (data.nsp: for clarity)
# knob -> (values searched, the baseline: bert-mini's own), in the default search order
SPACE = {
    "dropout": ([0.1, 0.0], 0.1),  # cramming: no dropout when each token is seen about once
    "pre_ln": ([False, True], False),  # cramming: pre-LN tolerates a higher peak lr
    "lr": ([2.5e-4, 5e-4, 1e-3, 2e-3], 5e-4),
    "warmup": ([0.01, 0.05, 0.1, 0.25], 0.05),  # share of the budget; then linear decay to 0
    "batch": ([16, 32, 64, 128], 32),
    "seq": ([64, 128, 256], 128),
    "shape": (["2x128", "4x256", "6x256", "4x384", "8x256"], "4x256"),  # layers x hidden
    "vocab": ([8192, 16384, 30522], 30522),
}
SMOKE_SPACE = {"lr": ([1e-3, 3e-3], 1e-3), "pre_ln": ([False, True], False), "vocab": ([600, 1000], 1000),
               "shape": (["1x32"], "1x32"), "seq": ([64], 64), "batch": ([8], 8), "warmup": ([0.1], 0.1),
               "dropout": ([0.0], 0.0)}
TASKS = {"sst2": "accuracy", "cola": "mcc"}  # fine-tuning tasks and their main metrics


def parse_value(knob: str, text) -> object:
    """A knob's value from the command line, checked for its type and range."""
    try:
        if knob == "shape":
            layers, hidden = (int(v) for v in str(text).lower().split("x"))
            if layers >= 1 and hidden >= 8:
                return f"{layers}x{hidden}"
        elif knob == "pre_ln":
            return {"true": True, "false": False, "pre": True, "post": False}[str(text).lower()]
        elif knob in ("vocab", "seq", "batch"):
            if float(text).is_integer() and float(text) >= {"vocab": 100, "seq": 8, "batch": 1}[knob]:
                return int(float(text))
        elif knob == "lr" and float(text) > 0 or knob != "lr" and 0 <= float(text) < 1:
            return float(text)
    except (ValueError, KeyError):
        pass
    raise EmberError(f"{knob}={text!r} is not a valid value; e.g. {knob}={SPACE[knob][1]}")


def knob_overrides(knob: str, value) -> list[str]:
    """The ember settings a knob's value stands for (a vocabulary is its corpus: chosen apart)."""
    if knob == "shape":  # heads of 64 dimensions (at least 2), a 4H feed-forward: BERT's miniatures
        layers, hidden = (int(v) for v in value.split("x"))
        return [f"model.num_layers={layers}", f"model.hidden_size={hidden}",
                f"model.num_heads={max(2, hidden // 64)}", f"model.intermediate_size={4 * hidden}"]
    if knob == "seq":  # BERT: max_predictions_per_seq ~ 15% of the length (20 at 128)
        return [f"data.max_seq_length={value}", f"data.max_predictions={predictions(value)}"]
    if knob == "dropout":
        return [f"model.dropout={value}", f"model.attention_dropout={value}"]
    setting = {"batch": "train.batch_size", "lr": "train.lr", "warmup": "train.warmup_ratio",
               "pre_ln": "model.pre_layer_norm", "vocab": None}[knob]
    return [f"{setting}={str(value).lower()}"] if setting else []


def trial_name(stage: str, budget: float, config: dict) -> str:
    """A readable folder name: screen-5m-4x256-v30522-L128-b32-lr0.0005-wu0.05-postLN-do0.1."""
    c = config
    return (f"{'screen-' if stage == 'screen' else ''}{format_duration(budget)}-{c['shape']}-v{c['vocab']}-"
            f"L{c['seq']}-b{c['batch']}-lr{c['lr']:g}-wu{c['warmup']:g}-{'pre' if c['pre_ln'] else 'post'}LN-"
            f"do{c['dropout']:g}")


# -- the search ---------------------------------------------------------------------------------
def select(current: dict, current_metric: float, results: list[tuple[dict, float | None]],
           min_gain: float = 0.0) -> tuple[dict, float]:
    """A coordinate-search step: the candidate with the lowest metric when it beats the current
    configuration by more than ``min_gain``, else the current one (a diverged run's metric: None)."""
    finite = [(c, m) for c, m in results if m is not None and math.isfinite(m)]
    best = min(finite, key=lambda cm: cm[1], default=None)
    return best if best is not None and best[1] < current_metric - min_gain else (current, current_metric)


def metric(record: dict) -> float:
    return record["bits_per_char"] if record.get("status") == "done" else math.inf


def budget_candidates(screened: list[dict], top: int) -> list[dict]:
    """The configurations re-run at the full budgets: the best screened configuration of each shape
    first (best shape first), then the next best overall, ``top`` in all. A short screening favours
    the small shapes that take more steps in it, while the compute-optimal model grows with the
    budget (Kaplan et al. 2020; Geiping & Goldstein 2022, section 3): so the shapes meet again at
    the budgets that decide, instead of the top few being variants of the smallest shape."""
    ranked = sorted((r for r in screened if metric(r) < math.inf), key=metric)
    best_of_shape = {}
    for record in ranked:
        best_of_shape.setdefault(record["config"]["shape"], record["config"])
    chosen = list(best_of_shape.values())[:top]
    chosen += [r["config"] for r in ranked if r["config"] not in chosen][:top - len(chosen)]
    return chosen


def coordinate_search(baseline: dict, space: dict, order: list[str], passes: int, evaluate, log=print) -> dict:
    """One knob at a time around the current best; ``evaluate(configs) -> records``."""
    best = dict(baseline)
    best_metric = metric(evaluate([best])[0])
    for _ in range(passes):
        changed = False
        for knob in order:
            candidates = [{**best, knob: v} for v in space[knob] if v != best[knob]]
            if candidates:
                records = evaluate(candidates)
                new, best_metric = select(best, best_metric, [(c, metric(r)) for c, r in zip(candidates, records)])
                log(f"  {knob}: {'now' if new is not best else 'keep'} {new[knob]} (bits/char {best_metric:.4f})")
                changed, best = changed or new is not best, new
        if not changed:
            break
    return best


class Search:
    """The study's settings, its corpora (vocab -> (folder, tokenizer size)) and every record."""

    def __init__(self, args, out: Path, corpora: dict[int, tuple[Path, int]]) -> None:
        self.args, self.out, self.corpora = args, out, corpora
        self.records: dict[str, dict] = {}
        self.trained = 0

    def pretrain_spec(self, config: dict, budget: float, stage: str) -> dict:
        args, name, every = self.args, trial_name(stage, budget, config), 0
        if stage == "budget":  # --curve-points evaluations, paced by the screening trial's speed
            seen = self.records.get(trial_name("screen", args.screen_budget, config), {})
            every = max(1, round(seen["steps"] / seen["cpu_s"] * budget / args.curve_points)) if seen else 100
        sets = (BASE + args.extra + [o for k, v in config.items() for o in knob_overrides(k, v)]
                + [f"model.vocab_size={self.corpora[config['vocab']][1]}", "train.clock=cpu", "train.num_threads=1",
                   "train.schedule=time", "train.max_steps=100000000", f"train.max_time={budget}",
                   f"train.eval_every={every}", f"train.save_every={3 * every}"])
        return {"kind": "pretrain", "name": name, "dir": str(self.out / "trials" / name), "stage": stage,
                "budget": budget, "config": config, "overrides": sets, "data": str(self.corpora[config["vocab"]][0]),
                "eval_length": args.eval_length, "eval_examples": args.eval_examples}

    def run(self, specs: list[dict]) -> list[dict]:
        """Records of ``specs`` in order: read when done before, else trained (--workers at once)."""
        done = {s["name"]: _read_record(s) for s in specs}
        todo = sorted((s for s in specs if done[s["name"]] is None), key=lambda s: -s.get("budget", 0))
        if todo:  # (the longest first, so the workers finish together)
            print(f"{len(todo)} to train ({len(specs) - len(todo)} done before); {load()}", flush=True)
        if self.args.workers <= 1:  # in this process: the Trainer's signal handlers need the main thread
            for spec in todo:
                self._finished(run_job(spec), done)
        else:  # a failure stops the study once the trials under way have finished
            with ThreadPoolExecutor(self.args.workers) as pool:
                for future in as_completed([pool.submit(run_in_subprocess, s) for s in todo]):
                    self._finished(future.result(), done)
        self.records.update(done)
        return [done[s["name"]] for s in specs]

    def _finished(self, record: dict, done: dict) -> None:
        self.trained += 1
        done[record["name"]] = record
        print(f"  [{self.trained}] {_cram_report.describe(record)}; {load()}", flush=True)


def _read_record(spec: dict) -> dict | None:
    path = Path(spec["dir"]) / "record.json"
    return json.loads(path.read_text()) if path.is_file() else None


# -- one job (a trial or a fine-tuning), in this process or a worker's --------------------------
def run_job(spec: dict) -> dict:
    folder, started = Path(spec["dir"]), time.perf_counter()
    record = {**spec, **(pretrain_job(spec, folder / "run") if spec["kind"] == "pretrain"
                         else finetune_job(spec, folder / "run"))}
    record["wall_s"] = time.perf_counter() - started
    atomic_write_text(folder / "record.json", json.dumps(record, indent=2))
    shutil.rmtree(folder / "run" / "checkpoints", ignore_errors=True)  # done: the final weights are enough
    return record


def pretrain_job(spec: dict, run: Path) -> dict:
    from ember.runs.folder import last_evaluation

    resume = (run / "checkpoints").is_dir()  # an interrupted run continues from its checkpoint
    try:
        trained = ember.pretrain(RECIPE, run, data=spec["data"], overrides=spec["overrides"], resume=resume,
                                 overwrite=not resume, progress=False).runs[0]
    except EmberError as exc:
        if "loss became" not in str(exc):
            raise
        return {"status": "diverged", "error": str(exc)}  # a result too: this lr (or shape) is too hot
    final = last_evaluation(run)
    return {"status": "done", "steps": trained["step"], "tokens": trained["tokens"], "cpu_s": trained["elapsed"],
            "mlm_loss": final.get("mlm_loss"), "mlm_acc": final.get("mlm_acc"),
            **heldout_eval(run, spec["eval_length"], spec["eval_examples"])}


def finetune_job(spec: dict, out: Path) -> dict:
    from ember.runs.folder import load_run_config
    from ember.runs.init import Init

    run = Path(spec["init"])  # the random start: the winner's shape and tokenizer, no weights
    init = Init(load_run_config(run).model, None, run / "tokenizer.json") if spec["variant"] == "random" else run
    result = ember.finetune(spec["task"], out, init, seeds=spec["seeds"], train_limit=spec["train_limit"],
                            epochs=spec["epochs"], lr=spec["lr"], max_length=spec["max_length"], num_threads=1,
                            overrides=spec["model"], overwrite=True, progress=False)
    name = TASKS[spec["task"]]
    return {"metric": name, "scores": {str(s): r["metrics"][name] for s, r in zip(spec["seeds"], result.runs)}}


def run_in_subprocess(spec: dict) -> dict:
    """The job in a Python process of its own (one thread), its output in DIR/log.txt."""
    folder, root = Path(spec["dir"]), str(Path(__file__).resolve().parents[2])
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    with open(folder / "log.txt", "w", encoding="utf-8") as log:
        code = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--job", json.dumps(spec)],
                              stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root).returncode
    record = _read_record(spec)
    if code or record is None:
        tail = "\n".join((folder / "log.txt").read_text(encoding="utf-8").splitlines()[-15:])
        raise EmberError(f"{spec['name']} failed (exit code {code}); the end of {folder}/log.txt:\n{tail}")
    return record


def ensure_corpora(args, out: Path) -> dict[int, tuple[Path, int]]:
    """vocab -> (prepared folder, its tokenizer's size): --data, or made once from --corpus."""
    from ember.data.prepare import prepare_corpus
    from ember.data.shards import TokenCorpus
    from ember.tokenizers import train_tokenizer

    corpora = {}
    for vocab in sorted(set(args.space["vocab"]) | {args.baseline["vocab"]}):
        folder = out / "corpora" / f"vocab-{vocab}"
        prepared = args.data.get(vocab, folder / "prepared")
        if not (prepared / "meta.json").is_file():
            print(f"vocabulary {vocab}: tokenizer and shards from {args.corpus} ({load()})", flush=True)
            folder.mkdir(parents=True, exist_ok=True)
            train_tokenizer([args.corpus], vocab_size=vocab, max_documents=args.corpus_docs or None,
                            progress=False).save(str(folder / "tokenizer.json"))
            prepare_corpus([args.corpus], folder / "tokenizer.json", prepared, max_docs=args.corpus_docs or None,
                           workers=args.workers, progress=False, overwrite=True)
        corpora[vocab] = (prepared.resolve(), TokenCorpus(prepared, "train").vocab_size)
    return corpora


# -- command line: all of it is checked before a file is written --------------------------------
def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--screen-budget", default="5m", help="CPU time of each screening trial")
    p.add_argument("--budgets", default="30m,60m", help="the budgets the --top configurations re-run at")
    p.add_argument("--top", type=int, default=3,
                   help="screened configurations re-run at every budget (the best of each shape first)")
    p.add_argument("--workers", type=int, default=1, help="trials at once, each a process on one thread")
    p.add_argument("--knobs", default=",".join(SPACE), help="the knobs searched, in this order")
    p.add_argument("--space", dest="space_items", action="append", default=[], metavar="KNOB=V1,V2,...")
    p.add_argument("--baseline", dest="baseline_items", action="append", default=[], metavar="KNOB=V")
    p.add_argument("--passes", type=int, default=1, help="rounds over the knobs (fewer when one changes none)")
    p.add_argument("--corpus", help="raw text the vocabularies are made from (default: $EMBER_DATA/wiki-en)")
    p.add_argument("--corpus-docs", type=int, default=0, help="only its first N documents (0: all)")
    p.add_argument("--data", dest="data_items", action="append", default=[], metavar="VOCAB=PATH",
                   help="a corpus prepared (`ember prepare`) with a tokenizer of about VOCAB pieces")
    p.add_argument("--eval-length", type=int, default=0, help="protocol length (0: the shortest searched)")
    p.add_argument("--eval-examples", type=int, default=0, help="protocol sequences (0: the whole held-out split)")
    p.add_argument("--curve-points", type=int, default=12, help="held-out evaluations in a full-budget run")
    p.add_argument("--finetune", action="store_true", help="fine-tune the winner and a random init (SST-2, CoLA)")
    p.add_argument("--seeds", default="1,2,3", help="fine-tuning seeds")
    p.add_argument("--finetune-lr", type=float, default=1e-4, help="peak lr of both (as time_to_accuracy)")
    p.add_argument("--sst2-limit", type=int, default=20000, help="SST-2 sentences, 1 epoch (0: all 67k)")
    p.add_argument("--finetune-dropout", type=float, default=0.1, help="dropout when fine-tuning (cramming: 0.1)")
    p.add_argument("--screen-only", action="store_true",
                   help="stop after the screening (OUT/screening.md); rerun without it to go on to --budgets")
    p.add_argument("--smoke", action="store_true", help="tiny space, model and corpus; seconds-long budgets (CI)")
    args = p.parse_args(argv)
    space = SMOKE_SPACE if args.smoke else SPACE
    if args.smoke:
        args.screen_budget, args.budgets, args.top, args.seeds, args.finetune = "1s", "1s,2s", 2, "1,2", True
        args.knobs, args.eval_examples, args.corpus_docs, args.sst2_limit = "lr,pre_ln,vocab", 64, 60, 32
        args.corpus = args.corpus or str(data_root() / "wiki-en" / "AA" / "wiki_00.gz")
    args.extra, args.order = SMOKE_MODEL if args.smoke else [], choices(args.knobs, SPACE, "knob")
    args.space, args.baseline = {k: v[0] for k, v in space.items()}, {k: v[1] for k, v in space.items()}
    for knob, values in (_pair(item, "--space") for item in args.space_items):
        args.space[knob] = [parse_value(knob, v) for v in values.split(",") if v.strip()]
    for knob, value in (_pair(item, "--baseline") for item in args.baseline_items):
        args.baseline[knob] = parse_value(knob, value)
    args.screen_budget, args.budgets = _budget(args.screen_budget), sorted(map(_budget, args.budgets.split(",")))
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        raise EmberError(f"--seeds {args.seeds!r}: write whole numbers, e.g. 1,2,3") from None
    if min(args.top, args.workers, args.passes, args.curve_points, len(args.seeds)) < 1:
        raise EmberError("--top, --workers, --passes, --curve-points and --seeds need at least one")
    args.data = {parse_value("vocab", v): Path(path) for v, path in (_pair(d, "--data") for d in args.data_items)}
    check_space(args)
    check_corpora(args)
    return args


def _pair(item: str, option: str) -> tuple[str, str]:
    if "=" not in item:
        raise EmberError(f"{option} {item!r}: write NAME=VALUE (e.g. {option} lr=5e-4)")
    key, value = (s.strip() for s in item.split("=", 1))
    return key if option == "--data" else choices(key, SPACE, "knob")[0], value


def _budget(text: str) -> float:
    if parse_duration(text) <= 0:
        raise EmberError(f"budget {text!r} must be positive (e.g. 5m, 30m, 1h)")
    return parse_duration(text)


def check_space(args) -> None:
    """Settle the protocol's length; build the RunConfig of the baseline and of every one-knob
    change (setting names, types, shapes, lengths)."""
    shortest = min(set(args.space["seq"]) | {args.baseline["seq"]})
    args.eval_length = args.eval_length or shortest
    if args.eval_length > shortest:
        raise EmberError(f"--eval-length {args.eval_length} is longer than the shortest length searched "
                         f"({shortest}): that model would be scored at positions it never trained")
    for knob, values in args.space.items():
        if not values:
            raise EmberError(f"--space {knob}= gives no values")
        for config in ({**args.baseline, knob: v} for v in values):
            sets = BASE + args.extra + [o for k, v in config.items() for o in knob_overrides(k, v)]
            cfg = recipe_config(RECIPE, sets + [f"model.vocab_size={config['vocab']}"])
            if cfg.data.max_seq_length > cfg.model.max_position:
                raise EmberError(f"seq={cfg.data.max_seq_length} exceeds model.max_position={cfg.model.max_position}")


def check_corpora(args) -> None:
    """Every --data folder is a prepared corpus; --corpus has text when a vocabulary is to be made."""
    from ember.data.readers import DocumentReader

    for vocab, path in args.data.items():
        if not (path / "meta.json").is_file():
            raise EmberError(f"--data {vocab}={path}: not a folder written by `ember prepare` (no meta.json)")
    if set(args.space["vocab"]) | {args.baseline["vocab"]} <= set(args.data):
        return
    args.corpus = args.corpus or str(data_root() / "wiki-en")
    if not Path(args.corpus).exists():
        raise EmberError(f"--corpus {args.corpus} does not exist (set EMBER_DATA, or give --corpus or --data)")
    if next(iter(DocumentReader([args.corpus])), None) is None:
        raise EmberError(f"--corpus {args.corpus} holds no text to make a vocabulary from")


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--job"]:  # a worker process (run_in_subprocess)
        torch.set_num_threads(1)
        return run_job(json.loads(argv[1]))
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    print(f"{machine()}; {load()}", flush=True)
    search = Search(args, out, ensure_corpora(args, out))
    print(f"screening: {format_duration(args.screen_budget)} a trial, knobs {', '.join(args.order)}", flush=True)
    coordinate_search(args.baseline, args.space, args.order, args.passes, lambda configs: search.run(
        [search.pretrain_spec(c, args.screen_budget, "screen") for c in configs]))
    screened = sorted((r for r in search.records.values() if r["stage"] == "screen"), key=metric)
    top = budget_candidates(screened, args.top)
    if not top:
        raise EmberError("every screening trial diverged: lower the lr values (--space lr=...)")
    if args.screen_only:  # stage 1 alone; the same command without the flag continues from here
        text = _cram_report.write_screening(out, screened, args.screen_budget)
        print(text)
        return {"screened": screened, "text": text, "trained": search.trained}
    print(f"budgets {', '.join(map(format_duration, args.budgets))} for the top {len(top)}", flush=True)
    runs = search.run([search.pretrain_spec(c, b, "budget") for b in args.budgets for c in top])
    final = [r for r in runs if r["budget"] == args.budgets[-1] and metric(r) < math.inf]
    if not final:
        raise EmberError(f"every run at {format_duration(args.budgets[-1])} diverged")
    winner = min(final, key=metric)
    meta = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M"), "argv": argv, "recipe": RECIPE,
            "base": BASE + args.extra, "order": args.order, "space": args.space, "baseline": args.baseline,
            "screen_budget": args.screen_budget, "budgets": args.budgets, "eval_length": args.eval_length,
            "eval_examples": args.eval_examples, "corpus": args.corpus, "smoke": args.smoke,
            "finetune_lr": args.finetune_lr, "finetune_dropout": args.finetune_dropout}
    pretraining = [r for r in search.records.values() if r["kind"] == "pretrain"]
    result = _cram_report.write(out, pretraining, winner, meta)  # before fine-tuning, which takes a while
    if args.finetune:
        result = _cram_report.write(out, pretraining, winner, meta, finetune_stage(search, winner))
    print(result["text"])
    return {**result, "trained": search.trained}


def finetune_stage(search: Search, winner: dict) -> list[dict]:
    """The winner and a random init of its shape on each task: same seeds, data and settings."""
    # one folder per peak lr and dropout: a rerun with other settings keeps the earlier runs
    args = search.args
    folder = search.out / "finetune" / f"{winner['name']}-lr{args.finetune_lr:g}-do{args.finetune_dropout:g}"
    dropout = [f"model.dropout={args.finetune_dropout}", f"model.attention_dropout={args.finetune_dropout}"]
    specs = [{"kind": "finetune", "name": f"{variant}-{task}", "dir": str(folder / f"{variant}-{task}"),
              "variant": variant, "task": task, "init": str(Path(winner["dir"]) / "run"), "seeds": args.seeds,
              "train_limit": args.sst2_limit or None if task == "sst2" or args.smoke else None,
              "epochs": 1 if task == "sst2" or args.smoke else 3, "lr": args.finetune_lr,
              "max_length": 32 if args.smoke else 64, "model": dropout}
             for variant in ("pretrained", "random") for task in TASKS]
    print(f"fine-tuning {winner['name']} and a random init, seeds {args.seeds}", flush=True)
    return search.run(specs)


if __name__ == "__main__":
    run_cli(main)
