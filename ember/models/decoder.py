"""Causal Transformer decoder: GPT-1 (Radford et al. 2018) and GPT-2 (Radford et al. 2019).

forward(input_ids, attention_mask, position_ids, cache) -> DecoderOutput with
last_hidden_state (B, T, H) where position t saw only positions <= t.

The two families are the encoder's TransformerLayer run causally, with
- learned absolute positions summed with token embeddings, no embedding LayerNorm, no
  segment embeddings and no padding row (GPT vocabularies have no pad token);
- GPT-1 (family "gpt"): post-LN layers as the original Transformer, no final LayerNorm;
- GPT-2 (family "gpt2"): pre-LN layers plus a final LayerNorm after the last layer (§2.3),
  and the residual projections (attention output, FFN down) initialised with std
  0.02/sqrt(2 * n_layer) "to account for the accumulation on the residual path" (§2.3).
Both tie the output softmax to the input embeddings; the LM logits are
``hidden @ word_embeddings.T`` (``lm_logits``), no bias.

Generation passes a ``KVCache``: keys/values of earlier positions are kept, so each new
token costs one position. Left-padded batches (batched prompts) pass the full
``attention_mask`` (B, past + T); positions then count real tokens only, as Hugging Face's
GPT-2 ``generate`` numbers them, so a prompt's outputs do not depend on its padding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ember.config import ModelConfig
from ember.errors import EmberError
from ember.models.encoder import EncoderOutput, build_layers, init_weights
from ember.nn.embeddings import InputEmbeddings
from ember.nn.kv_cache import KVCache
from ember.nn.onednn import linear


@dataclass
class DecoderOutput(EncoderOutput):
    cache: KVCache | None = None  # the cache passed in, now holding these positions too


def causal_mask(attention_mask: torch.Tensor | None, t: int, past: int,
                device: torch.device) -> torch.Tensor | None:
    """Bool (B|1, 1, T, past + T): query i (absolute position past + i) may attend key j
    when j <= past + i and key j is a real token. Every query may attend itself, so a
    padding query's row is never empty (an all-masked row would give NaN that later layers
    could spread through 0 * NaN); padding outputs are never read. None when plain causal
    attention (SDPA's is_causal) or no mask at all is exact."""
    total = past + t
    if attention_mask is None and (past == 0 or t == 1):
        return None
    q = torch.arange(past, total, device=device)[:, None]  # (T, 1)
    k = torch.arange(total, device=device)[None, :]  # (1, L)
    allowed = (k <= q)[None, None]  # (1, 1, T, L)
    if attention_mask is None:
        return allowed
    real = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, L)
    return (allowed & real) | (k == q)[None, None]


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.share_layers != "none" or (cfg.embedding_size and cfg.embedding_size != cfg.hidden_size):
            raise EmberError(f"{cfg.family} decoders have no layer sharing or factorized embeddings; "
                             "set model.share_layers=none and model.embedding_size=0")
        self.config = cfg
        self.embeddings = InputEmbeddings(cfg.vocab_size, cfg.hidden_size, cfg.max_position, 0,
                                          cfg.dropout, cfg.layer_norm_eps, pad_token_id=None,
                                          layer_norm=False)
        self.layers = build_layers(cfg)
        self.final_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps) if cfg.pre_layer_norm else None
        self.apply(lambda m: init_weights(m, cfg.initializer_range))
        if cfg.family == "gpt2":  # scaled residual projections (Radford et al. 2019, §2.3)
            std = cfg.initializer_range / math.sqrt(2 * cfg.num_layers)
            for layer in self.layers:
                nn.init.normal_(layer.attention.out.weight, mean=0.0, std=std)
                nn.init.normal_(layer.ffn.down.weight, mean=0.0, std=std)

    @property
    def word_embeddings(self) -> torch.Tensor:  # (V, H), tied to the output softmax
        return self.embeddings.word.weight

    def lm_projection(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        """The LM head as F.linear's (input, weight, bias): the tied embedding matrix, no bias.
        Losses hand these to ``ember.nn.linear_cross_entropy`` instead of forming the logits."""
        return hidden, self.word_embeddings, None

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., V) next-token logits through the tied embedding matrix."""
        return linear(*self.lm_projection(hidden))  # a decoding step's one row: ember.nn.onednn.row_product

    def shard_units(self) -> list[nn.Module]:
        """Blocks FSDP may gather one at a time (see ``Encoder.shard_units``): every layer."""
        return list(self.layers)

    def new_cache(self, capacity: int = 0) -> KVCache:
        """An empty cache; ``capacity``: positions to allocate up front (prompt + new tokens)."""
        return KVCache(len(self.layers), capacity)

    def positions(self, attention_mask: torch.Tensor | None, t: int, past: int,
                  device: torch.device) -> torch.Tensor:
        """(B|1, T) position ids of the new tokens: 0.. over real tokens only."""
        if attention_mask is None:
            return torch.arange(past, past + t, device=device)[None]
        return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past:]

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T): the new tokens (all of them without a cache)
        attention_mask: torch.Tensor | None = None,  # (B, past + T), 1 = real token
        token_type_ids: torch.Tensor | None = None,  # accepted for the common interface; unused
        position_ids: torch.Tensor | None = None,  # (B, T)
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        cache: KVCache | None = None,
    ) -> DecoderOutput:
        b, t = input_ids.shape
        past = cache.length if cache is not None else 0
        if attention_mask is not None and attention_mask.shape[-1] != past + t:
            raise EmberError(f"attention_mask covers {attention_mask.shape[-1]} positions but the "
                             f"cache holds {past} and {t} tokens are new; pass the mask of all "
                             f"{past + t} positions")
        if position_ids is None:
            position_ids = self.positions(attention_mask, t, past, input_ids.device)
        if int(position_ids.max()) >= self.config.max_position:
            raise EmberError(f"position {int(position_ids.max())} is beyond the model's "
                             f"{self.config.max_position} positions; shorten the prompt or "
                             "generate fewer tokens")
        x = self.embeddings(input_ids, None, position_ids)  # (B, T, H)
        mask = causal_mask(attention_mask, t, past, input_ids.device)
        is_causal = mask is None and past == 0
        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        for i, layer in enumerate(self.layers):
            kv = cache.layers[i] if cache is not None else None
            x, probs = layer(x, mask, need_weights=output_attentions, is_causal=is_causal, kv_cache=kv)
            if hidden_states is not None:
                hidden_states.append(x)
            if attentions is not None:
                attentions.append(probs)
        if self.final_norm is not None:
            x = self.final_norm(x)
            if hidden_states is not None:  # as transformers' GPT-2: the last entry is after ln_f
                hidden_states[-1] = x
        return DecoderOutput(
            last_hidden_state=x,
            hidden_states=tuple(hidden_states) if hidden_states is not None else None,
            attentions=tuple(attentions) if attentions is not None else None,
            cache=cache,
        )


class CausalLM(nn.Module):
    """A causal decoder with its tied LM head: what generation (``ember.generate``) and few-shot
    scoring run, and what the ``clm`` pre-training objective trains (``ember.objectives.clm``
    subclasses it to add its data and loss). Its parameters are the backbone's, under
    ``backbone.`` as in every run folder's weights."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               cache: KVCache | None = None, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Next-token logits (B, T, V) for the new tokens; ``cache`` (KVCache) grows."""
        out = self.backbone(input_ids, attention_mask, position_ids=position_ids, cache=cache)
        return self.backbone.lm_logits(out.last_hidden_state)
