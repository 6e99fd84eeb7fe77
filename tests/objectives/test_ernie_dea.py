"""ERNIE's denoising entity auto-encoder (Zhang et al. 2019, §3.4): the corruption rates, eq. 7 over
the sentence's candidates, the loss going down, and continued pre-training on real Wikipedia text."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from conftest import KG_SAMPLE, real_data
from ember.config import ModelConfig, RunConfig
from ember.knowledge.ernie import FusionEncoder
from ember.objectives.ernie import MASK_ALIGNMENT, RANDOM_ENTITY, ErniePretraining

SPECIAL = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
CFG = ModelConfig(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32, max_position=64,
                  dropout=0.0, attention_dropout=0.0)


def objective(seed: int = 0) -> ErniePretraining:
    torch.manual_seed(seed)
    backbone = FusionEncoder(CFG, num_entities=30, entity_dim=8, fusion_layers=1, entity_heads=2)
    backbone.set_entity_vectors(torch.randn(30, 8))
    return ErniePretraining(backbone, SPECIAL, 0.15, 20, mlm_weight=1.0, dea_weight=1.0)


def examples(n: int, rng: np.random.Generator) -> list[dict]:
    out = []
    for i in range(n):
        ids = [2] + rng.integers(5, 50, 20).tolist() + [3]
        ents = [-1] * len(ids)
        for position, entity in zip((2, 6, 11), rng.choice(30, 3, replace=False)):
            ents[position] = int(entity)
        if i % 4 == 0:  # one sentence in four has a single entity: nothing for dEA to choose from
            ents = [-1] * len(ids)
            ents[3] = 7
        out.append({"input_ids": ids, "entity_ids": ents})
    return out


def test_dea_corruption_rates_candidates_and_targets():
    module = objective()
    rng = np.random.default_rng(0)
    data = examples(400, rng)
    batch = module.make_batch(data, np.random.default_rng(1))
    original = torch.full_like(batch["entity_ids"], -1)
    for row, e in enumerate(data):
        original[row, : len(e["entity_ids"])] = torch.tensor(e["entity_ids"])
    aligned = original >= 0
    masked = aligned & (batch["entity_ids"] == -1)
    swapped = aligned & (batch["entity_ids"] >= 0) & (batch["entity_ids"] != original)
    n = int(aligned.sum())
    assert abs(masked.sum() / n - MASK_ALIGNMENT) < 0.03
    assert abs(swapped.sum() / n - RANDOM_ENTITY) < 0.02  # (a random entity equal to the original counts as kept)
    assert (batch["entity_ids"][~aligned] == -1).all()  # nothing aligned where no mention was
    for row, e in enumerate(data):
        where = [i for i, x in enumerate(e["entity_ids"]) if x >= 0]
        candidates = batch["candidates"][row]
        if len(where) < 2:
            assert (batch["dea_targets"][row] == -100).all()
            continue
        for i in where:  # the target names the original entity among the sentence's own entities
            assert int(candidates[batch["dea_targets"][row, i]]) == e["entity_ids"][i]


def test_dea_logits_are_eq_7_dot_products_over_the_sentence_candidates():
    module = objective()
    hidden = torch.randn(1, 4, 16)
    targets = torch.tensor([[-100, 1, -100, 0]])
    candidates = torch.tensor([[5, 9, -1]])
    loss, metrics = module.dea_loss(hidden, targets, candidates)
    q = module.dea.linear(hidden[0, [1, 3]])  # linear(w_i^o)
    e = module.backbone.entity_vectors[[5, 9]]
    expected = torch.nn.functional.cross_entropy(q @ e.T, torch.tensor([1, 0]))  # the padding candidate excluded
    assert float(loss.detach()) == pytest.approx(float(expected.detach()), rel=1e-5)
    assert metrics["dea_loss"][1] == 2


def test_mlm_and_dea_losses_go_down_on_a_fixed_batch():
    torch.manual_seed(0)
    module = objective()
    batch = module.make_batch(examples(16, np.random.default_rng(2)), np.random.default_rng(3))
    optimizer = torch.optim.Adam(module.parameters(), lr=3e-3)
    first = None
    for _ in range(30):
        loss, metrics = module(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        first = first or metrics
    assert metrics["dea_loss"][0] < 0.5 * first["dea_loss"][0]
    assert metrics["mlm_loss"][0] / metrics["mlm_loss"][1] < first["mlm_loss"][0] / first["mlm_loss"][1]


def test_ernie_continued_pretraining_on_real_wikipedia_from_a_run(tmp_path):
    """`ember pretrain --recipe ernie-dea`: a (tiny) encoder run continues with MLM + dEA on real
    text; the result holds the fusion layers, which fine-tuning with --entities loads."""
    from ember.api import pretrain
    from ember.knowledge.graph import read_triples
    from ember.knowledge.transe import TransESettings, train_transe
    from ember.models import build_backbone
    from ember.runs.checkpoint import save_weights
    from ember.runs.folder import write_run_files
    from ember.runs.init import load_init
    from ember.tokenizers import load_tokenizer

    wiki = real_data("wiki-en", "AA", "wiki_00.gz")
    tok = real_data("checkpoints", "all-MiniLM-L6-v2", "tokenizer.json")
    torch.set_num_threads(1)
    init = tmp_path / "init"
    model = dataclasses.replace(CFG, vocab_size=load_tokenizer(tok).get_vocab_size())
    write_run_files(init, RunConfig(kind="pretrain", model=model), tok)
    save_weights({f"backbone.{k}": v for k, v in build_backbone(model).state_dict().items()},
                 init / "model.safetensors", {})
    entities = tmp_path / "transe"
    train_transe(read_triples(KG_SAMPLE), TransESettings(dim=8, epochs=1, held_out=0), progress=False).embeddings.save(
        entities)
    out = tmp_path / "ernie"
    result = pretrain("ernie-dea", out, data=wiki, progress=False, overrides=[
        f"knowledge.init={init}", f"knowledge.entities={entities}", "knowledge.max_sentences=120",
        "knowledge.entity_heads=2", "train.max_steps=4", "train.batch_size=8", "train.eval_every=4",
        "data.eval_examples=8", "data.max_seq_length=64"])
    assert {"dea_loss", "mlm_loss"} <= set(result.metrics)
    assert (out / "entities.tsv").is_file()
    start = load_init(out)  # fine-tuning from it: every weight has a home in the fusion encoder
    backbone = FusionEncoder(start.model, len(read_triples(KG_SAMPLE).entities()), 8, entity_heads=2)
    missing, unexpected = backbone.load_state_dict(start.state, strict=False)
    assert not unexpected and all(m.startswith("pooler.") for m in missing)
    assert any(k.startswith("fusion.") for k in start.state)
    from ember.errors import EmberError
    from ember.tasks.base import get_adapter
    from ember.tasks.task_model import build_task_module

    with pytest.raises(EmberError, match="ERNIE's fusion layers .*fine-tune with --entities DIR"):
        build_task_module(RunConfig(kind="finetune", model=start.model), get_adapter("sst2"), start.state, 0)
