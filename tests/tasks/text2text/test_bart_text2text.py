"""BART runs fine-tune text to text on T5's adapters (Lewis et al. 2020 §3; the same task formats
as Raffel et al. 2020 App. D): a tiny BART pre-trained on real Wikipedia with BART's noising is
fine-tuned on real SST-2, scored with the official metric, predicts and evaluates from its folder,
and the pre-trained run itself answers /generate as `ember serve` would."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import real_data

import ember

TINY_BART = ["model.vocab_size=1000", "model.num_layers=2", "model.hidden_size=64", "model.num_heads=2",
             "model.intermediate_size=128", "train.num_threads=1"]


@pytest.fixture(scope="module")
def bart_pretrained(wiki_bpe, tmp_path_factory):
    """bart-tiny, 40 steps of infilling + sentence permutation on 60 real articles."""
    run = tmp_path_factory.mktemp("bart-t2t") / "pretrained"
    ember.pretrain("bart-mini", run, data=wiki_bpe, progress=False,
                   overrides=TINY_BART + ["train.max_steps=40", "train.batch_size=8", "data.max_seq_length=64",
                                          "train.eval_every=0", "train.save_every=40"])
    return run


@pytest.mark.slow
def test_bart_text2text_fine_tunes_on_real_sst2_and_answers_from_its_folder(bart_pretrained, tmp_path):
    real_data("glue", "SST-2")
    before = torch.get_num_threads()
    # 100 steps at lr 1e-2 (AdamW): the decoder learns to write the two label words (measured: loss
    # 6.6 -> 1.2, no invalid output); a 0.4M model pre-trained for 40 steps is not expected to beat
    # the majority class, so accuracy is checked for its form, not its size
    result = ember.finetune("sst2", tmp_path / "sst2", init=str(bart_pretrained), train_limit=1600, epochs=1,
                            lr=1e-2, max_length=48, progress=False,
                            overrides=["train.batch_size=16", "train.num_threads=1", "train.log_every=1",
                                       "task.text2text=true"])
    torch.set_num_threads(before)
    records = [json.loads(line) for line in (tmp_path / "sst2" / "metrics.jsonl").read_text().splitlines()]
    train = [r["loss"] for r in records if r["split"] == "train"]
    # the target is one of two words: the loss leaves the 1000-word vocabulary's ln(1000) = 6.9
    assert np.mean(train[-10:]) < 0.5 * np.mean(train[:3]), train
    metrics = result.metrics
    assert {"accuracy", "invalid"} <= set(metrics) and 0.0 <= metrics["invalid"] <= 1.0
    assert metrics["invalid"] < 0.05  # the decoder learned to write label words, not free text
    saved = json.loads((tmp_path / "sst2" / "results.json").read_text())
    assert saved["task"] == "SST-2" and saved["metrics"]["accuracy"] == metrics["accuracy"]
    # from its folder: the same dev score, and predictions of label words (or "invalid")
    again = ember.evaluate(tmp_path / "sst2")
    assert again["metrics"]["accuracy"] == pytest.approx(metrics["accuracy"], abs=1e-9)
    model = ember.load(tmp_path / "sst2")
    rows = model.classify(["a gorgeous, witty, seductive movie.", "the plot is a mess and the acting worse."])
    assert all(r["label"] in ("positive", "negative", "invalid") for r in rows)


def test_pretrained_bart_run_generates_as_its_decoding_loop(bart_pretrained):
    """A BART pre-training run is served like a T5 one: /generate continues the input with the
    one seq2seq decoding loop (greedy here, so the answer is the loop's own tokens)."""
    from ember.seq2seq_generation import Seq2SeqGenerationConfig, load_seq2seq_lm, seq2seq_generate_text

    model = ember.load(bart_pretrained)
    assert "generate" in model.methods
    text = "The river <mask> through the old city."
    got = model.generate(text, max_new_tokens=8)
    lm, tok = load_seq2seq_lm(bart_pretrained)
    (expected,) = seq2seq_generate_text(lm, tok, [text], Seq2SeqGenerationConfig(max_new_tokens=8))
    assert got["text"].strip() == expected.strip()
