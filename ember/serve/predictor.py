"""Runs a loaded model's inference methods (``ember.tasks.inference.methods``) for a micro-batch.

``Predictor.run(name, requests)`` hands a micro-batch of validated requests to the method
called ``name``; the method encodes them, calls ``forward`` once for all their rows, and
decodes one response (or a ``RequestError``) per request, so one bad request never fails the
others. ``forward`` sorts the rows by length, pads per chunk of at most ``max_batch`` rows, runs
the backend (``runners.py``) and trims each row's logits to its length along the head's
sequence axis. Which methods a model has comes from its provider (the task adapter of a
fine-tuned run, ``ember.tasks.inference.pretrained`` for a pre-training run), plus ``embed`` for every
model with an inference graph; nothing here branches on a task. A graph run whose provider has
an ``lm_model`` (BART's heads) also gets that PyTorch model for its decoding-loop methods
(``side_model``).

Inputs longer than ``max_length`` tokens are truncated, and every result says whether its
input was (``"truncated": true``).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Sequence

from ember.errors import EmberError
from ember.serve.graph import ServeInfo
from ember.serve.inputs import pad_arrays
from ember.tasks.batching import length_sorted_batches


def inference_context(info: ServeInfo, tokenizer, max_length: int | None = None, max_batch: int = 32,
                      model=None):
    from ember.tasks.inference.methods import InferenceContext

    max_length = min(max_length or info.max_length, info.max_position)
    return InferenceContext(tokenizer, max_length, info.special, info.labels, info.num_layers,
                            info.hidden_size, max_batch, model, info.cfg.model.vocab_size,
                            embedding=info.embedding)


def build_methods(info: ServeInfo, ctx) -> list:
    """The provider's methods, plus ``embed`` wherever there is a graph (hidden states)."""
    from ember.tasks.inference.embedding import EmbedMethod

    methods = list(info.provider.inference_methods(ctx))
    if info.has_graph:
        methods.append(EmbedMethod(ctx))
    return methods


class Predictor:
    """Runs a model's inference methods over batches of rows. ``pad_multiple``: batches are padded
    to widths in steps of this many tokens. ``ember serve`` asks for ``SERVED_WIDTH_STEP`` (16), so
    a long-lived server meets a bounded set of batch shapes and its memory stays flat
    (ember.serve.inputs.padded_width, docs/reliability.md); batch jobs (``ember embed``,
    ``ember.load(run)``, evaluation) keep 1, each batch as wide as its longest row: steps of 16 cost
    STS-B's short sentences 1.4x the tokens (BENCHMARKS.md, "Embeddings: the serving width step")."""

    def __init__(self, runner, info: ServeInfo, tokenizer, max_length: int | None = None,
                 max_batch: int = 32, model=None, backend: str = "", pad_multiple: int = 1) -> None:
        self.runner, self.info, self.tokenizer = runner, info, tokenizer
        self.pad_multiple = pad_multiple
        self.ctx = inference_context(info, tokenizer, max_length, max_batch, model)
        self.max_length, self.max_batch = self.ctx.max_length, max_batch
        self.methods = {m.name: m for m in build_methods(info, self.ctx)}
        self._backend = backend
        if runner is not None:  # the head's sequence axis, per row (batch axis dropped)
            seq = [axis for axis, name in runner.logits_axes.items() if name == "seq"]
            self._seq_axis = seq[0] - 1 if seq else None
        self._lock = threading.Lock()  # one forward at a time, whichever thread calls

    @property
    def backend(self) -> str:
        return self.runner.backend if self.runner is not None else self._backend or "torch"

    @property
    def forwards(self) -> int:
        """Forward passes run (or decoding loops): micro-batching shows as forwards < requests."""
        return self.ctx.counters["forwards"]

    @property
    def endpoints(self) -> list[str]:
        return [f"/{name}" for name in self.methods]

    @property
    def model(self):
        """The PyTorch model of the methods with their own decoding loop (None for graph models,
        except beside a BART head run's graph: its backbone, for /score and /generate)."""
        return self.ctx.model

    @property
    def vocab_size(self) -> int:
        return self.ctx.vocab_size

    def parse(self, name: str, data: dict, limits) -> dict:
        return self.methods[name].parse(data, limits)

    def run(self, name: str, requests: Sequence[dict]) -> list:
        return self.methods[name](requests, self.forward)

    def forward(self, rows: Sequence[tuple[list, list]], need_hidden: bool | list[int] = False) -> list:
        """Per row: (logits trimmed to the row's length, hidden (L+1, n, H) or None); ``need_hidden``
        may list layer indices, and hidden then holds those layers only, in that order."""
        if self.runner is None:
            raise EmberError(f"{self.info.display_name} has no inference graph to run rows through")
        out: list = [None] * len(rows)
        with self._lock:
            for chunk in length_sorted_batches([len(ids) for ids, _ in rows], self.max_batch):
                arrays = pad_arrays([rows[i] for i in chunk], self.info.pad_id, self.pad_multiple, self.max_length)
                logits, hidden = self.runner(arrays, need_hidden)
                self.ctx.counters["forwards"] += 1
                for j, i in enumerate(chunk):
                    n = len(rows[i][0])
                    row = logits[j]
                    if self._seq_axis is not None:
                        row = row.take(range(n), axis=self._seq_axis)
                    out[i] = (row, None if hidden is None else hidden[:, j, :n])
        return out


