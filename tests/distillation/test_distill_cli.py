"""`ember distill` end to end on real data: SST-2 teacher -> KD / PKD / TinyBERT students (with
Wikipedia sentences as unlabeled text), DistilBERT and TinyBERT general distillation on
prepared Wikipedia shards, and exact resume after a kill."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import TINY_MODEL, real_data
from ember.cli import main
from ember.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from ember.errors import EmberError
from ember.runs.checkpoint import load_weights
from ember.tasks.task_model import evaluate_run
from ember.train.finetune import run_finetuning

TEACHER = ModelConfig(vocab_size=2000, hidden_size=32, num_layers=4, num_heads=2, intermediate_size=64,
                      max_position=64)


@pytest.fixture(scope="module")
def sst2_teacher(wiki_prepared, tmp_path_factory):
    real_data("glue", "SST-2")
    run = tmp_path_factory.mktemp("teacher") / "run"
    cfg = RunConfig(kind="finetune", model=TEACHER, task=TaskConfig(name="sst2", max_length=48, epochs=1, init="random"),
                    train=TrainConfig(lr=1e-3, batch_size=32, warmup_ratio=0.1, eval_every=0, save_every=0))
    run_finetuning(cfg, run, None, wiki_prepared / "tokenizer.json", train_limit=256, progress=False)
    return run


def distill(*args: str) -> None:
    assert main(["distill", "--no-progress", "--batch-size", "16", "--lr", "1e-3", *args]) == 0


def test_kd_cli_on_sst2_and_wikipedia_writes_a_run_that_evaluate_reads(sst2_teacher, tmp_path):
    wiki = str(real_data("wiki-en", "AA", "wiki_00.gz"))
    out = tmp_path / "kd"
    distill("--method", "kd", "--teacher", str(sst2_teacher), "--student", "teacher", "--student-layers", "1",
            "--unlabeled", wiki, "task", "--max-unlabeled", "64", "--train-limit", "64", "--epochs", "1",
            "--out", str(out))
    results = json.loads((out / "results.json").read_text())
    record = json.loads((out / "distill.json").read_text())
    assert record["transfer_set"] == {"task_train": 64, "task_train_labelled": 0, "unlabeled_sentences": 64}
    assert results["parameters"]["student"] < results["parameters"]["teacher"]
    assert 0.0 <= results["dev_agreement"] <= 1.0 and results["retained"] > 0
    # An ordinary fine-tuned run folder: `ember evaluate` reloads the same student.
    again = evaluate_run(out)
    assert again["metrics"]["accuracy"] == pytest.approx(results["metrics"]["accuracy"])
    (tmp_path / "in.tsv").write_text("sentence\nan utterly charming film\na dull , lifeless mess\n")
    assert main(["predict", str(out), "--input", str(tmp_path / "in.tsv"), "--out", str(tmp_path / "p.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["prediction"] in ("negative", "positive") for r in rows)
    # --resume refuses a changed recipe before touching the run.
    with pytest.raises(EmberError, match=r"changes settings\.temperature; "):  # named to the leaf
        _raise_cli("--method", "kd", "--teacher", str(sst2_teacher), "--student", "teacher", "--student-layers", "1",
                   "--unlabeled", wiki, "task", "--max-unlabeled", "64", "--train-limit", "64", "--epochs", "1",
                   "--batch-size", "16", "--lr", "1e-3", "--temperature", "7", "--resume", "--out", str(out))
    assert json.loads((out / "distill.json").read_text())["settings"]["temperature"] == 2.0
    # --out naming the teacher (with --overwrite, which deleted it) and --resume into a run that
    # distillation did not write (which rewrote its config.yaml): refused, both left as they were
    teacher_files = sorted(p.name for p in sst2_teacher.iterdir())
    for where, extra, message in ((sst2_teacher, "--overwrite", "is where this command reads"),
                                  (sst2_teacher, "--resume", "holds a run that `ember distill` did not write")):
        with pytest.raises(EmberError, match=message):
            _raise_cli("--method", "kd", "--teacher", str(sst2_teacher), "--student", "teacher", "--student-layers",
                       "1", "--unlabeled", "task", "--train-limit", "64", "--epochs", "1", extra, "--out", str(where))
    assert sorted(p.name for p in sst2_teacher.iterdir()) == teacher_files
    # The soft targets are cached once and reused by a second student of the same transfer set.
    cache = out / "teacher-logits.npz"
    stamp = cache.stat().st_mtime_ns
    distill("--method", "kd", "--teacher", str(sst2_teacher), "--student", "teacher", "--student-layers", "1",
            "--unlabeled", wiki, "task", "--max-unlabeled", "64", "--train-limit", "64", "--epochs", "1",
            "--soft-loss", "mse", "--logits-cache", str(cache), "--out", str(tmp_path / "kd-mse"))
    assert cache.stat().st_mtime_ns == stamp
    assert not (tmp_path / "kd-mse" / "teacher-logits.npz").exists()
    with np.load(cache) as stored:
        assert stored["logits"].shape == (128, 2)
    # ... but never paired with another transfer set.
    with pytest.raises(EmberError, match="another teacher or transfer set"):
        _raise_cli("--method", "kd", "--teacher", str(sst2_teacher), "--student-layers", "1", "--unlabeled", "task",
                   "--train-limit", "32", "--logits-cache", str(cache), "--out", str(tmp_path / "kd-other"))


def test_transfer_set_keeps_gold_labels_only_within_the_train_limit(wiki_prepared):
    from ember.distillation.transfer_set import build_transfer_set
    from ember.tasks.base import get_adapter
    from ember.tokenizers import load_tokenizer

    real_data("glue", "SST-2")
    tok = load_tokenizer(wiki_prepared / "tokenizer.json")
    feats, counts = build_transfer_set(get_adapter("sst2"), tok, 48, ["task"], 0, train_limit=5, keep_labels=True,
                                       task_unlabeled=12)
    assert [f["label"] is not None for f in feats] == [True] * 5 + [False] * 7
    assert counts == {"task_train": 12, "task_train_labelled": 5, "unlabeled_sentences": 0}
    feats, _ = build_transfer_set(get_adapter("sst2"), tok, 48, ["task"], 0, train_limit=5, keep_labels=False)
    assert len(feats) == 5 and all(f["label"] is None for f in feats)
    with pytest.raises(EmberError, match="sentence pairs"):
        build_transfer_set(get_adapter("mrpc"), tok, 48, [str(real_data("wiki-en", "AA", "wiki_00.gz"))], 5,
                           train_limit=5, keep_labels=False)


def _raise_cli(*args: str) -> None:
    """Run the verb's function directly so its EmberError reaches the test."""
    from ember.cli import build_parser

    parsed = build_parser().parse_args(["distill", "--no-progress", *args])
    parsed.run(parsed)


