"""Encoder-decoder Transformer: T5 (Raffel et al. 2020, "Exploring the Limits of Transfer
Learning with a Unified Text-to-Text Transformer"), v1.0 and v1.1.

    encode(input_ids, attention_mask) -> EncoderOutput, last_hidden_state (B, S, H)
    decode(decoder_input_ids, encoder_hidden, ...) -> Seq2SeqDecoderOutput (B, T, H) + cache
    forward(input_ids, attention_mask, *, decoder_input_ids=..., ...) -> Seq2SeqOutput (both
        stacks), or the encoder's output alone without decoder inputs
    lm_logits(decoder_hidden) -> (B, T, V);  shift_right(labels) -> decoder_input_ids

Architecture (§2.1; blocks in ember.nn.seq2seq_layer): one embedding table shared by the
encoder input, the decoder input and (v1.0) the output layer; no absolute positions but a
relative position bias per stack (ember.nn.relative_bias), bidirectional in the encoder
and causal in the decoder, computed once and shared by the stack's layers; pre-norm blocks
with scale-only LayerNorm (ember.nn.rms_norm); dropout on the embeddings, on every
sub-layer output and after each stack's final norm. The decoder is causal, with
cross-attention over the encoder output in every block.

The LM head (``lm_logits``) of v1.0 is the embedding matrix applied to h * d_model^-0.5
(Mesh TensorFlow's rescaling of tied logits); v1.1 (``tie_word_embeddings=False``) has its
own ``lm_head`` and no rescaling. Initialisation follows the released (Mesh TensorFlow)
code, with ``initializer_range`` as its factor (1.0): every projection N(0, fan_in^-0.5),
the query's additionally divided by sqrt(d_kv) (the 1/sqrt(d) that attention logits
otherwise get), embeddings N(0, 1).

BART (Lewis et al. 2020, "BART: Denoising Sequence-to-Sequence Pre-training", §2.1; family
"bart") is the same class with other ModelConfig options (ember.presets._bart): learned
absolute positions (``position_kind="learned"``, 2 offset rows as the released checkpoints)
and a LayerNorm over token + position embeddings (``embedding_norm``) instead of the relative
bias, post-LN blocks (``pre_layer_norm=False``) with LayerNorm and biases, GELU, N(0, 0.02)
init, tied output embeddings read without rescaling plus ``final_logits_bias``, decoding
started from </s> (``decoder_start_token_id``). mBART (Liu et al. 2020) is BART with
``pre_layer_norm=True`` (a final norm per stack) and ``scale_embedding``.

Decoding with a cache (ember.nn.kv_cache.EncoderDecoderCache) feeds only the new token(s):
decoder self-attention keys/values grow, the encoder's cross-attention keys/values are
computed at the first step and reused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ember.config import ModelConfig
from ember.errors import EmberError
from ember.models.decoder import DecoderOutput, causal_mask
from ember.models.encoder import EncoderOutput
from ember.nn.attention import MultiHeadAttention
from ember.nn.dropout import Dropout
from ember.nn.kv_cache import EncoderDecoderCache
from ember.nn.onednn import dense, linear
from ember.nn.embeddings import OffsetPositions
from ember.nn.relative_bias import RelativePositionBias
from ember.nn.rms_norm import RMSNorm, make_norm
from ember.nn.seq2seq_layer import Seq2SeqLayer


@dataclass
class Seq2SeqDecoderOutput(DecoderOutput):
    cross_attentions: tuple[torch.Tensor, ...] | None = None  # per layer (B, heads, T, S)


@dataclass
class Seq2SeqOutput:
    last_hidden_state: torch.Tensor  # (B, T, H): the decoder's, before the LM head
    encoder_last_hidden_state: torch.Tensor  # (B, S, H)
    encoder_hidden_states: tuple[torch.Tensor, ...] | None = None  # embeddings, then per layer
    encoder_attentions: tuple[torch.Tensor, ...] | None = None
    decoder_hidden_states: tuple[torch.Tensor, ...] | None = None
    decoder_attentions: tuple[torch.Tensor, ...] | None = None
    cross_attentions: tuple[torch.Tensor, ...] | None = None
    cache: EncoderDecoderCache | None = None


def _key_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, S) 1/0 -> bool (B, 1, 1, S), None when nothing is padded."""
    if attention_mask is None or bool(attention_mask.bool().all()):
        return None
    return attention_mask.bool()[:, None, None, :]


