"""Causal-LM pre-training: end-of-text token, packed blocks, the clm objective, recipes, real text."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from ember.recipes import RECIPES_DIR, recipe_path
from ember.config import apply_overrides, load_yaml, run_config_from_dict


def test_bpe_tokenizer_has_end_of_text_token(wiki_bpe):
    from ember.tokenizers import END_OF_TEXT, end_of_text_id, load_tokenizer, special_token_ids

    tok = load_tokenizer(wiki_bpe / "tokenizer.json")
    assert end_of_text_id(tok) == tok.token_to_id(END_OF_TEXT) == 5
    assert special_token_ids(tok) == {"cls": 0, "pad": 1, "sep": 2, "unk": 3, "mask": 4}  # RoBERTa ids kept
    assert tok.encode("a <|endoftext|> b", add_special_tokens=False).ids.count(5) == 1  # never split


def test_clm_blocks_are_documents_joined_by_end_of_text(wiki_bpe):
    from ember.data.blocks import TokenBlockDataset
    from ember.data.shards import TokenCorpus

    corpus = TokenCorpus(wiki_bpe, "train")
    data = TokenBlockDataset(corpus, 128, eot_id=5)
    stream = np.concatenate([np.append(corpus.doc_tokens(d).astype(np.int64), 5) for d in range(corpus.num_docs)])
    assert data.num_tokens == len(stream) == corpus.num_tokens + corpus.num_docs
    assert len(data) == len(stream) // 128
    blocks = np.concatenate([data.example(i) for i in range(len(data))])
    np.testing.assert_array_equal(blocks, stream[: len(data) * 128])  # every token once, in order
    assert all(len(data.example(i)) == 128 for i in (0, len(data) - 1))
    with pytest.raises(IndexError):
        data.example(len(data))


def test_clm_loss_is_next_token_cross_entropy():
    from ember.nn.lm_loss import next_token_loss

    class TiedHead:  # a backbone's LM head as F.linear's (input, weight, bias)
        weight = torch.randn(11, 7)

        def lm_projection(self, hidden):
            return hidden, self.weight, None

    hidden = torch.randn(2, 5, 7)
    logits = hidden @ TiedHead.weight.T  # (2, 5, 11)
    ids = torch.randint(0, 11, (2, 5))
    loss, metrics = next_token_loss(TiedHead(), hidden, ids)
    manual = -torch.stack([logits[b, t].log_softmax(-1)[ids[b, t + 1]] for b in range(2) for t in range(4)]).mean()
    torch.testing.assert_close(loss, manual)
    assert metrics["lm_loss"][1] == 8


def test_clm_objective_refuses_an_encoder():
    from ember.config import RunConfig, model_preset
    from ember.errors import EmberError
    from ember.objectives import build_objective

    with pytest.raises(EmberError, match="causal decoder"):
        build_objective(RunConfig(objective="clm", model=model_preset("bert-tiny")), {"eot": 2})


def test_gpt2_recipes_load_with_published_shapes():
    from ember.config import model_preset

    for name in ("gpt2-tiny", "gpt2-mini"):
        cfg = run_config_from_dict(load_yaml(recipe_path(name)))
        assert cfg.objective == "clm" and cfg.model.family == "gpt2" and cfg.model.pre_layer_norm
    small = model_preset("gpt2-small")
    assert (small.num_layers, small.hidden_size, small.num_heads, small.max_position, small.vocab_size) == \
        (12, 768, 12, 1024, 50257)
    gpt1 = model_preset("gpt1")
    assert (gpt1.family, gpt1.num_layers, gpt1.hidden_size, gpt1.max_position, gpt1.pre_layer_norm) == \
        ("gpt", 12, 768, 512, False)
    from ember.models import build_backbone

    with torch.device("meta"):  # shapes only: no 124M-parameter allocation and init
        params = sum(p.numel() for p in build_backbone(small).parameters())
    assert abs(params - 124.4e6) < 0.1e6  # GPT-2 small: 124M parameters with tied embeddings


GPT_RECIPES = sorted(p.stem for p in RECIPES_DIR.glob("gpt*.yaml"))
# A 2-layer, 64-wide decoder on 64-token blocks: any recipe steps in well under a second.
TINY_DECODER = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=2", "model.intermediate_size=128",
                "data.max_seq_length=64", "data.eval_examples=32"]


def test_gpt1_recipes_follow_the_paper():
    """gpt1 as in Radford et al. 2018 §4.1; gpt1-mini keeps its architecture, scaled down."""
    full, mini = (run_config_from_dict(load_yaml(recipe_path(n))) for n in ("gpt1", "gpt1-mini"))
    for cfg in (full, mini):
        m = cfg.model
        assert cfg.objective == "clm" and m.family == "gpt" and not m.pre_layer_norm  # post-LN, no final LN
        assert (m.hidden_act, m.dropout, m.attention_dropout, m.intermediate_size) == \
            ("gelu_new", 0.1, 0.1, 4 * m.hidden_size)
        assert (m.max_position, cfg.train.weight_decay, cfg.train.adam_beta2) == (512, 0.01, 0.999)
        assert cfg.train.schedule == "linear"  # ember's stand-in for the paper's cosine decay to 0
    m, t = full.model, full.train
    assert (m.num_layers, m.hidden_size, m.num_heads, m.vocab_size) == (12, 768, 12, 40478)
    assert (full.data.max_seq_length, t.batch_size, t.lr, t.warmup_steps) == (512, 64, 2.5e-4, 2000)
    assert (mini.model.num_layers, mini.model.hidden_size, mini.model.num_heads) == (4, 256, 4)
    assert (mini.data.max_seq_length, mini.train.batch_size) == (256, 32)


@pytest.mark.parametrize("name", GPT_RECIPES)
def test_every_gpt_recipe_builds_its_objective_and_takes_a_step(name, wiki_bpe):
    from ember.data.shards import TokenCorpus
    from ember.objectives import build_objective
    from ember.tokenizers import end_of_text_id, load_tokenizer
    from ember.objectives.setup import objective_dataset

    cfg = run_config_from_dict(apply_overrides(load_yaml(recipe_path(name)),
                                               [*TINY_DECODER, "model.vocab_size=1000", f"data.prepared={wiki_bpe}"]))
    corpus = TokenCorpus(wiki_bpe, "train")
    eot = end_of_text_id(load_tokenizer(corpus.tokenizer_path))
    torch.manual_seed(0)
    module = build_objective(cfg, {**corpus.special_token_ids, "eot": eot})
    data = objective_dataset(module, corpus, cfg.data, cfg.train.seed, corpus.special_token_ids["sep"])
    batch = module.make_batch([data.example(i) for i in range(4)], np.random.default_rng(0))
    loss, metrics = module(batch)
    loss.backward()
    assert torch.isfinite(loss) and metrics["lm_loss"][1] == 4 * 63
    assert batch["input_ids"].shape == (4, cfg.data.max_seq_length)


def pretrain_evals(wiki_bpe, run, recipe: str, *args: str) -> list[dict]:
    """Pre-train ``recipe`` for 40 steps of batch 8 on the real-text corpus with ``args``;
    the held-out evaluations every 10 steps."""
    from ember.cli import main

    assert main(["pretrain", "--recipe", recipe, "--data", str(wiki_bpe), "--out", str(run),
                 "--max-steps", "40", "--batch-size", "8", "--no-progress", *args,
                 "--set", "data.max_seq_length=64", "--set", "data.eval_examples=32",
                 "--set", "train.eval_every=10", "--set", "train.save_every=20"]) == 0
    evals = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["split"] == "eval"]
    assert [r["step"] for r in evals] == [10, 20, 30, 40]
    return evals


def test_gpt2_pretraining_on_real_text_lowers_held_out_loss(wiki_bpe, tmp_path):
    from ember.cli import main

    run = tmp_path / "run"
    evals = pretrain_evals(wiki_bpe, run, "gpt2-tiny", "--lr", "3e-3", "--set", "model.vocab_size=1000",
                           "--set", "model.hidden_size=64", "--set", "model.num_heads=2",
                           "--set", "model.intermediate_size=128")
    assert evals[-1]["lm_loss"] < evals[0]["lm_loss"] - 0.1
    assert evals[-1]["lm_loss"] < math.log(1000) - 0.5  # well below a uniform guess (6.9 nats)
    assert evals[-1]["ppl"] == pytest.approx(math.exp(evals[-1]["lm_loss"]), rel=1e-6)
    # The run folder generates text.
    assert main(["generate", str(run), "--prompt", "The city", "--max-new-tokens", "5"]) == 0


def test_gpt1_mini_recipe_pretrains_end_to_end_on_real_text(wiki_bpe, tmp_path):
    """The recipe's own architecture (4 post-LN layers x 256) and optimisation (peak lr, warm-up
    share, Adam betas); only the length, batch and block size are cut for the test."""
    from ember.cli import main
    from ember.config import load_yaml as read
    from ember.generate import load_causal_lm

    run = tmp_path / "gpt1-mini"
    evals = pretrain_evals(wiki_bpe, run, "gpt1-mini")
    assert evals[-1]["lm_loss"] < evals[0]["lm_loss"] - 0.1
    assert evals[-1]["lm_loss"] < math.log(1000) - 0.5
    saved = read(run / "config.yaml")
    assert saved["model"]["family"] == "gpt" and saved["model"]["pre_layer_norm"] is False
    assert saved["model"]["vocab_size"] == 1000  # sized to the corpus's tokenizer
    model, _ = load_causal_lm(run)
    assert model.backbone.final_norm is None and len(model.backbone.layers) == 4
    assert main(["generate", str(run), "--prompt", "The city", "--max-new-tokens", "5"]) == 0