def data_orders(run, pattern: str = "**/trainer_state.json") -> set[str]:
    """The batch orders a run's checkpoints recorded (ember.train.length_groups)."""
    states = [json.loads(p.read_text()) for p in run.glob(pattern)]
    assert states, f"no checkpoint in {run}"
    return {s["data_order"] for s in states}


@pytest.mark.slow
def test_pkd_and_tinybert_task_stage_cli_on_sst2(sst2_teacher, tmp_path):
    distill("--method", "pkd", "--pkd-strategy", "skip", "--teacher", str(sst2_teacher), "--student-init",
            "teacher", "--student-layers", "2", "--train-limit", "64", "--epochs", "1", "--out", str(tmp_path / "pkd"))
    results = json.loads((tmp_path / "pkd" / "results.json").read_text())
    assert results["method"] == "pkd" and "hard_loss" in (tmp_path / "pkd" / "metrics.jsonl").read_text()
    assert "pt_loss" in (tmp_path / "pkd" / "metrics.jsonl").read_text()
    assert data_orders(tmp_path / "pkd") == {"length-grouped-spread"}  # PKD compares each example's [CLS]
    out = tmp_path / "tiny"
    distill("--method", "tinybert", "--teacher", str(sst2_teacher), "--student", "bert-tiny", "--student-layers",
            "2", "--unlabeled", "task", "--train-limit", "64", "--epochs", "1", "--out", str(out))
    assert (out / "intermediate" / "student.safetensors").is_file()
    assert "attention_loss" in (out / "intermediate" / "metrics.jsonl").read_text()
    # TinyBERT's intermediate losses average over tokens, so that step keeps shuffled batches;
    # its prediction-layer step (logits only) groups them
    assert data_orders(out / "intermediate") == {"shuffled"}
    assert data_orders(out, "checkpoints/*/trainer_state.json") == {"length-grouped-spread"}
    assert json.loads((out / "results.json").read_text())["parameters"]["student"] > 0
    assert evaluate_run(out)["metrics"]["accuracy"] == pytest.approx(
        json.loads((out / "results.json").read_text())["metrics"]["accuracy"])


def test_distill_refuses_overrides_it_would_not_use(sst2_teacher, tmp_path, capsys):
    """--set data.eval_examples=8 or task.max_length=16 were dropped without a word (only train.* is read)."""
    for setting in ("data.eval_examples=8", "task.max_length=16"):
        assert main(["distill", "--method", "kd", "--teacher", str(sst2_teacher), "--out", str(tmp_path / "kd"),
                     "--set", setting]) == 1
        assert f"distillation takes train.* overrides only; {setting} would not be used" in capsys.readouterr().err
        assert not (tmp_path / "kd").exists()


