"""`ember pretrain --recipe xlnet-mini` on real Wikipedia text: the loss goes down, a killed run
resumes with bit-identical losses, and an XLNet-style SentencePiece (unigram) vocabulary trained
here goes through pre-training and export to a folder transformers loads with the same outputs."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import TINY_MODEL, real_data
from ember.cli import main
from ember.recipes import recipe_path
from ember.config import load_yaml, run_config_from_dict
from ember.objectives.plm import prediction_count
from run_helpers import env, kill_after_checkpoint, train_losses

# XLNet's SentencePiece special tokens, in its order (<unk> 0 ... <eop> 8).
XLNET_SPECIALS = ["<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>", "<eod>", "<eop>"]
STEPS = 40


def with_sets(items: list[str]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def pretrain_args(prepared: Path, run: Path, *extra: str) -> list[str]:
    sets = TINY_MODEL + ["train.log_every=1", "train.eval_every=20", "train.save_every=10",
                         "train.warmup_ratio=0.1", "model.mem_len=48"]
    return ["pretrain", "--recipe", "xlnet-mini", "--data", str(prepared), "--out", str(run),
            "--max-steps", str(STEPS), "--batch-size", "16", "--lr", "3e-3", "--no-progress",
            *with_sets(sets), *extra]


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_xlnet_recipes_have_the_published_shapes():
    base = run_config_from_dict(load_yaml(recipe_path("xlnet-base")))
    m = base.model
    assert (base.objective, m.family, m.num_layers, m.hidden_size, m.num_heads, m.intermediate_size) == \
        ("plm", "xlnet", 12, 768, 12, 3072)
    assert (base.data.max_seq_length, m.mem_len, base.plm.k) == (512, 384, 6.0)
    assert prediction_count(base.plm, base.data.max_seq_length) == 85  # the released num_predict
    assert (m.hidden_act, m.layer_norm_eps, m.attn_type, m.pooler) == ("gelu", 1e-12, "bi", False)
    mini = run_config_from_dict(load_yaml(recipe_path("xlnet-mini")))
    assert (mini.model.num_layers, mini.model.hidden_size, mini.data.max_seq_length, mini.model.mem_len) == \
        (4, 256, 128, 96)


@pytest.fixture(scope="module")
def xlnet_run(wiki_prepared, tmp_path_factory):
    run = tmp_path_factory.mktemp("xlnet") / "run"
    assert main(pretrain_args(wiki_prepared, run)) == 0
    return run


def test_xlnet_mini_pretraining_loss_goes_down_on_real_text(xlnet_run):
    rows = records(xlnet_run)
    losses = [r["plm_loss"] for r in rows if r["split"] == "train"]
    assert len(losses) == STEPS
    assert np.mean(losses[-10:]) < np.mean(losses[:5]) - 0.5, losses
    held_out = [r for r in rows if r["split"] == "eval"]
    assert [r["step"] for r in held_out] == [20, 40]
    assert held_out[-1]["plm_loss"] < held_out[0]["plm_loss"] < np.log(2000)
    cfg = run_config_from_dict(load_yaml(xlnet_run / "config.yaml"))
    assert (cfg.objective, cfg.model.family, cfg.model.mem_len) == ("plm", "xlnet", 48)


def test_xlnet_resume_after_kill_matches_uninterrupted_losses(wiki_prepared, xlnet_run, tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "ember", *pretrain_args(wiki_prepared, run)]
    kill_after_checkpoint(cmd, run, step=20)
    done = subprocess.run(cmd + ["--resume"], check=False, env=env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resumed from" in done.stdout
    resumed = train_losses(run)
    assert sorted(resumed) == list(range(1, STEPS + 1))
    assert resumed == train_losses(xlnet_run)  # bit-for-bit: memory passes and orders replay exactly


@pytest.fixture(scope="module")
def sentencepiece_prepared(tmp_path_factory):
    """A Unigram (SentencePiece-style) vocabulary with XLNet's special tokens, trained here on
    real Wikipedia text, and token shards of the same articles."""
    from ember.data.prepare import prepare_corpus
    from ember.tokenizers import train_tokenizer

    source = real_data("wiki-en", "AA", "wiki_00.gz")
    root = tmp_path_factory.mktemp("sp")
    tok = train_tokenizer([source], kind="unigram", vocab_size=2000, lowercase=False, max_documents=100,
                          special_tokens=XLNET_SPECIALS, progress=False)
    tok.save(str(root / "tokenizer.json"))
    prepare_corpus([source], root / "tokenizer.json", root / "prepared", max_docs=100,
                   valid_fraction=0.05, progress=False)
    return root / "prepared"


def test_xlnet_sentencepiece_pretraining_and_export_match_transformers_on_real_text(sentencepiece_prepared, tmp_path):
    from ember.data.shards import TokenCorpus
    from ember.interop.convert import export_hf
    from ember.models import build_backbone
    from ember.objectives import build_objective
    from ember.runs.checkpoint import load_weights
    from ember.runs.folder import load_run_config

    transformers = pytest.importorskip("transformers")
    corpus = TokenCorpus(sentencepiece_prepared, "train")
    special = corpus.special_token_ids
    assert (special["cls"], special["sep"], special["pad"], special["mask"]) == (3, 4, 5, 6)  # <cls> <sep> <pad> <mask>
    # the objective lays out A <sep> B <sep> <cls> with XLNet's tokens and joins documents with <eod>
    cfg = run_config_from_dict({"objective": "plm", "model": {"preset": "xlnet-mini", "mem_len": 16},
                                "data": {"max_seq_length": 64}})
    module = build_objective(cfg, {**special, "eot": 7, "tokenizer_path": str(corpus.tokenizer_path)})
    data = module.build_dataset(corpus, cfg.data, 0)
    batch = module.make_batch([data.example(i) for i in range(len(data))], np.random.default_rng(0))
    assert (batch["input_ids"][:, -1] == 3).all() and (batch["input_ids"][:, -2] == 4).all()
    assert (batch["input_ids"] == 7).any()  # documents end inside windows

    run = tmp_path / "run"
    assert main(pretrain_args(sentencepiece_prepared, run, "--max-steps", "5")) == 0
    export_hf(run, tmp_path / "hf")
    hf = transformers.XLNetLMHeadModel.from_pretrained(tmp_path / "hf").eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "The history of the city begins with a small settlement on the river."
    ids = torch.tensor([hf_tok(text, add_special_tokens=False)["input_ids"]])
    assert ids.shape[1] > 8 and 0 not in ids.tolist()[0]  # known pieces, no <unk>
    backbone = build_backbone(load_run_config(run).model).eval()
    backbone.load_state_dict({k.removeprefix("backbone."): v for k, v in load_weights(run / "model.safetensors").items()})
    t = ids.shape[1]
    perm = torch.zeros(1, t, t)
    perm[:, :, -1] = 1.0  # predict the last piece from all the others (transformers' own example)
    mapping = torch.zeros(1, 1, t)
    mapping[0, 0, -1] = 1.0
    with torch.no_grad():
        ref = hf(ids, perm_mask=perm, target_mapping=mapping).logits
        ours = backbone.lm_logits(backbone(ids, perm_mask=perm, target_mapping=mapping).query_hidden)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)


def test_xlnet_full_disk_or_kill_mid_checkpoint_keeps_the_last_one_and_resume_matches(wiki_prepared, xlnet_run,
                                                                                     tmp_path):
    """A full disk at the second save (step 20): one line names the cause and the step-10
    checkpoint stays intact; the --resume from it is then killed (-9) in the middle of its own
    step-20 save; a second --resume reproduces the uninterrupted losses."""
    from run_helpers import assert_failed_save_kept_the_last_checkpoint, run_with_fault_at_save

    run = tmp_path / "run"
    done = run_with_fault_at_save(pretrain_args(wiki_prepared, run), at=2, fault="full-disk")
    assert_failed_save_kept_the_last_checkpoint(done, run, step=20, kept=10)
    killed = run_with_fault_at_save(pretrain_args(wiki_prepared, run, "--resume"), at=1, fault="kill")
    assert killed.returncode == -signal.SIGKILL and "resumed from" in killed.stdout
    assert list((run / "checkpoints").glob(".step-00000020.*.tmp"))  # the half-written save, left by the kill
    resumed = subprocess.run([sys.executable, "-m", "ember", *pretrain_args(wiki_prepared, run), "--resume"],
                             env=env(), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "step-00000010" in resumed.stdout  # the intact checkpoint, not the half-written one
    assert train_losses(run) == train_losses(xlnet_run)
    assert not list((run / "checkpoints").glob(".step-*"))
