"""LM training steps with and without the fused head-and-loss (ember.nn.linear_cross_entropy).

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/speed/lm_loss_step.py --cpu-time \
        [--objectives clm span_corruption] [--repeats 4]

One training step (forward, backward, AdamW) of GPT's causal LM (gpt2-mini's shape with GPT-2's
50,257-word vocabulary: every position predicts, so the head makes batch x length x vocabulary
logits) and of T5's span corruption (t5-mini, 32,128 words, the head at the target positions),
in turn in one process: "fused" is what `ember pretrain` runs; "logits" forces the ordinary
path (F.linear, F.cross_entropy, an argmax for accuracy) by switching the fused step off.
Random token ids (the head's cost does not depend on them). Freed host memory is kept, as
`ember pretrain` does.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
from _bench import add_common_args, alternate, apply_common_args, clock, median, run_cli  # noqa: E402

from ember.config import TrainConfig, model_preset  # noqa: E402
from ember.models import build_backbone  # noqa: E402
from ember.nn import linear_cross_entropy  # noqa: E402
from ember.nn.lm_loss import seq2seq_loss  # noqa: E402
from ember.objectives.clm import CausalLM  # noqa: E402
from ember.host_memory import keep_freed_host_memory  # noqa: E402
from ember.train.optim import build_optimizer  # noqa: E402

SHAPES = {"clm": ("gpt2-mini", 50257), "span_corruption": ("t5-mini", 32128)}


def _step_for(objective: str, preset: str, vocab: int, batch: int, length: int):
    torch.manual_seed(0)
    cfg = dataclasses.replace(model_preset(preset), vocab_size=vocab)
    ids = torch.randint(0, vocab, (batch, length))
    if objective == "clm":
        module = CausalLM(build_backbone(cfg), vocab - 1)
        data = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        loss_of = module
    else:  # T5: inputs of `length`, targets of a quarter of it (span corruption's ratio)
        module = build_backbone(cfg)
        data = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                "labels": torch.randint(0, vocab, (batch, max(2, length // 4)))}

        def loss_of(b):
            return seq2seq_loss(module, b)
    module.train()
    optimizer = build_optimizer(module, TrainConfig())

    def step() -> float:
        loss, _ = loss_of(data)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()
    return step


def _timed(step, fused: bool, tokens: int, steps: int):
    def run() -> float:
        saved = linear_cross_entropy.fusable
        if not fused:
            linear_cross_entropy.fusable = lambda x, weight: False
        try:
            step()  # untimed: the other contender ran last
            start = clock()
            for _ in range(steps):
                step()
            return tokens * steps / (clock() - start)
        finally:
            linear_cross_entropy.fusable = saved
    return run


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objectives", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=4, help="alternating repetitions (medians)")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per repetition")
    add_common_args(parser, "a tiny vocabulary and batch, seconds (CI)")
    args = parser.parse_args(argv)
    apply_common_args(args)
    keep_freed_host_memory()
    results = []
    for objective in args.objectives:
        preset, vocab = SHAPES[objective]
        batch, length = args.batch, args.length
        if args.smoke:
            preset, vocab, batch, length, args.repeats, args.steps = (
                "gpt2-tiny" if objective == "clm" else "t5-tiny"), 500, 2, 16, 2, 1
        step = _step_for(objective, preset, vocab, batch, length)
        rates = alternate({"fused": _timed(step, True, batch * length, args.steps),
                           "logits": _timed(step, False, batch * length, args.steps)}, args.repeats)
        each = [f / u for f, u in zip(rates["fused"], rates["logits"])]
        result = {"objective": objective, "preset": preset, "vocab": vocab, "batch": batch, "length": length,
                  "tokens_per_s": {k: median(v) for k, v in rates.items()}, "speedup_each": each,
                  "speedup": float(np.median(each))}
        print(f"{objective} ({preset}, vocabulary {vocab:,}, {batch}x{length}): fused "
              f"{result['tokens_per_s']['fused']:,.0f} vs logits {result['tokens_per_s']['logits']:,.0f} "
              f"input tokens/s, {result['speedup']:.2f}x (each repetition: {' '.join(f'{x:.2f}' for x in each)})")
        results.append(result)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    run_cli(main)
