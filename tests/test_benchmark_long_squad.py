"""The whole-article SQuAD study (issue 42 item 7): its data on the real SQuAD 2.0 dev half, and a
smoke run whose long models read each article in one window. Not measurements."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from benchmark_helpers import keep_torch_threads, load_benchmark  # noqa: F401 (an autouse fixture)
from conftest import real_data

import ember
from ember.errors import EmberError


def test_long_squad_articles_hold_every_paragraph_and_their_answers_on_real_squad(tmp_path):
    source = real_data("squad2-dev-half", "dev-v2.0.json")
    bench = load_benchmark("long_squad")
    args = argparse.Namespace(squad=str(source), questions=30, paragraphs=0)
    files = bench.write_data(args, tmp_path)
    original = {a["title"]: a for a in json.loads(source.read_text())["data"]}
    from ember.tasks.qa.squad import read_squad, split_by_article

    dev_titles = {ex.title for ex in split_by_article(read_squad(source), "dev")}
    articles = json.loads(files["dev-articles"].read_text())["data"]
    paragraphs = json.loads(files["dev-paragraphs"].read_text())["data"]
    train = json.loads(files["train"].read_text())["data"]
    assert {a["title"] for a in articles} == dev_titles  # the split `--task squad` makes
    assert not dev_titles & {a["title"] for a in train}
    by_id = {q["id"]: (p["context"], q) for a in paragraphs for p in a["paragraphs"] for q in p["qas"]}
    for article in articles:
        (whole,) = article["paragraphs"]
        assert whole["context"] == "\n\n".join(p["context"] for p in original[article["title"]]["paragraphs"])
        assert len(whole["qas"]) == 30
        for q in whole["qas"]:
            context, same = by_id[q["id"]]
            assert same["question"] == q["question"] and not q.get("is_impossible")
            for moved, there in zip(q["answers"], same["answers"]):
                assert moved["text"] == there["text"]
                assert whole["context"][moved["answer_start"]:][:len(moved["text"])] == moved["text"]
                assert whole["context"].index(context) + there["answer_start"] == moved["answer_start"]
    assert sum(len(a["paragraphs"][0]["qas"]) for a in articles) == len(by_id)


@pytest.mark.slow
def test_long_squad_smoke_reads_each_article_in_one_window_and_a_wide_longformer_keeps_the_runs_answers(tmp_path):
    real_data("squad2-dev-half", "dev-v2.0.json")
    bench = load_benchmark("long_squad")
    result = bench.main(["--out", str(tmp_path), "--smoke"])
    assert set(result["table"]) == {"paragraph", "windows", "longformer", "bigbird"}
    run = tmp_path / "runs" / "seed-1"
    articles = tmp_path / "data" / "dev-articles.json"

    from ember.runs.folder import load_run_config
    from ember.tasks.task_model import load_run_adapter, load_task_module
    from ember.tokenizers import load_tokenizer

    def windows_and_logits(folder, file, max_length=None):
        cfg = load_run_config(folder, expect_kind="finetune")
        adapter = load_run_adapter(folder, cfg)
        tokenizer = load_tokenizer(folder / "tokenizer.json")
        module = load_task_module(folder, cfg, adapter, 0)
        examples, features = adapter.load("dev", tokenizer, max_length or cfg.task.max_length, path=str(file))
        return examples, features, module.predict(features, 8)

    examples, features, _ = windows_and_logits(run.parent / "seed-1-longformer", articles, 2048)
    assert len(features) == len(examples) == result["meta"]["questions"]  # one window: the whole article
    examples, short, _ = windows_and_logits(run, articles)
    assert len(short) > 3 * len(examples)  # the run's own 128-token windows over the same articles
    # A Longformer window wider than the input, question global: the same function as the run
    from ember.interop.long import lengthen_run

    wide = tmp_path / "wide-longformer"
    lengthen_run(run, wide, 2048, attention="longformer", window=512)
    paragraphs = tmp_path / "data" / "dev-paragraphs.json"
    _, _, theirs = windows_and_logits(run, paragraphs)
    _, _, ours = windows_and_logits(wide, paragraphs)
    for (s1, e1), (s2, e2) in zip(theirs, ours):
        np.testing.assert_allclose(s2, s1, atol=1e-4)
        np.testing.assert_allclose(e2, e1, atol=1e-4)
    with pytest.raises(EmberError, match="beyond the model's 512 positions"):
        ember.evaluate(run, file=articles, max_length=513)
