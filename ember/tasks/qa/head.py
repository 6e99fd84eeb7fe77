"""Extractive question answering: a start/end head on an encoder and n-best span decoding.

Head (BERT, Devlin et al. 2019, §4.2): one Linear(H, 2) on the final hidden states gives a
start and an end logit per token; the loss is the mean of the start and end cross-entropies
over the window's positions. For SQuAD 2.0 (§4.3) an unanswerable window points both at
[CLS], so the "null" span is scored like any other: ``s_null = start[CLS] + end[CLS]``.

Decoding (Google's ``run_squad.py``). Per window, the ``n_best`` highest start and end logits
are paired; a pair is kept when both ends are context tokens of the window, ``end >= start``,
the span has at most ``max_answer_length`` tokens, and the window is the start token's most
central view (``max_context``). Candidates of all windows of a question are ranked by
``start + end`` and the best is mapped back to context characters through the tokenizer's
offsets. The null score of a question is the minimum of its windows' null scores, and its
no-answer score is ``s_null - s_best``: SQuAD 2.0 answers "no answer" when that exceeds a
threshold tuned on dev (§4.3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ember.tasks.batching import length_sorted_batches
from ember.tasks.featurize import EXTRA_INPUTS, collate, extra_inputs

SHORT_WINDOW = 512  # the longest window a BERT-style model reads; predict's token budget per row


def span_view(logits: np.ndarray, mask: np.ndarray, regression: bool = False):
    """``compare_view`` of start/end logits (B, 2, T): real tokens only; the start and end token
    of each row are its predictions."""
    return np.broadcast_to(mask[:, None, :].astype(bool), logits.shape), logits.argmax(-1).reshape(-1)


class QuestionAnswering(nn.Module):
    logits_axes = {0: "batch", 2: "seq"}  # (B, 2, T): start and end logits per token
    compare_view = staticmethod(span_view)
    # one loss term per window (its start and end cross-entropies): fine-tuning may group windows
    # of similar length into batches (ember.train.length_groups) without reweighting anything
    # (only when asked, train.group_by_length=true: over a 152-update run from MiniLM, grouped
    # windows could not be shown as accurate as shuffled ones; ember.train.length_groups)
    loss_per_example = True

    def __init__(self, backbone: nn.Module, pad_id: int) -> None:
        super().__init__()
        cfg = backbone.config
        self.backbone = backbone
        self.pad_id = pad_id
        self.qa_outputs = nn.Linear(cfg.hidden_size, 2)
        nn.init.normal_(self.qa_outputs.weight, std=cfg.initializer_range)
        nn.init.zeros_(self.qa_outputs.bias)

    def make_batch(self, features: Sequence[dict], rng: np.random.Generator | None = None) -> dict:
        """Pad to the longest window; add start/end targets (B,) when the features carry them."""
        keep = ("input_ids", "token_type_ids", *EXTRA_INPUTS)
        batch = collate([{k: f[k] for k in keep if k in f} for f in features], self.pad_id)
        if all(f.get("start_position") is not None for f in features):
            batch["start_positions"] = torch.tensor([f["start_position"] for f in features])
            batch["end_positions"] = torch.tensor([f["end_position"] for f in features])
        return batch

    def head_logits(self, out, attention_mask: torch.Tensor) -> torch.Tensor:
        """Start and end logits stacked (B, 2, T); padding positions are set to -inf-like values."""
        pad = attention_mask == 0
        start, end = self.qa_outputs(out.last_hidden_state).float().unbind(-1)  # (B, T) each
        return torch.stack([start.masked_fill(pad, -1e4), end.masked_fill(pad, -1e4)], dim=1)

    def backbone_inputs(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """Keyword inputs of the backbone beyond ids, mask and segments. On a Longformer the
        question attends globally (Beltagy et al. 2020, §4: "global attention ... on all question
        tokens" for QA): every position before a row's first separator, transformers'
        LongformerForQuestionAnswering rule, with ``model.sep_token_id``. Without a recorded
        separator the model's own ``attention_global`` positions stay global."""
        cfg = getattr(self.backbone, "config", None)
        if cfg is None or cfg.attention != "longformer" or cfg.sep_token_id < 0:
            return {}
        return {"global_attention_mask": (input_ids == cfg.sep_token_id).cumsum(1) == 0}

    def backbone_pass(self, input_ids, attention_mask, token_type_ids, **kwargs):
        """The backbone's output as the served graph reads it (ember.serve.graph), the globals included."""
        return self.backbone(input_ids, attention_mask, token_type_ids, **kwargs, **self.backbone_inputs(input_ids))

    def logits(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Start and end logits, each (B, T); padding positions are set to -inf-like values."""
        out = self.backbone(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"),
                            **extra_inputs(batch), **self.backbone_inputs(batch["input_ids"]))
        start, end = self.head_logits(out, batch["attention_mask"]).unbind(1)
        return start, end

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        start, end = self.logits(batch)
        starts, ends = batch["start_positions"], batch["end_positions"]
        loss = (F.cross_entropy(start, starts) + F.cross_entropy(end, ends)) / 2
        n = int(starts.shape[0])
        hit = ((start.argmax(-1) == starts) & (end.argmax(-1) == ends)).sum().item()
        return loss, {"loss": (loss.item() * n, n), "span_accuracy": (hit, n)}

    @torch.no_grad()
    def predict(self, features: Sequence[dict], batch_size: int = 64, device: str = "cpu"
                ) -> list[tuple[np.ndarray, np.ndarray]]:
        """(start_logits, end_logits) per feature, each of the feature's length, in input order."""
        was_training = self.training
        self.eval()
        out: list = [None] * len(features)
        # Windows of up to 512 tokens come batch_size at a time; a long model's windows (a whole
        # article: thousands of tokens) as many as that many tokens allow, not 64 x 16,384.
        lengths = [len(f["input_ids"]) for f in features]
        for idx in length_sorted_batches(lengths, batch_size, max_tokens=batch_size * SHORT_WINDOW):
            batch = self.make_batch([{**features[i], "start_position": None} for i in idx])  # no targets
            batch = {k: v.to(device) for k, v in batch.items()}
            start, end = (t.cpu().numpy() for t in self.logits(batch))
            for row, i in enumerate(idx):
                n = len(features[i]["input_ids"])
                out[i] = (start[row, :n], end[row, :n])
        self.train(was_training)
        return out


@dataclass
class Answer:
    """One question's decoded answer: best span text and score, null score, n-best list."""

    text: str
    score: float  # start + end logit of the best span (-inf when no span was valid)
    null_score: float  # min over windows of start[CLS] + end[CLS]
    nbest: list[tuple[str, float]] = field(default_factory=list)

    @property
    def null_minus_best(self) -> float:
        """SQuAD 2.0's no-answer score: answer "no answer" when this exceeds the threshold."""
        return self.null_score - self.score


def window_candidates(start: np.ndarray, end: np.ndarray, feature: dict, n_best: int,
                      max_answer_length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(scores, start_tokens, end_tokens) of the valid spans among top-k starts x top-k ends."""
    is_context = np.fromiter((o is not None for o in feature["offsets"]), bool, len(start))  # (L,)
    may_start = is_context & np.asarray(feature["max_context"], dtype=bool)
    top_starts = np.argsort(-start, kind="stable")[:n_best]
    top_ends = np.argsort(-end, kind="stable")[:n_best]
    s = top_starts[may_start[top_starts]][:, None]  # (k_s, 1)
    e = top_ends[is_context[top_ends]][None, :]  # (1, k_e)
    length = e - s + 1  # (k_s, k_e) tokens per span; < 1 when the end precedes the start
    keep = (length >= 1) & (length <= max_answer_length)
    s, e = np.broadcast_to(s, keep.shape)[keep], np.broadcast_to(e, keep.shape)[keep]
    return start[s] + end[e], s, e


def decode_answers(contexts: Sequence[str], features: Sequence[dict],
                   logits: Sequence[tuple[np.ndarray, np.ndarray]], n_best: int = 20,
                   max_answer_length: int = 30) -> list[Answer]:
    """One ``Answer`` per context (question), aggregating that question's windows."""
    if n_best <= 0 or max_answer_length <= 0:
        raise ValueError(f"n_best ({n_best}) and max_answer_length ({max_answer_length}) must be positive")
    per_example: dict[int, list[int]] = {}
    for i, f in enumerate(features):
        per_example.setdefault(f["example_index"], []).append(i)
    answers = []
    for index, context in enumerate(contexts):
        windows = per_example.get(index, [])
        null_score, found = float("inf"), []  # found: (scores, starts, ends, window) per window
        for i in windows:
            start, end = logits[i]
            cls = features[i]["cls_index"]
            null_score = min(null_score, float(start[cls] + end[cls]))
            scores, s, e = window_candidates(start, end, features[i], n_best, max_answer_length)
            found.append((scores, s, e, np.full(len(s), i)))
        nbest = []
        if found:
            scores, s, e, w = (np.concatenate(parts) for parts in zip(*found))
            for k in np.argsort(-scores, kind="stable")[:n_best]:
                offsets = features[w[k]]["offsets"]
                nbest.append((context[offsets[s[k]][0]:offsets[e[k]][1]], float(scores[k])))
        best_text, best_score = nbest[0] if nbest else ("", float("-inf"))
        answers.append(Answer(best_text, best_score, null_score, nbest))
    return answers
