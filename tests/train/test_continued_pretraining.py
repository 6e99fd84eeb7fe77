"""`ember pretrain --init RUN` (ember.api.continued): continued MLM pre-training of a trained
encoder (Longformer §5), on a tiny run trained here and on the real all-MiniLM-L6-v2, imported
and made long, with real Wikipedia text tokenized by its own tokenizer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import TINY_MODEL, real_data
from ember.cli import main
from ember.runs.checkpoint import load_weights
from ember.runs.folder import load_run_config
from run_helpers import env, kill_after_checkpoint, train_losses

SHORT = ["train.log_every=1", "train.eval_every=0", "train.save_every=0", "train.warmup_steps=1",
         "train.batch_size=4", "data.eval_examples=8"]


def sets(*items: str) -> list[str]:
    return [a for s in items for a in ("--set", s)]


@pytest.fixture(scope="module")
def tiny_run(wiki_prepared, tmp_path_factory):
    """A tiny BERT pre-trained with MLM for 4 steps on real Wikipedia shards: an init with an MLM head."""
    run = tmp_path_factory.mktemp("tiny") / "run"
    assert main(["pretrain", "--recipe", "roberta-mini", "--data", str(wiki_prepared), "--out", str(run),
                 "--max-steps", "4", "--grad-accum", "1", "--no-progress", *sets(*TINY_MODEL, *SHORT)]) == 0
    return run


def continued_setup(init, prepared, out, *overrides):
    """The objective module `ember pretrain --init` trains, before its first step."""
    from ember.api.pretrain import pretrain_config
    from ember.objectives.setup import setup_pretraining

    cfg = pretrain_config(None, out, prepared, list(overrides), init=init)
    torch.manual_seed(cfg.train.seed)
    return cfg, setup_pretraining(cfg, out, False, False)


def assert_same_tensors(module, state: dict) -> None:
    own = module.state_dict()
    shared = [k for k in own if k in state]
    assert all(k in state for k in own if k.startswith("backbone."))
    for k in shared:
        assert torch.equal(own[k], state[k]), k  # exact: the init's tensors themselves


def test_continued_pretraining_starts_from_every_init_tensor_exactly_bert(tiny_run, wiki_prepared, tmp_path):
    cfg, setup = continued_setup(tiny_run, wiki_prepared, tmp_path / "new")
    init_cfg, state = load_run_config(tiny_run), load_weights(tiny_run / "model.safetensors")
    assert cfg.model == init_cfg.model and cfg.init == str(tiny_run)
    assert_same_tensors(setup.module, state)
    assert any(k.startswith("mlm.") for k in state)  # the init's trained MLM head goes on training
    assert set(setup.module.state_dict()) <= set(state)
    # the recipe continue-mlm: sequences as long as the model's positions, a fresh schedule
    assert (cfg.data.max_seq_length, cfg.data.packing, cfg.objective) == (64, "full_sentences", "mlm")


def test_continued_pretraining_cli_trains_a_new_run_and_resume_after_kill_reproduces_losses(
        tiny_run, wiki_prepared, tmp_path, capsys):
    def cmd(run: Path, *extra: str) -> list[str]:
        return [sys.executable, "-m", "ember", "pretrain", "--init", str(tiny_run), "--data", str(wiki_prepared),
                "--out", str(run), "--max-steps", "8", "--no-progress",
                *sets(*SHORT[:-1], "train.save_every=2", "model.dropout=0.2"), *extra]

    whole = tmp_path / "whole"
    done = subprocess.run(cmd(whole), env=env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"continuing {tiny_run}" in done.stdout
    losses = train_losses(whole)
    assert sorted(losses) == list(range(1, 9))
    saved = load_run_config(whole)
    assert saved.init == str(tiny_run) and saved.model.dropout == 0.2  # dropout leaves the weights' meaning
    assert json.loads((whole / "recipe.json").read_text())["init"] == str(tiny_run)
    run = tmp_path / "run"
    kill_after_checkpoint(cmd(run), run, step=4)
    done = subprocess.run(cmd(run, "--resume"), env=env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resumed from" in done.stdout
    assert train_losses(run) == losses  # bit-for-bit the uninterrupted run's losses
    assert main(cmd(run, "--resume")[3:5] + [str(whole)] + cmd(run, "--resume")[6:]) == 1  # another init
    assert f"continues {tiny_run}, not --init {whole}" in capsys.readouterr().err
    # a checkpoint is an init too: its tensors, and its run's config and tokenizer
    checkpoint = whole / "checkpoints" / "step-00000006"
    _, setup = continued_setup(checkpoint, wiki_prepared, tmp_path / "from-checkpoint")
    from ember.runs.sharded import checkpoint_model_state

    assert_same_tensors(setup.module, checkpoint_model_state(checkpoint))


@pytest.mark.parametrize("attention,options", [("bigbird", ["--block", "16", "--random-blocks", "1"]),
                                               ("reformer", ["--chunk", "16", "--hashes", "2"])])
def test_continued_pretraining_of_bigbird_and_reformer_conversions_starts_exactly_and_trains(
        attention, options, tiny_run, wiki_prepared, tmp_path):
    """The attention variant is a model setting the init carries: a run made long with BigBird's or
    Reformer's attention (Reformer's shared QK needs this training) continues with its own."""
    long = tmp_path / "long"
    assert main(["convert", "--from-run", str(tiny_run), "--long", "128", "--attention", attention, "--out",
                 str(long), *options]) == 0
    cfg, setup = continued_setup(long, wiki_prepared, tmp_path / "probe")
    assert (cfg.model.attention, cfg.model.max_position, cfg.data.max_seq_length) == (attention, 128, 128)
    assert_same_tensors(setup.module, load_weights(long / "model.safetensors"))
    run = tmp_path / "run"
    assert main(["pretrain", "--init", str(long), "--data", str(wiki_prepared), "--out", str(run), "--max-steps", "3",
                 "--no-progress", *sets(*SHORT)]) == 0
    assert load_run_config(run).model == load_run_config(long).model
    losses = train_losses(run)
    assert sorted(losses) == [1, 2, 3] and all(v == v for v in losses.values())


def refused(args: list[str], capsys) -> str:
    assert main(args) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    return err


def test_continued_pretraining_refuses_what_contradicts_the_init_before_writing(
        tiny_run, wiki_prepared, tmp_path, capsys):
    from ember.data.prepare import prepare_corpus

    out = tmp_path / "out"
    base = ["pretrain", "--init", str(tiny_run), "--data", str(wiki_prepared), "--out", str(out), "--no-progress"]
    err = refused(base + sets("model.hidden_size=64"), capsys)
    assert "model.hidden_size" in err and "hidden_size=32" in err
    assert "model.attention" in refused(base + sets("model.attention=longformer"), capsys)
    assert "objective 'electra'" in refused(base + ["--recipe", "electra-mini"], capsys)
    assert "where this command reads" in refused(base[:-2] + [str(tiny_run), "--no-progress"], capsys)
    # shards from another tokenizer: another vocabulary size, or the same size with other rules
    source = real_data("wiki-en", "AA", "wiki_00.gz")
    small = tmp_path / "small-tok.json"
    from conftest import make_wordpiece

    make_wordpiece(["the", "a", "of"]).save(str(small))
    prepare_corpus([source], small, tmp_path / "small", max_docs=3, valid_fraction=0.0, progress=False)
    err = refused(base[:3] + ["--data", str(tmp_path / "small")] + base[5:], capsys)
    assert "8-token vocabulary" in err and "2,000 tokens" in err and "--tokenizer" in err
    cased = json.loads((tiny_run / "tokenizer.json").read_text())
    cased["normalizer"]["lowercase"] = False
    (tmp_path / "cased.json").write_text(json.dumps(cased))
    prepare_corpus([source], tmp_path / "cased.json", tmp_path / "cased", max_docs=3, valid_fraction=0.0,
                   progress=False)
    err = refused(base[:3] + ["--data", str(tmp_path / "cased")] + base[5:], capsys)
    assert "another tokenizer (sha256" in err and "both 2,000 tokens" in err
    assert not out.exists()  # nothing half-written


def test_continued_pretraining_refuses_an_elmo_init(tmp_path, tiny_tokenizer_path, wiki_prepared, capsys):
    """Every family on `ember prepare` shards continues (test_continued_pretraining_families.py);
    ELMo reads raw text with its own word vocabulary, so its run is refused in one line."""
    from ember.config import RunConfig
    from ember.runs.checkpoint import save_weights
    from ember.runs.folder import write_run_files

    write_run_files(tmp_path / "elmo", RunConfig(objective="bilm"), tiny_tokenizer_path)
    save_weights({"elmo.softmax.bias": torch.zeros(3)}, tmp_path / "elmo" / "model.safetensors")
    err = refused(["pretrain", "--init", str(tmp_path / "elmo"), "--data", str(wiki_prepared), "--out",
                   str(tmp_path / "out")], capsys)
    assert "is an ELMo run" in err and not (tmp_path / "out").exists()


# ---- the real all-MiniLM-L6-v2, imported and made long, on real Wikipedia text ----

@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    """MiniLM imported, made long (1,024 positions, window 512), and ~40 real Wikipedia articles
    tokenized with its tokenizer."""
    from ember.data.prepare import prepare_corpus

    checkpoint = real_data("checkpoints", "all-MiniLM-L6-v2")
    source = real_data("wiki-en", "AA", "wiki_00.gz")
    root = tmp_path_factory.mktemp("minilm")
    assert main(["convert", "--from-hf", str(checkpoint), "--out", str(root / "minilm")]) == 0
    assert main(["convert", "--from-run", str(root / "minilm"), "--long", "1024", "--out", str(root / "long")]) == 0
    prepare_corpus([source], root / "minilm" / "tokenizer.json", root / "wiki", max_docs=40, valid_fraction=0.1,
                   progress=False)
    return root / "minilm", root / "long", root / "wiki"


def test_continued_pretraining_from_long_minilm_keeps_its_model_and_weights(minilm, tmp_path):
    short, long, wiki = minilm
    cfg, setup = continued_setup(long, wiki, tmp_path / "new")
    model = load_run_config(long).model
    assert cfg.model == model and (model.attention, model.max_position, model.sep_token_id) == ("longformer", 1024, 102)
    assert cfg.data.max_seq_length == 1024  # documents packed up to the long length
    state = load_weights(long / "model.safetensors")
    assert_same_tensors(setup.module, state)
    assert not any(k.startswith("mlm.") for k in state)  # MiniLM has no MLM head: a fresh one
    assert "fresh heads: mlm" in setup.description
    # the HF folder itself as the init: the imported run's tensors (the import is exact)
    hf = real_data("checkpoints", "all-MiniLM-L6-v2")  # its tokenizer.json differs only in padding/truncation
    cfg, setup = continued_setup(hf, wiki, tmp_path / "from-hf")
    assert cfg.model == load_run_config(short).model
    assert_same_tensors(setup.module, load_weights(short / "model.safetensors"))


def test_continued_pretraining_minilm_mlm_loss_falls_from_its_fresh_head_on_real_text(minilm, tmp_path):
    """MiniLM (a sentence-embedding model) has no MLM head: the first batch is scored by a fresh
    head, near or above a random model's ln(30,522) = 10.3, not below it (docs/pretraining.md has
    the measured comparison over 60 steps). What a few steps must show: the loss falls as the head
    learns to read the trained encoder, with no step blowing up."""
    short, _, wiki = minilm
    run = tmp_path / "run"
    assert main(["pretrain", "--init", str(short), "--data", str(wiki), "--out", str(run), "--max-steps", "6",
                 "--lr", "5e-4", "--no-progress", *sets(*SHORT, "data.max_seq_length=128", "train.warmup_steps=2")]) == 0
    losses = [loss for _, loss in sorted(train_losses(run).items())]
    assert len(losses) == 6 and all(loss == loss and loss < 13 for loss in losses)  # finite, no divergence
    assert min(losses[-2:]) < losses[0] - 1.0  # 11.7 -> ~8 when measured: the fresh head learns
    assert load_run_config(run).model == load_run_config(short).model


def test_continued_pretraining_long_minilm_finetunes_and_exports_to_transformers_longformer(minilm, tmp_path):
    """A few MLM steps on the long MiniLM over real text, then `convert --to-hf`, whose transformers
    LongformerForMaskedLM gives the continued run's MLM logits (its new head included), and
    `ember finetune --init`."""
    transformers = pytest.importorskip("transformers")
    from hf_interop_helpers import load_hf
    from ember.config import DataConfig
    from ember.models import build_backbone
    from ember.objectives.bert import BertPretraining
    from ember.tokenizers import load_tokenizer

    _, long, wiki = minilm
    run = tmp_path / "run"
    assert main(["pretrain", "--init", str(long), "--data", str(wiki), "--out", str(run), "--max-steps", "2",
                 "--no-progress", *sets(*SHORT, "train.batch_size=2", "data.max_seq_length=256")]) == 0
    weights = load_weights(run / "model.safetensors")
    moved = load_weights(long / "model.safetensors")["backbone.layers.0.ffn.up.weight"]
    assert not torch.equal(weights["backbone.layers.0.ffn.up.weight"], moved)  # it trained
    assert main(["convert", "--to-hf", str(run), "--out", str(tmp_path / "hf")]) == 0
    hf = load_hf(transformers.LongformerForMaskedLM, tmp_path / "hf", tied=("lm_head.decoder.weight",
                                                                          "lm_head.decoder.bias"))
    ids = torch.tensor([load_tokenizer(run / "tokenizer.json").encode(_wiki_words(3000)).ids[:700]])  # > window
    ours = BertPretraining(build_backbone(load_run_config(run).model), {"pad": 0, "cls": 101, "sep": 102,
                                                                        "mask": 103}, DataConfig(), "none").eval()
    ours.load_state_dict(weights)  # every tensor of the run, the trained MLM head too
    with torch.no_grad():
        logits, _ = ours.logits({"input_ids": ids})
        torch.testing.assert_close(logits, hf(input_ids=ids).logits, atol=1e-4, rtol=0)  # float32 sums in
        # another order over 384-wide rows and a 30,522-way decoder: equal to ~1e-5, not bit-equal
    dev = tmp_path / "dev16.tsv"  # 16 real RTE dev pairs: the scoring path, at a fraction of the dev set's cost
    dev.write_text("".join(real_data("glue", "RTE", "dev.tsv").read_text().splitlines(keepends=True)[:17]))
    out = tmp_path / "rte"
    assert main(["finetune", "--task", "rte", "--init", str(run), "--out", str(out), "--train-limit", "16",
                 "--epochs", "1", "--max-length", "64", "--eval-split", str(dev), "--no-progress"]) == 0
    assert 0.0 <= json.loads((out / "results.json").read_text())["metrics"]["accuracy"] <= 1.0
    assert "attention: longformer" in (out / "config.yaml").read_text()


def _wiki_words(words: int) -> str:
    import gzip
    import re

    with gzip.open(real_data("wiki-en", "AA", "wiki_00.gz"), "rt", encoding="utf-8") as fh:
        text = re.sub(r"<[^>]+>", " ", fh.read(400_000))
    return " ".join(text.split()[:words])
