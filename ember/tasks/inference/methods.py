"""What a model answers at inference, one *method* at a time.

A method (``classify``, ``tag``, ``answer``, ``fill-mask``, ``embed``, ``generate``, ...) belongs
to the task or objective whose head it decodes, and lives beside that head. It has

    name                              the method's name (the HTTP endpoint is "/" + name)
    parse(data, limits) -> request    a JSON-like dict checked field by field (RequestError, 4xx)
    __call__(requests, forward)       one response (or a RequestError) per validated request
    inputs (optional)                 the fields that carry one value per input, {single: plural
                                      or None}, the first the main one (default {"text":
                                      "texts"}): how ``ember.load(...).<method>(inputs, ...)``
                                      turns a Python list into requests
    form (optional)                   how the page of `ember serve` (GET /) asks for a request and
                                      shows the response: {"title", "view", "fields": [{"name",
                                      "label", "type": text | textarea | lines | number | select |
                                      checkbox | hidden, "default" / "value", "optional", "min",
                                      "max", "step", "options"}]}; "view" names one of the page's
                                      renderers (ember/serve/page/page.js), and a method without
                                      a form gets a JSON editor there

``forward(rows, need_hidden)`` is given by the caller (``ember.serve.predictor``: the same for
the HTTP server and the Python API): it runs ``rows`` (token ids, segment ids) through the
model's inference graph in length-sorted, padded batches on whatever backend is loaded
(PyTorch fp32/int8, ONNX Runtime), and returns per row the head's logits trimmed to the row's
length and, with ``need_hidden``, every layer's hidden states (L + 1, n, H), or only the layers
it lists (a list of indices: (len, n, H)). A method that
runs its own decoding loop (generation) holds its model instead and ignores ``forward``.

The model side of the same contract is the task module's ``head_logits(out, attention_mask)``
(the head applied to one backbone pass), ``logits_axes`` (which logits axis is the sequence,
for trimming and for ONNX's dynamic axes) and ``compare_view`` (which logits are real, and
the predictions, for checking an export against the original).

A provider (a task adapter for a fine-tuned run, ``ember.tasks.inference.pretrained`` for a pre-training
run) says which methods a run has: ``inference_methods(ctx)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
from tokenizers import Tokenizer

from ember.tasks.inference.requests import TextEncoder

# rows [(ids, type_ids)], need_hidden (bool or layer indices) -> per row (logits, hidden (layers, n, H) or None)
Forward = Callable[[Sequence[tuple[list, list]], "bool | list[int]"], list]


@dataclass
class InferenceContext:
    """What a method needs to know about the loaded model besides its weights."""

    tokenizer: Tokenizer
    max_length: int  # tokens per input (truncation), within the model's positions
    special: dict[str, int]  # pad/cls/sep/mask (eot for causal LMs)
    labels: list[str] | None = None  # output labels of a fine-tuned head
    num_layers: int = 0
    hidden_size: int = 0
    max_batch: int = 32  # rows per forward pass
    model: Any = None  # the loaded model, for methods with their own decoding loop
    vocab_size: int = 0
    counters: dict = field(default_factory=lambda: {"forwards": 0})
    embedding: Any = None  # the run's embedding defaults (ember.runs.embedding), None: mean, unnormalised

    def encoder(self) -> TextEncoder:
        return TextEncoder(self.tokenizer, self.max_length)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def encode_texts(encoder: TextEncoder, requests: Sequence[dict]):
    """Flatten the texts (and pairs) of all requests: (rows, truncated flags, slice per request)."""
    rows, flags, spans = [], [], []
    for req in requests:
        encoded = encoder(req["texts"], req.get("pairs"))
        spans.append(slice(len(rows), len(rows) + len(encoded)))
        rows += [(ids, types) for ids, types, _ in encoded]
        flags += [cut for _, _, cut in encoded]
    return rows, flags, spans


def sequence_view(logits: np.ndarray, mask: np.ndarray, regression: bool = False):
    """``compare_view`` of per-sequence logits (B, C): every value is real; one prediction per row."""
    return np.ones(logits.shape, dtype=bool), None if regression else logits.argmax(-1)


def token_view(logits: np.ndarray, mask: np.ndarray, regression: bool = False):
    """``compare_view`` of per-token logits (B, T, C): real tokens only; one prediction per token."""
    real = mask.astype(bool)
    return np.broadcast_to(real[:, :, None], logits.shape), logits.argmax(-1)[real]
