"""Distillation modules on tiny random models: student initialisation, students learning their
teacher (Hinton KD, Patient KD, TinyBERT, DistilBERT), and what is (not) trained or saved."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from ember.config import ModelConfig, TrainConfig
from ember.distillation.kd import KDSettings, TaskDistiller
from ember.distillation.student import init_from_teacher, student_config, teacher_layer_choice
from ember.errors import EmberError
from ember.models import Encoder
from ember.tasks.classification import SequenceClassifier
from ember.train.loop import Trainer

TINY = ModelConfig(vocab_size=40, hidden_size=32, num_layers=4, num_heads=2, intermediate_size=64,
                   max_position=32, dropout=0.0, attention_dropout=0.0)


class ListData:
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def example(self, index, epoch):
        return self.items[index]


def test_distilbert_student_init_copies_exactly_every_other_teacher_layer():
    torch.manual_seed(0)
    teacher = Encoder(TINY).eval()
    scfg = student_config(TINY, "", 2)
    assert teacher_layer_choice(2, 4) == [0, 2] and teacher_layer_choice(6, 12) == [0, 2, 4, 6, 8, 10]
    student = Encoder(scfg).eval()
    student.load_state_dict(init_from_teacher(teacher.state_dict(), TINY, scfg), strict=True)
    t_state = teacher.state_dict()
    for name, value in student.state_dict().items():
        if name.startswith("layers."):
            i, rest = name.split(".", 2)[1:]
            assert torch.equal(value, t_state[f"layers.{2 * int(i)}.{rest}"]), name
        else:
            assert torch.equal(value, t_state[name]), name
    # Functionally: the student is the teacher's embeddings followed by its layers 0 and 2.
    ids = torch.randint(5, 40, (3, 7))
    x = teacher.embeddings(ids, None, None)
    for k in (0, 2):
        x, _ = teacher.layers[k](x)
    assert torch.allclose(student(ids).last_hidden_state, x, atol=1e-6)


def test_student_init_from_teacher_refuses_other_widths():
    with pytest.raises(EmberError, match="hidden_size"):
        init_from_teacher(Encoder(TINY).state_dict(), TINY, dataclasses.replace(TINY, hidden_size=16,
                                                                                  num_layers=2))


def toy_features(n: int, seed: int) -> list[dict]:
    """Random token sequences; the 'teacher' scores #tokens in 5..14 minus #tokens in 15..24."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = int(rng.integers(4, 10))
        ids = rng.integers(5, 25, size=length)
        score = float((ids < 15).sum() - (ids >= 15).sum())
        out.append({"input_ids": [2, *ids.tolist(), 3], "token_type_ids": [0] * (length + 2), "label": None,
                    "teacher_logits": np.array([-score, score], dtype=np.float32)})
    return out


def agreement(student: SequenceClassifier, features: list[dict]) -> float:
    logits = student.predict(features, 64)
    teacher = np.stack([f["teacher_logits"] for f in features])
    return float(np.mean(logits.argmax(-1) == teacher.argmax(-1)))


def test_kd_student_learns_the_teacher_from_cached_soft_targets(tmp_path):
    torch.manual_seed(0)
    cfg = dataclasses.replace(TINY, num_layers=1)
    student = SequenceClassifier(Encoder(cfg), 2, pad_id=0)
    train, held_out = toy_features(512, 1), toy_features(200, 2)
    held_out = [f for f in held_out if f["teacher_logits"][1] != 0]  # ties have no right answer
    distiller = TaskDistiller(student, KDSettings(temperature=2.0, alpha=1.0))
    batch = distiller.make_batch(held_out)

    def soft_loss():
        with torch.no_grad():
            return distiller(batch)[0].item()

    before_loss, before_agree = soft_loss(), agreement(student, held_out)
    train_cfg = TrainConfig(lr=3e-3, batch_size=32, max_steps=160, warmup_steps=10, log_every=1000,
                            save_every=0, eval_every=0, max_grad_norm=1.0)
    Trainer(distiller, ListData(train), train_cfg, tmp_path, progress=False).train()
    after_loss, after_agree = soft_loss(), agreement(student, held_out)
    assert after_loss < 0.5 * before_loss
    assert after_agree > max(0.85, before_agree + 0.2)


def test_hard_label_loss_is_mixed_only_where_a_gold_label_exists():
    torch.manual_seed(0)
    student = SequenceClassifier(Encoder(dataclasses.replace(TINY, num_layers=1)), 2, pad_id=0).eval()
    feats = toy_features(4, 3)
    feats[0] = dict(feats[0], label=1)
    d = TaskDistiller(student, KDSettings(temperature=2.0, alpha=0.3))
    batch = d.make_batch(feats)
    assert batch["labels"].tolist()[1:] == [-100, -100, -100]
    loss, metrics = d(batch)
    from ember.distillation.kd import classifier_forward
    from ember.distillation.losses import soft_cross_entropy

    logits, _ = classifier_forward(student, batch)
    soft = soft_cross_entropy(logits, batch["teacher_logits"], 2.0)
    hard = torch.nn.functional.cross_entropy(logits[:1], torch.tensor([1]))
    assert loss.item() == pytest.approx(0.3 * soft.item() + 0.7 * hard.item(), rel=1e-5)
    assert metrics["hard_loss"][1] == 1


