"""``ember.sweep``: a hyper-parameter search over ``finetune``, ``pretrain`` or ``distill`` (Optuna).

It sits with the experiments (above ``ember.api``, whose functions each trial calls); ``import
ember`` exposes it beside them.

    result = ember.sweep("finetune", "runs/rte-sweep", grid="bert-paper", task="rte", init="runs/minilm")
    result.run_dir            # the best trial's run folder (chosen on dev)
    result.summary["trials"]  # every trial: state, dev metric, settings, dev curve, run folder

The keywords not listed below go to the command unchanged (``task=``, ``init=``, ``seeds=``,
``recipe=``, ``data=``, ``method=``, ``teacher=``, ...); ``overrides`` are its fixed ``--set``
settings. ``params`` maps ``section.key`` to a list of values or a range string
(``"log:1e-5:1e-4"``, ``"float:0:0.2"``, ``"int:2:4"``): ``ember.experiments.sweep_space``.
"""

from __future__ import annotations

import json
from pathlib import Path

from ember.api.arguments import folder_arg, strings_arg
from ember.api.results import RunResult
from ember.errors import EmberError

COMMANDS = ("finetune", "pretrain", "distill")


def sweep(command: str, out: str | Path, *, params: dict | None = None, grid: str | None = None,
          sampler: str | None = None, trials: int | None = None, metric: str | None = None,
          direction: str | None = None, storage: str | None = None, study: str | None = None, prune: bool = True,
          prune_after: int = 5, seed: int = 0, overrides: list[str] | tuple[str, ...] = (), progress: bool = False,
          keep_checkpoints: bool = False, **kwargs) -> RunResult:
    """Run (or resume: the same call again) a sweep into ``out``; returns the best trial as a RunResult
    (``run_dir``: its run folder, ``metrics``: its dev metrics, ``summary``: SWEEP/results.json).

    ``sampler``: "grid" (the default when every setting is a list), "tpe" (otherwise) or "random";
    ``trials``: how many to finish (a grid: all of it); ``storage``: an RDB URL several processes
    can share (default: SWEEP/study.db); ``study``: its name there (default: the folder's name);
    ``prune``: stop trials whose dev curve is below the median of earlier ones at the same epoch
    (once ``prune_after`` trials have finished; Optuna's MedianPruner); ``keep_checkpoints``: keep
    each ended trial's ``checkpoints/`` (by default removed when it ends; its final weights stay).
    """
    from ember.experiments.sweep import run_sweep
    from ember.experiments.sweep_space import search_space

    if command not in COMMANDS:
        raise EmberError(f"ember.sweep runs {', '.join(COMMANDS)}, not {command!r}")
    out, fixed = folder_arg(out, "out"), strings_arg(overrides, "overrides")
    space = search_space(command, params, grid)
    for name in ("out", "resume", "overwrite"):
        if name in kwargs:
            raise EmberError(f"{name}= is the sweep's own: each trial gets its own run folder under out/trials")
    if command == "finetune":
        from ember.api.finetune import SETTINGS

        if kwargs.get("eval_split") == "test":
            raise EmberError("a sweep chooses its best trial on dev; eval_split='test' would choose on test")
        given = {SETTINGS[k]: k for k, v in kwargs.items() if k in SETTINGS and v is not None}
        both = [given[p.key] for p in space if p.key in given]
        if both:
            raise EmberError(f"{both[0]}= is also searched ({SETTINGS[both[0]]}); give it one way")
    function = _command(command)

    def runner(run_dir: Path, sets: list[str]) -> None:
        function(out=run_dir, overrides=fixed + sets, progress=progress, **kwargs)

    corpus_level = False
    if command == "distill":
        from ember.api.distill import is_corpus_level

        corpus_level = is_corpus_level(kwargs.get("method", ""), kwargs.get("stage", "task"))
    record = {"kwargs": json.loads(json.dumps(kwargs, default=str)), "overrides": fixed}
    summary = run_sweep(command, out, runner, space, record_run=record, fixed_overrides=fixed, sampler=sampler,
                        trials=trials, metric=metric, direction=direction, storage=storage, study_name=study,
                        prune=prune, prune_after=prune_after, seed=seed,
                        corpus_level=corpus_level, keep_checkpoints=keep_checkpoints)
    return sweep_result(out, summary)


def sweep_result(out: Path, summary: dict) -> RunResult:
    best = summary["best"]
    if best is None:
        return RunResult(Path(out), {}, summary["trials"], summary)
    return RunResult(Path(out) / best["run_dir"], best["metrics"], summary["trials"], summary)


def _command(command: str):
    import ember.api

    return getattr(ember.api, command)
