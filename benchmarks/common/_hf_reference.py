"""The reference side of the pre-training races (time_to_accuracy.py, time_to_loss.py):
transformers' ``BertForMaskedLM`` trained by a plain loop on exactly the batches ember's
Trainer draws.

Same data, same masks: the loop takes ember's MLM objective only as a batch maker
(``ember.objectives.setup.setup_pretraining`` with objective "mlm": the prepared corpus's
sequences, dynamic 15% masking with 80/10/10), walks the examples in the Trainer's order
(``DataOrder``) and seeds each micro-batch's masks as the Trainer does ([seed, step, k]).
So at every step both sides see the same tokens with the same masks; what differs is the
engine.

  head "full"    logits for every position, loss at the masked ones: what run_mlm.py and the
                 HF Trainer run (transformers' BertForMaskedLM as it is)
  head "masked"  the encoder, then the head at the masked rows only: what an informed user,
                 MosaicBERT or cramming (Geiping & Goldstein 2022, sec. 4.2) does

Optimiser and schedule: AdamW with BERT's decay groups (no decay on biases and LayerNorm,
as the HF Trainer), the run's lr, betas, eps, weight decay and clipping; the learning rate
follows ember's time schedule over the same budget (warm-up for warmup_ratio of the budget,
then linear decay to zero when the budget is spent), computed from the same clock. An earlier
version planned a linear step schedule from a 3-step speed probe, as a run_mlm user sets
--max_steps; the first steps are slow, so it under-planned (371 planned, 485 run in 30
CPU-minutes) and the reference spent its last minutes at lr 0. Both sides now share one
schedule, so a race measures the engine. Held-out evaluation is ember's own function
(``held_out_metrics``: the same examples with the same fixed masks), run through
``HFMaskedLM``, so both curves measure one thing.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ember.fileio import atomic_write_text
from ember.interop.hf_bert import config_to_hf
from ember.objectives.setup import setup_pretraining
from ember.train.clock import step_clock
from ember.train.loop import DataOrder
from ember.train.logging import MetricsLogger
from ember.train.optim import parameter_groups, time_lr_factor

HEADS = ("full", "masked")


def hf_bert_config(m):
    """transformers.BertConfig of ember's ModelConfig ``m`` (sdpa attention), through the
    interop's own config map (the one `ember convert --to-hf` writes)."""
    import transformers

    hf = config_to_hf(m, ["BertForMaskedLM"])
    hf.pop("model_type")  # BertConfig's class attribute, not an argument
    return transformers.BertConfig(**hf, attn_implementation="sdpa")


