"""Time to accuracy: the same wall-clock pre-training budget for ember and a plain
Hugging Face loop, then the same SST-2 fine-tuning of both (mean dev accuracy over seeds).

    PYTHONPATH=. nice -n 19 .venv/bin/python benchmarks/studies/time_to_accuracy.py \
        --data RUNS/wiki-prep --budget 20m --seeds 1,2,3 --out /tmp/tta

  ember      `ember pretrain --recipe bert-mini` (MLM + NSP, sparse MLM head, fused AdamW)
             with train.max_time = budget and, by default, train.schedule=time (warm-up and
             decay laid over the budget, cramming-style; --ember-schedule linear keeps the
             recipe's step schedule, its max_steps estimated from a speed probe).
  reference  transformers.BertForMaskedLM (sdpa, full-vocabulary head, as run_mlm.py) of the
             same shape, trained by a plain loop on the same prepared corpus with the same
             dynamic 15% masking (80/10/10), batch, peak learning rate, AdamW settings and
             clipping, and ember's time schedule over the budget (benchmarks/common/_hf_reference.py).
Both budgets count training-step seconds only (data loading and evaluation excluded, as
ember's Trainer counts them). With --cpu-time both sides run on one thread and count this
process's CPU seconds instead of wall seconds (ember: train.clock=cpu), so other programs on
a shared machine cannot make the budgets unequal. Then `ember finetune --task sst2` runs on each with the same
seeds and settings; the reference checkpoint is read through ember's HF import.
The full run takes about 2 x budget + fine-tuning time; --smoke runs a tiny version in
seconds (CI).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
from _bench import load, machine  # noqa: E402
from _hf_reference import train_reference  # noqa: E402

import ember  # noqa: E402
from ember.durations import parse_duration  # noqa: E402
from ember.recipes import recipe_path  # noqa: E402
from ember.config import apply_overrides, load_yaml, run_config_from_dict  # noqa: E402

SMOKE_MODEL = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
               "model.max_position=64", "data.max_seq_length=64", "data.eval_examples=16"]


def recipe_config(recipe: str, overrides: list[str]):
    return run_config_from_dict(apply_overrides(load_yaml(recipe_path(recipe)), overrides))


def finetune(init: Path, out: Path, args) -> dict:
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    result = ember.finetune("sst2", out, init, seeds=seeds, train_limit=args.train_limit or None,
                            epochs=args.finetune_epochs or None, max_length=args.max_length or None,
                            lr=args.finetune_lr or None, overwrite=True, progress=False)
    accs = [r["metrics"]["accuracy"] for r in result.runs]
    return {"accuracy_mean": float(np.mean(accs)), "accuracies": accs}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="prepared corpus folder (`ember prepare`)")
    parser.add_argument("--out", required=True, help="folder for both runs and results.json")
    parser.add_argument("--budget", type=parse_duration, default="20m", help="pre-training wall clock each (20m, 1h)")
    parser.add_argument("--recipe", default="bert-mini")
    parser.add_argument("--ember-schedule", choices=["time", "linear"], default="time")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--train-limit", type=int, default=0, help="SST-2 training examples (0: all 67k)")
    parser.add_argument("--finetune-epochs", type=float, default=0, help="0: the task default (3)")
    parser.add_argument("--max-length", type=int, default=64, help="SST-2 max tokens (sentences are short)")
    parser.add_argument("--finetune-lr", type=float, default=1e-4,
                        help="SST-2 peak lr for both (default 1e-4: BERT-base's 2e-5 barely moves a 4-layer "
                             "model in one epoch; Turc et al. 2019 fine-tune miniatures at 1e-4..3e-5)")
    parser.add_argument("--reuse-pretraining", action="store_true",
                        help="keep OUT/ember and OUT/reference-hf from an earlier run; only fine-tune again")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="recipe override for both")
    parser.add_argument("--cpu-time", action="store_true",
                        help="one thread each, budgets in this process's CPU seconds (shared machines)")
    parser.add_argument("--smoke", action="store_true", help="tiny model, seconds-long budget (CI)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    budget = float(args.budget)
    overrides = list(args.overrides)
    if args.smoke:
        budget, args.seeds, args.train_limit, args.finetune_epochs = 3.0, "1", 64, 1
        overrides = SMOKE_MODEL + [f"model.vocab_size={_vocab(args.data)}"] + overrides
    if not args.data:
        parser.error("--data is required (a folder written by `ember prepare`)")
    if args.cpu_time:  # both sides: one thread, CPU seconds (ember's Trainer and the reference loop)
        torch.set_num_threads(1)
        overrides += ["train.clock=cpu", "train.num_threads=1"]
    print(f"{machine()}; {load()}")
    cfg = recipe_config(args.recipe, overrides)

    ember_run = out / "ember"
    if args.reuse_pretraining:
        return finish(args, out, ember_run, _reused(ember_run, out / "reference-hf"), cfg, budget)
    sets = overrides + [f"train.max_time={budget}", "train.eval_every=0", "train.save_every=0",
                        f"train.schedule={args.ember_schedule}"]
    if args.ember_schedule == "time":
        sets.append("train.max_steps=100000000")  # the budget ends the run
    started = time.perf_counter()
    ember.pretrain(args.recipe, ember_run, data=args.data, overrides=sets, overwrite=True, progress=False)
    ember_wall = time.perf_counter() - started
    state = _last_trainer_state(ember_run)
    started = time.perf_counter()
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, prepared=str(args.data)))
    ref_info = train_reference(cfg, out / "reference-hf", budget, progress=not args.smoke)
    ref_wall = time.perf_counter() - started
    pretrain = {"ember": {**state, "wall_s": ember_wall}, "reference": {**ref_info, "wall_s": ref_wall}}
    return finish(args, out, ember_run, pretrain, cfg, budget)


def _last_trainer_state(ember_run: Path) -> dict | None:
    """trainer_state.json of ember's newest checkpoint (None when there is none)."""
    checkpoints = sorted((ember_run / "checkpoints").glob("step-*"))
    return json.loads((checkpoints[-1] / "trainer_state.json").read_text()) if checkpoints else None


