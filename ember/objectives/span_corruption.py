"""T5's unsupervised objectives for an encoder-decoder (Raffel et al. 2020, §3.1.4 and §3.3).

``span_corruption`` is the objective T5 was pre-trained with (§3.3.4, Table 5; the T5 code's
``span_corruption`` preprocessor / ``span_3_15_u_u.gin``): 15% of the tokens, in spans of
mean length 3, each span replaced in the input by its own sentinel; the target lists every
sentinel followed by the tokens it dropped, then EOS. The paper's Figure 2, on
"Thank you for inviting me to your party last week.":

    inputs   Thank you <X> me to your party <Y> week.
    targets  <X> for inviting <Y> last <Z>

The figure closes the targets with a sentinel; the released code (reproduced here) starts
every sequence with a non-noise span and ends it with a noise span, so the inputs end with
a sentinel and the targets with the last span, each followed by ``</s>``.

The comparison objectives of §3.3 are the same machinery with other choices (the T5 code's
gin names in brackets; ``ember.objectives.noise`` holds the pieces):

  prefix_lm        Table 3: split a span of text at a uniformly random point; the encoder
                   reads the prefix, the decoder predicts the rest              [prefix_lm]
  bert_denoising   Tables 3-4, "BERT-style": 15% of tokens i.i.d., 90% masked, 10% a random
                   token; the target is the whole original text                 [iid_15_r10s90_f]
  mass_denoising   Table 4, "MASS-style": the same, always masked               [iid_15_m_f]
  deshuffle        Table 3, "deshuffling": all tokens shuffled; target the original [all_permute]
  replace_spans    Table 4, "replace corrupted spans": i.i.d. 15%, each run of
                   corrupted tokens one sentinel, targets as span corruption     [iid_15_u_u]
  drop_tokens      Table 4, "drop corrupted tokens": i.i.d. 15% dropped from the input;
                   the target is the dropped tokens in order                     [iid_15_d_d]

Data (T5's preprocessors): every objective but prefix_lm and deshuffle reads the corpus as
one stream of documents joined with nothing between them, cut into blocks (``reduce_concat_
tokens`` + ``split_tokens``); prefix_lm and deshuffle cut each document on its own. Blocks are
``random_spans_lengths(data.max_seq_length)`` raw tokens for span corruption (568 for 512
inputs: inputs exactly 512, targets exactly 114, no padding) and ``data.max_seq_length - 1``
(room for EOS) for the others, whose inputs/targets vary in length and are padded per batch.
T5's cap on the i.i.d. targets (192 / 104 tokens) is not applied: nothing is truncated.
T5 also picks one random 64k-token chunk of longer documents first (``select_random_chunk``);
Wikipedia articles are shorter, so every token is used.

The loss is the mean cross-entropy over target tokens (the decoder input is the target shifted
right behind the start token, ``backbone.shift_right``); metrics: ``loss``, ``token_acc``, and
held-out perplexity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import nn

from ember.errors import EmberError
from ember.nn.lm_loss import seq2seq_loss
from ember.objectives import noise as N


@dataclass(frozen=True)
class Denoiser:
    """One objective of the paper's comparison: noise mask x inputs encoding x targets encoding."""

    mask: str  # "spans" | "iid" | "prefix" | "all"
    inputs: Callable  # (tokens, noise, vocab, rng) -> ids
    targets: Callable
    per_document: bool  # cut documents on their own (True) or one concatenated stream


DENOISERS = {
    "span_corruption": Denoiser("spans", N.noise_span_to_unique_sentinel, N.nonnoise_span_to_unique_sentinel, False),
    "replace_spans": Denoiser("iid", N.noise_span_to_unique_sentinel, N.nonnoise_span_to_unique_sentinel, False),
    "drop_tokens": Denoiser("iid", N.drop_noise_tokens, N.drop_nonnoise_tokens, False),
    "bert_denoising": Denoiser("iid", N.noise_token_to_random_token_or_sentinel, N.keep_all_tokens, False),
    "mass_denoising": Denoiser("iid", N.noise_token_to_sentinel, N.keep_all_tokens, False),
    "prefix_lm": Denoiser("prefix", N.drop_noise_tokens, N.drop_nonnoise_tokens, True),
    "deshuffle": Denoiser("all", N.permute_noise_tokens, N.keep_all_tokens, True),
}


