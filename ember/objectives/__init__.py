"""Pre-training objectives: each owns its corruption step, its heads and its loss.

An objective is an ``nn.Module`` wrapping a backbone with:
  make_batch(examples, rng) -> dict of tensors   (corruption drawn on the fly)
  forward(batch) -> (loss, metrics)              metrics: name -> (sum, count)
and optionally ``build_dataset(corpus, data_cfg, seed)`` (its own data layout) and
``derived_metrics(held_out) -> dict`` (e.g. perplexity). Its module has
``build(cfg, special_ids)`` and, when its data is not the token shards of `ember prepare`,
``setup_pretraining(cfg, run_dir, resume, progress)`` (``ember.objectives.setup``).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ember.errors import EmberError

# objective name -> module with ``build(cfg: RunConfig, special_ids: dict) -> nn.Module``.
OBJECTIVES = {
    "bert": "ember.objectives.bert",  # MLM + NSP (Devlin et al. 2019)
    "mlm": "ember.objectives.bert",  # MLM only (RoBERTa, Liu et al. 2019)
    "albert": "ember.objectives.bert",  # MLM + sentence-order prediction (Lan et al. 2020)
    "spanbert": "ember.objectives.spanbert",  # span masking + span-boundary objective (Joshi et al. 2020)
    "electra": "ember.objectives.electra",  # replaced-token detection (Clark et al. 2020)
    "clm": "ember.objectives.clm",  # causal LM on packed blocks (GPT-1/GPT-2, Radford et al. 2018/2019)
    "bilm": "ember.objectives.bilm",  # ELMo forward + backward LSTM LMs (Peters et al. 2018)
    # T5 (Raffel et al. 2020): span corruption and the §3.3 comparison objectives, seq2seq
    "span_corruption": "ember.objectives.span_corruption",
    "prefix_lm": "ember.objectives.span_corruption",
    "bert_denoising": "ember.objectives.span_corruption",
    "mass_denoising": "ember.objectives.span_corruption",
    "deshuffle": "ember.objectives.span_corruption",
    "replace_spans": "ember.objectives.span_corruption",
    "drop_tokens": "ember.objectives.span_corruption",
    # BART (Lewis et al. 2020): noised documents reconstructed (noising.kinds); MASS (Song et al. 2019):
    # a masked fragment predicted by the decoder. Both on the bart-* encoder-decoder.
    "bart": "ember.objectives.bart",
    "mass": "ember.objectives.mass",
    "plm": "ember.objectives.plm",  # permutation LM, two-stream attention, memory (XLNet, Yang et al. 2019)
    # XLM (Lample & Conneau 2019): language embeddings; streams/pairs of a corpus prepared with --lang/--parallel
    "xlm_mlm": "ember.objectives.xlm",  # masked LM on monolingual streams (§3.2)
    "xlm_clm": "ember.objectives.xlm",  # causal LM on monolingual streams (§3.1)
    "tlm": "ember.objectives.xlm",  # translation LM on parallel pairs (§3.3)
    "xlm_mlm_tlm": "ember.objectives.xlm",  # MLM and TLM mixed
    "ernie": "ember.objectives.ernie",  # MLM + denoising entity auto-encoder on a fusion encoder (Zhang et al. 2019)
    # Dai & Le 2015: an LSTM pre-trained as a language model or a sequence autoencoder
    "lstm_lm": "ember.objectives.dai_le",
    "seq_autoencoder": "ember.objectives.dai_le",
}


def objective_module(name: str) -> ModuleType:
    try:
        module_name = OBJECTIVES[name]
    except KeyError:
        raise EmberError(f"unknown objective {name!r}; known: {', '.join(OBJECTIVES)}") from None
    return importlib.import_module(module_name)


def build_objective(cfg, special_ids: dict):
    """The pre-training module named by ``cfg.objective``, with a fresh backbone."""
    return objective_module(cfg.objective).build(cfg, special_ids)
