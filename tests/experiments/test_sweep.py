"""`ember sweep` / ember.sweep: Optuna searches over fine-tuning and pre-training runs on real data
(SST-2 sentences, Wikipedia shards), resumed after a kill, shared by two processes, and refused
with one line for bad input."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from conftest import TINY_MODEL, make_wordpiece, real_data

import ember
from ember.cli import main
from ember.errors import EmberError

pytest.importorskip("optuna")
TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
TINY = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=64",
        "model.max_position=64", "train.num_threads=1"]


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def tok(tmp_path):
    path = tmp_path / "tokenizer.json"
    make_wordpiece([f"w{i}" for i in range(90)] + ["the", "a", "film", "good", "bad", "movie"]).save(str(path))
    return path


def sst2(tok, train_limit=48) -> dict:
    """A random 2 x 32 BERT on the first real SST-2 sentences: a trial takes seconds."""
    real_data("glue", "SST-2")
    return dict(task="sst2", init="random", model="bert-tiny", tokenizer=str(tok), train_limit=train_limit,
                epochs=2, max_length=32, overrides=TINY)


def study_trials(url: str, name: str):
    import optuna

    return optuna.load_study(study_name=name, storage=url).get_trials(deepcopy=False)


def test_bert_paper_grid_is_the_papers_eighteen_settings():
    from ember.experiments.sweep_space import search_space

    space = {p.key: p.choices for p in search_space("finetune", grid="bert-paper")}
    assert space == {"train.lr": (5e-5, 3e-5, 2e-5), "train.batch_size": (16, 32), "task.epochs": (2.0, 3.0, 4.0)}


@pytest.mark.parametrize("params, message", [
    ({"train.lrr": [1e-3]}, "no setting lrr in train (did you mean train.lr?)"),
    ({"data.mask_prob": [0.1]}, "finetune takes settings of train.*, task.*, model.*, knowledge.*"),
    ({"train.batch_size": "float:8:32"}, "whole-number setting; use int:LO:HI"),
    ({"train.lr": "int:1:3"}, "float setting; use float:LO:HI or log:LO:HI"),
    ({"train.schedule": "float:0:1"}, "is a str setting; a range needs a number setting"),
    ({"train.batch_size": "16,big"}, "expected a int, got 'big'"),
    ({"train.lr": "log:0:1e-3"}, "a log range needs LOW > 0"),
])
def test_sweep_refuses_a_bad_key_or_range_in_one_line_and_writes_nothing(tmp_path, tok, params, message):
    out = tmp_path / "sweep"
    with pytest.raises(EmberError, match=re.escape(message)):
        ember.sweep("finetune", out, params=params, **sst2(tok))
    assert not out.exists()


def test_sweep_cli_bad_input_is_one_line_and_nothing_written(tmp_path, tok, capsys):
    out = tmp_path / "sweep"
    common = ["sweep", "--out", str(out)]
    bad = [
        (["--param", "train.lrr=1e-3", "finetune", "--task", "sst2"], "no setting lrr in train"),
        (["--param", "train.lr=1e-3", "--storage", f"sqlite:///{tmp_path}/no/such/folder/s.db", "finetune",
          "--task", "sst2"], "cannot be reached"),
        (["--param", "train.lr=1e-3", "--storage", "postgresql://nobody@127.0.0.1:1/none", "finetune",
          "--task", "sst2"], "cannot be reached"),
        (["--param", "train.lr=1e-3", "finetune", "--task", "sst2", "--eval-split", "test"], "would choose on test"),
        (["--param", "train.lr=log:1e-5:1e-3", "--sampler", "grid", "finetune", "--task", "sst2"],
         "a grid takes lists of values"),
        (["--param", "train.lr=1e-3", "finetune", "--task", "sst2", "--set", "train.lr=2e-3"], "also searched"),
        # a command that cannot run: its first trial fails, the sweep stops there and leaves nothing
        (["--param", "train.lr=1e-3", "finetune", "--task", "sst2", "--init", str(tmp_path / "missing")],
         "the first trial failed: "),
    ]
    for args, message in bad:
        assert main(common + args) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("ember sweep: error: ") and message in err, err
        assert not out.exists()
    # A folder another command's sweep made, and a run folder, are refused as such.
    out.mkdir()
    (out / "sweep.json").write_text(json.dumps({"command": "pretrain"}))
    assert main(common + ["--param", "train.lr=1e-3", "finetune", "--task", "sst2"]) == 1
    assert "is a sweep of `ember pretrain`, not of finetune" in capsys.readouterr().err
    (out / "sweep.json").unlink()
    (out / "config.yaml").write_text("kind: finetune\n")
    assert main(common + ["--param", "train.lr=1e-3", "finetune", "--task", "sst2"]) == 1
    assert "holds a run folder, not a sweep" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml"]


def test_finetune_grid_sweep_runs_each_point_once_reports_dev_curves_and_links_the_best(tmp_path, tok):
    out = tmp_path / "sweep"
    params = {"train.lr": [1e-3, 3e-3], "train.batch_size": [16]}
    result = ember.sweep("finetune", out, params=params, **sst2(tok))
    summary = json.loads((out / "results.json").read_text())
    assert summary["metric"] == "accuracy" and summary["direction"] == "maximize" and summary["sampler"] == "grid"
    assert sorted(r["params"]["train.lr"] for r in summary["trials"]) == [1e-3, 3e-3]
    for r in summary["trials"]:
        run = out / r["run_dir"]
        results = json.loads((run / "results.json").read_text())
        assert r["state"] == "complete" and r["value"] == results["metrics"]["accuracy"]
        # the searched settings reached the run, and the pruner saw one dev value per epoch
        config = yaml.safe_load((run / "config.yaml").read_text())
        assert config["train"]["lr"] == r["params"]["train.lr"] and config["train"]["batch_size"] == 16
        evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert r["dev_curve"] == [e["accuracy"] for e in evals if e["split"] == "eval"] and len(r["dev_curve"]) == 2
        # an ended trial keeps its weights, not its training state (no trial resumes another)
        assert (run / "model.safetensors").is_file() and not (run / "checkpoints").exists()
        from ember.experiments.run_report import summarize
        from ember.interop.model_card import _trainer_state

        assert _trainer_state(run)["step"] == summarize(run, "t")["steps"] > 0
    best = max(summary["trials"], key=lambda r: r["value"])
    assert summary["best"]["trial"] == best["trial"] and (out / "best").resolve() == (out / best["run_dir"]).resolve()
    assert result.run_dir.resolve() == (out / "best").resolve() and result.metrics == best["metrics"]
    html = (out / "report.html").read_text()
    # history and parallel coordinates always; parameter importance needs the trials to differ (tiny
    # models from a 100-word vocabulary often all predict the majority class), else the page says why
    if len({r["value"] for r in summary["trials"]}) > 1:
        assert html.count("data:image/png;base64,") == 3
    else:
        assert html.count("data:image/png;base64,") == 2 and "not drawn: Encountered zero total variance" in html
    assert len((out / "results.tsv").read_text().splitlines()) == 3
    from ember.experiments.run_report import find_runs

    assert len(find_runs(out)) == 2  # `ember report SWEEP`: each trial once, not again through best
    # The same call again finds the study finished: no trial is run twice.
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("trials/*/results.json")}
    ember.sweep("finetune", out, params=params, **sst2(tok))
    assert {p: p.stat().st_mtime_ns for p in out.glob("trials/*/results.json")} == stamps
    with pytest.raises(EmberError, match="holds a sweep with other settings"):
        ember.sweep("finetune", out, params={"train.lr": [1e-3]}, **sst2(tok))
    # Distillation sweeps the same way, the best trial as its teacher; its objective is the task's metric
    distilled = ember.sweep("distill", tmp_path / "kd", params={"train.lr": [1e-3]}, method="kd",
                            teacher=str(out / "best"), unlabeled=["task"], student_layers=1, train_limit=32,
                            max_unlabeled=32, epochs=1,
                            overrides=["train.num_threads=1"]).summary
    assert distilled["metric"] == "accuracy" and distilled["finished"] == 1
    kd = json.loads((tmp_path / "kd" / distilled["best"]["run_dir"] / "results.json").read_text())
    assert kd["method"] == "kd" and distilled["best"]["value"] == kd["metrics"]["accuracy"]


def test_mrpc_sweep_chooses_on_dev_and_reports_the_best_trials_test(tmp_path, tok, capsys):
    """MRPC has a labelled test split: every trial scores it with its best-on-dev weights; the objective
    and the choice of the best trial stay dev F1, the best trial's test figures are reported beside it."""
    real_data("glue", "MRPC", "test.tsv")
    out = tmp_path / "sweep"
    ember.sweep("finetune", out, params={"train.lr": [1e-3, 3e-3]}, task="mrpc", init="random", model="bert-tiny",
                tokenizer=str(tok), train_limit=32, epochs=1, max_length=32, overrides=TINY)
    summary = json.loads((out / "results.json").read_text())
    assert summary["metric"] == "f1"
    for r in summary["trials"]:
        results = json.loads((out / r["run_dir"] / "results.json").read_text())
        assert r["value"] == results["metrics"]["f1"] and r["other_splits"] == results["other_splits"]
    best = summary["best"]
    assert best["value"] == max(r["value"] for r in summary["trials"])  # chosen on dev only
    test = json.loads((out / "best" / "results.json").read_text())["other_splits"]["test"]
    assert best["other_splits"] == {"test": test} and {"f1", "accuracy"} <= set(test)
    html = (out / "report.html").read_text()
    assert "with its best-on-dev weights, test: " in html and f"f1 {test['f1']:.4g}" in html
    printed = capsys.readouterr().out
    assert "best trial on test, with its best-on-dev weights (not used to choose): " in printed
    assert f"f1 {test['f1']:.4g}" in printed.split("best trial on test")[-1]


