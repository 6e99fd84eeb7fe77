"""Text generation as an inference method: ``generate`` continues prompts with a GPT-1/GPT-2 run.

``GenerateMethod`` answers a micro-batch of validated requests (``parse``). Decoding is
``ember.generate.generate_ids``: left-padded batches, positions counting real tokens only, a
key/value cache. How requests share a batch:

* greedy requests (temperature 0) with the same ``max_new_tokens`` are generated together,
  all their prompts in left-padded batches of at most ``max_batch`` rows. Greedy decoding
  of a left-padded row does not depend on the other rows (tests/test_gpt_generate.py), so
  batching changes nothing but the speed. Stop sequences are per row (``stop_check``), so
  requests with different ``stop`` lists still share a batch. Different ``max_new_tokens``
  are not mixed: every row of a batch runs until the longest is done, and a row whose own
  budget was spent would then decode past the positions its prompt was truncated for.
* a sampling request (temperature > 0) runs on its own, all its prompts in one batch with
  one generator seeded by its ``seed`` (as `ember generate` does for one batch), so the same
  request always gets the same text whatever else the server is doing.

Prompts longer than the context allows are cut from the left: the last
``context - max_new_tokens`` tokens are kept (the end of a prompt is what its continuation
follows), and the result says ``"truncated": true``. ``context`` is the run's training block
length (data.max_seq_length, as `ember fewshot`), or ``--max-length``, within the model's
positions: positions past the training blocks have untrained embeddings.
"""

from __future__ import annotations

import secrets
import threading
from typing import Sequence

from ember.errors import RequestError
from ember.generate import GenerationConfig, cut_at_stop, generate_ids
from ember.tasks.inference.requests import (Limits, body_schema, check_fields, int_field, number_field, texts_field,
                                  unicode_field)

MAX_STOP = 16  # stop sequences per request
MAX_STOP_CHARS = 200
MIN_TEMPERATURE = 1e-4  # below this, logits / T can overflow float32 (sampling NaN); use 0 for greedy
MAX_TEMPERATURE = 100.0
DEFAULT_NEW_TOKENS = 50  # as `ember generate`


# Fields that belong to the other kind of generator: a clear 422 instead of "unknown field".
TEXT2TEXT_FIELDS = ("text", "texts")
BEAM_FIELDS = ("num_beams", "length_penalty", "early_stopping")


def refuse_fields(data: dict, names, message: str) -> None:
    """A 422 naming the first of ``names`` in ``data``, with ``message`` saying what fits instead."""
    sent = [n for n in names if n in data]
    if sent:
        raise RequestError(422, f"'{sent[0]}' {message}")


def parse_decoding(data: dict, high: int, vocab_size: int, why: str = "") -> dict:
    """The decoding settings every generator takes: max_new_tokens (1..``high``, ``why`` says
    where the bound comes from), temperature, top_k, top_p, stop (list of strings), seed ->
    keyword arguments of a GenerationConfig.

    As in `ember generate`, temperature 0 is greedy, and top_k / top_p alone imply sampling at
    temperature 1; with temperature 0 they are refused rather than silently ignored. A
    sampling request without a seed gets a random one, returned in the response.
    """
    new_tokens = int_field(data, "max_new_tokens", min(DEFAULT_NEW_TOKENS, high), 1, high, why)
    top_k = int_field(data, "top_k", 0, 0, vocab_size)
    top_p = number_field(data, "top_p", 1.0)
    if not 0.0 < top_p <= 1.0:
        raise RequestError(422, f"'top_p' must be in (0, 1] (1 = no nucleus cut), got {top_p}")
    temperature = number_field(data, "temperature", None)
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
        unicode_field(s, f"stop[{i}]")
    seed = data.get("seed")
    if seed is None:
        seed = secrets.randbelow(2**31) if temperature > 0 else 0
    seed = int_field({"seed": seed}, "seed", 0, 0, 2**63 - 1)
    return {"max_new_tokens": new_tokens, "temperature": temperature, "top_k": top_k, "top_p": top_p,
            "stop": tuple(stop), "seed": seed}


