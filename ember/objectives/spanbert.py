"""SpanBERT pre-training: span masking + the span-boundary objective (Joshi et al. 2020).

Masking (§3.1) is ``data.masking: span`` (``ember.objectives.masking.select_spans``):
contiguous spans of whole words, lengths ~ Geometric(0.2) clipped at 10 words, until 15% of
the tokens are masked, 80/10/10 applied per span. The recipe sets it; any other scheme
also works (each unit is then a "span" for the SBO).

Span-boundary objective (§3.2): every token x_i of a masked span (s..e) is predicted again,
from the encoder outputs at the two boundary tokens just outside the span and a relative
position embedding of the target inside it:

    h0 = [x_{s-1}; x_{e+1}; p_{i-s+1}]          (3H)
    h1 = LayerNorm(GeLU(W1 h0))                  (H)
    y_i = LayerNorm(GeLU(W2 h1))                 (H, or E with factorized embeddings)

then the vocabulary decoder tied to the input embeddings (with its own bias). The second
layer plus decoder is exactly BERT's MLM head, so ``MaskedLMHead`` is reused for it.
Loss = MLM cross-entropy + SBO cross-entropy, both averaged over the masked tokens, which with
the span boundaries are the only rows either loss reads: the encoder's last layer runs its
queries and feed-forward only there (``rows=``, as BERT's MLM does at its masked rows). No NSP:
SpanBERT trains on single contiguous segments (§3.3), so ``pair_mode`` is "none".

The boundaries always exist: masked tokens are never [CLS]/[SEP], so s-1 >= 0 ([CLS] at
worst) and e+1 is at most the closing [SEP]. The position table has ``max_position`` rows
(p_0 is the first token of a span): offsets are bounded by the sequence, so none is clipped.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ember.data.pairs import SegmentPair
from ember.models.encoder import init_weights, output_at_rows
from ember.nn.activations import activation
from ember.nn.heads import MaskedLMHead
from ember.nn.lm_loss import token_loss
from ember.nn.onednn import dense, linear
from ember.objectives.bert import BertPretraining
from ember.objectives.masking import Masker, build_masker
from ember.objectives.mlm import masked_lm_loss


def build(cfg, special_ids: dict) -> "SpanBertPretraining":
    from ember.models import build_backbone

    masker = build_masker(cfg.data, special_ids, cfg.model.vocab_size, cfg.train.seed)
    return SpanBertPretraining(build_backbone(cfg.model), special_ids, cfg.data, masker)


class SpanBoundaryHead(nn.Module):
    """SBO head: boundary pair + relative position -> vocabulary logits (§3.2)."""

    def __init__(self, hidden_size: int, vocab_size: int, act: str, layer_norm_eps: float,
                 embedding_size: int | None, max_offsets: int) -> None:
        super().__init__()
        self.position = nn.Embedding(max_offsets, hidden_size)  # p_{i-s+1}
        self.dense = nn.Linear(3 * hidden_size, hidden_size)  # W1
        self.act = activation(act)
        self.norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        # W2 + GeLU + LayerNorm + tied decoder: the MLM head's shape.
        self.output = MaskedLMHead(hidden_size, vocab_size, act, layer_norm_eps, embedding_size)

    def transform(self, left: torch.Tensor, right: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
        """left, right (N, H) boundary states, offset (N,) position in the span -> y (N, E), what
        the tied decoder reads."""
        h0 = torch.cat([left, right, self.position(offset)], dim=-1)  # (N, 3H)
        h1 = self.norm(self.act(dense(self.dense, h0)))  # (N, H)
        return self.output.transform(h1)

    def forward(self, left: torch.Tensor, right: torch.Tensor, offset: torch.Tensor,
                word_embeddings: torch.Tensor) -> torch.Tensor:
        """The same inputs -> logits (N, V)."""
        return linear(self.transform(left, right, offset), word_embeddings, self.output.bias)


class SpanBertPretraining(BertPretraining):
    """Backbone + MLM head + SBO head; single segments, no sentence-level task."""

    def __init__(self, backbone: nn.Module, special_ids: dict, data, masker: Masker | None = None) -> None:
        super().__init__(backbone, special_ids, data, "none", masker)
        cfg = backbone.config
        self.sbo = SpanBoundaryHead(cfg.hidden_size, cfg.vocab_size, cfg.hidden_act, cfg.layer_norm_eps,
                                    cfg.embedding_size or None, cfg.max_position)
        self.sbo.apply(lambda m: init_weights(m, cfg.initializer_range))

    def make_batch(self, pairs: list[SegmentPair], rng: np.random.Generator) -> dict[str, torch.Tensor]:
        batch, masked = self.masked_inputs(pairs, rng)
        # (B, T) unit bounds of every predicted token, -1 elsewhere: the SBO's span (s, e+1).
        batch["span_start"] = torch.from_numpy(masked.unit_start)
        batch["span_end"] = torch.from_numpy(masked.unit_end)
        return batch

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        labels = batch["labels"]  # (B, T)
        where = labels != -100
        rows, cols = where.nonzero(as_tuple=True)  # (N,) each, the order masked_lm_loss uses
        start, end = batch["span_start"][where], batch["span_end"][where]  # (N,)
        left, right = (rows, start - 1), (rows, end)  # each target's span boundaries
        # the last layer only at the rows the two losses read, masked tokens and span boundaries
        # (ember.nn.query_rows); `slot` maps a (b, t) position to its row of the (R, H) output
        read = where.clone()
        read[left], read[right] = True, True
        hidden = output_at_rows(self.backbone, read, batch["input_ids"], batch["attention_mask"],
                                batch["token_type_ids"]).last_hidden_state  # (R, H)
        slot = torch.full_like(labels, -1)
        slot[read] = torch.arange(int(read.sum()), device=labels.device)
        at_targets, at_left, at_right = hidden[slot[where]], hidden[slot[left]], hidden[slot[right]]
        embeddings = self.backbone.word_embeddings
        mlm_loss, metrics = masked_lm_loss(self.mlm, at_targets, embeddings, labels, at_targets=True)
        # the tied decoder and its loss as one step, like the MLM's (the (N, V) logits are never kept)
        sbo_loss, sbo_metrics = token_loss(self.sbo.transform(at_left, at_right, cols - start), embeddings,
                                           self.sbo.output.bias, labels[where], "sbo")
        metrics.update(sbo_metrics)
        loss = mlm_loss + sbo_loss
        n = int(batch["input_ids"].shape[0])
        metrics["loss"] = (loss.item() * n, n)
        return loss, metrics
