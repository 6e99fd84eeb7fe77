"""XLM pre-training end to end: the xlm-mini recipe on a small real English + Russian corpus
(wiki-en + ruslit), the causal variant, exact resume of the language-mixed stream."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch


TINY = ["--set", "model.hidden_size=32", "--set", "model.num_layers=2", "--set", "model.num_heads=2",
        "--set", "model.intermediate_size=128", "--set", "model.max_position=64", "--set", "data.max_seq_length=64",
        "--set", "data.eval_examples=32", "--set", "train.log_every=1", "--set", "train.num_threads=1",
        "--no-progress"]


def metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_xlm_mini_recipe_loads_with_languages():
    from ember.recipes import recipe_path
    from ember.config import load_yaml, run_config_from_dict

    cfg = run_config_from_dict(load_yaml(recipe_path("xlm-mini")))
    assert cfg.objective == "xlm_mlm" and cfg.model.family == "xlm"
    assert (cfg.model.num_languages, cfg.model.language_codes) == (2, ["en", "ru"])
    assert (cfg.model.num_layers, cfg.model.hidden_size, cfg.model.num_heads, cfg.model.intermediate_size) == (4, 256, 4, 1024)
    assert (cfg.data.max_seq_length, cfg.data.mask_prob, cfg.xlm.alpha) == (256, 0.15, 0.5)
    assert not cfg.model.pooler and cfg.model.type_vocab_size == 0


def test_xlm_mini_pretrain_on_real_en_ru_loss_goes_down(tmp_path, en_ru):
    """`ember pretrain --recipe xlm-mini` (tiny overrides) on real en + ru: the MLM loss falls,
    held-out evaluation reports each language, the run keeps its language map."""
    from ember.cli import main
    from ember.runs.folder import load_run_config

    run = tmp_path / "run"
    assert main(["pretrain", "--recipe", "xlm-mini", "--data", str(en_ru), "--out", str(run), "--max-steps", "60",
                 "--batch-size", "16", "--lr", "2e-3", "--set", "train.eval_every=60", *TINY]) == 0
    train = [m for m in metrics(run) if m["split"] == "train"]
    first, last = np.mean([m["mlm_loss"] for m in train[:5]]), np.mean([m["mlm_loss"] for m in train[-5:]])
    assert last < first - 0.5, (first, last)
    held_out = [m for m in metrics(run) if m["split"] == "eval"][-1]
    assert {"mlm_en_loss", "mlm_ru_loss", "mlm_acc"} <= set(held_out)
    cfg = load_run_config(run)
    assert cfg.model.languages == "en,ru" and cfg.model.vocab_size == 800
    from ember.runs.checkpoint import load_weights

    state = load_weights(run / "model.safetensors")
    assert state["backbone.embeddings.language.weight"].shape == (2, 32) and "lm.bias" in state

    # The trained run exports to transformers' XLMWithLMHeadModel with the same logits on a
    # real held-out Russian stream.
    transformers = pytest.importorskip("transformers")
    from ember.data.shards import TokenCorpus
    from ember.interop.convert import export_hf
    from ember.models import build_backbone
    from ember.objectives.xlm import XlmPretraining

    ours = XlmPretraining(build_backbone(cfg.model), TokenCorpus(en_ru, "train").special_token_ids, cfg.data,
                          cfg.xlm).eval()
    ours.load_state_dict(state)
    data = ours.build_dataset(TokenCorpus(en_ru, "valid"), cfg.data, seed=0)
    ru = next(e for e in (data.example(i) for i in range(len(data))) if e.language_ids[0] == 1)
    batch = {k: v for k, v in ours.make_batch([ru], np.random.default_rng(0)).items()}
    hf = transformers.XLMWithLMHeadModel.from_pretrained(export_hf(run, tmp_path / "hf")).eval()
    assert hf.config.lang2id == {"en": 0, "ru": 1}
    with torch.no_grad():
        ref = hf(input_ids=batch["input_ids"], langs=batch["language_ids"], position_ids=batch["position_ids"]).logits
        torch.testing.assert_close(ours.logits(batch), ref, atol=1e-5, rtol=0)


def test_xlm_causal_encoder_never_reads_the_future():
    """model.causal: logits at position t do not change when tokens after t do (XLM's CLM)."""
    import dataclasses

    from ember.config import DataConfig, XlmConfig, model_preset
    from ember.models import build_backbone
    from ember.objectives.xlm import XlmPretraining

    cfg = dataclasses.replace(model_preset("xlm-mini"), vocab_size=50, hidden_size=32, num_heads=2, num_layers=2,
                              intermediate_size=128, num_languages=2, languages="en,ru", causal=True)
    special = {"cls": 0, "sep": 1, "pad": 2, "unk": 3, "mask": 4}
    module = XlmPretraining(build_backbone(cfg), special, DataConfig(), XlmConfig(), "clm").eval()
    ids = torch.randint(5, 50, (2, 12))
    changed = ids.clone()
    changed[:, 7:] = torch.randint(5, 50, (2, 5))
    langs = torch.zeros_like(ids)
    with torch.no_grad():
        a = module.logits({"input_ids": ids, "language_ids": langs})
        b = module.logits({"input_ids": changed, "language_ids": langs})
        padded = module.logits({"input_ids": ids, "attention_mask": torch.ones_like(ids), "language_ids": langs})
    torch.testing.assert_close(a[:, :7], b[:, :7], atol=1e-5, rtol=0)
    assert (a[:, 7:] - b[:, 7:]).abs().max() > 1e-3
    torch.testing.assert_close(a, padded, atol=1e-5, rtol=0)


def test_xlm_mlm_loss_and_per_language_metrics_match_its_full_logits_on_real_en_ru(en_ru):
    """The fused head's per-token losses and hits (ember.nn.linear_cross_entropy, reduction
    "none") give XLM's loss and its per-language metrics as F.cross_entropy and argmax over the
    model's full logits do, on real English and Russian streams (eval mode, no dropout)."""
    import dataclasses

    import torch.nn.functional as F

    from ember.config import DataConfig, XlmConfig, model_preset
    from ember.data.shards import TokenCorpus
    from ember.models import build_backbone
    from ember.objectives.xlm import XlmPretraining

    corpus = TokenCorpus(en_ru, "train")
    cfg = dataclasses.replace(model_preset("xlm-mini"), vocab_size=corpus.vocab_size, hidden_size=32, num_heads=2,
                              num_layers=2, intermediate_size=64, max_position=64, num_languages=2, languages="en,ru")
    data = DataConfig(max_seq_length=64)
    torch.manual_seed(0)
    module = XlmPretraining(build_backbone(cfg), corpus.special_token_ids, data, XlmConfig(), "mlm").eval()
    examples = module.build_dataset(corpus, data, seed=0)
    batch = module.make_batch([examples.example(i) for i in range(12)], np.random.default_rng(0))
    with torch.no_grad():
        loss, metrics = module(batch)
        where = batch["labels"] != -100
        logits = module.logits(batch)[where]  # (N, V)
    targets, language = batch["labels"][where], batch["language_ids"][where]
    per_token = F.cross_entropy(logits, targets, reduction="none")
    torch.testing.assert_close(loss, per_token.mean(), rtol=1e-5, atol=1e-5)
    assert metrics["mlm_acc"] == (int((logits.argmax(-1) == targets).sum()), int(where.sum()))
    for lang, code in enumerate(("en", "ru")):
        chosen = language == lang
        total, n = metrics[f"mlm_{code}_loss"]
        assert n == int(chosen.sum()) > 0
        assert abs(total - float(per_token[chosen].sum())) < 1e-3 * n


def test_xlm_clm_pretrain_on_real_en_ru_learns_and_reports_perplexity(tmp_path, en_ru):
    from ember.cli import main

    run = tmp_path / "clm"
    assert main(["pretrain", "--recipe", "xlm-mini", "--data", str(en_ru), "--out", str(run), "--max-steps", "40",
                 "--batch-size", "8", "--lr", "2e-3", "--set", "objective=xlm_clm", "--set", "model.causal=true",
                 "--set", "train.eval_every=40", *TINY]) == 0
    train = [m for m in metrics(run) if m["split"] == "train"]
    assert np.mean([m["lm_loss"] for m in train[-5:]]) < np.mean([m["lm_loss"] for m in train[:5]]) - 0.5
    held_out = [m for m in metrics(run) if m["split"] == "eval"][-1]
    assert held_out["ppl"] == pytest.approx(np.exp(held_out["lm_loss"]), rel=1e-6) and "lm_ru_loss" in held_out


def test_xlm_pretrain_resume_continues_the_language_mix_exactly(tmp_path, en_ru):
    """8 steps straight == the same run rewound to its step-4 checkpoint and resumed: the
    mixed en/ru stream (language draws, blocks, masks) is a pure function of (seed, step)."""
    import shutil

    from ember.cli import main

    args = ["--recipe", "xlm-mini", "--data", str(en_ru), "--max-steps", "8", "--batch-size", "4",
            "--set", "train.eval_every=0", "--set", "train.save_every=4", "--set", "train.keep_checkpoints=3", *TINY]
    a = tmp_path / "a"
    assert main(["pretrain", "--out", str(a), *args]) == 0
    straight = {m["step"]: m["loss"] for m in metrics(a) if m["split"] == "train"}
    b = tmp_path / "b"
    shutil.copytree(a, b)
    (b / "model.safetensors").unlink()
    for ckpt in (b / "checkpoints").iterdir():
        if not ckpt.name.endswith("00000004"):
            shutil.rmtree(ckpt)
    assert main(["pretrain", "--out", str(b), "--resume", "--no-progress"]) == 0  # the run's saved settings
    resumed = {m["step"]: m["loss"] for m in metrics(b) if m["split"] == "train"}
    assert sorted(resumed) == list(range(1, 9)) and resumed == straight
