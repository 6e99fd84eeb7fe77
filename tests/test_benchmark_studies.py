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


@pytest.mark.slow
def test_multitask_evidence_smoke_spends_equal_steps_per_side_and_pairs_by_seed(tmp_path):
    """MT-DNN's question, smoke: the multi-task run takes the single side's steps (to a step of
    rounding), stage 2 starts from the stage-1 mixture, SNLI trains on its dev file and is scored
    on the first rows of test, the table's paired differences are the runs' own, and a second
    call trains nothing."""
    for task in ("RTE", "MRPC", "STS-B", "CoLA", "SST-2"):
        real_data("glue", task, "train.tsv")
    real_data("snli", "test.tsv")
    bench = load_benchmark("multitask_evidence")
    argv = ["--out", str(tmp_path), "--smoke", "--large-dev-limit", "40"]
    result = bench.main(argv)
    runs = tmp_path / "runs"
    single_steps = sum(json.loads((runs / "single" / "seed-1" / t / "results.json").read_text())["steps"]
                       for t in ("rte", "mrpc", "stsb", "cola"))
    assert single_steps == result["budget"]["single_steps"]
    multi = {r["variant"]: r for r in result["records"]}
    assert abs(multi["multi"]["steps"] - single_steps) <= 1  # an epoch's steps are rounded up once
    stage2 = sum(json.loads((runs / "multi+ft" / "seed-1" / t / "results.json").read_text())["steps"]
                 for t in ("rte", "mrpc", "stsb", "cola"))
    assert abs(multi["multi+ft"]["stage1"]["steps"] + stage2 - single_steps) <= 4  # each run rounds up once
    for task in ("rte", "cola"):
        kept = json.loads((runs / "multi+ft" / "seed-1" / task / "results.json").read_text())
        assert kept["init"] == str(runs / "multi+ft" / "seed-1" / "stage1")
    shares = multi["multi"]["shares"]
    assert sum(shares.values()) == pytest.approx(1.0) and shares["sst2"] + shares["snli"] > 0
    snli = json.loads((runs / "multi" / "seed-1" / "tasks" / "snli" / "results.json").read_text())
    assert snli["train_examples"] == 24  # the smoke's limit, drawn from SNLI's dev file
    scored = (tmp_path / "snli-test-first-40.tsv").read_text().splitlines()
    assert len(scored) == 41 and scored[0].split("\t")[:2] == ["premise", "hypothesis"]
    for task in ("rte", "mrpc", "stsb", "cola"):
        row = result["table"][task]["dev"]
        for side in ("multi", "multi+ft"):
            assert row[side]["vs_reference"]["mean"] == pytest.approx(
                multi[side]["scores"][task] - multi["single"]["scores"][task], abs=1e-12)
    table = (tmp_path / "table.md").read_text()
    assert "| rte | dev |" in table and "multi-task + per-task" in table
    assert (tmp_path / "multitask.png").read_bytes()[:4] == b"\x89PNG"
    assert bench.main(argv)["records"] == result["records"]  # a second call trains nothing again


def test_multitask_evidence_refuses_a_task_on_both_sides_and_a_share_outside_0_1(tmp_path):
    bench = load_benchmark("multitask_evidence")
    with pytest.raises(EmberError, match="no task is in both"):
        bench.parse_args(["--out", str(tmp_path), "--small", "rte,sst2", "--large", "sst2"])
    with pytest.raises(EmberError, match="between 0 and 1"):
        bench.parse_args(["--out", str(tmp_path), "--stage1-share", "1"])
