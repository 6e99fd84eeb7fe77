"""Requests to a model, as the Python API and the HTTP server receive them: limits, field
validation with messages that name the field, and texts -> token ids with explicit truncation.

Every problem is a ``RequestError`` (4xx) saying what to change; nothing here touches a model.
The methods of each task (``ember.tasks.inference.methods``) parse their own requests with these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from tokenizers import Tokenizer

from ember.errors import EmberError, RequestError


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 1_000_000
    max_texts: int = 64  # texts (or sentences, or questions) in one request
    max_chars: int = 20_000  # characters in one text / context
    max_new_tokens: int = 256  # tokens one /generate prompt may ask for (`ember serve --max-new-tokens`)


def check_fields(data: dict, allowed: set[str]) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise RequestError(422, f"unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")


def text_field(value, name: str, limits: Limits) -> str:
    if not isinstance(value, str):
        raise RequestError(422, f"'{name}' must be a string, not {type(value).__name__}")
    if not value.strip():
        raise RequestError(422, f"'{name}' is empty")
    if len(value) > limits.max_chars:
        raise RequestError(422, f"'{name}' has {len(value)} characters; the limit is {limits.max_chars}")
    return unicode_field(value, name)


def unicode_field(value: str, name: str) -> str:
    """JSON may carry lone surrogates ("\ud800"), which no tokenizer can read nor response encode."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(422, f"'{name}' is not valid Unicode text ({exc.reason} at character "
                           f"{exc.start}); send UTF-8 text without lone surrogates") from None
    return value


def texts_field(data: dict, single: str, plural: str, limits: Limits) -> list[str]:
    """Either ``single`` (one string) or ``plural`` (a non-empty list of strings)."""
    if (single in data) == (plural in data):
        raise RequestError(422, f"send exactly one of '{single}' (a string) or '{plural}' (a list of strings)")
    if single in data:
        return [text_field(data[single], single, limits)]
    values = data[plural]
    if not isinstance(values, list):
        raise RequestError(422, f"'{plural}' must be a list of strings, not {type(values).__name__}")
    if not values:
        raise RequestError(422, f"'{plural}' is empty")
    if len(values) > limits.max_texts:
        raise RequestError(422, f"'{plural}' has {len(values)} items; the limit is {limits.max_texts} "
                           "per request (split it into several requests)")
    return [text_field(v, f"{plural}[{i}]", limits) for i, v in enumerate(values)]


def int_field(data: dict, name: str, default: int, low: int, high: int, why: str = "") -> int:
    """An integer field in [low, high]; ``why`` explains the bounds in the error message."""
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(422, f"'{name}' must be an integer, not {type(value).__name__}")
    if not low <= value <= high:
        raise RequestError(422, f"'{name}' must be between {low} and {high}{why}, got {value}")
    return value


def parse_texts(data: dict, limits: Limits) -> dict:
    """{"text": str} | {"texts": [str]}, optionally "text_pair" / "text_pairs" (sentence pairs)."""
    check_fields(data, {"text", "texts", "text_pair", "text_pairs"})
    texts = texts_field(data, "text", "texts", limits)
    pairs = None
    if "text_pair" in data or "text_pairs" in data:
        key = "text_pair" if "text" in data else "text_pairs"
        if key not in data:
            raise RequestError(422, "use 'text_pair' with 'text' and 'text_pairs' with 'texts'")
        pairs = texts_field(data, "text_pair", "text_pairs", limits)
        if len(pairs) != len(texts):
            raise RequestError(422, f"'text_pairs' has {len(pairs)} items but 'texts' has {len(texts)}")
    return {"texts": texts, "pairs": pairs}


def number_field(data: dict, name: str, default: float | None) -> float | None:
    value = data.get(name, default)
    if value is None:
        if default is None:  # an optional setting left unset ("temperature": null = the default rule)
            return None
        # a setting with a default given as null: refused as the HTTP layer refuses it (it was a
        # TypeError further on from Python, e.g. "top_p": None)
        raise RequestError(422, f"'{name}' must be a number, not null (leave it out for the default, {default})")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(422, f"'{name}' must be a number, not {type(value).__name__}")
    if not math.isfinite(value):
        raise RequestError(422, f"'{name}' must be a finite number, got {value}")
    return float(value)


class TextEncoder:
    """Single sentences or pairs -> (ids, type_ids, truncated), truncated to ``max_length``.

    One private tokenizer copy is configured once (``longest_first``, BERT's pair rule) and
    reused for every request; ``truncated`` is read from the encoding's overflow, so the
    response can say which inputs were cut.
    """

    def __init__(self, tokenizer: Tokenizer, max_length: int) -> None:
        self.tokenizer = Tokenizer.from_str(tokenizer.to_str())
        self.tokenizer.no_padding()
        room = max_length - self.tokenizer.num_special_tokens_to_add(True)
        if room < 2:
            raise EmberError(f"max_length={max_length} leaves no room for text after special tokens")
        self.tokenizer.enable_truncation(max_length, strategy="longest_first")
        self.max_length = max_length

    def __call__(self, texts: Sequence[str], pairs: Sequence[str] | None = None) -> list[tuple[list, list, bool]]:
        inputs = list(texts) if pairs is None else list(zip(texts, pairs))
        return [(e.ids, e.type_ids, bool(e.overflowing)) for e in self.tokenizer.encode_batch(inputs)]


# -- request bodies as JSON Schema (the OpenAPI page of `ember serve`: /docs, /openapi.json) --------


def body_schema(description: str, properties: dict, example: dict, required: tuple[str, ...] = ()) -> dict:
    """A method's request body as a JSON Schema object; ``request_schema`` of each method.
    Unknown fields are refused (``check_fields``), hence ``additionalProperties: false``."""
    schema = {"type": "object", "description": description, "properties": properties,
              "additionalProperties": False, "example": example}
    if required:
        schema["required"] = list(required)
    return schema


def string_schema(description: str) -> dict:
    return {"type": "string", "description": description}


def strings_schema(description: str) -> dict:
    return {"type": "array", "items": {"type": "string"}, "description": description}


TEXT_FIELDS = {
    "text": string_schema("one text; send 'text' or 'texts'"),
    "texts": strings_schema("several texts, answered in order (at most the server's max_texts)"),
    "text_pair": string_schema("the second text of a sentence pair, with 'text'"),
    "text_pairs": strings_schema("the second texts of sentence pairs, with 'texts' (as many)"),
}
