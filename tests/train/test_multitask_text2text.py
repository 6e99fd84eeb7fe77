"""Text-to-text multi-task fine-tuning (ember.train.multitask with ember.tasks.text2text): one T5 (or
BART) model trained on a mixture, every task told apart by its input's fixed text (T5's prefixes,
Raffel et al. 2020 App. D, or decaNLP's questions, McCann et al. 2018), each task's own dev metric
and best weights; evaluate, predict, ember.load and serve answer every task; inputs of two tasks
that the model could not tell apart are refused. Tiny models on real GLUE rows."""

from __future__ import annotations

import json

import pytest
from conftest import real_data
from t5_helpers import one_thread, t5_glue_tokenizer, t5_run_folder  # noqa: F401

import ember
from ember.errors import EmberError
from ember.train.logging import MetricsLogger

pytestmark = pytest.mark.usefixtures("one_thread")
TEXT, PAIR = "A man is playing a guitar.", "A man plays an instrument."
WORDS = {"sst2": {"negative", "positive"}, "rte": {"entailment", "not_entailment"}}


@pytest.fixture(scope="module")
def t5_init(t5_glue_tokenizer, tmp_path_factory):
    real_data("glue", "RTE")
    return t5_run_folder(tmp_path_factory.mktemp("t5-multi") / "init", t5_glue_tokenizer)


@pytest.fixture(scope="module")
def t5_multitask(t5_init, tmp_path_factory):
    """sst2 + rte on one tiny T5: 80 Adafactor steps (measured: every dev output becomes one of its
    task's label words; the random init writes none)."""
    run = tmp_path_factory.mktemp("t5-multi") / "run"
    result = ember.finetune(tasks=["sst2", "rte"], out=run, init=str(t5_init), train_limit=160, max_length=48,
                            batch_size=8, epochs=2, lr=1e-2, seed=1, progress=False,
                            overrides=["train.log_every=1"])
    return run, result


def test_t5_multitask_writes_each_tasks_own_label_words_from_its_prefix(t5_multitask):
    run, result = t5_multitask
    evals = [r for r in MetricsLogger.read(run / "metrics.jsonl") if r["split"] == "eval"]
    assert len(evals) == 2
    for name in ("sst2", "rte"):
        # one model for both tasks: only the prefix ("sst2 sentence:" / "rte sentence1:") says which label
        # words to write, and a dev output in the other task's words counts as invalid
        assert result.result["tasks"][name]["metrics"]["invalid"] < 0.05
        own = json.loads((run / "tasks" / name / "results.json").read_text())
        assert own["metrics"]["accuracy"] == pytest.approx(max(r[f"{name}.accuracy"] for r in evals))
    # the shared model is the whole encoder-decoder, once; text-to-text tasks add no head
    from ember.runs.checkpoint import load_weights

    state = load_weights(run / "model.safetensors")
    assert state and all(k.startswith("backbone.") for k in state)
    # T5's fine-tuning defaults from the first task (Adafactor at a constant rate, no clipping)
    from ember.runs.folder import load_run_config

    cfg = load_run_config(run)
    assert cfg.train.optimizer == "adafactor" and cfg.train.max_grad_norm == 0.0


