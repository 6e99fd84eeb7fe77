"""benchmarks/studies/batch_order_noise.py (issue 46 item 4): the gradient noise of shuffled and
length-grouped batches, smoke: a random bert-mini on real SST-2 rows. It checks that the study
measures what it says (whole epochs, the batches each order makes, the effective batch size's
formula); its figures are not measurements."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmark_helpers import keep_torch_threads, load_benchmark  # noqa: F401 (an autouse fixture)
from conftest import real_data

from ember.errors import EmberError


def test_batch_order_noise_smoke_measures_whole_epochs_of_each_order_at_each_point(tmp_path):
    real_data("glue", "SST-2", "train.tsv")
    bench = load_benchmark("batch_order_noise")
    result = bench.main(["--out", str(tmp_path), "--smoke", "--batch-size", "8", "--seeds", "1,2", "--at", "0,2"])
    assert [p["updates"] for p in result["points"]] == [0, 2]
    n, batch = result["meta"]["examples"], 8
    assert n == 96
    for point in result["points"]:
        shuffled, grouped = point["orders"]["shuffled"], point["orders"]["grouped"]
        for order in (shuffled, grouped):
            # the batches of each epoch sum to the full gradient: every example once, weighted right
            assert order["epoch_identity"] < 1e-4
            assert order["count"] == 2 * (n // batch)  # every full batch of epoch 0 of two seeds
            assert order["noise"] == pytest.approx(np.mean([b["noise"] for b in order["batches"]]))
        # grouping puts rows of near-equal length in a batch; shuffling mixes them
        assert grouped["length_range"] < shuffled["length_range"]
        assert grouped["mean_length_sd"] > shuffled["mean_length_sd"]
        assert point["noise_ratio"] == pytest.approx(grouped["noise"] / shuffled["noise"])
        # random batches of the effective size have the grouped batches' noise (noise ~ (N - B) / ((N - 1) B))
        per_example = shuffled["noise"] * batch * (n - 1) / (n - batch)
        eff = point["effective_batch"]
        assert per_example * (n - eff) / ((n - 1) * eff) == pytest.approx(grouped["noise"], rel=1e-9)
    # the updates moved the weights: the full gradient is not the init's
    assert result["points"][0]["full_gradient_norm2"] != result["points"][1]["full_gradient_norm2"]
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["points"][1]["noise_ratio"] == result["points"][1]["noise_ratio"]
    assert "| after 2 updates | grouped |" in (tmp_path / "table.md").read_text()
    assert (tmp_path / "noise.png").read_bytes()[:4] == b"\x89PNG"


def small_teacher(bench, root) -> str:
    """A random 2-layer bert-mini fine-tuned for a few steps on real SST-2 rows: a run folder."""
    import ember

    ember.finetune("sst2", root / "teacher", init="random", model="bert-mini", tokenizer=str(bench.smoke_tokenizer(root)),
                   train_limit=64, epochs=2, batch_size=8, lr=1e-3, max_length=32, progress=False, num_threads=1,
                   overrides=["model.hidden_size=32", "model.num_layers=2", "model.num_heads=2",
                              "model.intermediate_size=64"])
    return str(root / "teacher")


def test_batch_order_noise_of_task_distillation_trains_the_student_on_the_teachers_soft_targets(tmp_path):
    real_data("glue", "SST-2", "train.tsv")
    bench = load_benchmark("batch_order_noise")
    teacher = small_teacher(bench, tmp_path)
    result = bench.main(["--out", str(tmp_path / "kd"), "--smoke", "--teacher", teacher, "--student-layers", "1",
                         "--batch-size", "8", "--seeds", "1", "--at", "0,2"])
    assert result["meta"]["task"] == "sst2" and result["meta"]["model"] == "KD from teacher into 1 layers (smoke)"
    for point in result["points"]:
        for order in point["orders"].values():
            assert order["epoch_identity"] < 1e-4 and order["count"] == 96 // 8
        assert point["orders"]["grouped"]["length_range"] < point["orders"]["shuffled"]["length_range"]
    # a student with all of the teacher's layers is the teacher: its soft targets are its own
    # outputs, so KD's loss is at its minimum and the full gradient vanishes (no gold labels in it)
    args = bench.parse_args(["--out", str(tmp_path / "same"), "--smoke", "--teacher", teacher,
                             "--student-layers", "2"])
    same = bench.setup(args, tmp_path / "same")
    assert all(f["label"] is None for f in same.features) and set(same.labels) <= {0.0, 1.0}
    one = bench.setup(bench.parse_args(["--out", str(tmp_path / "one"), "--smoke", "--teacher", teacher,
                                        "--student-layers", "1"]), tmp_path / "one")
    same.module.eval(), one.module.eval()
    assert float(bench.full_gradient(same).norm()) < 1e-3 * float(bench.full_gradient(one).norm())


@pytest.mark.parametrize("argv, message", [(["--at", "ten"], "comma-separated integers"),
                                           (["--seeds", ""], "at least one"),
                                           (["--at", "-3"], "at least one"),
                                           (["--batch-size", "1"], "2 or more")])
def test_batch_order_noise_refuses_bad_options_naming_them(tmp_path, argv, message):
    bench = load_benchmark("batch_order_noise")
    with pytest.raises(EmberError, match=message):
        bench.parse_args(["--out", str(tmp_path), *argv])
