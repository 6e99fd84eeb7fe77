"""Helpers shared by the T5 tests: tiny random transformers T5 models (built locally, never
downloaded), the matching ember backbone, and a T5-layout tokenizer."""

from __future__ import annotations

import torch
from torch import nn

from hf_interop_helpers import perturb

from ember.interop import hf_t5
from ember.models import build_backbone
from ember.runs.init import backbone_weights

VOCAB = 99
EOS = 1  # T5's </s>; the pad id 0 starts decoding


def hf_config(version: str = "v1_0", attn: str = "sdpa", **overrides):
    """A tiny T5Config: 2 encoder and 3 decoder layers, 3 heads of d_kv 8 != d_model / heads,
    few buckets with a short max distance so that the log-spaced buckets are exercised."""
    import transformers

    v1_1 = version == "v1_1"
    return transformers.T5Config(**{
        "vocab_size": VOCAB, "d_model": 32, "d_kv": 8, "d_ff": 48, "num_layers": 2, "num_decoder_layers": 3,
        "num_heads": 3, "relative_attention_num_buckets": 8, "relative_attention_max_distance": 20,
        "dropout_rate": 0.0, "feed_forward_proj": "gated-gelu" if v1_1 else "relu",
        "tie_word_embeddings": not v1_1, "decoder_start_token_id": 0, "pad_token_id": 0, "eos_token_id": EOS,
        "attn_implementation": attn, **overrides})


def tiny_hf_t5(version: str = "v1_0", seed: int = 0, attn: str = "sdpa", **overrides):
    """T5ForConditionalGeneration with every weight moved off its init. transformers 5 ties
    lm_head to the embeddings even for v1.1, so v1.1 gets its own head here, at ember's init
    scale d_model^-0.5: logits stay O(1), as a trained model's, where fp32 rounding sits well
    below 1e-5 (with an N(0, 1) head, logits of |20| differ by 1e-5 between transformers' own
    eager and SDPA attention)."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.T5ForConditionalGeneration(hf_config(version, attn, **overrides))
    if version == "v1_1":
        model.lm_head.weight = nn.Parameter(model.shared.weight.detach().clone() * model.config.d_model ** -0.5)
    return perturb(model, seed)


def ember_from_hf(hf_model):
    """ember's EncoderDecoder with the weights of ``hf_model`` (eval mode)."""
    cfg = hf_t5.config_from_hf(hf_model.config.to_dict())
    model = build_backbone(cfg).eval()
    model.load_state_dict(backbone_weights(hf_t5.state_from_hf(hf_model.state_dict(), cfg)), strict=True)
    return model


def t5_style_tokenizer(pieces: list[str]):
    """A Unigram tokenizer in T5's layout: <pad>=0, </s>=1, <unk>=2, then ``pieces``, with
    ``$A </s>`` as its template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + [(p, -float(i + 1)) for i, p in enumerate(pieces)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=2))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.add_special_tokens(["<pad>", "</s>", "<unk>"])
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", 1)])
    return tok
