"""Examples -> token ids for sentence(-pair) tasks, and batch collation.

``encode_examples`` relies on the tokenizer's own post-processor for the special tokens
(``[CLS] a [SEP]`` / ``[CLS] a [SEP] b [SEP]`` with segment ids 0/1 for BERT WordPiece), so
the same code serves any tokenizer.json. Sequences are not padded here: ``collate`` pads
each batch to its own longest row, which on CPU saves most of the work for short GLUE
sentences (SST-2 averages ~13 tokens against a max length of 128).

Truncation is reported, not silent: the result carries ``n_truncated``.
"""

from __future__ import annotations

import logging
from typing import NamedTuple, Sequence

import torch
from tokenizers import Tokenizer

from ember.errors import EmberError
from ember.tasks.glue import Example

log = logging.getLogger(__name__)

# The strategies `tokenizers` implements. "longest_first" (BERT's run_classifier
# `_truncate_seq_pair`) trims one token at a time from the longer segment.
TRUNCATION_STRATEGIES = ("longest_first", "only_first", "only_second")


class Featurized(NamedTuple):
    """``features[i]`` = {"input_ids", "token_type_ids", "label"}; unpacks as a pair."""

    features: list[dict]
    n_truncated: int


def encode_examples(
    examples: Sequence[Example],
    tokenizer: Tokenizer,
    max_length: int = 128,
    truncation: str = "longest_first",
) -> Featurized:
    """Tokenize ``examples`` with special tokens, truncated (not padded) to ``max_length``."""
    if truncation not in TRUNCATION_STRATEGIES:
        raise EmberError(
            f"unknown truncation {truncation!r}; valid: {', '.join(TRUNCATION_STRATEGIES)}"
        )
    if not examples:
        return Featurized([], 0)

    # Work on a private copy: the caller's tokenizer keeps its truncation/padding settings
    # (and a shared tokenizer is never left half-configured if encoding fails).
    tok = Tokenizer.from_str(tokenizer.to_str())
    tok.no_padding()

    has_pairs = any(ex.text_b is not None for ex in examples)
    has_singles = any(ex.text_b is None for ex in examples)
    for is_pair, present in ((False, has_singles), (True, has_pairs)):
        n_special = tok.num_special_tokens_to_add(is_pair)
        # `tokenizers` silently skips truncation when max_length leaves no room for text.
        if present and max_length <= n_special:
            raise EmberError(
                f"max_length={max_length} leaves no room for text: the tokenizer adds "
                f"{n_special} special tokens to each {'pair' if is_pair else 'sentence'}"
            )
    if truncation == "only_second" and has_singles:
        raise EmberError("truncation='only_second' needs sentence pairs; some examples are single")
    tok.enable_truncation(max_length, strategy=truncation)

    inputs = [ex.text_a if ex.text_b is None else (ex.text_a, ex.text_b) for ex in examples]
    try:
        encodings = tok.encode_batch(inputs)
    except Exception as err:  # tokenizers raises a bare Exception, e.g. segment too short
        raise EmberError(
            f"cannot truncate to max_length={max_length} with strategy {truncation!r}: {err}"
        ) from None

    features = []
    n_truncated = 0
    for ex, enc in zip(examples, encodings):
        ids = enc.ids
        if len(ids) > max_length:  # a guard on the library contract, cheap to keep
            raise EmberError(f"example {ex.guid}: {len(ids)} tokens exceed max_length={max_length}")
        # With stride 0, `overflowing` is non-empty exactly when tokens were cut off.
        n_truncated += bool(enc.overflowing)
        features.append({"input_ids": ids, "token_type_ids": enc.type_ids, "label": ex.label})
    if n_truncated:
        log.info(
            "truncated %d of %d examples to max_length=%d (%s)",
            n_truncated, len(examples), max_length, truncation,
        )
    return Featurized(features, n_truncated)


# Optional per-token inputs a featurizer may add, and their padding: explicit position ids
# (K-BERT's soft positions) and aligned entity rows (ERNIE), both from ember.knowledge.inputs.
OPTIONAL_INPUTS = {"position_ids": 0, "entity_ids": -1}


def backbone_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The optional inputs of a batch, as keyword arguments of the backbone."""
    return {key: batch[key] for key in OPTIONAL_INPUTS if key in batch}


def optional_inputs(features: Sequence[dict], width: int) -> dict[str, torch.Tensor]:
    """``OPTIONAL_INPUTS`` present in the features, padded to (B, width) int64; a feature's
    ``visible`` (n, n) bool matrix (K-BERT) becomes the batch's (B, T, T) attention mask, in
    which padding sees and is seen by nothing (the encoder lets every token see itself)."""
    out = {}
    for key, pad in OPTIONAL_INPUTS.items():
        if key in features[0]:
            values = torch.full((len(features), width), pad, dtype=torch.long)
            for row, f in enumerate(features):
                values[row, : len(f[key])] = torch.as_tensor(f[key], dtype=torch.long)
            out[key] = values
    if "visible" in features[0]:
        visible = torch.zeros((len(features), width, width), dtype=torch.bool)
        for row, f in enumerate(features):
            n = len(f["input_ids"])
            visible[row, :n, :n] = torch.as_tensor(f["visible"], dtype=torch.bool)
        out["attention_mask"] = visible
    return out


def collate(features: Sequence[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad a batch to its longest row.

    Returns ``input_ids``, ``attention_mask`` (1 = real token), ``token_type_ids`` (padding
    gets segment 0), all (B, T) int64, and ``labels`` (B,): int64 for class ids, float32 for
    regression targets (any float label). ``labels`` is left out when no feature has one.
    Features with knowledge (``optional_inputs``) add ``position_ids`` / ``entity_ids`` and
    replace the attention mask by their (B, T, T) visibility.
    """
    if not features:
        raise ValueError("cannot collate an empty batch")
    batch = len(features)
    width = max(len(f["input_ids"]) for f in features)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, width), dtype=torch.long)
    token_type_ids = torch.zeros((batch, width), dtype=torch.long)
    for row, f in enumerate(features):
        n = len(f["input_ids"])
        input_ids[row, :n] = torch.as_tensor(f["input_ids"], dtype=torch.long)
        attention_mask[row, :n] = 1
        token_type_ids[row, :n] = torch.as_tensor(f["token_type_ids"], dtype=torch.long)
    out = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "token_type_ids": token_type_ids,
        **optional_inputs(features, width),
    }

    labels = [f.get("label") for f in features]
    n_missing = sum(label is None for label in labels)
    if n_missing == batch:
        return out
    if n_missing:
        raise ValueError(f"{n_missing} of {batch} features have no label; cannot mix them")
    is_float = any(isinstance(label, float) for label in labels)
    out["labels"] = torch.tensor(labels, dtype=torch.float32 if is_float else torch.long)
    return out
