"""`ember finetune` transfer options on every task type: feature-based transfer (frozen encoder +
ScalarMix), layer-wise lr decay, STLR, gradual unfreezing, early stopping, predict inputs."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from conftest import make_wordpiece, real_data
from ember.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from ember.errors import EmberError
from ember.tasks.base import get_adapter
from ember.tasks.qa.task import SquadAdapter
from ember.data.in_memory import InMemoryData
from ember.tasks.task_model import build_task_module
from ember.train.finetune import check_options
from ember.train.layerwise import gradual_unfreezing, lr_scale_fn
from ember.train.loop import Trainer
from ember.train.optim import build_optimizer, lr_factor, set_lr, stlr_factor

TINY = ModelConfig(vocab_size=2000, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                   max_position=128)


def cfg_for(task: str, model: ModelConfig = TINY, **task_options) -> RunConfig:
    return RunConfig(kind="finetune", model=model, task=TaskConfig(name=task, max_length=64, **task_options),
                     train=TrainConfig(lr=1e-2, batch_size=8, warmup_steps=1, max_steps=6, eval_every=0,
                                       save_every=0, log_every=100))


@pytest.fixture(scope="module")
def wiki_tokenizer(wiki_prepared):
    from ember.tokenizers import load_tokenizer

    return load_tokenizer(wiki_prepared / "tokenizer.json")


# -- feature-based transfer --------------------------------------------------------------------
@pytest.mark.parametrize("task", ["sst2", "conll2003", "squad2"])
def test_features_keep_the_encoder_frozen_and_learn_the_layer_mix_on_real_text(task, wiki_tokenizer, tmp_path):
    real_data("squad2-dev-half" if task == "squad2" else "conll2003" if task == "conll2003" else "glue")
    adapter = SquadAdapter("squad2", doc_stride=32, max_query_length=24) if task == "squad2" else get_adapter(task)
    cfg = cfg_for(task, features=True)
    _, features = adapter.load("train", wiki_tokenizer, 64, limit=32)
    module = build_task_module(cfg, adapter, None, pad_id=0)
    encoder, mix = module.backbone.encoder, module.backbone.mix
    frozen = {k: v.clone() for k, v in encoder.state_dict().items()}
    mix_before = mix.weights.detach().clone()
    head_before = {n: p.detach().clone() for n, p in module.named_parameters() if not n.startswith("backbone.")}
    trainer = Trainer(module, InMemoryData(features), cfg.train, tmp_path, progress=False)
    in_optimizer = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert not any(id(p) in in_optimizer for p in encoder.parameters())
    assert id(mix.weights) in in_optimizer and id(mix.gamma) in in_optimizer
    module.train()
    assert not any(m.training for m in encoder.modules())  # no dropout in the frozen encoder
    trainer.train()
    for k, v in encoder.state_dict().items():
        assert torch.equal(v, frozen[k]), k
    assert not torch.allclose(mix.weights, mix_before)
    assert abs(sum(module.backbone.layer_weights()) - 1.0) < 1e-6 and len(module.backbone.layer_weights()) == 3
    assert all(not torch.equal(p, head_before[n]) for n, p in module.named_parameters() if n in head_before)


def test_features_pooled_vector_is_the_masked_mean_of_the_mixed_states():
    from ember.tasks.families.feature_transfer import FeatureBackbone
    from ember.models import build_backbone

    torch.manual_seed(0)
    fb = FeatureBackbone(build_backbone(dataclasses.replace(TINY, vocab_size=50)), feature_layers=0).eval()
    ids = torch.tensor([[2, 7, 8, 3, 0, 0]])
    mask = (ids != 0).long()
    out = fb(ids, mask)
    hidden = fb.encoder(ids, mask, output_hidden_states=True).hidden_states
    s = torch.softmax(fb.mix.weights, 0)
    expected = fb.mix.gamma * sum(w * h for w, h in zip(s, hidden))
    torch.testing.assert_close(out.last_hidden_state, expected)
    torch.testing.assert_close(out.pooled, expected[:, :4].mean(1))
    # padding does not change the real tokens' pooled vector
    torch.testing.assert_close(fb(ids[:, :4], mask[:, :4]).pooled, out.pooled, atol=1e-5, rtol=0)


def test_features_with_layer_options_is_a_clear_error():
    with pytest.raises(EmberError, match="nothing to act on"):
        check_options(cfg_for("sst2", features=True, layer_lr_decay=0.8))
    with pytest.raises(EmberError, match=r"must be in \(0, 1\]"):
        check_options(cfg_for("sst2", layer_lr_decay=2.6))


# -- layer-wise lr decay -----------------------------------------------------------------------
def expected_depth(name: str, share: str, L: int) -> int:
    """Depth from the parameter's name alone (independent of ember.train.layerwise)."""
    if name.startswith(("backbone.embeddings.", "backbone.embed_project.")):
        return 0
    if name.startswith("backbone.layers."):
        i = int(name.split(".")[2])
        if share == "all" or (share == "attention" and i == 0 and ".attention" in name):
            return L  # a shared (sub-)layer runs at every depth: it takes the top one
        return i + 1
    if name.startswith("backbone.final_norm."):
        return L
    return L + 1  # pooler and task head