def test_pretrain_sweep_prunes_trials_whose_dev_loss_is_above_the_median(wiki_prepared, tmp_path):
    out = tmp_path / "sweep"
    from optuna.samplers import GridSampler

    fixed = TINY_MODEL + ["train.max_steps=20", "train.eval_every=10", "train.save_every=20", "train.log_every=10",
                          "train.batch_size=16", "train.warmup_ratio=0.1", "train.num_threads=1"]
    # A learning rate that learns and one that leaves the random init as it is, two seeds each. The
    # sampler's seed is chosen so a learning trial runs first (Optuna's grid takes its points in a
    # seeded shuffle): every frozen trial after it is above the median dev loss at its first evaluation.
    params = {"train.lr": [2e-3, 1e-9], "train.seed": [1, 2]}
    seed = next(s for s in range(50) if dict(zip(GridSampler(params, seed=s)._param_names,
                                                 GridSampler(params, seed=s)._all_grids[0]))["train.lr"] == 2e-3)
    summary = ember.sweep("pretrain", out, params=params, prune_after=1, seed=seed, recipe="bert-mini",
                          data=str(wiki_prepared), overrides=fixed).summary
    assert summary["metric"] == "loss" and summary["direction"] == "minimize"
    pruned = [r for r in summary["trials"] if r["state"] == "pruned"]
    assert pruned and all(r["params"]["train.lr"] == 1e-9 for r in pruned)
    assert all(len(r["dev_curve"]) == 1 for r in pruned)  # stopped at its first evaluation, not run to the end
    assert summary["best"]["params"]["train.lr"] == 2e-3


