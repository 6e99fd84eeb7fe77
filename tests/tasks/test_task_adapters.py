"""The task-adapter registry: GLUE, CoNLL-2003 NER and (lazily) SQuAD behind one interface."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import make_wordpiece, real_data
from ember.config import MODEL_PRESETS, RunConfig, TrainConfig
from ember.errors import EmberError
from ember.tasks import base
from ember.tasks.glue_adapter import GlueAdapter
from ember.tasks.base import TaskAdapter, get_adapter, task_names
from ember.tasks.readers.glue import get_task
from ember.tasks.tagging import ConllNerAdapter, TokenClassifier, encode_words
from ember.runs.checkpoint import save_weights
from ember.tasks.task_model import build_task_module, load_task_module


def test_registry_maps_glue_and_ner_names_to_adapters():
    sst2 = get_adapter("SST-2")
    assert isinstance(sst2, GlueAdapter) and isinstance(sst2, TaskAdapter)
    assert (sst2.name, sst2.display_name, sst2.main_metric) == ("sst2", "SST-2", "accuracy")
    assert sst2.label_names() == ["negative", "positive"] and get_adapter("stsb").label_names() == ["score"]
    assert get_adapter(get_task("rte")).spec is get_task("rte")
    for name in ("conll2003", "CoNLL-2003", "ner"):
        ner = get_adapter(name)
        assert isinstance(ner, ConllNerAdapter) and isinstance(ner, TaskAdapter)
    assert (ner.main_metric, ner.report_splits, ner.hparams.learning_rate) == ("f1", ("test",), 5e-5)
    assert {"sst2", "conll2003", "squad", "squad2"} <= set(task_names())


def test_registry_unknown_or_unloadable_task_is_a_clear_error(monkeypatch):
    with pytest.raises(EmberError, match=r"unknown task 'nosuch'; known tasks: .*conll2003"):
        get_adapter("nosuch")
    monkeypatch.setitem(base.LAZY_ADAPTERS, "squad", "ember.tasks.no_such_module:SquadAdapter")
    with pytest.raises(EmberError, match=r"task 'squad' needs ember.tasks.no_such_module.SquadAdapter"):
        get_adapter("squad")


def test_glue_adapter_loads_the_reader_examples_encoded_with_the_tokenizer_template():
    real_data("glue", "RTE")
    tok = make_wordpiece(["the", "a", "is", "not"])
    examples, features = get_adapter("rte").load("dev", tok, 32, limit=20)
    from ember.tasks.featurize import encode_examples
    from ember.tasks.readers.glue import read_examples

    expected = read_examples(get_task("rte"), "dev", limit=20)
    assert examples == expected and features == encode_examples(expected, tok, 32).features
    assert features[0]["input_ids"][0] == tok.token_to_id("[CLS]") and len(features) == 20


def test_finetune_defaults_come_from_the_adapter_and_settings_override_them():
    from ember.api.finetune import finetune_config
    from ember.config import ModelConfig

    cfg = finetune_config("conll2003", ModelConfig(), seed=3)
    assert (cfg.task.name, cfg.train.lr, cfg.train.batch_size, cfg.task.max_length) == ("conll2003", 5e-5, 32, 128)
    assert cfg.train.seed == 3
    cola = finetune_config("cola", ModelConfig(), lr=1e-4, overrides=["train.warmup_ratio=0.2"])
    assert (cola.task.name, cola.train.lr, cola.train.warmup_ratio, cola.task.epochs) == ("cola", 1e-4, 0.2, 3.0)
    ulmfit = finetune_config("sst2", ModelConfig(), ulmfit=True, schedule="linear")  # explicit settings win
    assert (ulmfit.task.layer_lr_decay, ulmfit.train.schedule, ulmfit.task.gradual_unfreeze) == (1 / 2.6, "linear", True)
    with pytest.raises(EmberError, match="unknown fine-tuning setting"):
        finetune_config("sst2", ModelConfig(), learning_rate=1e-4)


def _tiny(preset: str):
    cfg = MODEL_PRESETS[preset]
    small = dict(vocab_size=16, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                 max_position=40, dropout=0.0, attention_dropout=0.0)
    if cfg.embedding_size and cfg.embedding_size != cfg.hidden_size:
        small["embedding_size"] = 8  # keep ALBERT/ELECTRA's factorized embeddings (E < H)
    return dataclasses.replace(cfg, **small)


@pytest.mark.parametrize("preset", ["bert-tiny", "roberta-mini", "albert-mini", "electra-mini", "distilbert"])
def test_ner_head_trains_and_reloads_on_every_encoder_family(preset, tmp_path):
    tok = make_wordpiece(["the", "w1", "##s", "a"])
    cfg = RunConfig(kind="finetune", model=_tiny(preset), train=TrainConfig(seed=1))
    adapter = get_adapter("conll2003")
    module = build_task_module(cfg, adapter, None, pad_id=0)
    assert isinstance(module, TokenClassifier) and module.backbone.config.family == cfg.model.family
    features = encode_words([["the", "w1s", "a"], ["a", "the"]], tok, 16, label_seqs=[[1, 2, 0], [5, 6]]).features
    batch = module.make_batch(features, None)
    loss, metrics = module(batch)
    assert torch.isfinite(loss) and metrics["word_accuracy"][1] == 5  # 5 words carry labels
    loss.backward()
    # the loss reaches the encoder's first layer, not only the new head
    first = module.backbone.layers[0]
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in first.parameters())
    save_weights(module.state_dict(), tmp_path / "model.safetensors", {"task": adapter.name})
    again = load_task_module(tmp_path, cfg, adapter, pad_id=0)
    assert [p.tolist() for p in again.predict(features)] == [p.tolist() for p in module.eval().predict(features)]
