"""`ember glue`: a tiny pre-trained model on real SST-2 / MRPC / RTE, the paper-style table,
its agreement with the per-run results.json files, and resuming (finished runs are skipped)."""

from __future__ import annotations

import json
import re
import shutil
import statistics

import pytest
import torch

from conftest import TINY_MODEL, real_data
from ember.cli import main
from ember.errors import EmberError

TASKS = "sst2,mrpc,rte,qnli"  # SNLI is left out: scoring its 9.8k test pairs twice costs ~20 s


@pytest.fixture(scope="module")
def tiny_run(wiki_prepared, tmp_path_factory):
    """A 2-layer, 32-wide BERT pre-trained for 2 steps on real Wikipedia (weights ~random)."""
    from ember.recipes import recipe_path
    from ember.config import apply_overrides, load_yaml, run_config_from_dict
    from ember.train.pretrain import run_pretraining

    cfg = run_config_from_dict(apply_overrides(load_yaml(recipe_path("bert-mini")), TINY_MODEL + [
        f"data.prepared={wiki_prepared}", "train.max_steps=2", "train.eval_every=0", "train.save_every=0",
        "train.num_threads=1"]))
    run_dir = tmp_path_factory.mktemp("glue") / "tiny-bert"
    threads = torch.get_num_threads()
    try:
        run_pretraining(cfg, run_dir, progress=False)
    finally:
        torch.set_num_threads(threads)
    return run_dir


