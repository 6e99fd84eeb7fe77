"""`ember quickstart` runs end to end even on a machine with no data folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


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
    assert "== 5/5 fine-tuning on the docstring task" in done.stdout and "the docstring task dev accuracy:" in done.stdout
    results = json.loads((tmp_path / "qs" / "sst2" / "results.json").read_text())
    assert results["train_examples"] == 300 and 0 <= results["metrics"]["accuracy"] <= 1
    assert (tmp_path / "qs" / "pretrain" / "model.safetensors").is_file()


def test_quickstart_side_by_side_line_up_both_accuracies():
    from ember.experiments.quickstart import side_by_side

    text = side_by_side(0.7712, 0.8853, "all-MiniLM-L6-v2", 20000, "300 steps, at most 6 min")
    lines = text.strip().splitlines()
    assert lines[0] == "SST-2 dev accuracy, fine-tuned on the same 20000 sentences with the same settings:"
    assert lines[1].endswith("  0.7712") and lines[2].endswith("  0.8853")
    assert lines[1].index("0.7712") == lines[2].index("0.8853")  # one column
    assert lines[3] == "  difference: +11.4 points"


@pytest.mark.slow
def test_quickstart_ends_by_fine_tuning_the_checkpoint_on_the_same_sentences(tmp_path):
    """Real data, a tiny stand-in checkpoint (random 2 x 32 BERT with the real checkpoint's
    vocabulary) given with --checkpoint: the last step fine-tunes it on the same 300 SST-2
    sentences and prints both accuracies. ~1-2 min."""
    transformers = pytest.importorskip("transformers")
    import shutil

    from conftest import real_data

    vocab = real_data("checkpoints", "all-MiniLM-L6-v2", "tokenizer.json")
    real_data("glue", "SST-2")
    folder = tmp_path / "ckpt"
    transformers.BertModel(transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                                                   num_attention_heads=2, intermediate_size=64)).save_pretrained(folder)
    shutil.copyfile(vocab, folder / "tokenizer.json")
    done = subprocess.run(
        [sys.executable, "-m", "ember", "quickstart", "--out", str(tmp_path / "qs"), "--pretrain-steps", "4",
         "--max-docs", "100", "--finetune-limit", "300", "--no-progress", "--checkpoint", str(folder)],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "== 6/6 fine-tuning the real checkpoint ckpt on the same 300 SST-2 sentences" in done.stdout
    assert "fine-tuned on the same 300 sentences with the same settings:" in done.stdout
    ours = json.loads((tmp_path / "qs" / "sst2" / "results.json").read_text())
    theirs = json.loads((tmp_path / "qs" / "sst2-checkpoint" / "results.json").read_text())
    assert ours["train_examples"] == theirs["train_examples"] == 300 and theirs["init"] == str(folder)
    for result in (ours, theirs):
        assert f"{result['metrics']['accuracy']:.4f}" in done.stdout


def test_quickstart_replaces_only_its_own_folder(tmp_path):
    """--out runs (or .) must not delete the user's runs: a folder with files no quickstart wrote is
    refused before anything happens; an earlier quickstart's folder is replaced as documented."""
    from ember.errors import EmberError
    from ember.experiments.quickstart import MARKER, replace_own_folder

    runs = tmp_path / "runs"
    (runs / "my-run").mkdir(parents=True)
    (runs / "my-run" / "model.safetensors").write_bytes(b"weights")
    done = subprocess.run([sys.executable, "-m", "ember", "quickstart", "--out", str(runs)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "holds files that no quickstart wrote" in done.stderr, done.stderr
    assert (runs / "my-run" / "model.safetensors").read_bytes() == b"weights"
    with pytest.raises(EmberError, match="is a file"):
        replace_own_folder(runs / "my-run" / "model.safetensors")
    mine = tmp_path / "qs"
    replace_own_folder(mine)
    (mine / "tok").mkdir()  # an earlier quickstart's outputs, replaced by the next one
    replace_own_folder(mine)
    assert sorted(p.name for p in mine.iterdir()) == [MARKER]