def parse_generate(data: dict, limits: Limits, context: int, vocab_size: int) -> dict:
    """{"prompt": str} | {"prompts": [str]} and the decoding settings (``parse_decoding``) ->
    {"prompts", "config": GenerationConfig}.

    ``context`` is the tokens a prompt plus its continuation may span: max_new_tokens is at
    most min(limits.max_new_tokens, context - 1), so at least one prompt token fits.
    """
    refuse_fields(data, TEXT2TEXT_FIELDS, "is the input of a text-to-text (encoder-decoder, T5) model; this "
                  "causal LM continues a prompt: send 'prompt' (a string) or 'prompts' (a list)")
    refuse_fields(data, BEAM_FIELDS, "is a beam-search setting of text-to-text (T5) models; a causal LM's "
                  "/generate is greedy (temperature 0) or sampled (temperature, top_k, top_p)")
    check_fields(data, {"prompt", "prompts", "max_new_tokens", "temperature", "top_k", "top_p", "stop", "seed"})
    prompts = texts_field(data, "prompt", "prompts", limits)
    high = min(limits.max_new_tokens, context - 1)
    # name what binds: a server's cap, or the context (a Python caller has no cap of its own)
    why = (" (the server's cap)" if limits.max_new_tokens < context - 1 else
           f" (the model's context of {context} tokens must also hold at least one prompt token)")
    settings = parse_decoding(data, high, vocab_size, why)
    return {"prompts": prompts, "config": GenerationConfig(**settings)}


def finish_reason(text_stopped: bool, generated: int, max_new_tokens: int) -> str:
    """Why a continuation ended: "stop" (a stop sequence, cut off), "length" (max_new_tokens
    reached) or "end_of_text" (the model produced its end-of-text token)."""
    if text_stopped:
        return "stop"
    return "length" if generated >= max_new_tokens else "end_of_text"


