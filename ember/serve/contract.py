"""The HTTP contract of `ember serve`: the OpenAPI entry of each route, stated tightly enough that
a client (or an OpenAPI fuzzer) can tell from /openapi.json alone which requests are accepted
and what every answer looks like.

Each POST route documents:

- its request body as the forms it accepts (``anyOf`` of closed objects: "exactly one of
  'text' / 'texts'" is a form with ``text`` required and one with ``texts`` required, neither
  allowing the other), with the limits the server enforces: ``maxLength`` = the character cap
  (``--max-chars``), ``maxItems`` = ``--max-texts``, a text must hold a non-blank character,
  number ranges and enums as the method's ``parse`` checks them, rules between fields (greedy
  decoding takes no ``top_k`` / ``top_p``; beam-search settings only with ``num_beams`` above 1)
  as separate forms; and no field is ever ``null`` (leave a field out to get its default);
- every status it can answer, with its body's schema: 200 (the keys every answer has, and their
  types), 400 (empty body, malformed JSON, a bad Content-Length), 413
  (body over ``--max-body-bytes``), 422 (a field the method refuses), 500 (an unexpected failure;
  the server keeps running), 503 (queue full, or shutting down), each error with its body's
  schema, ``{"error": message}``.

A few rules JSON Schema cannot state are in the form's description instead: paired lists
('texts' and 'text_pairs', 'contexts', 'targets') have equal lengths, and the mask token of
/fill-mask must fall within the model's first ``max_length`` tokens.

The schemas are built here, from each method's fields (``ember.tasks``' ``request_schema`` where
a method has one) and the server's ``Limits``; ``parse`` remains what checks a request, with
messages that name the field. Methods this module does not know keep their own schema (or a
plain object) and still get the error statuses.
"""

from __future__ import annotations

import copy
import inspect

# Text fields refuse whitespace-only text (str.strip() empties it), so a text must hold one
# character Python does not count as whitespace. Spelled out rather than \S: a JSON Schema pattern
# is an ECMA-262 regex, whose \s lacks \x1c-\x1f and \x85 (which Python strips) and has \ufeff.
NOT_BLANK = "[^\\x09-\\x0d\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"
MAX_SEED = 2**53 - 1  # over HTTP (prepare); the Python API takes up to 2**63 - 1
MAX_LAYER_WEIGHT = 1e6  # |layer_weights[i]| < 1e6, as ember.tasks.inference.embedding checks it

ERROR_SCHEMA = {"type": "object", "required": ["error"], "additionalProperties": False,
                "properties": {"error": {"type": "string", "description": "what is wrong and what to change"}}}
POST_ERRORS = {
    400: "the body is empty or not JSON, or its Content-Length header is not a number",
    413: "the body is larger than the server's --max-body-bytes",
    422: "the body is JSON but not a request this route accepts (the message names the field): a "
         "missing or unknown field, a wrong type, a value out of range, a text over the character cap",
    500: "an unexpected failure while answering; the server keeps running",
    503: "the server is shutting down, or its queue is full (retry shortly)",
}


def error_responses(statuses: dict[int, str]) -> dict:
    return {str(code): {"description": why, "content": {"application/json": {"schema": ERROR_SCHEMA}}}
            for code, why in statuses.items()}


# -- fields ----------------------------------------------------------------------------------------


def text(limits, description: str) -> dict:
    return {"type": "string", "minLength": 1, "maxLength": limits.max_chars, "pattern": NOT_BLANK,
            "description": f"{description} (at most {limits.max_chars} characters, not blank)"}


def texts(limits, description: str) -> dict:
    return {"type": "array", "minItems": 1, "maxItems": limits.max_texts, "items": text(limits, "a text"),
            "description": f"{description} (1 to {limits.max_texts})"}


def integer(low: int, high: int, description: str) -> dict:
    return {"type": "integer", "minimum": low, "maximum": high, "description": description}


def form(properties: dict, required: tuple[str, ...], description: str = "") -> dict:
    """One accepted shape of a body: a closed object (a field not listed is refused)."""
    schema = {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}
    if description:
        schema["description"] = description
    return schema


def text_forms(limits, common: dict, single: str, plural: str, what: str, other: tuple[str, str] | None = None,
               other_required: bool = False, other_what: str = "") -> list[dict]:
    """The 'one' and the 'many' form of a body: ``single`` (a string) or ``plural`` (a list),
    optionally each with its companion ``other`` = (single, plural) field."""
    one = {single: text(limits, f"one {what}")}
    many = {plural: texts(limits, f"several {what}s, answered in order")}
    need_one, need_many = (single,), (plural,)
    note = ""
    if other is not None:
        one[other[0]] = text(limits, f"the {other_what} of '{single}'")
        many[other[1]] = texts(limits, f"the {other_what}s, one per item of '{plural}'")
        note = f"'{other[1]}' has as many items as '{plural}'"
        if other_required:
            need_one, need_many = (single, other[0]), (plural, other[1])
    return [form({**one, **common}, need_one), form({**many, **common}, need_many, note)]