@pytest.mark.parametrize("share", ["none", "all", "attention"])
def test_layer_lr_decay_gives_every_parameter_the_formula_lr(share):
    L, decay, lr = 3, 0.5, 1e-3
    model = dataclasses.replace(TINY, num_layers=L, share_layers=share, embedding_size=16)
    module = build_task_module(cfg_for("sst2", model), get_adapter("sst2"), None, pad_id=0)
    opt = build_optimizer(module, TrainConfig(lr=lr, weight_decay=0.01), lr_scale_fn(module, decay))
    set_lr(opt, lr)
    lr_of = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    wd_of = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(module.parameters()))
    for name, p in module.named_parameters():
        assert lr_of[id(p)] == pytest.approx(lr * decay ** (L + 1 - expected_depth(name, share, L))), name
        no_decay = name.endswith("bias") or "norm" in name
        assert wd_of[id(p)] == (0.0 if no_decay else 0.01), name
    assert lr_of[id(module.classifier.weight)] == lr
    assert lr_of[id(module.backbone.embeddings.word.weight)] == pytest.approx(lr * decay ** (L + 1))


def test_trainer_applies_layer_scales_at_every_step(tmp_path):
    tok = make_wordpiece(["good", "bad", "film"])
    feats = [{"input_ids": tok.encode(t).ids, "token_type_ids": [0] * len(tok.encode(t).ids), "label": y}
             for t, y in (("good film", 1), ("bad film", 0))] * 4
    cfg = cfg_for("sst2", dataclasses.replace(TINY, vocab_size=10))
    module = build_task_module(cfg, get_adapter("sst2"), None, pad_id=0)
    trainer = Trainer(module, InMemoryData(feats), cfg.train, tmp_path, progress=False,
                      lr_scale=lr_scale_fn(module, 0.8))
    trainer.train()
    base = cfg.train.lr * lr_factor(cfg.train.max_steps - 1, cfg.train)
    assert sorted({round(g["lr"] / base, 9) for g in trainer.optimizer.param_groups}) == \
        sorted({round(0.8 ** k, 9) for k in range(TINY.num_layers + 2)})


# -- slanted triangular learning rates ---------------------------------------------------------
def test_stlr_matches_ulmfit_equation_3():
    # Howard & Ruder 2018, eq. 3 with T = 1000, cut_frac = 0.1, ratio = 32: cut = 100.
    cfg = TrainConfig(schedule="stlr", max_steps=1000, warmup_ratio=0.5)  # warm-up is STLR's own
    for t, p in ((0, 0.0), (50, 0.5), (100, 1.0), (550, 1 - 450 / 900), (999, 1 - 899 / 900)):
        assert lr_factor(t, cfg) == pytest.approx((1 + p * 31) / 32)
    assert lr_factor(0, cfg) == pytest.approx(1 / 32) and max(lr_factor(t, cfg) for t in range(1000)) == 1.0
    assert stlr_factor(10, 20, cut_frac=0.5, ratio=4.0) == pytest.approx(1.0)
    with pytest.raises(EmberError, match="cut_frac"):
        stlr_factor(0, 10, cut_frac=1.5)


# -- gradual unfreezing ------------------------------------------------------------------------
def test_gradual_unfreezing_adds_one_layer_per_epoch_from_the_top():
    tok = make_wordpiece(["good", "bad", "film"])
    model = dataclasses.replace(TINY, vocab_size=10, num_layers=3)
    module = build_task_module(cfg_for("sst2", model), get_adapter("sst2"), None, pad_id=0)
    enc = [tok.encode("good film"), tok.encode("bad film")]
    batch = module.make_batch([{"input_ids": e.ids, "token_type_ids": e.type_ids, "label": y}
                               for e, y in zip(enc, (1, 0))], None)
    hook = gradual_unfreezing(module, steps_per_epoch=5)
    expected = [("layers.2",), ("layers.2", "layers.1"), ("layers.2", "layers.1", "layers.0"),
                ("layers", "embeddings"), ("layers", "embeddings")]
    for epoch, trained in enumerate(expected):
        hook(epoch * 5 + 4)  # the last step of the epoch: still that epoch's layers
        module.zero_grad(set_to_none=True)
        module(batch)[0].backward()
        got = {n for n, p in module.named_parameters() if p.grad is not None}
        want = {n for n, _ in module.named_parameters()
                if not n.startswith("backbone.") or n.startswith("backbone.pooler.")
                or n.startswith(tuple(f"backbone.{t}" for t in trained))}
        assert got == want, (epoch, sorted(got ^ want))