def test_t5_multitask_run_answers_every_task_in_evaluate_predict_load_and_serve(t5_multitask, tmp_path):
    run, result = t5_multitask
    scored = ember.evaluate(run)["tasks"]
    assert set(scored) == {"sst2", "rte"}
    assert scored["rte"]["metrics"] == pytest.approx(result.result["tasks"]["rte"]["metrics"])
    model = ember.load(run)
    rte = model.classify(TEXT, text_pair=PAIR, task="rte")
    assert rte == ember.load(run / "tasks" / "rte").classify(TEXT, text_pair=PAIR)
    assert rte["label"] in WORDS["rte"]
    assert model.classify("a gripping , beautifully acted film", task="sst2")["label"] in WORDS["sst2"]
    rows = real_data("glue", "SST-2", "dev.tsv").read_text(encoding="utf-8").splitlines()[:6]
    (tmp_path / "in.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    predicted = ember.predict(run / "tasks" / "sst2", tmp_path / "in.tsv")
    assert len(predicted) == 5 and all(p["prediction"] in WORDS["sst2"] for p in predicted)
    from fastapi.testclient import TestClient

    from ember.serve.app import create_app
    from ember.serve.predictor import load_predictor

    with TestClient(create_app(load_predictor(run))) as client:
        answer = client.post("/classify", json={"task": "rte", "text": TEXT, "text_pair": PAIR})
        assert answer.status_code == 200 and answer.json()["results"][0] == rte
        single = client.post("/classify", json={"task": "sst2", "text": TEXT})
        assert single.status_code == 200 and single.json()["results"][0]["label"] in WORDS["sst2"]
        missing = client.post("/classify", json={"text": TEXT})
        assert missing.status_code == 400 and "task" in missing.json()["error"]


# The first dev row of each task written by hand in decaNLP's framing (McCann et al. 2018: SST's
# question verbatim; RTE in MNLI's 'Hypothesis: "..." -- a, b, or c?' over 'Premise: "..."').
# The input text joins the pieces with spaces, so the quotes stand apart from the sentences.
DECANLP = {
    "sst2": ("question: Is this review negative or positive? context: it 's a charming and often affecting "
             "journey .", "positive"),
    "rte": ('question: Hypothesis: " Christopher Reeve had an accident. " -- entailment or not_entailment? '
            'context: Premise: " Dana Reeve, the widow of the actor Christopher Reeve, has died of lung cancer at '
            'age 44, according to the Christopher Reeve Foundation. "', "not_entailment"),
    "stsb": ('question: Sentence 2: " A man wearing a hard hat is dancing. " -- how similar, from 0.0 to 5.0? '
             'context: Sentence 1: " A man with a hard hat is dancing. "', "5.0"),
}


@pytest.mark.parametrize("task", sorted(DECANLP))
def test_decanlp_templates_ask_each_real_glue_row_as_a_question_over_a_context(task, t5_glue_tokenizer):
    real_data("glue", "SST-2", "dev.tsv")
    from ember.config import TaskConfig, model_preset
    from ember.tasks.base import get_adapter
    from ember.tasks.text2text.templates import input_text
    from ember.tokenizers import load_tokenizer

    adapter = get_adapter(task, model_preset("t5-tiny"), settings=TaskConfig(templates="decanlp"))
    examples, features = adapter.load("dev", load_tokenizer(t5_glue_tokenizer), 128, limit=1)
    text, target = DECANLP[task]
    assert input_text(adapter.template, examples[0]) == text
    assert adapter.template.target(examples[0]) == target
    # outputs parse back as under T5's templates: the label words, and STS-B's 0.2 steps
    assert adapter.template.parse(target).valid and not adapter.template.parse("sst2 " + target).valid


def test_decanlp_multitask_run_keeps_its_template_set_for_evaluation(t5_init, tmp_path):
    run = tmp_path / "deca"
    result = ember.finetune(tasks=["sst2", "rte"], out=run, init=str(t5_init), train_limit=16, max_length=48,
                            batch_size=8, epochs=1, progress=False, overrides=["task.templates=decanlp"])
    from ember.runs.folder import load_run_config
    from ember.tasks.task_model import load_run_adapter
    from ember.tasks.text2text.decanlp import QuestionTemplate

    for name in ("sst2", "rte"):
        folder = run / "tasks" / name
        assert load_run_config(folder).task.templates == "decanlp"
        # scored again from its folder, the task is asked the same questions as in training
        assert ember.evaluate(folder)["metrics"] == pytest.approx(result.result["tasks"][name]["metrics"])
    folder = run / "tasks" / "rte"
    assert isinstance(load_run_adapter(folder, load_run_config(folder)).template, QuestionTemplate)


def test_bart_multitask_mixture_trains_one_model_for_every_task(t5_glue_tokenizer, tmp_path):
    """A random bart-tiny on the same mixture as text to text (task.text2text: BART's own default for
    GLUE-style tasks is the paper's heads on the decoder's states, Lewis et al. 2020 §3.1)."""
    real_data("glue", "RTE")
    run = tmp_path / "bart"
    result = ember.finetune(tasks=["sst2", "rte"], out=run, model="bart-tiny", tokenizer=str(t5_glue_tokenizer),
                            train_limit=16, max_length=48, batch_size=8, epochs=1, progress=False,
                            overrides=["model.num_layers=1", "model.hidden_size=32", "model.num_heads=2",
                                       "model.intermediate_size=64", "task.text2text=true"])
    assert set(result.result["tasks"]) == {"sst2", "rte"} and result.result["steps"] == 4
    assert set(ember.evaluate(run)["tasks"]) == {"sst2", "rte"}
    assert ember.load(run).classify(TEXT, text_pair=PAIR, task="rte")["valid"] in (True, False)


def test_text2text_mixture_refuses_tasks_the_model_could_not_tell_apart(t5_init, tmp_path):
    train, dev = tmp_path / "a.csv", tmp_path / "b.csv"
    for path in (train, dev):
        path.write_text("text,label\ngood film,yes\nbad film,no\n", encoding="utf-8")
    out = tmp_path / "never"
    common = dict(out=out, init=str(t5_init), train_limit=8, progress=False, max_length=48)
    cases = [
        # two of your own classify tasks given one prefix: both "mine sentence: ...", their label sets would
        # collide (by default each has its name as prefix: tests/train/test_multitask_custom_text2text.py)
        (dict(tasks=["sst2", f"a=classify:{train}:{dev}:prefix=mine", f"b=classify:{train}:{dev}:prefix=mine"]),
         "tasks a and b"),
        (dict(tasks=["sst2", "rte"], overrides=["task.templates=alpaca"]), "task.templates='alpaca'"),
    ]
    for kwargs, message in cases:
        with pytest.raises(EmberError, match=message) as error:
            ember.finetune(**{**common, **kwargs})
        assert "\n" not in str(error.value) and not out.exists()


def test_decanlp_templates_are_refused_on_an_encoder_mixture(tmp_path):
    from multitask_helpers import TINY_MODEL, glue_tokenizer

    real_data("glue", "RTE")
    out = tmp_path / "never"
    with pytest.raises(EmberError, match="task.templates=decanlp") as error:
        ember.finetune(tasks=["rte", "stsb"], out=out, model="bert-tiny", tokenizer=str(glue_tokenizer(
            tmp_path / "tok.json")), train_limit=8, progress=False, overrides=TINY_MODEL + ["task.templates=decanlp"])
    assert "\n" not in str(error.value) and not out.exists()
