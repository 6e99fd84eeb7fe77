"""Multi-task fine-tuning (ember.train.multitask): one shared encoder, a head per task, one task per
batch, each task's own best checkpoint and results; evaluating, loading and serving every task; the
second stage (--init MULTI_RUN); bad input refused before anything is written. Tiny models on real
GLUE data (RTE, STS-B) and a custom classify task written from real SST-2 rows."""

from __future__ import annotations

import json

import pytest
import torch

import ember
from conftest import real_data
from ember.errors import EmberError
from ember.train.logging import MetricsLogger
from multitask_helpers import TINY_MODEL, glue_tokenizer, sst2_csv_task

QUICK = dict(max_length=48, lr=1e-3, batch_size=8, epochs=2, progress=False)
TEXT, PAIR = "A man is playing a guitar.", "A man plays an instrument."


@pytest.fixture(scope="module")
def multitask_run(tmp_path_factory):
    real_data("glue", "RTE")
    root = tmp_path_factory.mktemp("multitask")
    tokenizer = glue_tokenizer(root / "tokenizer.json")
    train, dev = sst2_csv_task(root)
    run = root / "run"
    result = ember.finetune(tasks=["rte", "stsb", f"mine=classify:{train}:{dev}"], out=run, model="bert-tiny",
                            tokenizer=str(tokenizer), train_limit=64, seed=3, mixing="temperature",
                            mixing_temperature=2, overrides=TINY_MODEL + ["train.log_every=1"], **QUICK)
    return run, result, tokenizer


def test_multitask_run_keeps_each_tasks_best_checkpoint_and_results(multitask_run):
    run, result, _ = multitask_run
    names = ["rte", "stsb", "mine"]
    summary = json.loads((run / "summary.json").read_text())
    assert list(summary["tasks"]) == names
    evals = [r for r in MetricsLogger.read(run / "metrics.jsonl") if r["split"] == "eval"]
    assert len(evals) == 2  # once per epoch over all tasks' examples together
    for name in names:
        folder = run / "tasks" / name
        own = json.loads((folder / "results.json").read_text())
        main = own["main_metric"]
        # the kept weights are the best of this task's own dev evaluations, not the average's
        best = max(evals, key=lambda r: r[f"{name}.{main}"])
        assert own["metrics"][main] == pytest.approx(best[f"{name}.{main}"])
        assert own["best_step"] == best["step"]
        assert summary["tasks"][name]["value"] == pytest.approx(own["metrics"][main])
        # the folder is an ordinary fine-tuned run: scoring its weights again gives its numbers
        assert ember.evaluate(folder)["metrics"] == pytest.approx(own["metrics"])
    assert json.loads((run / "tasks" / "mine" / "task.json").read_text())["kind"] == "classify"
    assert json.loads((run / "tasks" / "mine" / "labels.json").read_text()) == ["negative", "positive"]
    # the shared model is stored once: the encoder under backbone.*, each head under heads.<task>.*
    from ember.runs.checkpoint import load_weights

    state = load_weights(run / "model.safetensors")
    assert {k.split(".")[1] for k in state if k.startswith("heads.")} == set(names)
    assert not any(".backbone." in k for k in state)
    assert result.metrics["average"] == pytest.approx(summary["average"])


def test_multitask_batches_hold_one_task_and_shares_are_logged(multitask_run):
    run, result, _ = multitask_run
    names = ["rte", "stsb", "mine"]
    train = [r for r in MetricsLogger.read(run / "metrics.jsonl") if r["split"] == "train"]
    steps = result.result["steps"]
    assert len(train) == steps
    per_step = [[n for n in names if f"{n}.loss" in r] for r in train]
    assert all(len(tasks) == 1 for tasks in per_step)  # one batch = one task
    counts = {n: sum(tasks == [n] for tasks in per_step) for n in names}
    last_eval = [r for r in MetricsLogger.read(run / "metrics.jsonl") if r["split"] == "eval"][-1]
    for n in names:
        own = result.result["tasks"][n]
        assert own["task_steps"] == counts[n] and own["share"] == pytest.approx(counts[n] / steps)
        assert last_eval[f"{n}.share"] == pytest.approx(counts[n] / steps)
    # temperature T=2 over 64 examples each: equal rates, as asked
    assert [result.result["tasks"][n]["rate"] for n in names] == pytest.approx([1 / 3] * 3)


def test_multitask_run_answers_every_task_in_evaluate_load_and_serve(multitask_run):
    run, result, _ = multitask_run
    scored = ember.evaluate(run)["tasks"]
    assert set(scored) == {"rte", "stsb", "mine"}
    assert scored["rte"]["metrics"] == pytest.approx(result.result["tasks"]["rte"]["metrics"])
    model = ember.load(run)
    one = ember.load(run / "tasks" / "rte").classify(TEXT, text_pair=PAIR)
    assert model.classify(TEXT, text_pair=PAIR, task="rte") == one
    assert "score" in model.classify(TEXT, text_pair=PAIR, task="stsb")
    with pytest.raises(EmberError, match="name the task"):
        model.classify(TEXT)
    with pytest.raises(EmberError, match="predict with one task's run folder"):
        ember.predict(run, run / "tasks" / "mine" / "labels.json")
    from fastapi.testclient import TestClient

    from ember.serve.app import create_app
    from ember.serve.predictor import load_predictor

    with TestClient(create_app(load_predictor(run))) as client:
        answer = client.post("/classify", json={"task": "rte", "text": TEXT, "text_pair": PAIR})
        assert answer.status_code == 200 and answer.json()["results"][0] == one
        missing = client.post("/classify", json={"text": TEXT})
        assert missing.status_code == 400 and "task" in missing.json()["error"]


