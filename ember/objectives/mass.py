"""MASS: Masked Sequence to Sequence pre-training (Song et al. 2019, §2.2-2.3), on the same
encoder-decoder as BART (a bart-* preset: learned positions, so the decoder can be told where
the fragment sits).

For a sequence x of m tokens and a fragment x[u:v] of k = ``noising.mass_ratio`` * m
consecutive tokens (§4.1: k = 50% of m; start u uniform):

    encoder input   x with x[u:v] replaced by [M], then </s>
    decoder input   position i reads x[i-1] when x[i-1] is in the fragment, else [M] ("the
                    tokens in the decoder input which are unmasked in the source side are
                    masked"), at the original positions 0..m-1
    targets         x[u:v] at positions u..v-1; every other position is ignored

"The decoder ... is forced to rely more on the source representation" (it sees no unmasked
source token) and the encoder learns from the masked ones. §2.3's two limits: k = 1 is BERT's
masked LM (one target, every decoder input [M]); k = m is a standard LM (every encoder token
masked, the decoder reads the whole sequence shifted right behind [M]). As BERT's masking, which
MASS keeps (Song et al. 2019; the released code's word_mask / word_rand / word_keep), a fragment
token of the encoder input is [M] with probability ``noising.mass_mask_prob`` (0.8), a token drawn
uniformly from the vocabulary with ``noising.mass_random_prob`` (0.1) and itself otherwise (0.1),
so the encoder cannot count on seeing [M] where it has to represent a token; the decoder's inputs
and the targets stay the original fragment. The limits above are exact with mass_mask_prob 1.

Data: blocks of whole sentences (ember.data.sentence_blocks) of at most data.max_seq_length - 1
tokens (room for </s>); the loss is the mean cross-entropy over fragment tokens.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from ember.errors import EmberError
from ember.nn.lm_loss import seq2seq_loss
from ember.objectives.bart import pad_rows, setup_pretraining, special_ids  # noqa: F401 (setup: the registry's)


def fragment(m: int, ratio: float, rng: np.random.Generator) -> tuple[int, int]:
    """(u, v): a fragment of k = round(ratio * m) tokens (at least 1), start uniform in [0, m - k]."""
    k = min(m, max(1, round(ratio * m)))
    u = int(rng.integers(0, m - k + 1))
    return u, u + k


def corrupt(tokens: np.ndarray, mask_id: int, mask_prob: float, random_prob: float, vocab_size: int,
            rng: np.random.Generator) -> np.ndarray:
    """Each token -> [M] with ``mask_prob``, a uniform token of the vocabulary with ``random_prob``,
    else itself (BERT's 80/10/10 with the defaults of ``MassObjective``)."""
    if mask_prob >= 1.0:  # all [M]: no draws, so the rest of the example's randomness is unchanged
        return np.full_like(tokens, mask_id)
    draw = rng.random(len(tokens))
    out = tokens.copy()
    out[draw < mask_prob] = mask_id
    swap = (draw >= mask_prob) & (draw < mask_prob + random_prob)
    out[swap] = rng.integers(0, vocab_size, int(swap.sum()))
    return out


def mass_example(x: np.ndarray, ratio: float, mask_id: int, eos_id: int, rng: np.random.Generator,
                 mask_prob: float = 1.0, random_prob: float = 0.0,
                 vocab_size: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x (m,) -> (encoder input (m + 1,), decoder input (m,), labels (m,) with -100 off the fragment);
    the fragment's encoder tokens are ``corrupt``-ed (all [M] by default)."""
    x = np.asarray(x, dtype=np.int64)
    m = len(x)
    u, v = fragment(m, ratio, rng)
    source = x.copy()
    source[u:v] = corrupt(x[u:v], mask_id, mask_prob, random_prob, vocab_size, rng)
    decoder = np.full(m, mask_id, dtype=np.int64)
    decoder[u + 1:v] = x[u:v - 1]  # x[i-1] where it is a fragment token; position u reads [M]
    labels = np.full(m, -100, dtype=np.int64)
    labels[u:v] = x[u:v]
    return np.append(source, eos_id), decoder, labels


class MassObjective(nn.Module):
    pair_mode = "none"

    def __init__(self, backbone: nn.Module, ratio: float, mask_id: int, eos_id: int, pad_id: int,
                 block_size: int, mask_prob: float = 0.8, random_prob: float = 0.1) -> None:
        super().__init__()
        if not 0.0 < ratio <= 1.0:
            raise EmberError(f"noising.mass_ratio={ratio} must be in (0, 1] (MASS: 0.5)")
        if not (0.0 <= mask_prob and 0.0 <= random_prob and mask_prob + random_prob <= 1.0):
            raise EmberError(f"noising.mass_mask_prob={mask_prob} and noising.mass_random_prob={random_prob}: "
                             "two shares of the fragment, each at least 0 and together at most 1 (MASS: 0.8, 0.1)")
        self.backbone, self.ratio = backbone, ratio
        self.mask_prob, self.random_prob = mask_prob, random_prob
        self.mask_id, self.eos_id, self.pad_id, self.block_size = mask_id, eos_id, pad_id, block_size

    def build_dataset(self, corpus, data_cfg, seed: int):
        from ember.data.sentence_blocks import SentenceBlockDataset

        return SentenceBlockDataset(corpus, self.block_size)

    def make_batch(self, examples, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        vocab = self.backbone.config.vocab_size
        rows = [mass_example(block.tokens, self.ratio, self.mask_id, self.eos_id, rng, self.mask_prob,
                             self.random_prob, vocab) for block in examples]
        input_ids = pad_rows([r[0] for r in rows], self.pad_id)
        lengths = torch.tensor([len(r[0]) for r in rows])[:, None]
        decoder_ids = pad_rows([r[1] for r in rows], self.pad_id)
        decoder_lengths = torch.tensor([len(r[1]) for r in rows])[:, None]
        return {"input_ids": input_ids, "attention_mask": (torch.arange(input_ids.shape[1]) < lengths).long(),
                "decoder_input_ids": decoder_ids,
                "decoder_attention_mask": (torch.arange(decoder_ids.shape[1]) < decoder_lengths).long(),
                "labels": pad_rows([r[2] for r in rows], -100)}

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        return seq2seq_loss(self.backbone, batch)

    @staticmethod
    def derived_metrics(metrics: dict) -> dict:
        return {"ppl": math.exp(min(metrics["loss"], 50.0))} if "loss" in metrics else {}


def build(cfg, special: dict) -> MassObjective:
    from ember.models import build_backbone

    ids = special_ids(cfg, special, "mass")
    if cfg.data.max_seq_length < 2:
        raise EmberError(f"data.max_seq_length={cfg.data.max_seq_length} leaves no room for text before </s>")
    return MassObjective(build_backbone(cfg.model), cfg.noising.mass_ratio, ids["mask"], ids["sep"], ids["pad"],
                         cfg.data.max_seq_length - 1, cfg.noising.mass_mask_prob, cfg.noising.mass_random_prob)
