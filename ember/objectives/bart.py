"""BART's pre-training objective (Lewis et al. 2020, §2.2): corrupt a document, reconstruct it.

    input    <s> noise(body) </s>        (ember.objectives.bart_noising; noising.kinds)
    target   <s> body </s>               the decoder reads it shifted right behind </s>

"BART is trained by corrupting documents and then optimizing a reconstruction loss - the
cross-entropy between the decoder's output and the original document" (§2): the loss is the
mean cross-entropy over every target token (ember.nn.lm_loss.seq2seq_loss). The noise is drawn
on the fly, so every epoch sees new corruptions. §5.1's final model uses text infilling (30% of
tokens, Poisson(3) spans) with permutation of all sentences, the default of ``noising``.

Data: blocks of whole sentences of one document of at most ``data.max_seq_length - 2`` tokens
(ember.data.sentence_blocks; room for <s> and </s>). Special tokens come from the corpus
tokenizer: <s> and </s> (cls/sep roles), the mask (a tokenizer without one is refused) and pad;
the run's ``model.decoder_start_token_id`` is set to its </s>, as BART decodes from </s>.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from torch import nn

from ember.errors import EmberError
from ember.nn.lm_loss import seq2seq_loss
from ember.objectives import bart_noising as N

SPECIAL_ROLES = ("mask", "cls", "sep", "pad")  # <mask>, <s>, </s>, <pad>


class BartNoise:
    """``noising`` settings -> body (L,) [+ sentence ends] -> noised body."""

    def __init__(self, settings, mask_id: int, ordinary: np.ndarray, continues_word: np.ndarray | None = None) -> None:
        self.kinds = N.parse_kinds(settings.kinds)
        if settings.unit not in ("token", "word"):
            raise EmberError(f"noising.unit={settings.unit!r}; choose token or word")
        if settings.unit == "word" and continues_word is None:
            raise EmberError("noising.unit=word needs the tokenizer's word-continuation table")
        self.continues_word = continues_word if settings.unit == "word" else None  # bool (V,)
        for name in ("mask_ratio", "random_ratio", "permute_ratio", "rotate_ratio"):
            if not 0.0 <= getattr(settings, name) <= 1.0:
                raise EmberError(f"noising.{name}={getattr(settings, name)} must be in [0, 1]")
        if settings.poisson_lambda <= 0:
            raise EmberError(f"noising.poisson_lambda={settings.poisson_lambda} must be > 0 (BART: 3)")
        self.s, self.mask_id, self.ordinary = settings, mask_id, ordinary

    def __call__(self, tokens: np.ndarray, sentence_ends: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        s = self.s
        if "permute" in self.kinds:
            tokens, sentence_ends = N.sentence_permutation(tokens, sentence_ends, rng, s.permute_ratio)
        starts = self.word_starts(tokens)  # after the permutation, as fairseq
        if "mask" in self.kinds:
            tokens = N.token_masking(tokens, s.mask_ratio, self.mask_id, rng, s.random_ratio, self.ordinary, starts)
        elif "delete" in self.kinds:
            tokens = N.token_deletion(tokens, s.mask_ratio, rng, starts)
        elif "infill" in self.kinds:
            tokens = N.text_infilling(tokens, s.mask_ratio, s.poisson_lambda, self.mask_id, rng, s.random_ratio,
                                      self.ordinary, starts)
        if "rotate" in self.kinds and rng.random() < s.rotate_ratio:
            tokens = N.document_rotation(tokens, rng)
        return tokens

    def word_starts(self, tokens: np.ndarray) -> np.ndarray | None:
        """bool (L,) True where a word starts (``noising.unit: word``), None for token units."""
        if self.continues_word is None:
            return None
        known = tokens < len(self.continues_word)  # ids beyond the table start words
        return ~np.where(known, self.continues_word[np.minimum(tokens, len(self.continues_word) - 1)], False)


def pad_rows(rows: list[np.ndarray], value: int) -> torch.Tensor:
    out = np.full((len(rows), max(len(r) for r in rows)), value, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return torch.from_numpy(out)


def ordinary_tokens(special: dict) -> np.ndarray:
    """Ids a random replacement may take: every id of the corpus tokenizer but its special tokens
    (<s>, </s>, <mask>, <unk>, <|endoftext|>, ...)."""
    from ember.tokenizers import load_tokenizer

    tok = load_tokenizer(special["tokenizer_path"])
    specials = [i for i, t in tok.get_added_tokens_decoder().items() if t.special]
    return np.setdiff1d(np.arange(tok.get_vocab_size(), dtype=np.int64), np.array(specials, dtype=np.int64))


class BartDenoising(nn.Module):
    """An encoder-decoder backbone trained to reconstruct documents from BART's noise."""

    pair_mode = "none"

    def __init__(self, backbone: nn.Module, noise: BartNoise, bos_id: int, eos_id: int, pad_id: int,
                 block_size: int) -> None:
        super().__init__()
        self.backbone, self.noise = backbone, noise
        self.bos_id, self.eos_id, self.pad_id, self.block_size = bos_id, eos_id, pad_id, block_size

    def build_dataset(self, corpus, data_cfg, seed: int):
        from ember.data.sentence_blocks import SentenceBlockDataset

        data = SentenceBlockDataset(corpus, self.block_size)
        if "permute" in self.noise.kinds and data.max_sentences < 2:
            raise EmberError(f"noising.kinds asks for sentence permutation, but {corpus.prepared_dir} has no sentence "
                             "boundaries inside any block (every document is one sentence); drop 'permute' from "
                             "noising.kinds or prepare a corpus of multi-sentence documents")
        return data

    def make_batch(self, examples, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        """input_ids / attention_mask (B, S) of the noised blocks, labels (B, T) the originals, -100
        after each; new noise on every call."""
        inputs, targets = [], []
        for block in examples:
            body = np.asarray(block.tokens, dtype=np.int64)
            inputs.append(np.concatenate([[self.bos_id], self.noise(body, block.sentence_ends, rng), [self.eos_id]]))
            targets.append(np.concatenate([[self.bos_id], body, [self.eos_id]]))
        input_ids = pad_rows(inputs, self.pad_id)
        lengths = torch.tensor([len(x) for x in inputs])[:, None]
        return {"input_ids": input_ids, "attention_mask": (torch.arange(input_ids.shape[1]) < lengths).long(),
                "labels": pad_rows(targets, -100)}

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        return seq2seq_loss(self.backbone, batch)

    @staticmethod
    def derived_metrics(metrics: dict) -> dict:
        """Held-out perplexity of the reconstructed tokens."""
        return {"ppl": math.exp(min(metrics["loss"], 50.0))} if "loss" in metrics else {}


def special_ids(cfg, special: dict, objective: str) -> dict[str, int]:
    """The corpus tokenizer's <s>, </s>, mask and pad ids, one clear error for a missing one."""
    from ember.config import SEQ2SEQ_FAMILIES
    from ember.tokenizers.train import role_id

    if cfg.model.family not in SEQ2SEQ_FAMILIES or cfg.model.position_kind != "learned":
        raise EmberError(f"objective {objective} needs a BART-style encoder-decoder (a bart-* preset, e.g. --recipe "
                         f"bart-mini), not a {cfg.model.family!r} model with {cfg.model.position_kind} positions")
    return {role: role_id(special, role, f"objective {objective}") for role in SPECIAL_ROLES}


def setup_pretraining(cfg, run_dir, resume: bool, progress: bool):
    """``setup_from_shards`` with the run's decoder start set to the corpus tokenizer's </s>."""
    from ember.objectives.setup import setup_from_shards

    cfg = with_decoder_start(cfg)
    return setup_from_shards(cfg, run_dir, resume, progress)


def with_decoder_start(cfg):
    """BART decodes from </s>: the corpus tokenizer's, recorded in the run's model config."""
    from ember.data.shards import TokenCorpus
    from ember.tokenizers import load_tokenizer, special_token_ids

    if not cfg.data.prepared:
        return cfg  # setup_from_shards says what is missing
    tokenizer = load_tokenizer(TokenCorpus(cfg.data.prepared, "train").tokenizer_path)
    sep = special_token_ids(tokenizer)["sep"]
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, decoder_start_token_id=sep))


def build(cfg, special: dict) -> BartDenoising:
    from ember.models import build_backbone

    ids = special_ids(cfg, special, cfg.objective)
    if "tokenizer_path" not in special:
        raise EmberError(f"objective {cfg.objective} needs the corpus tokenizer (for its special tokens)")
    if cfg.data.max_seq_length < 3:
        raise EmberError(f"data.max_seq_length={cfg.data.max_seq_length} leaves no room for text between <s> and </s>")
    continues = None
    if cfg.noising.unit == "word":
        from ember.objectives.masking import word_continuation_table
        from ember.tokenizers import load_tokenizer

        continues = word_continuation_table(load_tokenizer(special["tokenizer_path"]))
    noise = BartNoise(cfg.noising, ids["mask"], ordinary_tokens(special), continues)
    return BartDenoising(build_backbone(cfg.model), noise, ids["cls"], ids["sep"], ids["pad"],
                         cfg.data.max_seq_length - 2)
