"""Fine-tuning: GLUE classification and regression on real data, evaluate/predict, HF export."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import real_data
from ember.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from ember.errors import EmberError
from ember.tasks.task_model import evaluate_run
from ember.train.finetune import run_finetuning

TINY = ModelConfig(vocab_size=2000, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128,
                   max_position=128)


def finetune_cfg(task: str, epochs: float = 2.0, lr: float = 1e-3, **train) -> RunConfig:
    return RunConfig(kind="finetune", model=TINY,
                     task=TaskConfig(name=task, max_length=64, epochs=epochs, init="random"),
                     train=TrainConfig(lr=lr, batch_size=32, warmup_ratio=0.1, eval_every=0,
                                       save_every=0, log_every=10, **train))


@pytest.fixture(scope="module")
def sst2_run(wiki_prepared, tmp_path_factory):
    real_data("glue", "SST-2")
    run = tmp_path_factory.mktemp("sst2") / "run"
    result = run_finetuning(finetune_cfg("sst2"), run, None, wiki_prepared / "tokenizer.json",
                            train_limit=3000, progress=False)
    return run, result


def test_finetune_sst2_from_random_init_learns_on_real_data(sst2_run):
    run, result = sst2_run
    # 3,000 real training sentences, 2 epochs of a random 2-layer model: above the majority class
    # by more than 3 standard errors of an 872-sentence dev accuracy (random inits reach 57-67%
    # over seeds, with shuffled batches and with length-grouped ones alike)
    import csv

    with open(real_data("glue", "SST-2", "dev.tsv"), encoding="utf-8") as f:
        labels = [int(r[1]) for r in list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]]
    majority = max(np.mean(labels), 1 - np.mean(labels))
    assert result["metrics"]["accuracy"] > majority + 3 * np.sqrt(0.25 / len(labels))
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["split"] == "eval"]
    assert len(evals) == 2  # one dev evaluation per epoch
    assert result["best_step"] in [r["step"] for r in evals]
    assert result["metrics"]["accuracy"] == pytest.approx(max(r["accuracy"] for r in evals))
    assert (run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the loss and dev accuracy, plotted


def test_evaluate_reloads_best_checkpoint_with_same_metrics(sst2_run, tmp_path):
    run, result = sst2_run
    again = evaluate_run(run)
    assert again["metrics"] == pytest.approx(result["metrics"])
    header = tmp_path / "header.tsv"  # SST-2's header and no rows: one line, not metrics' ValueError
    header.write_text(real_data("glue", "SST-2", "dev.tsv").read_text().splitlines()[0] + "\n")
    with pytest.raises(EmberError, match="has no examples to score"):
        evaluate_run(run, path=str(header))


def test_finetune_scores_the_dev_set_once_when_its_last_evaluation_is_the_best(wiki_prepared, tmp_path,
                                                                             monkeypatch):
    """One epoch, one evaluation: the reported metrics are that evaluation's (the weights on disk),
    not a second pass over the dev set; the reloaded run scores the same."""
    from ember.tasks.glue_adapter import GlueAdapter

    real_data("glue", "SST-2")
    calls = []
    score = GlueAdapter.score

    def counted(self, *args, **kwargs):
        calls.append(1)
        return score(self, *args, **kwargs)

    monkeypatch.setattr(GlueAdapter, "score", counted)
    result = run_finetuning(finetune_cfg("sst2", epochs=1.0), tmp_path / "run", None,
                            wiki_prepared / "tokenizer.json", train_limit=200, progress=False)
    assert len(calls) == 1
    assert evaluate_run(tmp_path / "run")["metrics"] == pytest.approx(result["metrics"])


def test_predict_writes_one_prediction_per_row(sst2_run, tmp_path):
    run, _ = sst2_run
    source = tmp_path / "in.tsv"
    source.write_text("sentence\nan utterly charming film\na dull , lifeless mess\n")
    out = tmp_path / "pred.jsonl"
    done = subprocess.run([sys.executable, "-m", "ember", "predict", str(run), "--input", str(source),
                           "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and all(r["prediction"] in ("negative", "positive", "0", "1") for r in rows)
    assert all(abs(sum(r["probabilities"].values()) - 1) < 1e-4 for r in rows)


def test_finetune_stsb_regression_reports_pearson_and_spearman(wiki_prepared, tmp_path):
    real_data("glue", "STS-B")
    result = run_finetuning(finetune_cfg("stsb", epochs=1.0), tmp_path / "run", None,
                            wiki_prepared / "tokenizer.json", train_limit=600, progress=False)
    metrics = result["metrics"]
    assert {"pearson", "spearman"} <= set(metrics)
    assert all(np.isfinite(metrics[k]) for k in ("pearson", "spearman"))


def test_finetuned_classifier_exports_to_transformers_with_same_logits(sst2_run, tmp_path):
    transformers = pytest.importorskip("transformers")
    from ember.interop.convert import export_hf
    from ember.tokenizers import load_tokenizer
    from ember.tasks.base import get_adapter
    from ember.tasks.task_model import load_task_module
    from ember.runs.folder import load_run_config

    run, _ = sst2_run
    out = export_hf(run, tmp_path / "hf")
    hf = transformers.BertForSequenceClassification.from_pretrained(out).eval()
    cfg = load_run_config(run)
    ours = load_task_module(run, cfg, get_adapter("sst2", cfg.model), 0)
    tok = load_tokenizer(run / "tokenizer.json")
    enc = tok.encode("a gripping , beautifully acted story")
    ids = torch.tensor([enc.ids])
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    with torch.no_grad():
        torch.testing.assert_close(ours.logits(batch), hf(**batch).logits, atol=1e-5, rtol=0)
    assert hf.config.id2label[0] in ("negative", "0")


def test_init_from_a_run_of_another_family_is_a_clear_error(tmp_path, monkeypatch):
    from ember.runs import init
    from ember.runs.init import load_init

    # GPT and T5 runs fine-tune now (ember.tasks.families.gpt, ember.tasks.text2text.task): the
    # check is tested with a supported list that leaves T5 out
    monkeypatch.setattr(init, "SUPPORTED_FAMILIES", ("bert", "gpt"))
    run = tmp_path / "t5"
    run.mkdir()
    (run / "config.yaml").write_text("kind: pretrain\nobjective: span_corruption\nmodel:\n  family: t5\n")
    with pytest.raises(EmberError, match="holds a 't5' model"):
        load_init(str(run))


def test_finetune_from_a_pretraining_run_uses_its_weights(wiki_prepared, tmp_path):
    from ember.config import apply_overrides, load_yaml, run_config_from_dict
    from ember.recipes import recipe_path
    from ember.runs.init import load_init
    from ember.train.pretrain import run_pretraining
    from conftest import TINY_MODEL

    cfg = run_config_from_dict(apply_overrides(load_yaml(recipe_path("bert-mini")), TINY_MODEL + [
        f"data.prepared={wiki_prepared}", "train.max_steps=3", "train.eval_every=0", "train.save_every=0"]))
    run_pretraining(cfg, tmp_path / "pre", progress=False)
    model_cfg, state, tokenizer = load_init(str(tmp_path / "pre"))
    assert model_cfg.hidden_size == 32 and tokenizer.name == "tokenizer.json"
    from ember.runs.checkpoint import load_weights

    saved = load_weights(tmp_path / "pre" / "model.safetensors")
    torch.testing.assert_close(state["embeddings.word.weight"], saved["backbone.embeddings.word.weight"])
    assert not any(k.startswith(("mlm.", "nsp.")) for k in state)


def test_finetune_set_model_applies_to_random_init_and_only_free_settings_to_a_pretrained_one(
        wiki_prepared, tmp_path, capsys):
    """`--set model.K=V` used to be dropped silently (the init's model config replaced it)."""
    from conftest import TINY_MODEL
    from ember.cli import main
    from ember.recipes import recipe_path
    from ember.config import apply_overrides, load_yaml, run_config_from_dict
    from ember.train.pretrain import run_pretraining
    from ember.runs.folder import load_run_config

    real_data("glue", "SST-2")
    common = ["--task", "sst2", "--train-limit", "32", "--epochs", "1", "--max-length", "32", "--no-progress"]
    assert main(["finetune", "--init", "random", "--model", "bert-tiny", "--tokenizer",
                 str(wiki_prepared / "tokenizer.json"), "--out", str(tmp_path / "random"),
                 "--set", "model.num_layers=1", "--set", "model.dropout=0.0", *common]) == 0
    model = load_run_config(tmp_path / "random").model
    assert (model.num_layers, model.dropout, model.hidden_size) == (1, 0.0, 128)

    cfg = run_config_from_dict(apply_overrides(load_yaml(recipe_path("bert-mini")), TINY_MODEL + [
        f"data.prepared={wiki_prepared}", "train.max_steps=2", "train.eval_every=0", "train.save_every=0"]))
    run_pretraining(cfg, tmp_path / "pre", progress=False)
    assert main(["finetune", "--init", str(tmp_path / "pre"), "--out", str(tmp_path / "tuned"),
                 "--set", "model.dropout=0.2", *common]) == 0
    assert load_run_config(tmp_path / "tuned").model.dropout == 0.2
    capsys.readouterr()
    assert main(["finetune", "--init", str(tmp_path / "pre"), "--out", str(tmp_path / "bad"),
                 "--set", "model.num_layers=1", *common]) != 0
    assert "a pre-trained init fixes the model's shape" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_finetune_applies_train_num_threads(wiki_prepared, tmp_path):
    """`train.num_threads` used to be ignored by fine-tuning (only pre-training applied it), so
    `ember finetune/glue/compare --set train.num_threads=1` ran on torch's default threads."""
    real_data("glue", "SST-2")
    before = torch.get_num_threads()
    wanted = 1 if before != 1 else 2
    try:
        run_finetuning(finetune_cfg("sst2", epochs=0.1, num_threads=wanted), tmp_path / "run", None,
                       wiki_prepared / "tokenizer.json", train_limit=64, progress=False)
        assert torch.get_num_threads() == wanted
    finally:
        torch.set_num_threads(before)


def test_snli_trains_on_dev_and_reports_test_when_asked(wiki_prepared, tmp_path):
    real_data("snli")
    cfg = finetune_cfg("snli", epochs=1.0)
    import dataclasses

    cfg = dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, train_split="dev", eval_split="test"))
    result = run_finetuning(cfg, tmp_path / "run", None, wiki_prepared / "tokenizer.json",
                            train_limit=300, progress=False)
    assert result["split"] == "test" and 0.0 <= result["metrics"]["accuracy"] <= 1.0
    same = dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, eval_split="dev"))
    with pytest.raises(EmberError, match="same split"):
        run_finetuning(same, tmp_path / "run2", None, wiki_prepared / "tokenizer.json", progress=False)
