"""Run folders written by the ember of commit 7caa1bc, before the application layer was given its
floors (tests/fixtures/old_runs, made by make_old_runs.py there): the current code must load,
evaluate, serve and resume them as they are."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

OLD = Path(__file__).resolve().parents[1] / "fixtures" / "old_runs"


@pytest.fixture
def old(tmp_path, monkeypatch):
    """A copy of the old folders (tests must not write into the repository), with the relative
    corpus path pointed at the copy, as a user does after moving runs to another machine."""
    root = tmp_path / "old_runs"
    shutil.copytree(OLD, root, ignore=shutil.ignore_patterns("*.py"))
    config = root / "pretrain" / "config.yaml"
    config.write_text(config.read_text().replace("prepared: corpus", f"prepared: {root / 'corpus'}"))
    monkeypatch.setenv("EMBER_DATA", str(root / "sst2-data"))
    return root


def _losses(run: Path, steps) -> dict[int, dict]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: {k: r[k] for k in ("loss", "mlm_loss", "nsp_loss")}
            for r in records if r["split"] == "train" and r["step"] in steps}


def test_old_pretraining_run_resumes_to_the_losses_it_logged(old):
    """Steps 3-4 retrained by the current code from the old step-2 checkpoint give the losses
    the old code logged for them."""
    import ember

    run = old / "pretrain"
    logged = _losses(run, (3, 4))
    assert len(logged) == 2
    shutil.rmtree(run / "checkpoints" / "step-00000004")
    (run / "model.safetensors").unlink()
    result = ember.pretrain(None, run, resume=True, progress=False)
    assert result.result["step"] == 4 and (run / "model.safetensors").is_file()
    again = _losses(run, (3, 4))
    for step in (3, 4):
        assert again[step] == pytest.approx(logged[step], rel=1e-6, abs=1e-7), step


def test_old_finetuned_run_evaluates_to_its_recorded_metrics(old):
    import ember

    recorded = json.loads((old / "sst2" / "results.json").read_text())["metrics"]
    assert ember.evaluate(old / "sst2")["metrics"] == pytest.approx(recorded, abs=1e-6)


def test_old_runs_and_exports_serve_with_the_current_predictor(old):
    from ember.serve.predictor import load_predictor
    from ember.tasks.inference.requests import Limits

    def ask(predictor, name, body):
        return predictor.run(name, [predictor.parse(name, body, Limits())])[0]

    texts = {"texts": ["the good film of the river .", "a bad war story ."]}
    fp32 = load_predictor(old / "sst2")
    assert fp32.endpoints == ["/classify", "/embed"]
    classified = ask(fp32, "classify", texts)["results"]
    int8 = ask(load_predictor(old / "sst2-int8"), "classify", texts)["results"]  # an old int8 export
    for a, b in zip(classified, int8):
        assert a["probabilities"] == pytest.approx(b["probabilities"], abs=0.05)
    mlm = load_predictor(old / "pretrain")
    assert mlm.endpoints == ["/fill-mask", "/embed"]
    onnx = load_predictor(old / "pretrain-onnx")  # an old ONNX export: its manifest has no state_keys
    assert onnx.endpoints == ["/fill-mask", "/embed"] and onnx.backend == "onnx"
    body = {"text": "the [MASK] of the city .", "top_k": 3}
    torch_masks, onnx_masks = ask(mlm, "fill-mask", body)["masks"][0], ask(onnx, "fill-mask", body)["masks"][0]
    assert [m["token"] for m in torch_masks] == [m["token"] for m in onnx_masks]
    np.testing.assert_allclose([m["probability"] for m in torch_masks], [m["probability"] for m in onnx_masks],
                               atol=1e-5)
    vector = ask(mlm, "embed", {"text": "the river ."})["results"][0]["embedding"]
    assert len(vector) == 16 and np.isfinite(vector).all()