@pytest.fixture(scope="module")
def wiki_teacher(wiki_prepared, tmp_path_factory):
    from ember.recipes import recipe_path
    from ember.config import apply_overrides, load_yaml, run_config_from_dict
    from ember.train.pretrain import run_pretraining

    run = tmp_path_factory.mktemp("mlm-teacher") / "run"
    cfg = run_config_from_dict(apply_overrides(load_yaml(recipe_path("bert-mini")), TINY_MODEL + [
        "model.num_layers=4", f"data.prepared={wiki_prepared}", "train.max_steps=3", "train.eval_every=0",
        "train.save_every=0"]))
    run_pretraining(cfg, run, progress=False)
    return run


def test_distilbert_cli_starts_from_every_other_teacher_layer_and_fill_mask_reads_it(
        wiki_prepared, wiki_teacher, tmp_path):
    out = tmp_path / "distil"
    # lr 0: one step that changes nothing, so the saved student is exactly its initialisation.
    distill("--method", "distilbert", "--teacher", str(wiki_teacher), "--data", str(wiki_prepared),
            "--max-steps", "1", "--lr", "0", "--out", str(out))
    teacher = load_weights(wiki_teacher / "model.safetensors")
    student = load_weights(out / "model.safetensors")
    assert sum(k.startswith("backbone.layers.") for k in student) * 2 == sum(
        k.startswith("backbone.layers.") for k in teacher)
    for name, value in student.items():
        source = name
        if name.startswith("backbone.layers."):
            i, rest = name[len("backbone.layers."):].split(".", 1)
            source = f"backbone.layers.{2 * int(i)}.{rest}"
        torch.testing.assert_close(value, teacher[source], rtol=0, atol=0)
    metrics = (out / "metrics.jsonl").read_text()
    assert "ce_loss" in metrics and "cos_loss" in metrics
    from ember.tasks.inference.fill_mask import FillMask

    assert len(FillMask(out)("the [MASK] of the city")[0]) == 5


def test_tinybert_general_stage_cli_trains_a_narrower_student_for_finetune_init(wiki_prepared, wiki_teacher, tmp_path):
    from ember.runs.init import load_init

    out = tmp_path / "general"
    distill("--method", "tinybert", "--stage", "general", "--teacher", str(wiki_teacher), "--data", str(wiki_prepared),
            "--student", "bert-tiny", "--student-layers", "2", "--max-steps", "3",
            "--out", str(out))
    cfg, state, _ = load_init(str(out))
    assert (cfg.num_layers, cfg.hidden_size) == (2, 128) and state
    assert "attention_loss" in (out / "metrics.jsonl").read_text()


@pytest.mark.slow
def test_tinybert_task_stage_starts_from_the_general_student(wiki_prepared, wiki_teacher, sst2_teacher, tmp_path):
    general = tmp_path / "general"
    distill("--method", "tinybert", "--stage", "general", "--teacher", str(wiki_teacher), "--data", str(wiki_prepared),
            "--student", "bert-tiny", "--student-layers", "2", "--max-steps", "2",
            "--out", str(general))
    task = tmp_path / "task"
    distill("--method", "tinybert", "--teacher", str(sst2_teacher), "--student-init", str(general), "--unlabeled",
            "task", "--train-limit", "32", "--epochs", "1", "--lr", "0", "--out", str(task))
    # lr 0 in both steps: the task student's encoder is exactly the general-stage student.
    start = load_weights(general / "model.safetensors")
    final = load_weights(task / "model.safetensors")
    for name, value in start.items():
        if not name.startswith("backbone.pooler."):
            torch.testing.assert_close(final[name], value, rtol=0, atol=0)


@pytest.mark.slow
def test_kd_resume_after_kill_reproduces_the_uninterrupted_run(sst2_teacher, tmp_path):
    from run_helpers import env, kill_after_checkpoint, train_losses

    def cmd(out):
        return [sys.executable, "-m", "ember", "distill", "--method", "kd", "--teacher", str(sst2_teacher),
                "--student-layers", "2", "--unlabeled", "task", "--train-limit", "96", "--epochs", "3",
                "--batch-size", "8", "--lr", "1e-3", "--set", "train.save_every=4", "--set", "train.log_every=1",
                "--no-progress", "--out", str(out)]

    subprocess.run(cmd(tmp_path / "full"), env=env(), check=True, capture_output=True)
    killed = tmp_path / "killed"
    kill_after_checkpoint(cmd(killed), killed, step=8)
    assert not (killed / "results.json").exists()
    subprocess.run(cmd(killed) + ["--resume"], env=env(), check=True, capture_output=True)
    full, resumed = train_losses(tmp_path / "full"), train_losses(killed)
    assert sorted(resumed) == sorted(full) == list(range(1, 37))
    for step in full:
        assert resumed[step] == pytest.approx(full[step], abs=1e-6), step
    a = json.loads((tmp_path / "full" / "results.json").read_text())
    b = json.loads((killed / "results.json").read_text())
    assert a["metrics"] == b["metrics"]
    # KD's loss is one term per example: its batches were length-grouped, and the checkpoints say so
    assert data_orders(killed) == {"length-grouped-spread"}
