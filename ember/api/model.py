"""``ember.load``: a run, export or Hugging Face folder -> a model whose methods are its inference
methods (``classify``, ``embed``, ``fill_mask``, ``tag``, ``answer``, ``generate``, ``score``).

    model = ember.load("runs/sst2")               # backend="torch" | "int8" | "bf16" | "onnx" | "onnx-int8"
    model.classify("a gripping film")             # {"label": ..., "probabilities": {...}, ...}
    model.classify(["great", "awful"])            # one result per text
    model.embed(df, column="review")              # numpy array (N, H)

Every call goes through the predictor `ember serve` runs (``ember.serve.predictor``): the
method's own ``parse`` checks the options (the same messages as the HTTP 4xx), and its
``__call__`` encodes, batches and decodes, so the numbers are the server's. What is added
here is only what a list in Python needs: a list is split into requests and chunks (the
texts sorted by token length first, so each forward pass pads little; results come back in the
given order; ``embed`` of pooled vectors is ``ember.api.embed.embed_with``, the code of
`ember embed`, so the notebook and the command run the same batches at the same speed),
and the request limits of a server (texts per request, characters per text) do not apply. Methods that run their own decoding loop (``generate``, ``score``) get the
whole list in one request, in order, exactly as a POST of that list would: their sampling
and batching are theirs.

Which fields carry the inputs is the method's ``inputs`` ({single field: plural field or
None}, default {"text": "texts"}): the first is the positional argument, the others are
keywords taking a string (shared by every input) or one string per input
(``model.classify(texts, text_pair=others)``, ``model.answer(question, context=...)``); every
other keyword is a request option (``top_k=3``, ``pooling="cls"``, ``max_new_tokens=20``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ember.api.arguments import backend_arg, folder_arg
from ember.api.caller_state import caller_state_kept, keeps_caller_state
from ember.api.data import texts
from ember.api.sources import layout, run_of_hf_folder
from ember.errors import EmberError
from ember.tasks.batching import length_sorted_batches

DEFAULT_INPUTS = {"text": "texts"}
# The options ``embed_with`` takes: ``model.embed`` with these runs through it (see ``Model._call``).
_EMBED_WITH_OPTIONS = {"pooling", "layer", "normalize", "layer_weights"}
# Every inference method ember has, for the message naming what a model can do instead.
KNOWN_METHODS = ("classify", "embed", "fill_mask", "tag", "answer", "generate", "score")


def _python_limits():
    """A server's request limits, lifted: a Python caller's list is as long as it is."""
    from ember.tasks.inference.requests import Limits

    big = 10**12
    return Limits(max_body_bytes=big, max_texts=big, max_chars=big, max_new_tokens=big)


@keeps_caller_state
def load(path: str | Path, backend: str = "torch", max_length: int | None = None, batch_size: int = 32,
         threads: int = 0, *, max_batch: int | None = None) -> "Model":
    """The model in ``path``: a run folder, an `ember export` folder (which runs its own format)
    or a Hugging Face checkpoint folder (converted once into a cached run, see
    ``ember.api.sources``), on ``backend``. ``max_length`` caps tokens per input (default:
    the run's), ``batch_size`` rows per forward pass (as ``ember.embed``'s; ``max_batch=``, its old
    name, is still read, with a DeprecationWarning), ``threads`` the CPU threads this model's calls
    run on (0: torch's setting at each call). The caller's torch thread count and random state are
    as they were after every call (``ember.api.caller_state``).

    >>> model = ember.load("runs/sst2", backend="onnx")  # doctest: +SKIP
    """
    from ember.serve.predictor import load_predictor

    if max_batch is not None:
        import warnings

        warnings.warn("ember.load(max_batch=) is now batch_size=, the name ember.embed uses", DeprecationWarning,
                      stacklevel=3)
        batch_size = max_batch
    source = folder_arg(path, "path")
    from ember.tasks.multitask import is_multitask_run

    if is_multitask_run(source):  # one model per task, each loaded on its first call
        return TaskModels(source, lambda run: load(run, backend, max_length, batch_size, threads))
    kind = layout(source)
    run_dir = run_of_hf_folder(source) if kind == "hf" else source
    # An export folder runs its own format: "torch" (the default) then means "as exported".
    predictor = load_predictor(run_dir, backend_arg(backend, source), threads, max_length, batch_size)
    return Model(predictor, run_dir, source, kind, threads)


class Model:
    """A loaded model (``ember.load``); its inference methods are attributes (``model.methods``
    lists them: ``classify``, ``embed``, ``generate``, ...; see the module docstring)."""

    def __init__(self, predictor, run_dir: Path, source: Path, kind: str, threads: int = 0) -> None:
        self._predictor = predictor
        self._threads = threads
        self._encoder = None  # the tokenizer copy that sorts a list by token length (_token_lengths)
        self.path = Path(run_dir)  # the folder that runs (the cached run of an HF checkpoint)
        self.source = Path(source)  # what was passed to ember.load
        self.layout = kind  # "run", "export" or "hf"

    # -- what it is ----------------------------------------------------------------------------
    @property
    def methods(self) -> list[str]:
        """The inference methods of this model, as Python names."""
        return [name.replace("-", "_") for name in self._predictor.methods]

    @property
    def info(self) -> dict:
        """What the model is: the run's summary, its backend, max_length and methods."""
        return {**self._predictor.info.summary(), "backend": self._predictor.backend,
                "max_length": self._predictor.max_length, "methods": self.methods}

    @property
    def backend(self) -> str:
        """The backend it runs on (torch, int8, bf16, onnx, onnx-int8)."""
        return self._predictor.backend

    @property
    def tokenizer(self):
        """The run's tokenizer (a ``tokenizers.Tokenizer``)."""
        return self._predictor.tokenizer

    @property
    def predictor(self):
        """The ``ember.serve.predictor.Predictor`` underneath (the one `ember serve` would run)."""
        return self._predictor

    def __repr__(self) -> str:
        return (f"<ember model {self._predictor.info.display_name} from {self.source} "
                f"({self.backend}): {', '.join(self.methods)}>")

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self.methods))

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        endpoint = name.replace("_", "-")
        for candidate in (name, endpoint):
            if candidate in self._predictor.methods:
                return self._method(candidate)
        what = f"this model ({self._predictor.info.display_name}, {self.source})"
        if name in KNOWN_METHODS:
            raise AttributeError(f"{what} has no {name!r} method; it has: {', '.join(self.methods)}")
        raise AttributeError(f"{what} has no attribute {name!r}; its methods: {', '.join(self.methods)}")

    # -- running a method ----------------------------------------------------------------------
    def _method(self, name: str):
        """The bound inference method ``name``, documented with the request it takes (help() shows it)."""
        def method(data: Any, column: str | None = None, **options):
            with caller_state_kept():  # a seeded generate() or a model with threads= leaves the caller's state
                if self._threads:
                    torch.set_num_threads(self._threads)
                return self._call(name, data, column, **options)
        schema = getattr(self._predictor.methods[name], "request_schema", None) or {}
        method.__name__ = method.__qualname__ = name.replace("-", "_")
        method.__doc__ = (f"{method.__name__}(data, column=None, **options): {schema.get('description', '')}\n\n"
                          "data: a str, a list of str, a pandas Series, or one column of a DataFrame / Dataset; "
                          "options: the request fields of POST /" + name + " (ember serve's /docs lists them)")
        return method

    def _call(self, name: str, data: Any, column: str | None = None, **options):
        method = self._predictor.methods[name]
        fields = dict(getattr(method, "inputs", DEFAULT_INPUTS))
        first, *others = fields
        py = name.replace("-", "_")
        values, single = texts(data, column, where=f"{py}()'s input")
        companions = {}
        for field in others:
            value = options.pop(field, None)
            if value is None:
                continue
            if isinstance(value, str):
                companions[field] = [value] * len(values)
                continue
            given, _ = texts(value, None, where=f"{py}(..., {field}=...)")
            if len(given) != len(values):
                raise EmberError(f"{py}(): {len(values)} inputs but {len(given)} values of {field}=")
            companions[field] = given
        plural = fields[first] is not None and all(fields[f] is not None for f in companions)
        n = len(values)
        if name == "embed" and values and not companions and self._predictor.runner is not None \
                and set(options) <= _EMBED_WITH_OPTIONS and options.get("pooling", "mean") in ("mean", "cls"):
            from ember.api.embed import embed_with  # pooled vectors: the code `ember embed` runs

            vectors = embed_with(self._predictor, values, **options)[0]
            return vectors[0] if single else vectors
        if self._predictor.runner is None or getattr(method, "decoding_loop", False):
            # its own decoding loop (beside a graph too: a BART head run's score): the whole list as one request
            chunks = [list(range(n))]
        else:  # similar token lengths together, one forward pass per chunk (bounded memory)
            chunks = length_sorted_batches(self._token_lengths(values, list(companions.values())),
                                           self._predictor.max_batch)
        limits = _python_limits()
        results: list = [None] * n
        for chunk in chunks:
            if plural:
                body = {fields[first]: [values[i] for i in chunk],
                        **{fields[f]: [companions[f][i] for i in chunk] for f in companions}, **options}
                requests = [self._predictor.parse(name, body, limits)]
            else:
                requests = [self._predictor.parse(name, {first: values[i], **{f: companions[f][i] for f in companions},
                                                         **options}, limits) for i in chunk]
            responses = self._predictor.run(name, requests)
            for response in responses:
                if isinstance(response, Exception):
                    raise response if isinstance(response, EmberError) else EmberError(
                        f"{py}() failed: {type(response).__name__}: {response}") from response
            if plural:
                extra = {k: v for k, v in responses[0].items() if k not in ("results", "truncated")}
                per_input = [{**extra, **r} for r in responses[0]["results"]]
            else:
                per_input = responses
            for i, result in zip(chunk, per_input):
                results[i] = result
        return _as_python(results, single)

    def _token_lengths(self, values: list[str], companions: list[list[str]]) -> list[int]:
        """Tokens per input (all its fields), capped at max_length: the key that sorts a list into
        chunks. Characters, the key before, padded STS-B dev's chunks of 32 to 1.33x the tokens
        of token-sorted ones (a word's characters say little about its word pieces), which made
        ``model.embed`` 19% slower than ``ember embed`` on the same predictor (issue 46)."""
        from ember.tasks.inference.requests import TextEncoder

        if self._encoder is None:  # one private tokenizer copy, set up once
            self._encoder = TextEncoder(self._predictor.tokenizer, self._predictor.max_length)
        lengths = [0] * len(values)
        for column in (values, *companions):
            for i, (ids, _, _) in enumerate(self._encoder(column)):
                lengths[i] += len(ids)
        return [min(n, self._predictor.max_length) for n in lengths]

    # -- writing it out ------------------------------------------------------------------------
    def _source_run(self, what: str) -> Path:
        if self.layout == "export":
            raise EmberError(f"{self.source} is an `ember export` folder; {what} from the run folder it was "
                             "exported from (its export.json names it under 'source')")
        return self.path

    def to_hf(self, path: str | Path, overwrite: bool = False) -> Path:
        """Write the model as a Hugging Face folder (``from_pretrained`` loads it); atomic."""
        from ember.interop.convert import export_hf

        from ember.fileio import atomic_folder

        run_dir, out = self._source_run("convert to HF"), Path(path)
        if out.exists() and not overwrite:
            raise EmberError(f"{out} already exists; pass overwrite=True or choose another folder")
        with atomic_folder(out) as tmp:
            export_hf(run_dir, tmp)
        return out

    def export(self, path: str | Path, format: str = "onnx", verify: bool = True, overwrite: bool = False,
               **options) -> dict:
        """`ember export`: ``format`` hf, onnx, int8 or onnx-int8, verified against the original
        (``options``: verify_file, limit, batch_size, tolerance); returns the report."""
        from ember.serve.export import export_run

        known = ("verify_file", "limit", "batch_size", "tolerance")  # export_run's keywords besides these
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise EmberError(f"export() got unknown keyword(s) {', '.join(unknown)}; its options: {', '.join(known)}")
        return export_run(self._source_run("export"), format, path, verify=verify, overwrite=overwrite, **options)


