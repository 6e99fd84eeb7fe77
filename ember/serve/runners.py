"""One calling convention over every way of running a model:

    runner(arrays, need_hidden) -> (logits, hidden_states or None)   (numpy in, numpy out)

``need_hidden``: False, True (every layer, (L + 1, B, T, H)) or a list of layer indices (those, stacked).

``arrays`` holds input_ids / attention_mask / token_type_ids, each (B, T) int64; the
outputs are laid out as in ``graph.py``, and ``runner.logits_axes`` names the logits' batch
and sequence axes (from the inference model, or read back from an ONNX file). Backends: PyTorch fp32 ("torch"), PyTorch int8
dynamic ("int8"), PyTorch with bf16 weights and activations ("bf16": fast where the CPU has AMX
or on a GPU, ~100x slower than fp32 on other CPUs), ONNX Runtime ("onnx", "onnx-int8"), and a
transformers model loaded from an HF export ("hf", used only to verify that export).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from ember.errors import EmberError
from ember.serve import BACKENDS
from ember.serve.graph import (InferenceGraph, ServeInfo, build_module, describe, hidden_layers, load_module,
                               read_manifest)


class TorchRunner:
    def __init__(self, graph: InferenceGraph, backend: str = "torch") -> None:
        self.graph = graph.eval()
        self.backend = backend
        self.logits_axes = graph.logits_axes
        self.calls = 0  # forward passes run (tests check that micro-batching batches)

    def __call__(self, arrays: dict[str, np.ndarray], need_hidden: bool | list[int] = False):
        self.calls += 1
        with torch.inference_mode():
            t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}
            logits, hidden = self.graph(t["input_ids"], t["attention_mask"], t["token_type_ids"], need_hidden)
            return logits.float().numpy(), None if hidden is None else hidden.float().numpy()


class OnnxRunner:
    def __init__(self, session, backend: str = "onnx") -> None:
        self.session = session
        self.backend = backend
        # The dynamic axes the export named ("batch", "seq"), read back from the file itself.
        shape = next(o.shape for o in session.get_outputs() if o.name == "logits")
        self.logits_axes = {i: d for i, d in enumerate(shape) if isinstance(d, str)}
        self.calls = 0

    def __call__(self, arrays: dict[str, np.ndarray], need_hidden: bool | list[int] = False):
        self.calls += 1
        names = ["logits", "hidden_states"] if need_hidden else ["logits"]
        # A graph whose model ignores an input (XLM has no segment embeddings) was exported
        # without it; feed the inputs the file declares.
        declared = {i.name for i in self.session.get_inputs()}
        feeds = {k: np.ascontiguousarray(arrays[k], dtype=np.int64)
                 for k in ("input_ids", "attention_mask", "token_type_ids") if k in declared}
        out = self.session.run(names, feeds)
        if not need_hidden:
            return out[0], None
        return out[0], (np.stack(hidden_layers(out[1], need_hidden)) if isinstance(need_hidden, list) else out[1])


class HFRunner:
    """A transformers model from an HF export, mapped to the graph's logits layout (a QA model's
    start/end logits stacked as (B, 2, T), as ember's span head gives them). An export whose
    tokenizer pads on the left (XLNet: its summary reads the last position) is fed the rows
    padded on the left, as transformers' users feed it, and its per-token outputs are moved
    back to the rows' right-padded layout. ``extra_inputs(input_ids) -> dict`` gives the model
    inputs the run's provider adds to every row (a fine-tuned XLM's ``langs``: the task language)."""

    def __init__(self, model, left_padding: bool = False, extra_inputs=None, input_names=None) -> None:
        self.model = model.eval()
        self.backend = "hf"
        self.calls = 0
        self.left_padding = left_padding
        self.extra_inputs = extra_inputs
        self.input_names = input_names  # what the exported tokenizer gives the model (None: all)

    def __call__(self, arrays: dict[str, np.ndarray], need_hidden: bool | list[int] = False):
        self.calls += 1
        t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}
        pads = (t["attention_mask"].shape[1] - t["attention_mask"].sum(1)).tolist() if self.left_padding else None
        if pads is not None:
            t = {k: _shift(v, pads, 1) for k, v in t.items()}
        if getattr(self.model.config, "type_vocab_size", 2) in (0, 1):
            t.pop("token_type_ids")  # RoBERTa-style / DistilBERT: no segment input
        if self.model.config.model_type == "distilbert":
            t.pop("token_type_ids", None)
        if self.input_names is not None:  # e.g. no token_type_ids for XLM, which would embed them as words
            t = {k: v for k, v in t.items() if k in self.input_names}
        if self.extra_inputs is not None:
            t.update(self.extra_inputs(t["input_ids"]))
        with torch.inference_mode():
            out = self.model(**t, output_hidden_states=bool(need_hidden))
        back = (lambda x, axis: _shift(x, [-p for p in pads], axis)) if pads is not None else (lambda x, axis: x)
        if hasattr(out, "start_logits"):
            pad = torch.from_numpy(np.ascontiguousarray(arrays["attention_mask"])) == 0
            start, end = back(out.start_logits, 1), back(out.end_logits, 1)
            logits = torch.stack([start.masked_fill(pad, -1e4), end.masked_fill(pad, -1e4)], 1)
        else:  # *ForPreTraining models name their MLM logits prediction_logits; a model without a head
            # (BertModel, an imported sentence encoder) gives its last hidden states, as ember's EmbeddingModel
            logits = next(getattr(out, name) for name in ("logits", "prediction_logits", "last_hidden_state")
                          if getattr(out, name, None) is not None)
            logits = back(logits, 1) if logits.dim() == 3 else logits  # per token: (B, T, C)
        hidden = back(torch.stack(hidden_layers(out.hidden_states, need_hidden)), 2).numpy() if need_hidden else None
        return logits.float().numpy(), hidden


def _shift(x: torch.Tensor, shifts: list[int], axis: int) -> torch.Tensor:
    """Roll row b of ``x`` (batch axis 0, or 1 for stacked hidden states) by ``shifts[b]`` along ``axis``."""
    batch_axis = 0 if axis == 1 else 1
    rows = [torch.roll(row, s, dims=axis - 1) for row, s in zip(x.unbind(batch_axis), shifts)]
    return torch.stack(rows, batch_axis)


def load_hf_runner(hf_dir: Path, extra_inputs=None) -> HFRunner:
    try:
        import transformers
    except ImportError:
        raise EmberError("verifying an HF export needs transformers (pip install transformers), "
                         "or pass --no-verify") from None
    config = json.loads((Path(hf_dir) / "config.json").read_text())
    arch = (config.get("architectures") or [""])[0]
    cls = getattr(transformers, arch, None)
    if cls is None:
        raise EmberError(f"{hf_dir}/config.json names architecture {arch!r}, unknown to transformers")
    tokenizer_config = Path(hf_dir) / "tokenizer_config.json"
    settings = json.loads(tokenizer_config.read_text()) if tokenizer_config.is_file() else {}
    return HFRunner(cls.from_pretrained(str(hf_dir)), left_padding=settings.get("padding_side") == "left",
                    extra_inputs=extra_inputs, input_names=settings.get("model_input_names"))


def example_inputs(info: ServeInfo) -> dict[str, torch.Tensor]:
    """A small real-looking batch for tracing (B=2, T=8): the shapes are symbolic anyway."""
    ids = torch.full((2, 8), info.special["unk"], dtype=torch.long)
    ids[:, 0], ids[:, -1] = info.special["cls"], info.special["sep"]
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def warn_if_slow_bf16() -> None:
    from ember.nn.onednn import cpu_has_fast_bf16

    if not cpu_has_fast_bf16():
        print("warning: --bf16 on a CPU without AMX: bf16 matrix products have no fast kernel here "
              "and run far slower than fp32 (~100x on AMD EPYC); drop --bf16 (or use --int8) on this machine",
              file=sys.stderr)


def load_runner(path: str | Path, backend: str = "", threads: int = 0):
    """(runner, info, tokenizer) for a run folder or an `ember export` folder.

    A run folder runs in PyTorch fp32 by default; ``backend`` int8 quantizes it in memory, bf16
    casts it (weights and activations; outputs come back as fp32), onnx / onnx-int8 export it to
    a temporary file first. An export folder runs its format
    (``backend`` must then match or be empty).
    """
    from ember.serve.onnx_export import ONNX_FILE, export_onnx, onnx_session, quantize_onnx
    from ember.serve.quantize import INT8_FILE, load_int8, quantize_int8

    path = Path(path)
    if backend and backend not in BACKENDS:
        raise EmberError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if threads:
        torch.set_num_threads(threads)
    manifest = read_manifest(path)
    if manifest is not None:
        fmt = manifest.get("format")
        if fmt == "hf" or fmt not in BACKENDS:
            raise EmberError(f"{path} holds a {fmt!r} export; serve the original run folder instead")
        if backend and backend != fmt:
            raise EmberError(f"{path} holds a {fmt!r} export, not {backend!r}; drop the flag or serve "
                             "the original run folder")
        info, tokenizer = describe(path)
        if fmt == "int8":
            module = load_int8(build_module(info), path / INT8_FILE)
            return TorchRunner(InferenceGraph(module), "int8"), info, tokenizer
        return OnnxRunner(onnx_session(path / ONNX_FILE, threads), fmt), info, tokenizer

    info, tokenizer = describe(path)
    module = load_module(path, info)
    backend = backend or "torch"
    if backend == "torch":
        return TorchRunner(InferenceGraph(module)), info, tokenizer
    if backend == "int8":
        return TorchRunner(InferenceGraph(quantize_int8(module)), "int8"), info, tokenizer
    if backend == "bf16":
        warn_if_slow_bf16()
        runner = TorchRunner(InferenceGraph(module).to(torch.bfloat16), "bf16")
        try:  # a family with an fp32-only step says so now, not at the first request
            runner({k: v.numpy() for k, v in example_inputs(info).items()}, True)
        except RuntimeError as exc:
            raise EmberError(f"{path}: this {info.display_name} does not run in bf16 ({exc}); "
                             "drop --bf16") from None
        runner.calls = 0
        return runner, info, tokenizer
    tmp = Path(tempfile.mkdtemp(prefix="ember-onnx-"))
    try:
        onnx_path = export_onnx(InferenceGraph(module), tmp / ONNX_FILE, example_inputs(info))
        if backend == "onnx-int8":
            onnx_path = quantize_onnx(onnx_path, tmp / "model-int8.onnx")
        session = onnx_session(onnx_path, threads)
    finally:  # the session holds the model in memory; the file is not needed past this point (a folder
        # left to a finalizer stayed behind when the interpreter exited first, ~90 MB for MiniLM)
        shutil.rmtree(tmp, ignore_errors=True)
    return OnnxRunner(session, backend), info, tokenizer
