"""ELECTRA pre-training: generator sizing, replaced-token labels, weight sharing, gradients,
learning on real text and fine-tuning from the discriminator (Clark et al. 2020)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from conftest import TINY_MODEL, real_data
from ember.recipes import recipe_path
from ember.config import (DataConfig, ElectraConfig, ModelConfig, apply_overrides, load_yaml, model_preset,
                          run_config_from_dict)
from ember.data.pairs import SegmentPair
from ember.errors import EmberError
from ember.objectives import build_objective
from ember.objectives.electra import (ElectraPretraining, generator_config, replace_tokens,
                                      sample_replacements)

SPECIAL = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
TINY = ModelConfig(family="electra", vocab_size=120, hidden_size=32, num_layers=2, num_heads=2,
                   intermediate_size=64, max_position=64, embedding_size=16, pooler=False,
                   dropout=0.0, attention_dropout=0.0)


def tiny_electra(seed: int = 0, **electra) -> ElectraPretraining:
    torch.manual_seed(seed)
    return ElectraPretraining(TINY, ElectraConfig(**electra), SPECIAL, DataConfig(nsp=False))


def test_electra_generator_is_a_quarter_of_the_discriminator():
    # App. C Table 6: ELECTRA-Small's generator has 1/4 of the hidden size, FFN and heads.
    small = generator_config(model_preset("electra-small"), ElectraConfig())
    assert (small.hidden_size, small.num_heads, small.intermediate_size, small.num_layers) == (64, 1, 256, 12)
    assert small.embedding_size == 128  # reads the discriminator's E=128 embeddings, projects 128 -> 64
    base = generator_config(model_preset("electra-base"), ElectraConfig(generator_size=1 / 3))
    assert (base.hidden_size, base.num_heads, base.intermediate_size) == (256, 4, 1024)  # heads of 64
    half = generator_config(TINY, ElectraConfig(generator_size=0.25, generator_layers=0.5))
    assert (half.hidden_size, half.num_heads, half.num_layers) == (8, 1, 1)
    with pytest.raises(EmberError, match="generator_size"):
        generator_config(TINY, ElectraConfig(generator_size=0.0))


def test_electra_rtd_labels_golden_seeded():
    """Two rows, six masked tokens each, every one either its original id 10 or the
    alternative 13 with equal probability. Gumbel-max picks the candidate with the larger
    uniform draw (g = -log(-log u) increases with u). torch.manual_seed(0) draws, at columns
    (10, 13) of the (12, 16) noise:
      row 0: (.349,.169) (.953,.373) (.585,.242) (.154,.701) (.935,.065) (.683,.687)
      row 1: (.124,.575) (.256,.204) (.601,.818) (.770,.109) (.940,.681) (.380,.771)
    so 13 (a replacement, label 1) wins at row 0 positions 4, 6 and row 1 positions 1, 3, 6."""
    original = torch.tensor([[2, 10, 10, 10, 10, 10, 10, 3], [2, 10, 10, 10, 10, 10, 10, 3]])
    where = torch.zeros_like(original, dtype=torch.bool)
    where[:, 1:7] = True
    logits = torch.full((12, 16), -1e9)
    logits[:, [10, 13]] = 0.0
    torch.manual_seed(0)
    sampled = sample_replacements(logits, temperature=1.0)
    ids, labels = replace_tokens(original, where, sampled)
    expected = torch.tensor([[0, 0, 0, 0, 1, 0, 1, 0], [0, 1, 0, 1, 0, 0, 1, 0]], dtype=torch.float)
    torch.testing.assert_close(labels, expected)
    torch.testing.assert_close(ids, torch.where(expected.bool(), 13, original))
    # A sample equal to the original is "original": a generator that always returns the
    # original token produces no positive labels at all.
    certain = torch.full((12, 16), -1e9)
    certain[:, 10] = 0.0
    _, labels = replace_tokens(original, where, sample_replacements(certain))
    assert labels.sum() == 0


def test_electra_sampling_follows_generator_softmax_and_temperature():
    torch.manual_seed(1)
    probs = torch.tensor([0.5, 0.3, 0.2])
    logits = probs.log().expand(20000, 3)
    freq = torch.bincount(sample_replacements(logits), minlength=3).float() / 20000
    torch.testing.assert_close(freq, probs, atol=0.015, rtol=0)  # 3 sigma ~ 0.011
    # temperature 0.5 squares and renormalises the probabilities: (25, 9, 4) / 38
    freq = torch.bincount(sample_replacements(logits, temperature=0.5), minlength=3).float() / 20000
    torch.testing.assert_close(freq, torch.tensor([25, 9, 4]) / 38.0, atol=0.015, rtol=0)
    with pytest.raises(EmberError, match="temperature"):
        sample_replacements(logits, temperature=0.0)


def test_electra_make_batch_masks_15_percent_85_as_mask_15_unchanged():
    module = tiny_electra()
    rng = np.random.default_rng(0)
    pairs = [SegmentPair(rng.integers(5, 120, size=60), None, 0) for _ in range(200)]
    batch = module.make_batch(pairs, np.random.default_rng(1))
    ids, labels = batch["input_ids"].numpy(), batch["labels"].numpy()
    chosen = labels != -100
    assert (chosen.sum(1) == 9).all()  # round(0.15 * 60)
    assert not chosen[:, 0].any() and not chosen[:, 61].any()  # never [CLS] / [SEP]
    originals = np.stack([np.concatenate([[2], p.tokens_a, [3]]) for p in pairs])
    np.testing.assert_array_equal(labels[chosen], originals[chosen])
    as_mask = (ids[chosen] == 4).mean()
    assert abs(as_mask - 0.85) < 0.02  # reference pretrain_helpers.mask: 85% [MASK] ...
    assert ((ids[chosen] == 4) | (ids[chosen] == originals[chosen])).all()  # ... the rest unchanged
    np.testing.assert_array_equal(ids[~chosen], originals[~chosen])
    assert batch["attention_mask"].all() and not batch["token_type_ids"].any()


def forced_batch(module: ElectraPretraining, forced: int):
    """A batch with masked positions, some of whose originals equal ``forced``."""
    ids = torch.randint(5, 120, (2, 12), generator=torch.Generator().manual_seed(3))
    ids[:, 0], ids[:, -1] = 2, 3
    ids[0, 4] = ids[1, 2] = forced
    labels = torch.full_like(ids, -100)
    masked = [(0, 2), (0, 4), (0, 7), (1, 2), (1, 5)]
    for r, c in masked:
        labels[r, c] = ids[r, c]
        ids[r, c] = SPECIAL["mask"]
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # padding
    ids[1, 9:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids), "labels": labels}


def test_electra_correct_generator_samples_are_labelled_original_in_forward():
    module = tiny_electra()
    forced = 77
    with torch.no_grad():  # the generator now puts all its mass on token 77
        module.generator_head.bias[forced] = 1e4
    batch = forced_batch(module, forced)
    s = module.step(batch)
    where = batch["labels"] != -100
    assert (s.disc_ids[where] == forced).all()
    expected = torch.zeros(2, 12)
    expected[0, 2] = expected[0, 7] = expected[1, 5] = 1.0  # (0, 4) and (1, 2) were 77 already
    torch.testing.assert_close(s.rtd_labels, expected)
    # unmasked positions keep their original ids; padding is not scored
    original = torch.where(where, batch["labels"], batch["input_ids"])
    assert torch.equal(s.disc_ids[~where], original[~where])
    assert s.real.sum() == 21 and s.rtd_logits.shape == (2, 12)
    loss, metrics = module(batch)
    assert metrics["replaced_frac"] == (3, 5) and metrics["rtd_loss"][1] == 21
    torch.testing.assert_close(loss, s.mlm_loss + 50.0 * s.rtd_loss)


def test_electra_generator_shares_embedding_tensors_with_discriminator():
    module = tiny_electra()
    assert module.generator.embeddings is None
    assert not [k for k in module.state_dict() if k.startswith("generator.embeddings")]
    assert module.generator.embed_project.weight.shape == (8, 16)  # E=16 -> generator H=8
    assert module.generator_head.dense.weight.shape == (16, 8)  # H_G -> E, tied (V, E) decoder
    s = module.step(forced_batch(module, 50))
    shared = dict(module.backbone.embeddings.named_parameters())
    for name, loss in (("mlm", s.mlm_loss), ("rtd", s.rtd_loss)):
        grads = torch.autograd.grad(loss, list(shared.values()), retain_graph=True, allow_unused=True)
        for (param, grad) in zip(shared, grads):
            assert grad is not None and grad.abs().sum() > 0, f"{name} loss gives no gradient to {param}"


def test_electra_no_gradient_flows_through_sampling():
    module = tiny_electra()
    s = module.step(forced_batch(module, 50))
    s.rtd_loss.backward(retain_graph=True)
    for name, p in module.named_parameters():
        if name.startswith(("generator.", "generator_head.")):
            assert p.grad is None or not p.grad.any(), f"discriminator loss reached {name}"
    module.zero_grad(set_to_none=True)
    s.mlm_loss.backward()
    for name, p in module.named_parameters():
        if name.startswith(("backbone.layers", "backbone.embed_project", "rtd_head.")):
            assert p.grad is None, f"generator loss reached {name}"


def tiny_electra_config(prepared, *extra):
    values = apply_overrides(load_yaml(recipe_path("electra-mini")),
                             TINY_MODEL + ["model.embedding_size=16", f"data.prepared={prepared}", *extra])
    return run_config_from_dict(values)


def test_electra_recipes_build_the_papers_shapes():
    small = run_config_from_dict(load_yaml(recipe_path("electra-small")))
    assert small.objective == "electra" and small.model == model_preset("electra-small")
    assert (small.electra.generator_size, small.electra.discriminator_weight, small.train.lr) == (0.25, 50.0, 5e-4)
    mini = run_config_from_dict(load_yaml(recipe_path("electra-mini")))
    module = build_objective(dataclasses.replace(mini, model=dataclasses.replace(mini.model, vocab_size=500)),
                             SPECIAL)
    assert module.pair_mode == "none" and module.generator.config.hidden_size == 64


@pytest.fixture(scope="module")
def electra_run(wiki_prepared, tmp_path_factory):
    from ember.train.pretrain import run_pretraining

    run = tmp_path_factory.mktemp("electra") / "run"
    cfg = tiny_electra_config(wiki_prepared, "train.max_steps=60", "train.lr=5e-3", "train.log_every=1",
                              "train.eval_every=60", "train.save_every=60", "train.batch_size=16",
                              "train.warmup_ratio=0.1")
    run_pretraining(cfg, run, progress=False)
    return run


def test_electra_pretraining_loss_goes_down_on_real_text(electra_run):
    from ember.train.logging import MetricsLogger

    records = MetricsLogger.read(electra_run / "metrics.jsonl")
    train = [r for r in records if r["split"] == "train"]
    first, last = train[:5], train[-10:]
    mean = lambda rows, key: float(np.mean([r[key] for r in rows]))  # noqa: E731
    # Generator: from ~ln(V) = 7.6 towards the unigram entropy.
    assert mean(last, "mlm_loss") < mean(first, "mlm_loss") - 0.5
    # Discriminator: from ~ln 2 to the replaced-token prior (~14% of real tokens are replaced,
    # binary entropy 0.40). Going further needs context: the generator learns the unigram
    # distribution within these steps, so its samples are no longer given away by being rare
    # tokens - the point of ELECTRA's learned generator (Clark et al. 2020, §3.2).
    assert mean(first, "rtd_loss") > 0.6 and mean(last, "rtd_loss") < 0.45
    assert mean(last, "loss") < mean(first, "loss") - 10.0
    evals = [r for r in records if r["split"] == "eval"]
    assert evals and {"mlm_loss", "mlm_acc", "rtd_loss", "rtd_acc", "replaced_frac",
                      "rtd_precision", "rtd_recall"} <= set(evals[-1])
    assert (electra_run / "model.safetensors").is_file()


def test_electra_finetune_init_loads_the_discriminator_only(electra_run, wiki_prepared):
    from ember.runs.checkpoint import load_weights
    from ember.tasks.base import get_adapter
    from ember.tasks.task_model import build_task_module
    from ember.runs.init import load_init

    cfg, state, tokenizer = load_init(str(electra_run))
    assert cfg.family == "electra" and cfg.hidden_size == 32 and tokenizer.is_file()
    saved = load_weights(electra_run / "model.safetensors")
    assert any(k.startswith("generator.") for k in saved)
    assert set(state) == {k.removeprefix("backbone.") for k in saved if k.startswith("backbone.")}
    run_cfg = tiny_electra_config(wiki_prepared)
    classifier = build_task_module(dataclasses.replace(run_cfg, model=cfg), get_adapter("sst2"), state, pad_id=0)
    for name, value in classifier.backbone.state_dict().items():
        torch.testing.assert_close(value, saved[f"backbone.{name}"], atol=0, rtol=0)


def test_electra_finetune_from_pretraining_run_on_sst2(electra_run, tmp_path):
    """The `ember finetune --init <electra run>` path end to end, on a slice of real SST-2."""
    from ember.config import RunConfig, TaskConfig, TrainConfig
    from ember.train.finetune import run_finetuning
    from ember.runs.init import load_init

    real_data("glue", "SST-2")
    model, state, tokenizer = load_init(str(electra_run))
    cfg = RunConfig(kind="finetune", model=model, task=TaskConfig(name="sst2", max_length=64, epochs=1.0),
                    train=TrainConfig(lr=1e-3, batch_size=32, eval_every=0, save_every=0, log_every=10))
    result = run_finetuning(cfg, tmp_path / "ft", state, tokenizer, train_limit=128, progress=False)
    assert 0.0 <= result["metrics"]["accuracy"] <= 1.0 and result["steps"] == 4


def test_electra_static_masks_repeat_per_example_and_use_the_masking_scheme():
    """data.static_masks=N (RoBERTa §4.1) fixes each sequence's masks - positions and the
    [MASK]-or-keep choice - by (index, epoch mod N), whatever the batch RNG."""
    torch.manual_seed(0)
    module = ElectraPretraining(TINY, ElectraConfig(), SPECIAL, DataConfig(nsp=False, static_masks=2))
    tokens = np.arange(5, 65)
    first = module.make_batch([SegmentPair(tokens, None, 0, (7, 0))], np.random.default_rng(1))
    again = module.make_batch([SegmentPair(tokens, None, 0, (7, 2))], np.random.default_rng(2))
    other = module.make_batch([SegmentPair(tokens, None, 0, (7, 1))], np.random.default_rng(1))
    assert torch.equal(first["input_ids"], again["input_ids"]) and torch.equal(first["labels"], again["labels"])
    assert not torch.equal(first["labels"], other["labels"])


def test_electra_whole_word_masking_chooses_whole_words(tmp_path):
    from conftest import make_wordpiece
    from ember.config import RunConfig

    path = tmp_path / "tokenizer.json"
    make_wordpiece(["un", "##believ", "##able", "the", "cat", "##s"]).save(str(path))
    cfg = RunConfig(objective="electra", model=dataclasses.replace(TINY, vocab_size=11),
                    data=DataConfig(nsp=False, masking="whole_word", mask_prob=0.3))
    module = build_objective(cfg, {**SPECIAL, "tokenizer_path": str(path)})
    word = [5, 6, 7, 8, 9, 10]  # un ##believ ##able the cat ##s
    chosen = module.make_batch([SegmentPair(np.array(word * 5), None, 0)] * 50,
                               np.random.default_rng(0))["labels"].numpy()[:, 1:-1] != -100
    pieces = chosen.reshape(50, 5, 6)
    # "un ##believ ##able" and "cat ##s" are masked together or not at all
    assert (pieces[..., 0] == pieces[..., 1]).all() and (pieces[..., 1] == pieces[..., 2]).all()
    assert (pieces[..., 4] == pieces[..., 5]).all() and chosen.any()


def test_electra_run_exports_its_discriminator_to_hf(electra_run, tmp_path):
    """`ember convert` of an ELECTRA run: ElectraForPreTraining with the discriminator's outputs."""
    transformers = pytest.importorskip("transformers")
    from hf_interop_helpers import assert_close_where, load_hf, padded_batch

    from ember.interop.convert import export_hf
    from ember.runs.checkpoint import load_weights
    from ember.runs.folder import load_run_config

    out = export_hf(electra_run, tmp_path / "hf")
    hf = load_hf(transformers.ElectraForPreTraining, out)
    cfg = load_run_config(electra_run)
    module = ElectraPretraining(cfg.model, cfg.electra, SPECIAL, cfg.data).eval()
    module.load_state_dict(load_weights(electra_run / "model.safetensors"), strict=True)
    ids, mask = padded_batch(2000, 0, length=40)
    with torch.no_grad():
        assert_close_where(module.logits({"input_ids": ids, "attention_mask": mask}),
                           hf(input_ids=ids, attention_mask=mask).logits, mask)


def test_electra_eval_mode_samples_are_reproducible_whatever_the_global_rng():
    module = tiny_electra().eval()
    batch = forced_batch(module, 50)
    torch.manual_seed(1)
    a = module.step(batch)
    torch.manual_seed(2)
    b = module.step(batch)
    assert torch.equal(a.sampled, b.sampled) and torch.equal(a.rtd_labels, b.rtd_labels)
    module.train()
    torch.manual_seed(1)
    c = module.step(batch)
    torch.manual_seed(2)
    d = module.step(batch)
    assert not torch.equal(c.sampled, d.sampled)  # training draws follow the (per-step seeded) global RNG
