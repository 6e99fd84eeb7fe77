"""Pre-training objectives: each owns its corruption step, its heads and its loss.

An objective is an ``nn.Module`` wrapping a backbone with:
  make_batch(examples, rng) -> dict of tensors   (corruption drawn on the fly)
  forward(batch) -> (loss, metrics)              metrics: name -> (sum, count)
"""

from __future__ import annotations

import importlib

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
    # XLM (Lample & Conneau 2019): language embeddings; streams/pairs of a corpus prepared with --lang/--parallel
    "xlm_mlm": "ember.objectives.xlm",  # masked LM on monolingual streams (§3.2)
    "xlm_clm": "ember.objectives.xlm",  # causal LM on monolingual streams (§3.1)
    "tlm": "ember.objectives.xlm",  # translation LM on parallel pairs (§3.3)
    "xlm_mlm_tlm": "ember.objectives.xlm",  # MLM and TLM mixed
}


def build_objective(cfg, special_ids: dict):
    """The pre-training module named by ``cfg.objective``, with a fresh backbone."""
    try:
        module_name = OBJECTIVES[cfg.objective]
    except KeyError:
        raise EmberError(f"unknown objective {cfg.objective!r}; known: {', '.join(OBJECTIVES)}") from None
    return importlib.import_module(module_name).build(cfg, special_ids)