SCRIPT = """
import sys, json
sys.path.insert(0, {tests!r})
import ember
kwargs = json.loads({kwargs!r})
ember.sweep("finetune", sys.argv[1], **kwargs)
"""


def sweep_process(out: Path, kwargs: dict | None = None, argv: list[str] | None = None) -> subprocess.Popen:
    """`ember.sweep(**kwargs)` in a process of its own, or `ember sweep ARGV`."""
    command = ["-c", SCRIPT.format(tests=str(TESTS), kwargs=json.dumps(kwargs)), str(out)] if argv is None \
        else ["-m", "ember", *argv]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, *command], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)


def sst2_argv(out: Path, tok: Path, *sweep_options: str) -> list[str]:
    """`ember sweep` over `ember finetune` on the same tiny SST-2 runs as ``sst2``."""
    real_data("glue", "SST-2")
    sets = [a for item in TINY for a in ("--set", item)]
    return ["sweep", "--out", str(out), *sweep_options, "--", "finetune", "--task", "sst2", "--init", "random",
            "--model", "bert-tiny", "--tokenizer", str(tok), "--train-limit", "96", "--epochs", "2",
            "--max-length", "32", "--no-progress", *sets]


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(f"the sweep ended before {path.name}: {proc.stderr.read()[-2000:]}")
        if time.time() > deadline:
            proc.kill()
            pytest.fail(f"no {path} in {timeout} s")
        time.sleep(0.005)


