"""benchmarks/speed/long_attention.py --smoke runs end to end (tiny sizes, one process): every
implementation and pass is measured, ember's and transformers' Longformer layers agree, and the
table and plot are written. Not a measurement."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "speed" / "long_attention.py"


def test_long_attention_benchmark_smoke_measures_every_implementation_and_pass(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "RESULTS.json").read_text())
    assert result["max_diff_vs_transformers"] < 1e-4
    measured = {(r["impl"], r["length"], r["pass"]) for r in result["rows"]}
    assert measured == {(i, n, p) for i in ("full", "ember-longformer", "hf-longformer") for n in (64, 256)
                        for p in ("fwd", "fwd+bwd", "train")}
    assert all(r["seconds"] > 0 for r in result["rows"])
    assert (tmp_path / "long_attention.png").stat().st_size > 10_000
    assert "| 256 | train |" in (tmp_path / "table.md").read_text()


def test_long_attention_benchmark_smoke_measures_reformer(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--impls", "full,ember-reformer", "--passes",
                           "fwd,train", "--out", str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads((tmp_path / "RESULTS.json").read_text())["rows"]
    assert {(r["impl"], r["length"], r["pass"]) for r in rows} == {(i, n, p) for i in ("full", "ember-reformer")
                                                                  for n in (64, 256) for p in ("fwd", "train")}
    assert all(r["seconds"] > 0 for r in rows)


def test_long_stack_memory_smoke_measures_both_window_layouts(tmp_path):
    """benchmarks/speed/long_stack_memory.py --smoke: a tiny Longformer stack trains one step with the
    band's windows kept and rebuilt, each in its own process, and the table names both. Not a measurement."""
    script = SCRIPT.parent / "long_stack_memory.py"
    out = tmp_path / "rows.json"
    done = subprocess.run([sys.executable, str(script), "--smoke", "--json", str(out)],
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert [r["hidden"] for r in rows] == [32]
    for layout in ("kept", "rebuilt"):
        assert rows[0][layout]["peak_mb"] >= 0 and rows[0][layout]["cpu_s"] > 0
    assert "| H = 32 |" in done.stdout
