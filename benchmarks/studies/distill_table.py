"""The distillation evidence table: a fine-tuned teacher and its students side by side on the
teacher's dev split (SST-2 in the distillation issue), with the issue's claims checked
against the measured numbers.

    PYTHONPATH=. nice -n 19 .venv/bin/python benchmarks/studies/distill_table.py --cpu-time --repeats 5 \\
        --teacher runs/sst2-teacher \\
        --student KD=runs/sst2-kd --student "DistilBERT-init KD=runs/sst2-kd-distilinit" \\
        --student TinyBERT=runs/sst2-tinybert --student PKD-skip=runs/sst2-pkd \\
        --student "no teacher (pre-trained + fine-tuned)=runs/sst2-small" \\
        --baseline "no teacher (pre-trained + fine-tuned)" --out runs/distill-table

For the teacher and every student (each a fine-tuned run folder of a classification task
scored by accuracy; all on the teacher's task and dev split):
- dev accuracy recomputed now, exactly as results.json was made (the run's tokenizer, max
  length and eval batch size), next to results.json's figure; a difference above 1e-6 stops
  the table, since it means weights and results.json are out of step;
- parameters (total, and the backbone without its embeddings), share of the teacher's
  accuracy, agreement with the teacher's dev predictions;
- CPU sentences/s over all dev sentences on PyTorch fp32, PyTorch dynamic int8, ONNX Runtime
  fp32 and ONNX Runtime int8 (ember's own exports), length-sorted batches of 32, every
  (run, path) pair alternating in one process (``_bench.alternate``), and each path's accuracy.
Writes OUT/table.md, OUT/table.json and OUT/table.png (see ``_distill_report``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
from _bench import add_common_args, alternate, apply_common_args, clock_name, load, machine, median, run_cli  # noqa: E402
from _distill_report import claims, render_markdown, write_chart  # noqa: E402
from _predictors import onnx_predictors, rate_keeping_logits, torch_predictors  # noqa: E402

from ember.errors import EmberError  # noqa: E402

BATCH = 32  # the serving default (`ember serve --max-batch`, `ember export --batch-size`)
TOLERANCE = 1e-6  # recomputed vs results.json accuracy: the same computation, so only a stale run differs
# Parameter names under these backbone parts count as embeddings (ALBERT's E -> H projection
# belongs to its factorized embedding, as in the ALBERT paper's parameter counts).
EMBEDDING_PARTS = {"embeddings", "embed_project"}


@dataclass
class Entry:
    """One row: a run folder, loaded and featurized for its dev split."""
    label: str
    path: Path
    role: str  # teacher | student | baseline
    cfg: object  # RunConfig
    module: torch.nn.Module
    features: list[dict]
    pad_id: int
    recorded: dict  # results.json
    method: str
    task: str  # display name, e.g. SST-2


def parse_student(text: str) -> tuple[str, Path]:
    label, sep, run = text.partition("=")
    if not sep or not label.strip() or not run.strip():
        raise EmberError(f"--student {text!r}: write LABEL=RUN, e.g. --student KD=runs/sst2-kd")
    return label.strip(), Path(run.strip())


def _check_classification(label: str, path: Path, cfg, adapter) -> None:
    from ember.config import DECODER_FAMILIES
    from ember.tasks.glue_adapter import GlueAdapter

    if not isinstance(adapter, GlueAdapter) or adapter.spec.is_regression or adapter.main_metric != "accuracy":
        raise EmberError(f"{label} ({path}) was fine-tuned on {adapter.display_name}; the distillation table "
                         "compares classification runs scored by accuracy, such as `ember finetune --task sst2` "
                         "and the `ember distill` students of one")
    if cfg.model.family in DECODER_FAMILIES:
        raise EmberError(f"{label} ({path}) is a {cfg.model.family} classifier; the table times ONNX exports, "
                         "which `ember export` makes for encoder runs only")


def _method(path: Path, cfg) -> str:
    """What made the run: the distillation method (distill.json) or plain fine-tuning, and its init."""
    record = path / "distill.json"
    if record.is_file():
        info = json.loads(record.read_text())
        method = info.get("method", "distill") + (f"-{info['pkd_strategy']}" if info.get("pkd_strategy") else "")
        return f"{method} (init {Path(str(info.get('student_init', 'random'))).name})"
    return f"fine-tune (init {Path(str(cfg.task.init or 'random')).name})"


def load_entry(label: str, path: Path, role: str) -> Entry:
    from ember.tokenizers import load_tokenizer
    from ember.tasks.task_model import load_run_adapter, load_task_module, pad_token_id
    from ember.runs.folder import load_run_config

    cfg = load_run_config(path, expect_kind="finetune")
    adapter = load_run_adapter(path, cfg)
    _check_classification(label, path, cfg, adapter)
    results = path / "results.json"
    if not results.is_file():
        raise EmberError(f"{label} ({path}) has no results.json: pass a finished fine-tuned or distilled run "
                         "(for `ember finetune --seeds`, one of its seed-N folders)")
    recorded = json.loads(results.read_text())
    if "accuracy" not in recorded.get("metrics", {}):
        raise EmberError(f"{results} holds no dev accuracy (metrics.accuracy); re-run `ember evaluate {path}`")
    tokenizer = load_tokenizer(path / "tokenizer.json")
    pad_id = pad_token_id(tokenizer)
    module = load_task_module(path, cfg, adapter, pad_id)
    _, features = adapter.load(cfg.task.eval_split, tokenizer, cfg.task.max_length)
    return Entry(label, path, role, cfg, module, features, pad_id, recorded, _method(path, cfg), adapter.display_name)


def check_same_task(teacher: Entry, entry: Entry) -> None:
    mine, theirs = entry.cfg.task, teacher.cfg.task
    if (mine.name, mine.eval_split) != (theirs.name, theirs.eval_split):
        raise EmberError(f"{entry.label} ({entry.path}) is {mine.name} scored on {mine.eval_split}, but the teacher "
                         f"is {theirs.name} scored on {theirs.eval_split}; every row must share the teacher's task "
                         "and dev split")
    if len(entry.features) != len(teacher.features):
        raise EmberError(f"{entry.label} has {len(entry.features)} dev examples, the teacher {len(teacher.features)}; "
                         "both must read the same dev file (same EMBER_DATA)")


def dev_accuracy(entry: Entry) -> tuple[float, np.ndarray]:
    """(accuracy, predictions) recomputed as results.json was: the run's eval batch size and metric code."""
    from ember.tasks.metrics.classification import compute_metrics

    logits = entry.module.predict(entry.features, entry.cfg.task.eval_batch_size)
    labels = [f["label"] for f in entry.features]
    accuracy = compute_metrics(entry.cfg.task.name, logits, labels)["accuracy"]
    recorded = entry.recorded["metrics"]["accuracy"]
    if abs(accuracy - recorded) > TOLERANCE:
        raise EmberError(f"{entry.label} ({entry.path}): dev accuracy recomputed now is {accuracy:.6f} but its "
                         f"results.json says {recorded:.6f}; the weights and results.json are out of step (an "
                         "overwritten or stale run?): re-train it, or re-evaluate it with `ember evaluate`")
    return accuracy, logits.argmax(-1)