def decoding(limits, method, high: int, beams: bool) -> list[tuple[dict, tuple[str, ...]]]:
    """The decoding settings' forms (ember.tasks.inference.generation.parse_decoding): explicit greedy
    (temperature 0: no top_k / top_p cut), sampling or the default, and for an encoder-decoder
    beam search (num_beams 2..8, deterministic: no sampling settings). -> (fields, required)."""
    from ember.tasks.inference.generation import MAX_STOP, MAX_STOP_CHARS, MAX_TEMPERATURE, MIN_TEMPERATURE

    common = {
        "max_new_tokens": integer(1, high, f"tokens to generate (at most {high}: the server's cap and the "
                                  "model's context)"),
        "stop": {"type": "array", "maxItems": MAX_STOP, "description": "stop at the first of these strings",
                 "items": {"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS}},
        "seed": integer(0, MAX_SEED, "random seed of a sampled request (a sampled request without one gets "
                        "one, returned in the response)"),
    }
    vocab = int(getattr(method, "vocab_size", 0)) or 2**31 - 1
    greedy = {**common, "temperature": {"const": 0, "description": "0: greedy decoding"},
              "top_k": {"const": 0, "description": "no cut when greedy"},
              "top_p": {"const": 1, "description": "no cut when greedy"}}
    sampling = {**common,
                "temperature": {"type": "number", "minimum": MIN_TEMPERATURE, "maximum": MAX_TEMPERATURE,
                                "description": "sampling temperature (leave out for greedy, unless top_k / top_p "
                                "are given: they imply sampling at temperature 1)"},
                "top_k": integer(0, vocab, "sample among the k most likely tokens (0 = all)"),
                "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1,
                          "description": "nucleus sampling: the smallest set of tokens with this much probability"}}
    if not beams:
        return [(greedy, ()), (sampling, ())]
    from ember.tasks.text2text.methods import MAX_BEAMS, MAX_LENGTH_PENALTY

    one_beam = {"num_beams": {"const": 1, "description": "1 = greedy or sampling"}}
    return [({**greedy, **one_beam}, ()), ({**sampling, **one_beam}, ()),
            ({**greedy, "num_beams": integer(2, MAX_BEAMS, "beams per input"),
              "length_penalty": {"type": "number", "minimum": -MAX_LENGTH_PENALTY, "maximum": MAX_LENGTH_PENALTY,
                                 "description": "beam score = sum log p / length^penalty"},
              "early_stopping": {"type": "boolean", "description": "stop when num_beams beams are done"}},
             ("num_beams",))]


# -- bodies per method -----------------------------------------------------------------------------


def request_body(method, limits) -> dict:
    """The JSON Schema of a method's request body under ``limits`` (module docstring)."""
    kind = type(method).__name__
    own = getattr(method, "request_schema", None) or {}
    build = BODIES.get(kind)
    if build is None:
        return own or {"type": "object", "description": inspect.getdoc(getattr(method, "parse", None)) or ""}
    forms = build(method, limits, own.get("properties", {}))
    body = {"anyOf": forms, "description": own.get("description") or (inspect.getdoc(type(method)) or kind)}
    if "example" in own:
        body["example"] = own["example"]
    return body


def _described(own: dict, name: str, schema: dict) -> dict:
    """``schema`` with the method's own description of the field, when it has one."""
    if own.get(name, {}).get("description"):
        schema = {**schema, "description": own[name]["description"]}
    return schema


def _high(own: dict, name: str) -> int:
    """The ``maximum`` a method's own schema gives a field (where its ``parse`` checks it)."""
    return int(own[name]["maximum"])


def _classify(method, limits, own):
    return text_forms(limits, {}, "text", "texts", "text", ("text_pair", "text_pairs"), other_what="second text")


def _text2text_classify(method, limits, own):
    pair = bool(getattr(getattr(method, "template", None), "is_pair", False))
    if pair:
        return text_forms(limits, {}, "text", "texts", "text", ("text_pair", "text_pairs"), other_required=True,
                          other_what="second text")
    return text_forms(limits, {}, "text", "texts", "text")


def _embed(method, limits, own):
    n = int(method.num_layers) + 1
    common = {"pooling": _described(own, "pooling", {"enum": list(own["pooling"]["enum"])}),
              "normalize": _described(own, "normalize", {"type": "boolean"})}
    layer = {"layer": _described(own, "layer", integer(-n, n - 1, ""))}
    weights = {"layer_weights": {"type": "array", "minItems": n, "maxItems": n,
                                 "items": {"type": "number", "exclusiveMinimum": -MAX_LAYER_WEIGHT,
                                           "exclusiveMaximum": MAX_LAYER_WEIGHT},
                                 "description": f"one weight per layer, embeddings first ({n}), softmax-mixed; "
                                 "instead of 'layer'"}}
    forms = []
    for extra in (layer, weights):
        for f in text_forms(limits, {**common, **extra}, "text", "texts", "text", ("text_pair", "text_pairs"),
                            other_what="second text"):
            if "layer_weights" in extra:
                f["required"].append("layer_weights")
            forms.append(f)
    return forms


def _fill_mask(method, limits, own):
    token = getattr(method, "mask_token", "[MASK]")
    field = {**text(limits, f"the text, with one or more {token} tokens"), "pattern": _escape(token)}
    top_k = _described(own, "top_k", integer(1, _high(own, "top_k"), ""))
    return [form({"text": field, "top_k": top_k}, ("text",),
                 f"the first {token} must fall within the model's first {getattr(method, 'max_length', '')} "
                 "tokens")]


def _tag(method, limits, own):
    words = {"type": "array", "minItems": 1, "maxItems": limits.max_texts,
             "description": f"sentences already split into words (1 to {limits.max_texts}; at most "
             f"{limits.max_chars * limits.max_texts} characters in all)",
             "items": {"type": "array", "minItems": 1, "items": text(limits, "a word")}}
    return text_forms(limits, {}, "text", "texts", "sentence") + [form({"words": words}, ("words",))]


def _answer(method, limits, own):
    fields = {"question": text(limits, "the question"), "context": text(limits, "the text that holds the answer")}
    if "top_k" in own:  # the encoder's extractive /answer lists n-best spans
        fields["top_k"] = _described(own, "top_k", integer(1, _high(own, "top_k"), ""))
    return [form(fields, ("question", "context"))]


def _generate(method, limits, own):
    context = int(method.max_length)
    high = min(limits.max_new_tokens, context - 1)
    return [form({key: value, **settings}, (key,))
            for key, value in (("prompt", text(limits, "one prompt")),
                               ("prompts", texts(limits, "several prompts")))
            for settings, _ in decoding(limits, method, high, beams=False)]


def _seq2seq_generate(method, limits, own):
    high = min(limits.max_new_tokens, int(method.decoder_limit))
    return [form({key: value, **settings}, (key, *needed))
            for key, value in (("text", text(limits, "one input text")),
                               ("texts", texts(limits, "several input texts")))
            for settings, needed in decoding(limits, method, high, beams=True)]


def _score(method, limits, own):
    return text_forms(limits, {}, "text", "texts", "text", ("context", "contexts"),
                      other_what="context (scored after it)")


def _seq2seq_score(method, limits, own):
    return text_forms(limits, {}, "text", "texts", "input text", ("target", "targets"), other_required=True,
                      other_what="target")


def _escape(token: str) -> str:
    import re

    return re.escape(token)


BODIES = {
    "ClassifyMethod": _classify, "Text2TextClassifyMethod": _text2text_classify, "EmbedMethod": _embed,
    "FillMaskMethod": _fill_mask, "TagMethod": _tag, "AnswerMethod": _answer, "Text2TextAnswerMethod": _answer,
    "GenerateMethod": _generate, "Seq2SeqGenerateMethod": _seq2seq_generate, "ScoreMethod": _score,
    "Seq2SeqScoreMethod": _seq2seq_score,
}


# -- answers (200) per method: the keys every answer has and their types ---------------------------

NUMBER, BOOL, STRING, INT = {"type": "number"}, {"type": "boolean"}, {"type": "string"}, {"type": "integer"}
NUMBERS = {"type": "array", "items": NUMBER}


def obj(properties: dict, required: tuple[str, ...] | None = None) -> dict:
    """An object with these keys (all required unless ``required`` says which); other keys may
    be added in later versions, so they are not refused."""
    return {"type": "object", "properties": properties, "required": list(required or properties)}


def nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


def results(item: dict, **extra) -> dict:
    """One answer per input, in order, and whether any input was cut to the model's length."""
    return obj({"results": {"type": "array", "items": item}, "truncated": BOOL, **extra})


GENERATED = obj({"text": STRING, "finish_reason": {"enum": ["length", "end_of_text", "stop"]},
                 "generated_tokens": INT, "truncated": BOOL})
SCORED = obj({"log_likelihood": NUMBER, "tokens": INT, "perplexity": NUMBER, "truncated": BOOL})
TEXT2TEXT = {"valid": {**BOOL, "description": "whether the output reads as an answer of the task"},
             "output": {**STRING, "description": "the decoded output text"}, "truncated": BOOL}
ANSWERS = {
    "ClassifyMethod": results({"anyOf": [
        obj({"label": STRING, "probabilities": {"type": "object", "additionalProperties": NUMBER},
             "truncated": BOOL}),
        obj({"score": NUMBER, "truncated": BOOL})]}),  # a regression head
    "Text2TextClassifyMethod": results(obj({"label": nullable(STRING), "score": nullable(NUMBER), **TEXT2TEXT},
                                           ("valid", "output", "truncated"))),
    "EmbedMethod": results({"anyOf": [obj({"embedding": NUMBERS, "truncated": BOOL}),
                                      obj({"tokens": {"type": "array", "items": nullable(STRING)},
                                           "embeddings": {"type": "array", "items": NUMBERS}, "truncated": BOOL})]},
                           dimension=INT),
    "FillMaskMethod": obj({"masks": {"type": "array", "items": {"type": "array", "items": obj(
        # null: an id the tokenizer has no token for (a model vocabulary padded past the tokenizer's)
        {"token": nullable(STRING), "probability": NUMBER})}}, "truncated": BOOL}),
    "TagMethod": results(obj({"words": {"type": "array", "items": STRING}, "tags": {"type": "array", "items": STRING},
                              "entities": {"type": "array", "items": obj({"type": STRING, "start": INT, "end": INT,
                                                                          "text": STRING})},
                              "truncated": BOOL})),
    "AnswerMethod": obj({"answer": STRING, "best_span": STRING, "score": nullable(NUMBER),
                         "no_answer_score": nullable(NUMBER),
                         "nbest": {"type": "array", "items": obj({"text": STRING, "score": NUMBER})},
                         "truncated": BOOL}),
    "Text2TextAnswerMethod": obj({"answer": nullable(STRING), **TEXT2TEXT}),
    "GenerateMethod": results({"allOf": [GENERATED, obj({"prompt_tokens": INT})]}, settings={"type": "object"}),
    "Seq2SeqGenerateMethod": results({"allOf": [GENERATED, obj({"input_tokens": INT})]}, settings={"type": "object"}),
    "ScoreMethod": results(SCORED),
    "Seq2SeqScoreMethod": results(SCORED),
}


def answer_body(method) -> dict:
    """The JSON Schema of a method's 200 answer ({} - any JSON - for a method not listed)."""
    return copy.deepcopy(ANSWERS.get(type(method).__name__, {}))


def route_docs(method, body: dict) -> dict:
    """``add_api_route`` keywords documenting a method: summary, description, the request body's
    contract (``request_body``) and every status the route answers."""
    doc = inspect.getdoc(type(method)) or method.name
    return {"summary": doc.splitlines()[0], "description": doc,
            "responses": {200: {"description": "the answer", "content": {"application/json": {
                "schema": answer_body(method)}}}, **error_responses(POST_ERRORS)},
            "openapi_extra": {"requestBody": {"required": True, "content": {"application/json": {
                "schema": copy.deepcopy(body)}}}}}


def integer_fields(body: dict) -> frozenset[str]:
    """The fields a body's forms type as integers."""
    names = set()
    for shape in body.get("anyOf", [body]):
        for name, field in shape.get("properties", {}).items():
            if field.get("type") == "integer" or isinstance(field.get("const"), int):
                names.add(name)
    return frozenset(names)


def prepare(data: dict, integers: frozenset[str]) -> dict:
    """A body as the contract reads it, before the method's ``parse``:

    - no field is ever null (the types say so; leaving a field out is how a client asks for its
      default, and a null reached the parsers as a value);
    - an integer field may be written 2.0: JSON has one number type, and JSON Schema counts 2.0
      as an integer, so a client that writes numbers as floats sends valid requests;
    - a seed is at most 2**53 - 1 (``MAX_SEED``), the largest integer every JSON client reads
      exactly, so the seed a response echoes reproduces the text (the Python API takes up to
      2**63 - 1)."""
    from ember.errors import RequestError

    for name, value in data.items():
        if value is None:
            raise RequestError(422, f"'{name}' is null; leave the field out to get its default")
    out = dict(data)
    for name in integers & out.keys():
        value = out[name]
        if isinstance(value, float) and value.is_integer() and abs(value) <= MAX_SEED:
            out[name] = int(value)
    seed = out.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool) and seed > MAX_SEED:
        raise RequestError(422, f"'seed' must be between 0 and {MAX_SEED} (2**53 - 1, the largest integer JSON "
                           f"clients read exactly), got {seed}")
    return out