class Stack(nn.Module):
    """The encoder (``causal=False``) or the decoder (``causal=True``, with cross-attention)."""

    def __init__(self, cfg: ModelConfig, num_layers: int, causal: bool) -> None:
        super().__init__()
        self.causal = causal
        learned = cfg.position_kind == "learned"
        # Mesh TensorFlow folds attention's 1/sqrt(d) into the query init (T5); otherwise SDPA scales
        scale = 1.0 if cfg.init_scheme == "mesh_tf" else None
        self.layers = nn.ModuleList(
            Seq2SeqLayer(cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.intermediate_size, cfg.hidden_act,
                         cfg.dropout, cfg.attention_dropout, cfg.layer_norm_eps, cross_attention=causal,
                         pre_layer_norm=cfg.pre_layer_norm, norm=cfg.norm_kind, bias=cfg.linear_bias, scale=scale)
            for _ in range(num_layers))
        # T5: a relative position bias in the attention logits; BART: learned absolute positions
        # added to the token embeddings (then optionally a LayerNorm, BART's layernorm_embedding)
        self.position_bias = None if learned else RelativePositionBias(
            cfg.num_heads, not causal, cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance)
        self.position = OffsetPositions(cfg.max_position, cfg.hidden_size) if learned else None
        self.embedding_norm = make_norm(cfg.norm_kind, cfg.hidden_size, cfg.layer_norm_eps) if cfg.embedding_norm else None
        # pre-LN stacks end with a norm (T5's final_layer_norm, mBART's layer_norm); post-LN ones do not
        self.final_norm = make_norm(cfg.norm_kind, cfg.hidden_size, cfg.layer_norm_eps) if cfg.pre_layer_norm else None
        self.dropout = Dropout(cfg.dropout)

    def shard_units(self) -> list[nn.Module]:
        """Blocks FSDP may gather one at a time (see ``Encoder.shard_units``): every layer (the
        relative position bias is shared by the stack's layers, so it stays in the outer unit)."""
        return list(self.layers)

    def self_attention_mask(self, attention_mask: torch.Tensor | None, t: int, past: int,
                            device: torch.device) -> torch.Tensor | None:
        """T5: float (B|1, heads, T, past + T), the position bias, -inf-like where a query may not
        attend (a padding key; in the decoder also a later position). Learned positions: bool
        (B|1, 1, T, L), True = may attend, or None when every key may be attended."""
        if self.causal:  # an all-ones mask asks causal_mask for the explicit triangle
            real = attention_mask if attention_mask is not None else torch.ones(1, past + t, device=device)
            allowed = causal_mask(real, t, past, device)  # bool (B|1, 1, T, L)
        else:
            allowed = _key_mask(attention_mask)  # bool (B, 1, 1, L) or None
        if self.position_bias is None:
            return allowed
        bias = self.position_bias(t, past + t, query_offset=past)  # (1, heads, T, L)
        if allowed is None:
            return bias
        return bias.masked_fill(~allowed, torch.finfo(bias.dtype).min)

    def cached_step_mask(self, cache: EncoderDecoderCache, t: int, past: int,
                         device: torch.device) -> torch.Tensor | None:
        """``self_attention_mask`` of a decoding step without padding, from what the cache keeps:
        T5's causal bias rows past .. past + T - 1, computed once for the cache's capacity; with
        learned positions one new query may attend every cached key, so no mask at all."""
        if self.position_bias is None:
            return None if t == 1 else self.self_attention_mask(None, t, past, device)
        end = past + t
        if cache.self_bias is None or cache.self_bias.shape[-1] < end:
            size = max(end, cache.self_attention.capacity)
            cache.self_bias = self.self_attention_mask(None, size, 0, device)  # (1, heads, C, C)
        return cache.self_bias[:, :, past:end, :end]

    def embed(self, x: torch.Tensor, past: int) -> torch.Tensor:
        """Token embeddings (B, T, H) -> the first layer's input: + learned positions past .. past
        + T - 1 and the embedding norm where the model has them, then dropout."""
        if self.position is not None:
            x = x + self.position(x.shape[1], past)
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        return self.dropout(x)

    def forward(
        self,
        x: torch.Tensor,  # (B, T, H) input embeddings
        attention_mask: torch.Tensor | None = None,  # (B, past + T), 1 = real token
        memory: torch.Tensor | None = None,  # (B, S, H) encoder output (decoder only)
        memory_mask: torch.Tensor | None = None,  # (B, S)
        cache: EncoderDecoderCache | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> Seq2SeqDecoderOutput:
        b, t, _ = x.shape
        past = cache.length if cache is not None else 0
        if attention_mask is not None and attention_mask.shape[-1] != past + t:
            raise EmberError(f"attention_mask covers {attention_mask.shape[-1]} positions but the cache holds "
                             f"{past} and {t} tokens are new; pass the mask of all {past + t} positions")
        if cache is not None and attention_mask is None:
            mask = self.cached_step_mask(cache, t, past, x.device)
        else:
            mask = self.self_attention_mask(attention_mask, t, past, x.device)
        if mask is not None and mask.is_floating_point():
            mask = mask.to(x.dtype)
        if cache is None:
            memory_mask = _key_mask(memory_mask)
        elif cache.cross_attention.length == 0:  # the first step: the encoder's mask, once
            memory_mask = cache.memory_mask = _key_mask(memory_mask)
        else:
            memory_mask = cache.memory_mask
        x = self.embed(x, past)
        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        cross_attentions = [] if output_attentions and self.causal else None
        for i, layer in enumerate(self.layers):
            self_kv = cache.self_attention.layers[i] if cache is not None else None
            cross_kv = cache.cross_attention.layers[i] if cache is not None else None
            x, probs, cross_probs = layer(x, mask, memory, memory_mask, output_attentions, self_kv, cross_kv)
            if hidden_states is not None:
                hidden_states.append(x)
            if attentions is not None:
                attentions.append(probs)
            if cross_attentions is not None:
                cross_attentions.append(cross_probs)
        if self.final_norm is not None:
            x = self.dropout(self.final_norm(x))
            if hidden_states is not None:  # as transformers: the last entry is after the final norm
                hidden_states[-1] = x
        return Seq2SeqDecoderOutput(
            last_hidden_state=x,
            hidden_states=tuple(hidden_states) if hidden_states is not None else None,
            attentions=tuple(attentions) if attentions is not None else None,
            cache=cache,
            cross_attentions=tuple(cross_attentions) if cross_attentions is not None else None,
        )


class EncoderDecoder(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.share_layers != "none" or (cfg.embedding_size and cfg.embedding_size != cfg.hidden_size):
            raise EmberError(f"{cfg.family} models have no layer sharing or factorized embeddings; "
                             "set model.share_layers=none and model.embedding_size=0")
        if cfg.type_vocab_size:
            raise EmberError(f"{cfg.family} has no segment embeddings; set model.type_vocab_size=0")
        self.config = cfg
        self.shared = nn.Embedding(cfg.vocab_size, cfg.hidden_size)  # encoder, decoder (and v1.0 output)
        self.encoder = Stack(cfg, cfg.num_layers, causal=False)
        self.decoder = Stack(cfg, cfg.num_decoder_layers or cfg.num_layers, causal=True)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        # BART: token embeddings optionally times sqrt(d) (scale_embedding), and a (1, V) bias on the
        # logits, a buffer in the released models (never trained there; zeros unless imported)
        self.embed_scale = cfg.hidden_size ** 0.5 if cfg.scale_embedding else 1.0
        if cfg.final_logits_bias:
            self.register_buffer("final_logits_bias", torch.zeros(1, cfg.vocab_size))
        else:
            self.final_logits_bias = None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Mesh TensorFlow's T5 initialisation (see the module docstring), times initializer_range.
        The untied lm_head gets N(0, d_model^-0.5) like every projection, so its logits start
        at the scale of the tied head's N(0, 1) embeddings applied to h * d_model^-0.5.
        ``init_scheme="normal"`` (BART, as fairseq/transformers' init_std): every linear and
        embedding N(0, initializer_range), biases 0, norms 1 and 0."""
        f, h = self.config.initializer_range, self.config.hidden_size
        if self.config.init_scheme == "normal":
            for module in self.modules():
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(module.weight, std=f)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
                elif isinstance(module, (nn.LayerNorm, RMSNorm)):
                    module.reset_parameters() if isinstance(module, nn.LayerNorm) else nn.init.ones_(module.weight)
            self.shared.weight[self.config.pad_token_id].zero_()  # nn.Embedding(padding_idx=pad)'s zero row
            return
        nn.init.normal_(self.shared.weight, std=f)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=f * module.in_features ** -0.5)
            elif isinstance(module, RelativePositionBias):
                nn.init.normal_(module.embedding.weight, std=f * h ** -0.5)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
        for module in self.modules():
            if isinstance(module, MultiHeadAttention):  # 1/sqrt(d_kv) folded into the query
                module.q.weight.mul_(module.head_dim ** -0.5)

    @property
    def word_embeddings(self) -> torch.Tensor:  # (V, H), shared by both stacks (and the v1.0 head)
        return self.shared.weight

    def new_cache(self, capacity: int = 0) -> EncoderDecoderCache:
        """An empty cache; ``capacity``: decoder positions to allocate up front (start + new tokens)."""
        return EncoderDecoderCache(len(self.decoder.layers), capacity)

    def lm_projection(self, decoder_hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The LM head as F.linear's (input, weight, bias), for ``ember.nn.linear_cross_entropy``:
        the untied lm_head, or the shared embeddings applied to h * d_model^-0.5 (T5 v1.0) or to
        h (BART, ``scale_decoder_outputs=False``); BART's final_logits_bias as the bias."""
        bias = self.final_logits_bias[0] if self.final_logits_bias is not None else None
        if self.lm_head is not None:
            return decoder_hidden, self.lm_head.weight, bias
        if self.config.scale_decoder_outputs:
            decoder_hidden = decoder_hidden * self.config.hidden_size ** -0.5
        return decoder_hidden, self.shared.weight, bias

    def lm_logits(self, decoder_hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) decoder states -> (..., V) next-token logits."""
        if self.lm_head is not None and self.final_logits_bias is None:  # as a module: int8 heads stay usable
            return dense(self.lm_head, decoder_hidden)
        return linear(*self.lm_projection(decoder_hidden))  # one row: ember.nn.onednn.row_product

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, T, H) token embeddings of either stack (times sqrt(d) with scale_embedding)."""
        x = self.shared(ids)
        return x * self.embed_scale if self.embed_scale != 1.0 else x

    def shift_right(self, labels: torch.Tensor) -> torch.Tensor:
        """(B, T) targets -> decoder inputs: the start token (T5: the pad id; BART: </s>,
        ``decoder_start_token_id``) then the targets but the last, with ignored positions (-100)
        as padding (teacher forcing)."""
        start = self.config.decoder_start_id
        shifted = torch.cat([labels.new_full((*labels.shape[:-1], 1), start), labels[..., :-1]], dim=-1)
        return shifted.masked_fill(shifted == -100, self.config.pad_token_id)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               output_hidden_states: bool = False, output_attentions: bool = False) -> EncoderOutput:
        out = self.encoder(self.embed_tokens(input_ids), attention_mask, output_hidden_states=output_hidden_states,
                           output_attentions=output_attentions)
        return EncoderOutput(last_hidden_state=out.last_hidden_state, hidden_states=out.hidden_states,
                             attentions=out.attentions)

    def decode(self, decoder_input_ids: torch.Tensor, encoder_hidden: torch.Tensor,
               encoder_attention_mask: torch.Tensor | None = None,
               decoder_attention_mask: torch.Tensor | None = None, cache: EncoderDecoderCache | None = None,
               output_hidden_states: bool = False, output_attentions: bool = False) -> Seq2SeqDecoderOutput:
        """Decoder states (B, T, H) of the new decoder tokens (all of them without a cache);
        ``decoder_attention_mask`` covers the cached positions too: (B, past + T)."""
        return self.decoder(self.embed_tokens(decoder_input_ids), decoder_attention_mask, encoder_hidden,
                            encoder_attention_mask, cache, output_hidden_states, output_attentions)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,  # (B, S)
        attention_mask: torch.Tensor | None = None,  # (B, S)
        token_type_ids: torch.Tensor | None = None,  # the common interface's; T5 has no segments
        *,
        decoder_input_ids: torch.Tensor | None = None,  # (B, T)
        decoder_attention_mask: torch.Tensor | None = None,  # (B, past + T)
        encoder_hidden: torch.Tensor | None = None,  # (B, S, H): skip the encoder (generation)
        cache: EncoderDecoderCache | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> Seq2SeqOutput | EncoderOutput:
        """Both stacks; without decoder inputs, the encoder alone (T5EncoderModel's view), so
        code that calls every backbone as ``backbone(input_ids, attention_mask, token_type_ids)``
        gets the encoder states. Decoder inputs are keyword-only for that reason: passed third,
        they would be taken for segment ids."""
        if token_type_ids is not None and bool(token_type_ids.any()):
            raise EmberError(f"{self.config.family} has no segment embeddings, but token_type_ids has non-zero "
                             "entries: pass decoder inputs as decoder_input_ids=..., and sentence pairs as one "
                             "text (T5's 'sentence1: ... sentence2: ...' prefixes)")
        if encoder_hidden is None:
            if input_ids is None:
                raise EmberError("give input_ids (the encoder's input) or encoder_hidden (its output)")
            enc = self.encode(input_ids, attention_mask, output_hidden_states, output_attentions)
            if decoder_input_ids is None:
                return enc
        else:
            enc = EncoderOutput(last_hidden_state=encoder_hidden)
            if decoder_input_ids is None:
                raise EmberError("encoder_hidden was given without decoder_input_ids: nothing to decode")
        dec = self.decode(decoder_input_ids, enc.last_hidden_state, attention_mask, decoder_attention_mask,
                          cache, output_hidden_states, output_attentions)
        return Seq2SeqOutput(
            last_hidden_state=dec.last_hidden_state, encoder_last_hidden_state=enc.last_hidden_state,
            encoder_hidden_states=enc.hidden_states, encoder_attentions=enc.attentions,
            decoder_hidden_states=dec.hidden_states, decoder_attentions=dec.attentions,
            cross_attentions=dec.cross_attentions, cache=dec.cache,
        )
