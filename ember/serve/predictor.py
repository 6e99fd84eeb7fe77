"""What each endpoint computes, for a micro-batch of validated requests of one kind.

``Predictor.run(kind, requests)`` tokenizes every request of the micro-batch, runs the rows
through the model in as few forward passes as possible (rows sorted by length, padded per
chunk of at most ``max_batch`` rows), and returns one response dict per request, or a
``RequestError`` for a request that cannot be answered (e.g. a fill-mask text whose masks
were all truncated away); one bad request never fails the others.

Inputs longer than ``max_length`` tokens are truncated, and every result says whether its
input was (``"truncated": true``).
"""

from __future__ import annotations

import threading
from typing import Sequence

import numpy as np

from ember.serve.graph import KIND_ENDPOINTS, ServeInfo
from ember.serve.inputs import TextEncoder, pad_arrays
from ember.serve.requests import RequestError


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


class Predictor:
    def __init__(self, runner, info: ServeInfo, tokenizer, max_length: int | None = None,
                 max_batch: int = 32) -> None:
        max_length = min(max_length or info.max_length, info.max_position)
        self.runner, self.info, self.tokenizer = runner, info, tokenizer
        self.max_length, self.max_batch = max_length, max_batch
        self.encoder = TextEncoder(tokenizer, max_length)
        self.forwards = 0  # forward passes run (micro-batching shows as forwards < requests)
        self._lock = threading.Lock()  # one forward at a time, whichever thread calls

    @property
    def backend(self) -> str:
        return self.runner.backend

    @property
    def endpoints(self) -> list[str]:
        return [KIND_ENDPOINTS[self.info.kind], "/embed"]

    def run(self, kind: str, requests: Sequence[dict]) -> list:
        handler = {"classify": self._classify, "embed": self._embed, "fill-mask": self._fill_mask,
                   "tag": self._tag, "answer": self._answer}[kind]
        return handler(requests)

    # -- the shared forward --------------------------------------------------------------------
    def forward(self, rows: Sequence[tuple[list, list]], need_hidden: bool = False) -> list:
        """Per row: (logits trimmed to the row's length, hidden (L+1, n, H) or None)."""
        order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
        out: list = [None] * len(rows)
        with self._lock:
            for first in range(0, len(order), self.max_batch):
                chunk = order[first : first + self.max_batch]
                logits, hidden = self.runner(pad_arrays([rows[i] for i in chunk], self.info.pad_id), need_hidden)
                self.forwards += 1
                for j, i in enumerate(chunk):
                    n = len(rows[i][0])
                    row = logits[j] if self.info.kind == "classify" else (
                        logits[j, :, :n] if self.info.kind == "answer" else logits[j, :n])
                    out[i] = (row, None if hidden is None else hidden[:, j, :n])
        return out

    def _encode_all(self, requests: Sequence[dict]):
        """Flatten the texts of all requests; returns (rows, truncated flags, slices per request)."""
        rows, flags, spans = [], [], []
        for req in requests:
            encoded = self.encoder(req["texts"], req.get("pairs"))
            spans.append(slice(len(rows), len(rows) + len(encoded)))
            rows += [(ids, types) for ids, types, _ in encoded]
            flags += [cut for _, _, cut in encoded]
        return rows, flags, spans

    # -- endpoints -------------------------------------------------------------------------------
    def _classify(self, requests):
        rows, flags, spans = self._encode_all(requests)
        outs = self.forward(rows)
        labels = self.info.labels or []
        results = []
        for i, (logits, _) in enumerate(outs):
            if self.info.is_regression:
                results.append({"score": float(logits[0]), "truncated": flags[i]})
            else:
                probs = _softmax(logits.astype(np.float64))
                names = labels if len(labels) == len(probs) else [str(k) for k in range(len(probs))]
                results.append({"label": names[int(probs.argmax())],
                                "probabilities": {n: float(p) for n, p in zip(names, probs)},
                                "truncated": flags[i]})
        return [{"results": results[s], "truncated": any(flags[s])} for s in spans]

    def _embed(self, requests):
        rows, flags, spans = self._encode_all(requests)
        outs = self.forward(rows, need_hidden=True)
        responses = []
        for req, s in zip(requests, spans):
            results = []
            for (_, hidden), (ids, _), cut in zip(outs[s], rows[s], flags[s]):
                if req["layer_weights"] is not None:
                    # ELMo's scalar mix (Peters et al. 2018, eq. 1) with fixed weights: softmax(w)
                    w = _softmax(np.asarray(req["layer_weights"], dtype=np.float64))
                    states = np.tensordot(w, hidden, axes=1)  # (n, H)
                else:
                    states = hidden[req["layer"]]  # (n, H)
                if req["pooling"] == "none":
                    vectors = states
                    result = {"tokens": [self.tokenizer.id_to_token(t) for t in ids]}
                else:
                    vectors = states[0] if req["pooling"] == "cls" else states.mean(0)  # no padding here
                    result = {}
                if req["normalize"]:
                    vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
                key = "embeddings" if req["pooling"] == "none" else "embedding"
                result.update({key: np.asarray(vectors, dtype=np.float32).tolist(), "truncated": cut})
                results.append(result)
            responses.append({"results": results, "truncated": any(flags[s]),
                              "dimension": int(self.info.hidden_size)})
        return responses

    def _fill_mask(self, requests):
        mask_id = self.info.special["mask"]
        mask_token = self.tokenizer.id_to_token(mask_id)
        rows, flags, spans = self._encode_all(requests)
        outs = self.forward(rows)
        responses = []
        for req, s in zip(requests, spans):
            (logits, _), (ids, _), cut = outs[s][0], rows[s][0], flags[s][0]
            positions = [p for p, t in enumerate(ids) if t == mask_id]
            if not positions:
                where = f" within the first {self.max_length} tokens" if cut else ""
                responses.append(RequestError(422, f"no {mask_token} token in 'text'{where}; write e.g. "
                                              f"'Paris is the capital of {mask_token}.'"))
                continue
            masks = []
            for p in positions:
                probs = _softmax(logits[p].astype(np.float64))
                top = np.argsort(-probs, kind="stable")[: req["top_k"]]
                masks.append([{"token": self.tokenizer.id_to_token(int(t)), "probability": float(probs[t])}
                              for t in top])
            responses.append({"masks": masks, "truncated": cut})
        return responses

    def _tag(self, requests):
        from ember.tasks.ner_metrics import get_entities
        from ember.tasks.tagging import encode_words

        sentences = [req["words"] for req in requests]  # per request: sentences, each a list of words
        flat = [words for words_list in sentences for words in words_list]
        features, _ = encode_words(flat, self.tokenizer, self.max_length)
        outs = self.forward([(f["input_ids"], f["token_type_ids"]) for f in features])
        labels = self.info.labels
        responses, k = [], 0
        for words_list in sentences:
            results = []
            for words in words_list:
                f, (logits, _) = features[k], outs[k]
                k += 1
                starts = np.asarray(f["word_starts"], dtype=np.int64)
                token_pred = logits.argmax(-1)
                tags = [labels[int(token_pred[p])] if p >= 0 else "O" for p in starts]
                # Cut-off words have no sub-token (-1); a full-length row with such words was truncated.
                cut = len(f["input_ids"]) >= self.max_length and bool((starts < 0).any())
                entities = [{"type": t, "start": a, "end": b + 1, "text": " ".join(words[a : b + 1])}
                            for t, a, b in get_entities(tags)]
                results.append({"words": words, "tags": tags, "entities": entities, "truncated": cut})
            responses.append({"results": results, "truncated": any(r["truncated"] for r in results)})
        return responses

    def _answer(self, requests):
        from ember.tasks.base import get_adapter
        from ember.tasks.qa import decode_answers
        from ember.tasks.squad import SquadExample, featurize_squad

        adapter = get_adapter(self.info.task)
        examples = [SquadExample(str(i), "", r["question"], r["context"], (), False) for i, r in enumerate(requests)]
        features = featurize_squad(examples, self.tokenizer, self.max_length, adapter.doc_stride,
                                   adapter.max_query_length)
        outs = self.forward([(f["input_ids"], f["token_type_ids"]) for f in features])
        answers = decode_answers([ex.context for ex in examples], features,
                                 [(logits[0], logits[1]) for logits, _ in outs], adapter.n_best,
                                 adapter.max_answer_length)
        responses = []
        for req, ex, answer in zip(requests, examples, answers):
            question_tokens = len(self.encoder.tokenizer.encode(ex.question, add_special_tokens=False).ids)
            null = adapter.with_no_answer and answer.null_minus_best > adapter.null_threshold
            responses.append({
                "answer": "" if null else answer.text, "best_span": answer.text,
                "score": answer.score if np.isfinite(answer.score) else None,
                "no_answer_score": answer.null_minus_best if adapter.with_no_answer and np.isfinite(answer.score) else None,
                "nbest": [{"text": t, "score": v} for t, v in answer.nbest[: req["top_k"]]],
                # Contexts are read in overlapping windows (never cut); long questions are.
                "truncated": question_tokens > adapter.max_query_length,
            })
        return responses
