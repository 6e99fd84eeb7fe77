"""train.trackers=tensorboard,mlflow: a fine-tuning run and a sweep's trials read back from a local
MLflow store through MlflowClient (params, per-step metrics, artifacts, the final model, child runs)."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import make_wordpiece, real_data

import ember
from ember.errors import EmberError

pytest.importorskip("mlflow")
pytest.importorskip("optuna")
TINY = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=64",
        "model.max_position=64", "train.num_threads=1"]


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_sweep_trials_are_mlflow_child_runs_with_params_step_metrics_artifacts_and_model(tmp_path):
    from mlflow import MlflowClient

    real_data("glue", "SST-2")
    tok = tmp_path / "tokenizer.json"
    make_wordpiece([f"w{i}" for i in range(90)] + ["the", "a", "film", "good", "bad"]).save(str(tok))
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    (tmp_path / "store").mkdir()
    tracking = ["train.trackers=tensorboard,mlflow", f"train.tracking_uri={uri}", "train.experiment=sst2-sweep",
                "train.log_every=1"]
    out = tmp_path / "sweep"
    summary = ember.sweep("finetune", out, params={"train.lr": [1e-3, 3e-3]}, task="sst2", init="random",
                          model="bert-tiny", tokenizer=str(tok), train_limit=48, epochs=2, max_length=32,
                          overrides=TINY + tracking).summary
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("sst2-sweep")
    runs = client.search_runs([experiment.experiment_id])
    parent = next(r for r in runs if "ember.sweep" in r.data.tags)
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(runs) == 3 and len(children) == 2
    best = summary["best"]
    assert parent.data.metrics["best/accuracy"] == pytest.approx(best["value"])
    assert parent.info.status == "FINISHED"
    for trial in summary["trials"]:
        run_dir = out / trial["run_dir"]
        run = next(r for r in children if r.data.tags["ember.run_dir"] == str(run_dir))
        assert run.info.status == "FINISHED" and run.info.run_name == run_dir.name
        # every setting of config.yaml is a param; the searched one as the trial had it
        assert float(run.data.params["train.lr"]) == trial["params"]["train.lr"]
        assert run.data.params["task.name"] == "sst2" and run.data.params["model.hidden_size"] == "32"
        # per-step training metrics at their steps, the dev curve, the final metrics from results.json
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        losses = client.get_metric_history(run.info.run_id, "train/loss")
        assert [(m.step, m.value) for m in losses] == [(r["step"], pytest.approx(r["loss"]))
                                                      for r in records if r["split"] == "train"]
        assert len(client.get_metric_history(run.info.run_id, "eval/accuracy")) == 2
        results = json.loads((run_dir / "results.json").read_text())
        assert run.data.metrics["final/accuracy"] == pytest.approx(results["metrics"]["accuracy"])
        # the run folder's files, the final weights among them, byte for byte
        names = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"model.safetensors", "config.yaml", "results.json", "metrics.jsonl", "tokenizer.json"} <= names
        assert "checkpoints" not in names
        local = client.download_artifacts(run.info.run_id, "model.safetensors", str(tmp_path / trial["run_dir"][-10:]))
        assert open(local, "rb").read() == (run_dir / "model.safetensors").read_bytes()
    assert (tmp_path / "store" / "mlruns").is_dir()  # artifacts beside the SQLite store, not in the working folder


def test_unknown_tracker_is_one_line_before_any_run_folder(tmp_path):
    real_data("glue", "SST-2")
    tok = tmp_path / "tokenizer.json"
    make_wordpiece(["the", "a"]).save(str(tok))
    with pytest.raises(EmberError, match="train.trackers=tensorboard,comet: unknown tracker 'comet'"):
        ember.finetune("sst2", tmp_path / "run", init="random", model="bert-tiny", tokenizer=str(tok), train_limit=8,
                       epochs=1, overrides=TINY + ["train.trackers=tensorboard,comet"], progress=False)
    assert not (tmp_path / "run").exists()


def test_multitask_run_ends_its_mlflow_run_with_every_tasks_final_metrics(tmp_path):
    """A multi-task run's results.json holds one block per task, not one "metrics": the tracker's
    run still ends FINISHED with each task's final dev metrics and the average, as ember.finetune
    returns them."""
    from mlflow import MlflowClient

    from multitask_helpers import TINY_MODEL, glue_tokenizer

    real_data("glue", "RTE")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = tmp_path / "multi"
    result = ember.finetune(tasks=["sst2", "rte"], out=run, model="bert-tiny", tokenizer=str(glue_tokenizer(tmp_path / "tokenizer.json")),
                            train_limit=32, max_length=32, epochs=1, seed=1, progress=False,
                            overrides=TINY_MODEL + ["train.trackers=tensorboard,mlflow", f"train.tracking_uri={uri}"])
    client = MlflowClient(uri)
    (tracked,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert tracked.info.status == "FINISHED"
    results = json.loads((run / "results.json").read_text())
    assert tracked.data.metrics["final/average"] == pytest.approx(results["average"])
    for task in ("sst2", "rte"):
        assert tracked.data.metrics[f"final/{task}.accuracy"] == pytest.approx(results["tasks"][task]["metrics"]["accuracy"])
    assert tracked.data.metrics["final/rte.accuracy"] == pytest.approx(result.metrics["rte.accuracy"])
