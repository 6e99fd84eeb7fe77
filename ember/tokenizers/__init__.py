"""Subword tokenizers: train WordPiece / byte-level BPE / Unigram, load, look up specials."""

from ember.tokenizers.sentinels import sentinel_ids
from ember.tokenizers.train import (
    END_OF_TEXT,
    KINDS,
    end_of_text_id,
    load_tokenizer,
    role_id,
    sequence_end_id,
    special_token_ids,
    tokenizer_kind,
    train_tokenizer,
)

__all__ = ["END_OF_TEXT", "KINDS", "end_of_text_id", "load_tokenizer", "role_id", "sentinel_ids", "sequence_end_id", "special_token_ids", "tokenizer_kind", "train_tokenizer"]