class TaskModels:
    """A multi-task run (``ember.train.multitask``) loaded: ``model.classify(text, task="rte")`` runs
    that task's best weights (RUN/tasks/rte, loaded on first use); ``model.task("rte")`` is its ``Model``."""

    def __init__(self, run_dir: Path, loader) -> None:
        from ember.tasks.multitask import task_names

        self.path = self.source = Path(run_dir)
        self.tasks = task_names(run_dir)
        self._loader, self._models = loader, {}

    def task(self, name: str) -> Model:
        from ember.tasks.multitask import task_run

        folder = task_run(self.path, name)  # the message names the tasks when name is "" or unknown
        if folder.name not in self._models:
            self._models[folder.name] = self._loader(folder)
        return self._models[folder.name]

    def __repr__(self) -> str:
        return f"<ember multi-task model from {self.path}: tasks {', '.join(self.tasks)}>"

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in KNOWN_METHODS:
            raise AttributeError(f"{self!r} has no attribute {name!r}; call a method with task=, e.g. "
                                 f"classify(text, task={self.tasks[0]!r})")

        def method(data: Any, column: str | None = None, *, task: str = "", **options):
            return getattr(self.task(task), name)(data, column, **options)

        method.__name__ = method.__qualname__ = name
        method.__doc__ = f"{name}(data, column=None, task=NAME, **options): the named task's model ({', '.join(self.tasks)})"
        return method


def _as_python(results: list, single: bool):
    """Embeddings become numpy: (N, H) for pooled vectors (H,) for one text; per-token vectors
    (pooling "none") one (tokens, H) array per text. Everything else is as the server sends it."""
    if all("embedding" in r for r in results):
        vectors = np.asarray([r["embedding"] for r in results], dtype=np.float32)
        return vectors[0] if single else vectors
    if all("embeddings" in r for r in results):
        arrays = [np.asarray(r["embeddings"], dtype=np.float32) for r in results]
        return arrays[0] if single else arrays
    return results[0] if single else results
