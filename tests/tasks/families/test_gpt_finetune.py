"""GPT-1 style fine-tuning: input transformations, extract-token classifier, auxiliary LM loss."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import real_data
from ember.tasks.readers.glue import Example
from gpt_helpers import make_gpt_run, tiny_model


@pytest.fixture
def gpt1_run(tmp_path):
    """A tiny random GPT-1 run folder whose BPE is trained on real SST-2 sentences."""
    import dataclasses

    from ember.config import DataConfig, RunConfig
    from ember.runs.checkpoint import save_weights
    from ember.runs.folder import load_run_config, write_run_files

    run = make_gpt_run(tmp_path, text=real_data("glue", "SST-2", "train.tsv"), vocab=600)
    cfg = load_run_config(run)
    model = tiny_model("gpt", vocab=cfg.model.vocab_size)
    gpt1 = tmp_path / "gpt1"
    write_run_files(gpt1, RunConfig(objective="clm", model=dataclasses.replace(model.backbone.config),
                                    data=DataConfig(max_seq_length=64)), run / "tokenizer.json")
    save_weights(model.state_dict(), gpt1 / "model.safetensors")
    return gpt1


def test_gpt1_input_transformations(gpt1_run):
    from ember.tasks.families.gpt import encode_gpt_examples, transform_ids
    from ember.tokenizers import load_tokenizer

    tok = load_tokenizer(gpt1_run / "tokenizer.json")
    ids = transform_ids(tok)
    assert ids == {"start": tok.token_to_id("<s>"), "delim": tok.token_to_id("</s>"),
                   "extract": tok.token_to_id("<|endoftext|>")}
    a = tok.encode("a fine film", add_special_tokens=False).ids
    b = tok.encode("it is good", add_special_tokens=False).ids
    (single, pair), cut = encode_gpt_examples([Example("1", "a fine film", None, 1),
                                               Example("2", "a fine film", "it is good", 0)], tok, 64)
    assert cut == 0
    assert single["input_ids"] == [ids["start"], *a, ids["extract"]]
    assert pair["input_ids"] == [ids["start"], *a, ids["delim"], *b, ids["extract"]]
    long = Example("3", "word " * 50, "short", 1)
    (feature,), cut = encode_gpt_examples([long], tok, 20)
    assert cut == 1 and len(feature["input_ids"]) == 20 and feature["input_ids"][-1] == ids["extract"]


def test_gpt1_classifier_reads_the_extract_token_and_adds_half_the_lm_loss():
    from ember.tasks.featurize import collate
    from ember.tasks.families.gpt import GptClassifier

    model = GptClassifier(tiny_model("gpt").backbone, num_labels=2, pad_id=1).eval()
    features = [{"input_ids": [0, 10, 11, 12, 5], "token_type_ids": [0] * 5, "label": 1},
                {"input_ids": [0, 20, 5], "token_type_ids": [0] * 3, "label": 0}]
    batch = collate(features, pad_id=1)
    with torch.no_grad():
        together = model.logits(batch)
        alone = model.logits(collate(features[1:], pad_id=1))
        torch.testing.assert_close(together[1:], alone, atol=1e-5, rtol=0)  # padding does not matter
        loss, metrics = model(batch)
        task = torch.nn.functional.cross_entropy(together, batch["labels"])
        logits = model.backbone.lm_logits(model.backbone(batch["input_ids"]).last_hidden_state)[:, :-1]
        targets = batch["input_ids"][:, 1:].masked_fill(batch["attention_mask"][:, 1:] == 0, -100)
        lm = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, ignore_index=-100)
    torch.testing.assert_close(loss, task + 0.5 * lm, atol=1e-5, rtol=0)
    assert {"task_loss", "lm_loss", "accuracy"} <= set(metrics)


def test_gpt1_finetune_and_predict_sst2_from_cli(gpt1_run, tmp_path):
    from ember.cli import main

    out = tmp_path / "ft"
    # --features (a frozen encoder under a learned mix) has no GPT form: one line, and no folder left
    # behind that the corrected command would have to --overwrite
    assert main(["finetune", "--task", "sst2", "--init", str(gpt1_run), "--out", str(out), "--features",
                 "--train-limit", "8", "--no-progress"]) == 1
    assert not out.exists()
    assert main(["finetune", "--task", "sst2", "--init", str(gpt1_run), "--out", str(out), "--epochs", "1",
                 "--train-limit", "64", "--batch-size", "16", "--max-length", "64", "--lr", "1e-3",
                 "--no-progress"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["task"] == "SST-2" and 0.0 <= results["metrics"]["accuracy"] <= 1.0
    train = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert "lm_loss" in train[0] and "task_loss" in train[0]
    tsv = tmp_path / "in.tsv"
    tsv.write_text("sentence\tlabel\na great film\t1\na dull film\t0\n")
    assert main(["predict", str(out), "--input", str(tsv), "--out", str(tmp_path / "p.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["prediction"] in ("negative", "positive") for r in rows)
