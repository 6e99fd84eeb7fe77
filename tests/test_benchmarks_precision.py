"""The precision benchmarks: precision_race (bf16 vs fp32 runs read off their held-out curves)
and head_dropout_ab (this checkout's fused head and dropout against another checkout's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmark_helpers import BENCHMARKS, keep_torch_threads, load_benchmark  # noqa: F401 (an autouse fixture)


def _race_run(folder: Path, evals: list[tuple[int, float, float, float]]) -> Path:
    """A run folder as time_to_loss.py --side ember leaves it: metrics.jsonl with eval records."""
    from ember.train.logging import MetricsLogger

    logger = MetricsLogger(folder / "ember")
    for step, elapsed, loss, acc in evals:
        logger.log(step, "train", {"loss": loss + 0.1}, elapsed)
        logger.log(step, "eval", {"mlm_loss": loss, "mlm_acc": acc}, elapsed)
    return folder


def test_precision_race_reads_bf16s_time_to_the_fp32_final_loss_off_its_curve(tmp_path):
    bench = load_benchmark("precision_race")
    fp32 = _race_run(tmp_path / "fp32", [(200, 300.0, 7.3, 0.08), (400, 600.0, 7.1, 0.09)])
    bf16 = _race_run(tmp_path / "bf16", [(200, 150.0, 7.3, 0.08), (400, 300.0, 7.0, 0.10), (800, 600.0, 6.9, 0.11)])
    result = bench.main([str(fp32), str(bf16), "--out", str(tmp_path / "race")])
    # fp32 ends at 7.1; bf16 passes it between 150 s (7.3) and 300 s (7.0): 150 + 150 * 2/3 = 250 s
    assert result["bf16_time_to_fp32_final_loss"] == pytest.approx({"seconds": 250.0, "bound": False})
    assert result["bf16_time_to_fp32_final_acc"] == pytest.approx({"seconds": 225.0, "bound": False})
    text = (tmp_path / "race" / "table.md").read_text()
    assert "| bf16 | 800 | 10.0 | 6.9000 | 11.00% | - |" in text and "4.2 CPU-min (0.42x the budget)" in text
    assert (tmp_path / "race" / "curves.png").stat().st_size > 0


def test_precision_race_says_which_run_is_missing_its_evaluations(tmp_path):
    bench = load_benchmark("precision_race")
    fp32 = _race_run(tmp_path / "fp32", [(200, 300.0, 7.3, 0.08)])
    with pytest.raises(bench.EmberError, match="no metrics.jsonl: run time_to_loss.py"):
        bench.main([str(fp32), str(tmp_path / "nothing"), "--out", str(tmp_path / "race")])


def test_head_dropout_ab_smoke_times_both_versions_of_each_component(tmp_path):
    bench = load_benchmark("head_dropout_ab")
    result = bench.main(["--against", str(BENCHMARKS.parent), "--smoke"])  # this checkout against itself
    assert set(result) == {"head", "head-bf16", "dropout", "dropout-bf16"}
    assert all(r["before_ms"] > 0 and r["after_ms"] > 0 and r["speedup"] > 0 for r in result.values())
    with pytest.raises(bench.EmberError, match="must be an ember checkout"):
        bench.main(["--against", str(tmp_path), "--smoke"])