def live_teacher() -> SequenceClassifier:
    torch.manual_seed(1)
    return SequenceClassifier(Encoder(TINY), 2, pad_id=0).eval()


@pytest.mark.parametrize("method", ["pkd", "tinybert"])
def test_layer_distillation_with_a_live_teacher_lowers_its_loss_and_trains_only_the_student(method, tmp_path):
    from ember.distillation.pkd import PatienceLoss
    from ember.distillation.tinybert import TinyBertLayerLoss

    teacher = live_teacher()
    torch.manual_seed(2)
    scfg = dataclasses.replace(TINY, num_layers=2, hidden_size=16, num_heads=1 if method == "tinybert" else 2,
                               intermediate_size=32)
    student = SequenceClassifier(Encoder(scfg), 2, pad_id=0)
    if method == "pkd":
        layer_loss = PatienceLoss(2, 4, 16, 32, "skip", beta=100.0)
        settings = KDSettings(temperature=5.0, alpha=1.0)
    else:
        layer_loss = TinyBertLayerLoss(2, 4, 16, 32)
        settings = KDSettings(prediction_weight=0.0)
    d = TaskDistiller(student, settings, teacher=teacher, layer_loss=layer_loss)
    feats = [dict(f, label=None) for f in toy_features(256, 4)]
    for f in feats:
        del f["teacher_logits"]
    batch = d.make_batch(feats[:64])

    def loss():
        with torch.no_grad():
            return d(batch)[0].item()

    before = loss()
    teacher_before = {k: v.clone() for k, v in teacher.state_dict().items()}
    cfg = TrainConfig(lr=2e-3, batch_size=32, max_steps=60, warmup_steps=5, log_every=1000, save_every=60,
                      eval_every=0)
    trainer = Trainer(d, ListData(feats), cfg, tmp_path, progress=False)
    trainer.train()
    assert loss() < 0.7 * before
    # The frozen teacher is untouched, outside the optimizer and outside checkpoints.
    assert all(torch.equal(v, teacher_before[k]) for k, v in teacher.state_dict().items())
    trained = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert not any(id(p) in trained for p in teacher.parameters())
    assert all(k.startswith(("student.", "layer_loss.")) for k in d.state_dict())
    assert any(k.startswith("layer_loss.proj") for k in d.state_dict())  # W_h: 16 -> 32


def test_distilbert_triple_loss_goes_down_and_matches_its_parts():
    from ember.config import DataConfig
    from ember.data.pairs import SegmentPair
    from ember.distillation.distilbert import DistilBertDistiller, DistilBertWeights
    from ember.objectives.bert import BertPretraining

    special = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
    data = DataConfig(nsp=False)
    torch.manual_seed(0)
    teacher = BertPretraining(Encoder(TINY), special, data, "none").eval()
    scfg = student_config(TINY, "", 2)
    student = BertPretraining(Encoder(scfg), special, data, "none")
    state = {f"backbone.{k}": v for k, v in init_from_teacher(teacher.backbone.state_dict(), TINY, scfg).items()}
    state.update({k: v for k, v in teacher.state_dict().items() if k.startswith("mlm.")})
    student.load_state_dict(state)
    d = DistilBertDistiller(student, teacher, DistilBertWeights())
    rng = np.random.default_rng(0)
    pairs = [SegmentPair(rng.integers(5, 40, size=12), None, 0) for _ in range(16)]
    batch = d.make_batch(pairs, np.random.default_rng(1))
    loss, m = d(batch)
    n_masked = m["mlm_loss"][1]
    total = 5.0 * m["ce_loss"][0] / n_masked + 2.0 * m["mlm_loss"][0] / n_masked + m["cos_loss"][0] / 16
    assert loss.item() == pytest.approx(total, rel=1e-5)
    opt = torch.optim.AdamW(student.parameters(), lr=3e-3)
    first, first_m = loss.item(), m
    for _ in range(30):
        opt.zero_grad()
        loss, m = d(batch)
        loss.backward()
        opt.step()
    # The soft-target term keeps the teacher's entropy (a constant), so check the total falls
    # clearly and the MLM part with it. (The cosine term starts near 0: the student is a copy.)
    assert loss.item() < first - 1.0
    assert m["mlm_loss"][0] < 0.8 * first_m["mlm_loss"][0]


def test_encoder_returns_attention_probabilities_for_tinybert():
    """TinyBERT compares attention maps: the encoder must hand back softmax probabilities,
    rows summing to 1 and nothing on padded keys, one (B, heads, T, T) map per layer."""
    torch.manual_seed(0)
    enc = Encoder(TINY).eval()
    ids = torch.randint(5, 40, (2, 6))
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    out = enc(ids, mask, output_attentions=True, output_hidden_states=True)
    assert len(out.attentions) == TINY.num_layers and len(out.hidden_states) == TINY.num_layers + 1
    for probs in out.attentions:
        assert probs.shape == (2, TINY.num_heads, 6, 6)
        torch.testing.assert_close(probs.sum(-1), torch.ones(2, TINY.num_heads, 6))
        assert probs[1, :, :, 4:].abs().max() == 0