def test_sweep_resume_after_kill_skips_finished_trials(tmp_path, tok):
    out = tmp_path / "sweep"
    argv = sst2_argv(out, tok, "--param", "train.lr=1e-3,2e-3,3e-3")  # the command line, end to end

    def kill_during(trial: int) -> None:
        proc = sweep_process(out, argv=argv)
        wait_for(out / "trials" / f"trial-{trial:04d}" / "config.yaml", proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    kill_during(1)  # trial 0 done, trial 1 training
    url = f"sqlite:///{(out / 'study.db').resolve()}"
    before = {t.number: t for t in study_trials(url, "sweep") if t.state.name == "COMPLETE"}
    assert 0 in before and not (out / "trials" / "trial-0001" / "results.json").exists()  # killed mid-trial
    stamp = (out / "trials" / "trial-0000" / "results.json").stat().st_mtime_ns
    kill_during(2)  # the second start runs trial 1's settings again first, as trial 2: killed too
    assert main(argv) == 0  # the same command again resumes
    summary = json.loads((out / "results.json").read_text())
    trials = study_trials(url, "sweep")
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    # every grid point once, even the one killed twice; the finished ones kept as they were
    assert sorted(t.params["train.lr"] for t in complete) == [1e-3, 2e-3, 3e-3]
    assert all(t.value == before[n].value for n, t in ((t.number, t) for t in complete) if n in before)
    assert (out / "trials" / "trial-0000" / "results.json").stat().st_mtime_ns == stamp
    killed = [t for t in trials if t.number in (1, 2)]
    assert all(t.state.name == "FAIL" and t.user_attrs["interrupted"] for t in killed)
    assert killed[0].params == killed[1].params
    retry = next(r for r in summary["trials"] if r["retry_of"] == 1 and r["state"] == "complete")
    assert retry["params"] == dict(killed[0].params)
    # the retry that finished is not marked interrupted (it inherits its original's attributes)
    assert not next(t for t in trials if t.number == retry["trial"]).user_attrs["interrupted"]
    assert summary["finished"] == 3 and summary["interrupted"] == 2
    assert [r["state"] for r in summary["trials"] if r["trial"] in (1, 2)] == ["interrupted", "interrupted"]


def test_a_trial_stopped_by_a_full_disk_is_run_again_on_the_next_start(tmp_path):
    import errno

    from ember.experiments.sweep import run_sweep
    from ember.experiments.sweep_space import search_space

    space, calls = search_space("finetune", {"train.lr": [1e-3, 2e-3]}), []

    def runner(run_dir: Path, overrides: list[str]) -> None:  # the second trial finds the disk full
        calls.append(overrides)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(run_dir / "model.safetensors"))
        run_dir.mkdir(parents=True, exist_ok=True)
        lr = float(overrides[0].split("=")[1])
        (run_dir / "results.json").write_text(json.dumps({"main_metric": "accuracy", "metrics": {"accuracy": lr}}))

    kwargs = dict(record_run={"task": "stand-in"}, fixed_overrides=[])
    with pytest.raises(OSError, match="No space left"):
        run_sweep("finetune", tmp_path / "sweep", runner, space, **kwargs)
    summary = run_sweep("finetune", tmp_path / "sweep", runner, space, **kwargs)  # the disk freed: same call
    assert sorted(r["params"]["train.lr"] for r in summary["trials"] if r["state"] == "complete") == [1e-3, 2e-3]
    assert [r["state"] for r in summary["trials"] if r["trial"] == 1] == ["interrupted"]


