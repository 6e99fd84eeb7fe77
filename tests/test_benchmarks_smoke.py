"""Each benchmark's --smoke mode runs (seconds on idle cores) and reports sane numbers, so the
benchmark scripts keep working as the library changes. These are not measurements."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from conftest import make_wordpiece, real_data

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_benchmark(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def keep_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_pretrain_throughput_smoke_reports_rates_ratio_and_utilisation(tmp_path):
    bench = load_benchmark("pretrain_throughput")
    out = tmp_path / "r.json"
    (result,) = bench.main(["--smoke", "--cpu-time", "--variants", "ember", "ember-torch-dropout", "--json", str(out)])
    assert set(result["tokens_per_s"]) == {"ember", "ember-torch-dropout", "reference"}
    assert all(v > 0 for v in result["tokens_per_s"].values())
    assert 0 < result["utilisation"]["ember"] < 1.5
    assert result["ratio"]["ember"] > 0
    assert json.loads(out.read_text())[0]["masked"] == result["masked"]


def test_useful_flops_count_matches_a_hand_count_for_one_layer():
    bench = load_benchmark("pretrain_throughput")
    from ember.config import ModelConfig

    cfg = ModelConfig(vocab_size=10, hidden_size=4, num_layers=1, num_heads=1, intermediate_size=8)
    # per token: QKV 2*4*12 + out 2*4*4 + FFN 2*(4*8 + 8*4) = 96 + 32 + 128 = 256;
    # attention 2 * (2 * T * H) per token with T = 3: 48; x 3 tokens (1 x 3 batch) = 912;
    # head at 1 masked row: 2 * (4*4 + 4*10) = 112; forward 1024, training step x3
    assert bench.useful_flops(cfg, 1, 3, 1) == 3 * 1024


def _tiny_sst2_run(folder: Path) -> Path:
    """A fine-tuned-run folder (random weights) that the inference benchmark can load."""
    from ember.config import ModelConfig, RunConfig, TaskConfig
    from ember.models import build_backbone
    from ember.tasks.classification import SequenceClassifier
    from ember.train.checkpoint import save_weights
    from ember.train.rundir import write_run_files

    words = ["the", "a", "film", "movie", "good", "bad", "is", "it", "not", "and", "of", "."]
    tok = folder / "tok.json"
    folder.mkdir(parents=True)
    make_wordpiece(words).save(str(tok))
    model = ModelConfig(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                        max_position=128)
    write_run_files(folder, RunConfig(kind="finetune", model=model, task=TaskConfig(name="sst2")), tok)
    torch.manual_seed(0)
    save_weights(SequenceClassifier(build_backbone(model), 2, 0).state_dict(), folder / "model.safetensors", {})
    return folder


def test_inference_smoke_agrees_with_the_reference_and_scores_sst2(tmp_path):
    real_data("glue", "SST-2", "dev.tsv")
    bench = load_benchmark("inference")
    result = bench.main(["--smoke", "--run", str(_tiny_sst2_run(tmp_path / "run"))])
    assert result["max_abs_diff"] < 1e-4  # same weights, same logits
    for row in result["fixed"]:
        assert set(row["sequences_per_s"]) == {"ember fp32", "reference fp32", "ember int8"}
    rows = result["sst2_dev"]["rows"]
    assert rows["ember fp32 (length-sorted)"]["agrees_with_ember_fp32"] == 1.0
    # the same fp32 weights predict the same labels however the batches are padded
    assert rows["reference fp32 (pad to 128)"]["agrees_with_ember_fp32"] == 1.0
    assert rows["reference fp32 (dynamic pad)"]["agrees_with_ember_fp32"] == 1.0
    assert 0 <= rows["ember int8 (length-sorted)"]["accuracy"] <= 1
    # ember's ONNX export is the same fp32 function: same predictions in the same order
    assert rows["ember ONNX fp32 (length-sorted)"]["agrees_with_ember_fp32"] == 1.0
    assert rows["ember ONNX fp32 (length-sorted)"]["accuracy"] == rows["ember fp32 (length-sorted)"]["accuracy"]
    assert 0 <= rows["ember ONNX int8 (length-sorted)"]["accuracy"] <= 1


def test_prepare_throughput_smoke_reports_overhead_and_memory(tmp_path):
    real_data("wiki-en", "AA", "wiki_00.gz")
    bench = load_benchmark("prepare_throughput")
    result = bench.main(["--smoke", "--json", str(tmp_path / "r.json")])
    assert all(v > 0 for v in result["mb_per_s"].values())
    assert [m["files"] for m in result["memory"]] == [1, 4]
    assert all(m["peak_mb"] > 0 for m in result["memory"])


@pytest.mark.slow
def test_time_to_accuracy_smoke_trains_both_and_fine_tunes_both(wiki_prepared, tmp_path):
    real_data("glue", "SST-2", "train.tsv")
    bench = load_benchmark("time_to_accuracy")
    result = bench.main(["--smoke", "--cpu-time", "--data", str(wiki_prepared), "--out", str(tmp_path / "tta")])
    assert result["clock"] == "cpu"  # both budgets counted in CPU seconds
    for side in ("ember", "reference"):
        assert 0.0 <= result[side]["sst2"]["accuracy_mean"] <= 1.0
    assert result["reference"]["pretrain"]["steps"] >= 1
    assert (tmp_path / "tta" / "results.json").is_file()
