"""The cramming search's ranking metric (cram_search.py): every trial's final weights scored by
one protocol, the masked tokens' cross-entropy in bits per character of their text, so that
vocabularies and sequence lengths compare (see cram_search.py's docstring for the reasoning).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F


def predictions(length: int) -> int:
    """BERT's max_predictions_per_seq: ~15% of the length (20 at 128)."""
    return math.ceil(0.15 * length)


def token_chars(token: str, special: frozenset = frozenset()) -> int:
    """Characters of text one vocabulary entry stands for (a special token, e.g. [UNK]: 1)."""
    text = token[2:] if token.startswith("##") else token.lstrip("\u0120\u2581")  # BPE's 'Ġ', Unigram's '▁'
    return 1 if token in special else max(len(text), 1)


def bits_per_char(nats, tokens: list[str], special: frozenset = frozenset()) -> float:
    """Cross-entropy of masked tokens (nats each) per character of their text, in bits."""
    return float(np.sum(nats) / math.log(2) / max(sum(token_chars(t, special) for t in tokens), 1))


@torch.no_grad()
def masked_token_losses(module, dataset, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per masked token of the first ``n`` examples: CE (nats), target id, argmax right; in
    batches of 32 with the masks of ember's held-out evaluation (held_out_metrics' seeds)."""
    nats, targets, right = [], [], []
    for b, start in enumerate(range(0, n, 32)):
        examples = [dataset.example(i, 0) for i in range(start, min(start + 32, n))]
        batch = module.make_batch(examples, np.random.default_rng([seed, 31337, b]))
        hidden = module.backbone(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        where = batch["labels"] != -100
        logits = module.mlm(hidden.last_hidden_state[where], module.backbone.word_embeddings).float()
        labels = batch["labels"][where]
        nats.append(F.cross_entropy(logits, labels, reduction="none").numpy())
        targets.append(labels.numpy())
        right.append((logits.argmax(-1) == labels).numpy())
    return np.concatenate(nats), np.concatenate(targets), np.concatenate(right)


def heldout_eval(run: Path, length: int, examples: int) -> dict:
    """The fixed protocol (module docstring) on a finished run's final weights."""
    from ember.data.shards import TokenCorpus
    from ember.objectives.setup import objective_dataset, setup_from_shards
    from ember.runs.checkpoint import load_weights
    from ember.runs.folder import load_run_config
    from ember.tokenizers import load_tokenizer

    cfg = load_run_config(run)
    data = dataclasses.replace(cfg.data, max_seq_length=length, max_predictions=predictions(length))
    module = setup_from_shards(dataclasses.replace(cfg, data=data), run, resume=False, progress=False).module
    module.load_state_dict(load_weights(run / "model.safetensors"))
    module.eval()
    valid = objective_dataset(module, TokenCorpus(cfg.data.prepared, "valid"), data, cfg.train.seed + 1,
                              module.special_ids["sep"])
    n = min(examples or len(valid), len(valid))
    nats, targets, right = masked_token_losses(module, valid, n, cfg.train.seed)
    tok = load_tokenizer(run / "tokenizer.json")
    special = frozenset(tok.id_to_token(i) for i in module.special_ids.values() if isinstance(i, int))
    return {"heldout_ce": float(nats.mean()), "heldout_acc": float(right.mean()),
            "bits_per_char": bits_per_char(nats, [tok.id_to_token(int(i)) for i in targets], special),
            "heldout_sequences": n, "heldout_masked": int(len(nats))}
