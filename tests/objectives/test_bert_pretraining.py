"""BERT pre-training: masking statistics, the sparse MLM head, segment pairs, learning."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember.config import DataConfig, ModelConfig, apply_overrides, load_yaml, run_config_from_dict
from ember.data.pairs import SegmentPairDataset
from ember.data.shards import TokenCorpus
from ember.errors import EmberError
from ember.models import build_backbone
from ember.objectives.bert import BertPretraining
from ember.objectives.mlm import mask_tokens
from ember.recipes import recipe_path
from conftest import TINY_MODEL

SPECIAL = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}


def test_mlm_masks_15_percent_with_80_10_10_split():
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 1000, size=(400, 128))
    maskable = np.ones_like(ids, dtype=bool)
    maskable[:, 0] = maskable[:, -1] = False  # [CLS] ... [SEP]
    maskable[:200, 100:] = False  # padding in half the rows
    corrupted, labels = mask_tokens(ids, maskable, rng, mask_id=4, vocab_size=1000)
    chosen = labels != -100
    # exactly round(15% of the maskable tokens) per row, never a special or padding position
    np.testing.assert_array_equal(chosen.sum(1), np.rint(maskable.sum(1) * 0.15))
    assert not (chosen & ~maskable).any()
    np.testing.assert_array_equal(labels[chosen], ids[chosen])
    as_mask = (corrupted[chosen] == 4).mean()
    unchanged = (corrupted[chosen] == ids[chosen]).mean()
    assert abs(as_mask - 0.8) < 0.02
    assert abs(unchanged - 0.1) < 0.02  # 10% kept (+ random draws that hit the same id)
    np.testing.assert_array_equal(corrupted[~chosen], ids[~chosen])


def test_mlm_masks_are_fresh_each_time_a_sequence_is_seen():
    ids = np.arange(5, 133)[None].repeat(2, 0)
    maskable = np.ones_like(ids, dtype=bool)
    _, a = mask_tokens(ids, maskable, np.random.default_rng([0, 1]), 4, 1000)
    _, b = mask_tokens(ids, maskable, np.random.default_rng([0, 2]), 4, 1000)
    assert not np.array_equal(a, b)


def test_sparse_mlm_head_matches_full_head_loss_and_gradients():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=300, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                      max_position=64, dropout=0.0, attention_dropout=0.0, pooler=False)
    module = BertPretraining(build_backbone(cfg), SPECIAL, DataConfig(nsp=False))
    ids = torch.randint(5, 300, (4, 20))
    labels = torch.full_like(ids, -100)
    labels[:, 3] = ids[:, 3]
    labels[1:, 11] = ids[1:, 11]
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
             "token_type_ids": torch.zeros_like(ids), "labels": labels}
    sparse_loss, _ = module(batch)
    sparse_grads = torch.autograd.grad(sparse_loss, list(module.parameters()))
    full_logits, _ = module.logits(batch)  # (B, T, V) over every position, as run_mlm does
    full_loss = torch.nn.functional.cross_entropy(full_logits.view(-1, 300), labels.view(-1))
    full_grads = torch.autograd.grad(full_loss, list(module.parameters()))
    torch.testing.assert_close(sparse_loss, full_loss, atol=1e-6, rtol=1e-6)
    for a, b in zip(sparse_grads, full_grads):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_nsp_pairs_are_half_random_and_true_pairs_continue_the_document(wiki_prepared):
    corpus = TokenCorpus(wiki_prepared, "train")
    data = SegmentPairDataset(corpus, max_seq_length=64, pair_mode="nsp", seed=0)
    labels, random_b_inside_chunk = [], []
    for i in range(min(len(data), 600)):
        pair = data.example(i, epoch=0)
        assert len(pair.tokens_a) + len(pair.tokens_b) <= 61
        assert len(pair.tokens_a) > 0 and len(pair.tokens_b) > 0
        labels.append(pair.label)
        doc, first, end = data.chunks[i]
        chunk = corpus.sentences(int(first), int(end))
        inside = lambda seg: seg.astype(chunk.dtype).tobytes() in chunk.tobytes()  # noqa: E731
        assert inside(pair.tokens_a)  # A is a (possibly trimmed) run of the chunk
        if pair.label == 0:  # B is the chunk's true continuation, after A
            assert inside(pair.tokens_b)
            a_at = chunk.tobytes().index(pair.tokens_a.astype(chunk.dtype).tobytes())
            assert chunk.tobytes().index(pair.tokens_b.astype(chunk.dtype).tobytes()) > a_at
        else:
            random_b_inside_chunk.append(inside(pair.tokens_b))
    assert np.mean(random_b_inside_chunk) < 0.05  # random B comes from another document
    assert 0.4 < np.mean(labels) < 0.65  # 50% random, plus one-sentence chunks (always random)
    # the same (epoch, index) gives the same pair; another epoch draws a new split
    a, b = data.example(5, 0), data.example(5, 0)
    np.testing.assert_array_equal(a.tokens_a, b.tokens_a)


def test_sop_pairs_swap_half_of_the_segments(wiki_prepared):
    corpus = TokenCorpus(wiki_prepared, "train")
    data = SegmentPairDataset(corpus, max_seq_length=64, pair_mode="sop", seed=0)
    labels = [data.example(i).label for i in range(min(len(data), 400))]
    assert 0.4 < np.mean(labels) < 0.6


def tiny_config(prepared, *extra):
    values = apply_overrides(load_yaml(recipe_path("bert-mini")),
                             TINY_MODEL + [f"data.prepared={prepared}", *extra])
    return run_config_from_dict(values)


def test_bert_pretraining_loss_goes_down_on_real_text(wiki_prepared, tmp_path):
    from ember.train.logging import MetricsLogger
    from ember.train.pretrain import run_pretraining

    cfg = tiny_config(wiki_prepared, "train.max_steps=60", "train.lr=2e-3", "train.log_every=1",
                      "train.eval_every=60", "train.save_every=60", "train.batch_size=16",
                      "train.warmup_ratio=0.1")
    run_pretraining(cfg, tmp_path / "run", progress=False)
    records = MetricsLogger.read(tmp_path / "run" / "metrics.jsonl")
    train = [r["mlm_loss"] for r in records if r["split"] == "train"]
    assert np.mean(train[-10:]) < np.mean(train[:5]) - 0.6  # from ~ln(V)=7.6 towards unigram entropy
    evals = [r for r in records if r["split"] == "eval"]
    assert evals and {"mlm_loss", "mlm_acc", "nsp_acc", "nsp_loss"} <= set(evals[-1])
    assert (tmp_path / "run" / "model.safetensors").is_file()
    assert (tmp_path / "run" / "curves.png").is_file()
    assert list((tmp_path / "run" / "tb").iterdir())


def test_pretrain_rejects_sequences_longer_than_positions(wiki_prepared, tmp_path):
    from ember.train.pretrain import run_pretraining

    cfg = tiny_config(wiki_prepared, "data.max_seq_length=128")
    with pytest.raises(EmberError, match="max_position"):
        run_pretraining(cfg, tmp_path / "run", progress=False)


def test_pretrain_refuses_to_mix_into_an_existing_run(wiki_prepared, tmp_path):
    from ember.train.pretrain import run_pretraining

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "keep.txt").write_text("earlier work")
    cfg = tiny_config(wiki_prepared, "train.max_steps=2")
    with pytest.raises(EmberError, match="--resume"):
        run_pretraining(cfg, tmp_path / "run", progress=False)
    assert (tmp_path / "run" / "keep.txt").read_text() == "earlier work"


@pytest.mark.slow
def test_compiled_training_matches_eager_losses_and_checkpoint_names(wiki_prepared, tmp_path):
    """train.compile=true (torch.compile, inductor) changes speed, not results: the same
    per-step losses as eager mode (dropout off: compiled dropout draws other random numbers),
    and the saved weights keep their plain names (no `_orig_mod.` prefix)."""
    from safetensors.torch import load_file

    from ember.train.logging import MetricsLogger
    from ember.train.pretrain import run_pretraining

    losses, names = {}, {}
    for compiled in (False, True):
        cfg = tiny_config(wiki_prepared, "train.max_steps=4", "train.log_every=1", "train.eval_every=0",
                          "train.save_every=4", "train.batch_size=8", "model.dropout=0.0",
                          "model.attention_dropout=0.0", f"train.compile={str(compiled).lower()}")
        run = tmp_path / f"compiled-{compiled}"
        run_pretraining(cfg, run, progress=False)
        losses[compiled] = [r["loss"] for r in MetricsLogger.read(run / "metrics.jsonl") if r["split"] == "train"]
        names[compiled] = set(load_file(str(run / "model.safetensors")))
    assert len(losses[True]) == 4
    np.testing.assert_allclose(losses[True], losses[False], rtol=2e-4)
    assert names[True] == names[False]
