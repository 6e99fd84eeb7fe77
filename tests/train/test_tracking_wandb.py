"""train.trackers=wandb: an offline Weights & Biases run, read back from its own .wandb files (the
config, every metrics.jsonl value at its step, the final metrics), continued by --resume, and a
sweep's trials grouped under the sweep. No test reaches the network: the W&B server address points
at a closed local port and WANDB_MODE=online is set in the environment, which ember must override."""

from __future__ import annotations

import json
import signal
import struct

import pytest
import torch
import yaml

from conftest import make_wordpiece, real_data

import ember
from ember.errors import EmberError

wandb = pytest.importorskip("wandb")
TINY = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=64",
        "model.max_position=64", "train.num_threads=1", "train.log_every=1"]


@pytest.fixture(autouse=True)
def offline_one_thread(monkeypatch):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setenv("WANDB_MODE", "online")  # a stray shell setting: the run must stay offline regardless
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # were anything sent, it would go nowhere
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    yield
    wandb.teardown()  # stop wandb's service process, so none outlives the test
    torch.set_num_threads(before)


def wandb_records(path):
    """The protobuf records of a .wandb file: W&B's 7-byte header (":W&B", magic, version), then
    LevelDB's log format (32 KiB blocks; each chunk a 7-byte header: CRC32, length, type FULL=1 /
    FIRST=2 / MIDDLE=3 / LAST=4), each record a wandb_internal Record. wandb 0.31 has no Python
    reader of its own (its Go core writes and syncs these files)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, chunks = 7, []
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if left < 7 or (n == 0 and kind == 0):  # a block's zero-filled tail
            pos += left
            continue
        chunks.append(data[pos + 7:pos + 7 + n])
        pos += 7 + n
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(chunks))
            chunks = []
            yield record


def read_offline_run(run_dir):
    """One W&B run (all its offline segments, in order) as run records, history by step and summary."""
    # run.finish() returns once the run's exit is acknowledged, but it only *tells* wandb's service that
    # the stream is done (a message it does not wait on); the service closes the .wandb file afterwards.
    # Under a loaded CI a read straight after finish once found the file without its run record, so
    # stop the service first: teardown returns when it has exited, every file closed.
    wandb.teardown()
    run_id = json.loads((run_dir / "wandb.json").read_text())["id"]
    files = sorted(run_dir.glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb"))
    runs, history, summary = [], {}, {}
    for path in files:
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                runs.append(record.run)
            elif kind == "history":
                row = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
                history.setdefault(row["_step"], {}).update(row)
            elif kind == "summary":
                summary.update({"/".join(u.nested_key) or u.key: json.loads(u.value_json)
                                for u in record.summary.update})
    return run_id, files, runs, history, summary


def test_finetune_wandb_offline_run_has_config_step_metrics_final_and_resume_continues_it(tmp_path):
    from ember.train.logging import evaluations_to
    from ember.train.loop import TrainingInterrupted

    real_data("glue", "SST-2")
    tok = tmp_path / "tokenizer.json"
    make_wordpiece([f"w{i}" for i in range(90)] + ["the", "a", "film", "good", "bad"]).save(str(tok))
    run = tmp_path / "run"
    args = dict(init="random", model="bert-tiny", tokenizer=str(tok), train_limit=48, epochs=2, max_length=32,
                overrides=TINY + ["train.trackers=wandb", "train.wandb_project=sst2-tiny"], progress=False)
    stops = []

    def stop_after_first_evaluation(run_dir, step, metrics, main_metric):  # as Ctrl-C would, mid-run
        if not stops:
            stops.append(step)
            signal.raise_signal(signal.SIGINT)

    with evaluations_to(stop_after_first_evaluation), pytest.raises(TrainingInterrupted):
        ember.finetune("sst2", run, **args)
    first_id = json.loads((run / "wandb.json").read_text())["id"]
    ember.finetune("sst2", run, resume=True, **args)
    run_id, files, runs, history, summary = read_offline_run(run)
    # --resume continued the same W&B run: two offline segments of one id, `wandb sync` joins them
    assert run_id == first_id and len(files) == 2 and {r.run_id for r in runs} == {run_id}
    assert [r.resume for r in runs] == [False, True]  # the second part says it continues the run
    assert {(r.project, r.display_name) for r in runs} == {("sst2-tiny", "run")}
    # the config is config.yaml's, section by section
    config = {u.key: json.loads(u.value_json) for u in runs[0].config.update if u.key != "_wandb"}
    assert config == yaml.safe_load((run / "config.yaml").read_text())
    # every metrics.jsonl value at its step, train and eval alike, the same float
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    splits = {r["split"] for r in records}
    assert {"train", "eval"} <= splits and stops[0] < max(r["step"] for r in records)
    logged = {(r["step"], f"{r['split']}/{k}"): v for r in records for k, v in r.items()
              if k not in ("step", "split", "elapsed")}
    assert {key: history[key[0]][key[1]] for key in logged} == logged
    results = json.loads((run / "results.json").read_text())
    assert summary["final/accuracy"] == results["metrics"]["accuracy"]
    assert not (run / "wandb" / "debug-internal.log").exists() or "127.0.0.1:9" not in \
        (run / "wandb" / "debug-internal.log").read_text()


def test_pretrain_wandb_run_has_every_step_and_the_last_evaluation_as_final(wiki_prepared, tmp_path):
    # a corpus-level run has no results.json: its final metrics are its last held-out evaluation
    from ember.runs.folder import last_evaluation

    run = tmp_path / "bert"
    ember.pretrain("bert-mini", run, wiki_prepared, TINY + [
        "model.max_position=128", "train.max_steps=6", "train.eval_every=3", "train.save_every=6", "train.batch_size=8",
        "train.trackers=wandb", "train.wandb_name=tiny-bert", f"train.wandb_dir={tmp_path / 'wandb-runs'}"],
        progress=False)
    record = json.loads((run / "wandb.json").read_text())
    assert record["mode"] == "offline" and not (run / "wandb").exists()
    (tmp_path / "wandb-runs" / "wandb").rename(run / "wandb")  # where read_offline_run looks
    _, files, runs, history, summary = read_offline_run(run)
    assert len(files) == 1 and runs[0].display_name == "tiny-bert"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in records if r["split"] == "train"}) == list(range(1, 7))
    logged = {(r["step"], f"{r['split']}/{k}"): v for r in records for k, v in r.items()
              if k not in ("step", "split", "elapsed")}
    assert {key: history[key[0]][key[1]] for key in logged} == logged
    final = last_evaluation(run)
    assert final and {f"final/{k}": v for k, v in final.items()} == \
        {k: v for k, v in summary.items() if k.startswith("final/")}


def test_sweep_trials_are_offline_wandb_runs_in_the_sweeps_group(tmp_path):
    pytest.importorskip("optuna")
    real_data("glue", "SST-2")
    tok = tmp_path / "tokenizer.json"
    make_wordpiece([f"w{i}" for i in range(90)] + ["the", "a", "film", "good", "bad"]).save(str(tok))
    out = tmp_path / "rte-grid"
    summary = ember.sweep("finetune", out, params={"train.lr": [1e-3, 3e-3]}, task="sst2", init="random",
                          model="bert-tiny", tokenizer=str(tok), train_limit=32, epochs=1, max_length=32,
                          overrides=TINY + ["train.trackers=tensorboard,wandb"]).summary
    ids = set()
    for trial in summary["trials"]:
        run_dir = out / trial["run_dir"]
        run_id, _, runs, _, summary_ = read_offline_run(run_dir)
        ids.add(run_id)
        assert {(r.run_group, r.display_name, r.project) for r in runs} == {("rte-grid", run_dir.name, "ember")}
        config = {u.key: json.loads(u.value_json) for u in runs[0].config.update}
        assert config["train"]["lr"] == trial["params"]["train.lr"]
        assert summary_["final/accuracy"] == trial["metrics"]["accuracy"]
    assert len(ids) == 2  # a run each


def test_wandb_missing_or_unknown_mode_is_one_line_before_any_run_folder(tmp_path, monkeypatch):
    real_data("glue", "SST-2")
    tok = tmp_path / "tokenizer.json"
    make_wordpiece(["the", "a"]).save(str(tok))
    args = dict(init="random", model="bert-tiny", tokenizer=str(tok), train_limit=8, epochs=1, progress=False)
    with pytest.raises(EmberError, match="train.wandb_mode='cloud': choose offline"):
        ember.finetune("sst2", tmp_path / "run", overrides=TINY + ["train.trackers=wandb", "train.wandb_mode=cloud"],
                       **args)
    monkeypatch.setitem(__import__("sys").modules, "wandb", None)  # as if not installed
    with pytest.raises(EmberError, match=r"train.trackers=wandb needs Weights & Biases: pip install wandb"):
        ember.finetune("sst2", tmp_path / "run", overrides=TINY + ["train.trackers=wandb"], **args)
    assert not (tmp_path / "run").exists()


def test_empty_tracker_setting_is_empty_not_none():
    # `--set train.trackers=` (metrics.jsonl only) and `--set train.wandb_dir=` (the run folder) are YAML
    # nulls; read as the string "None" they named an unknown tracker and a folder called None
    from ember.config import apply_overrides, run_config_from_dict
    from ember.train.tracking import check_trackers

    train = run_config_from_dict(apply_overrides({}, ["train.trackers=", "train.wandb_dir="])).train
    assert (train.trackers, train.wandb_dir) == ("", "")
    check_trackers(train.trackers)
