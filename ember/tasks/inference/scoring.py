"""Log-likelihood of texts as an inference method: ``score``, beside ``generate``.

A causal LM (GPT-1/GPT-2) scores a text x_1..x_n as

    log p(x) = sum_t log p(x_t | <eot>, c, x_<t)

with the end-of-text token as the start (ember's CLM corpus joins documents with it, as GPT-2's
training data does, Radford et al. 2019 §2.1, so "after <eot>" means "at the start of a
document"), and an optional context c that conditions without being scored (log p(answer |
question), as zero-shot evaluation ranks candidates, Radford et al. 2019 §3; ``ember.tasks.
fewshot`` scores its label words with the same function). The context is tokenized apart from
the text, so give the text its leading space ("Paris" after "The capital is" -> " Paris").

An encoder-decoder (T5) scores a target y given an input x: log p(y </s> | x), the sum of the
teacher-forced decoder's log-probabilities (Raffel et al. 2020 §2.1), </s> included: it is the
probability that the model writes exactly y. The target is tokenized with the tokenizer's
template (T5's appends </s>).

Each result holds the summed log-likelihood in nats, the number of tokens scored and the
perplexity exp(-log p / tokens). Inputs that do not fit the model's context are cut (a
causal context from the left, then the text at its end; a T5 input and target at their end)
and say ``"truncated": true``: the numbers then cover only the tokens scored.
"""

from __future__ import annotations

import math
import threading
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ember.errors import RequestError
from ember.tasks.batching import length_sorted_batches
from ember.tasks.inference.requests import check_fields, texts_field


def _gather(logits: torch.Tensor, targets: list[int]) -> np.ndarray:
    """log softmax(logits (M, V))[m, targets[m]] -> (M,) float32."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return logp[torch.arange(len(targets)), torch.tensor(targets, dtype=torch.long)].cpu().numpy()


@torch.no_grad()
def causal_logprobs(model, rows: Sequence[tuple[list[int], int]], batch_size: int = 16) -> list[np.ndarray]:
    """Per row (ids, n): log p of the last n tokens of ids, each given every token before it,
    (n,) float32. Rows are right-padded in length-sorted batches: padding sits after every real
    token, so causal attention never sees it, and only the scored positions go through the
    (V, H) output layer."""
    device = next(model.parameters()).device
    out: list = [None] * len(rows)
    for chunk in length_sorted_batches([len(r[0]) for r in rows], batch_size):
        width = max(len(rows[i][0]) for i in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        for b, i in enumerate(chunk):
            ids[b, : len(rows[i][0])] = torch.tensor(rows[i][0])
        hidden = model.backbone(ids.to(device)).last_hidden_state  # (b, T, H)
        where, positions, targets = [], [], []
        for b, i in enumerate(chunk):
            seq, n = rows[i]
            where += [b] * n
            positions += range(len(seq) - n - 1, len(seq) - 1)  # token t is predicted at t - 1
            targets += seq[len(seq) - n:]
        logits = model.backbone.lm_logits(hidden[torch.tensor(where), torch.tensor(positions)])  # (M, V)
        logp, k = _gather(logits, targets), 0
        for i in chunk:
            n = rows[i][1]
            out[i], k = logp[k : k + n], k + n
    return out


@torch.no_grad()
def seq2seq_logprobs(model, rows: Sequence[tuple[list[int], list[int]]], pad_id: int,
                     batch_size: int = 16) -> list[np.ndarray]:
    """Per row (input ids, target ids): log p of every target token given the input and the
    targets before it (teacher forcing), (len(target),) float32. Inputs are right-padded and
    masked; targets are right-padded, which a causal decoder never looks ahead to."""
    device = next(model.parameters()).device
    out: list = [None] * len(rows)
    for chunk in length_sorted_batches([(len(r[0]), len(r[1])) for r in rows], batch_size):
        width_in = max(len(rows[i][0]) for i in chunk)
        width_out = max(len(rows[i][1]) for i in chunk)
        ids = torch.full((len(chunk), width_in), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        labels = torch.full((len(chunk), width_out), -100, dtype=torch.long)
        for b, i in enumerate(chunk):
            src, tgt = rows[i]
            ids[b, : len(src)], mask[b, : len(src)] = torch.tensor(src), 1
            labels[b, : len(tgt)] = torch.tensor(tgt)
        ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
        encoded = model.encode(ids, mask).last_hidden_state  # (b, S, H)
        hidden = model.decode(model.shift_right(labels), encoded, mask).last_hidden_state  # (b, T, H)
        real = labels != -100
        logp = _gather(model.lm_logits(hidden[real]), labels[real].tolist())  # row-major: row by row
        k = 0
        for i in chunk:
            n = len(rows[i][1])
            out[i], k = logp[k : k + n], k + n
    return out


def _result(logp: np.ndarray, truncated: bool) -> dict:
    total = float(sum(logp.tolist()))  # float64 accumulation of float32 terms
    n = len(logp)
    return {"log_likelihood": total, "tokens": n, "perplexity": math.exp(-total / n), "truncated": truncated}


def _paired_texts(data: dict, limits, single: str, plural: str, other: str, others: str,
                  required: bool) -> tuple[list[str], list[str] | None]:
    """``single``/``plural`` texts and, per text, an ``other``/``others`` companion (optional
    unless ``required``), with the one-or-many forms matched ("text" + "context", "texts" +
    "contexts")."""
    texts = texts_field(data, single, plural, limits)
    if other not in data and others not in data:
        if required:
            raise RequestError(422, f"send '{other}' with '{single}' (or '{others}' with '{plural}')")
        return texts, None
    key = other if single in data else others
    if key not in data:
        raise RequestError(422, f"use '{other}' with '{single}' and '{others}' with '{plural}'")
    companions = texts_field(data, other, others, limits)
    if len(companions) != len(texts):
        raise RequestError(422, f"'{others}' has {len(companions)} items but '{plural}' has {len(texts)}")
    return texts, companions


class _ScoreMethod:
    """What both ``score`` methods share: the model and its limits from the context, texts plus
    one companion per text (``companion``: single and plural field), one pass for all rows."""

    name = "score"
    decoding_loop = True  # runs its model itself, not the predictor's forward (ember.api.model: one request)
    companion: tuple[str, str]
    required = False  # must every text have its companion?

    def __init__(self, ctx) -> None:
        self.model, self.tokenizer = ctx.model, ctx.tokenizer
        self.max_length, self.max_batch = ctx.max_length, ctx.max_batch
        self.counters = ctx.counters
        self.lock = threading.Lock()

    def parse(self, data: dict, limits) -> dict:
        one, many = self.companion
        check_fields(data, {"text", "texts", one, many})
        texts, others = _paired_texts(data, limits, "text", "texts", one, many, self.required)
        return {"texts": texts, many: others}

    def _answer(self, rows: list, cuts: list[bool], spans: list, score) -> list[dict]:
        """Score every row in one locked pass; one response per request's slice of rows."""
        with self.lock:
            logps = score(rows) if rows else []
            self.counters["forwards"] += math.ceil(len(rows) / self.max_batch)
        return [{"results": [_result(lp, cut) for lp, cut in zip(logps[s], cuts[s])], "truncated": any(cuts[s])}
                for s in spans]


