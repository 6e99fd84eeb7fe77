"""`ember sweep`: a hyper-parameter search (Optuna) over `ember finetune`, `pretrain` or `distill`."""

from __future__ import annotations

import argparse
import textwrap

COMMANDS = ("finetune", "pretrain", "distill")


def register(sub) -> None:
    from ember.experiments.sweep_space import GRIDS

    p = sub.add_parser(
        "sweep",
        help="hyper-parameter search (grid, random, TPE; median pruning) over finetune, pretrain or distill",
        description=textwrap.fill(
            "Run a training command once per trial with the searched --set settings, each trial a run folder "
            "OUT/trials/trial-NNNN, and keep the best on dev: the task's official metric (pre-training: the "
            "held-out loss), never a test split. The study is kept in OUT/study.db (SQLite): the same command "
            "again resumes it, without rerunning finished trials; --storage URL (an RDB) lets several processes "
            "or machines run trials of one study. Results: OUT/results.tsv and results.json, OUT/best (the best "
            "trial's run folder), OUT/report.html with Optuna's plots. Needs pip install 'ember[sweep]'.", 100),
        epilog="examples:\n"
        "  ember sweep --out runs/rte-grid --grid bert-paper -- finetune --task rte --init runs/minilm\n"
        "  ember sweep --out runs/rte-tpe --param train.lr=log:1e-5:1e-4 --param task.epochs=2,3,4 \\\n"
        "      --trials 20 -- finetune --task rte --init runs/minilm --seeds 1,2,3\n"
        "  ember sweep --out runs/mini-sweep --param train.lr=log:1e-4:2e-3 --trials 8 --sampler random \\\n"
        "      -- pretrain --recipe bert-mini --data runs/wiki --max-time 10m\n"
        f"grids: {', '.join(GRIDS)} (bert-paper: lr 5e-5/3e-5/2e-5 x batch 16/32 x epochs 2/3/4, Devlin et al. "
        "2019 App. A.3)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, help="sweep folder (trials, study.db, results, report)")
    p.add_argument("--grid", help=f"a paper's grid: {', '.join(GRIDS)}")
    p.add_argument("--param", action="append", default=[], metavar="SECTION.KEY=VALUES",
                   help="a searched setting: values a,b,c, or a range float:LO:HI, log:LO:HI, int:LO:HI (repeatable)")
    p.add_argument("--sampler", choices=["grid", "random", "tpe"],
                   help="grid (default when every setting is a list of values), tpe (default otherwise), random")
    p.add_argument("--trials", type=int, help="trials to finish (grid: the whole grid by default)")
    p.add_argument("--metric", help="dev metric to optimise (default: the task's official one; pretrain: loss)")
    p.add_argument("--direction", choices=["maximize", "minimize"],
                   help="default: minimize losses and perplexities, maximize the rest")
    p.add_argument("--storage", metavar="URL", help="Optuna RDB URL shared by several processes, e.g. "
                   "sqlite:////shared/study.db or postgresql://host/db (default: OUT/study.db)")
    p.add_argument("--study", help="the study's name in --storage (default: OUT's folder name)")
    p.add_argument("--no-prune", action="store_true", help="run every trial to the end (no median pruning)")
    p.add_argument("--prune-after", type=int, default=5, metavar="N",
                   help="prune only once N trials have finished (default 5, Optuna's MedianPruner)")
    p.add_argument("--seed", type=int, default=0, help="the sampler's seed (a trial's own seed: --set train.seed)")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="keep each ended trial's checkpoints/ (weights and optimizer state, ~600 MB for a MiniLM "
                        "trial); by default they are removed when the trial ends, its final weights kept")
    # (dest "verb": "command" is the CLI's own name for the verb being run, `sweep`)
    p.add_argument("verb", metavar="command", choices=COMMANDS, help="the command each trial runs")
    p.add_argument("command_args", nargs=argparse.REMAINDER,
                   help="its options, as for `ember COMMAND` but without --out (each trial has its own)")
    p.set_defaults(run=run)


def command_args(command: str, argv: list[str]):
    """The command's own parser on ``argv`` (with a placeholder --out), so its options mean what they
    mean there; a wrong option is its usage line."""
    import importlib

    from ember.errors import EmberError

    argv = [a for a in argv if a != "--"]
    for flag in ("--out", "--resume", "--overwrite"):
        if flag in argv or any(a.startswith(flag + "=") for a in argv):
            raise EmberError(f"{flag} is the sweep's own: each trial gets a run folder under the sweep's --out")
    parser = argparse.ArgumentParser(prog="ember sweep ...")
    sub = parser.add_subparsers(dest="command")
    importlib.import_module(f"ember.commands.{command}").register(sub)
    return parser.parse_args([command, *argv, "--out", "unused"])


def run(args) -> int:
    import copy

    from ember.errors import EmberError
    from ember.experiments.sweep import run_sweep
    from ember.experiments.sweep_space import parse_param_args, search_space

    space = search_space(args.verb, parse_param_args(args.param), args.grid)
    trial_args = command_args(args.verb, args.command_args)
    if getattr(trial_args, "eval_split", None) == "test":
        raise EmberError("a sweep chooses its best trial on dev; --eval-split test would choose on test")
    fixed = list(trial_args.overrides)

    def runner(run_dir, sets) -> None:
        one = copy.copy(trial_args)
        one.out, one.overrides = str(run_dir), fixed + sets
        one.run(one)

    corpus_level = False
    if args.verb == "distill":  # DistilBERT-style runs have no task: their held-out loss is the objective
        from ember.api.distill import is_corpus_level

        corpus_level = is_corpus_level(trial_args.method, trial_args.stage)
    record = {"argv": [a for a in args.command_args if a != "--"]}
    run_sweep(args.verb, args.out, runner, space, record_run=record, fixed_overrides=fixed, sampler=args.sampler,
              trials=args.trials, metric=args.metric, direction=args.direction, storage=args.storage,
              study_name=args.study, prune=not args.no_prune, prune_after=args.prune_after,
              seed=args.seed, corpus_level=corpus_level, keep_checkpoints=args.keep_checkpoints)
    return 0
