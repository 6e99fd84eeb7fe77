"""What a pre-training run answers at inference, by objective (fine-tuned runs: their task adapter).

objective -> "module:factory"; the factory takes (run config, the names of the run's weights)
and returns a provider (``ember.tasks.inference.methods``): which inference model to build on the
backbone and which methods it serves. An objective that is not listed serves embeddings only,
as every encoder can; a new family that serves more adds one line (T5: generate).
"""

from __future__ import annotations

import importlib
from typing import Iterable

from ember.errors import EmberError

PRETRAINED = {
    "bert": "ember.tasks.inference.pretrained:masked_lm_or_encoder",
    "mlm": "ember.tasks.inference.pretrained:masked_lm_or_encoder",
    "albert": "ember.tasks.inference.pretrained:masked_lm_or_encoder",
    "spanbert": "ember.tasks.inference.pretrained:masked_lm_or_encoder",
    # ELECTRA's MLM head belongs to its generator, not to the discriminator kept as the backbone.
    "electra": "ember.tasks.inference.embedding:EmbeddingProvider",
    "clm": "ember.tasks.inference.generation:CausalLMProvider",
    "bilm": "ember.tasks.inference.pretrained:not_served",
    # ERNIE's dEA run: embeddings of its encoder (fusion layers need entities a request does not carry)
    "ernie": "ember.tasks.inference.embedding:EmbeddingProvider",
    # T5's denoising objectives (Raffel et al. 2020, §3.3), BART's noising and MASS (Lewis et al.
    # 2020; Song et al. 2019): the encoder-decoder generates text
    **{objective: "ember.tasks.text2text.methods:Seq2SeqLMProvider" for objective in (
        "span_corruption", "prefix_lm", "bert_denoising", "mass_denoising", "deshuffle", "replace_spans",
        "drop_tokens", "bart", "mass")},
    "lstm_lm": "ember.tasks.families.lstm:not_served",  # Dai & Le's LSTM: fine-tune it, serve that
    "seq_autoencoder": "ember.tasks.families.lstm:not_served",
}


def masked_lm_or_encoder(cfg, state_keys: Iterable[str]):
    """Fill-mask when the run holds an MLM head; embeddings only otherwise (an imported
    ``BertModel`` or sentence-embedding checkpoint has no MLM head: that is no reason to refuse it)."""
    from ember.tasks.inference.embedding import EmbeddingProvider
    from ember.tasks.inference.fill_mask import MaskedLMProvider

    return MaskedLMProvider(cfg) if "mlm.dense.weight" in set(state_keys) else EmbeddingProvider(cfg)


def not_served(cfg, state_keys: Iterable[str]):
    raise EmberError(f"a {cfg.objective} pre-training run has no inference endpoint here: use its layers as "
                     "features with `ember elmo-features --elmo RUN`")


def pretrained_provider(cfg, state_keys: Iterable[str]):
    target = PRETRAINED.get(cfg.objective, "ember.tasks.inference.embedding:EmbeddingProvider")
    module_name, _, name = target.partition(":")
    return getattr(importlib.import_module(module_name), name)(cfg, state_keys)