def test_gradual_unfreezing_leaves_lower_layers_untouched_in_training(tmp_path):
    tok = make_wordpiece(["good", "bad", "film"])
    feats = [{"input_ids": tok.encode(t).ids, "token_type_ids": [0] * len(tok.encode(t).ids), "label": y}
             for t, y in (("good film", 1), ("bad film", 0))] * 4
    model = dataclasses.replace(TINY, vocab_size=10, num_layers=3)
    cfg = cfg_for("sst2", model)
    module = build_task_module(cfg, get_adapter("sst2"), None, pad_id=0)
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    train = dataclasses.replace(cfg.train, max_steps=2, batch_size=4)  # 2 epochs of 8 examples
    Trainer(module, InMemoryData(feats), train, tmp_path, progress=False,
            before_step=gradual_unfreezing(module, steps_per_epoch=2)).train()
    changed = {n for n, p in module.named_parameters() if not torch.equal(p, before[n])}
    assert any(n.startswith("backbone.layers.2.") for n in changed) and "classifier.weight" in changed
    assert not any(n.startswith(("backbone.layers.0.", "backbone.layers.1.", "backbone.embeddings."))
                   for n in changed)


# -- early stopping ----------------------------------------------------------------------------
class Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Linear(2, 1)

    def make_batch(self, examples, rng):
        return {"x": torch.tensor(np.asarray(examples, dtype=np.float32))}

    def forward(self, batch):
        loss = self.w(batch["x"]).pow(2).mean()
        return loss, {"loss": (loss.item(), 1)}


SCORES = [0.1, 0.3, 0.2, 0.25, 0.9, 0.95, 0.96, 0.97]  # dev metric after steps 1, 2, ...


def toy_trainer(run_dir, patience: int, best_steps: list | None = None) -> Trainer:
    data = InMemoryData([[1.0, 2.0], [3.0, -1.0]])
    cfg = TrainConfig(lr=1e-2, batch_size=2, max_steps=len(SCORES), warmup_steps=1, eval_every=1, save_every=1,
                      keep_checkpoints=20, log_every=1)
    holder = {}
    trainer = Trainer(Toy(), data, cfg, run_dir, evaluate=lambda m: {"score": SCORES[holder["t"].step - 1]},
                      best_metric="score", patience=patience, progress=False,
                      on_best=lambda m, metrics: best_steps.append(holder["t"].step) if best_steps is not None else None)
    holder["t"] = trainer
    return trainer


def test_early_stopping_stops_after_patience_evaluations_without_improvement(tmp_path):
    best_steps = []
    trainer = toy_trainer(tmp_path / "a", patience=2, best_steps=best_steps)
    out = trainer.train()
    assert (trainer.step, out["stopped_early"], trainer.best) == (4, True, {"value": 0.3, "step": 2})
    assert best_steps == [1, 2]
    patient = toy_trainer(tmp_path / "b", patience=3)
    assert patient.train()["stopped_early"] is False and patient.step == len(SCORES)
    assert patient.best["step"] == len(SCORES)


def test_early_stopping_state_survives_resume(tmp_path):
    run = tmp_path / "run"
    toy_trainer(run, patience=2).train()
    # Resuming a run that stopped early does not train on.
    again = toy_trainer(run, patience=2)
    again.train(resume=True)
    assert again.step == 4 and again.stopped_early
    # Resuming from before the stop (step 3, one bad evaluation so far) stops at the same step.
    import shutil

    shutil.rmtree(run / "checkpoints" / "step-00000004")
    resumed = toy_trainer(run, patience=2)
    resumed.train(resume=True)
    assert (resumed.step, resumed.stopped_early, resumed.best) == (4, True, {"value": 0.3, "step": 2})


# -- predict inputs ----------------------------------------------------------------------------
def test_jsonl_predict_input_reads_task_keys_or_text_and_names_bad_lines(tmp_path):
    from ember.tasks.readers.glue import get_task
    from ember.tasks.readers.jsonl_input import read_jsonl_examples

    good = tmp_path / "in.jsonl"
    good.write_text('{"id": "a", "sentence1": "x y", "sentence2": "z"}\n{"text": "p", "text_pair": "q"}\n')
    rows = read_jsonl_examples(good, get_task("mrpc"))
    assert [(r.guid, r.text_a, r.text_b) for r in rows] == [("a", "x y", "z"), ("in-1", "p", "q")]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"sentence": "fine"}\n{"sentence": ""}\n')
    with pytest.raises(EmberError, match=r"bad.jsonl:2: 'sentence' must be a non-empty string"):
        read_jsonl_examples(bad, get_task("sst2"))
    bad.write_text('{"sentence": "fine"}\nnot json\n')
    with pytest.raises(EmberError, match=r"bad.jsonl:2: not valid JSON"):
        read_jsonl_examples(bad, get_task("sst2"))


