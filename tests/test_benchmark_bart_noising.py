"""BART's Table 1 at CPU scale (issue 41, item 6): the study's --smoke mode pre-trains the six
noising variants of bart-mini with `ember compare` on real Wikipedia text at one CPU budget,
fine-tunes each (and a random init) on SST-2 and on the lead-generation task, and tabulates.
The smoke's models are tiny and barely trained: it checks the study, not the figures."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from benchmark_helpers import keep_torch_threads, load_benchmark  # noqa: F401 (an autouse fixture)
from conftest import real_data

from ember.durations import parse_duration
from ember.errors import EmberError
from ember.runs.folder import load_run_config


@pytest.mark.slow
def test_bart_noising_smoke_runs_each_noising_kind_at_one_cpu_budget_fills_the_table_and_resumes(tmp_path):
    pytest.importorskip("rouge_score")
    real_data("wiki-en", "AA"), real_data("wiki-en", "AB"), real_data("glue", "SST-2")
    bench = load_benchmark("bart_noising")
    argv = ["--out", str(tmp_path), "--smoke", "--control", "rotate:5"]
    result = bench.main(argv)
    rows = {r["label"]: r for r in result["rows"]}
    variants = list(bench.VARIANTS)
    control = "rotate @ 5 steps (control)"
    assert list(rows) == [*variants, "random", control, "lead baseline"]
    assert bench.VARIANTS["infill+permute"] == "infill,permute"  # §5.1's combination
    assert len(set(bench.VARIANTS.values())) == 6

    # the six recipes differ in noising.kinds and in nothing else
    recipes = {label: yaml.safe_load((tmp_path / "recipes" / f"{label}.yaml").read_text()) for label in variants}
    for label, values in recipes.items():
        assert values["noising"].pop("kinds") == bench.VARIANTS[label]
    assert all(values == recipes["mask"] for values in recipes.values())

    runs = tmp_path / "compare" / "runs"
    budgets = set()
    for label in variants:
        run = runs / label / "pretrain"
        cfg = load_run_config(run)
        # the run folder records the noise it was trained with, and the equal CPU budget on one thread
        assert cfg.noising.kinds == bench.VARIANTS[label] == rows[label]["recipe_kinds"]
        assert cfg.objective == "bart" and cfg.train.clock == "cpu" and cfg.train.num_threads == 1
        summary = json.loads((runs / label / "pretrain.json").read_text())
        budgets.add(summary["budget_seconds"])
        assert cfg.train.max_time == summary["budget_seconds"]
        # the budget bounds the training-step CPU time (one step may end past it, not more)
        assert 0 < summary["train_seconds"] <= summary["budget_seconds"] * 1.5 + 1.0
        # every column of a pre-trained row is filled, with finite numbers
        row = rows[label]
        assert row["steps"] == summary["steps"] > 0
        for key in ("own_loss", "common_loss", "sst2", "rouge1", "rouge2", "rougeLsum"):
            assert row[key] is not None and math.isfinite(row[key]), (label, key)
        assert 0 <= row["sst2"] <= 100 and row["distinct_outputs"] >= 1 and row["finetune_steps"] > 0
        # the common yardstick path, asked for the run's own noise, gives the held-out loss the
        # trainer logged at the end (the same blocks, noise draws and weights; the trainer ran it
        # in its autocast context, a no-op in fp32, so equal to float rounding)
        assert bench.yardstick_loss(run, cfg.noising.kinds)["loss"] == pytest.approx(row["own_loss"], abs=1e-5)
        assert len(result["curves"][label]) >= 2  # held-out evaluations during pre-training: a curve
    assert budgets == {parse_duration(bench.SMOKE["budget"])}  # one budget for all six

    # the unigram reference: token frequencies predict real text better than a uniform guess
    vocab = load_run_config(runs / "mask" / "pretrain").model.vocab_size
    assert 0 < result["unigram_loss"] < math.log(vocab)

    # the control: rotation's recipe run for exactly the steps asked, without a time cap, fine-tuned as the rows
    assert rows[control]["steps"] == rows[control]["max_steps"] == 5 and rows[control]["recipe_kinds"] == "rotate"
    assert load_run_config(tmp_path / "control" / "rotate-5").train.max_time == 0
    assert all(rows[control][key] is not None for key in ("own_loss", "common_loss", "sst2", "rouge1"))

    # the random-init row has the fine-tuned columns only; the lead baseline ROUGE only
    assert rows["random"]["sst2"] is not None and "steps" not in rows["random"]
    assert rows["lead baseline"]["rouge1"] > 0 and "sst2" not in rows["lead baseline"]
    table = (tmp_path / "table.md").read_text()
    assert all(f"| {label} |" in table for label in rows)
    assert json.loads((tmp_path / "table.json").read_text())["rows"] == json.loads(json.dumps(result["rows"]))
    assert (tmp_path / "curves.png").stat().st_size > 0

    # a second call reuses every finished run: no pre-training, no fine-tuning
    finished = [runs / "infill" / "pretrain" / "model.safetensors", runs / "random" / "sst2-seed1" / "results.json",
                *(tmp_path / "control" / f"rotate-5{tail}" / "model.safetensors" for tail in ("", "-sst2", "-lead"))]
    stamps = [path.stat().st_mtime_ns for path in finished]
    again = bench.main(argv)
    assert again["lead_finetunes_run"] == 0 and [path.stat().st_mtime_ns for path in finished] == stamps
    assert again["rows"] == result["rows"]


@pytest.mark.parametrize("spec", ["rotate", "rotation:900", "rotate:0", "rotate:many"])
def test_bart_noising_refuses_a_control_that_is_not_a_row_and_a_step_count(tmp_path, spec):
    bench = load_benchmark("bart_noising")
    with pytest.raises(EmberError, match="LABEL:STEPS"):
        bench.parse_args(["--out", str(tmp_path), "--control", spec])
    assert bench.parse_args(["--out", str(tmp_path), "--control", "infill+permute:12"]).control == ["infill+permute:12"]
