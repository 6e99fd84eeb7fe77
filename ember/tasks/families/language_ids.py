"""Tasks on a model with language embeddings (XLM, Lample & Conneau 2019): a language id per token.

XLM adds a learned language embedding to every token (§3.4); fine-tuning and evaluation must
give each token the id of the language its text is in, as pre-training did. Every task knows
its language (``TaskSpec.language``: "en" for GLUE, "ko" NSMC, "ru" RuSentiment; the adapters
of CoNLL-2003 and SQuAD say "en"), overridden by ``task.language`` (``--set task.language=ru``).
The paper's zero-shot cross-lingual classification (§4.1; XNLI, §5.2) fine-tunes with the source language's id (English) and
evaluates with the target language's: ``ember evaluate RUN --task rusentiment-binary`` builds
the Russian task's adapter, so its features carry Russian ids.

``ember.tasks.base.get_adapter`` wraps the task's adapter in ``LanguageAdapter`` for every model
whose config has language embeddings (``model.num_languages`` > 0), whatever its family:

* ``load`` adds ``language_ids`` (the example's length, filled with the language's id) to each
  feature; ``collate`` pads them and the heads hand them to the backbone (``extra_inputs``);
* ``build_module`` also gives the backbone a default: a call without ``language_ids`` (a row
  served over HTTP, ``ember predict``'s file, an exported ONNX graph, which see token ids
  only) reads as the task's language (``default_language``), never as "no language" (which
  the model was not fine-tuned with). An HF export (``XLMForSequenceClassification``) needs
  ``langs`` for the same outputs (``hf_inputs``), as transformers' XLM has no default.
"""

from __future__ import annotations

import torch
from torch import nn

from ember.errors import EmberError
from ember.tasks.wrapped import WrappedAdapter


def with_language_ids(features: list[dict], language_id: int) -> list[dict]:
    """Each feature with ``language_ids``: one id per token (sequence length), all ``language_id``."""
    return [{**f, "language_ids": [language_id] * len(f["input_ids"])} for f in features]


def default_language(backbone: nn.Module, language_id: int) -> nn.Module:
    """Make ``backbone`` read calls without ``language_ids`` as language ``language_id``.

    A forward pre-hook, so the backbone's parameters and state-dict names stay as they are
    (the fine-tuned run still converts to ``XLMForSequenceClassification``) and every caller
    of ``module.backbone`` - the heads, the serving graph, its ONNX trace - gets it alike.
    """
    def fill(module, args, kwargs):
        if kwargs.get("language_ids") is None:
            input_ids = args[0] if args else kwargs["input_ids"]  # (B, T)
            kwargs["language_ids"] = torch.full_like(input_ids, language_id)
        return args, kwargs

    backbone.register_forward_pre_hook(fill, with_kwargs=True)
    return backbone


class LanguageAdapter(WrappedAdapter):
    """A task's adapter for a model with language embeddings (see the module docstring)."""

    def __init__(self, base, model) -> None:
        super().__init__(base)
        self.model = model
        _ = self.language_id  # an unknown language fails here, before any work is done

    @property
    def language_id(self) -> int:
        language = getattr(self.base, "language", "en")
        try:
            return self.model.language_id(language)
        except EmberError as exc:
            if getattr(self.base, "language_given", False):  # the user's task.language (get_adapter)
                raise EmberError(f"task.language={language!r}: {exc}") from None
            raise EmberError(f"{self.base.display_name} is in language {language!r}, but {exc}; fine-tune "
                             "a model pre-trained on that language, or set the task's language with "
                             "--set task.language=CODE") from None

    def load(self, split, tokenizer, max_length, limit=None, path=None):
        examples, features = self.base.load(split, tokenizer, max_length, limit=limit, path=path)
        return examples, with_language_ids(features, self.language_id)

    def build_module(self, backbone: nn.Module, pad_id: int) -> nn.Module:
        return self.base.build_module(default_language(backbone, self.language_id), pad_id)

    def hf_inputs(self, input_ids: torch.Tensor) -> dict:
        """What transformers' XLM classes need for the same outputs: ``langs`` (B, T), the task's
        language (they add no language embedding without it)."""
        return {"langs": torch.full_like(input_ids, self.language_id)}


def adapt(adapter, model) -> LanguageAdapter:
    return LanguageAdapter(adapter, model)
