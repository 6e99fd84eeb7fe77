"""Request bodies: read with a size limit, parse, validate; every problem is a 4xx with a message.

Checked here, before anything reaches the model: body size (413), empty body or malformed
JSON (400), a body that is not a JSON object, unknown fields, wrong types, empty texts, too
many texts in one request or too long a text, out-of-range options such as a negative
temperature (422). Each parser returns the normalised request the predictor expects.
"""

from __future__ import annotations

import json
import math
import secrets
from dataclasses import dataclass


class RequestError(Exception):
    """A client error: HTTP ``status`` and a message saying what to change."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 1_000_000
    max_texts: int = 64  # texts (or sentences, or questions) in one request
    max_chars: int = 20_000  # characters in one text / context
    max_new_tokens: int = 256  # tokens one /generate prompt may ask for (`ember serve --max-new-tokens`)


async def read_json(request, limits: Limits) -> dict:
    """The request body as a JSON object, read incrementally so a huge body is refused early."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            declared_bytes = int(declared)
        except ValueError:
            raise RequestError(400, f"bad Content-Length header {declared!r}") from None
        if declared_bytes > limits.max_body_bytes:
            raise RequestError(413, f"request body of {declared_bytes} bytes exceeds the limit of "
                               f"{limits.max_body_bytes}; send fewer or shorter texts")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limits.max_body_bytes:
            raise RequestError(413, f"request body exceeds the limit of {limits.max_body_bytes} bytes; "
                               "send fewer or shorter texts")
    if not body.strip():
        raise RequestError(400, 'empty request body; send a JSON object, e.g. {"text": "a fine film"}')
    try:
        data = json.loads(bytes(body))
    except (ValueError, RecursionError) as exc:
        raise RequestError(400, f"malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise RequestError(422, f"the body must be a JSON object, not {type(data).__name__}")
    return data


def _check_fields(data: dict, allowed: set[str]) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise RequestError(422, f"unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")


def _text(value, name: str, limits: Limits) -> str:
    if not isinstance(value, str):
        raise RequestError(422, f"'{name}' must be a string, not {type(value).__name__}")
    if not value.strip():
        raise RequestError(422, f"'{name}' is empty")
    if len(value) > limits.max_chars:
        raise RequestError(422, f"'{name}' has {len(value)} characters; the limit is {limits.max_chars}")
    return value


def _texts(data: dict, single: str, plural: str, limits: Limits) -> list[str]:
    """Either ``single`` (one string) or ``plural`` (a non-empty list of strings)."""
    if (single in data) == (plural in data):
        raise RequestError(422, f"send exactly one of '{single}' (a string) or '{plural}' (a list of strings)")
    if single in data:
        return [_text(data[single], single, limits)]
    values = data[plural]
    if not isinstance(values, list):
        raise RequestError(422, f"'{plural}' must be a list of strings, not {type(values).__name__}")
    if not values:
        raise RequestError(422, f"'{plural}' is empty")
    if len(values) > limits.max_texts:
        raise RequestError(422, f"'{plural}' has {len(values)} items; the limit is {limits.max_texts} "
                           "per request (split it into several requests)")
    return [_text(v, f"{plural}[{i}]", limits) for i, v in enumerate(values)]


def _int(data: dict, name: str, default: int, low: int, high: int, why: str = "") -> int:
    """An integer field in [low, high]; ``why`` explains the bounds in the error message."""
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(422, f"'{name}' must be an integer, not {type(value).__name__}")
    if not low <= value <= high:
        raise RequestError(422, f"'{name}' must be between {low} and {high}{why}, got {value}")
    return value


def parse_classify(data: dict, limits: Limits) -> dict:
    """{"text": str} | {"texts": [str]}, optionally "text_pair" / "text_pairs" (sentence pairs)."""
    _check_fields(data, {"text", "texts", "text_pair", "text_pairs"})
    texts = _texts(data, "text", "texts", limits)
    pairs = None
    if "text_pair" in data or "text_pairs" in data:
        key = "text_pair" if "text" in data else "text_pairs"
        if key not in data:
            raise RequestError(422, "use 'text_pair' with 'text' and 'text_pairs' with 'texts'")
        pairs = _texts(data, "text_pair", "text_pairs", limits)
        if len(pairs) != len(texts):
            raise RequestError(422, f"'text_pairs' has {len(pairs)} items but 'texts' has {len(texts)}")
    return {"texts": texts, "pairs": pairs}


POOLINGS = ("mean", "cls", "none")


def parse_embed(data: dict, limits: Limits, num_layers: int) -> dict:
    """Texts as for /classify, plus pooling (mean | cls | none = per token), layer (0 = embeddings,
    -1 = last) or layer_weights (one per layer incl. embeddings, softmax-mixed), normalize."""
    _check_fields(data, {"text", "texts", "text_pair", "text_pairs", "pooling", "layer", "layer_weights",
                         "normalize"})
    req = parse_classify({k: v for k, v in data.items() if k in ("text", "texts", "text_pair", "text_pairs")},
                         limits)
    pooling = data.get("pooling", "mean")
    if pooling not in POOLINGS:
        raise RequestError(422, f"'pooling' must be one of {', '.join(POOLINGS)}, got {pooling!r}")
    n = num_layers + 1
    if "layer" in data and "layer_weights" in data:
        raise RequestError(422, "send 'layer' or 'layer_weights', not both")
    layer = _int(data, "layer", -1, -n, n - 1)
    weights = data.get("layer_weights")
    if weights is not None:
        if (not isinstance(weights, list) or len(weights) != n
                or not all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in weights)):
            raise RequestError(422, f"'layer_weights' must be a list of {n} numbers (embeddings + "
                               f"{num_layers} layers)")
        if not all(abs(w) < 1e6 for w in weights):
            raise RequestError(422, "'layer_weights' must be finite numbers below 1e6 in size")
    normalize = data.get("normalize", False)
    if not isinstance(normalize, bool):
        raise RequestError(422, f"'normalize' must be true or false, not {type(normalize).__name__}")
    return {**req, "pooling": pooling, "layer": layer, "layer_weights": weights, "normalize": normalize}


