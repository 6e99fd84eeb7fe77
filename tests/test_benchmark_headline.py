"""benchmarks/headline.py --quick: the table is made from the scripts' own results (seconds; not a
measurement), names the machine and its load, and takes generation rows from generate_speed's
``generation_rows(quick)`` when that module is there, saying it is missing otherwise."""

from __future__ import annotations

import sys
import types

import pytest

from benchmark_helpers import keep_torch_threads, load_benchmark  # noqa: F401 (an autouse fixture)


@pytest.fixture
def headline(monkeypatch):
    return load_benchmark("headline")


def test_headline_quick_rows_are_the_scripts_ratios_with_machine_and_load(headline, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "generate_speed", None)  # as in a checkout without it: import fails
    r = headline.main(["--quick", "--only", "pretrain", "serving", "generation", "--log", str(tmp_path / "log"),
                       "--json", str(tmp_path / "r.json")])
    works = [row["work"] for row in r["rows"]]
    assert works[0].startswith("MLM pre-training step") and any("classification forward" in w for w in works)
    timed = [row for row in r["rows"] if row["ratio"] is not None]
    assert len(timed) == 6 and all(row["ratio"] > 0 for row in timed)
    # a row's ratio is the script's: the pre-training row is its ratio against the masked-rows loop,
    # and every repetition's own ratio is kept beside it
    assert len(timed[0]["each"]) == 2 and min(timed[0]["each"]) <= timed[0]["ratio"] * 1.0001
    generation = [row for row in r["rows"] if row["work"] == "generation"]
    assert generation[0]["ratio"] is None and "missing" in generation[0]["detail"]
    printed = capsys.readouterr().out
    assert "AMD" in printed or "Intel" in printed or "cores" in printed
    assert "load averages (1, 5, 15 min):" in printed and "| work | reference |" in printed
    assert "matmul peak" in (tmp_path / "log").read_text()  # the script's own report went to the log
    assert (tmp_path / "r.json").is_file()


def test_headline_takes_generation_rows_from_generate_speed_and_survives_a_broken_section(headline, monkeypatch):
    calls = []
    fake = types.ModuleType("generate_speed")

    def generation_rows(quick):
        calls.append(quick)
        return [{"work": "GPT-2 batch 1 greedy", "ratio": 1.3, "each": [1.2, 1.4], "detail": "tokens equal"}]

    fake.generation_rows = generation_rows
    monkeypatch.setitem(sys.modules, "generate_speed", fake)
    monkeypatch.setitem(headline.RUNNERS, "serving", lambda quick, work: 1 / 0)
    r = headline.main(["--quick", "--only", "generation", "serving"])
    assert calls == [True]
    gen, broken = r["rows"]
    assert (gen["work"], gen["ratio"], gen["each"], gen["detail"]) == ("GPT-2 batch 1 greedy", 1.3, [1.2, 1.4],
                                                                       "tokens equal")
    assert broken["ratio"] is None and broken["detail"].startswith("failed: ZeroDivisionError")