def _reused(ember_run: Path, reference: Path) -> dict:
    """The pre-training records of an earlier run in OUT (for --reuse-pretraining)."""
    state = _last_trainer_state(ember_run)
    if state is None or not (reference / "model.safetensors").is_file():
        raise SystemExit(f"--reuse-pretraining: no finished runs in {ember_run} and {reference}")
    ref_info = (json.loads((reference / "pretrain.json").read_text()) if (reference / "pretrain.json").is_file()
                else {"note": "made before pretrain.json was recorded: see the run's log for its steps"})
    return {"ember": state, "reference": ref_info}


def finish(args, out: Path, ember_run: Path, pretrain: dict, cfg, budget: float) -> dict:
    """Fine-tune both pre-trained models on SST-2 with the same settings; write and print the results."""
    result = {"machine": machine(), "budget_s": budget,
              "clock": cfg.train.clock, "recipe": args.recipe, "seeds": args.seeds,
              "finetune_lr": args.finetune_lr,
              "ember": {"pretrain": pretrain["ember"]}, "reference": {"pretrain": pretrain["reference"]}}
    result["ember"]["sst2"] = finetune(ember_run, out / "ember-sst2", args)
    result["reference"]["sst2"] = finetune(out / "reference-hf", out / "reference-sst2", args)
    result["load_after"] = load()
    (out / "results.json").write_text(json.dumps(result, indent=2))
    for side in ("ember", "reference"):
        r = result[side]
        print(f"{side:9s} pre-training steps {r['pretrain'].get('step', r['pretrain'].get('steps'))}, "
              f"SST-2 dev accuracy {100 * r['sst2']['accuracy_mean']:.2f} "
              f"({', '.join(f'{100 * a:.2f}' for a in r['sst2']['accuracies'])})")
    return result


def _vocab(data: str | None) -> int:
    from ember.data.shards import TokenCorpus

    return TokenCorpus(data, "train").vocab_size if data else 30522


if __name__ == "__main__":
    main()