class HFMaskedLM(nn.Module):
    """An HF ``BertForMaskedLM`` behind ember's objective interface: ``make_batch`` is
    ember's (same layout and masks), ``forward(batch) -> (loss, metrics)`` reports
    ``mlm_loss``/``mlm_acc``/``loss`` as (sum, count) the way ember's MLM objective does."""

    def __init__(self, model: nn.Module, batcher: nn.Module, head: str = "full") -> None:
        super().__init__()
        if head not in HEADS:
            raise ValueError(f"head={head!r}; choose one of {HEADS}")
        self.model, self.head = model, head
        self._batcher = [batcher]  # a list: not a submodule (its weights are not trained here)

    def make_batch(self, examples, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        return self._batcher[0].make_batch(examples, rng)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        labels = batch["labels"]
        where = labels != -100
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
        # In evaluation both heads take the masked rows only: the same numbers, and held-out
        # time is not counted in the budget anyway.
        if self.head == "full" and self.model.training:
            logits = self.model(**inputs).logits[where]  # (B, T, V) computed, masked rows kept
        else:
            hidden = self.model.bert(**inputs).last_hidden_state  # (B, T, H)
            logits = self.model.cls(hidden[where])  # (N, V)
        targets = labels[where]
        loss = F.cross_entropy(logits.float(), targets)
        n, rows = int(targets.numel()), int(labels.shape[0])
        correct = (logits.argmax(-1) == targets).sum().item()
        return loss, {"mlm_loss": (loss.item() * n, n), "mlm_acc": (correct, n), "loss": (loss.item() * rows, rows)}


def trainer_batches(objective, data, order: DataOrder, t, step: int) -> list[dict[str, torch.Tensor]]:
    """The micro-batches ember's Trainer trains on at ``step`` on one process: the examples at
    positions step * batch + k * micro ... in ``order``, masks drawn with [seed, step, k]."""
    micro = t.batch_size // t.grad_accum
    batches = []
    for k in range(t.grad_accum):
        first = step * t.batch_size + k * micro
        examples = [data.example(*order(pos)) for pos in range(first, first + micro)]
        batches.append(objective.make_batch(examples, np.random.default_rng([t.seed, step, k])))
    return batches


def train_reference(cfg, out: Path, budget: float, *, head: str = "full", evaluate_every: float = 0.0,
                    progress: bool = False, on_eval: Callable[[dict], None] | None = None) -> dict:
    """Train the reference for ``budget`` seconds of step time on ``cfg.train.clock`` and save it
    to ``out`` in HF layout. With ``evaluate_every`` > 0, held-out metrics are taken each time
    that many more seconds of training have passed and once at the end (not counted in the
    budget); each is logged to ``out/metrics.jsonl`` by ember's MetricsLogger and passed to
    ``on_eval``."""
    import transformers

    t = cfg.train
    setup = setup_pretraining(dataclasses.replace(cfg, objective="mlm"), out, False, False)
    m = setup.cfg.model
    torch.manual_seed(t.seed)
    model = transformers.BertForMaskedLM(hf_bert_config(m)).train()
    objective = HFMaskedLM(model, setup.module, head)
    # BERT's decay groups (biases and LayerNorms undecayed), as the HF Trainer forms them
    optimizer = torch.optim.AdamW(parameter_groups(model, t.weight_decay), lr=t.lr,
                                  betas=(t.adam_beta1, t.adam_beta2), eps=t.adam_eps)
    data, order = setup.train_data, DataOrder(len(setup.train_data), t.seed)
    clock = step_clock(t.clock)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").unlink(missing_ok=True)
    logger = MetricsLogger(out)

    def step(i: int, elapsed: float) -> float:
        """One optimiser step on the Trainer's examples and masks; its seconds."""
        start = clock()
        for batch in trainer_batches(objective, data, order, t, i):
            loss, _ = objective(batch)
            (loss / t.grad_accum).backward()
        if t.max_grad_norm > 0:
            nn.utils.clip_grad_norm_(model.parameters(), t.max_grad_norm)
        # the lr of ember's time schedule at this moment (this step's seconds so far included)
        lr = t.lr * time_lr_factor(elapsed + clock() - start, budget, t.warmup_ratio)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return clock() - start

    def evaluate(i: int, elapsed: float) -> None:
        model.eval()
        with torch.no_grad():
            metrics = setup.evaluate(objective)
        model.train()
        logger.log(i, "eval", metrics, elapsed)
        if on_eval is not None:
            on_eval({"step": i, "elapsed": elapsed, **metrics})

    elapsed, i, next_eval = 0.0, 0, evaluate_every
    while elapsed < budget:
        elapsed += step(i, elapsed)
        i += 1
        if evaluate_every and elapsed >= next_eval and elapsed < budget:
            evaluate(i, elapsed)
            next_eval += evaluate_every
        if progress and i % 50 == 0:
            print(f"  reference step {i}, {elapsed:.0f}/{budget:.0f} s", flush=True)
    if evaluate_every:
        evaluate(i, elapsed)
    logger.close()
    model.save_pretrained(out)
    tokenizer = Path(setup.cfg.data.prepared) / "tokenizer.json"
    if tokenizer.is_file():
        shutil.copy(tokenizer, out / "tokenizer.json")
    info = {"steps": i, "elapsed": elapsed, "clock": t.clock, "head": head, "schedule": "time"}
    atomic_write_text(out / "pretrain.json", json.dumps(info, indent=2))  # read back by --reuse-pretraining
    return info
