"""Configuration: frozen dataclasses, named presets, YAML load/save and dotted overrides.

A run is described by three parts: ``model`` (the backbone's shape), ``data`` (corpus and
sequence construction) and ``train`` (optimisation and budgets). Recipes in ``recipes/``
are YAML files with those three sections; ``--set train.lr=1e-4`` overrides any field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from ember.errors import EmberError


SHARE_MODES = ("none", "all", "attention", "ffn")
# Every family below is the same Encoder with different options; the family name decides
# how checkpoints are named when exchanged with Hugging Face (ember.interop).
ENCODER_FAMILIES = ("bert", "roberta", "albert", "electra", "distilbert", "xlm")
# Causal decoders (ember.models.decoder): GPT-1 ("gpt") and GPT-2 ("gpt2").
DECODER_FAMILIES = ("gpt", "gpt2")
# Encoder-decoders (ember.models.encoder_decoder): T5 v1.0 and v1.1 ("t5").
SEQ2SEQ_FAMILIES = ("t5",)
ATTN_TYPES = ("bi", "uni")  # XLNet's attention: bidirectional (XLNet) or causal (Transformer-XL)
LSTM_POOLINGS = ("last", "linear_gain")  # the LSTM classifier's read-out (Dai & Le 2015, §2-3)


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Transformer encoder (BERT, Devlin et al. 2019, Table/§3 and App. A)."""

    family: str = "bert"
    vocab_size: int = 30522
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 1024
    max_position: int = 512
    type_vocab_size: int = 2  # 0: no segment embeddings (RoBERTa/DistilBERT style)
    hidden_act: str = "gelu"  # exact erf GELU, as the original TF BERT
    dropout: float = 0.1
    attention_dropout: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    pre_layer_norm: bool = False  # BERT is post-LN; GPT-2 style pre-LN is an option
    pooler: bool = True  # [CLS] dense+tanh pooler used by NSP and classification
    embedding_size: int = 0  # E; 0 = hidden_size. E < H factorizes embeddings (ALBERT, ELECTRA)
    share_layers: str = "none"  # ALBERT cross-layer sharing: none | all | attention | ffn
    # T5 (Raffel et al. 2020; family "t5"). num_layers is the encoder's depth, hidden_act
    # "relu" (v1.0) or "gated-gelu_new" (v1.1's gated-GELU), layer_norm_eps T5's 1e-6;
    # max_position is the length trained on (relative positions set no hard limit).
    num_decoder_layers: int = 0  # 0 = as many as the encoder
    head_dim: int = 0  # d_kv, per-head size; 0 = hidden_size / num_heads
    relative_attention_num_buckets: int = 32  # §2.1: 32 log-spaced buckets ...
    relative_attention_max_distance: int = 128  # ... up to an offset of 128
    # v1.0: the LM head is the input embedding matrix, applied to h * d_model^-0.5; False: an
    # own lm_head (v1.1, "no parameter sharing between embedding and classifier layer")
    tie_word_embeddings: bool = True
    # XLNet / Transformer-XL (family "xlnet", ember.models.xlnet; Yang et al. 2019, Dai et al.
    # 2019 §3.2-3.3). Other families ignore these. max_position is the segment length trained on.
    mem_len: int = 0  # hidden states per layer kept as memory for the next segment; 0 = none
    reuse_len: int = 0  # only a segment's first reuse_len positions enter the memory; 0 = all
    clamp_len: int = -1  # relative distances clipped to +-clamp_len; -1 = never
    bi_data: bool = False  # 2nd half of each batch reads with mirrored relative positions
    attn_type: str = "bi"  # "bi" (XLNet) or "uni" (causal, Transformer-XL)
    # XLM (Lample & Conneau 2019, §3.4 and Fig. 2): a learned language embedding added to
    # the token and position embeddings, a table of num_languages rows (0 = none);
    # ``languages`` names them in id order ("en,ru": en = 0, ru = 1), as HF's id2lang.
    num_languages: int = 0
    languages: str = ""
    sinusoidal_positions: bool = False  # fixed sin/cos position table (XLM's option) instead of learned
    causal: bool = False  # every position attends only to itself and the left (XLM's CLM, §3.1)
    # LSTM (family "lstm", ember.models.lstm; Dai & Le 2015 "Semi-supervised Sequence Learning"):
    # embedding_size is the word-embedding width (0 = hidden_size), hidden_size the LSTM cells per
    # layer, dropout the dropout between LSTM layers and on the top layer's outputs; max_position
    # only bounds the input length (an LSTM has no position table). Other families ignore these.
    embedding_dropout: float = 0.0  # dropout on the word embeddings (Dai & Le §4: embedding dropout)
    # How the LSTM classifier reads the label off the states (ember.tasks.lstm_classifier): "last"
    # (the final state, §2) or "linear_gain" (a prediction at every step, weighted t/T, §3)
    lstm_pooling: str = "last"

    def __post_init__(self) -> None:
        if self.share_layers not in SHARE_MODES:
            raise EmberError(f"model.share_layers={self.share_layers!r}; choose one of {', '.join(SHARE_MODES)}")
        if self.head_dim < 0 or self.num_decoder_layers < 0:
            raise EmberError(f"model.head_dim={self.head_dim} and model.num_decoder_layers="
                             f"{self.num_decoder_layers} must be >= 0 (0 = derived from the encoder)")
        if self.attn_type not in ATTN_TYPES:
            raise EmberError(f"model.attn_type={self.attn_type!r}; choose one of {', '.join(ATTN_TYPES)}")
        if self.mem_len < 0 or self.reuse_len < 0:
            raise EmberError(f"model.mem_len={self.mem_len} and model.reuse_len={self.reuse_len} must be "
                             ">= 0 (0: no memory / every position reused)")
        if self.hidden_size % self.num_heads and not self.head_dim:
            raise EmberError(
                f"model.hidden_size={self.hidden_size} is not divisible by "
                f"model.num_heads={self.num_heads}; pick sizes where hidden_size/num_heads is whole "
                "(or set model.head_dim, T5's d_kv)"
            )
        if self.num_languages == 1 or self.num_languages < 0:
            raise EmberError(f"model.num_languages={self.num_languages}: use 0 (no language embeddings) "
                             "or the number of languages (at least 2); one language needs no embedding")
        codes = self.language_codes
        if codes and len(codes) != self.num_languages:
            raise EmberError(f"model.languages={self.languages!r} names {len(codes)} languages but "
                             f"model.num_languages={self.num_languages}; give one code per language id")
        if len(set(codes)) != len(codes):
            raise EmberError(f"model.languages={self.languages!r} repeats a language code")
        if self.lstm_pooling not in LSTM_POOLINGS:
            raise EmberError(f"model.lstm_pooling={self.lstm_pooling!r}; choose one of {', '.join(LSTM_POOLINGS)}")
        if not 0.0 <= self.embedding_dropout < 1.0:
            raise EmberError(f"model.embedding_dropout={self.embedding_dropout} must be in [0, 1)")

    @property
    def language_codes(self) -> list[str]:
        """``languages`` as a list, index = language id ([] when unnamed)."""
        return [c.strip() for c in self.languages.split(",") if c.strip()]

    def language_id(self, code: str) -> int:
        """The language id of ``code`` for this model (XLM): its index in ``languages``."""
        codes = self.language_codes
        if code not in codes:
            raise EmberError(f"language {code!r} is not one of this model's languages "
                             f"({', '.join(codes) or 'none: model.languages is empty'}); "
                             "give one of those codes")
        return codes.index(code)


