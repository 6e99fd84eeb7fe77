"""Named model shapes (``model.preset`` / ``--model``): BERT's miniatures and sizes, ALBERT,
ELECTRA, XLM, GPT-2, T5, BART, XLNet and Dai & Le's LSTMs, each with the paper it follows."""

from __future__ import annotations

import dataclasses

from ember.errors import EmberError
from ember.model_config import ModelConfig

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


def _bart(layers: int, hidden: int, heads: int, ffn: int, mbart: bool = False) -> ModelConfig:
    # BART (Lewis et al. 2020, §2.1 and §3.1/§5.1; the released fairseq and transformers configs):
    # the standard seq2seq Transformer with GELU, post-LN blocks with LayerNorm (eps 1e-5) and
    # biases, a LayerNorm on the embeddings, 1024 learned positions, N(0, 0.02) init, embeddings
    # tied across both stacks and the output layer (+ final_logits_bias), dropout 0.1, the GPT-2
    # byte-level BPE (50,265 entries; <s>=0, <pad>=1, </s>=2) and decoding started from </s>.
    # Base: 6 + 6 layers of 768; Large: 12 + 12 of 1024 (§3.1 "12 layers in the encoder and
    # decoder, and a hidden size of 1024"). mBART (Liu et al. 2020, §2.1): pre-LN with a final
    # LayerNorm per stack and embeddings scaled by sqrt(d). Recipes set vocab_size and the
    # special ids from their own tokenizer.
    return ModelConfig(
        family="bart", vocab_size=250027 if mbart else 50265, hidden_size=hidden, num_layers=layers,
        num_heads=heads, intermediate_size=ffn, max_position=1024, type_vocab_size=0, hidden_act="gelu",
        dropout=0.1, attention_dropout=0.1, layer_norm_eps=1e-5, initializer_range=0.02, pad_token_id=1,
        pre_layer_norm=mbart, pooler=False, tie_word_embeddings=True, position_kind="learned",
        norm_kind="layer", linear_bias=True, embedding_norm=True, scale_embedding=mbart,
        final_logits_bias=True, scale_decoder_outputs=False, init_scheme="normal", decoder_start_token_id=2,
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
    # thread, benchmarks/speed/t5_costs.py): the decoder runs on the short targets only.
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
    # BART miniatures at BERT-tiny / BERT-mini width and depth per stack (as t5-tiny / t5-mini),
    # the paper's Base and Large (Lewis et al. 2020, §3.1), and mBART-large (Liu et al. 2020).
    # MASS (Song et al. 2019) pre-trains the same backbone (recipe mass-mini).
    "bart-tiny": _bart(2, 128, 2, 512),
    "bart-mini": _bart(4, 256, 4, 1024),
    "bart-base": _bart(6, 768, 12, 3072),
    "bart-large": _bart(12, 1024, 16, 4096),
    "mbart-large": _bart(12, 1024, 16, 4096, mbart=True),
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
