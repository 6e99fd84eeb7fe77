"""Sequence classification and regression on top of an encoder (BERT, Devlin et al. §4.1).

The [CLS] representation (through BERT's tanh pooler when the backbone has one) goes through
dropout and one linear layer: cross-entropy over labels, or MSE for a regression target
(STS-B, 1 output). Used by `ember finetune` with any backbone returning ``pooled`` or hidden
states.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ember.nn.linear_head import BackboneWithLinearHead
from ember.tasks.batching import length_sorted_batches
from ember.tasks.featurize import collate, extra_inputs
from ember.tasks.inference.methods import encode_texts, sequence_view, softmax
from ember.tasks.inference.requests import TEXT_FIELDS, body_schema, parse_texts


class SequenceClassifier(BackboneWithLinearHead):
    logits_axes = {0: "batch"}  # (B, num_labels): no sequence axis
    compare_view = staticmethod(sequence_view)
    padding: dict = {}  # ``collate`` options of this head's batches (XLNet: left padding)
    # one loss term per example: fine-tuning may group examples of similar length into batches
    # (ember.train.length_groups) without reweighting anything
    # (only when asked, train.group_by_length=true: see ember.train.length_groups.wants_length_groups)
    loss_per_example = True

    @property
    def is_regression(self) -> bool:
        return self.num_labels == 1

    def make_batch(self, features: list[dict], rng: np.random.Generator | None = None) -> dict:
        return collate(features, self.pad_id, **self.padding)

    def head_logits(self, out, attention_mask: torch.Tensor) -> torch.Tensor:  # (B, num_labels)
        """The head on one backbone pass: [CLS] (through the pooler when there is one). A pass
        run with ``rows`` at [CLS] (``logits``) returns those rows alone, (B, H)."""
        hidden = out.last_hidden_state
        pooled = out.pooled if out.pooled is not None else (hidden if hidden.dim() == 2 else hidden[:, 0])
        return self.classifier(self.dropout(pooled))

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:  # (B, num_labels)
        ids = batch["input_ids"]
        rows = {}
        if getattr(self.backbone, "takes_rows", False):  # the last layer at [CLS] only (ember.nn.query_rows)
            rows["rows"] = torch.zeros_like(ids, dtype=torch.bool)
            rows["rows"][:, 0] = True
        out = self.backbone(ids, batch["attention_mask"], batch.get("token_type_ids"), **extra_inputs(batch), **rows)
        return self.head_logits(out, batch["attention_mask"])

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        logits = self.logits(batch).float()
        labels = batch["labels"]
        n = int(labels.shape[0])
        if self.is_regression:
            loss = F.mse_loss(logits.squeeze(-1), labels.float())
            return loss, {"loss": (loss.item() * n, n)}
        loss = F.cross_entropy(logits, labels)
        correct = (logits.argmax(-1) == labels).sum().item()
        return loss, {"loss": (loss.item() * n, n), "accuracy": (correct, n)}

    @torch.no_grad()
    def predict(self, features: list[dict], batch_size: int = 64, device: str = "cpu") -> np.ndarray:
        """Logits (N, num_labels) in input order; batches are formed by length to save padding."""
        was_training = self.training
        self.eval()
        out = np.zeros((len(features), self.num_labels), dtype=np.float32)
        for idx in length_sorted_batches([len(f["input_ids"]) for f in features], batch_size):
            batch = self.make_batch([{**features[i], "label": None} for i in idx])
            batch = {k: v.to(device) for k, v in batch.items()}
            out[idx] = self.logits(batch).float().cpu().numpy()
        self.train(was_training)
        return out


def predictions_from_logits(logits: np.ndarray, regression: bool) -> np.ndarray:
    return logits[:, 0] if regression else logits.argmax(-1)


class ClassifyMethod:
    """``classify``: texts (or pairs) -> label and probabilities per label, or a score (regression)."""

    name = "classify"
    inputs = {"text": "texts", "text_pair": "text_pairs"}  # per-input fields, single -> plural
    # The page `ember serve` shows at / (ember.serve.page): fields of the request, and its view.
    form = {"title": "Classify", "view": "classify", "fields": [
        {"name": "text", "label": "Text", "type": "textarea", "default": "a gripping, beautifully acted film"},
        {"name": "text_pair", "label": "Second text (sentence-pair tasks only)", "type": "textarea",
         "optional": True}]}
    request_schema = body_schema(
        "Texts (or sentence pairs) to classify: each gets a label and the probability of every label "
        "(or a score, for a regression head); 'truncated' says which inputs were cut to the model's length.",
        TEXT_FIELDS, {"texts": ["a gripping, beautifully acted film", "a dull, lifeless mess"]})

    def __init__(self, ctx) -> None:
        self.encoder = ctx.encoder()
        self.labels = ctx.labels or []
        self.regression = self.labels == ["score"]

    def parse(self, data: dict, limits) -> dict:
        return parse_texts(data, limits)

    def __call__(self, requests, forward) -> list[dict]:
        rows, flags, spans = encode_texts(self.encoder, requests)
        results = []
        for i, (logits, _) in enumerate(forward(rows, False)):
            if self.regression:
                results.append({"score": float(logits[0]), "truncated": flags[i]})
                continue
            probs = softmax(logits.astype(np.float64))
            names = self.labels if len(self.labels) == len(probs) else [str(k) for k in range(len(probs))]
            results.append({"label": names[int(probs.argmax())],
                            "probabilities": {n: float(p) for n, p in zip(names, probs)}, "truncated": flags[i]})
        return [{"results": results[s], "truncated": any(flags[s])} for s in spans]
