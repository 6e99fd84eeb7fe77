"""GPT-1 style fine-tuning for sentence (pair) classification (Radford et al. 2018, §3.2-3.3).

Input transformations (Fig. 1): one token sequence per example,
    single:  start text extract
    pair:    start a delim b extract
with start = ``<s>``, delim = ``</s>`` and extract = ``<|endoftext|>`` of ember's byte-level
BPE (a tokenizer without them, such as GPT-2's, uses ``<|endoftext|>`` for all three). The
final hidden state of the extract token (the last real token: padding is on the right and
attention is causal) feeds a linear classifier, and the LM objective is kept as an
auxiliary loss, L3 = L2 + lambda * L1 with lambda = 0.5 (eq. 5), which the paper found helps
generalisation and convergence on the larger datasets.

``adapt`` is registered for the GPT families in ``ember.tasks.base.FAMILY_ADAPTERS``: it turns a
GLUE-style task's adapter into ``GptGlueAdapter``, so `ember finetune --task sst2 --init <gpt run>`
trains this.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer

from ember.errors import EmberError
from ember.nn.lm_loss import next_token_loss
from ember.tasks.glue_adapter import GlueAdapter
from ember.tasks.classification import SequenceClassifier
from ember.tasks.featurize import Featurized
from ember.tasks.readers.glue import Example

AUX_LM_WEIGHT = 0.5  # lambda in L3 = L2 + lambda * L1 (Radford et al. 2018, §3.2)


def transform_ids(tokenizer: Tokenizer) -> dict[str, int]:
    """start / delim / extract token ids."""
    from ember.tokenizers import end_of_text_id

    eot = end_of_text_id(tokenizer)
    start, delim = tokenizer.token_to_id("<s>"), tokenizer.token_to_id("</s>")
    return {"start": eot if start is None else start, "delim": eot if delim is None else delim, "extract": eot}


def encode_gpt_examples(examples: list[Example], tokenizer: Tokenizer, max_length: int) -> Featurized:
    """Examples -> GPT-1 input transformations, text cut (longest segment first) to fit."""
    ids = transform_ids(tokenizer)
    features, n_truncated = [], 0
    for ex in examples:
        a = tokenizer.encode(ex.text_a, add_special_tokens=False).ids
        b = tokenizer.encode(ex.text_b, add_special_tokens=False).ids if ex.text_b is not None else None
        room = max_length - (3 if b is not None else 2)
        if room < 2:
            raise EmberError(f"max_length={max_length} leaves no room for text around GPT's special tokens")
        cut = False
        while len(a) + len(b or []) > room:  # as BERT's _truncate_seq_pair: trim the longer one
            cut = True
            if b is not None and len(b) > len(a):
                b = b[:-1]
            else:
                a = a[:-1]
        n_truncated += cut
        tokens = [ids["start"], *a] + ([ids["delim"], *b] if b is not None else []) + [ids["extract"]]
        features.append({"input_ids": tokens, "token_type_ids": [0] * len(tokens), "label": ex.label})
    return Featurized(features, n_truncated)


class GptClassifier(SequenceClassifier):
    """Linear classifier on the extract token's hidden state + auxiliary LM loss."""

    def __init__(self, backbone, num_labels: int, pad_id: int, lm_weight: float = AUX_LM_WEIGHT) -> None:
        super().__init__(backbone, num_labels, pad_id)
        self.lm_weight = lm_weight
        self._hidden = None  # set during forward() so logits() reuses that backbone pass

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:  # (B, num_labels)
        mask = batch["attention_mask"]
        hidden = self._hidden
        if hidden is None:
            hidden = self.backbone(batch["input_ids"], mask).last_hidden_state  # (B, T, H)
        last = mask.sum(-1) - 1  # (B,) the extract token: right padding, causal attention
        return self.classifier(self.dropout(hidden[torch.arange(hidden.shape[0]), last]))

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        # Right padding never reaches a real token through causal attention: no mask needed.
        hidden = self.backbone(batch["input_ids"]).last_hidden_state  # (B, T, H)
        self._hidden = hidden
        try:
            loss, metrics = super().forward(batch)  # the task loss, on self.logits(batch)
        finally:
            self._hidden = None
        if self.lm_weight:
            lm_loss, lm_metrics = next_token_loss(self.backbone, hidden, batch["input_ids"], batch["attention_mask"])
            metrics["task_loss"] = metrics["loss"]
            metrics.update(lm_metrics)
            loss = loss + self.lm_weight * lm_loss
            n = int(batch["input_ids"].shape[0])
            metrics["loss"] = (loss.item() * n, n)
        return loss, metrics


class GptGlueAdapter(GlueAdapter):
    """A GLUE-style task fine-tuned the GPT-1 way (causal decoder backbones)."""

    inference_methods = None  # not served yet: `ember predict` classifies with it

    def encode(self, examples, tokenizer, max_length) -> Featurized:
        return encode_gpt_examples(examples, tokenizer, max_length)

    def build_module(self, backbone, pad_id):
        if not hasattr(backbone, "lm_projection"):  # e.g. FeatureBackbone: GPT-1's auxiliary LM loss needs it
            raise EmberError("--features freezes an encoder's layers under a learned mix; a GPT run fine-tunes "
                             "whole, with its language-model loss beside the task's (Radford et al. 2018, "
                             "eq. 5): drop --features")
        return GptClassifier(backbone, self.spec.num_labels, pad_id)


def adapt(adapter, model) -> GptGlueAdapter:
    """The GPT-1 form of a task's encoder adapter; GPT fine-tunes sentence (pair) tasks only."""
    if type(adapter) is GlueAdapter:
        return GptGlueAdapter(adapter.spec)
    if isinstance(adapter, GlueAdapter):  # e.g. NSMC / RuSentiment readers: already GLUE-style
        return adapter
    raise EmberError(f"{adapter.display_name} cannot be fine-tuned with a {model.family} decoder yet; "
                     "GPT models fine-tune on GLUE-style sentence (pair) classification")
