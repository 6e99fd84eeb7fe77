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
    assert "4 steps (safety stop at 30m)" in done.stdout and "WARNING" not in done.stdout + done.stderr
    assert "majority class: " in done.stdout  # the accuracy is shown next to what always-one-class scores


def test_quickstart_pretrains_a_step_budget_and_a_fired_safety_stop_says_so_loudly(tmp_path):
    """The step budget defines the model; the time cap only stops a run that is far too slow, and
    then the output says the model is not the quickstart's (on stdout and stderr), and the
    side-by-side line says the budget was cut short."""
    from ember.experiments.quickstart import PRETRAIN_STEPS, SAFETY_STOP, time_stop_warning

    assert (PRETRAIN_STEPS, SAFETY_STOP) == (300, 1800.0)
    assert time_stop_warning(300, 300, 1800.0) == ""
    warning = time_stop_warning(236, 300, 1800.0)
    assert "safety stop (--pretrain-time 30m) fired at step 236 of 300" in warning
    assert "not the quickstart's model" in warning and "larger --pretrain-time" in warning
    done = subprocess.run([sys.executable, "-m", "ember", "quickstart", "--help"], capture_output=True, text=True,
                          timeout=120)
    assert "default 300" in done.stdout and "safety stop" in done.stdout and "default 30m" in done.stdout


def test_an_accuracy_near_the_majority_class_is_called_learned_little(tmp_path):
    from ember.experiments.quickstart import NEAR_MAJORITY_POINTS, against_majority, majority_rate

    dev = tmp_path / "dev.tsv"
    dev.write_text("sentence\tlabel\na \" quote\t1\nb\t0\nc\t1\nd\t1\n")  # a lone quote is text (GLUE's TSV)
    assert majority_rate(dev) == 0.75
    dev.write_text("sentence\tlabel\n")
    assert majority_rate(dev) is None and against_majority(0.6, None) == ""
    assert NEAR_MAJORITY_POINTS == 10.0
    near = against_majority(0.600, 0.509)  # issue 45: the 236-step model on SST-2 dev
    assert near.startswith("majority class: 0.5090 (+9.1 points)")
    assert "within 10 points of the majority class: the model learned little" in near
    below = against_majority(0.45, 0.509)
    assert "(-5.9 points)" in below and "learned little" in below
    far = against_majority(0.757, 0.509)  # the 300-step model on a quiet machine
    assert far == "majority class: 0.5090 (+24.8 points)"
    assert "learned little" in against_majority(0.6089, 0.509)  # 9.99 points: within 10
    assert "learned little" not in against_majority(0.6091, 0.509)


def test_quickstart_side_by_side_line_up_both_accuracies():
    from ember.experiments.quickstart import side_by_side

    text = side_by_side(0.7712, 0.8853, "all-MiniLM-L6-v2", 20000, "300 steps in 5.2 min")
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


def test_a_fired_safety_stop_and_a_near_majority_accuracy_reach_the_quickstarts_output(tmp_path, monkeypatch, capsys):
    """run_quickstart's wiring, with its heavy steps stubbed: pre-training that the time cap ended at
    step 236 of 300 (issue 45's loaded machine) and a 60% fine-tuned accuracy on a 50.9% majority
    give the loud warning (stdout and stderr), the note, and a summary that records both."""
    import ember.api
    import ember.data.prepare
    import ember.tasks.inference.fill_mask
    import ember.tokenizers
    from ember.api.results import RunResult
    from ember.experiments.quickstart import run_quickstart

    data = tmp_path / "data"
    (data / "wiki-en").mkdir(parents=True)
    (data / "glue" / "SST-2").mkdir(parents=True)
    rows = ["0"] * 428 + ["1"] * 444  # SST-2 dev's labels: 50.9% positive
    (data / "glue" / "SST-2" / "dev.tsv").write_text("sentence\tlabel\n" + "".join(f"s\t{r}\n" for r in rows))
    monkeypatch.setenv("EMBER_DATA", str(data))

    class Tok:
        def save(self, path):
            pass

        def get_vocab_size(self):
            return 100

    monkeypatch.setattr(ember.tokenizers, "train_tokenizer", lambda *a, **k: Tok())
    monkeypatch.setattr(ember.data.prepare, "prepare_corpus", lambda *a, **k: None)
    monkeypatch.setattr(ember.tasks.inference.fill_mask, "FillMask", lambda run: lambda text, k: [[("paris", 0.5)]])
    asked = {}

    def pretrain(preset, out, overrides, **kwargs):
        asked["overrides"] = overrides
        return RunResult(out, {}, [{"step": 236, "elapsed": 1800.4}])

    monkeypatch.setattr(ember.api, "pretrain", pretrain)
    monkeypatch.setattr(ember.api, "finetune", lambda task, out, **k: RunResult(out, {"accuracy": 0.6}, [{}]))
    summary = run_quickstart(tmp_path / "qs", progress=False, checkpoint=tmp_path / "no-checkpoint")
    assert "train.max_steps=300" in asked["overrides"] and "train.max_time=1800.0" in asked["overrides"]
    out, err = capsys.readouterr()
    for stream in (out, err):
        assert "!! WARNING: the pre-training safety stop (--pretrain-time 30m) fired at step 236 of 300" in stream
    assert "SST-2 dev accuracy: 0.6000" in out and "majority class: 0.5092 (+9.1 points)" in out
    assert "the model learned little" in out and "pre-trained 236 of 300 steps" in out
    assert (summary["pretrain_steps"], summary["pretrain_steps_planned"], summary["pretrain_time_stop_fired"]) == \
        (236, 300, True)
    assert summary["majority"] == 444 / 872  # a count ratio, exact
