"""Bidirectional Transformer encoder: BERT (Devlin et al. 2019) and its variants.

forward(input_ids, attention_mask, token_type_ids) -> EncoderOutput with
last_hidden_state (B, T, H), pooled (B, H) when the config has a pooler, and on request
every layer's hidden states (num_layers + 1 tensors, embeddings first) and attentions.

Options used by the variants, all from ModelConfig:
- ``embedding_size`` E < H: factorized embeddings, a V x E table then an E -> H projection
  (ALBERT, Lan et al. 2020 §3.1; ELECTRA-small, Clark et al. 2020 App. C).
- ``share_layers``: ALBERT's cross-layer parameter sharing - "all" (one layer applied
  num_layers times), "attention" or "ffn" (only that sub-layer shared), "none".
- ``embeddings=False`` builds an encoder without its own embedding tables; it is fed
  ``inputs_embeds`` from another model's embeddings (ELECTRA's generator shares the
  discriminator's, Clark et al. 2020 §3.2).
- ``num_languages`` / ``language_ids``: XLM's language embeddings (Lample & Conneau 2019,
  §3.4), ``sinusoidal_positions``: a fixed position table (ember.nn.embeddings).
- ``causal``: every position attends only to itself and to its left (XLM's causal LM,
  §3.1); see ``causal_mask_4d`` for padding.
- ``attention``: "full", or for long inputs "longformer" (Beltagy et al. 2020: a sliding window
  per layer + global positions, ember.nn.longformer; ``forward(global_attention_mask=)`` names
  the global positions, 1 = global, as transformers' LongformerModel) or "bigbird" (Zaheer et
  al. 2020: window, global and random blocks, ember.nn.bigbird) or "performer" (Choromanski et
  al. 2021: FAVOR+ random features, ember.nn.performer; causal too) or "reformer" (Kitaev et al.
  2020: shared-QK LSH attention, ember.nn.lsh).
- ``reversible``: RevNet layers (Kitaev et al. 2020 §3, ember.nn.reversible), the same pre-LN
  layers' weights run as Y1 = X1 + F(X2), Y2 = X2 + G(Y1) from (X, X), output (Y1 + Y2) / 2;
  activations are recomputed in the backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ember.config import ModelConfig
from ember.errors import EmberError
from ember.nn.embeddings import InputEmbeddings
from ember.nn.bigbird import BigBirdAttention
from ember.nn.heads import Pooler
from ember.nn.longformer import LongformerAttention, LongMask
from ember.nn.lsh import LSHAttention
from ember.nn.performer import PerformerAttention
from ember.nn.query_rows import QueryRows
from ember.nn.reversible import layer_blocks, reversible_stack
from ember.nn.transformer import TransformerLayer


@dataclass
class EncoderOutput:
    last_hidden_state: torch.Tensor  # (B, T, H)
    pooled: torch.Tensor | None = None  # (B, H)
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


def attention_mask_4d(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """The attention mask SDPA takes, from either of the masks the encoder accepts:

    * (B, T) 1/0 padding mask -> bool (B, 1, 1, T), broadcast over heads and queries; None
      when nothing is padded: SDPA then needs no mask and may pick its fused kernel (as
      transformers does for an all-ones mask);
    * (B, T, T) visibility, True where query i may attend to key j (e.g. K-BERT's visible
      matrix, Liu et al. 2020 eq. 4) -> bool (B, 1, T, T). Each token always sees itself: a
      row that sees nothing (a padding query) would make the softmax NaN, and a NaN value
      spreads to every token in the next layer even where its attention weight is 0."""
    if attention_mask is None:
        return None
    mask = attention_mask.bool()
    if mask.dim() == 3:
        return (mask | torch.eye(mask.shape[-1], dtype=torch.bool, device=mask.device))[:, None]
    if bool(mask.all()):
        return None
    return mask[:, None, None, :]


def causal_mask_4d(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """The mask of a causal encoder: None (SDPA's ``is_causal``) when nothing is padded,
    else bool (B, 1, T, T) allowing key j for query i when j <= i and j is a real token, or
    j == i (a pad query then still has one key: no all-masked softmax row, whose output
    nothing reads). Real tokens see exactly what transformers' causal XLM lets them see."""
    if attention_mask is None or bool(attention_mask.bool().all()):
        return None
    t = attention_mask.shape[1]
    eye = torch.eye(t, dtype=torch.bool, device=attention_mask.device)
    if attention_mask.dim() == 3:  # a (B, T, T) visibility, also limited to the left
        keys = attention_mask.bool()[:, None] | eye
    else:
        keys = attention_mask.bool()[:, None, None, :] | eye  # (B, 1, T, T)
    return keys & torch.ones(t, t, dtype=torch.bool, device=attention_mask.device).tril()


def init_weights(module: nn.Module, std: float) -> None:
    """BERT initialisation: N(0, 0.02) weights, zero biases, unit LayerNorm."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def build_attention(cfg: ModelConfig, index: int) -> nn.Module | None:
    """Layer ``index``'s attention when ``model.attention`` is not full (None: the layer's own
    full SelfAttention)."""
    if cfg.attention == "longformer":
        return LongformerAttention(cfg.hidden_size, cfg.num_heads, cfg.attention_dropout,
                                   cfg.attention_windows[index], cfg.attention_dilations[index])
    if cfg.attention == "bigbird":
        return BigBirdAttention(cfg.hidden_size, cfg.num_heads, cfg.attention_dropout, cfg.attention_block,
                                cfg.attention_random_blocks)
    if cfg.attention == "performer":  # causal (XLM's CLM) through prefix sums; seed: the layer's own eval draw
        return PerformerAttention(cfg.hidden_size, cfg.num_heads, cfg.attention_dropout, cfg.attention_features,
                                  cfg.causal, seed=index)
    if cfg.attention == "reformer":  # seed: the layer's own eval-mode rotations
        return LSHAttention(cfg.hidden_size, cfg.num_heads, cfg.attention_dropout, cfg.attention_buckets,
                            cfg.attention_hashes, cfg.attention_chunk, seed=index)
    return None


def build_layers(cfg: ModelConfig) -> nn.ModuleList:
    """The stored layers (the GPT decoder runs the same ones causally). Sharing "all" stores
    one; "attention"/"ffn" store num_layers layers of which only layer 0 owns the shared
    sub-layer (the others borrow it at call time)."""
    def layer(index: int, own_attention: bool = True, own_ffn: bool = True) -> TransformerLayer:
        return TransformerLayer(
            cfg.hidden_size, cfg.num_heads, cfg.intermediate_size, cfg.hidden_act,
            cfg.dropout, cfg.attention_dropout, cfg.layer_norm_eps, cfg.pre_layer_norm,
            own_attention, own_ffn, build_attention(cfg, index) if own_attention else None,
        )

    if cfg.share_layers == "all":
        return nn.ModuleList([layer(0)])
    if cfg.share_layers == "attention":
        return nn.ModuleList([layer(0)] + [layer(i, own_attention=False) for i in range(1, cfg.num_layers)])
    if cfg.share_layers == "ffn":
        return nn.ModuleList([layer(0)] + [layer(i, own_ffn=False) for i in range(1, cfg.num_layers)])
    return nn.ModuleList(layer(i) for i in range(cfg.num_layers))


def output_at_rows(backbone: nn.Module, rows: torch.Tensor, *args, **kwargs):
    """``backbone(*args, **kwargs)`` with last_hidden_state (N, H), the output at ``rows`` (bool
    (B, T)) only: a backbone whose ``takes_rows`` is True runs its last layer only there
    (``Encoder(rows=)``), any other computes every position and hands back those rows."""
    if getattr(backbone, "takes_rows", False):
        return backbone(*args, rows=rows, **kwargs)
    out = backbone(*args, **kwargs)
    out.last_hidden_state = out.last_hidden_state[rows]
    return out


class Encoder(nn.Module):
    # forward(..., rows=) runs the last layer only at the rows read (ember.nn.query_rows); callers
    # ask for it through output_at_rows; set False to compute it everywhere
    takes_rows = True

    def __init__(self, cfg: ModelConfig, embeddings: bool = True) -> None:
        super().__init__()
        self.config = cfg
        self.takes_rows = type(self).takes_rows and cfg.attention == "full" and not cfg.reversible  # a band's queries are blocks (a subclass may say no)
        e = cfg.embedding_size or cfg.hidden_size
        self.embeddings = InputEmbeddings(
            cfg.vocab_size, e, cfg.max_position, cfg.type_vocab_size,
            cfg.dropout, cfg.layer_norm_eps, cfg.pad_token_id,
            num_languages=cfg.num_languages, sinusoidal=cfg.sinusoidal_positions,
        ) if embeddings else None
        self.embed_project = nn.Linear(e, cfg.hidden_size) if e != cfg.hidden_size else None
        self.layers = build_layers(cfg)
        self.final_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps) if cfg.pre_layer_norm else None
        self.pooler = Pooler(cfg.hidden_size) if cfg.pooler else None
        self.apply(lambda m: init_weights(m, cfg.initializer_range))

    @property
    def word_embeddings(self) -> torch.Tensor:  # (V, E), tied to the MLM decoder
        return self.embeddings.word.weight

    def layer_sequence(self):
        """(layer, donor) for each of the num_layers applications, in order."""
        first = self.layers[0]
        if self.config.share_layers == "all":
            return [(first, None)] * self.config.num_layers
        return [(layer, first) for layer in self.layers]

    def shard_units(self) -> list[nn.Module]:
        """The blocks a sharded data-parallel wrapper (FSDP, ember.train.fsdp) may gather one at
        a time: modules whose parameters only their own forward uses. With ALBERT's sharing a
        layer borrows layer 0's sub-layer at call time, so the encoder is then one unit."""
        # reversible layers call their sub-layers inside one autograd function: one unit too
        return list(self.layers) if self.config.share_layers == "none" and not self.config.reversible else []

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,  # (B, T) padding or (B, T, T) visibility
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,  # (B, T) or (T,); default 0..T-1
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        inputs_embeds: torch.Tensor | None = None,  # (B, T, E) from an embeddings module
        language_ids: torch.Tensor | None = None,  # (B, T) XLM language of each token
        rows: torch.Tensor | None = None,  # bool (B, T): only these rows of the output are read
        global_attention_mask: torch.Tensor | None = None,  # (B, T) 1 = global (model.attention=longformer)
    ) -> EncoderOutput:
        """With ``rows``, last_hidden_state is (N, H), the full output's ``[rows]``, and the last
        layer runs its queries, feed-forward and norms only there (ember.nn.query_rows: the same
        numbers to float rounding, same dropout masks); pooled is computed as without it."""
        x, mask, is_causal = self.embed(input_ids, attention_mask, token_type_ids, position_ids,
                                        inputs_embeds, language_ids, global_attention_mask)
        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        if self.config.reversible:
            return self.reversible(x, mask, hidden_states, attentions, rows)
        sequence = self.layer_sequence()
        at_rows = rows is not None and self.takes_rows and not (is_causal or output_hidden_states or output_attentions)
        for layer, donor in sequence[:-1] if at_rows else sequence:
            x, probs = layer(x, mask, need_weights=output_attentions, donor=donor, is_causal=is_causal)
            self.record(x, probs, hidden_states, attentions)
        if not at_rows:
            out = self.finish(x, hidden_states, attentions)
            if rows is not None:
                out.last_hidden_state = out.last_hidden_state[rows]
            return out
        need = rows.clone()
        if self.pooler is not None:
            need[:, 0] = True  # the pooler reads [CLS]; as the first read row it stays at column 0
        query_rows = QueryRows.of(need)
        layer, donor = sequence[-1]
        x, _ = layer(x, mask, donor=donor, rows=query_rows)  # (B, Q, H)
        out = self.finish(x, None, None)
        out.last_hidden_state = out.last_hidden_state[query_rows.valid & rows.gather(1, query_rows.index)]
        return out

    def reversible(self, x: torch.Tensor, mask, hidden_states: list | None, attentions: list | None,
                   rows: torch.Tensor | None) -> EncoderOutput:
        """model.reversible: the layers as RevNet blocks (ember.nn.reversible); with hidden states
        asked for, the same computation through ordinary autograd (each layer's is its streams' mean)."""
        if attentions is not None:
            raise EmberError("model.reversible=true does not keep attention probabilities (it recomputes "
                             "each layer in the backward); ask for hidden states instead")
        blocks = layer_blocks(self.layer_sequence(), mask, self.config.ffn_chunk)
        y1, y2 = reversible_stack(x, blocks, plain=hidden_states is not None, states=hidden_states)
        out = self.finish((y1 + y2) / 2, hidden_states, None)
        if rows is not None:
            out.last_hidden_state = out.last_hidden_state[rows]
        return out

    def embed(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
              language_ids=None, global_attention_mask=None) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
        """(layer input (B, T, H), the layers' attention mask - a LongMask for model.attention=longformer -,
        whether SDPA's causal triangle is used)."""
        if inputs_embeds is not None:
            x = inputs_embeds
        else:
            x = self.embeddings(input_ids, token_type_ids, position_ids, language_ids)
        if self.embed_project is not None:
            x = self.embed_project(x)  # (B, T, E) -> (B, T, H)
        if self.config.attention != "full":
            b, t = x.shape[:2]
            return x, LongMask.of(attention_mask, global_attention_mask, b, t, x.device,
                                  self.config.attention_global), False
        if global_attention_mask is not None:
            raise EmberError("global_attention_mask is read by model.attention=longformer; with full "
                             "attention every token already attends to every other")
        causal = self.config.causal
        mask = causal_mask_4d(attention_mask) if causal else attention_mask_4d(attention_mask)
        return x, mask, causal and mask is None  # SDPA's triangle; no (T, T) mask to build

    @staticmethod
    def record(x, probs, hidden_states: list | None, attentions: list | None) -> None:
        """Keep a layer's output and attention probabilities when they were asked for."""
        if hidden_states is not None:
            hidden_states.append(x)
        if attentions is not None:
            attentions.append(probs)

    def finish(self, x: torch.Tensor, hidden_states: list | None, attentions: list | None) -> EncoderOutput:
        """The final norm (pre-LN), the pooler and the output of the last layer's states x."""
        if self.final_norm is not None:
            x = self.final_norm(x)
        return EncoderOutput(
            last_hidden_state=x,
            pooled=self.pooler(x) if self.pooler is not None else None,
            hidden_states=tuple(hidden_states) if hidden_states is not None else None,
            attentions=tuple(attentions) if attentions is not None else None,
        )
