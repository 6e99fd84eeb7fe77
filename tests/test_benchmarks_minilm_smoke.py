"""The real-checkpoint benchmarks' --smoke modes (embeddings vs sentence-transformers, fine-tuning
vs a plain transformers loop) run on all-MiniLM-L6-v2 and report sane numbers. Not measurements."""

from __future__ import annotations

import pytest
import torch
from conftest import real_data
from test_benchmarks_smoke import load_benchmark


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    from ember.interop.convert import import_hf

    checkpoint = real_data("checkpoints", "all-MiniLM-L6-v2")
    return checkpoint, import_hf(checkpoint, tmp_path_factory.mktemp("minilm") / "run")


@pytest.fixture(autouse=True)
def keep_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_embed_throughput_smoke_fp32_matches_sentence_transformers_quality(minilm, monkeypatch):
    pytest.importorskip("sentence_transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hf, run = minilm
    bench = load_benchmark("embed_throughput")
    r = bench.main(["--hf", str(hf), "--run", str(run), "--backends", "torch", "int8", "--cpu-time", "--smoke"])
    # the same weights and pooling: fp32 Spearman equals sentence-transformers' to rounding
    assert abs(r["spearman"]["ember torch"] - r["spearman"][bench.REFERENCE]) < 0.05
    for corpus in r["corpora"].values():
        assert all(rate > 0 for rate in corpus["texts_per_s"].values()) and "ember int8" in corpus["ratio"]
    p50, p99 = r["latency_ms"]["ember torch"]
    assert 0 < p50 <= p99


@pytest.mark.slow
def test_finetune_throughput_smoke_runs_both_sides_on_sst2(minilm, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hf, run = minilm
    bench = load_benchmark("finetune_throughput")
    r = bench.main(["--hf", str(hf), "--run", str(run), "--tasks", "sst2", "--cpu-time", "--smoke", "--full-last-layer"])
    sst2 = r["tasks"]["sst2"]
    assert sst2["ember"]["seconds"] > 0 and sst2["transformers"]["seconds"] > 0
    assert 0 <= sst2["ember"]["accuracy"] <= 100 and len(sst2["ratio_each"]) == 1
    # the lever's twin: the same fine-tuning with the last layer everywhere, so the same accuracy
    assert sst2["ember-full-last-layer"]["accuracy"] == pytest.approx(sst2["ember"]["accuracy"], abs=1.0)
    assert len(sst2["last_layer_ratio_each"]) == 1