@pytest.fixture(scope="module")
def glue_out(tiny_run):
    for folder in ("SST-2", "MRPC", "RTE", "QNLI"):
        real_data("glue", folder)
    out = tiny_run.parent / "out"
    argv = ["glue", str(tiny_run), "--out", str(out), "--tasks", TASKS, "--seeds", "1,2",
            "--train-limit", "64", "--epochs", "2", "--max-length", "32", "--lr", "5e-4", "--no-progress"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(argv) == 0
        yield out, argv
    finally:
        torch.set_num_threads(threads)


def _row(table: str, name: str) -> list[str]:
    line = next(ln for ln in table.splitlines() if ln.startswith(f"| {name}"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_glue_table_has_the_papers_columns_and_marks_missing_tasks(glue_out):
    out, _ = glue_out
    table = (out / "glue.md").read_text()
    header = _row(table, "System")
    assert header == ["System", "MNLI-m (SNLI)", "QQP", "QNLI", "SST-2", "CoLA", "STS-B", "MRPC", "RTE", "Average"]
    lines = table.splitlines()
    metrics = lines[lines.index("| " + " | ".join(header) + " |") + 2]  # the row under the separator
    assert metrics == "|  | acc | F1/acc | acc | acc | MCC | Pearson/Spearman | F1/acc | acc |  |"
    mean_row = _row(table, "tiny-bert (mean ± std)")
    cells = dict(zip(header, mean_row))
    for absent in ("MNLI-m (SNLI)", "QQP", "QNLI", "CoLA", "STS-B"):
        assert cells[absent] == "–"
    assert re.fullmatch(r"\d+\.\d ± \d+\.\d", cells["SST-2"])
    assert re.fullmatch(r"\d+\.\d ± \d+\.\d / \d+\.\d ± \d+\.\d", cells["MRPC"])
    # Reasons for every dash, and SNLI's role and splits.
    assert "QQP: –, not in the data folder" in table
    assert "QNLI: –, no training split here" in table and "--train-file qnli=PATH" in table
    assert "CoLA: –, not requested (--tasks)" in table
    png = (out / "glue.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_glue_table_numbers_equal_the_per_run_results(glue_out):
    """Recompute every cell from the runs' results.json with the statistics module."""
    out, _ = glue_out
    table = (out / "glue.md").read_text()
    header = _row(table, "System")
    mean_cells = dict(zip(header, _row(table, "tiny-bert (mean ± std)")))
    median_cells = dict(zip(header, _row(table, "tiny-bert (median)")))
    shown = {"SST-2": ("sst2", ["accuracy"]), "MRPC": ("mrpc", ["f1", "accuracy"]), "RTE": ("rte", ["accuracy"])}
    main_values = {}
    for column, (task, metrics) in shown.items():
        runs = [json.loads((out / "runs" / f"{task}-seed{s}" / "results.json").read_text()) for s in (1, 2)]
        assert [r["seed"] for r in runs] == [1, 2] and all(r["train_examples"] == 64 for r in runs)
        expect_mean, expect_median = [], []
        for m in metrics:
            values = [r["metrics"][m] for r in runs]
            expect_mean.append(f"{100 * statistics.mean(values):.1f} ± {100 * statistics.stdev(values):.1f}")
            expect_median.append(f"{100 * statistics.median(values):.1f}")
        assert mean_cells[column] == " / ".join(expect_mean)
        assert median_cells[column] == " / ".join(expect_median)
        main_values[task] = [r["metrics"][metrics[0]] for r in runs]
    per_seed = [statistics.mean(v[i] for v in main_values.values()) for i in range(2)]
    assert mean_cells["Average"] == f"{100 * statistics.mean(per_seed):.1f} ± {100 * statistics.stdev(per_seed):.1f}"
    data = json.loads((out / "glue.json").read_text())
    rte = next(c for c in data["columns"] if c["column"] == "RTE")
    assert (rte["train_split"], rte["eval_split"], rte["status"]) == ("train", "dev", "done")
    assert data["average"]["mean"] == pytest.approx(statistics.mean(per_seed))
    assert rte["runs"]["1"]["metrics"] == json.loads((out / "runs" / "rte-seed1" / "results.json").read_text())["metrics"]


def test_glue_table_shows_mrpc_test_beside_dev_and_no_test_for_rte(glue_out):
    """MRPC's labelled test split, scored by each run with its best-on-dev weights, gets its own row;
    RTE (no test file here) and SST-2 (GLUE's test has no labels) show a dash and score nothing."""
    out, _ = glue_out
    table = (out / "glue.md").read_text()
    header = _row(table, "System")
    test_cells = dict(zip(header, _row(table, "tiny-bert, test (mean ± std)")))
    runs = [json.loads((out / "runs" / f"mrpc-seed{s}" / "results.json").read_text()) for s in (1, 2)]
    expect = [f"{100 * statistics.mean(v):.1f} ± {100 * statistics.stdev(v):.1f}"
              for v in ([r["other_splits"]["test"][m] for r in runs] for m in ("f1", "accuracy"))]
    assert test_cells["MRPC"] == " / ".join(expect)
    assert all(test_cells[c] == "–" for c in header[1:] if c != "MRPC")
    assert "MRPC: its test split has labels here" in table and "never used to choose" in table
    for task in ("rte", "sst2"):
        assert "other_splits" not in json.loads((out / "runs" / f"{task}-seed1" / "results.json").read_text())
    columns = {c["column"]: c for c in json.loads((out / "glue.json").read_text())["columns"]}
    assert columns["MRPC"]["runs"]["1"]["test"] == runs[0]["other_splits"]["test"]
    assert "test_summary" not in columns["RTE"] and "test" not in columns["RTE"]["runs"]["1"]
    mrpc_run = next(ln for ln in table.splitlines() if ln.startswith("| MRPC | 1 |"))
    assert f"; test F1 {100 * runs[0]['other_splits']['test']['f1']:.1f}" in mrpc_run


def test_glue_rerun_skips_finished_runs_and_redoes_a_missing_one(glue_out, capsys):
    out, argv = glue_out
    results = sorted((out / "runs").glob("*/results.json"))
    assert len(results) == 6
    stamps = {p: p.stat().st_mtime_ns for p in results}
    before = json.loads((out / "glue.json").read_text())
    capsys.readouterr()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(argv) == 0
        assert "ran 0 fine-tuning runs" in capsys.readouterr().out
        assert {p: p.stat().st_mtime_ns for p in results} == stamps
        assert json.loads((out / "glue.json").read_text()) == before
        # A run lost (e.g. killed before its first checkpoint): only that one runs again, and
        # with the same seed it reproduces the same numbers.
        shutil.rmtree(out / "runs" / "mrpc-seed2")
        assert main(argv) == 0
        printed = capsys.readouterr().out
        assert "ran 1 fine-tuning runs" in printed
        test_f1 = json.loads((out / "runs" / "mrpc-seed2" / "results.json").read_text())["other_splits"]["test"]["f1"]
        assert re.search(rf"MRPC dev seed 2: f1=\S+ .*; test f1={test_f1:.4f}", printed)  # test printed beside dev
    finally:
        torch.set_num_threads(threads)
    after = json.loads((out / "glue.json").read_text())
    assert after["columns"] == before["columns"]
    # Other settings in the same folder are refused rather than mixed into one table.
    changed = list(argv)
    changed[changed.index("--lr") + 1] = "5e-5"
    assert main(changed) == 1
    assert "other settings" in capsys.readouterr().err


def test_glue_train_file_option_is_checked(tmp_path):
    from ember.experiments.glue import parse_train_files

    with pytest.raises(EmberError, match="TASK=PATH"):
        parse_train_files(["qnli"])
    with pytest.raises(EmberError, match="file not found"):
        parse_train_files([f"qnli={tmp_path / 'nope.tsv'}"])
    (tmp_path / "t.tsv").write_text("x")
    with pytest.raises(EmberError, match="unknown task .conll2003."):
        parse_train_files([f"conll2003={tmp_path / 't.tsv'}"])


def test_glue_qnli_runs_from_a_given_train_file(tmp_path):
    """QNLI has only dev here; a train file in its layout makes it a planned task."""
    from ember.experiments.glue import plan_tasks

    dev = real_data("glue", "QNLI", "dev.tsv")
    rows = dev.read_text().splitlines()
    train = tmp_path / "train.tsv"
    train.write_text("\n".join(rows[:31]) + "\n")
    plans = plan_tasks(["qnli"], {"qnli": str(train)}, train_limit=None)
    assert plans[0].missing == "" and plans[0].n_train == 30 and plans[0].eval_split == "dev"
    assert plan_tasks(["qnli"], {}, None)[0].missing.startswith("no training split here")


def test_glue_snli_stands_in_for_mnli_training_on_dev_and_scored_on_test():
    from ember.experiments.glue_report import collect_results, render_markdown
    from ember.experiments.glue import plan_tasks

    real_data("snli")
    plan = plan_tasks(["snli"], {}, train_limit=500)[0]
    assert (plan.train_split, plan.eval_split, plan.n_train, plan.n_eval) == ("dev", "test", 500, 9_824)
    meta = {"model": "m", "seeds": [1], "tasks": ["snli"], "settings": {
        "init": "m", "model": "", "lr": None, "epochs": None, "max_length": None, "train_limit": 500}}
    text = render_markdown(collect_results(real_data("snli").parent / "no-runs-here", [plan], meta))
    assert "SNLI stands in for MNLI" in text and "trains on dev (500 pairs used)" in text
    assert "scored on test (9,824 pairs)" in text and "MNLI-m (SNLI): 0 of 1 seeds finished" in text


def test_glue_cell_shows_no_spread_for_a_single_seed():
    """One seed has no standard deviation: the cell (and the compare table, which shares
    summarize_seeds) must not claim "± 0.0"."""
    from ember.experiments.glue_report import _cell

    from ember.tasks.metrics.classification import summarize_seeds

    one = summarize_seeds([{"metrics": {"accuracy": 0.636}}])
    two = summarize_seeds([{"metrics": {"accuracy": 0.586}}, {"metrics": {"accuracy": 0.614}}])
    assert _cell({"summary": one, "metrics_shown": ["accuracy"]}, "mean") == "63.6"
    assert _cell({"summary": two, "metrics_shown": ["accuracy"]}, "mean") == "60.0 ± 2.0"


def test_glue_report_names_the_families_settings_and_why_an_average_is_undefined(tmp_path):
    """A T5 run's table said it was fine-tuned "with BERT's settings" (it ran Adafactor at a constant
    1e-3); an STS-B whose outputs were all invalid (Pearson undefined) read "Average: - until every
    task shown has a finished run" although every run had finished."""
    import json

    from ember.config import model_preset
    from ember.experiments.glue import fine_tuning_recipe, plan_tasks
    from ember.experiments.glue_report import collect_results, render_markdown
    from ember.experiments.report_common import clean

    assert "Adafactor at a constant lr 0.001" in fine_tuning_recipe(model_preset("t5-tiny"), "stsb")
    assert fine_tuning_recipe(model_preset("bert-tiny"), "stsb").startswith("BERT's settings")
    assert fine_tuning_recipe(model_preset("lstm-mini"), "stsb").startswith("an LSTM's settings (lr 0.001,")
    real_data("glue", "STS-B")
    plan = plan_tasks(["stsb"], {}, train_limit=64)[0]
    run = tmp_path / "runs" / "stsb-seed1"
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({"metrics": {"pearson": float("nan"), "spearman": float("nan")},
                                                  "best_step": 2, "steps": 2}))
    meta = {"model": "t5", "seeds": [1], "tasks": ["stsb"], "recipe": fine_tuning_recipe(model_preset("t5-tiny"), "stsb"),
            "settings": {"init": "t5", "model": "", "lr": None, "epochs": None, "max_length": None, "train_limit": 64}}
    text = render_markdown(clean(collect_results(tmp_path, [plan], meta)))
    assert "fine-tuned on each task with T5's settings" in text and "BERT's settings" not in text
    assert "Average: –: STS-B Spearman is undefined" in text
