"""benchmarks/speed/multitask_step.py --smoke: multi-task steps against single-task steps on the same
batches. Not a measurement: it checks that both sides train the same batches before they are timed
(and that the check catches a difference), and that the report holds a ratio per repetition."""

from __future__ import annotations

import json

import pytest

from benchmark_helpers import keep_torch_threads, load_benchmark  # noqa: F401 (an autouse fixture)
from conftest import real_data
from multitask_helpers import glue_tokenizer


def test_multitask_step_smoke_times_both_sides_on_the_same_real_glue_batches(tmp_path):
    real_data("glue", "RTE")
    bench = load_benchmark("multitask_step")
    out = tmp_path / "r.json"
    results = bench.main(["--smoke", "--cpu-time", "--tasks", "rte", "stsb", "sst2", "--json", str(out),
                          "--tokenizer", str(glue_tokenizer(tmp_path / "tok.json"))])
    assert sum(results["task_steps"]) == results["steps"] == 12
    assert len(results["reps"]) == 2
    for rep in results["reps"]:
        assert rep["multitask"] > 0 and rep["single"] > 0
        assert rep["ratio"] == pytest.approx(rep["single"] / rep["multitask"])
    # every batch of every repetition is timed on both sides and paired
    assert results["paired_steps"] == 2 * 12 and results["median_step_ratio"] > 0
    assert json.loads(out.read_text())["median_ratio"] == pytest.approx(results["median_ratio"])


def test_multitask_step_refuses_to_time_sides_that_train_different_batches(tmp_path, monkeypatch):
    real_data("glue", "RTE")
    bench = load_benchmark("multitask_step")
    s = bench.setup("random", ["rte", "stsb"], 8, 48, True, "bert-tiny", str(glue_tokenizer(tmp_path / "tok.json")),
                    ("model.hidden_size=32", "model.num_layers=2", "model.num_heads=2",
                     "model.intermediate_size=64"))
    bench.same_batches(s)  # seeded as the mixture seeds each task: the same batches
    import dataclasses

    real = bench._single_cfg
    monkeypatch.setattr(bench, "_single_cfg", lambda s, t: dataclasses.replace(real(s, t), seed=real(s, t).seed + 1))
    with pytest.raises(RuntimeError, match="batches differ"):
        bench.same_batches(s)
