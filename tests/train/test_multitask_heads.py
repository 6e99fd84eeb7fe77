"""Multi-task fine-tuning beyond sentence classification: a tagging head (CoNLL-2003 NER, and your own
CoNLL file) and a span head (SQuAD 2.0) share one encoder with SST-2's classifier (MT-DNN, Liu et
al. 2019: one shared encoder, a head per task). Each task keeps its official metric, SQuAD 2.0 its
tuned no-answer threshold; the average puts SQuAD's percentages on the others' [0, 1] scale; the
run answers /tag, /answer and /classify by task. A tiny BERT on real CoNLL-2003, SQuAD 2.0 and SST-2 rows."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import real_data
from multitask_helpers import TINY_MODEL, glue_tokenizer
from t5_helpers import t5_glue_tokenizer  # noqa: F401  (a session fixture)

import ember
from ember.errors import EmberError


def conll_files(folder, train_n: int = 120, dev_n: int = 60) -> tuple:
    """(train.txt, dev.txt): the first real CoNLL-2003 dev sentences, word and NER tag per line."""
    sentences, current = [], []
    for line in real_data("conll2003", "dev.txt").read_text(encoding="utf-8").splitlines():
        if line.startswith("-DOCSTART-"):
            continue
        if line.strip():
            current.append(f"{line.split()[0]} {line.split()[-1]}")
        elif current:
            sentences.append(current)
            current = []
    paths = []
    for name, part in (("train", sentences[:train_n]), ("dev", sentences[train_n:train_n + dev_n])):
        path = folder / f"{name}.txt"
        path.write_text("\n\n".join("\n".join(s) for s in part) + "\n", encoding="utf-8")
        paths.append(path)
    return tuple(paths)


@pytest.fixture(scope="module")
def heads_run(tmp_path_factory):
    real_data("conll2003", "train.txt")
    real_data("squad2-dev-half", "dev-v2.0.json")
    root = tmp_path_factory.mktemp("multitask-heads")
    tokenizer = glue_tokenizer(root / "tokenizer.json")
    train, dev = conll_files(root)
    run = root / "run"
    result = ember.finetune(tasks=["conll2003", "squad2", "sst2", f"mine=tag:{train}:{dev}"], out=run,
                            model="bert-tiny", tokenizer=str(tokenizer), train_limit=32, max_length=64, lr=1e-3,
                            batch_size=8, epochs=1, seed=2, progress=False, overrides=TINY_MODEL)
    return run, result


def test_tag_and_span_heads_train_beside_a_classifier_on_one_encoder(heads_run):
    run, result = heads_run
    tasks = result.result["tasks"]
    assert tasks["conll2003"]["main_metric"] == "f1" and "precision" in tasks["conll2003"]["metrics"]
    assert tasks["squad2"]["main_metric"] == "tuned_f1" and tasks["squad2"]["metrics"]["HasAns_total"] > 0
    assert tasks["mine"]["main_metric"] == "f1"  # an IOB tag set is scored by entity F1 (conlleval)
    # CoNLL-2003's test set is scored once with the task's kept weights, as a single-task run reports it
    assert set(tasks["conll2003"]["other_splits"]) == {"test"} and "f1" in tasks["conll2003"]["other_splits"]["test"]
    assert "other_splits" not in tasks["sst2"] and "other_splits" not in tasks["mine"]
    # SQuAD's long contexts are several windows: the mixture draws windows, so its rate counts them
    assert tasks["squad2"]["train_windows"] > tasks["squad2"]["train_examples"] == 32
    assert tasks["squad2"]["rate"] > tasks["sst2"]["rate"]
    # the average of the main metrics on one scale: SQuAD's percent / 100 beside F1 and accuracy
    mains = [tasks[n]["metrics"][tasks[n]["main_metric"]] / (100 if n == "squad2" else 1) for n in tasks]
    assert result.metrics["average"] == pytest.approx(np.mean(mains))
    assert 0 <= result.metrics["average"] <= 1
    # SQuAD 2.0's no-answer threshold is tuned on dev with the kept weights and kept beside them, so
    # the task's folder scores as training reported
    folder = run / "tasks" / "squad2"
    assert json.loads((folder / "tuned.json").read_text())["null_threshold"] == tasks["squad2"]["tuned"][
        "null_threshold"]
    for name in tasks:
        assert ember.evaluate(run / "tasks" / name)["metrics"] == pytest.approx(tasks[name]["metrics"])


def test_multitask_run_with_tag_and_span_heads_answers_each_route(heads_run):
    run, _ = heads_run
    model = ember.load(run)
    tagged = model.tag("EU rejects German call to boycott British lamb .", task="conll2003")
    labels = json.loads((run / "tasks" / "conll2003" / "labels.json").read_text())
    assert len(tagged["tags"]) == 9 and set(tagged["tags"]) <= set(labels) and "B-ORG" in labels
    context = "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy."
    answered = model.answer("Who gave their name to Normandy?", context=context, task="squad2")
    assert answered == ember.load(run / "tasks" / "squad2").answer("Who gave their name to Normandy?",
                                                                     context=context)
    from fastapi.testclient import TestClient

    from ember.serve.app import create_app
    from ember.serve.predictor import load_predictor

    with TestClient(create_app(load_predictor(run))) as client:
        for route, body in (("/tag", {"task": "mine", "text": "Peter lives in Paris ."}),
                            ("/answer", {"task": "squad2", "question": "Who?", "context": context}),
                            ("/classify", {"task": "sst2", "text": "a gripping film"})):
            assert client.post(route, json=body).status_code == 200, route
        wrong = client.post("/tag", json={"task": "sst2", "text": "a gripping film"})
        assert wrong.status_code == 400 and "conll2003, mine" in wrong.json()["error"]


def test_text2text_mixture_refuses_a_tagging_task_with_one_line(t5_glue_tokenizer, tmp_path):
    """A T5 model has no template for NER (Raffel et al. 2020 cast no tagging task as text)."""
    from t5_helpers import t5_run_folder

    real_data("conll2003", "dev.txt")
    init = t5_run_folder(tmp_path / "init", t5_glue_tokenizer)
    out = tmp_path / "never"
    with pytest.raises(EmberError, match="no text-to-text template") as error:
        ember.finetune(tasks=["sst2", "conll2003"], out=out, init=str(init), train_limit=8, progress=False)
    assert "\n" not in str(error.value) and not out.exists()
