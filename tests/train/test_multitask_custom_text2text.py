"""Your own tasks in a text-to-text mixture (ember.train.multitask, ember.api.multitask): a text2text
file (input -> target texts) trains beside SST-2 in one T5 (and one BART with task.text2text=true), its
inputs starting with its own prefix (by default its name, as T5 names each task, Raffel et al. 2020
App. D); two of your own tasks of one kind get a prefix each and train together; only tasks whose
inputs could not be told apart are refused. A tiny T5 trained 40 steps on real SST-2 rows and a CoLA
file written as text2text (real CoLA sentences -> "acceptable" / "unacceptable")."""

from __future__ import annotations

import csv
import json

import pytest
from conftest import real_data
from multitask_helpers import sst2_csv_task
from t5_helpers import one_thread, t5_glue_tokenizer, t5_run_folder  # noqa: F401

import ember
from ember.errors import EmberError

pytestmark = pytest.mark.usefixtures("one_thread")
COLA_WORDS = ("unacceptable", "acceptable")  # CoLA's label names, T5's target words for it
SST2_WORDS = {"negative", "positive"}


def cola_text2text_files(folder, train_n: int = 160, dev_n: int = 40, test_n: int = 40, prefix: str = "") -> tuple:
    """(train, dev, test) .jsonl of real CoLA rows as text2text: {"input": sentence, "target": label word};
    train from CoLA train, dev and test from separate CoLA dev rows. ``prefix`` starts every input."""
    def rows(split):
        with open(real_data("glue", "CoLA", f"{split}.tsv"), encoding="utf-8") as fh:
            return list(csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))

    train, dev = rows("train"), rows("dev")
    paths = []
    for split, part in (("train", train[:train_n]), ("dev", dev[:dev_n]), ("test", dev[dev_n:dev_n + test_n])):
        path = folder / f"cola{prefix.strip(':')}-{split}.jsonl"
        path.write_text("".join(json.dumps({"input": f"{prefix} {r[3]}".strip(), "target": COLA_WORDS[int(r[1])]})
                                + "\n" for r in part), encoding="utf-8")
        paths.append(path)
    return tuple(paths)


@pytest.fixture(scope="module")
def t5_init(t5_glue_tokenizer, tmp_path_factory):
    real_data("glue", "CoLA")
    return t5_run_folder(tmp_path_factory.mktemp("t5-custom-mix") / "init", t5_glue_tokenizer)


@pytest.fixture(scope="module")
def grammar_run(t5_init, tmp_path_factory):
    """sst2 + grammar (a CoLA text2text file with a test file): 40 Adafactor steps of batch 8."""
    root = tmp_path_factory.mktemp("t5-custom-mix")
    files = cola_text2text_files(root)
    run = root / "run"
    result = ember.finetune(tasks=["sst2", "grammar=text2text:{}:{}:{}".format(*files)], out=run, init=str(t5_init),
                            train_limit=160, max_length=48, batch_size=8, epochs=1, lr=1e-2, seed=1, progress=False)
    return run, result, files


def test_t5_mixture_trains_your_text2text_file_beside_sst2_with_its_own_prefix(grammar_run):
    run, result, (train, dev, test) = grammar_run
    tasks = result.result["tasks"]
    assert result.result["steps"] == 40 and set(tasks) == {"sst2", "grammar"}
    # each task's dev score is computed and written: its folder's results.json, the run's summary
    for name, metric in (("sst2", "accuracy"), ("grammar", "f1")):
        own = json.loads((run / "tasks" / name / "results.json").read_text())
        assert own["main_metric"] == metric and own["metrics"] == pytest.approx(tasks[name]["metrics"])
        assert json.loads((run / "summary.json").read_text())["tasks"][name]["value"] == own["metrics"][metric]
    # text metrics are percentages (exact match, token F1, BLEU, ROUGE): the average counts them / 100
    assert tasks["grammar"]["unit_scale"] == 0.01
    assert result.metrics["average"] == pytest.approx((tasks["sst2"]["metrics"]["accuracy"]
                                                       + tasks["grammar"]["metrics"]["f1"] / 100) / 2)
    # the test file is scored once with the task's kept weights, as `ember evaluate --split test` scores it
    folder = run / "tasks" / "grammar"
    assert tasks["grammar"]["other_splits"]["test"] == pytest.approx(ember.evaluate(folder, split="test")["metrics"])
    # the prefix is kept in the task's task.json: its folder writes inputs as training did
    assert json.loads((folder / "task.json").read_text())["prefix"] == "grammar"
    from ember.runs.folder import load_run_config
    from ember.tasks.task_model import load_run_adapter
    from ember.tasks.text2text.templates import input_text

    adapter = load_run_adapter(folder, load_run_config(folder))
    first = json.loads(dev.read_text(encoding="utf-8").splitlines()[0])
    assert input_text(adapter.template, adapter.inner.read("dev")[0]) == f"grammar: {first['input']}"
    assert ember.evaluate(folder)["metrics"] == pytest.approx(tasks["grammar"]["metrics"])


