"""`ember fewshot`: zero/one/few-shot classification accuracy of a GPT-style causal LM."""

from __future__ import annotations

import argparse

from ember.commands.common import count_arg, int_list_arg

HELP = """\
Score a causal LM run (GPT-1/GPT-2) on a GLUE-style task without training, as GPT-2/GPT-3
do: each dev example gets k demonstrations drawn at random (seeded) from the train split,
written in the task's prompt format with their answers, then the example itself; the label
whose verbalizer (SST-2: " negative" / " positive", RTE: " True" / " False", ...) has the
highest log-likelihood wins. Prints accuracy per k as mean ± std over --seeds (k = 0 runs
once), with the majority-class rate for reference. Prompt formats: ember/tasks/inference/fewshot.py.
--calibrate adds contextual calibration (Zhao et al. 2021): the label bias measured on
content-free queries ("N/A", "[MASK]", "") after the same demonstrations is divided out,
and the calibrated accuracy is printed beside the raw one.

examples:
  ember fewshot runs/gpt2-tiny --task sst2 --shots 0,1,8 --seeds 1,2,3
  ember fewshot runs/gpt2-tiny --task rte --shots 0,4 --limit 100 --out rte-fewshot.json
  ember fewshot runs/gpt2-tiny --task sst2 --calibrate
"""


def register(sub) -> None:
    p = sub.add_parser("fewshot", help="zero/one/few-shot accuracy of a GPT-style LM on a task",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", help="run folder of a gpt/gpt2 model")
    p.add_argument("--task", required=True, help="sst2, rte, cola, mrpc, qnli or snli")
    p.add_argument("--shots", type=int_list_arg, default=[0, 1, 8], help="values of k (default 0,1,8)")
    p.add_argument("--seeds", type=int_list_arg, default=[1, 2, 3], help="demonstration draws (default 1,2,3)")
    p.add_argument("--max-length", type=int,
                   help="context in tokens (default: the run's training block length, within its positions)")
    p.add_argument("--limit", type=count_arg, help="score only the first N evaluation examples")
    p.add_argument("--batch-size", type=int, default=16, help="sequences per forward pass (default 16)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--calibrate", action="store_true",
                   help="also report contextual calibration (Zhao et al. 2021); 4x the scoring")
    p.add_argument("--out", help="also write the report as JSON here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run)


def run(args) -> int:
    import json
    from pathlib import Path

    from ember.errors import EmberError
    from ember.generate import load_causal_lm
    from ember.tasks.inference.fewshot import evaluate_fewshot, format_report
    from ember.runs.checkpoint import atomic_write_text
    from ember.runs.folder import load_run_config

    model, tokenizer = load_causal_lm(args.run_dir, args.device)
    positions = model.backbone.config.max_position
    max_length = args.max_length or min(load_run_config(args.run_dir).data.max_seq_length, positions)
    if max_length > positions:
        raise EmberError(f"--max-length {max_length} exceeds the model's {positions} positions")
    report = evaluate_fewshot(model, tokenizer, args.task, args.shots, args.seeds, max_length,
                              limit=args.limit, batch_size=args.batch_size, progress=not args.no_progress,
                              calibrate=args.calibrate)
    print(format_report(report))
    if args.out:
        atomic_write_text(Path(args.out), json.dumps(report, indent=2))
        print(f"wrote {args.out}")
    return 0