def test_two_processes_run_trials_of_one_study_through_a_shared_storage_url(tmp_path, tok):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    kwargs = {**sst2(tok), "params": {"train.lr": [1e-3, 2e-3], "train.seed": [1]}, "storage": url,
              "study": "shared", "prune": False}
    other = sweep_process(tmp_path / "machine-a", kwargs)
    wait_for(tmp_path / "machine-a" / "trials" / "trial-0000" / "config.yaml", other)
    ember.sweep("finetune", tmp_path / "machine-b", **kwargs)
    assert other.wait(timeout=180) == 0, other.stderr.read()[-2000:]
    trials = study_trials(url, "shared")
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    # each grid point once (both processes number the grid alike), none run twice
    assert sorted(t.params["train.lr"] for t in complete) == [1e-3, 2e-3], [(t.number, t.params) for t in trials]
    assert len({t.user_attrs["pid"] for t in complete}) == 2  # both processes ran trials
    for t in complete:  # each trial's run folder is where the process that ran it put it
        assert (Path(t.user_attrs["run_dir"]) / "results.json").is_file()


def test_sweep_needs_optuna_says_how_to_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_optuna(name, *args, **kwargs):
        if name == "optuna":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_optuna)
    from ember.experiments.sweep import need_optuna

    with pytest.raises(EmberError, match=r"pip install 'ember\[sweep\]'"):
        need_optuna()


def test_import_ember_stays_light():
    code = "import ember, sys; print(sorted(m for m in ('torch', 'optuna', 'mlflow') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True).stdout
    assert out.strip() == "[]"


def test_sweep_help_lists_the_grids():
    out = subprocess.run([sys.executable, "-m", "ember", "sweep", "--help"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True).stdout
    assert "bert-paper" in out and "--param" in out and "--keep-checkpoints" in out


def test_an_ended_trials_checkpoints_are_removed_unless_asked_to_keep_them(tmp_path):
    from ember.experiments.sweep import run_sweep
    from ember.experiments.sweep_space import search_space

    space = search_space("finetune", {"train.lr": [1e-3, 2e-3]})

    def runner(run_dir: Path, overrides: list[str]) -> None:  # a run with a checkpoint and final weights
        for step in (1, 2):
            (run_dir / "checkpoints" / f"step-{step:08d}").mkdir(parents=True)
            (run_dir / "checkpoints" / f"step-{step:08d}" / "optimizer.pt").write_bytes(b"state")
            (run_dir / "checkpoints" / f"step-{step:08d}" / "trainer_state.json").write_text(json.dumps({"step": step}))
        (run_dir / "model.safetensors").write_bytes(b"weights")
        lr = float(overrides[0].split("=")[1])
        (run_dir / "results.json").write_text(json.dumps({"main_metric": "accuracy", "metrics": {"accuracy": lr}}))

    kwargs = dict(record_run={"task": "stand-in"}, fixed_overrides=[])
    run_sweep("finetune", tmp_path / "dropped", runner, space, **kwargs)
    trials = sorted((tmp_path / "dropped" / "trials").iterdir())
    assert len(trials) == 2 and all((t / "model.safetensors").is_file() and not (t / "checkpoints").exists()
                                    for t in trials)
    # the newest checkpoint's trainer state stays, for the report and the model card
    assert [json.loads((t / "trainer_state.json").read_text()) for t in trials] == [{"step": 2}, {"step": 2}]
    run_sweep("finetune", tmp_path / "kept", runner, space, keep_checkpoints=True, **kwargs)
    assert all((t / "checkpoints" / "step-00000001" / "optimizer.pt").is_file()
               for t in (tmp_path / "kept" / "trials").iterdir())
