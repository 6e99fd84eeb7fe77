"""What /generate computes: continuations of prompts with a GPT-1/GPT-2 run (ember.generate).

``GenerationPredictor.run("generate", requests)`` answers a micro-batch of validated requests
(requests.parse_generate). Decoding is ``ember.generate.generate_ids``: left-padded batches,
positions counting real tokens only, a key/value cache. How requests share a batch:

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

import threading
from pathlib import Path
from typing import Sequence

from ember.errors import EmberError
from ember.generate import cut_at_stop, generate_ids

# Backends that can generate: the PyTorch model, fp32 or with int8 dynamic quantization of its
# Linear layers (the ONNX graph has no key/value cache and no decoding loop).
GENERATION_BACKENDS = ("torch", "int8")


def finish_reason(text_stopped: bool, generated: int, max_new_tokens: int) -> str:
    """Why a continuation ended: "stop" (a stop sequence, cut off), "length" (max_new_tokens
    reached) or "end_of_text" (the model produced its end-of-text token)."""
    if text_stopped:
        return "stop"
    return "length" if generated >= max_new_tokens else "end_of_text"


class GenerationPredictor:
    """The /generate counterpart of serve.predictor.Predictor (same attributes for the app)."""

    endpoints = ["/generate"]

    def __init__(self, model, tokenizer, info, max_length: int | None = None, max_batch: int = 32,
                 backend: str = "torch") -> None:
        from ember.tokenizers import end_of_text_id

        self.model, self.tokenizer, self.info = model, tokenizer, info
        self.backend, self.max_batch = backend, max_batch
        # Prompt + new tokens must fit here (see the module docstring).
        self.max_length = min(max_length or info.max_length, info.max_position)
        self.eot_id = end_of_text_id(tokenizer)
        self.forwards = 0  # generate_ids calls (batches of rows generated together)
        self._lock = threading.Lock()

    @property
    def vocab_size(self) -> int:
        return self.info.cfg.model.vocab_size

    def run(self, kind: str, requests: Sequence[dict]) -> list:
        if kind != "generate":
            raise ValueError(f"a causal LM answers /generate, not /{kind}")
        encoded = [self._encode(req) for req in requests]
        results: list = [None] * len(requests)
        greedy: dict[int, list[int]] = {}  # max_new_tokens -> indices of greedy requests
        jobs: list[list[int]] = []
        for i, req in enumerate(requests):
            if req["config"].greedy:
                greedy.setdefault(req["config"].max_new_tokens, []).append(i)
            else:
                jobs.append([i])
        jobs += list(greedy.values())
        for job in jobs:
            try:
                outputs = self._generate([encoded[i] for i in job], [requests[i] for i in job])
            except Exception as exc:  # one failed job answers its own requests with a 500
                outputs = [exc] * len(job)
            for i, out in zip(job, outputs):
                results[i] = out
        return results

    def _encode(self, req: dict) -> list[tuple[list[int], bool]]:
        """Per prompt: (token ids, truncated), keeping the last context - max_new_tokens tokens."""
        room = self.max_length - req["config"].max_new_tokens  # >= 1: parse_generate checks it
        out = []
        for prompt in req["prompts"]:
            ids = self.tokenizer.encode(prompt, add_special_tokens=False).ids
            out.append((ids[-room:], len(ids) > room))
        return out

    def _generate(self, encoded: list[list[tuple[list[int], bool]]], requests: list[dict]) -> list[dict]:
        """One job: requests sharing a GenerationConfig up to their stop sequences."""
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

            with self._lock:
                new_ids += generate_ids(self.model, [ids for ids, _, _ in chunk], cfg, self.eot_id,
                                        stop_check if any(stop for _, _, stop in chunk) else None)
                self.forwards += 1
        responses, k = [], 0
        for enc, req in zip(encoded, requests):
            c = req["config"]
            results = []
            for ids, cut in enc:
                new = new_ids[k]
                text, stopped = cut_at_stop(self.tokenizer.decode(new), c.stop)
                results.append({"text": text, "finish_reason": finish_reason(stopped, len(new), c.max_new_tokens),
                                "prompt_tokens": len(ids), "generated_tokens": len(new), "truncated": cut})
                k += 1
            settings = {"max_new_tokens": c.max_new_tokens, "temperature": c.temperature, "top_k": c.top_k,
                        "top_p": c.top_p, "stop": list(c.stop), "seed": None if c.greedy else c.seed}
            responses.append({"results": results, "truncated": any(r["truncated"] for r in results),
                              "settings": settings})
        return responses


def load_generation_predictor(run_dir: str | Path, backend: str = "", threads: int = 0,
                              max_length: int | None = None, max_batch: int = 32) -> GenerationPredictor:
    """A GenerationPredictor for a GPT-1/GPT-2 pre-training run, PyTorch fp32 or int8."""
    import torch

    from ember.generate import load_causal_lm
    from ember.serve.graph import describe

    backend = backend or "torch"
    if backend not in GENERATION_BACKENDS:
        raise EmberError(f"{run_dir} holds a causal LM, which `ember serve` generates with in PyTorch only: "
                         f"drop --{backend} (--int8 quantizes its Linear layers and works)")
    if threads:
        torch.set_num_threads(threads)
    info, _ = describe(run_dir)
    model, tokenizer = load_causal_lm(run_dir)
    if backend == "int8":
        from ember.serve.quantize import quantize_int8

        model = quantize_int8(model)
    return GenerationPredictor(model, tokenizer, info, max_length, max_batch, backend)
