"""The seed studies of the real-checkpoint issue (items 5 and 7): their --smoke modes train
every variant on real GLUE/SST-2 text with a tiny random model, compute what their tables say
from the runs' own predictions, and resume. These are not measurements."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmark_helpers import keep_torch_threads, load_benchmark  # noqa: F401 (an autouse fixture)
from conftest import real_data

from ember.errors import EmberError


@pytest.mark.slow
def test_finetune_stability_smoke_counts_collapses_from_real_dev_predictions_and_resumes(tmp_path):
    for task in ("RTE", "MRPC", "CoLA"):
        real_data("glue", task, "dev.tsv")
    bench = load_benchmark("finetune_stability")
    argv = ["--out", str(tmp_path), "--smoke"]
    result = bench.main(argv)
    assert len(result["records"]) == 3 * 3 * 2  # tasks x methods x the smoke's two seeds
    for r in result["records"]:
        # The predictions the study counts are the ones the trainer scored: same metric to 1e-9.
        assert r["scores"]["dev"] == pytest.approx(r["recorded_dev"], abs=1e-9), r["run"]
        assert r["collapsed"] == (r["top_prediction_share"] >= 0.99)
    for row in result["rows"]:
        runs = [r for r in result["records"] if (r["task"], r["variant"]) == (row["task"], row["method"])]
        assert row["collapsed"] == sum(r["collapsed"] for r in runs) and row["n"] == 2
        assert row["min"] <= row["mean"] <= row["max"]
    # The majority-class score: CoLA's Matthews correlation of a constant prediction is 0; RTE's
    # accuracy is the dev share of the training set's most frequent label (this copy's layout:
    # index, label, sentence1, sentence2).
    assert result["majority"]["cola"]["score"] == 0.0
    rte = {split: [line.split("\t")[1] for line in real_data("glue", "RTE", f"{split}.tsv").read_text().splitlines()[1:]]
           for split in ("train", "dev")}
    majority = max(set(rte["train"]), key=rte["train"].count)
    assert result["majority"]["rte"]["score"] == pytest.approx(rte["dev"].count(majority) / len(rte["dev"]))
    table = (tmp_path / "table.md").read_text()
    assert "| rte | layer-wise lr decay |" in table and "| cola | gradual unfreezing |" in table
    assert (tmp_path / "stability.png").read_bytes()[:4] == b"\x89PNG"
    assert bench.main(argv)["records"] == result["records"]  # a second call trains nothing again


def test_finetune_stability_refuses_a_regression_task_and_unknown_methods(tmp_path):
    bench = load_benchmark("finetune_stability")
    with pytest.raises(EmberError, match="stsb is a regression task"):
        bench.parse_args(["--out", str(tmp_path), "--tasks", "stsb"])
    with pytest.raises(EmberError, match="unknown method"):
        bench.parse_args(["--out", str(tmp_path), "--methods", "plain,freeze"])


@pytest.mark.slow
def test_distill_study_smoke_pairs_each_method_with_its_gold_label_twin_and_resumes(tmp_path):
    real_data("glue", "SST-2", "train.tsv")
    bench = load_benchmark("distill_study")
    argv = ["--out", str(tmp_path), "--smoke", "--variants", "tiny-direct,tiny-kd"]
    result = bench.main(argv)
    assert {(r["variant"], r["seed"]) for r in result["records"]} == {(v, s) for v in ("tiny-direct", "tiny-kd")
                                                                       for s in (1, 2)}
    # McNemar's counts come from the two runs' own dev predictions, seed by seed.
    labels = np.asarray(json.loads((tmp_path / "speed" / "table.json").read_text())["labels"])
    by_key = {(r["variant"], r["seed"]): r for r in result["records"]}
    pairs = result["twins"]["tiny-kd"]
    assert [p["seed"] for p in pairs] == [1, 2] and "tiny-direct" not in result["twins"]
    for p in pairs:
        kd, direct = (np.asarray(by_key[(v, p["seed"])]["predictions"]) == labels for v in ("tiny-kd", "tiny-direct"))
        assert p["only_this_right"] == int(np.sum(kd & ~direct)) and p["only_twin_right"] == int(np.sum(direct & ~kd))
        assert p["points"] == pytest.approx(100 * (kd.mean() - direct.mean()))
        assert 0.0 <= p["mcnemar_p"] <= 1.0
    # The students read the teacher's vocabulary and the KD student learnt from its cached soft targets.
    assert (tmp_path / "teacher-logits.npz").is_file()
    speed = result["speed"]
    assert set(speed) == {"teacher", "tiny-direct", "tiny-kd"}
    assert speed["tiny-kd"]["shape"]["layers"] == 2 and speed["tiny-kd"]["paths"]["pytorch fp32"]["sentences_per_s"] > 0
    text = (tmp_path / "study.md").read_text()
    assert "| bert-tiny, KD | 2 × 128 |" in text and "Distilled students beat their directly trained twins" in text
    assert f"| **teacher** ({Path(result['meta']['teacher']).name}) |" in text  # the teacher it was given
    assert (tmp_path / "study.png").read_bytes()[:4] == b"\x89PNG"
    again = bench.main(argv)  # a second call trains nothing again
    assert [r["scores"] for r in again["records"]] == [r["scores"] for r in result["records"]]


def test_distill_study_refuses_a_method_without_its_twin(tmp_path):
    bench = load_benchmark("distill_study")
    with pytest.raises(EmberError, match="add tiny-direct"):
        bench.parse_args(["--out", str(tmp_path), "--variants", "tiny-kd"])
