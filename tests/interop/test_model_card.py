"""The README.md model card of an exported Hugging Face folder: YAML metadata in the Hub's
convention with the run's real numbers, and how it was trained (a tiny SST-2 run on real data)."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import real_data
from ember.cli import main


@pytest.fixture(scope="module")
def sst2(wiki_prepared, tmp_path_factory):
    from serve_helpers import sst2_run

    real_data("glue", "SST-2")
    return sst2_run(tmp_path_factory.mktemp("card-runs"), wiki_prepared / "tokenizer.json")


def card(folder):
    text = (folder / "README.md").read_text(encoding="utf-8")
    assert text.startswith("---\n")
    front, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(front), body


@pytest.mark.parametrize("how", ["convert", "export"])
def test_hf_export_writes_a_model_card_with_the_runs_metadata_and_numbers(sst2, tmp_path, how):
    out = tmp_path / "sst2-hf"
    args = (["convert", "--to-hf", str(sst2), "--out", str(out)] if how == "convert"
            else ["export", str(sst2), "--format", "hf", "--out", str(out), "--limit", "16"])
    assert main(args) == 0
    meta, body = card(out)
    results = json.loads((sst2 / "results.json").read_text())
    assert meta["language"] == ["en"] and meta["datasets"] == ["nyu-mll/glue"]
    assert meta["library_name"] == "transformers" and meta["pipeline_tag"] == "text-classification"
    assert {"ember", "bert", "sst2", "glue"} <= set(meta["tags"])
    assert "license" not in meta and "# license: fill in before sharing" in (out / "README.md").read_text()
    [index] = meta["model-index"]
    assert index["name"] == "sst2-hf"
    [result] = index["results"]
    assert result["dataset"] == {"name": "GLUE SST-2", "type": "nyu-mll/glue", "config": "sst2", "split": "validation"}
    assert result["metrics"] == [{"type": "accuracy", "value": results["metrics"]["accuracy"], "name": "accuracy"}]
    # how it was trained, as the run folder records it
    state = json.loads(sorted((sst2 / "checkpoints").glob("step-*"))[-1].joinpath("trainer_state.json").read_text())
    assert f"| steps | {results['steps']} (best at {results['best_step']}) |" in body
    assert f"| batch size | 32 |" in body and "| epochs | 1 |" in body
    assert f"train ({results['train_examples']} examples); selected on dev" in body
    assert state["hardware"]["cpu"] and state["hardware"]["cpu"] in body
    assert f"| dev | accuracy | {results['metrics']['accuracy']:.4f} |" in body
