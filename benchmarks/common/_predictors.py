"""Length-sorted predictors over a fixed list of features, for one fine-tuned classifier, on
each CPU inference path ember ships: PyTorch fp32, PyTorch dynamic int8, ONNX Runtime fp32
and ONNX Runtime dynamic int8. Shared by ``inference.py`` and ``distill_table.py``.

Every predictor is a zero-argument callable returning the logits (N, labels) in input order.
Batches are formed once, up front, by length (as ``SequenceClassifier.predict`` does), so a
timed call measures the model, not tokenization or collation, and every path sees exactly
the same padded batches.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import torch

from _bench import clock
from ember.tasks.featurize import collate

Predictor = Callable[[], np.ndarray]


def sorted_predictor(logits_of, features: list[dict], pad_id: int, size: int) -> Predictor:
    """Like SequenceClassifier.predict: batches formed by length, logits back in input order."""
    order = np.argsort([len(f["input_ids"]) for f in features], kind="stable")
    batches = [(order[i:i + size], collate([{**features[j], "label": None} for j in order[i:i + size]], pad_id))
               for i in range(0, len(order), size)]

    def run():
        out = None
        for idx, batch in batches:
            logits = logits_of(batch)
            out = np.zeros((len(features), logits.shape[-1]), np.float32) if out is None else out
            out[idx] = logits
        return out
    return run


def torch_predictors(module, features: list[dict], pad_id: int, size: int) -> dict[str, Predictor]:
    """PyTorch fp32 and dynamic int8 (the quantization `ember export --format int8` saves)."""
    from ember.serve.quantize import quantize_int8

    def logits_of(m):
        return lambda batch: m.logits(batch).float().numpy()
    return {"pytorch fp32": sorted_predictor(logits_of(module), features, pad_id, size),
            "pytorch int8": sorted_predictor(logits_of(quantize_int8(module)), features, pad_id, size)}


def onnx_available() -> bool:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def onnx_predictors(run: Path, features: list[dict], pad_id: int, size: int, work: Path) -> dict[str, Predictor]:
    """``run`` exported by ember (`ember export --format onnx` / `onnx-int8`) into ``work``, run
    by ONNX Runtime; empty (with a note) when onnx/onnxruntime are not installed."""
    if not onnx_available():
        print("onnx/onnxruntime not installed: ONNX contenders skipped (pip install 'ember[serve]')")
        return {}
    from ember.serve.export import export_run
    from ember.serve.onnx_export import INPUT_NAMES, ONNX_FILE, onnx_session

    predictors = {}
    for fmt, name in (("onnx", "onnx fp32"), ("onnx-int8", "onnx int8")):
        # Not verified here: callers score every path on the whole dev set themselves.
        export_run(run, fmt, work / fmt, verify=False, overwrite=True)
        # intra-op threads as torch uses (1 under --cpu-time: ONNX Runtime then runs on this thread)
        session = onnx_session(work / fmt / ONNX_FILE, threads=torch.get_num_threads())

        def logits_of(batch, s=session):
            return s.run(["logits"], {k: batch[k].numpy() for k in INPUT_NAMES})[0]
        predictors[name] = sorted_predictor(logits_of, features, pad_id, size)
    return predictors


def rate_keeping_logits(predict: Predictor, count: int, logits: dict, key: str) -> Callable[[], float]:
    """A contender for ``_bench.alternate``: one timed call, in items/s; the logits are kept in
    ``logits[key]`` so accuracy comes from the very calls that were timed."""
    def run():
        with torch.inference_mode():
            start = clock()
            logits[key] = predict()
            return count / (clock() - start)
    return run
