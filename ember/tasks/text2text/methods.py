"""What an encoder-decoder (T5) answers at inference: ``generate`` for any T5 run, and ``classify`` /
``answer`` for a run fine-tuned text to text (ember.tasks.text2text.task).

* ``generate`` (``Seq2SeqGenerateMethod``): input texts -> output texts, the GPT path's request
  and limits (``ember.tasks.inference.generation``: max_new_tokens, temperature, top_k, top_p, stop,
  seed; the same 4xx errors) with the input as "text"/"texts" and beam search on top
  (num_beams, length_penalty, early_stopping; Raffel et al. 2020 §3.7 use 4 beams, penalty
  0.6). Inputs are encoded with the tokenizer's template (T5's appends </s>) and cut at the
  served length (the end goes; the response says "truncated"); the output equals
  ``ember.seq2seq_generation.seq2seq_generate_text`` of the same model. Requests with the same
  deterministic settings (greedy or beam, same max_new_tokens, beams, penalty, early stop)
  are decoded together; a sampling request alone, with its seed. max_new_tokens is capped by
  the server's limit and the decoder's limit (model.max_position).
* ``classify`` (``Text2TextClassifyMethod``): texts (and pairs) in the task's template, the run's
  decoding as in evaluation (greedy unless ``task.num_beams`` > 1), and per input the label (or STS-B score) the output parses to,
  ``valid`` (false when the output is no label; the label is then null) and the raw output.
* ``answer`` (``Text2TextAnswerMethod``): a SQuAD question and context -> the answer text
  ("" = no answer, SQuAD 2.0), ``valid`` (the output is a run of the context's words) and the
  raw output.

A pre-training T5 run (any of T5's objectives) serves ``generate`` through ``Seq2SeqLMProvider``
(``ember.tasks.inference.pretrained``), and a BART head run ``generate`` and ``score`` on its backbone
beside its head's graph (``seq2seq_lm_methods``, ``ember.tasks.families.bart``). All run the PyTorch model (fp32, or int8 with `ember serve
--int8`) in a decoding loop with both caches; none has an exported graph (``NO_GRAPH_REASON``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ember.errors import RequestError
from ember.tasks.inference.generation import GenerateMethod, parse_decoding, refuse_fields
from ember.tasks.inference.requests import (
    Limits,
    check_fields,
    int_field,
    number_field,
    parse_texts,
    text_field,
    texts_field,
)
from ember.tasks.text2text.encoding import NO_GRAPH_REASON, batched_decode

MAX_BEAMS = 8  # beams per input of one request (each beam is a decoder row)
MAX_LENGTH_PENALTY = 10.0


class Seq2SeqGenerateMethod(GenerateMethod):
    """``generate`` for an encoder-decoder: input texts -> output texts (module docstring)."""

    texts_key, tokens_key = "texts", "input_tokens"
    inputs = {"text": "texts"}
    # The page at / (ember.serve.page): the input text and the decoding settings.
    form = {"title": "Generate", "view": "generate", "fields": [
        {"name": "text", "label": "Input", "type": "textarea", "default": "sst2 sentence: a gem of a film"},
        {"name": "max_new_tokens", "label": "New tokens", "type": "number", "default": 20, "min": 1},
        {"name": "num_beams", "label": "Beams (1 = greedy)", "type": "number", "default": 1, "min": 1},
        {"name": "length_penalty", "label": "Length penalty", "type": "number", "default": 1.0, "step": 0.1}]}

    def __init__(self, ctx) -> None:
        super().__init__(ctx)  # eot_id: T5's </s>; max_length: the served input length
        self.encoder = ctx.encoder()
        self.decoder_limit = ctx.model.config.max_position

    def parse(self, data: dict, limits: Limits) -> dict:
        """{"text": str} | {"texts": [str]}, the GPT path's decoding settings, and num_beams (1 =
        greedy or sampling), length_penalty and early_stopping (beam search only)."""
        from ember.seq2seq_generation import Seq2SeqGenerationConfig

        refuse_fields(data, ("prompt", "prompts"), "is for causal LMs (GPT), which continue a prompt; this "
                      "text-to-text (encoder-decoder, T5) model reads an input text: send 'text' (a string) "
                      "or 'texts' (a list)")
        check_fields(data, {"text", "texts", "max_new_tokens", "num_beams", "length_penalty", "early_stopping",
                            "temperature", "top_k", "top_p", "stop", "seed"})
        texts = texts_field(data, "text", "texts", limits)
        high = min(limits.max_new_tokens, self.decoder_limit)
        why = (" (the server's cap)" if limits.max_new_tokens < self.decoder_limit else
               f" (the decoder's limit, model.max_position, is {self.decoder_limit})")
        settings = parse_decoding(data, high, self.vocab_size, why)
        beams = int_field(data, "num_beams", 1, 1, MAX_BEAMS)
        penalty = number_field(data, "length_penalty", 1.0)
        if abs(penalty) > MAX_LENGTH_PENALTY:
            raise RequestError(422, f"'length_penalty' must be between -{MAX_LENGTH_PENALTY:g} and "
                               f"{MAX_LENGTH_PENALTY:g} (beam score = sum log p / length^penalty), got {penalty}")
        early = data.get("early_stopping", False)
        if not isinstance(early, bool):
            raise RequestError(422, f"'early_stopping' must be true or false, not {type(early).__name__}")
        if beams == 1 and ("length_penalty" in data or "early_stopping" in data):
            raise RequestError(422, "'length_penalty' and 'early_stopping' only apply to beam search: set "
                               "'num_beams' above 1, or drop them")
        if beams > 1 and settings["temperature"] > 0:
            raise RequestError(422, "beam search is deterministic: with 'num_beams' above 1 drop 'temperature', "
                               "'top_k' and 'top_p' (or set 'num_beams' to 1 to sample)")
        config = Seq2SeqGenerationConfig(**settings, num_beams=beams, length_penalty=penalty, early_stopping=early)
        return {"texts": texts, "config": config}

    def _job_key(self, cfg):
        return (cfg.max_new_tokens, cfg.num_beams, cfg.length_penalty, cfg.early_stopping) if cfg.greedy else None

    def _encode(self, req: dict) -> list[tuple[list[int], bool]]:
        """Per input: (token ids with the template's </s>, truncated), cut at the served length."""
        return [(ids, cut) for ids, _, cut in self.encoder(req["texts"])]

    def _decode(self, inputs: list[list[int]], cfg, stop_check) -> list[list[int]]:
        from ember.seq2seq_generation import seq2seq_generate_ids

        return seq2seq_generate_ids(self.model, inputs, cfg, self.eot_id, stop_check if cfg.num_beams == 1 else None)

    def _text(self, ids: list[int]) -> str:
        from ember.tokenizers.sentinels import decode_with_sentinels

        return decode_with_sentinels(self.tokenizer, ids)  # a span-corruption run's answer is its sentinels

    def _settings(self, c) -> dict:
        return {**super()._settings(c), "num_beams": c.num_beams, "length_penalty": c.length_penalty,
                "early_stopping": c.early_stopping}


class Text2TextGenerateMethod(Seq2SeqGenerateMethod):
    """``generate`` for your own text2text task fine-tuned with a prefix (a mixture's: "summ: <input>"):
    each input text is written as training wrote it (the prefix, never cut, then the text, cut at the
    served length), so a caller sends the text alone, as to any other task of the run."""

    def __init__(self, adapter, ctx) -> None:
        super().__init__(ctx)
        self.task_encoder = adapter.encoder(ctx.tokenizer, ctx.max_length)
        fields = [dict(f, default="") if f["name"] == "text" else f for f in self.form["fields"]]
        self.form = {**self.form, "fields": fields}

    def _encode(self, req: dict) -> list[tuple[list[int], bool]]:
        from ember.tasks.text2text.custom import TextPair

        features, _ = self.task_encoder([TextPair(str(i), text, None) for i, text in enumerate(req["texts"])])
        return [(f["input_ids"], f["truncated"]) for f in features]


class _Text2TextTaskMethod:
    """Shared by classify and answer: the fine-tuned task's encoding, its decoding, parsing."""

    def __init__(self, adapter, ctx) -> None:
        self.adapter, self.template, self.model = adapter, adapter.template, ctx.model
        self.encoder = adapter.encoder(ctx.tokenizer, ctx.max_length)  # checks the label words
        self.budget = adapter.decode_budget(self.encoder)
        self.max_batch, self.counters = ctx.max_batch, ctx.counters
        self.lock = threading.Lock()

    def decode(self, examples) -> list[tuple[dict, str]]:
        """(feature, output text) per example, decoded as in evaluation (greedy unless the run set
        task.num_beams), in batches of at most max_batch inputs."""
        features, _ = self.encoder(examples)
        with self.lock:
            ids = batched_decode(self.model, [f["input_ids"] for f in features], self.budget, self.encoder.eos_id,
                                 self.max_batch, **self.adapter.decoding)
            self.counters["forwards"] += -(-len(features) // self.max_batch)  # decoding loops run
        return [(f, self.encoder.tokenizer.decode(x)) for f, x in zip(features, ids)]


class Text2TextClassifyMethod(_Text2TextTaskMethod):
    """``classify``: texts (or pairs) -> label (or score), valid, raw output (module docstring)."""

    name = "classify"
    inputs = {"text": "texts", "text_pair": "text_pairs"}  # ember.load(run).classify(text, text_pair=...)

    def parse(self, data: dict, limits: Limits) -> dict:
        request = parse_texts(data, limits)
        what = self.adapter.display_name
        if self.template.is_pair and request["pairs"] is None:
            raise RequestError(422, f"{what} classifies sentence pairs: send 'text_pair' with 'text' (or "
                               "'text_pairs' with 'texts')")
        if not self.template.is_pair and request["pairs"] is not None:
            raise RequestError(422, f"{what} classifies single sentences: drop 'text_pair' / 'text_pairs'")
        return request

    def __call__(self, requests: Sequence[dict], forward=None) -> list[dict]:
        from ember.tasks.readers.glue import Example

        examples, spans = [], []
        for req in requests:
            pairs = req["pairs"] or [None] * len(req["texts"])
            spans.append(slice(len(examples), len(examples) + len(pairs)))
            examples += [Example(str(len(examples) + i), a, b, None) for i, (a, b) in enumerate(zip(req["texts"], pairs))]
        results = []
        for feature, output in self.decode(examples):
            parsed = self.template.parse(output)
            if self.template.is_regression:
                answer = {"score": parsed.value}
            else:
                answer = {"label": self.template.words[parsed.value] if parsed.valid else None}
            results.append({**answer, "valid": parsed.valid, "output": output, "truncated": feature["truncated"]})
        return [{"results": results[s], "truncated": any(r["truncated"] for r in results[s])} for s in spans]


class Text2TextAnswerMethod(_Text2TextTaskMethod):
    """``answer``: {"question", "context"} -> answer ("" = no answer), valid, raw output."""

    name = "answer"

    def parse(self, data: dict, limits: Limits) -> dict:
        check_fields(data, {"question", "context"})
        for name in ("question", "context"):
            if name not in data:
                raise RequestError(422, f"'{name}' is required")
        return {name: text_field(data[name], name, limits) for name in ("question", "context")}

    def __call__(self, requests: Sequence[dict], forward=None) -> list[dict]:
        from ember.tasks.qa.squad import SquadExample

        examples = [SquadExample(str(i), "", r["question"], r["context"], (), False) for i, r in enumerate(requests)]
        responses = []
        for ex, (feature, output) in zip(examples, self.decode(examples)):
            parsed = self.template.parse(output, ex)
            responses.append({"answer": parsed.value if parsed.valid else None, "valid": parsed.valid,
                              "output": output, "truncated": feature["truncated"]})
        return responses


class Seq2SeqLMProvider:
    """What a T5 pre-training run serves: generate (PyTorch fp32 or int8, in a decoding loop)."""

    kind = "generate"
    graph = False
    no_graph_reason = NO_GRAPH_REASON

    def __init__(self, cfg, state_keys=()) -> None:
        self.task = cfg.objective
        self.display_name = f"{cfg.model.family} {cfg.objective} model"

    def load_model(self, run_dir):
        return load_model(run_dir)  # the module's function (a method's body does not see class names)

    def inference_methods(self, ctx) -> list:
        return seq2seq_lm_methods(ctx)


def seq2seq_lm_methods(ctx) -> list:
    """``generate`` and ``score`` of the encoder-decoder ``ctx.model``: a pre-training run's, or
    the backbone of a BART head run (ember.tasks.families.bart)."""
    from ember.tasks.inference.scoring import Seq2SeqScoreMethod

    return [Seq2SeqGenerateMethod(ctx), Seq2SeqScoreMethod(ctx)]


def load_model(run_dir):
    """The encoder-decoder of a T5 run folder (pre-trained or fine-tuned), in eval mode."""
    from ember.seq2seq_generation import load_seq2seq_lm

    return load_seq2seq_lm(run_dir)[0]


__all__ = ["Seq2SeqGenerateMethod", "Seq2SeqLMProvider", "seq2seq_lm_methods", "Text2TextAnswerMethod",
           "Text2TextClassifyMethod", "Text2TextGenerateMethod", "load_model"]
