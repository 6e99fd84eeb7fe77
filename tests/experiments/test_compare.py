"""`ember compare`: budget parsing, equal-compute pre-training of two recipes on real Wikipedia,
fine-tuning on real SST-2, the report files, and resuming a comparison from its folder."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from conftest import TINY_MODEL, real_data
from ember.cli import main
from ember.experiments.compare import assign_labels, parse_budget
from ember.experiments.compare_report import glue_average, render_markdown
from ember.errors import EmberError

BUDGET = 4.0  # seconds of pre-training per recipe
PROBE_STEPS = 5


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("20m", 1200), ("1.5h", 5400), ("45", 45),
                                           (" 2m ", 120), ("0.5", 0.5)])
def test_compare_budget_parsing_reads_durations(text, seconds):
    assert parse_budget(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "20 minutes", "-5m", "0", "0s", "5d", "1h30m"])
def test_compare_budget_parsing_rejects_bad_strings_clearly(text):
    with pytest.raises(EmberError, match=r"--budget .*(write a duration|more than zero)"):
        parse_budget(text)


def test_compare_cli_bad_budget_is_one_line_error(tmp_path, capsys):
    code = main(["compare", "bert-mini", "--data", str(tmp_path), "--budget", "soon", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 1 and "ember compare: error: --budget 'soon'" in err and "Traceback" not in err


def test_compare_labels_default_to_recipe_names_and_must_be_distinct():
    assert assign_labels(["bert-mini", "x/mlm-variant.yaml"], []) == [
        ("bert-mini", "bert-mini"), ("mlm-variant", "x/mlm-variant.yaml")]
    assert assign_labels(["bert-mini"], ["BERT=bert-mini"]) == [("BERT", "bert-mini")]
    with pytest.raises(EmberError, match="--label NAME=RECIPE"):
        assign_labels(["a/bert-mini.yaml", "bert-mini"], [])
    with pytest.raises(EmberError, match="one of bert-mini"):
        assign_labels(["bert-mini"], ["BERT=electra-mini"])
    with pytest.raises(EmberError, match="listed twice"):
        assign_labels(["bert-mini", "bert-mini"], [])


def test_compare_average_and_its_seed_spread_by_hand():
    # Two tasks x seeds 1, 2: per-seed averages (0.8+0.2)/2 = 0.5 and (0.6+0.4)/2 = 0.5 -> std 0;
    # task means 0.7 and 0.3 -> average 0.5.
    tasks = {"sst2": {"mean": 0.7, "main_metric": "accuracy", "seeds": {"1": {"accuracy": 0.8}, "2": {"accuracy": 0.6}}},
             "cola": {"mean": 0.3, "main_metric": "mcc", "seeds": {"1": {"mcc": 0.2}, "2": {"mcc": 0.4}}}}
    meta = {"tasks": ["sst2", "cola"], "seeds": [1, 2]}
    assert glue_average(tasks, meta) == {"glue_average": pytest.approx(0.5), "glue_average_std": pytest.approx(0.0)}
    # Per-seed averages 0.6 and 0.4 -> sample std sqrt(2 * 0.1^2 / 1) = 0.1414.
    tasks["cola"]["seeds"] = {"1": {"mcc": 0.4}, "2": {"mcc": 0.2}}
    assert glue_average(tasks, meta)["glue_average_std"] == pytest.approx(math.sqrt(0.02))
    # A task without results yet: no average (a partial one would flatter the unfinished model).
    assert glue_average({"sst2": tasks["sst2"]}, meta) == {"glue_average": None, "glue_average_std": None}


def test_compare_durations_read_naturally():
    from ember.durations import format_duration

    assert [format_duration(s) for s in (4, 90, 1200, 3725)] == ["4s", "1m30s", "20m", "1h02m"]


def test_compare_markdown_shows_mean_and_std_per_task():
    results = {
        "settings": {"budget_seconds": 1200.0, "data": "/d", "pretrain_seed": 0,
                     "finetune": {"lr": 1e-4, "epochs": None, "max_length": None, "train_limit": None}},
        "tasks": ["cola"], "seeds": [1, 2],
        "models": [{"label": "bert-mini", "recipe": "bert-mini", "pretrain": None,
                    "tasks": {"cola": {"mean": 0.1234, "std": 0.0150}}, "glue_average": 0.1234,
                    "glue_average_std": 0.0150}],
    }
    text = render_markdown(results)
    assert "| model | CoLA (mcc) | average | pre-train steps | tokens |" in text
    assert "| bert-mini | 12.3 ± 1.5 | 12.3 ± 1.5 | — | — |" in text
    assert "20m of training steps" in text


def _variant_recipe(path):
    """A second recipe that exists today: bert-mini trained with MLM alone (RoBERTa-style, no NSP)."""
    path.write_text(yaml.safe_dump({"kind": "pretrain", "objective": "mlm", "model": {"preset": "bert-mini"},
                                    "data": {"nsp": False}, "train": {"lr": 5e-4, "batch_size": 32}}))
    return path


@pytest.fixture(scope="module")
def compared(wiki_prepared, tmp_path_factory):
    real_data("glue", "SST-2")
    root = tmp_path_factory.mktemp("compare")
    argv = ["compare", "bert-mini", str(_variant_recipe(root / "bert-mini-mlm.yaml")), "--data", str(wiki_prepared),
            "--budget", f"{BUDGET}s", "--tasks", "sst2", "--seeds", "1", "--train-limit", "200",
            "--finetune-epochs", "2", "--max-length", "64", "--baseline", "random", "--probe-steps",
            str(PROBE_STEPS), "--out", str(root / "out"), "--no-progress"]
    # One thread: on 2 shared cores a second OpenMP thread waits on busy neighbours and tiny
    # steps got 20x slower (measured); run_pretraining sets it process-wide, so restore it.
    for item in TINY_MODEL + ["train.num_threads=1"]:
        argv += ["--set", item]
    threads = torch.get_num_threads()
    try:
        assert main(argv) == 0
        yield root / "out", argv
    finally:
        torch.set_num_threads(threads)


def test_compare_report_has_both_recipes_and_the_random_baseline(compared):
    out, _ = compared
    results = json.loads((out / "results.json").read_text())
    assert [m["label"] for m in results["models"]] == ["bert-mini", "bert-mini-mlm", "random"]
    for model in results["models"]:
        sst2 = model["tasks"]["sst2"]
        assert sst2["main_metric"] == "accuracy" and 0.3 <= sst2["mean"] <= 1.0 and sst2["std"] is None  # one seed: no spread
        assert model["glue_average"] == pytest.approx(sst2["mean"])
        assert (out / "runs" / model["label"] / "sst2-seed1" / "results.json").is_file()
    objectives = {m["label"]: m["pretrain"]["objective"] for m in results["models"][:2]}
    assert objectives == {"bert-mini": "bert", "bert-mini-mlm": "mlm"}
    for model in results["models"][:2]:
        pre = model["pretrain"]
        held = pre["held_out"]
        # Held-out MLM loss of a barely trained model: near ln(2000) = 7.6, certainly finite.
        assert 0 < held["mlm_loss"] < 10 and 0 <= held["mlm_acc"] <= 1
        assert ("nsp_acc" in held) == (pre["objective"] == "bert")
        # 32 sequences of at most 64 tokens per step; padding is not counted.
        assert 0 < pre["tokens"] <= pre["steps"] * 32 * 64
        assert pre["parameters"] > 0
    assert results["models"][2]["pretrain"] is None
    table = (out / "results.md").read_text()
    for label in ("bert-mini", "bert-mini-mlm"):  # linked to their section of report.html
        assert f"| [{label}](report.html#run-{label}-pretrain) | " in table
    assert "| random | " in table
    report = (out / "report.html").read_text()
    for run in ("bert-mini/pretrain", "bert-mini-mlm/pretrain", "random/sst2-seed1"):
        assert f'id="run-{run.replace("/", "-")}"' in report
    png = (out / "comparison.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_compare_max_steps_follow_the_measured_speed(compared):
    out, _ = compared
    from ember.runs.folder import load_run_config

    results = json.loads((out / "results.json").read_text())
    for model in results["models"][:2]:
        pre = model["pretrain"]
        probe = pre["probe"]
        assert probe["timed_steps"] == PROBE_STEPS and probe["timed_seconds"] > 0
        assert probe["steps_per_s"] == pytest.approx(PROBE_STEPS / probe["timed_seconds"])
        assert pre["max_steps"] == max(1, int(BUDGET * probe["steps_per_s"]))
        cfg = load_run_config(out / "runs" / model["label"] / "pretrain")
        assert (cfg.train.max_steps, cfg.train.max_time) == (pre["max_steps"], BUDGET)
        # Stopped by whichever came first: the planned steps, or the budget as the hard cap
        # (the last step may end past it, as max_time is checked before each step).
        assert 1 <= pre["steps"] <= pre["max_steps"]
        if pre["steps"] < pre["max_steps"]:
            assert pre["stopped_by"] == "max_time" and pre["train_seconds"] >= BUDGET
        else:
            assert pre["stopped_by"] == "max_steps"
        assert not (out / "runs" / model["label"] / "probe").exists()  # the probe run is discarded


def test_compare_rerun_reuses_finished_runs_and_resumes_unfinished(compared, capsys):
    out, argv = compared
    runs = out / "runs"
    before = json.loads((out / "results.json").read_text())
    watched = [runs / "bert-mini" / "pretrain" / "model.safetensors", runs / "bert-mini-mlm" / "probe.json",
               *runs.glob("*/sst2-seed1/results.json")]
    stamps = {p: p.stat().st_mtime_ns for p in watched}
    capsys.readouterr()
    assert main(argv) == 0
    assert "ran 0 pre-training and 0 fine-tuning runs" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in watched} == stamps
    assert json.loads((out / "results.json").read_text()) == before

    # A comparison killed during the mlm pre-training's last moments and the random baseline's
    # fine-tuning: the pre-training resumes from its checkpoint (no step is redone), the baseline
    # starts again, and nothing else runs.
    (runs / "bert-mini-mlm" / "pretrain.json").unlink()
    shutil.rmtree(runs / "random" / "sst2-seed1")
    assert main(argv) == 0
    assert "ran 1 pre-training and 1 fine-tuning runs" in capsys.readouterr().out
    after = json.loads((out / "results.json").read_text())
    old, new = before["models"][1]["pretrain"], after["models"][1]["pretrain"]
    assert new["resumed"] and (new["steps"], new["tokens"], new["max_steps"]) == (
        old["steps"], old["tokens"], old["max_steps"])
    assert after["models"][2]["tasks"]["sst2"]["mean"] == before["models"][2]["tasks"]["sst2"]["mean"]
    assert {p: p.stat().st_mtime_ns for p in watched if "random" not in str(p)} == {
        p: s for p, s in stamps.items() if "random" not in str(p)}


def test_compare_rerun_with_another_budget_is_refused(compared, capsys):
    out, argv = compared
    changed = list(argv)
    changed[changed.index("--budget") + 1] = "9s"
    assert main(changed) == 1
    err = capsys.readouterr().err
    assert "other settings" in err and "budget_seconds: 4.0 then, 9.0 now" in err


def test_compare_gives_a_recipe_its_own_corpus_and_vocabulary(wiki_prepared, wiki_t5_prepared, tmp_path):
    """T5's objectives need sentinels in the vocabulary: ``--data t5-tiny=PATH`` gives it the same
    text prepared with its own tokenizer; every other recipe keeps the shared corpus."""
    from ember.data.shards import TokenCorpus
    from ember.experiments.compare import build_entries, parse_data

    shared, own = parse_data([str(wiki_prepared), f"t5-tiny={wiki_t5_prepared}"])
    assert shared == wiki_prepared.resolve() and own == {"t5-tiny": wiki_t5_prepared.resolve()}
    bert, t5 = build_entries(["bert-mini", "t5-tiny"], [], shared, [], 0, own)
    assert Path(bert.cfg.data.prepared) == wiki_prepared.resolve()
    assert Path(t5.cfg.data.prepared) == wiki_t5_prepared.resolve()
    assert t5.cfg.model.vocab_size == TokenCorpus(wiki_t5_prepared, "train").vocab_size and t5.cfg.model.family == "t5"
    with pytest.raises(EmberError, match="no recipe or label of that name"):
        build_entries(["bert-mini"], [], shared, [], 0, {"t5-tiny": wiki_t5_prepared})
    with pytest.raises(EmberError, match="one shared corpus is given already"):
        parse_data([str(wiki_prepared), str(wiki_t5_prepared)])


def test_compare_finetune_rates_per_recipe_and_their_record():
    """T5 fine-tunes with Adafactor at 1e-3 beside encoders at 1e-4: --finetune-lr t5-mini=1e-3; a
    comparison without per-model rates records exactly the settings it recorded before they existed."""
    from ember.commands.compare import parse_rates
    from ember.experiments.compare import FinetuneSettings

    default, own = parse_rates(["2e-4", "t5-mini=1e-3"])
    settings = FinetuneSettings(default, epochs=2.0, lr_for=own)
    assert settings.lr_of("t5-mini") == 1e-3 and settings.lr_of("bert-mini") == 2e-4
    assert settings.lr_of("t5", recipe="t5-mini") == 1e-3  # a label naming the recipe
    assert settings.record()["lr_for"] == {"t5-mini": 1e-3}
    assert FinetuneSettings().record() == {"lr": 1e-4, "epochs": None, "max_length": None, "train_limit": None}
    with pytest.raises(EmberError, match="RECIPE=NUMBER"):
        parse_rates(["t5-mini=fast"])