def parse_fill_mask(data: dict, limits: Limits) -> dict:
    """{"text": str with mask tokens, "top_k": int (default 5)}."""
    _check_fields(data, {"text", "top_k"})
    if "text" not in data:
        raise RequestError(422, "'text' is required")
    return {"texts": [_text(data["text"], "text", limits)], "pairs": None, "top_k": _int(data, "top_k", 5, 1, 100)}


def parse_tag(data: dict, limits: Limits) -> dict:
    """{"text": str} | {"texts": [str]} (split into words) | {"words": [[str]]} (pre-split)."""
    from ember.tasks.tagging import split_words

    _check_fields(data, {"text", "texts", "words"})
    if "words" in data:
        if "text" in data or "texts" in data:
            raise RequestError(422, "send 'words' or 'text'/'texts', not both")
        sentences = data["words"]
        if not isinstance(sentences, list) or not sentences:
            raise RequestError(422, "'words' must be a non-empty list of sentences, each a list of words")
        if len(sentences) > limits.max_texts:
            raise RequestError(422, f"'words' has {len(sentences)} sentences; the limit is {limits.max_texts}")
        out = []
        for i, words in enumerate(sentences):
            if not isinstance(words, list) or not words:
                raise RequestError(422, f"'words[{i}]' must be a non-empty list of words")
            out.append([_text(w, f"words[{i}][{j}]", limits) for j, w in enumerate(words)])
        if sum(len(" ".join(w)) for w in out) > limits.max_chars * limits.max_texts:
            raise RequestError(422, "the sentences are too long in total")
        return {"words": out}
    texts = _texts(data, "text", "texts", limits)
    words = [split_words(t) for t in texts]
    empty = [i for i, w in enumerate(words) if not w]
    if empty:
        raise RequestError(422, f"text {empty[0]} has no words")
    return {"words": words}