def test_t5_mixture_answers_each_task_by_its_prefix_in_evaluate_predict_load_and_serve(grammar_run, tmp_path):
    run, result, (train, dev, test) = grammar_run
    scored = ember.evaluate(run)["tasks"]
    assert set(scored) == {"sst2", "grammar"}
    assert scored["grammar"]["metrics"] == pytest.approx(result.result["tasks"]["grammar"]["metrics"])
    # the same real sentences asked as either task: the model writes that task's own words, which it can
    # only do by reading the prefix ("sst2 sentence:" / "grammar:")
    with open(real_data("glue", "SST-2", "dev.tsv"), encoding="utf-8") as fh:
        sentences = [line.split("\t")[0] for line in fh.read().splitlines()[1:13]]
    model = ember.load(run)
    as_sst2 = [model.classify(s, task="sst2")["label"] for s in sentences]
    as_grammar = [model.generate(s, task="grammar")["text"] for s in sentences]
    assert sum(label in SST2_WORDS for label in as_sst2) >= 10
    assert all(text in COLA_WORDS for text in as_grammar)
    # predict on the task's folder reads inputs alone and adds the prefix, as load / serve do
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"input": s}) + "\n" for s in sentences), encoding="utf-8")
    predicted = ember.predict(run / "tasks" / "grammar", tmp_path / "in.jsonl")
    assert [p["prediction"] for p in predicted] == as_grammar
    from fastapi.testclient import TestClient

    from ember.serve.app import create_app
    from ember.serve.predictor import load_predictor

    with TestClient(create_app(load_predictor(run))) as client:
        served = client.post("/generate", json={"task": "grammar", "text": sentences[0]})
        assert served.status_code == 200 and served.json()["results"][0]["text"] == as_grammar[0]
        assert client.post("/classify", json={"task": "sst2", "text": sentences[0]}).json()["results"][0]["label"] \
            == as_sst2[0]


def test_bart_mixture_takes_your_text2text_file_with_its_prefix(t5_glue_tokenizer, tmp_path):
    """bart-tiny with task.text2text=true: the same mixture, one model, the same prefixes."""
    train, dev, test = cola_text2text_files(tmp_path, 16, 8, 8)
    run = tmp_path / "bart"
    result = ember.finetune(tasks=["rte", f"grammar=text2text:{train}:{dev}:{test}"], out=run, model="bart-tiny",
                            tokenizer=str(t5_glue_tokenizer), train_limit=16, max_length=48, batch_size=8, epochs=1,
                            progress=False, overrides=["model.num_layers=1", "model.hidden_size=32",
                                                       "model.num_heads=2", "model.intermediate_size=64",
                                                       "task.text2text=true"])
    tasks = result.result["tasks"]
    assert result.result["steps"] == 4 and set(tasks["grammar"]["other_splits"]) == {"test"}
    assert json.loads((run / "tasks" / "grammar" / "task.json").read_text())["prefix"] == "grammar"
    assert set(ember.evaluate(run)["tasks"]) == {"rte", "grammar"}
    assert isinstance(ember.load(run).generate("The boy sleeps.", task="grammar")["text"], str)


def _classify_files(folder, name: str) -> tuple:
    """(train, dev) .csv: 16 + 8 real SST-2 dev sentences as a classify task with yes/no labels."""
    return sst2_csv_task(folder, 16, 8, name, ("yes", "no"))


