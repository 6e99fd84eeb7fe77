"""Subword tokenizers: train WordPiece / byte-level BPE / Unigram, load, look up specials."""

from ember.tokenizers.train import (
    KINDS,
    load_tokenizer,
    special_token_ids,
    tokenizer_kind,
    train_tokenizer,
)

__all__ = ["KINDS", "load_tokenizer", "special_token_ids", "tokenizer_kind", "train_tokenizer"]