class ScoreMethod(_ScoreMethod):
    """``score`` of a causal LM: texts (optionally each after a context) -> log-likelihood."""

    inputs = {"text": "texts", "context": "contexts"}
    companion = ("context", "contexts")  # log p(text | <eot> context)
    form = {"title": "Score", "view": "score", "fields": [
        {"name": "texts", "label": "Texts to score (one per line)", "type": "lines",
         "default": "The city is on the river.\nThe river is on the city."},
    ]}

    def __init__(self, ctx) -> None:
        from ember.tokenizers import end_of_text_id

        super().__init__(ctx)
        self.eot_id = end_of_text_id(ctx.tokenizer)

    def _row(self, text: str, context: str | None) -> tuple[tuple[list[int], int], bool]:
        """(([eot] + context + text ids, tokens scored), truncated) within max_length tokens."""
        encode = self.tokenizer.encode
        ids = encode(text, add_special_tokens=False).ids
        before = encode(context, add_special_tokens=False).ids if context else []
        room = self.max_length - 1  # after <eot>
        cut = len(ids) + len(before) > room
        ids = ids[:room]
        before = before[len(before) - (room - len(ids)):] if room > len(ids) else []
        if not ids:
            raise RequestError(422, f"the text {text[:40]!r} has no tokens to score")
        return ([self.eot_id] + before + ids, len(ids)), cut

    def __call__(self, requests: Sequence[dict], forward=None) -> list:
        rows, cuts, spans, failed = [], [], [], {}
        for r, req in enumerate(requests):
            try:
                encoded = [self._row(t, c) for t, c in zip(req["texts"], req["contexts"] or [None] * len(req["texts"]))]
            except RequestError as exc:  # this request only; the others are answered
                failed[r] = exc
                continue
            spans.append(slice(len(rows), len(rows) + len(encoded)))
            rows += [row for row, _ in encoded]
            cuts += [cut for _, cut in encoded]
        answered = iter(self._answer(rows, cuts, spans, lambda x: causal_logprobs(self.model, x, self.max_batch)))
        return [failed[r] if r in failed else next(answered) for r in range(len(requests))]


class Seq2SeqScoreMethod(_ScoreMethod):
    """``score`` of an encoder-decoder (T5): log p(target </s> | input) per (input, target)."""

    inputs = {"text": "texts", "target": "targets"}
    companion = ("target", "targets")
    required = True
    form = {"title": "Score", "view": "score", "fields": [
        {"name": "text", "label": "Input", "type": "textarea", "default": "sst2 sentence: a gem of a film"},
        {"name": "target", "label": "Target", "type": "text", "default": "positive"},
    ]}

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.pad_id = ctx.special["pad"]
        self.encoder = ctx.encoder()  # the input, truncated with its template (</s>) kept

    def __call__(self, requests: Sequence[dict], forward=None) -> list:
        rows, cuts, spans = [], [], []
        for req in requests:
            inputs = self.encoder(req["texts"])
            spans.append(slice(len(rows), len(rows) + len(inputs)))
            for (ids, _, cut), target in zip(inputs, req["targets"]):
                tgt = self.tokenizer.encode(target).ids  # with the template's </s>
                rows.append((ids, tgt[: self.max_length]))
                cuts.append(cut or len(tgt) > self.max_length)
        return self._answer(rows, cuts, spans, lambda x: seq2seq_logprobs(self.model, x, self.pad_id, self.max_batch))
