"""A GLUE task's labelled test split (MRPC's, exported with its public labels): read by its header, scored
once with the best-on-dev weights after fine-tuning (results.json ``other_splits``), never where the test
file is absent (RTE here) or carries no labels (GLUE's own test files)."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from conftest import make_wordpiece, real_data
from ember.tasks.base import get_adapter
from ember.tasks.readers.glue import get_task, has_labels, read_examples

# The original GLUE download's MRPC test.tsv: no label column (GLUE keeps test labels private).
GLUE_MRPC_TEST_HEADER = ["index", "#1 ID", "#2 ID", "#1 String", "#2 String"]


def _file_rows(path, n):
    """The first ``n`` data rows of a TSV as dicts, parsed here with the csv module on its own."""
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f, delimiter="\t", quotechar='"')
        return [row for _, row in zip(range(n), reader)]


def test_mrpc_test_split_is_read_by_its_header_with_labels_and_sentences_of_the_file():
    path = real_data("glue", "MRPC", "test.tsv")
    with open(path, encoding="utf-8") as f:
        assert f.readline().rstrip("\n").split("\t") == ["index", "label", "sentence1", "sentence2"]
    rows = _file_rows(path, 3)
    examples = read_examples("mrpc", "test", limit=3)
    assert [(e.label, e.text_a, e.text_b) for e in examples] == [
        (int(r["label"]), r["sentence1"], r["sentence2"]) for r in rows]
    assert examples[0].text_a.startswith("PCCW 's chief operating officer") and examples[0].label == 1


def test_mrpc_test_file_in_another_column_order_reads_the_same_examples(tmp_path):
    """By column name, not position: the same real rows with the columns shuffled read the same."""
    rows = _file_rows(real_data("glue", "MRPC", "test.tsv"), 20)
    order = ["sentence2", "label", "index", "sentence1"]
    shuffled = tmp_path / "test.tsv"
    with open(shuffled, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", quotechar='"', lineterminator="\n")
        writer.writerow(order)
        writer.writerows([[r[c] for c in order] for r in rows])
    got = [(e.label, e.text_a, e.text_b) for e in read_examples("mrpc", "test", path=shuffled)]
    assert got == [(e.label, e.text_a, e.text_b) for e in read_examples("mrpc", "test", limit=20)]


def test_mrpc_in_the_glue_downloads_own_layout_reads_the_same_examples_and_its_test_has_no_labels(tmp_path):
    """GLUE's download writes MRPC as `Quality  #1 ID  #2 ID  #1 String  #2 String`, texts unquoted (a text may
    start with a lone `"`: the second dev row does); its test.tsv has `index` where `Quality` was."""
    from ember.tasks.readers.glue import read_tsv_examples

    rows = _file_rows(real_data("glue", "MRPC", "dev.tsv"), 30)
    assert rows[0]["sentence2"].startswith('" The foodservice')  # unquoted in GLUE's layout below
    for name, first, label in (("dev.tsv", "Quality", "label"), ("test.tsv", "index", None)):
        (tmp_path / name).write_text("\n".join(
            [f"{first}\t#1 ID\t#2 ID\t#1 String\t#2 String"]
            + [f"{r[label] if label else i}\t{2 * i}\t{2 * i + 1}\t{r['sentence1']}\t{r['sentence2']}"
               for i, r in enumerate(rows)]) + "\n", encoding="utf-8")
    expect = [(e.text_a, e.text_b) for e in read_examples("mrpc", "dev", limit=30)]
    dev = read_examples("mrpc", "dev", path=tmp_path / "dev.tsv")
    assert [(e.text_a, e.text_b) for e in dev] == expect
    assert [e.label for e in dev] == [int(r["label"]) for r in rows]
    unlabelled = read_tsv_examples(tmp_path / "test.tsv", "mrpc")  # `ember predict` reads it, labels None
    assert [(e.text_a, e.text_b) for e in unlabelled] == expect and {e.label for e in unlabelled} == {None}


def test_glue_test_split_is_reported_only_where_its_file_is_here_with_labels(tmp_path, monkeypatch):
    real_data("glue", "MRPC", "test.tsv")
    real_data("glue", "RTE", "dev.tsv")
    # The shared data: MRPC's test has labels, RTE has no test file, SST-2's spec has no test split.
    assert get_adapter("mrpc").report_splits == ("test",) and has_labels("mrpc", "test")
    assert get_adapter("rte").report_splits == () and not has_labels("rte", "test")
    assert get_adapter("sst2").report_splits == ()
    # A data root holding GLUE's own MRPC test.tsv (no label column, real sentences): not a labelled split.
    rows = _file_rows(real_data("glue", "MRPC", "test.tsv"), 5)
    (tmp_path / "glue" / "MRPC").mkdir(parents=True)
    (tmp_path / "glue" / "MRPC" / "test.tsv").write_text("\n".join(
        ["\t".join(GLUE_MRPC_TEST_HEADER)]
        + [f"{r['index']}\t{i}\t{i + 1}\t{r['sentence1']}\t{r['sentence2']}" for i, r in enumerate(rows)]) + "\n")
    monkeypatch.setenv("EMBER_DATA", str(tmp_path))
    assert not has_labels("mrpc", "test") and get_adapter("mrpc").report_splits == ()
    # CoLA's files have no header: a labelled file has all four columns, an unlabelled one three.
    spec = get_task("cola")
    assert not has_labels(spec, "test")  # CoLA's spec names no test file
    (tmp_path / "glue" / "CoLA").mkdir(parents=True)
    (tmp_path / "glue" / "CoLA" / "train.tsv").write_text("gj04\t1\t\tThe sailors rode the breeze clear.\n")
    assert has_labels(spec, "train")
    (tmp_path / "glue" / "CoLA" / "train.tsv").write_text("gj04\t\tThe sailors rode the breeze clear.\n")
    assert not has_labels(spec, "train")


def test_mrpc_finetune_scores_test_with_the_best_on_dev_weights_as_ember_evaluate_does(tmp_path, capsys):
    """A tiny random BERT on 32 real MRPC pairs: dev picks the weights, test (1,725 pairs) is scored once
    with them, with MRPC's official F1 and accuracy; `ember evaluate --split test` gives the same."""
    from ember.cli import main

    real_data("glue", "MRPC", "test.tsv")
    tok = tmp_path / "tokenizer.json"
    make_wordpiece(["the", "a", "said", "of", "to", "in", "and", "is", "was", "for", "."]).save(str(tok))
    run = tmp_path / "run"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["finetune", "--task", "mrpc", "--model", "bert-tiny", "--tokenizer", str(tok), "--out", str(run),
                     "--train-limit", "32", "--epochs", "1", "--max-length", "32", "--no-progress",
                     "--set", "train.num_threads=1"]) == 0
        capsys.readouterr()
        result = json.loads((run / "results.json").read_text())
        assert result["split"] == "dev" and result["main_metric"] == "f1"
        test = result["other_splits"]["test"]  # the metrics dev has: MRPC's F1 and accuracy (and their mean)
        assert set(result["other_splits"]) == {"test"} and set(test) == set(result["metrics"]) >= {"f1", "accuracy"}
        assert main(["evaluate", str(run), "--split", "test", "--no-progress"]) == 0
    finally:
        torch.set_num_threads(threads)
    evaluated = json.loads(capsys.readouterr().out)
    # the same weights, examples and batches in fp32 eval mode: the same computation, so equal numbers
    assert evaluated["metrics"] == result["other_splits"]["test"]