def _bert(layers: int, hidden: int) -> ModelConfig:
    # Turc et al. 2019 ("Well-Read Students Learn Better") miniatures and the BERT paper's
    # base/large: heads = hidden/64, feed-forward = 4*hidden.
    return ModelConfig(
        num_layers=layers, hidden_size=hidden, num_heads=max(1, hidden // 64),
        intermediate_size=4 * hidden,
    )


def _albert(layers: int, hidden: int, embedding: int = 128) -> ModelConfig:
    # ALBERT (Lan et al. 2020, Table 1): E = 128, all layers shared, heads = H/64, FFN = 4H,
    # GELU (tanh form in the released models), no dropout in the released v2 models - we
    # keep BERT's 0.1 as the paper's v1 did, since small corpora overfit.
    return dataclasses.replace(_bert(layers, hidden), family="albert", embedding_size=embedding,
                               share_layers="all", hidden_act="gelu_new")


def _electra(layers: int, hidden: int, embedding: int, heads: int) -> ModelConfig:
    # ELECTRA (Clark et al. 2020, App. C Table 6): small = 12 layers, H 256, E 128, 4 heads.
    return dataclasses.replace(_bert(layers, hidden), family="electra", embedding_size=embedding,
                               num_heads=heads, pooler=False)


def _xlm(layers: int, hidden: int, heads: int) -> ModelConfig:
    # XLM (Lample & Conneau 2019, §5.1): post-LN Transformer, GELU, dropout 0.1, learned
    # positions, FFN 4H (fixed in the released code), LN eps 1e-12; no segment embeddings
    # (language embeddings instead: recipes set num_languages/languages) and no pooler
    # (classification reads the first token, as transformers' XLMForSequenceClassification).
    return dataclasses.replace(_bert(layers, hidden), family="xlm", num_heads=heads,
                               type_vocab_size=0, pooler=False)


def _gpt2(layers: int, hidden: int, heads: int) -> ModelConfig:
    # GPT-2 (Radford et al. 2019, Table 2 and §2.3; the released hparams): 1024 positions,
    # vocabulary 50257, FFN 4H with the tanh GELU, pre-LN with a final LayerNorm, LN eps 1e-5,
    # dropout 0.1. Recipes set vocab_size to their own tokenizer's.
    return ModelConfig(
        family="gpt2", vocab_size=50257, hidden_size=hidden, num_layers=layers, num_heads=heads,
        intermediate_size=4 * hidden, max_position=1024, type_vocab_size=0, hidden_act="gelu_new",
        layer_norm_eps=1e-5, pre_layer_norm=True, pooler=False,
    )


def _t5(layers: int, hidden: int, heads: int, ffn: int, v1_1: bool = False) -> ModelConfig:
    # T5 (Raffel et al. 2020, §2.1 and §3.1.1): 64-wide heads (d_kv), no biases, scale-only
    # LayerNorm with eps 1e-6, relative position buckets, the 32,128-entry SentencePiece
    # vocabulary (32,000 pieces + 100 sentinels, padded), pad id 0 (also the decoder start),
    # dropout 0.1, pre-training on 512-token inputs. v1.1 (the T5 repository's released
    # checkpoints notes): gated-GELU feed-forward, untied LM head, and "dropout was turned off
    # in pre-training ... should be re-enabled during fine-tuning" (model.dropout=0.1).
    # Recipes set vocab_size to their own tokenizer's.
    dropout = 0.0 if v1_1 else 0.1
    return ModelConfig(
        family="t5", vocab_size=32128, hidden_size=hidden, num_layers=layers, num_heads=heads,
        head_dim=64, intermediate_size=ffn, max_position=512, type_vocab_size=0,
        hidden_act="gated-gelu_new" if v1_1 else "relu", dropout=dropout, attention_dropout=dropout,
        layer_norm_eps=1e-6, initializer_range=1.0, pre_layer_norm=True, pooler=False,
        tie_word_embeddings=not v1_1,
    )


def _xlnet(layers: int, hidden: int, heads: int, seq_len: int, mem_len: int) -> ModelConfig:
    # XLNet (Yang et al. 2019, §3.1 and App. A Table 7; the released xlnet_config.json): post-LN
    # Transformer-XL layers, FFN 4H with the exact GELU, LN eps 1e-12, dropout 0.1, a 32,000-piece
    # SentencePiece vocabulary, 512-token segments with a memory of 384 positions. No absolute
    # positions and no pooler (the sequence summary is a task head).
    return ModelConfig(
        family="xlnet", vocab_size=32000, hidden_size=hidden, num_layers=layers, num_heads=heads,
        intermediate_size=4 * hidden, max_position=seq_len, hidden_act="gelu", layer_norm_eps=1e-12,
        pooler=False, mem_len=mem_len,
    )


def _lstm(hidden: int, embedding: int, layers: int = 1) -> ModelConfig:
    # Dai & Le 2015 (§4.1, IMDB): one LSTM layer of 1024 cells over 512-wide word embeddings, the
    # classifier on the last state; dropout tuned per task. No attention, positions or segments:
    # max_position only bounds the input length. Word embeddings start uniform in +-0.1
    # (initializer_range), the LSTM weights in +-1/sqrt(hidden) (PyTorch's default).
    return ModelConfig(family="lstm", hidden_size=hidden, embedding_size=embedding, num_layers=layers,
                       num_heads=1, intermediate_size=0, max_position=1024, type_vocab_size=0,
                       pooler=False, dropout=0.1, initializer_range=0.1)


MODEL_PRESETS: dict[str, ModelConfig] = {
    "bert-tiny": _bert(2, 128),
    "bert-mini": _bert(4, 256),
    "bert-small": _bert(4, 512),
    "bert-medium": _bert(8, 512),
    "bert-base": _bert(12, 768),
    "bert-large": _bert(24, 1024),
    # RoBERTa (Liu et al. 2019): BERT shapes, one (unused) segment embedding, LN eps 1e-5.
    "roberta-mini": dataclasses.replace(_bert(4, 256), family="roberta", type_vocab_size=1, layer_norm_eps=1e-5),
    "roberta-base": dataclasses.replace(_bert(12, 768), family="roberta", type_vocab_size=1, layer_norm_eps=1e-5),
    "roberta-large": dataclasses.replace(_bert(24, 1024), family="roberta", type_vocab_size=1, layer_norm_eps=1e-5),
    "albert-mini": _albert(4, 256),
    "albert-base": _albert(12, 768),
    "albert-large": _albert(24, 1024),
    "albert-xlarge": _albert(24, 2048),
    "albert-xxlarge": dataclasses.replace(_albert(12, 4096), intermediate_size=16384),
    "electra-mini": _electra(4, 256, 128, 4),
    "electra-small": _electra(12, 256, 128, 4),
    "electra-base": _electra(12, 768, 768, 12),
    "electra-large": _electra(24, 1024, 1024, 16),
    # DistilBERT (Sanh et al. 2019, §3): BERT-base with half the layers, no token-type
    # embeddings and no pooler.
    "distilbert": dataclasses.replace(_bert(6, 768), family="distilbert", type_vocab_size=0, pooler=False),
    # XLM: a miniature for this machine and the paper's XNLI size (§5.1: 1024 hidden units,
    # 8 heads; 12 layers as the released xlm-mlm-tlm-xnli15-1024).
    "xlm-mini": _xlm(4, 256, 4),
    "xlm-1024": _xlm(12, 1024, 8),
    # GPT-2 miniatures for this machine, then the four published sizes (Radford et al. 2019).
    "gpt2-tiny": _gpt2(2, 128, 2),
    "gpt2-mini": _gpt2(4, 256, 4),
    "gpt2-small": _gpt2(12, 768, 12),
    "gpt2-medium": _gpt2(24, 1024, 16),
    "gpt2-large": _gpt2(36, 1280, 20),
    "gpt2-xl": _gpt2(48, 1600, 25),
    # GPT-1 (Radford et al. 2018, §4.1): 12 layers, 768 wide, 12 heads, FFN 3072, 512 learned
    # positions, 40,478-token BPE vocabulary, post-LN, GELU (tanh form in the released code).
    "gpt1": dataclasses.replace(_gpt2(12, 768, 12), family="gpt", vocab_size=40478, max_position=512,
                                pre_layer_norm=False),
    # T5 miniatures for a 2-core CPU, the paper's v1.0 architecture at BERT-tiny / BERT-mini
    # width and depth per stack (Turc et al. 2019): encoder and decoder of 2 x 128 and
    # 4 x 256. A span-corruption training step (32 inputs of 128 tokens, 32-token targets) of
    # t5-mini costs 1.6 bert-mini MLM steps on the same inputs (1.81 vs 1.13 s CPU time, one
    # thread, benchmarks/t5_costs.py): the decoder runs on the short targets only.
    "t5-tiny": _t5(2, 128, 2, 512),
    "t5-mini": _t5(4, 256, 4, 1024),
    # Raffel et al. 2020, §3.7 / Table 14: Small 60M (6 + 6 layers, d_model 512, d_ff 2048,
    # 8 heads), Base 220M (12 + 12, 768, 3072, 12 heads).
    "t5-small": _t5(6, 512, 8, 2048),
    "t5-base": _t5(12, 768, 12, 3072),
    # T5 v1.1 (released checkpoints notes): small 8 + 8 layers, d_model 512, d_ff 1024,
    # 6 heads; base 12 + 12, 768, 2048, 12 heads.
    "t5-v1_1-small": _t5(8, 512, 6, 1024, v1_1=True),
    "t5-v1_1-base": _t5(12, 768, 12, 2048, v1_1=True),
    # XLNet: a bert-mini-sized model for this CPU (128-token segments, memory 3/4 of that as
    # 384/512 in the paper), then the published Base and Large.
    "xlnet-mini": _xlnet(4, 256, 4, 128, 96),
    "xlnet-base": _xlnet(12, 768, 12, 512, 384),
    "xlnet-large": _xlnet(24, 1024, 16, 512, 384),
    # LSTM (Dai & Le 2015): the paper's IMDB size, and a CPU size (half as wide: a training step
    # costs ~3x less, 2.3k vs 0.76k tokens/s on one core at an 8k vocabulary).
    "lstm-dai-le": _lstm(1024, 512),
    "lstm-mini": _lstm(512, 256),
}


def model_preset(name: str) -> ModelConfig:
    try:
        return MODEL_PRESETS[name]
    except KeyError:
        raise EmberError(
            f"unknown model preset {name!r}; choose one of: {', '.join(MODEL_PRESETS)}"
        ) from None


@dataclass(frozen=True)
class DataConfig:
    """Where pre-training data comes from and how sequences are built."""

    prepared: str = ""  # folder written by `ember prepare`
    max_seq_length: int = 128
    short_seq_prob: float = 0.1  # BERT: 10% of sequences get a shorter random target length
    mask_prob: float = 0.15
    max_predictions: int = 20  # BERT's max_predictions_per_seq for length 128
    nsp: bool = True
    eval_examples: int = 512  # held-out sequences scored at each evaluation
    # Which units are masked together (ember.objectives.masking): "token" (BERT),
    # "whole_word" (all pieces of a word), "phrase" (ERNIE: corpus/phrase-detector spans
    # stored by `ember prepare`, else whole words), "span" (SpanBERT geometric spans).
    masking: str = "token"
    span_p: float = 0.2  # SpanBERT: span length in words ~ Geometric(p), clipped at max_span
    max_span: int = 10
    # How sequences are packed: "segments" (BERT chunks split into A/B for NSP/SOP, or one
    # segment without), "full_sentences" (RoBERTa: contiguous sentences, may cross
    # documents, separated by [SEP]) or "doc_sentences" (RoBERTa: never cross a document).
    packing: str = "segments"
    static_masks: int = 0  # 0 = dynamic masking; N = each sequence has N fixed masks (RoBERTa §4.1)


@dataclass(frozen=True)
class ElectraConfig:
    """ELECTRA's generator/discriminator settings (Clark et al. 2020, §3.2 and App. C)."""

    generator_size: float = 0.25  # generator hidden size (and heads, FFN) as a fraction of the discriminator's
    generator_layers: float = 1.0  # fraction of the discriminator's layers
    discriminator_weight: float = 50.0  # lambda in L = L_MLM + lambda * L_Disc
    temperature: float = 1.0  # sampling temperature for the replacements


@dataclass(frozen=True)
class ElmoConfig:
    """ELMo's biLM and its word-level data (Peters et al. 2018, §3.1 and §3.4; char-CNN and
    highway after Kim et al. 2016 / Jozefowicz et al. 2016). Used when ``objective: bilm``;
    ``data.prepared`` then names raw text (files, folders or globs), read word by word."""

    # token representation: char CNN -> highway -> projection (shared by both directions)
    char_dim: int = 16
    filters: str = "1:32,2:32,3:64,4:128"  # width:count per convolution; counts summed = CNN width
    highway_layers: int = 1
    max_word_chars: int = 50  # characters per word including the begin/end-of-word markers
    projection_dim: int = 128  # token representation size = LSTM projection size
    # biLSTM LM (paper: 2 layers of 4096 cells projected to 512, residual between layers)
    num_layers: int = 2
    hidden_size: int = 256  # LSTM cells per layer and direction
    dropout: float = 0.1
    # word vocabulary of the shared softmax: the corpus's most frequent words + <unk> <s> </s>
    vocab_size: int = 20000
    lowercase: bool = False  # the paper's model is cased; lower-case when the task text is
    max_corpus_words: int = 0  # stop reading the corpus after this many words (0 = all)
    valid_every: int = 50  # every N-th document is held out for perplexity


@dataclass(frozen=True)
class DenoisingConfig:
    """T5's unsupervised objectives (Raffel et al. 2020, §3.1.4 and §3.3; ember.objectives.
    span_corruption): the encoder's input length is ``data.max_seq_length`` (T5: 512)."""

    noise_density: float = 0.15  # share of tokens corrupted (§3.3.3: 10/15/25/50% compared)
    mean_noise_span_length: float = 3.0  # span_corruption: mean span length (§3.3.4: 2/3/5/10)
    random_token_prob: float = 0.1  # bert_denoising: corrupted tokens given a random token, not the mask


@dataclass(frozen=True)
class PlmConfig:
    """XLNet's permutation language model (objective ``plm``; Yang et al. 2019 §2.3, App. A and
    the released data pipeline). Sequences are ``A <sep> B <sep> <cls>`` of data.max_seq_length
    tokens, each with the model.mem_len tokens before it as Transformer-XL memory."""

    k: float = 6.0  # partial prediction: about 1/K of the tokens, the last 1/K of the order, are targets
    num_predict: int = 0  # targets per sequence; 0 = round(max_seq_length / k) (512 / 6 -> 85)
    max_span: int = 5  # a predicted span covers n <= max_span whole words, P(n) proportional to 1/n
    random_segment_prob: float = 0.5  # B comes from a random place in the corpus, not after A


@dataclass(frozen=True)
class XlmConfig:
    """XLM's data mix (Lample & Conneau 2019, §3.1 and §3.3), for objectives xlm_mlm,
    xlm_clm, tlm and xlm_mlm_tlm on a corpus prepared with language codes."""

    alpha: float = 0.5  # q_i = p_i^alpha / sum_j p_j^alpha: languages sampled with this exponent
    tlm_fraction: float = 0.5  # xlm_mlm_tlm: share of sequences that are TLM pairs (the rest MLM streams)


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation, budgets, logging and checkpointing."""

    seed: int = 0
    lr: float = 5e-4
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-6
    batch_size: int = 32  # sequences per optimizer step, over all ranks and accumulation
    grad_accum: int = 1
    max_grad_norm: float = 1.0
    max_steps: int = 10000
    max_time: float = 0.0  # seconds of training-step time on `clock`; 0 = no limit
    # Which clock max_time and the logged `elapsed` use: "wall" (time.perf_counter) or "cpu"
    # (this process's CPU time, time.process_time). "cpu" makes time budgets mean the same
    # compute on a shared, busy machine; with one thread (num_threads=1) it counts no
    # spin-waiting, so it measures work done.
    clock: str = "wall"
    warmup_steps: int = 0
    warmup_ratio: float = 0.01  # used when warmup_steps is 0
    # linear warm-up then linear decay to 0 at max_steps; "constant"; "stlr" (ULMFiT);
    # "time": the same warm-up/decay laid over the time budget max_time (cramming-style)
    schedule: str = "linear"
    stlr_cut_frac: float = 0.1  # STLR: fraction of steps with increasing lr (Howard & Ruder 2018, eq. 3)
    stlr_ratio: float = 32.0  # STLR: how much smaller the lowest lr is than the peak
    eval_every: int = 500
    save_every: int = 500
    log_every: int = 10
    keep_checkpoints: int = 2
    device: str = "cpu"
    dtype: str = "float32"  # "bfloat16" turns on autocast where the device supports it
    num_threads: int = 0  # 0: torch default
    # torch.compile the training forward/backward (inductor). Off by default: on a 2-core CPU
    # it gained ~3% at bert-mini (within noise) for ~1 min of compilation (BENCHMARKS.md).
    compile: bool = False
    # Optimizer (ember.train.optim): "adamw" (BERT and most recipes) or "adafactor" (Shazeer &
    # Stern 2018, as T5 pre-trains: Raffel et al. 2020, §3.1.2). T5's schedule is
    # schedule=inverse_sqrt with lr 0.01 and warmup_steps 10000: 1/sqrt(max(step, 10^4)).
    optimizer: str = "adamw"
    # Adafactor (Shazeer & Stern 2018, Alg. 4/5): second-moment decay beta2_t = 1 - t^-decay_rate
    # (§7.1, increasing decay; T5 0.8), update clipping threshold d (§6; 1.0), step size scaled by
    # the parameter's RMS ("relative step size"; on in T5), beta1 0 = no momentum (as T5).
    adafactor_decay_rate: float = 0.8
    adafactor_clip_threshold: float = 1.0
    adafactor_scale_parameter: bool = True
    adafactor_beta1: float = 0.0
    # Beyond one machine (docs/distributed.md). Under torchrun: "ddp" replicates the model on
    # every rank; "fsdp" shards parameters, gradients and optimizer state (FSDP2, one unit per
    # transformer block) and writes sharded checkpoints (torch.distributed.checkpoint).
    parallel: str = "ddp"
    # Sequences per forward pass on one rank; when set, grad_accum is derived as
    # batch_size / (micro_batch_size x world size), so the global batch and the micro-batch
    # layout (hence the losses) stay the same whatever the number of ranks. 0: use grad_accum.
    micro_batch_size: int = 0
    # optimizer "lamb" (You et al. 2019, Alg. 2) uses adam_beta1/adam_beta2/adam_eps and
    # weight_decay; lr scaling for a grown batch: lr x (batch_size / lr_base_batch) ("linear",
    # Goyal et al. 2017) or its square root ("sqrt"); "none" (or lr_base_batch 0) keeps lr.
    lr_scaling: str = "none"
    lr_base_batch: int = 0

    def __post_init__(self) -> None:
        # fp16 autocast without loss scaling lets small gradients underflow to zero (Micikevicius
        # et al. 2018, §3.2), silently; ember does not scale losses, so it refuses fp16 outright.
        if self.dtype.lower() in ("float16", "fp16", "half"):
            raise EmberError(f"train.dtype={self.dtype}: fp16 training needs loss scaling, which ember does "
                             "not do, so small gradients would underflow to zero; use train.dtype=bfloat16 "
                             "(fp32's range, autocast on GPUs that support it) or float32")


@dataclass(frozen=True)
class TaskConfig:
    """Fine-tuning: which task, how inputs are cut, where the weights start from."""

    name: str = ""
    max_length: int = 128
    init: str = ""  # a pre-training run folder, an HF checkpoint folder, or "random"
    epochs: float = 3.0
    eval_batch_size: int = 64
    train_split: str = "train"  # SNLI here has only dev/test: train on dev, evaluate on test
    eval_split: str = "dev"
    # Feature-based transfer (ELMo, Peters et al. 2018): the encoder is frozen; a learned
    # ScalarMix over its num_layers+1 hidden states, ``feature_layers`` per-token GELU layers
    # and the task head are trained (ember.train.transfer).
    features: bool = False
    feature_layers: int = 1
    # ULMFiT (Howard & Ruder 2018) options, usable with every encoder and task:
    layer_lr_decay: float = 1.0  # lr x decay^(depth below the head) per layer; 1 = off; ULMFiT 1/2.6
    gradual_unfreeze: bool = False  # epoch 1: head + top layer; one more layer per epoch
    patience: int = 0  # stop after N dev evaluations without a better main metric; 0 = never
    # The language of the task's texts ("" = the task's own: "en" for GLUE, "ko" NSMC, "ru"
    # RuSentiment); a model with language embeddings (XLM) gives every token this language's id.
    language: str = ""


@dataclass(frozen=True)
class KnowledgeConfig:
    """Knowledge graphs in an encoder (ember.knowledge, docs/knowledge.md): K-BERT's injected
    triples (Liu et al. 2020) and ERNIE's entity fusion (Zhang et al. 2019), alone or together,
    for fine-tuning any encoder family; ERNIE's dEA objective for continued pre-training."""

    graph: str = ""  # K-BERT: triples file (head<TAB>relation<TAB>tail) injected into each sentence; "" = off
    relations: str = ""  # keep only these relations of the graph (comma-separated); "" = all
    max_triples: int = 2  # k: triples injected per entity (the released K-BERT code's max_entities)
    entities: str = ""  # ERNIE: entity embeddings folder (`ember kg embed`, or OpenKE's files); "" = off
    fusion_layers: int = 0  # top encoder layers given an information fusion layer; 0 = the top half (ERNIE 6 of 12)
    entity_heads: int = 4  # heads of the entity self-attention (ERNIE: 4 over 100 dimensions)
    num_entities: int = 0  # rows of the entity table: set from the embeddings when a run starts
    entity_dim: int = 0  # width of the entity table: likewise
    # Objective "ernie" (`ember pretrain --recipe ernie-dea`): MLM + denoising entity auto-encoder
    # (§4.2) on raw text, continuing from a pre-trained encoder.
    init: str = ""  # the run or HF checkpoint folder pre-training continues from
    max_sentences: int = 100000  # training sentences (with an entity) read from data.prepared; 0 = all
    mlm_weight: float = 1.0  # loss = mlm_weight * MLM + dea_weight * dEA (0 drops MLM)
    dea_weight: float = 1.0


@dataclass(frozen=True)
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    kind: str = "pretrain"  # "pretrain" or "finetune": what the run folder holds
    objective: str = "bert"  # which pre-training objective (see ember.objectives)
    electra: ElectraConfig = field(default_factory=ElectraConfig)
    elmo: ElmoConfig = field(default_factory=ElmoConfig)
    denoising: DenoisingConfig = field(default_factory=DenoisingConfig)  # T5 objectives
    plm: PlmConfig = field(default_factory=PlmConfig)
    xlm: XlmConfig = field(default_factory=XlmConfig)
    task: TaskConfig = field(default_factory=lambda: TaskConfig())
    knowledge: KnowledgeConfig = field(default_factory=KnowledgeConfig)  # K-BERT / ERNIE (ember.knowledge)


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def _build(cls: type, values: dict, where: str) -> Any:
    """Build dataclass ``cls`` from a dict, checking names and coercing types."""
    if not isinstance(values, dict):
        raise EmberError(f"{where}: expected a mapping of settings, got {values!r}")
    defaults = cls()
    names = {f.name for f in fields(cls)}
    unknown = set(values) - names
    if unknown:
        raise EmberError(f"{where}: unknown setting(s) {sorted(unknown)}; valid: {sorted(names)}")
    kwargs = {}
    for name, value in values.items():
        default = getattr(defaults, name)
        if dataclasses.is_dataclass(default):
            kwargs[name] = _build(type(default), value or {}, f"{where}.{name}")
        else:
            kwargs[name] = _coerce(value, default, f"{where}.{name}")
    return cls(**kwargs)


def _coerce(value: Any, default: Any, where: str) -> Any:
    """Coerce YAML / command-line values to the type of the field's default."""
    if isinstance(default, bool):
        if isinstance(value, str):
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise EmberError(f"{where}: expected true/false, got {value!r}")
        return bool(value)
    try:
        if isinstance(default, int):
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(float(value)) if isinstance(value, str) else int(value)
        if isinstance(default, float):
            return float(value)
    except (TypeError, ValueError):
        raise EmberError(
            f"{where}: expected a {type(default).__name__}, got {value!r}"
        ) from None
    return str(value) if isinstance(default, str) else value


def run_config_from_dict(values: dict, where: str = "config") -> RunConfig:
    """Build a RunConfig; ``model.preset: bert-mini`` starts the model from a named preset."""
    values = dict(values)
    model = dict(values.get("model") or {})
    preset = model.pop("preset", None)
    if preset is not None:
        model = {**dataclasses.asdict(model_preset(preset)), **model}
    values["model"] = model
    return _build(RunConfig, values, where)


def load_yaml(path: str | Path) -> dict:
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as fh:
            values = yaml.safe_load(fh) or {}
    except FileNotFoundError:
        raise EmberError(f"config file not found: {path}") from None
    except yaml.YAMLError as exc:
        raise EmberError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(values, dict):
        raise EmberError(f"{path}: expected a mapping of settings at the top level")
    return values


def apply_overrides(values: dict, overrides: list[str]) -> dict:
    """Apply ``section.key=value`` overrides (values parsed as YAML scalars)."""
    values = {k: dict(v) if isinstance(v, dict) else v for k, v in values.items()}
    for item in overrides:
        if "=" not in item:
            raise EmberError(f"override {item!r} must look like section.key=value")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        node = values
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise EmberError(f"override {item!r}: {part} is not a section")
        node[parts[-1]] = yaml.safe_load(raw)
    return values


def save_yaml(cfg: Any, path: str | Path) -> None:
    from ember.fileio import atomic_write_text

    atomic_write_text(Path(path), yaml.safe_dump(to_dict(cfg), sort_keys=False))

