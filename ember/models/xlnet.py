"""XLNet backbone (Yang et al. 2019): Transformer-XL layers (Dai et al. 2019) with two-stream
attention.

forward(input_ids, attention_mask, token_type_ids, mems, perm_mask, target_mapping) ->
XLNetOutput with
- ``last_hidden_state`` (B, T, H): the content stream after the last layer;
- ``query_hidden`` (B, N, H): the query stream at the N targets of ``target_mapping``
  (B, N, T), when given - the states that predict those tokens (§2.3, eq. 4);
- ``mems``: with ``model.mem_len`` > 0, each layer's new memory (B, <= mem_len, H) to pass
  as ``mems`` with the next segment of the same texts (§2.4 / Transformer-XL §3.2).

The pieces (ember.nn): word embeddings only - positions enter as sinusoidal *relative*
encodings inside attention (ember.nn.relative_position), segments as relative segment
encodings (ember.nn.relative_attention) - and post-LN ``TwoStreamLayer``s. The query stream
starts from one learned vector ``mask_emb`` at every target. ``perm_mask[b, i, j]`` = 1 means
position i may not see position j (the factorisation order of ember.objectives.plm, or any
pattern a caller builds, as transformers' ``XLNetLMHeadModel`` takes it); without it and
without padding every position sees every other (fine-tuning).

``lm_logits`` is XLNetLMHeadModel's output layer: the word embedding matrix (tied) plus a
bias of its own. No loss is computed here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ember.config import ModelConfig
from ember.errors import EmberError
from ember.models.encoder import EncoderOutput, init_weights
from ember.nn.dropout import Dropout
from ember.nn.relative_attention import TargetPlacement, segment_difference
from ember.nn.relative_position import relative_positions
from ember.nn.two_stream import TwoStreamLayer, two_stream_masks, update_memory


@dataclass
class XLNetOutput(EncoderOutput):
    query_hidden: torch.Tensor | None = None  # (B, N, H) when target_mapping is given
    mems: list[torch.Tensor] | None = None  # per layer (B, <= mem_len, H), when mem_len > 0
    query_hidden_states: tuple[torch.Tensor, ...] | None = None  # query stream per layer
    query_attentions: tuple[torch.Tensor, ...] | None = None


class XLNet(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.share_layers != "none" or (cfg.embedding_size and cfg.embedding_size != cfg.hidden_size):
            raise EmberError("XLNet has no layer sharing or factorized embeddings; set "
                             "model.share_layers=none and model.embedding_size=0")
        if cfg.pre_layer_norm:
            raise EmberError("XLNet's layers are post-LayerNorm; set model.pre_layer_norm=false")
        self.config = cfg
        self.word_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.mask_emb = nn.Parameter(torch.zeros(cfg.hidden_size))  # w: the query stream's start
        self.layers = nn.ModuleList(
            TwoStreamLayer(cfg.hidden_size, cfg.num_heads, cfg.intermediate_size, cfg.hidden_act,
                           cfg.dropout, cfg.attention_dropout, cfg.layer_norm_eps)
            for _ in range(cfg.num_layers))
        self.dropout = Dropout(cfg.dropout)
        self.lm_bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        self.apply(lambda m: init_weights(m, cfg.initializer_range))
        with torch.no_grad():  # XLNet initialises its biases and segment vectors like weights
            nn.init.normal_(self.mask_emb, std=cfg.initializer_range)
            for layer in self.layers:
                att = layer.attention
                for p in (att.r_w_bias, att.r_r_bias, att.segment.bias, att.segment.embed):
                    nn.init.normal_(p, std=cfg.initializer_range)

    @property
    def word_embeddings(self) -> torch.Tensor:  # (V, H), tied to the LM output layer
        return self.word_embedding.weight

    def lm_projection(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The LM head as F.linear's (input, weight, bias), for ``ember.nn.linear_cross_entropy``."""
        return hidden, self.word_embeddings, self.lm_bias

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., V) token logits: tied embeddings + bias (XLNetLMHeadModel)."""
        return F.linear(*self.lm_projection(hidden))

    def _check_mems(self, mems: list[torch.Tensor], batch: int) -> int:
        cfg = self.config
        if cfg.mem_len == 0:
            raise EmberError("mems were passed, but this model keeps no memory (model.mem_len=0); "
                             "set model.mem_len to the memory length it should use, or pass no mems")
        if len(mems) != len(self.layers):
            raise EmberError(f"mems has {len(mems)} entries; this model has {len(self.layers)} layers "
                             "and takes one memory per layer (the mems of its previous call)")
        mlen = mems[0].shape[1]
        if any(m.shape != (batch, mlen, cfg.hidden_size) for m in mems):
            raise EmberError(f"mems must be {len(mems)} tensors of shape (batch={batch}, memory length, "
                             f"{cfg.hidden_size}); got {[tuple(m.shape) for m in mems][:2]}...")
        if mlen > cfg.mem_len:
            raise EmberError(f"the memory holds {mlen} positions, more than this model supports "
                             f"(model.mem_len={cfg.mem_len}); pass the mems the model returned, or "
                             f"keep only their last {cfg.mem_len} positions")
        return mlen

    def shard_units(self) -> list[nn.Module]:
        """Blocks FSDP may gather one at a time (see ``Encoder.shard_units``): every layer."""
        return list(self.layers)

    def _start(self, input_ids, attention_mask, token_type_ids, mems, perm_mask, target_mapping):
        """Everything the layers need: (h, g, masks, segment difference, position table,
        placement), from the inputs of ``forward``."""
        cfg = self.config
        b, t = input_ids.shape
        mlen = self._check_mems(mems, b) if mems is not None else 0
        if cfg.bi_data and b % 2:
            raise EmberError(f"model.bi_data=true reads half of each batch forward and half mirrored; "
                             f"the batch of {b} is odd - use an even batch size or bi_data=false")
        h = self.dropout(self.word_embedding(input_ids))  # (B, T, H)
        g, placement = None, None
        if target_mapping is not None:
            g = self.dropout(self.mask_emb.expand(b, target_mapping.shape[1], -1))  # (B, N, H)
            placement = TargetPlacement.of(target_mapping)
        masks = two_stream_masks(t, mlen, perm_mask, attention_mask, cfg.attn_type == "uni", input_ids.device)
        different = segment_difference(token_type_ids, mlen)
        positions = relative_positions(t, mlen + t, cfg.hidden_size, cfg.attn_type, cfg.clamp_len,
                                       cfg.bi_data, input_ids.device).to(h.dtype)
        positions = self.dropout(positions)  # (D, P, H); shared by the batch (transformers: per row)
        return h, g, masks, different, positions, placement

    def _memory(self, mems: list[torch.Tensor] | None, i: int, h: torch.Tensor) -> torch.Tensor:
        return update_memory(mems[i] if mems is not None else None, h, self.config.mem_len, self.config.reuse_len)

    @torch.no_grad()
    def memory(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
               mems: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
        """The memory a segment leaves for the next one - ``forward(...).mems`` - without
        gradient and without running the last layer, whose output is not part of it."""
        if self.config.mem_len == 0:
            raise EmberError("this model keeps no memory (model.mem_len=0); set model.mem_len")
        h, _, masks, different, positions, _ = self._start(input_ids, None, token_type_ids, mems, None, None)
        new_mems = []
        for i, layer in enumerate(self.layers):
            new_mems.append(self._memory(mems, i, h))
            if i + 1 < len(self.layers):
                h = layer(h, None, mems[i] if mems is not None else None, positions, masks, different)[0]
        return new_mems

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        attention_mask: torch.Tensor | None = None,  # (B, T) 1 = real token
        token_type_ids: torch.Tensor | None = None,  # (B, T) segment ids (only equality matters)
        mems: list[torch.Tensor] | None = None,  # per layer (B, M, H), from the previous segment
        perm_mask: torch.Tensor | None = None,  # (B, T, T) 1 = i may not see j
        target_mapping: torch.Tensor | None = None,  # (B, N, T) one-hot rows: the N targets
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> XLNetOutput:
        h, g, masks, different, positions, placement = self._start(
            input_ids, attention_mask, token_type_ids, mems, perm_mask, target_mapping)
        new_mems = [] if self.config.mem_len > 0 else None
        hidden_h, hidden_g = ([h], [g]) if output_hidden_states else (None, None)
        probs_h, probs_g = ([], []) if output_attentions else (None, None)
        for i, layer in enumerate(self.layers):
            if new_mems is not None:
                new_mems.append(self._memory(mems, i, h))
            h, g, p_h, p_g = layer(h, g, mems[i] if mems is not None else None, positions, masks,
                                   different, placement, output_attentions)
            if hidden_h is not None:
                hidden_h.append(h)
                hidden_g.append(g)
            if probs_h is not None:
                probs_h.append(p_h)
                probs_g.append(p_g)
        with_query = target_mapping is not None
        return XLNetOutput(
            last_hidden_state=self.dropout(h),
            query_hidden=self.dropout(g) if with_query else None,
            mems=new_mems,
            hidden_states=tuple(hidden_h) if hidden_h is not None else None,
            attentions=tuple(probs_h) if probs_h is not None else None,
            query_hidden_states=tuple(hidden_g) if hidden_g is not None and with_query else None,
            query_attentions=tuple(probs_g) if probs_g is not None and with_query else None,
        )
