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
import sys
from typing import NamedTuple, Sequence

import torch
from tokenizers import Tokenizer

from ember.errors import EmberError
from ember.tasks.readers.glue import Example

log = logging.getLogger(__name__)


def note_truncated(where: str, n_truncated: int, total: int, what: str, max_length: int,
                   unit: str = "tokens", consequence: str = "") -> None:
    """The stderr note every task prints when inputs were cut. It names the setting rather than one
    verb's flag: the quickstart and the Python API have no --max-length."""
    print(f"{where}: truncated {n_truncated} of {total} {what} to {max_length} {unit}{consequence} "
          "(a larger task.max_length keeps more: --max-length in ember finetune and ember glue, "
          "max_length= in ember.finetune)", file=sys.stderr)

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


# Optional per-token model inputs a feature may carry besides input_ids/token_type_ids, and
# their padding: padded by ``collate`` and handed to the backbone by keyword (``extra_inputs``).
# XLM's language of each token (Lample & Conneau 2019, §3.4); K-BERT's soft positions (Liu et
# al. 2020, §3.2) and ERNIE's aligned entity rows (Zhang et al. 2019, §3.3; -1 = no entity),
# from ember.knowledge.inputs. A family whose backbone reads another per-token input adds it here.
EXTRA_INPUTS = {"language_ids": 0, "position_ids": 0, "entity_ids": -1}


def extra_inputs(batch: dict) -> dict:
    """The optional backbone inputs present in ``batch`` (keyword arguments of the backbone)."""
    return {name: batch[name] for name in EXTRA_INPUTS if name in batch}


def collate(features: Sequence[dict], pad_id: int, left: bool = False, pad_type_id: int = 0) -> dict[str, torch.Tensor]:
    """Pad a batch to its longest row.

    Returns ``input_ids``, ``attention_mask`` (1 = real token), ``token_type_ids`` (padding
    gets segment ``pad_type_id``), every ``EXTRA_INPUTS`` entry the features carry (padding
    0), all (B, T) int64, and ``labels`` (B,): int64 for class ids, float32 for regression
    targets (any float label). ``labels`` is left out when no feature has one. ``left=True``
    pads on the left (XLNet, whose sequence summary is the last position). Features with a
    ``visible`` (n, n) matrix (K-BERT) replace the attention mask by the batch's (B, T, T)
    visibility, in which padding sees and is seen by nothing (the encoder lets every token see
    itself).
    """
    if not features:
        raise ValueError("cannot collate an empty batch")
    batch = len(features)
    width = max(len(f["input_ids"]) for f in features)
    extras = [name for name in EXTRA_INPUTS if any(name in f for f in features)]
    for name in extras:
        if not all(name in f for f in features):
            raise ValueError(f"some features carry {name!r} and some do not; cannot mix them")
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, width), dtype=torch.long)
    token_type_ids = torch.full((batch, width), pad_type_id, dtype=torch.long)
    per_token = {name: torch.full((batch, width), EXTRA_INPUTS[name], dtype=torch.long) for name in extras}
    visible = torch.zeros((batch, width, width), dtype=torch.bool) if "visible" in features[0] else None
    for row, f in enumerate(features):
        n = len(f["input_ids"])
        cols = slice(width - n, width) if left else slice(0, n)
        input_ids[row, cols] = torch.as_tensor(f["input_ids"], dtype=torch.long)
        attention_mask[row, cols] = 1
        token_type_ids[row, cols] = torch.as_tensor(f["token_type_ids"], dtype=torch.long)
        for name in extras:
            per_token[name][row, cols] = torch.as_tensor(f[name], dtype=torch.long)
        if visible is not None:
            visible[row, cols, cols] = torch.as_tensor(f["visible"], dtype=torch.bool)
    out = {
        "input_ids": input_ids,
        "attention_mask": attention_mask if visible is None else visible,
        "token_type_ids": token_type_ids,
        **per_token,
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