def check_distilled_from(entry: Entry, teacher_accuracy: float) -> None:
    """A distilled student's results.json records its teacher's dev accuracy: it must be this teacher's."""
    theirs = entry.recorded.get("teacher_metrics", {}).get("accuracy")
    if theirs is not None and abs(theirs - teacher_accuracy) > TOLERANCE:
        raise EmberError(f"{entry.label} ({entry.path}) was distilled from a teacher with dev accuracy {theirs:.6f} "
                         f"(its results.json), but --teacher scores {teacher_accuracy:.6f}; pass the teacher it "
                         "was distilled from")


def parameter_counts(module: torch.nn.Module) -> dict[str, int]:
    total = sum(p.numel() for p in module.parameters())
    body = sum(p.numel() for name, p in module.named_parameters()
               if name.startswith("backbone.") and not EMBEDDING_PARTS & set(name.split(".")))
    return {"total": total, "backbone_without_embeddings": body}


def measure(entries: list[Entry], repeats: int, work: Path, warm_up: bool = True) -> dict[tuple[str, str], dict]:
    """(label, path) -> sentences/s (median and all repetitions) and that path's logits (from a timed call)."""
    predictors = {}
    for i, entry in enumerate(entries):
        paths = torch_predictors(entry.module, entry.features, entry.pad_id, BATCH)
        paths.update(onnx_predictors(entry.path, entry.features, entry.pad_id, BATCH, work / f"run-{i}"))
        predictors.update({(entry.label, name): fn for name, fn in paths.items()})
    if warm_up:  # first calls allocate and ONNX Runtime plans its buffers: keep them out of the timings
        with torch.inference_mode():
            for fn in predictors.values():
                fn()
    count = len(entries[0].features)
    names = {f"{label} / {path}": (label, path) for label, path in predictors}
    logits: dict[str, np.ndarray] = {}
    rates = alternate({name: rate_keeping_logits(predictors[key], count, logits, name) for name, key in names.items()},
                      repeats)
    return {key: {"sentences_per_s": median(rates[name]), "repetitions": rates[name], "logits": logits[name]}
            for name, key in names.items()}


