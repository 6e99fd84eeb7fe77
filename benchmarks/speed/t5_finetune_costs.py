"""What text-to-text fine-tuning costs on this CPU (docs/t5.md, "Text-to-text fine-tuning"): a
t5-mini fine-tuning step at batch 32 on real SST-2 and RTE inputs, beside bert-mini's on the
same sentences, and greedy decoding of the dev set (what every evaluation costs).

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/speed/t5_finetune_costs.py \\
        --t5-tokenizer runs/t5tok/tokenizer.json --bert-tokenizer runs/tok/tokenizer.json

One thread, CPU time (time.process_time). Random weights: the cost does not depend on them,
except decoding, which runs until </s> or the budget (an untrained model never says </s>,
so its decoding cost is the budget's, the worst case). Batches are real training batches
(the first 32 x steps examples in a fixed random order), padded per batch as `ember finetune`
pads them; each step is forward + backward + the task's default optimizer (T5: Adafactor;
BERT: AdamW), with dropout on.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
import torch

from ember.api.finetune import finetune_config
from ember.config import model_preset
from ember.models import build_backbone
from ember.tasks.base import get_adapter
from ember.tokenizers import load_tokenizer, special_token_ids
from ember.train.optim import build_optimizer

BATCH, STEPS = 32, 6


def step_seconds(module, optimizer, batches: list[dict]) -> float:
    """Mean CPU seconds of a training step (forward, backward, optimizer) over ``batches[1:]``."""
    module.train()
    for i, batch in enumerate(batches):
        if i == 1:  # the first is a warm-up
            start = time.process_time()
        loss, _ = module(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return (time.process_time() - start) / (len(batches) - 1)


def task_step(task: str, preset: str, tokenizer_path: str) -> tuple[float, dict]:
    """(seconds per step, shapes) of fine-tuning ``preset`` on ``task`` with its defaults (max
    length, optimizer)."""
    tok = load_tokenizer(tokenizer_path)
    cfg = dataclasses.replace(model_preset(preset), vocab_size=tok.get_vocab_size(),
                              pad_token_id=special_token_ids(tok)["pad"])
    adapter = get_adapter(task, cfg)
    _, features = adapter.load("train", tok, adapter.hparams.max_length, limit=4000)
    torch.manual_seed(0)
    module = adapter.build_module(build_backbone(cfg), cfg.pad_token_id)
    order = np.random.default_rng(0).permutation(len(features))
    chunks = [[features[i] for i in order[k * BATCH:(k + 1) * BATCH]] for k in range(STEPS + 1)]
    batches = [module.make_batch(chunk, np.random.default_rng(k)) for k, chunk in enumerate(chunks)]
    optimizer = build_optimizer(module, finetune_config(task, cfg).train)
    shapes = {"inputs": float(np.mean([b["input_ids"].shape[1] for b in batches])),
              "targets": float(np.mean([b["labels"].shape[1] if b.get("labels") is not None and b["labels"].dim() == 2
                                        else 0 for b in batches]))}
    return step_seconds(module, optimizer, batches), shapes


def dev_decoding_seconds(task: str, tokenizer_path: str, max_length: int = 128) -> tuple[float, int]:
    """CPU seconds of one greedy evaluation pass of t5-mini over the task's dev split."""
    tok = load_tokenizer(tokenizer_path)
    cfg = dataclasses.replace(model_preset("t5-mini"), vocab_size=tok.get_vocab_size())
    adapter = get_adapter(task, cfg)
    examples, features = adapter.load("dev", tok, max_length)
    torch.manual_seed(0)
    module = adapter.build_module(build_backbone(cfg), 0).eval()
    start = time.process_time()
    adapter.score(module, examples, features, 64, "cpu")
    return time.process_time() - start, len(examples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--t5-tokenizer", required=True, help="a T5-layout tokenizer.json (ember tokenizer train "
                        "--kind unigram)")
    parser.add_argument("--bert-tokenizer", help="a WordPiece tokenizer.json for the bert-mini comparison")
    parser.add_argument("--tasks", default="sst2,rte", help="comma-separated tasks (default sst2,rte; squad2 "
                        "takes 512-token inputs: slow)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for task in args.tasks.split(","):
        t5, shape = task_step(task, "t5-mini", args.t5_tokenizer)
        line = (f"{task}: t5-mini fine-tuning step {t5:.3f} s (batch {BATCH}, inputs {shape['inputs']:.0f} tokens, "
                f"targets {shape['targets']:.0f}, Adafactor)")
        if args.bert_tokenizer:
            bert, shape = task_step(task, "bert-mini", args.bert_tokenizer)
            line += f"; bert-mini {bert:.3f} s (inputs {shape['inputs']:.0f}, AdamW); ratio {t5 / bert:.2f}"
        print(line, flush=True)
    seconds, n = dev_decoding_seconds("sst2", args.t5_tokenizer)
    print(f"sst2 dev evaluation (greedy, untrained: full budget): {seconds:.1f} s for {n} sentences", flush=True)


if __name__ == "__main__":
    main()