def parse_answer(data: dict, limits: Limits) -> dict:
    """{"question": str, "context": str, "top_k": int (n-best spans returned, default 3)}."""
    _check_fields(data, {"question", "context", "top_k"})
    for name in ("question", "context"):
        if name not in data:
            raise RequestError(422, f"'{name}' is required")
    return {"question": _text(data["question"], "question", limits),
            "context": _text(data["context"], "context", limits), "top_k": _int(data, "top_k", 3, 1, 20)}


def _number(data: dict, name: str, default: float | None) -> float | None:
    value = data.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(422, f"'{name}' must be a number, not {type(value).__name__}")
    if not math.isfinite(value):
        raise RequestError(422, f"'{name}' must be a finite number, got {value}")
    return float(value)


MAX_STOP = 16  # stop sequences per request
MAX_STOP_CHARS = 200
MIN_TEMPERATURE = 1e-4  # below this, logits / T can overflow float32 (sampling NaN); use 0 for greedy
MAX_TEMPERATURE = 100.0
DEFAULT_NEW_TOKENS = 50  # as `ember generate`


def parse_generate(data: dict, limits: Limits, context: int, vocab_size: int) -> dict:
    """{"prompt": str} | {"prompts": [str]}, optional max_new_tokens, temperature, top_k, top_p,
    stop (list of strings), seed -> {"prompts", "config": GenerationConfig}.

    ``context`` is the tokens a prompt plus its continuation may span: max_new_tokens is at
    most min(limits.max_new_tokens, context - 1), so at least one prompt token fits. As in
    `ember generate`, temperature 0 is greedy, and top_k / top_p alone imply sampling at
    temperature 1; with temperature 0 they are refused rather than silently ignored. A
    sampling request without a seed gets a random one, returned in the response.
    """
    from ember.generate import GenerationConfig

    _check_fields(data, {"prompt", "prompts", "max_new_tokens", "temperature", "top_k", "top_p", "stop", "seed"})
    prompts = _texts(data, "prompt", "prompts", limits)
    high = min(limits.max_new_tokens, context - 1)
    new_tokens = _int(data, "max_new_tokens", min(DEFAULT_NEW_TOKENS, high), 1, high,
                      f" (the server's cap is {limits.max_new_tokens}; the model's context of {context} "
                      "tokens must also hold at least one prompt token)")
    top_k = _int(data, "top_k", 0, 0, vocab_size)
    top_p = _number(data, "top_p", 1.0)
    if not 0.0 < top_p <= 1.0:
        raise RequestError(422, f"'top_p' must be in (0, 1] (1 = no nucleus cut), got {top_p}")
    temperature = _number(data, "temperature", None)
    cuts = top_k > 0 or top_p < 1.0
    if temperature is None:
        temperature = 1.0 if cuts else 0.0
    elif temperature != 0.0 and not MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE:
        raise RequestError(422, f"'temperature' must be 0 (greedy) or between {MIN_TEMPERATURE:g} and "
                           f"{MAX_TEMPERATURE:g} (sampling), got {temperature}")
    elif temperature == 0.0 and cuts:
        raise RequestError(422, "'top_k' and 'top_p' only apply when sampling; with 'temperature' 0 (greedy) "
                           "drop them, or set 'temperature' above 0")
    stop = data.get("stop", [])
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise RequestError(422, "'stop' must be a list of strings, e.g. [\".\", \"\\n\"]")
    if len(stop) > MAX_STOP:
        raise RequestError(422, f"'stop' has {len(stop)} items; the limit is {MAX_STOP}")
    for i, s in enumerate(stop):
        if not s or len(s) > MAX_STOP_CHARS:
            raise RequestError(422, f"'stop[{i}]' must have 1 to {MAX_STOP_CHARS} characters")
    seed = data.get("seed")
    if seed is None:
        seed = secrets.randbelow(2**31) if temperature > 0 else 0
    seed = _int({"seed": seed}, "seed", 0, 0, 2**63 - 1)
    config = GenerationConfig(max_new_tokens=new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                              stop=tuple(stop), seed=seed)
    return {"prompts": prompts, "config": config}