# -- end to end on real data -------------------------------------------------------------------
@pytest.fixture(scope="module")
def features_run(wiki_prepared, tmp_path_factory):
    real_data("glue", "SST-2")
    from ember.cli import main

    out = tmp_path_factory.mktemp("features") / "sst2"
    code = main(["finetune", "--task", "sst2", "--model", "bert-tiny", "--tokenizer",
                 str(wiki_prepared / "tokenizer.json"), "--out", str(out), "--features", "--train-limit", "200",
                 "--epochs", "2", "--lr", "3e-3", "--batch-size", "16", "--max-length", "64", "--patience", "3",
                 "--no-progress", "--seed", "4"])
    assert code == 0
    return out, json.loads((out / "results.json").read_text())


def test_features_sst2_cli_records_layer_weights_and_reloads(features_run, tmp_path):
    from ember.cli import main
    from ember.models import build_backbone
    from ember.runs.checkpoint import load_weights
    from ember.tasks.task_model import evaluate_run
    from ember.runs.folder import load_run_config

    out, results = features_run
    cfg = load_run_config(out)
    assert cfg.task.features and results["stopped_early"] is False and results["steps"] == 26
    weights = results["scalar_mix"]["weights"]
    assert len(weights) == cfg.model.num_layers + 1 and abs(sum(weights) - 1) < 1e-6
    assert max(weights) - min(weights) > 1e-4  # the mix moved off its uniform start
    # The stored encoder is the untouched seeded initialisation (frozen during training).
    torch.manual_seed(4)
    init = build_backbone(cfg.model).state_dict()
    saved = load_weights(out / "model.safetensors")
    for k, v in init.items():
        assert torch.equal(saved[f"backbone.encoder.{k}"], v), k
    assert evaluate_run(out)["metrics"] == pytest.approx(results["metrics"])
    source = tmp_path / "in.jsonl"
    source.write_text('{"sentence": "an utterly charming film"}\n{"id": "x", "sentence": "a dull mess"}\n')
    assert main(["predict", str(out), "--input", str(source), "--out", str(tmp_path / "p.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["in-0", "x"] and all(r["prediction"] in ("negative", "positive") for r in rows)


def test_features_run_export_to_transformers_is_a_clear_error(features_run, tmp_path):
    from ember.interop.convert import export_hf

    with pytest.raises(EmberError, match="feature-based run"):
        export_hf(features_run[0], tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("features", [False, True])
def test_predict_regression_run_reads_tsv_and_jsonl(features, tiny_tokenizer_path, tmp_path):
    """STS-B-style regression through `ember predict`: the same scores from TSV and JSONL input."""
    from ember.cli import main
    from ember.runs.checkpoint import save_weights
    from ember.runs.folder import write_run_files

    run = tmp_path / "run"
    cfg = dataclasses.replace(cfg_for("stsb", dataclasses.replace(TINY, vocab_size=100), features=features))
    write_run_files(run, cfg, tiny_tokenizer_path)
    save_weights(build_task_module(cfg, get_adapter("stsb"), None, pad_id=0).state_dict(), run / "model.safetensors")
    (tmp_path / "in.tsv").write_text("sentence1\tsentence2\nthe w1\ta w2\nw3 w4\tthe w5\n")
    (tmp_path / "in.jsonl").write_text('{"sentence1": "the w1", "sentence2": "a w2"}\n'
                                       '{"text": "w3 w4", "text_pair": "the w5"}\n')
    outputs = []
    for name in ("in.tsv", "in.jsonl"):
        assert main(["predict", str(run), "--input", str(tmp_path / name), "--out", str(tmp_path / f"{name}.jsonl")]) == 0
        outputs.append([json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()])
    assert [r["id"] for r in outputs[0]] == [r["id"] for r in outputs[1]] == ["in-0", "in-1"]
    assert [r["prediction"] for r in outputs[0]] == pytest.approx([r["prediction"] for r in outputs[1]])
    assert all(isinstance(r["prediction"], float) for r in outputs[0])
    assert main(["predict", str(run), "--input", str(tmp_path / "in.tsv"), "--out", str(tmp_path / "p.tsv")]) == 0
    assert (tmp_path / "p.tsv").read_text().splitlines()[0] == "id\tprediction"


def test_early_stopping_is_not_reported_when_the_last_evaluation_ends_the_run(tmp_path):
    trainer = toy_trainer(tmp_path, patience=2)
    trainer.cfg = dataclasses.replace(trainer.cfg, max_steps=4)  # patience runs out exactly at the end
    assert trainer.train()["stopped_early"] is False and trainer.step == 4
