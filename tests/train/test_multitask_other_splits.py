"""A task of a mixture is scored on every further labelled split it has, as a single-task run is
(ember.train.finetune.score_other_splits): your own TEST file (NAME=KIND:TRAIN:DEV:TEST) and a built-in
task's test set (CoNLL-2003's, tests/train/test_multitask_heads.py; MRPC's, below), once, with the task's own
best-on-dev weights, into its results.json, summary.json and the printed table. A tiny BERT on real
RTE rows and a regression task of real STS-B rows with a test file of its own (continuous metrics, so
scoring other weights than the kept ones shows)."""

from __future__ import annotations

import csv
import json

import pytest
from conftest import real_data
from multitask_helpers import TINY_MODEL, glue_tokenizer

import ember
from ember.errors import EmberError


def stsb_regression_files(folder, train_n: int = 96, dev_n: int = 60, test_n: int = 60) -> tuple:
    """(train.csv, dev.csv, test.csv) of real STS-B pairs and scores as a custom regression task: training
    rows from STS-B train; dev and test from separate rows of STS-B dev (its test labels are not public)."""
    def rows(split):
        with open(real_data("glue", "STS-B", f"{split}.tsv"), encoding="utf-8") as fh:
            return [r[-3:] for r in list(csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]]

    train, dev = rows("train"), rows("dev")
    paths = []
    for split, part in (("train", train[:train_n]), ("dev", dev[:dev_n]), ("test", dev[dev_n:dev_n + test_n])):
        path = folder / f"stsb-{split}.csv"
        with open(path, "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(["sentence1", "sentence2", "score"])
            writer.writerows(part)
        paths.append(path)
    return tuple(paths)


@pytest.fixture(scope="module")
def split_run(tmp_path_factory):
    real_data("glue", "RTE")
    root = tmp_path_factory.mktemp("multitask-splits")
    tokenizer = glue_tokenizer(root / "tokenizer.json")
    train, dev, test = stsb_regression_files(root)
    return root, tokenizer, (train, dev, test)


def test_multitask_scores_each_tasks_test_file_with_its_kept_weights(split_run, tmp_path, capsys):
    root, tokenizer, (train, dev, test) = split_run
    run = root / "run"
    result = ember.finetune(tasks=["rte", f"sim=regression:{train}:{dev}:{test}"], out=run, model="bert-tiny",
                            tokenizer=str(tokenizer), train_limit=48, max_length=64, lr=1e-3, batch_size=8,
                            epochs=3, seed=4, progress=False, overrides=TINY_MODEL)
    table = capsys.readouterr().out
    folder = run / "tasks" / "sim"
    sim = json.loads((folder / "results.json").read_text())
    assert set(sim["other_splits"]) == {"test"} and sim["main_metric"] == "pearson"
    # scored with the task's own best-on-dev weights (its folder), as `ember evaluate --split test` scores them
    assert sim["other_splits"]["test"] == pytest.approx(ember.evaluate(folder, split="test")["metrics"])
    assert sim["other_splits"]["test"] == pytest.approx(ember.evaluate(folder, file=test)["metrics"])
    # ... which are not the run's final weights here (best on dev at step 12 of 36): those score otherwise
    assert sim["best_step"] < sim["steps"]
    assert sim["other_splits"]["test"]["pearson"] != pytest.approx(_final_weights_score(run, "sim", tmp_path)["pearson"])
    # RTE has no labelled split beyond dev here: nothing reported for it
    assert "other_splits" not in json.loads((run / "tasks" / "rte" / "results.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["tasks"]["sim"]["other_splits"] == {"test": sim["other_splits"]["test"]["pearson"]}
    assert result.result["tasks"]["sim"]["other_splits"] == sim["other_splits"]
    assert result.metrics["sim.test.pearson"] == sim["other_splits"]["test"]["pearson"]
    row = next(line for line in table.splitlines() if line.startswith("sim "))
    assert row.endswith(f"test {sim['other_splits']['test']['pearson']:.4f}")
    # and in the HTML report's task table
    from ember.experiments.run_report import write_report

    html = write_report(run, tmp_path / "report.html").read_text(encoding="utf-8")
    assert "<th>other splits</th>" in html
    assert f"<td>test {sim['other_splits']['test']['pearson']:.4g}</td>" in html  # the page's 4 digits


def test_multitask_mixture_scores_mrpcs_labelled_test_split_and_not_rtes(split_run, capsys):
    """MRPC's test.tsv carries labels here: in a mixture it is scored with MRPC's own best-on-dev weights,
    as `ember evaluate --split test` scores them; RTE, without a test file, reports none."""
    real_data("glue", "MRPC", "test.tsv")
    root, tokenizer, _ = split_run
    run = root / "mrpc-rte"
    ember.finetune(tasks=["mrpc", "rte"], out=run, model="bert-tiny", tokenizer=str(tokenizer), train_limit=32,
                   max_length=32, lr=1e-3, batch_size=16, epochs=1, seed=1, progress=False, overrides=TINY_MODEL)
    table = capsys.readouterr().out
    mrpc = json.loads((run / "tasks" / "mrpc" / "results.json").read_text())
    assert set(mrpc["other_splits"]) == {"test"} and {"f1", "accuracy"} <= set(mrpc["other_splits"]["test"])
    assert mrpc["other_splits"]["test"] == pytest.approx(ember.evaluate(run / "tasks" / "mrpc", split="test")["metrics"])
    assert "other_splits" not in json.loads((run / "tasks" / "rte" / "results.json").read_text())
    row = next(line for line in table.splitlines() if line.startswith("mrpc "))
    assert row.endswith(f"test {mrpc['other_splits']['test']['f1']:.4f}")


def _final_weights_score(run, task: str, tmp_path) -> dict:
    """The task's test metrics with the run's final shared model (RUN/model.safetensors) in its folder."""
    import shutil

    from ember.runs.checkpoint import load_weights, save_weights

    copy = tmp_path / "final"
    shutil.copytree(run / "tasks" / task, copy)
    state = load_weights(run / "model.safetensors")
    head = f"heads.{task}."
    save_weights({k[len(head):] if k.startswith(head) else k: v for k, v in state.items()
                  if k.startswith(("backbone.", head))}, copy / "model.safetensors")
    return ember.evaluate(copy, split="test")["metrics"]


def test_multitask_test_file_spellings_and_bad_input(split_run, tmp_path):
    root, tokenizer, (train, dev, test) = split_run
    from ember.api.multitask import parse_tasks

    assert parse_tasks(f"rte,t=regression:{train}:{dev}:{test}:prefix=para phrase")[1] == {
        "name": "t", "kind": "regression", "train": str(train), "dev": str(dev), "test": str(test), "prefix": "para phrase"}
    assert parse_tasks(f"t=regression:{train}:{dev}:prefix=x")[0]["prefix"] == "x"  # a prefix without a test file
    out = tmp_path / "never"
    common = dict(out=out, model="bert-tiny", tokenizer=str(tokenizer), train_limit=8, progress=False,
                  max_length=48, overrides=TINY_MODEL)
    cases = [
        (f"t=regression:{train}:{dev}:{test}:{test}", "at most a TEST file and prefix=TEXT"),
        (f"t=regression:{train}:{dev}:{tmp_path / 'gone.csv'}", "gone.csv: file not found"),
        (f"t=regression:{train}:{dev}:{dev}", "must be different files"),
        ({"name": "t", "kind": "regression", "train": str(train), "dev": str(dev), "tset": str(test)}, "unknown key 'tset'"),
        ({"name": "t", "kind": "regression", "train": str(train), "dev": str(dev), "prefix": "two\nlines"}, "one line"),
    ]
    pairs = [tmp_path / "pairs.jsonl", tmp_path / "pairs-dev.jsonl"]
    for path in pairs:
        path.write_text('{"input": "a gem", "target": "good"}\n', encoding="utf-8")
    cases.append((f"t=text2text:{pairs[0]}:{pairs[1]}", "takes an encoder-decoder"))  # a bert-tiny writes no texts
    for task, message in cases:
        with pytest.raises(EmberError, match=message) as error:
            ember.finetune(tasks=["rte", task], **common)
        assert "\n" not in str(error.value) and not out.exists()
