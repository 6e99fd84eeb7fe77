"""The grid-search study (issue 44 item 4), smoke: a random small model on real RTE rows. It
checks that the study compares what it says it compares; its figures are not measurements."""

from __future__ import annotations

import json

import pytest
import yaml

from benchmark_helpers import keep_torch_threads, load_benchmark  # noqa: F401 (an autouse fixture)
from conftest import real_data

from ember.errors import EmberError


@pytest.mark.slow
def test_grid_evidence_smoke_picks_the_winner_on_dev_and_reruns_it_and_the_defaults_at_fresh_seeds(tmp_path):
    real_data("glue", "RTE", "train.tsv")
    bench = load_benchmark("grid_evidence")
    argv = ["--out", str(tmp_path), "--smoke", "--tasks", "rte", "--seeds", "2,3", "--train-limit", "96",
            "--grid-seed", "5", "--set", "train.group_by_length=true"]
    result = bench.main(argv)
    rte = result["tasks"][0]
    trials = rte["grid"]["trials"]
    assert sorted(t["settings"]["train.lr"] for t in trials) == [2e-5, 5e-5]  # the smoke's two grid points
    assert rte["grid"]["winner"]["dev"] == max(t["dev"] for t in trials)  # chosen on dev
    for config in (tmp_path / "rte" / "grid-seed-5" / "trials").glob("trial-*/config.yaml"):
        train = yaml.safe_load(config.read_text())["train"]
        assert train["seed"] == 5  # the grid's runs train at its seed
        assert train["group_by_length"] == "true"  # and share the study's --set
    # ember's defaults, as the default runs resolved them, are one of the grid's points: the study
    # reads that point's score at the grid's seed from the sweep instead of training it again.
    assert rte["default"]["settings"] == {"train.lr": 2e-5, "train.batch_size": 32, "task.epochs": 3.0}
    assert rte["default_at_grid_seed"] == next(t["dev"] for t in trials if t["settings"]["train.lr"] == 2e-5)
    for side in ("default", "winner"):
        for seed in (2, 3):  # fresh seeds only; each run trained with its side's settings
            run = tmp_path / "rte" / (side if side == "default" or not rte["winner_is_default"] else "default") / f"seed-{seed}"
            config = yaml.safe_load((run / "config.yaml").read_text())
            assert config["train"]["seed"] == seed
            assert config["train"]["group_by_length"] == "true"
            want = rte["default"]["settings"] if side == "default" else rte["grid"]["winner"]["settings"]
            assert config["train"]["lr"] == want["train.lr"]
            score = json.loads((run / "results.json").read_text())["metrics"]["accuracy"]
            assert rte[side]["scores"][seed] == score
    row = result["summary"]["table"]["rte"]["dev"]
    diffs = [rte["winner"]["scores"][s] - rte["default"]["scores"][s] for s in (2, 3)]
    assert row["winner"]["vs_reference"]["mean"] == pytest.approx(sum(diffs) / 2, abs=1e-12)
    extra = result["summary"]["extra"]["rte"]
    assert extra["optimism"] == pytest.approx(rte["grid"]["winner"]["dev"] - row["winner"]["mean"], abs=1e-12)
    assert "| rte | dev |" in (tmp_path / "table.md").read_text()
    assert "Every run shares `--set train.group_by_length=true`" in (tmp_path / "table.md").read_text()
    assert (tmp_path / "grid.png").read_bytes()[:4] == b"\x89PNG"
    again = bench.main(argv)  # everything is done: a second call trains nothing and finds the same
    assert again["tasks"][0]["grid"] == rte["grid"] and again["tasks"][0]["default"]["scores"] == rte["default"]["scores"]
    assert not list(tmp_path.glob("rte/grid-seed-5/trials/trial-0002"))


def test_grid_evidence_refuses_the_grids_seed_among_the_fresh_ones_an_unknown_task_and_a_searched_or_misspelt_set(tmp_path):
    bench = load_benchmark("grid_evidence")
    with pytest.raises(EmberError, match="must be fresh: seed 0"):
        bench.parse_args(["--out", str(tmp_path), "--seeds", "0,2"])
    with pytest.raises(EmberError, match="unknown task"):
        bench.parse_args(["--out", str(tmp_path), "--tasks", "rte,qqp"])
    with pytest.raises(EmberError, match="train.lr is also searched"):
        bench.parse_args(["--out", str(tmp_path), "--set", "train.lr=1e-4"])
    with pytest.raises(EmberError, match="the study sets the seeds itself"):
        bench.parse_args(["--out", str(tmp_path), "--set", "train.seed=7"])
    with pytest.raises(EmberError, match="did you mean train.group_by_length"):
        bench.parse_args(["--out", str(tmp_path), "--set", "train.group_by_lenght=true"])
    with pytest.raises(EmberError, match="KEY=VALUE"):
        bench.parse_args(["--out", str(tmp_path), "--set", "train.group_by_length"])