def build_rows(entries: list[Entry], scored: dict, timings: dict, labels: np.ndarray) -> list[dict]:
    teacher_accuracy, teacher_pred = scored[entries[0].label]
    rows = []
    for entry in entries:
        accuracy, pred = scored[entry.label]
        model = entry.cfg.model
        paths = {}
        for (label, path), timing in timings.items():
            if label == entry.label:
                path_pred = timing["logits"].argmax(-1)
                paths[path] = {"sentences_per_s": timing["sentences_per_s"], "repetitions": timing["repetitions"],
                               "accuracy": float(np.mean(path_pred == labels)),
                               "agreement_with_fp32": float(np.mean(path_pred == pred))}
        rows.append({"label": entry.label, "run": str(entry.path), "role": entry.role, "method": entry.method,
                     "shape": {"layers": model.num_layers, "hidden": model.hidden_size, "heads": model.num_heads,
                               "intermediate": model.intermediate_size},
                     "parameters": parameter_counts(entry.module),
                     "accuracy": accuracy, "results_json_accuracy": entry.recorded["metrics"]["accuracy"],
                     "share_of_teacher": accuracy / teacher_accuracy if teacher_accuracy else None,
                     "agreement_with_teacher": float(np.mean(pred == teacher_pred)),
                     "predictions": pred.tolist(), "paths": paths})
    return rows


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", required=True, help="the teacher's fine-tuned run folder")
    parser.add_argument("--student", action="append", default=[], metavar="LABEL=RUN", required=True,
                        help="a student row (repeatable), e.g. KD=runs/sst2-kd")
    parser.add_argument("--baseline", action="append", default=[], metavar="LABEL",
                        help="a --student label trained without a teacher (repeatable): distilled students "
                             "are checked against it")
    parser.add_argument("--repeats", type=int, default=5, help="timed repetitions (median reported)")
    parser.add_argument("--out", help="folder for table.md, table.json and table.png")
    add_common_args(parser, "one repetition, no warm-up: for CI, on the tiny runs a test provides")
    args = parser.parse_args(argv)
    students = [parse_student(s) for s in args.student]
    labels = ["teacher"] + [label for label, _ in students]
    doubles = sorted({label for label in labels if labels.count(label) > 1})
    if doubles:
        raise EmberError(f"row labels must be unique ('teacher' is the teacher's); repeated: {', '.join(doubles)}")
    unknown = [b for b in args.baseline if b not in labels[1:]]
    if unknown:
        raise EmberError(f"--baseline {', '.join(unknown)}: no --student has that label "
                         f"(labels: {', '.join(labels[1:])})")
    if args.repeats < 1:
        raise EmberError("--repeats must be at least 1")
    return args, students


def main(argv: list[str] | None = None) -> dict:
    args, students = parse_args(argv)
    apply_common_args(args)
    repeats = 1 if args.smoke else args.repeats
    load_before = load()
    entries = [load_entry("teacher", Path(args.teacher), "teacher")]
    for label, run in students:
        entries.append(load_entry(label, run, "baseline" if label in args.baseline else "student"))
        check_same_task(entries[0], entries[-1])
    scored = {e.label: dev_accuracy(e) for e in entries}
    for entry in entries[1:]:
        check_distilled_from(entry, scored["teacher"][0])
    labels = np.asarray([f["label"] for f in entries[0].features])
    print(f"{entries[0].cfg.task.name} {entries[0].cfg.task.eval_split}: {len(labels)} sentences, "
          f"{len(entries)} runs, {repeats} repetitions; {load()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="ember-distill-table-") as work:
        timings = measure(entries, repeats, Path(work), warm_up=not args.smoke)
    result = {"machine": machine(), "clock": clock_name(), "load_before": load_before, "load_after": load(),
              "date": time.strftime("%Y-%m-%d %H:%M"), "task": entries[0].task,
              "split": entries[0].cfg.task.eval_split, "sentences": len(labels), "batch_size": BATCH,
              "repeats": repeats, "labels": labels.tolist(), "rows": build_rows(entries, scored, timings, labels)}
    result["claims"] = claims(result)
    markdown = render_markdown(result)
    print("\n" + markdown)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "table.md").write_text(markdown)
        (out / "table.json").write_text(json.dumps(result, indent=2))
        write_chart(result, out / "table.png")
        print(f"wrote {out / 'table.md'}, table.json, table.png")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    run_cli(main)
