"""Token rows -> padded arrays, and real inputs to verify an export with."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
from tokenizers import Tokenizer

from ember.errors import EmberError
from ember.serve.graph import ServeInfo


def pad_arrays(rows: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int, multiple: int = 1,
               cap: int | None = None) -> dict[str, np.ndarray]:
    """[(ids, type_ids), ...] -> input_ids / attention_mask / token_type_ids, each (B, T) int64,
    padded to the batch's longest row (not to max_length: short requests stay cheap), rounded up
    to a ``multiple`` of tokens but never beyond ``cap`` (see ``padded_width``)."""
    width = padded_width(max(len(ids) for ids, _ in rows), multiple, cap)
    out = {"input_ids": np.full((len(rows), width), pad_id, dtype=np.int64),
           "attention_mask": np.zeros((len(rows), width), dtype=np.int64),
           "token_type_ids": np.zeros((len(rows), width), dtype=np.int64)}
    for r, (ids, types) in enumerate(rows):
        out["input_ids"][r, : len(ids)] = ids
        out["attention_mask"][r, : len(ids)] = 1
        out["token_type_ids"][r, : len(types)] = types
    return out


# ``ember serve`` pads every batch to a width in steps of this many tokens (see ``padded_width``)
SERVED_WIDTH_STEP = 16


def padded_width(longest: int, multiple: int = 1, cap: int | None = None) -> int:
    """``longest`` rounded up to a multiple, at most ``cap`` (and never below ``longest``).

    A server sees every input length; each new batch shape costs memory that PyTorch's CPU
    kernels keep (oneDNN holds state per input row count) and fragments the heap, so a served
    process grew without bound (docs/reliability.md). Widths in steps of 16 tokens bound the
    shapes a server meets at a cost of under 8 padding tokens per row on average.
    """
    width = -(-longest // multiple) * multiple
    return max(longest, min(width, cap)) if cap is not None else width


def verification_rows(info: ServeInfo, tokenizer: Tokenizer, path: str | Path | None = None,
                      limit: int | None = 1000) -> tuple[list[tuple[list, list]], str]:
    """Real inputs to compare an export with its original: (rows, description).

    A fine-tuned run uses its task's dev split from the data root (or ``path`` in the task's
    own format: GLUE TSV, CoNLL file, SQuAD JSON); a pre-training run uses SST-2 dev sentences
    (or ``path``: plain text, one sentence per line).
    """
    if info.cfg.kind == "pretrain":
        if path is not None:
            lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
            texts, where = [t for t in lines if t], str(path)
        else:
            from ember.tasks.readers.glue import get_task, read_examples

            texts, where = [ex.text_a for ex in read_examples(get_task("sst2"), "dev")], "SST-2 dev"
        texts = texts[:limit] if limit else texts
        if not texts:
            raise EmberError(f"{where}: no sentences to verify with")
        from ember.tasks.inference.requests import TextEncoder

        encoded = TextEncoder(tokenizer, info.max_length)(texts)
        return [(ids, types) for ids, types, _ in encoded], f"{where} ({len(texts)} sentences)"
    split = info.cfg.task.eval_split
    _, features = info.provider.load(split, tokenizer, info.max_length, limit=limit, path=path)
    if not features:
        raise EmberError(f"{path or split}: no examples to verify with")
    where = str(path) if path is not None else f"{info.display_name} {split}"
    return [(f["input_ids"], f["token_type_ids"]) for f in features], f"{where} ({len(features)} inputs)"
