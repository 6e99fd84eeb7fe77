"""ONNX export of an ``InferenceGraph`` and ONNX Runtime int8 dynamic quantization.

Export uses the TorchScript-based exporter (``torch.onnx.export(dynamo=False)``): for these
plain encoder graphs it produces the same graph as the torch.export-based one in ~0.5 s
instead of ~15 s, and its ``dynamic_axes`` give every input and output a symbolic batch
and sequence axis, so one file takes any (B, T) up to the model's max position. The
sequence-length check in the embeddings is a Python ``if`` and is not part of the graph:
the caller (server, verifier) keeps inputs within ``max_position``.

Inputs: input_ids, attention_mask, token_type_ids, each (batch, seq) int64.
Outputs: logits (axes as the inference model's ``logits_axes`` name them, see graph.py) and
hidden_states (L + 1, batch, seq, H).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from ember.errors import EmberError

ONNX_FILE = "model.onnx"
INPUT_NAMES = ["input_ids", "attention_mask", "token_type_ids"]
OPSET = 17


def _require(module: str, extra: str = "serve"):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise EmberError(f"{module} is not installed; install the optional extra: "
                         f"pip install 'ember[{extra}]'") from None


def export_onnx(graph: torch.nn.Module, path: Path, example: dict[str, torch.Tensor], opset: int = OPSET) -> Path:
    """Write ``graph`` (an InferenceGraph in eval mode) to ``path``; ``example`` are real inputs."""
    _require("onnx")
    refusal = getattr(graph.module, "onnx_refusal", "")  # a model ONNX cannot express says why
    if refusal:
        raise EmberError(refusal)
    axes = {name: {0: "batch", 1: "seq"} for name in INPUT_NAMES}
    axes.update({"logits": graph.logits_axes, "hidden_states": {1: "batch", 2: "seq"}})
    args = tuple(example[name] for name in INPUT_NAMES)
    with warnings.catch_warnings():  # tracer notes about the Python-level length check
        warnings.simplefilter("ignore")
        with torch.no_grad():
            torch.onnx.export(graph.eval(), args, str(path), input_names=INPUT_NAMES,
                              output_names=["logits", "hidden_states"], dynamic_axes=axes,
                              opset_version=opset, dynamo=False)
    import onnx

    onnx.checker.check_model(str(path))
    return Path(path)


def quantize_onnx(src: Path, dst: Path) -> Path:
    """ONNX Runtime dynamic quantization: int8 weights for MatMul/Gemm, activations per batch."""
    _require("onnxruntime")
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # Shape inference/optimisation first, as ONNX Runtime recommends for transformer graphs.
    try:
        from onnxruntime.quantization.shape_inference import quant_pre_process

        pre = Path(dst).with_name(".pre-" + Path(dst).name)
        quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
        src_for_quant = pre
    except Exception:  # pre-processing is an optimisation only; quantize the graph as it is
        src_for_quant, pre = Path(src), None
    quantize_dynamic(str(src_for_quant), str(dst), weight_type=QuantType.QInt8,
                     op_types_to_quantize=["MatMul", "Gemm"])
    if pre is not None:
        pre.unlink(missing_ok=True)
    return Path(dst)


def onnx_session(path: Path, threads: int = 0):
    """An ONNX Runtime CPU session; ``threads`` 0 = ONNX Runtime's default (all cores)."""
    ort = _require("onnxruntime")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise EmberError(f"{path}: ONNX Runtime cannot load it ({exc})") from None
