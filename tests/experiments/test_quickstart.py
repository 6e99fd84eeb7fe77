"""`ember quickstart` runs end to end even on a machine with no data folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_quickstart_falls_back_to_stdlib_docstrings_without_data(tmp_path):
    env = {**os.environ, "EMBER_DATA": str(tmp_path / "no-data-here")}
    done = subprocess.run(
        [sys.executable, "-m", "ember", "quickstart", "--out", str(tmp_path / "qs"), "--pretrain-steps", "4",
         "--max-docs", "200", "--finetune-limit", "300", "--no-progress"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert str(tmp_path / "no-data-here") in done.stdout  # says where data was expected
    assert "standard library" in done.stdout
    assert "SST-2 dev accuracy:" in done.stdout
    results = json.loads((tmp_path / "qs" / "sst2" / "results.json").read_text())
    assert results["train_examples"] == 300 and 0 <= results["metrics"]["accuracy"] <= 1
    assert (tmp_path / "qs" / "pretrain" / "model.safetensors").is_file()