def side_model(info: ServeInfo, runner, path: str | Path):
    """The PyTorch model of the methods a graph run serves with their own loop beside the graph
    (a BART head run's /score and /generate: its backbone is a whole seq2seq LM), from the
    provider's ``lm_model(module, run_dir)``; the graph's own module is handed over when the
    backend runs one in PyTorch (torch, int8, bf16), so the weights are not held twice. None when
    the provider has no such model."""
    lm_model = getattr(info.provider, "lm_model", None)
    if lm_model is None:
        return None
    graph = getattr(runner, "graph", None)  # a TorchRunner's InferenceGraph; ONNX has none
    return lm_model(graph.module if graph is not None else None, Path(path))


def load_predictor(path: str | Path, backend: str = "", threads: int = 0, max_length: int | None = None,
                   max_batch: int = 32, pad_multiple: int = 1) -> Predictor:
    """A Predictor for a run or export folder: a graph on ``backend`` (torch, int8, bf16, onnx,
    onnx-int8), or, for a model served by its own decoding loop, the PyTorch model (fp32 or int8).
    ``pad_multiple``: see ``Predictor`` (``ember serve`` passes ``SERVED_WIDTH_STEP``)."""
    from ember.serve.runners import load_runner

    from ember.serve.graph import describe
    from ember.tasks.multitask import is_multitask_run

    if is_multitask_run(path):  # one predictor per task, the request's "task" picks (ember.serve.multitask)
        from ember.serve.multitask import load_multitask_predictor

        return load_multitask_predictor(Path(path), lambda run: load_predictor(run, backend, threads, max_length,
                                                                               max_batch, pad_multiple))
    info, tokenizer = describe(path)
    if info.has_graph:
        runner, info, tokenizer = load_runner(path, backend, threads)
        return Predictor(runner, info, tokenizer, max_length, max_batch, model=side_model(info, runner, path),
                         pad_multiple=pad_multiple)
    import torch

    backend = backend or "torch"
    if backend not in ("torch", "int8"):
        raise EmberError(f"{path} holds a {info.display_name}, which `ember serve` runs in PyTorch only: "
                         f"drop --{backend} (--int8 quantizes its Linear layers and works)")
    if threads:
        torch.set_num_threads(threads)
    model = info.provider.load_model(path)
    if backend == "int8":
        from ember.serve.quantize import quantize_int8

        model = quantize_int8(model)
    return Predictor(None, info, tokenizer, max_length, max_batch, model=model, backend=backend,
                     pad_multiple=pad_multiple)

