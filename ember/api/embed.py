"""``ember.embed``: texts -> sentence vectors with any encoder run; and zero-shot similarity.

The vectors come from the run's ``embed`` inference method through the same predictor as
``ember serve``'s /embed (``ember.serve.predictor.load_predictor``), so a vector here equals
/embed's for the same text and settings, on every backend (PyTorch fp32 or int8, ONNX Runtime
fp32 or int8). Pooling, normalisation and max length default to the run's RUN/embedding.json
(a sentence-transformers checkpoint's own settings; else mean pooling, unnormalised, the run's
length); the keyword settings override them.

Texts are sorted by token length and run ``batch_size`` at a time (little padding), and the
vectors are returned in the order the texts were given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ember.api.arguments import backend_arg, folder_arg
from ember.api.caller_state import keeps_caller_state
from ember.errors import EmberError
from ember.tasks.batching import inference_progress, length_sorted_batches


def load_embedder(run: str | Path, backend: str = "torch", max_length: int | None = None, batch_size: int = 32,
                  threads: int = 0):
    """The predictor of ``run`` (a run or `ember export` folder, or a Hugging Face checkpoint folder,
    converted once into a cached run as ``ember.load`` does), checked to have an ``embed`` method."""
    from ember.api.sources import is_hf_checkpoint, run_of_hf_folder
    from ember.serve.predictor import load_predictor

    run = folder_arg(run, "run")
    if is_hf_checkpoint(run):
        run = run_of_hf_folder(run)
    backend = backend_arg(backend, run)
    if batch_size < 1:
        raise EmberError(f"batch_size must be at least 1, got {batch_size}")
    if max_length is not None and max_length < 8:
        raise EmberError(f"max_length must be at least 8 tokens, got {max_length}")
    predictor = load_predictor(run, backend, threads, max_length, batch_size)
    if "embed" not in predictor.methods:
        raise EmberError(f"{run} holds a {predictor.info.display_name}, which has no hidden states to embed with "
                         f"(it serves {', '.join(predictor.endpoints)}); embed with an encoder run")
    return predictor


def embed_with(predictor, texts: Sequence[str], pooling: str | None = None, layer: int | None = None,
               normalize: bool | None = None, progress: bool = False,
               layer_weights: Sequence[float] | None = None) -> tuple[np.ndarray, int]:
    """(vectors (N, H) float32 in the texts' order, how many texts were truncated) from a loaded predictor."""
    from ember.tasks.inference.requests import Limits

    texts = list(texts)
    if not texts:
        raise EmberError("no texts to embed")
    if pooling == "none":
        raise EmberError("pooling 'none' gives one vector per token; sentence vectors need mean or cls "
                         "(per-token vectors: POST /embed with \"pooling\": \"none\")")
    if pooling is not None and pooling not in ("mean", "cls"):
        raise EmberError(f"pooling {pooling!r}: sentence vectors are pooled by mean or cls")
    method = predictor.methods["embed"]
    options = {k: v for k, v in (("pooling", pooling), ("layer", layer), ("normalize", normalize),
                                 ("layer_weights", None if layer_weights is None else list(layer_weights)))
               if v is not None}
    # The method's own checks (pooling name, layer range, text validity) over all texts at once,
    # so an error names the text's index in the whole list.
    request = method.parse({"texts": texts, **options}, Limits(max_texts=len(texts), max_chars=10**9))
    lengths = [len(ids) for ids, _, _ in method.encoder(texts)]
    out = np.empty((len(texts), predictor.info.hidden_size), dtype=np.float32)
    truncated = 0
    with inference_progress("embedding", progress, unit="text"):
        for chunk in length_sorted_batches(lengths, predictor.max_batch):
            response = predictor.run("embed", [{**request, "texts": [texts[i] for i in chunk], "pairs": None}])[0]
            if isinstance(response, Exception):
                raise response
            for i, result in zip(chunk, response["results"]):
                out[i] = result["embedding"]
                truncated += bool(result["truncated"])
    return out, truncated


@keeps_caller_state
def embed(run: str | Path, texts, *, column: str | None = None, pooling: str | None = None, layer: int | None = None,
          layer_weights: Sequence[float] | None = None, normalize: bool | None = None, max_length: int | None = None,
          backend: str = "torch", batch_size: int = 32, threads: int = 0, progress: bool = False) -> np.ndarray:
    """Sentence vectors (N, H) float32 of ``texts``, row i for text i; one text (a str) gives its
    vector (H,), as sentence-transformers' ``encode`` does. ``texts``: a str, a list or generator
    of str, a pandas Series, or one ``column`` of a DataFrame, ``datasets.Dataset`` or dict of
    columns (ember.api.data.texts, as ``Model.embed`` reads them).

    ``pooling``: mean | cls; ``layer``: 0 = embeddings, -1 = last (default), or ``layer_weights``
    (one per layer, embeddings first: ELMo's softmax-weighted scalar mix); ``normalize``: L2;
    ``backend``: torch (default), int8, bf16, onnx, onnx-int8.

    >>> vectors = ember.embed("runs/minilm", ["a fine film", "a dull mess"])  # doctest: +SKIP
    >>> float(vectors[0] @ vectors[1])  # cosine, when the run normalises  # doctest: +SKIP
    """
    from ember.api.data import texts as read_texts

    values, single = read_texts(texts, column, where="ember.embed()'s texts")  # checked before the model loads
    predictor = load_embedder(run, backend, max_length, batch_size, threads)
    vectors = embed_with(predictor, values, pooling, layer, normalize, progress, layer_weights)[0]
    return vectors[0] if single else vectors


@keeps_caller_state
def embed_file(run: str | Path, input: str | Path, out: str | Path, *, column: str | None = None,
               pooling: str | None = None, layer: int | None = None, normalize: bool | None = None,
               max_length: int | None = None, backend: str = "torch", batch_size: int = 32, threads: int = 0,
               progress: bool = True) -> dict:
    """Embed every text of ``input`` (.txt one per line, .jsonl, .tsv; ``ember.tasks.readers.embed_input``)
    and write ``out`` (.npy, (N, H) float32, row i = the i-th text) atomically. Returns a summary."""
    import io

    from ember.fileio import atomic_write_bytes
    from ember.tasks.readers.embed_input import read_texts

    out = Path(out)
    if out.suffix != ".npy":
        raise EmberError(f"--out {out}: write the vectors to a .npy file (numpy.load reads it)")
    texts = read_texts(input, column)
    predictor = load_embedder(run, backend, max_length, batch_size, threads)
    vectors, truncated = embed_with(predictor, texts, pooling, layer, normalize, progress)
    buffer = io.BytesIO()
    np.save(buffer, vectors)
    atomic_write_bytes(out, buffer.getvalue())
    method = predictor.methods["embed"]
    return {"out": str(out), "texts": len(texts), "dimension": int(vectors.shape[1]), "truncated": truncated,
            "max_length": predictor.max_length, "backend": predictor.backend,
            "pooling": pooling or method.defaults.pooling,
            "normalize": method.defaults.normalize if normalize is None else normalize,
            "layer": -1 if layer is None else layer}


def evaluate_similarity(run: str | Path, task: str = "", split: str = "", file: str | Path | None = None, *,
                        pooling: str | None = None, layer: int | None = None, max_length: int | None = None,
                        backend: str = "torch", batch_size: int = 32, progress: bool = False) -> dict:
    """Zero-shot similarity (``ember.tasks.inference.similarity``): {"task", "split", "zero_shot", "pooling",
    "layer", "metrics": {"pearson_cosine", "spearman_cosine" (x100), "pairs"}}; STS-B dev by default."""
    from ember.tasks.inference.similarity import cosine, read_pairs, similarity_metrics, similarity_task

    file = str(file) if file is not None else None
    spec = similarity_task(task, file)
    split = split or "dev"
    pairs = read_pairs(spec, split, file)
    predictor = load_embedder(run, backend, max_length, batch_size)
    unique = sorted({t for ex in pairs for t in (ex.text_a, ex.text_b)})  # each sentence embedded once
    vectors, _ = embed_with(predictor, unique, pooling, layer, None, progress)
    row = {t: i for i, t in enumerate(unique)}
    a = vectors[[row[ex.text_a] for ex in pairs]]
    b = vectors[[row[ex.text_b] for ex in pairs]]
    gold = np.asarray([ex.label for ex in pairs], dtype=np.float64)
    return {"task": spec.display_name, "split": split if file is None else file, "zero_shot": True,
            "pooling": pooling or predictor.methods["embed"].defaults.pooling, "layer": -1 if layer is None else layer,
            "max_length": predictor.max_length, "metrics": similarity_metrics(cosine(a, b), gold)}
