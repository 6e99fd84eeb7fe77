"""`ember export`: ONNX / int8 / ONNX-int8 / HF exports agree with the PyTorch original on
real SST-2 dev sentences, reload from disk, and are written atomically."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import real_data
from ember.errors import EmberError
from serve_helpers import random_run, sst2_run

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def run(wiki_prepared, tmp_path_factory):
    real_data("glue", "SST-2")
    return sst2_run(tmp_path_factory.mktemp("serve-runs"), wiki_prepared / "tokenizer.json")


def _reference(run_dir):
    from ember.serve.runners import load_runner

    return load_runner(run_dir)


def _dev_arrays(info, tokenizer, n=64):
    from ember.serve.inputs import pad_arrays, verification_rows

    rows, _ = verification_rows(info, tokenizer, limit=n)
    return pad_arrays(rows, info.pad_id)


def _pretraining_module(run_dir, info):
    from ember.config import DataConfig
    from ember.models import build_backbone
    from ember.objectives.bert import BertPretraining
    from ember.runs.checkpoint import load_weights

    module = BertPretraining(build_backbone(info.cfg.model), info.special, DataConfig(), "nsp")
    module.load_state_dict(load_weights(run_dir / "model.safetensors"))
    return module.eval()


def test_inference_graph_matches_each_task_modules_logits(wiki_prepared, tmp_path):
    """The one-pass graph (logits + hidden states) computes what the task modules compute."""
    from ember.serve.graph import InferenceGraph, describe, load_module
    from ember.tasks.featurize import collate

    for kind in ("conll2003", "squad2", "mlm"):
        run_dir = random_run(tmp_path, kind, wiki_prepared / "tokenizer.json")
        info, tok = describe(run_dir)
        module = load_module(run_dir, info)
        enc = [tok.encode(t) for t in ("Paris is the capital of France .", "a short one")]
        batch = collate([{"input_ids": e.ids, "token_type_ids": e.type_ids} for e in enc], info.pad_id)
        with torch.no_grad():
            logits, hidden = InferenceGraph(module)(
                batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
            if kind == "mlm":  # the inference model's MLM head is the objective's, weight for weight
                expected = _pretraining_module(run_dir, info).logits(batch)[0]
            else:
                expected = module.logits(batch)
        if kind == "squad2":
            expected = torch.stack(expected, 1)  # (B, 2, T)
        torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)
        assert hidden.shape == (info.num_layers + 1, 2, batch["input_ids"].shape[1], info.hidden_size)


def test_onnx_export_matches_pytorch_on_sst2_dev_with_dynamic_axes(run, tmp_path):
    from ember.serve.export import export_run
    from ember.serve.runners import load_runner

    out = tmp_path / "onnx"
    report = export_run(run, "onnx", out, limit=300)
    v = report["verification"]
    assert v["inputs"] == 300 and "SST-2 dev" in v["inputs_from"]
    assert v["max_abs_diff"] < 1e-4 and v["prediction_agreement"] == 1.0
    assert report["size_bytes"]["exported_weights"] == (out / "model.onnx").stat().st_size
    assert json.loads((out / "export.json").read_text())["format"] == "onnx"
    # The exported file takes other batch sizes and lengths than the traced example (2 x 8).
    onnx_runner, info, tok = load_runner(out)
    torch_runner, _, _ = _reference(run)
    arrays = _dev_arrays(info, tok, n=37)
    assert arrays["input_ids"].shape[0] == 37 and arrays["input_ids"].shape[1] > 8
    ours, hidden = onnx_runner(arrays, need_hidden=True)
    ref, ref_hidden = torch_runner(arrays, need_hidden=True)
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)
    np.testing.assert_allclose(hidden, ref_hidden, atol=1e-4, rtol=0)


def test_int8_export_reloads_and_agrees_on_sst2_dev(run, tmp_path):
    from ember.serve.export import export_run
    from ember.serve.graph import InferenceGraph, describe, load_module
    from ember.serve.quantize import quantize_int8
    from ember.serve.runners import TorchRunner, load_runner

    out = tmp_path / "int8"
    report = export_run(run, "int8", out, limit=300)
    v = report["verification"]
    # int8 is lossy but close: logits move by << their spread, predictions almost never flip
    assert 0 < v["max_abs_diff"] < 0.1 and v["prediction_agreement"] >= 0.97
    assert report["size_bytes"]["exported_weights"] < report["size_bytes"]["original_weights"]
    # What was saved and reloaded computes exactly what the in-memory quantized model does.
    reloaded, info, tok = load_runner(out)
    assert reloaded.backend == "int8"
    in_memory = TorchRunner(InferenceGraph(quantize_int8(load_module(run, describe(run)[0]))))
    arrays = _dev_arrays(info, tok)
    np.testing.assert_array_equal(reloaded(arrays)[0], in_memory(arrays)[0])


def test_onnx_int8_export_agrees_with_pytorch_on_sst2_dev(run, tmp_path):
    from ember.serve.export import export_run

    report = export_run(run, "onnx-int8", tmp_path / "onnx-int8", limit=300)
    v = report["verification"]
    assert 0 < v["max_abs_diff"] < 0.1 and v["prediction_agreement"] >= 0.97


def test_hf_export_is_verified_with_transformers(run, tmp_path):
    pytest.importorskip("transformers")
    from ember.serve.export import export_run

    report = export_run(run, "hf", tmp_path / "hf", limit=100)
    assert report["verification"]["max_abs_diff"] < 1e-4
    assert (tmp_path / "hf" / "config.json").is_file()


def test_onnx_export_of_tagging_and_qa_models_agrees(wiki_prepared, tmp_path):
    from ember.serve.inputs import pad_arrays
    from ember.tasks.inference.requests import TextEncoder
    from ember.serve.runners import load_runner

    for kind in ("conll2003", "squad2"):
        run_dir = random_run(tmp_path, kind, wiki_prepared / "tokenizer.json")
        torch_runner, info, tok = load_runner(run_dir)
        onnx_runner, _, _ = load_runner(run_dir, "onnx")

        rows = [(ids, types) for ids, types, _ in TextEncoder(tok, 64)(
            ["EU rejects German call to boycott British lamb .", "Peter Blackburn"],
            ["Who rejects the call?", "Who?"])]
        arrays = pad_arrays(rows, info.pad_id)
        np.testing.assert_allclose(onnx_runner(arrays)[0], torch_runner(arrays)[0], atol=1e-4, rtol=0)


def test_export_refuses_existing_out_and_leaves_nothing_on_failure(run, tmp_path):
    from ember.serve.export import export_run

    existing = tmp_path / "taken"
    existing.mkdir()
    with pytest.raises(EmberError, match="already exists"):
        export_run(run, "onnx", existing)
    # A failed verification (a tolerance no export can meet) writes nothing, not even a temp folder.
    with pytest.raises(EmberError, match="nothing was written"):
        export_run(run, "onnx", tmp_path / "strict", limit=50, tolerance=-1.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
    with pytest.raises(EmberError, match="unknown export format"):
        export_run(run, "tflite", tmp_path / "x")


def test_export_cli_prints_the_verification(run, tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "ember", "export", str(run), "--format", "int8", "--out",
                           str(tmp_path / "q"), "--limit", "64"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "max |diff|" in done.stdout and "prediction agreement" in done.stdout and "MiB" in done.stdout