class Corruption:
    """One objective's corruption of raw token sequences into (inputs, targets), EOS appended."""

    def __init__(self, name: str, settings, inputs_length: int, vocab: N.NoiseVocab, eos_id: int) -> None:
        if name not in DENOISERS:
            raise EmberError(f"unknown T5 objective {name!r}; choose one of {', '.join(DENOISERS)}")
        if not 0.0 < settings.noise_density < 1.0:
            raise EmberError(f"denoising.noise_density={settings.noise_density} must be between 0 and 1 "
                             "(T5: 0.15)")
        if settings.mean_noise_span_length < 1.0:
            raise EmberError(f"denoising.mean_noise_span_length={settings.mean_noise_span_length} must be "
                             "at least 1 token (T5: 3)")
        if not 0.0 <= settings.random_token_prob <= 1.0:
            raise EmberError(f"denoising.random_token_prob={settings.random_token_prob} must be in [0, 1]")
        self.name, self.denoiser, self.settings = name, DENOISERS[name], settings
        self.inputs_length, self.vocab, self.eos_id = inputs_length, vocab, eos_id
        if self.denoiser.mask == "spans":
            self.raw_length, self.targets_length = N.random_spans_lengths(
                inputs_length, settings.noise_density, settings.mean_noise_span_length)
            spans = N.span_counts(self.raw_length, settings.noise_density, settings.mean_noise_span_length)[1]
            if spans > len(vocab.sentinels):
                raise EmberError(f"data.max_seq_length={inputs_length} gives {spans} corrupted spans per "
                                 f"sequence but the tokenizer has {len(vocab.sentinels)} sentinels; retrain "
                                 f"it with --sentinels {spans} or lower data.max_seq_length")
        else:
            self.raw_length, self.targets_length = inputs_length - 1, None  # room for EOS
        if self.raw_length < 1:
            raise EmberError(f"data.max_seq_length={inputs_length} leaves no room for text")

    def noise_mask(self, length: int, rng: np.random.Generator) -> np.ndarray:
        s, kind = self.settings, self.denoiser.mask
        if kind == "spans":
            return N.random_spans_noise_mask(length, s.noise_density, s.mean_noise_span_length, rng)
        if kind == "iid":
            return N.iid_noise_mask(length, s.noise_density, rng)
        if kind == "prefix":
            return N.random_prefix_noise_mask(length, rng)
        return np.ones(length, dtype=bool)  # "all"

    def __call__(self, tokens: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """tokens (L,) int64 -> (inputs (I,), targets (T,)), both ending with EOS."""
        tokens = np.asarray(tokens, dtype=np.int64)
        noise = self.noise_mask(len(tokens), rng)
        inputs = self.denoiser.inputs(tokens, noise, self.vocab, rng)
        targets = self.denoiser.targets(tokens, noise, self.vocab, rng)
        return np.append(inputs, self.eos_id), np.append(targets, self.eos_id)

    def dataset(self, corpus):
        from ember.data.blocks import DocumentSegmentDataset, TokenBlockDataset

        if self.denoiser.per_document:
            return DocumentSegmentDataset(corpus, self.raw_length)
        return TokenBlockDataset(corpus, self.raw_length, eot_id=None)


def _pad(rows: list[np.ndarray], value: int) -> torch.Tensor:
    out = np.full((len(rows), max(len(r) for r in rows)), value, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return torch.from_numpy(out)


class Seq2SeqDenoising(nn.Module):
    """An encoder-decoder backbone trained on one of T5's denoising objectives."""

    pair_mode = "none"  # data comes as raw token blocks, not sentence pairs

    def __init__(self, backbone: nn.Module, corruption: Corruption, pad_id: int) -> None:
        super().__init__()
        self.backbone, self.corruption, self.pad_id = backbone, corruption, pad_id

    def build_dataset(self, corpus, data_cfg, seed: int):
        return self.corruption.dataset(corpus)

    def make_batch(self, examples: list[np.ndarray], rng: np.random.Generator) -> dict[str, torch.Tensor]:
        """Corrupt each example with ``rng`` (dynamic: new noise every time an example is
        seen). input_ids / attention_mask (B, I), labels (B, T) with -100 after each target."""
        pairs = [self.corruption(tokens, rng) for tokens in examples]
        input_ids = _pad([p[0] for p in pairs], self.pad_id)
        lengths = np.array([len(p[0]) for p in pairs])[:, None]  # (B, 1)
        attention_mask = torch.from_numpy((np.arange(input_ids.shape[1]) < lengths).astype(np.int64))
        return {"input_ids": input_ids, "attention_mask": attention_mask,
                "labels": _pad([p[1] for p in pairs], -100)}

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        return seq2seq_loss(self.backbone, batch)

    @staticmethod
    def derived_metrics(metrics: dict) -> dict:
        """Held-out perplexity of the target tokens."""
        return {"ppl": math.exp(min(metrics["loss"], 50.0))} if "loss" in metrics else {}


def noise_vocab(tok, random_token_prob: float, where: str = "the tokenizer") -> N.NoiseVocab:
    """Sentinels in order and the pool of ordinary pieces (no special token, no sentinel)."""
    from ember.tokenizers.sentinels import sentinel_ids

    sentinels = np.array(sentinel_ids(tok, where=where), dtype=np.int64)
    special = [i for i, t in tok.get_added_tokens_decoder().items() if t.special]
    ordinary = np.setdiff1d(np.arange(tok.get_vocab_size(), dtype=np.int64), np.array(special, dtype=np.int64))
    return N.NoiseVocab(sentinels, ordinary, random_token_prob)


def build(cfg, special_ids: dict) -> Seq2SeqDenoising:
    from ember.config import SEQ2SEQ_FAMILIES
    from ember.models import build_backbone
    from ember.tokenizers import load_tokenizer

    if cfg.model.family not in SEQ2SEQ_FAMILIES:
        raise EmberError(f"objective {cfg.objective} needs an encoder-decoder (model family "
                         f"{', '.join(SEQ2SEQ_FAMILIES)}), not {cfg.model.family!r}; use a t5-* preset "
                         "(e.g. --recipe t5-mini)")
    if "tokenizer_path" not in special_ids:
        raise EmberError(f"objective {cfg.objective} needs the corpus tokenizer (for its sentinels)")
    tok = load_tokenizer(special_ids["tokenizer_path"])
    vocab = noise_vocab(tok, cfg.denoising.random_token_prob, f"the corpus tokenizer {special_ids['tokenizer_path']}")
    corruption = Corruption(cfg.objective, cfg.denoising, cfg.data.max_seq_length, vocab, special_ids["sep"])
    return Seq2SeqDenoising(build_backbone(cfg.model), corruption, special_ids["pad"])
