"""`ember sweep` / ``ember.sweep``: a hyper-parameter search over a training command, with Optuna.

The search itself is Optuna's (samplers, the median pruner, the study in an RDB); ember adds what
a training run needs around it:

* each trial is a run folder ``SWEEP/trials/trial-NNNN`` written by the command itself
  (``ember.finetune`` / ``pretrain`` / ``distill``), with the searched settings as ``--set``
  overrides, so any trial can be evaluated, exported or served like a run;
* the objective is what the run chose its best weights by: the task's official metric on dev
  (results.json's ``main_metric``; pre-training: the held-out loss), never a test split;
* each dev evaluation is reported to the pruner (``ember.train.logging.evaluations_to``), by its
  index (epoch 1, 2, ...) so runs of different batch sizes compare at the same epoch;
* the study lives in ``SWEEP/study.db`` (SQLite) unless ``storage`` names an RDB, which several
  processes or machines can share. A trial whose process died (a kill, a lost machine: seen by its
  pid on this host, or Optuna's heartbeat elsewhere) or that was interrupted is run again with the
  same settings on the next start; finished trials are never rerun.

SWEEP/sweep.json records what the sweep runs, so a later start with another command or another
space is refused instead of mixing two searches in one study.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import time
import warnings
from pathlib import Path
from typing import Callable

from ember.errors import EmberError
from ember.experiments.sweep_space import Param, check_fixed_overrides
from ember.fileio import atomic_write_text

SWEEP_FILE = "sweep.json"
STUDY_FILE = "study.db"
SAMPLERS = ("grid", "random", "tpe")
# Optuna's heartbeat for trials run elsewhere (another machine on a shared RDB): a trial silent for
# the grace period is failed and retried once by whoever starts the next trial.
HEARTBEAT_SECONDS, GRACE_SECONDS = 60, 300


def need_optuna():
    try:
        import optuna
    except ImportError:
        raise EmberError("ember sweep needs Optuna: pip install 'ember[sweep]'") from None
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # a failed trial is ember's own line ("[sweep] trial N failed")
    return optuna


def metric_direction(metric: str) -> str:
    """Losses, perplexities and errors fall as a run improves; every task metric here rises."""
    low = metric.lower()
    return "minimize" if any(w in low for w in ("loss", "perplexity", "ppl", "error")) else "maximize"


def default_storage(out: Path) -> str:
    return f"sqlite:///{(out / STUDY_FILE).resolve()}"


def open_storage(url: str, optuna):
    """An RDBStorage on ``url``; one line when it cannot be reached (nothing else written yet)."""
    from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback

    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}  # two writers on one file wait
    try:
        with warnings.catch_warnings():  # the heartbeat is "experimental" in Optuna since 2.9; it is the mechanism
            warnings.simplefilter("ignore", category=optuna.exceptions.ExperimentalWarning)
            return RDBStorage(url, engine_kwargs=kwargs, heartbeat_interval=HEARTBEAT_SECONDS,
                              grace_period=GRACE_SECONDS,
                              heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=None))
    except Exception as exc:  # SQLAlchemy's errors (no driver, no server, no such folder) all mean the same here
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EmberError(f"--storage {url}: cannot be reached ({reason[:200]})") from None


def check_folder(out: Path, record: dict) -> bool:
    """True when ``out`` holds this very sweep (resume); refuse a folder that holds anything else."""
    if out.exists() and not out.is_dir():
        raise EmberError(f"--out {out} is a file; name a folder for the sweep")
    saved_path = out / SWEEP_FILE
    if saved_path.is_file():
        saved = json.loads(saved_path.read_text(encoding="utf-8"))
        if saved.get("command") != record["command"]:
            raise EmberError(f"{out} is a sweep of `ember {saved.get('command')}`, not of {record['command']}; "
                             "choose another --out")
        changed = [k for k in ("run", "space", "sampler", "metric", "direction", "study")
                   if saved.get(k) != record[k]]
        if changed:
            raise EmberError(f"{out} holds a sweep with other settings ({', '.join(changed)}); resume it with the "
                             "same command, or choose another --out")
        return True
    if out.is_dir() and any(out.iterdir()):
        what = "a run folder" if (out / "config.yaml").is_file() else "other files"
        raise EmberError(f"{out} holds {what}, not a sweep (no {SWEEP_FILE}); choose another --out")
    return False


class DevCurve:
    """Reports each dev evaluation of the trial's run (the first seed's, when it runs several) to
    the pruner and stops the run when the pruner says so."""

    def __init__(self, trial, run_dir: Path, metric: str | None, prune: bool, optuna) -> None:
        self.trial, self.run_dir, self.metric, self.prune, self.optuna = trial, run_dir.resolve(), metric, prune, optuna
        self.watched: Path | None = None
        self.index = 0

    def __call__(self, run_dir: Path, step: int, metrics: dict, main_metric: str | None) -> None:
        run_dir = run_dir.resolve()
        if run_dir != self.run_dir and self.run_dir not in run_dir.parents:
            return
        if self.watched is None:
            self.watched = run_dir
        name = self.metric or main_metric or "loss"  # no main metric: a corpus-level run's held-out loss
        if run_dir != self.watched or name not in metrics:
            return
        self.index += 1
        self.trial.report(float(metrics[name]), self.index)
        if self.prune and self.trial.should_prune():
            raise self.optuna.TrialPruned(f"pruned at dev evaluation {self.index} (step {step})")


def trial_value(run_dir: Path, metric: str | None) -> tuple[str, float, dict]:
    """(metric name, the objective, the run's results) from what the finished trial wrote."""
    from ember.runs.folder import last_evaluation

    results = _read_json(run_dir / "results.json")
    summary = _read_json(run_dir / "summary.json")  # several seeds: their mean is the objective
    if summary:
        name = metric or _read_json(next(iter(sorted(run_dir.glob("seed-*/results.json"))), run_dir / "none"))\
            .get("main_metric")
        stats = summary.get("metrics", {})
        if name not in stats:
            raise EmberError(f"metric {name!r} is not among the trial's dev metrics ({', '.join(stats)})")
        means = {k: s["mean"] for k, s in stats.items()}
        others = {split: {k: s["mean"] for k, s in m.items()} for split, m in summary.get("other_splits", {}).items()}
        return name, float(means[name]), {"metrics": means, **({"other_splits": others} if others else {})}
    if results:
        name = metric or results.get("main_metric")
        values = results.get("metrics", {})
    else:  # pre-training: the last held-out evaluation
        values = last_evaluation(run_dir)
        name = metric or "loss"
    if name not in values:
        raise EmberError(f"metric {name!r} is not among the trial's held-out metrics ({', '.join(values) or 'none'})")
    return name, float(values[name]), results or {"metrics": values}


def _read_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def retry_dead_trials(study, optuna) -> int:
    """Trials left RUNNING by a process of this host that is gone (killed), and trials that stopped on
    a signal, are failed and queued again with their settings. Returns how many were queued.

    Each interrupted trial is queued once; a queued copy that is interrupted in its turn is queued
    again, so a grid point survives any number of kills (Optuna's callback counts the copies in
    ``retry_history`` and would drop a point at its ``max_retry``)."""
    from optuna.storages import RetryHeartbeatStaleTrialCallback
    from optuna.trial import TrialState

    storage, host = study._storage, socket.gethostname()
    trials = study.get_trials(deepcopy=False)
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    count = 0
    for t in trials:
        dead = (t.state == TrialState.RUNNING and t.user_attrs.get("host") == host
                and not _alive(t.user_attrs.get("pid")))
        if dead:
            storage.set_trial_user_attr(t._trial_id, "interrupted", True)
            storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            t = storage.get_trial(t._trial_id)
        if (dead or (t.state == TrialState.FAIL and t.user_attrs.get("interrupted"))) and t.number not in retried:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", category=optuna.exceptions.ExperimentalWarning)
                RetryHeartbeatStaleTrialCallback(max_retry=None)(study, t)
            count += 1
    return count


def _alive(pid) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_sweep(command: str, out: Path, runner: Callable[[Path, list[str]], None], space: list[Param], *,
              record_run: dict, fixed_overrides: list[str], sampler: str | None = None, trials: int | None = None,
              metric: str | None = None, direction: str | None = None, storage: str | None = None,
              study_name: str | None = None, prune: bool = True, prune_after: int = 5, seed: int = 0,
              corpus_level: bool = False, keep_checkpoints: bool = False) -> dict:
    """Run (or resume) the sweep; returns its summary (also SWEEP/results.json).

    ``runner(run_dir, overrides)`` trains one trial into ``run_dir``; ``record_run`` is what it
    runs, as JSON (a later start must match it to resume). ``corpus_level``: the runs have no task
    (pre-training, DistilBERT-style distillation), so the objective is the held-out loss.
    ``keep_checkpoints``: keep a finished or pruned trial's ``checkpoints/`` (its training state,
    weights and optimizer: ~600 MB for a MiniLM trial); by default they are removed once the trial
    ends, since no trial resumes another (a retry starts afresh), and the trial keeps its final
    weights, results and logs."""
    check_fixed_overrides(fixed_overrides, space, command)
    grid_ok = all(p.kind == "choice" for p in space)
    sampler = sampler or ("grid" if grid_ok else "tpe")
    if sampler not in SAMPLERS:
        raise EmberError(f"--sampler {sampler}: choose one of {', '.join(SAMPLERS)}")
    if sampler == "grid" and not grid_ok:
        ranged = next(p.key for p in space if p.kind != "choice")
        raise EmberError(f"a grid takes lists of values; {ranged} is a range (use --sampler random or tpe, or "
                         "give its values as a,b,c)")
    grid_size = 1
    for p in space:
        grid_size *= len(p.choices) if p.kind == "choice" else 1
    if trials is None:
        if sampler != "grid":
            raise EmberError(f"--sampler {sampler} needs --trials N (how many trials to finish)")
        trials = grid_size
    if trials < 1 or prune_after < 0:
        raise EmberError(f"--trials {trials} must be 1 or more, --prune-after {prune_after} 0 or more")
    if direction not in (None, "maximize", "minimize"):
        raise EmberError(f"--direction {direction}: maximize or minimize")
    corpus_level = corpus_level or command == "pretrain"
    direction = direction or metric_direction(metric or ("loss" if corpus_level else "accuracy"))
    out = Path(out)
    record = {"command": command, "run": record_run, "space": {p.key: p.describe() for p in space},
              "sampler": sampler, "metric": metric, "direction": direction, "study": study_name or out.resolve().name,
              "storage": storage or "SWEEP/" + STUDY_FILE}
    optuna = need_optuna()
    resuming = check_folder(out, record)
    created = not out.exists()
    if storage:  # reached before the folder is made: an unreachable URL leaves nothing behind
        rdb = open_storage(storage, optuna)
    out.mkdir(parents=True, exist_ok=True)
    if not storage:
        rdb = open_storage(default_storage(out), optuna)
    atomic_write_text(out / SWEEP_FILE, json.dumps(record, indent=2))
    pruner = optuna.pruners.MedianPruner(n_startup_trials=prune_after) if prune else optuna.pruners.NopPruner()
    chooser = _sampler(sampler, space, seed, seed + len(_all_trials(rdb, record["study"])), optuna)
    study = optuna.create_study(study_name=record["study"], storage=rdb, direction=direction, load_if_exists=True,
                                sampler=chooser, pruner=pruner)
    retried = retry_dead_trials(study, optuna)
    done = _finished(study, optuna)
    if resuming:
        print(f"resuming {out}: {done} trial(s) finished" + (f", {retried} interrupted one(s) run again" if retried
                                                           else ""))
    tracking = _sweep_tracking(out, fixed_overrides, record)
    objective = _objective(out, runner, space, metric, prune, optuna, keep_checkpoints)
    stops = []

    def stop_when_all_failed(study, trial) -> None:
        # A trial that fails before any succeeded is almost always the command itself (a wrong --init,
        # data not found): stop and say why instead of failing every trial the same way.
        if trial.state == optuna.trial.TrialState.FAIL and not _finished(study, optuna):
            stops.append(trial.user_attrs.get("error", "failed"))
            study.stop()

    def stop_when_grid_is_taken(study, trial) -> None:
        # Optuna's grid sampler re-runs a point when every point has been started (its note on
        # distributed optimisation); here a point another process is running is left to it.
        if sampler == "grid" and grid_taken(study, space, optuna):
            study.stop()

    if done < trials and not (sampler == "grid" and grid_taken(study, space, optuna)):
        callbacks = [optuna.study.MaxTrialsCallback(trials, states=(optuna.trial.TrialState.COMPLETE,
                                                                    optuna.trial.TrialState.PRUNED)),
                     stop_when_all_failed, stop_when_grid_is_taken]
        with warnings.catch_warnings(), tracking:
            warnings.simplefilter("ignore", category=optuna.exceptions.ExperimentalWarning)
            study.optimize(objective, n_trials=trials - done + retried, catch=(EmberError,), callbacks=callbacks)
    if stops:
        # Nothing of a sweep that never ran a trial is worth resuming: a folder this call made is removed
        # (and the study, if nobody else has a trial in it), so the corrected command starts clean.
        kept = ""
        if created and all(t.state == optuna.trial.TrialState.FAIL for t in study.get_trials(deepcopy=False)):
            optuna.delete_study(study_name=record["study"], storage=rdb)
            shutil.rmtree(out, ignore_errors=True)
        else:
            kept = f" ({out} is kept: the same command resumes it)"
        raise EmberError(f"the first trial failed: {stops[0]}{kept}")
    from ember.experiments.sweep_report import write_results

    summary = write_results(out, study, record, optuna)
    if (out / "mlflow.json").is_file():  # the sweep's own MLflow run: its results and the best value
        from ember.train.tracking import finish_tracking, log_value

        if summary["best"]:
            log_value(out, f"best/{summary['metric']}", summary["best"]["value"])
        finish_tracking(out)
    return summary


def _sweep_tracking(out: Path, overrides: list[str], record: dict):
    """With ``--set train.trackers=...mlflow``: the sweep's MLflow run, each trial's run its child;
    with ``...wandb``: each trial's W&B run in the group named after the sweep."""
    import contextlib

    sets = dict(o.split("=", 1) for o in overrides if "=" in o)
    from ember.train.tracking import parent_run, start_sweep_run, tracker_names

    names = tracker_names(sets.get("train.trackers", ""))
    stack = contextlib.ExitStack()
    if "wandb" in names:
        from ember.train.wandb_run import wandb_group

        stack.enter_context(wandb_group(record["study"]))
    if "mlflow" in names:
        params = {"sampler": record["sampler"], "direction": record["direction"], **record["space"]}
        run_id = start_sweep_run(out, sets.get("train.tracking_uri", ""), sets.get("train.experiment", ""),
                                 record["study"], params)
        stack.enter_context(parent_run(run_id))
    return stack


def grid_taken(study, space: list[Param], optuna) -> bool:
    """Whether every grid point is finished or running. A queued retry (WAITING) is not taken: it
    waits for this process, even when it is the grid's last point."""
    import itertools

    S = optuna.trial.TrialState
    taken = {tuple(t.params.get(p.key) for p in space)
             for t in study.get_trials(deepcopy=False, states=(S.COMPLETE, S.PRUNED, S.RUNNING))}
    return all(point in taken for point in itertools.product(*(p.choices for p in space)))


def _all_trials(rdb, name: str) -> list:
    try:
        return rdb.get_all_trials(rdb.get_study_id_from_name(name), deepcopy=False)
    except KeyError:
        return []


def _finished(study, optuna) -> int:
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    return len(study.get_trials(deepcopy=False, states=states))


def _sampler(name: str, space: list[Param], base_seed: int, seed: int, optuna):
    # The seed moves on with the trials already in the study, so a resumed random search draws new
    # settings rather than replaying its first ones. Not a grid's: its points are numbered in the
    # seed's shuffle, which every process sharing the study must agree on.
    if name == "grid":
        return optuna.samplers.GridSampler({p.key: list(p.choices) for p in space}, seed=base_seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def _drop_checkpoints(run_dir: Path) -> None:
    """A trial that ended (finished or pruned) will never resume: its training state goes (an
    18-point MiniLM grid kept ~9 GB of it, and filled a disk). The newest checkpoint's
    trainer_state.json (steps, time, hardware: the model card and the report read it) is kept as
    RUN/trainer_state.json."""
    from ember.runs.checkpoint import CHECKPOINT_DIR, ENDED_TRAINER_STATE, list_checkpoints

    folder = run_dir / CHECKPOINT_DIR
    if not folder.is_dir():
        return
    states = [c / "trainer_state.json" for c in list_checkpoints(run_dir)]
    states = [p for p in states if p.is_file()]
    if states:
        atomic_write_text(run_dir / ENDED_TRAINER_STATE, states[-1].read_text(encoding="utf-8"))
    shutil.rmtree(folder, ignore_errors=True)


def _objective(out: Path, runner, space: list[Param], metric: str | None, prune: bool, optuna,
               keep_checkpoints: bool = False):
    from ember.train.logging import evaluations_to
    from ember.train.loop import TrainingInterrupted

    def objective(trial) -> float:
        trial.set_user_attr("pid", os.getpid())
        trial.set_user_attr("host", socket.gethostname())
        trial.set_user_attr("interrupted", False)  # a retry inherits its original's attributes: not its fate
        values = {p.key: p.suggest(trial) for p in space}
        run_dir = out.resolve() / "trials" / f"trial-{trial.number:04d}"
        trial.set_user_attr("run_dir", str(run_dir))  # whole: with a shared storage, under this process's --out
        settings = "  ".join(f"{k}={v}" for k, v in values.items())
        print(f"[sweep {time.strftime('%H:%M:%S')}] trial {trial.number}: {settings}", flush=True)
        started = time.perf_counter()
        curve = DevCurve(trial, run_dir, metric, prune, optuna)
        try:
            with evaluations_to(curve):
                runner(run_dir, [f"{k}={v}" for k, v in values.items()])
        except TrainingInterrupted:
            trial.set_user_attr("interrupted", True)  # run again with these settings on the next start
            raise KeyboardInterrupt from None
        except KeyboardInterrupt:  # Ctrl-C outside the training steps (reading data, evaluating)
            trial.set_user_attr("interrupted", True)
            raise
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # the disk, not the settings: run again once freed
                trial.set_user_attr("interrupted", True)
            raise
        except optuna.TrialPruned:
            print(f"[sweep] trial {trial.number} pruned after {curve.index} dev evaluation(s)", flush=True)
            _end_tracked_run(run_dir, "KILLED")
            if not keep_checkpoints:
                _drop_checkpoints(run_dir)
            raise
        except EmberError as exc:
            trial.set_user_attr("error", str(exc))
            print(f"[sweep] trial {trial.number} failed: {exc}", flush=True)
            _end_tracked_run(run_dir, "FAILED")
            raise
        finally:
            trial.set_user_attr("seconds", round(time.perf_counter() - started, 1))
        name, value, results = trial_value(run_dir, metric)
        if not keep_checkpoints:
            _drop_checkpoints(run_dir)
        trial.set_user_attr("metric", name)
        trial.set_user_attr("metrics", {k: v for k, v in results.get("metrics", {}).items()
                                        if isinstance(v, (int, float))})
        others = results.get("other_splits")  # e.g. CoNLL-2003 test: reported, never chosen on
        if others:
            trial.set_user_attr("other_splits", others)
        print(f"[sweep] trial {trial.number}: dev {name} {value:.4f}", flush=True)
        return value

    return objective


def _end_tracked_run(run_dir: Path, status: str) -> None:
    """A trial stopped early still ends its MLflow / W&B run (as KILLED when pruned, FAILED on an error)."""
    if (run_dir / "mlflow.json").is_file() or (run_dir / "wandb.json").is_file():
        from ember.train.tracking import finish_tracking

        finish_tracking(run_dir, status)
