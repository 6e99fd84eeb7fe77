"""T5 costs on this CPU (docs/t5.md): a t5-mini training step against a bert-mini one, and
generation with and without the key/value caches.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/speed/t5_costs.py

One thread, CPU time (time.process_time), so a busy shared machine changes little.
- Training step: forward + backward + AdamW on 32 inputs of 128 tokens, vocabulary 8,000,
  dropout 0.1 in both. t5-mini decodes 32-token targets (span corruption's length at noise
  density 0.15, mean span 3, plus sentinels and </s>); bert-mini predicts 15% of positions
  through its tied embeddings (no MLM transform layer).
- Generation: t5-mini, 8 inputs of 64 tokens, 48 new tokens (no </s> stop), greedy and beam 4,
  with the caches and recomputing the whole prefix every step.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from ember.config import model_preset
from ember.models import build_backbone
from ember.seq2seq_generation import Seq2SeqGenerationConfig, seq2seq_generate

V, B, S, T = 8000, 32, 128, 32


def step_seconds(model, loss_fn, repeats: int = 6) -> float:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for i in range(repeats + 1):  # the first is a warm-up
        if i == 1:
            start = time.process_time()
        loss_fn(model).backward()
        optimizer.step()
        optimizer.zero_grad()
    return (time.process_time() - start) / repeats


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    ids, targets = torch.randint(5, V, (B, S)), torch.randint(5, V, (B, T))
    masked = torch.rand(B, S) < 0.15

    def t5_loss(m):
        h = m(ids, None, decoder_input_ids=m.shift_right(targets)).last_hidden_state
        return torch.nn.functional.cross_entropy(m.lm_logits(h).flatten(0, 1), targets.flatten())

    def bert_loss(m):
        h = m(ids, None).last_hidden_state[masked]
        return torch.nn.functional.cross_entropy(h @ m.word_embeddings.T, ids[masked])

    t5 = build_backbone(dataclasses.replace(model_preset("t5-mini"), vocab_size=V)).train()
    bert = build_backbone(dataclasses.replace(model_preset("bert-mini"), vocab_size=V)).train()
    a, b = step_seconds(t5, t5_loss), step_seconds(bert, bert_loss)
    print(f"training step: t5-mini {a:.2f} s, bert-mini {b:.2f} s, ratio {a / b:.2f}")

    t5.eval()
    inputs = torch.randint(5, V, (8, 64))
    for beams in (1, 4):
        cfg = Seq2SeqGenerationConfig(max_new_tokens=48, num_beams=beams)
        for cache in (True, False):
            start = time.process_time()
            seq2seq_generate(t5, inputs, torch.ones_like(inputs), cfg, eos_id=-1, use_cache=cache)
            print(f"generate 48 tokens, beams {beams}, cache {cache}: {time.process_time() - start:.2f} s")


if __name__ == "__main__":
    main()