def test_second_stage_finetunes_one_task_from_the_multitask_encoder(multitask_run, tmp_path):
    run, _, _ = multitask_run
    from ember.runs.checkpoint import load_weights

    out = tmp_path / "rte"
    # MT-DNN §4: the multi-task model's shared encoder, then one task further at a small lr
    result = ember.finetune("rte", out, init=str(run), train_limit=32, overrides=["train.warmup_ratio=0"],
                            **{**QUICK, "lr": 1e-5, "epochs": 1})
    assert result.result["init"] == str(run)
    shared = {k: v for k, v in load_weights(run / "model.safetensors").items() if k.startswith("backbone.")}
    tuned = load_weights(out / "model.safetensors")
    # 4 Adam steps at 1e-5 move a weight by at most ~4e-5; a fresh encoder differs by ~initializer_range
    worst = max(float((tuned[k] - v).abs().max()) for k, v in shared.items() if k in tuned)
    assert set(shared) <= set(tuned) and worst < 1e-3


def test_multitask_bad_input_is_refused_before_anything_is_written(multitask_run, tmp_path, capsys):
    _, _, tokenizer = multitask_run
    out = tmp_path / "never"
    common = dict(out=out, model="bert-tiny", tokenizer=str(tokenizer), train_limit=16, progress=False, max_length=48,
                  overrides=TINY_MODEL)
    cases = [
        (dict(tasks=["rte", "RTE"]), "names rte twice"),
        (dict(tasks=["rte", "stsb"], mixing_limit=0), "mixing_limit=0"),
        (dict(tasks=["rte", "mine=classify:train.csv"]), "NAME=KIND:TRAIN:DEV"),
        (dict(tasks=["rte", {"name": "mine", "kind": "classify", "train": "train.csv"}]), "mine has no dev file"),
        (dict(tasks=["rte", "stsb"], features=True), "single-task options"),
        (dict(tasks=["rte"]), "two tasks or more"),
    ]
    for kwargs, message in cases:
        with pytest.raises(EmberError, match=message) as error:
            ember.finetune(**{**common, **kwargs})
        assert "\n" not in str(error.value) and not out.exists()
    # the command line: one line on stderr, exit status 1
    from ember.cli import main

    capsys.readouterr()
    code = main(["finetune", "--tasks", "sst2,sst-2", "--model", "bert-tiny", "--tokenizer", str(tokenizer),
                 "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 1 and err.count("\n") == 0 and "names sst2 twice" in err and not out.exists()
    code = main(["finetune", "--task", "rte", "--tasks", "rte,stsb", "--out", str(out)])
    assert code == 1 and "--task NAME (one task) or --tasks" in capsys.readouterr().err and not out.exists()


def test_multitask_model_state_has_no_shared_tensors_and_round_trips(multitask_run):
    run, _, _ = multitask_run
    from ember.runs.checkpoint import load_weights

    state = load_weights(run / "model.safetensors")
    # the encoder once, a head per task: loaded into a fresh model of two of the tasks, every tensor comes back
    from ember.models import build_backbone
    from ember.tasks.base import get_adapter
    from ember.train.multitask import MultiTaskModel
    from ember.runs.folder import load_run_config

    cfg = load_run_config(run)
    backbone = build_backbone(cfg.model)
    module = MultiTaskModel({n: get_adapter(n).build_module(backbone, 0) for n in ("rte", "stsb")})
    partial = {k: v for k, v in state.items() if not k.startswith("heads.mine.")}
    module.load_state_dict(partial)
    assert all(torch.equal(module.state_dict()[k], v) for k, v in partial.items())
    with pytest.raises(RuntimeError, match="does not fit"):
        module.load_state_dict(state)  # a head this model does not have


def test_multitask_report_draws_every_tasks_dev_curve(multitask_run, tmp_path):
    run, result, _ = multitask_run
    from ember.experiments.run_report import write_report

    html = write_report(run, tmp_path / "report.html").read_text(encoding="utf-8")
    evals = [r for r in MetricsLogger.read(run / "metrics.jsonl") if r["split"] == "eval"]
    assert "<h2>Tasks: run</h2>" in html
    for name in ("rte", "stsb", "mine"):
        main = result.result["tasks"][name]["main_metric"]
        title = f"{name}: dev {main}"
        assert f">{title}<" in html  # one chart per task, titled by its main metric
        chart = html[html.index(f">{title}<"):].split("</svg>")[0]
        # every dev evaluation of the task is a point, its tooltip naming its step
        assert chart.count("<circle") == len(evals) == 2
        assert all(f" at {r['step']}</title>" in chart for r in evals)
    assert ">training loss per task<" in html
    # the run's own charts keep the shared curves; the per-task keys live in the tasks' charts
    assert ">average<" in html and ">rte.accuracy<" not in html