class GenerateMethod:
    """``generate``: prompts -> continuations, greedy or sampled (see the module docstring).

    The hooks a generator of another kind overrides (``ember.tasks.text2text.methods``):
    ``parse``, ``_encode`` (token ids per input text), ``_job_key`` (which requests may share a
    batch), ``_decode`` (the decoding call) and ``_settings`` (echoed in the response)."""

    name = "generate"
    decoding_loop = True  # runs its model itself, not the predictor's forward (ember.api.model: one request)
    inputs = {"prompt": "prompts"}
    request_schema = body_schema(
        "Prompts -> continuations, greedy (temperature 0, the default) or sampled; a sampled request "
        "without a seed gets one, returned in the response.",
        {"prompt": {"type": "string", "description": "one prompt; send 'prompt' or 'prompts'"},
         "prompts": {"type": "array", "items": {"type": "string"}, "description": "several prompts"},
         "max_new_tokens": {"type": "integer", "minimum": 1, "description": "tokens to generate (capped by "
                            "the server's --max-new-tokens and the model's context)"},
         "temperature": {"type": "number", "description": "0 = greedy; sampling between 0.05 and 10"},
         "top_k": {"type": "integer", "minimum": 0, "description": "sample among the k most likely tokens (0 = all)"},
         "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1,
                   "description": "nucleus sampling: the smallest set of tokens with this much probability"},
         "stop": {"type": "array", "items": {"type": "string"}, "description": "stop at the first of these strings"},
         "seed": {"type": "integer", "minimum": 0, "description": "random seed of a sampled request"}},
        {"prompt": "The history of", "max_new_tokens": 20, "temperature": 0.8, "top_p": 0.9, "seed": 1})
    limits = ("max_new_tokens",)  # the request limits this method reads besides the common ones
    texts_key, tokens_key = "prompts", "prompt_tokens"  # request field, response field
    # The page at / (ember.serve.page): the prompt and the sampling settings.
    form = {"title": "Generate", "view": "generate", "fields": [
        {"name": "prompt", "label": "Prompt", "type": "textarea", "default": "The history of the city"},
        {"name": "max_new_tokens", "label": "New tokens", "type": "number", "default": 30, "min": 1},
        {"name": "temperature", "label": "Temperature (0 = greedy)", "type": "number", "default": 0.8,
         "min": 0, "step": 0.1},
        {"name": "top_k", "label": "Top k (0 = off)", "type": "number", "default": 0, "min": 0},
        {"name": "top_p", "label": "Top p (1 = off)", "type": "number", "default": 0.9, "min": 0, "max": 1,
         "step": 0.05},
        {"name": "seed", "label": "Seed (empty = random)", "type": "number", "optional": True, "min": 0}]}

    def __init__(self, ctx) -> None:
        from ember.tokenizers import end_of_text_id

        self.model, self.tokenizer = ctx.model, ctx.tokenizer
        self.max_batch, self.vocab_size = ctx.max_batch, ctx.vocab_size
        self.max_length = ctx.max_length  # prompt + new tokens must fit here
        self.eot_id = end_of_text_id(ctx.tokenizer)
        self.counters = ctx.counters  # decoding calls (batches of rows generated together)
        self.lock = threading.Lock()

    def parse(self, data: dict, limits: Limits) -> dict:
        return parse_generate(data, limits, self.max_length, self.vocab_size)

    def __call__(self, requests: Sequence[dict], forward=None) -> list:
        encoded = [self._encode(req) for req in requests]
        results: list = [None] * len(requests)
        shared: dict = {}  # job key -> indices of the requests generated together
        jobs: list[list[int]] = []
        for i, req in enumerate(requests):
            key = self._job_key(req["config"])
            if key is None:
                jobs.append([i])
            else:
                shared.setdefault(key, []).append(i)
        jobs += list(shared.values())
        for job in jobs:
            try:
                outputs = self._generate([encoded[i] for i in job], [requests[i] for i in job])
            except Exception as exc:  # one failed job answers its own requests with a 500
                outputs = [exc] * len(job)
            for i, out in zip(job, outputs):
                results[i] = out
        return results

    def _job_key(self, cfg):
        """Requests with the same key are generated together; None: alone (sampling, whose
        generator must draw the same numbers whatever else is in the batch)."""
        return cfg.max_new_tokens if cfg.greedy else None

    def _encode(self, req: dict) -> list[tuple[list[int], bool]]:
        """Per prompt: (token ids, truncated), keeping the last context - max_new_tokens tokens."""
        room = self.max_length - req["config"].max_new_tokens  # >= 1: parse_generate checks it
        out = []
        for prompt in req["prompts"]:
            ids = self.tokenizer.encode(prompt, add_special_tokens=False).ids
            out.append((ids[-room:], len(ids) > room))
        return out

    def _decode(self, inputs: list[list[int]], cfg, stop_check) -> list[list[int]]:
        return generate_ids(self.model, inputs, cfg, self.eot_id, stop_check)

    def _text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def _settings(self, c) -> dict:
        return {"max_new_tokens": c.max_new_tokens, "temperature": c.temperature, "top_k": c.top_k,
                "top_p": c.top_p, "stop": list(c.stop), "seed": None if c.greedy else c.seed}

    def _generate(self, encoded: list[list[tuple[list[int], bool]]], requests: list[dict]) -> list[dict]:
        """One job: requests sharing a config up to their stop sequences."""
        rows = [(ids, cut, req["config"].stop) for enc, req in zip(encoded, requests) for ids, cut in enc]
        cfg = requests[0]["config"]
        # A greedy job is cut into batches of max_batch rows; a sampling request is one batch so
        # its generator draws the same numbers whatever max_batch is.
        size = self.max_batch if cfg.greedy else len(rows)
        new_ids: list[list[int]] = []
        for first in range(0, len(rows), size):
            chunk = rows[first : first + size]

            def stop_check(i: int, ids: list[int], chunk=chunk) -> bool:
                stop = chunk[i][2]
                return bool(stop) and cut_at_stop(self.tokenizer.decode(ids), stop)[1]

            with self.lock:
                new_ids += self._decode([ids for ids, _, _ in chunk], cfg,
                                        stop_check if any(stop for _, _, stop in chunk) else None)
                self.counters["forwards"] += 1
        responses, k = [], 0
        for enc, req in zip(encoded, requests):
            c = req["config"]
            results = []
            for ids, cut in enc:
                new = new_ids[k]
                text, stopped = cut_at_stop(self._text(new), c.stop)
                results.append({"text": text, "finish_reason": finish_reason(stopped, len(new), c.max_new_tokens),
                                self.tokens_key: len(ids), "generated_tokens": len(new), "truncated": cut})
                k += 1
            responses.append({"results": results, "truncated": any(r["truncated"] for r in results),
                              "settings": self._settings(c)})
        return responses


class CausalLMProvider:
    """What a GPT-1/GPT-2 pre-training run serves: generate and score (log-likelihood). It runs the PyTorch model in a
    decoding loop (fp32 or int8), not an exported graph (no key/value cache in one)."""

    kind = "generate"
    task = "clm"
    graph = False

    def __init__(self, cfg, state_keys=()) -> None:
        self.display_name = f"{cfg.model.family} causal LM"

    def load_model(self, run_dir):
        from ember.generate import load_causal_lm

        return load_causal_lm(run_dir)[0]

    def inference_methods(self, ctx) -> list:
        from ember.tasks.inference.scoring import ScoreMethod

        return [GenerateMethod(ctx), ScoreMethod(ctx)]