def test_two_of_your_tasks_of_one_kind_get_a_prefix_each_in_a_t5_mixture(t5_init, tmp_path):
    a_train, a_dev = _classify_files(tmp_path, "a")
    b_train, b_dev = _classify_files(tmp_path, "b")
    run = tmp_path / "two"
    result = ember.finetune(tasks=[f"likes=classify:{a_train}:{a_dev}",
                                   {"name": "keeps", "kind": "classify", "train": str(b_train), "dev": str(b_dev),
                                    "prefix": "would watch again"}],
                            out=run, init=str(t5_init), train_limit=16, max_length=48, batch_size=8, epochs=1,
                            progress=False)
    assert set(result.result["tasks"]) == {"likes", "keeps"}
    from ember.runs.folder import load_run_config
    from ember.tasks.task_model import load_run_adapter
    from ember.tasks.text2text.templates import input_text

    for name, start in (("likes", "likes sentence: "), ("keeps", "would watch again sentence: ")):
        folder = run / "tasks" / name
        adapter = load_run_adapter(folder, load_run_config(folder))
        assert input_text(adapter.template, adapter.inner.read("train")[0]).startswith(start)
        assert ember.evaluate(folder)["metrics"] == pytest.approx(result.result["tasks"][name]["metrics"])


def test_t5_mixture_refuses_only_tasks_it_could_not_tell_apart(t5_init, tmp_path):
    a_train, a_dev = _classify_files(tmp_path, "a")
    b_train, b_dev = _classify_files(tmp_path, "b")
    plain = cola_text2text_files(tmp_path, 16, 8, 8)
    own_a = cola_text2text_files(tmp_path, 16, 8, 8, prefix="grammar:")
    own_b = cola_text2text_files(tmp_path, 16, 8, 8, prefix="judge acceptability:")
    out = tmp_path / "never"
    common = dict(out=out, init=str(t5_init), train_limit=8, progress=False, max_length=48)
    cases = [
        # the same prefix given to two tasks: their label sets would collide in the one output
        ([f"a=classify:{a_train}:{a_dev}:prefix=mine", f"b=classify:{b_train}:{b_dev}:prefix=mine"],
         "tasks a and b .*'mine sentence:'"),
        # two text2text files fed as written (prefix "") whose inputs start with nothing in common
        ([f"x=text2text:{plain[0]}:{plain[1]}:prefix=", f"y=text2text:{plain[0]}:{plain[1]}:prefix="], "tasks x and y"),
        # a prefix that makes your task's inputs SST-2's
        (["sst2", f"a=classify:{a_train}:{a_dev}:prefix=sst2"], "tasks sst2 and a"),
        # decaNLP's question, one prefix given twice
        ([f"a=classify:{a_train}:{a_dev}:prefix=mine", f"b=classify:{b_train}:{b_dev}:prefix=mine"], "tasks a and b"),
    ]
    for i, (tasks, message) in enumerate(cases):
        overrides = ["task.templates=decanlp"] if i == 3 else []
        with pytest.raises(EmberError, match=message) as error:
            ember.finetune(tasks=tasks, overrides=overrides, **common)
        assert "\n" not in str(error.value) and "prefix" in str(error.value) and not out.exists()
    # under decaNLP's set your classify tasks ask with their prefix first, so one label set twice is told apart
    from ember.api.multitask import parse_tasks, task_adapters
    from ember.config import TaskConfig
    from ember.runs.folder import load_run_config
    from ember.tasks.base import get_adapter
    from ember.tasks.text2text.templates import input_text

    model = load_run_config(t5_init).model
    raw = task_adapters(parse_tasks([f"a=classify:{a_train}:{a_dev}", f"b=classify:{b_train}:{b_dev}"]), model)[0]
    asked = [input_text(get_adapter(adapter.inner, model, settings=TaskConfig(templates="decanlp")).template,
                        adapter.inner.read("dev")[0]) for _, adapter in raw]
    assert [q.split(" context:")[0] for q in asked] == ["question: a: Is this text no or yes?",
                                                       "question: b: Is this text no or yes?"]
    # files that carry their own prefixes ("grammar: ...", "judge acceptability: ...") can be fed as written
    from ember.train.multitask import check_inputs_apart, fixed_text

    adapters = _text2text_adapters([("p", own_a), ("q", own_b)], t5_init)
    data = {name: ((adapter.inner.read("train"), None), None) for name, adapter in adapters}
    assert [fixed_text(a, data[n][0][0]) for n, a in adapters] == ["grammar:", "judge acceptability:"]
    check_inputs_apart(adapters, data)  # no error


def _text2text_adapters(specs, init) -> list:
    from ember.api.multitask import parse_tasks, task_adapters
    from ember.runs.folder import load_run_config

    tasks = parse_tasks([f"{name}=text2text:{files[0]}:{files[1]}:prefix=" for name, files in specs])
    return task_adapters(tasks, load_run_config(init).model)[0]
