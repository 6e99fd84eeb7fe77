"""`ember export`: a run folder -> HF layout, ONNX, PyTorch int8 or ONNX int8, verified.

Every format is written into a temporary folder beside ``out`` and renamed into place only
after it has been verified, so a failed or interrupted export leaves nothing half-written.
Verification runs the export and the original PyTorch fp32 model over real inputs (the
task's dev split, or a given file) and records the max/mean absolute logit difference,
prediction agreement and sentences/s of both in ``out/export.json`` with the sizes on disk.

Folders of the onnx / int8 / onnx-int8 formats also hold the run's config.yaml,
tokenizer.json and labels.json, so `ember serve OUT` runs them directly.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from ember.errors import EmberError
from ember.fileio import atomic_folder

FORMATS = ("hf", "onnx", "int8", "onnx-int8")
# fp32 exports must reproduce the original; int8 ones are only reported (they are lossy).
DEFAULT_TOLERANCE = 1e-3
RUN_FILES = ("config.yaml", "tokenizer.json", "labels.json", "embedding.json", "task.json")  # task.json: custom tasks


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _copy_run_files(run_dir: Path, out: Path) -> None:
    for name in RUN_FILES:
        if (run_dir / name).is_file():
            shutil.copyfile(run_dir / name, out / name)


def _write(fmt: str, run_dir: Path, tmp: Path, info, module):
    """Write format ``fmt`` into ``tmp``; returns (candidate runner, weights file)."""
    from ember.serve.graph import InferenceGraph
    from ember.serve.onnx_export import ONNX_FILE, export_onnx, onnx_session, quantize_onnx
    from ember.serve.quantize import INT8_FILE, save_int8, quantize_int8
    from ember.serve.runners import OnnxRunner, example_inputs, load_hf_runner, load_runner

    if fmt == "hf":
        from ember.interop.convert import export_hf

        export_hf(run_dir, tmp)
        # A provider may add inputs to every row (an XLM task's language), which transformers takes too.
        return (lambda: load_hf_runner(tmp, getattr(info.provider, "hf_inputs", None))), tmp / "model.safetensors"
    _copy_run_files(run_dir, tmp)
    if fmt == "int8":
        save_int8(quantize_int8(module), tmp / INT8_FILE)
        (tmp / "export.json").write_text(json.dumps({"format": "int8"}))  # load_runner reads it
        # Verify the reloaded file, not the in-memory copy: that is what `ember serve` runs.
        return (lambda: load_runner(tmp)[0]), tmp / INT8_FILE
    graph = InferenceGraph(module)
    if fmt == "onnx":
        export_onnx(graph, tmp / ONNX_FILE, example_inputs(info))
    else:
        fp32 = export_onnx(graph, tmp / ".fp32.onnx", example_inputs(info))
        quantize_onnx(fp32, tmp / ONNX_FILE)
        fp32.unlink()
    return (lambda: OnnxRunner(onnx_session(tmp / ONNX_FILE), fmt)), tmp / ONNX_FILE


def export_run(run_dir: str | Path, fmt: str, out: str | Path, verify: bool = True,
               verify_file: str | None = None, limit: int | None = 1000, batch_size: int = 32,
               tolerance: float = DEFAULT_TOLERANCE, overwrite: bool = False, source: str | Path | None = None) -> dict:
    """Export, verify and atomically write; returns the report also saved as out/export.json.
    ``source``: the folder the user named, when ``run_dir`` is a temporary view of it (a checkpoint,
    ``ember.runs.sharded.weights_view``); export.json records it, not the view that is gone."""
    from ember.serve.graph import InferenceGraph, describe, load_module
    from ember.serve.inputs import verification_rows
    from ember.serve.graph import read_manifest
    from ember.serve.runners import TorchRunner
    from ember.serve.verify import compare

    run_dir, out = Path(run_dir), Path(out)
    if fmt not in FORMATS:
        raise EmberError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if read_manifest(run_dir) is not None:
        raise EmberError(f"{run_dir} is itself an export; export from the original run folder")
    if out.exists() and not overwrite:
        raise EmberError(f"{out} already exists; pass --overwrite to replace it, or choose another --out")
    source = Path(source) if source is not None else run_dir
    if out.resolve() in (run_dir.resolve(), source.resolve()):
        raise EmberError("--out must differ from the run folder")
    info, tokenizer = describe(run_dir)
    module = load_module(run_dir, info)
    with atomic_folder(out) as tmp:  # renamed into place only once verified
        started = time.perf_counter()
        make_candidate, weights = _write(fmt, run_dir, tmp, info, module)
        report = {"format": fmt, "source": str(source.resolve()), "model": info.summary(),
                  "state_keys": list(module.state_dict()),
                  "export_seconds": round(time.perf_counter() - started, 2),
                  "size_bytes": {"original_weights": _size(run_dir / "model.safetensors"),
                                 "exported_weights": _size(weights), "folder": _size(tmp)}}
        if verify:
            rows, where = verification_rows(info, tokenizer, verify_file, limit)
            reference = TorchRunner(InferenceGraph(module))
            result = compare(reference, make_candidate(), rows, module.compare_view, info.pad_id, batch_size,
                             regression=info.is_regression)
            report["verification"] = {"inputs_from": where, **result}
            if fmt in ("hf", "onnx") and result["max_abs_diff"] > tolerance:
                raise EmberError(f"the {fmt} export differs from the original by up to "
                                 f"{result['max_abs_diff']:.2e} on {where} (tolerance {tolerance:g}); "
                                 "nothing was written")
        else:
            report["verification"] = None
        (tmp / "export.json").write_text(json.dumps(report, indent=2))
        report["size_bytes"]["folder"] = _size(tmp)
    return report


def format_report(report: dict) -> str:
    sizes = report["size_bytes"]
    mb = 1024 * 1024
    lines = [f"format {report['format']}: weights {sizes['exported_weights'] / mb:.1f} MiB "
             f"(original fp32 {sizes['original_weights'] / mb:.1f} MiB), folder {sizes['folder'] / mb:.1f} MiB"]
    v = report.get("verification")
    if v:
        agree = ("n/a (the outputs are scores or hidden states, not class predictions)"
                 if v["prediction_agreement"] is None else f"{v['prediction_agreement']:.4f}")
        lines.append(f"verified on {v['inputs_from']}: max |diff| {v['max_abs_diff']:.3e}, "
                     f"mean |diff| {v['mean_abs_diff']:.3e}, prediction agreement {agree}")
        lines.append(f"inputs/s at batch {v['batch_size']}: original {v['reference_per_s']:.1f}, "
                     f"export {v['candidate_per_s']:.1f}")
    else:
        lines.append("not verified (--no-verify)")
    return "\n".join(lines)
