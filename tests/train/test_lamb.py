"""LAMB (You et al. 2019, Alg. 2): two steps checked against the paper's equations worked by
hand, no trust ratio or decay for biases and norms, and a bert-mini run at 4x the batch."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from ember.config import TrainConfig
from ember.train.lamb import Lamb
from ember.train.optim import build_optimizer, set_lr


def test_lamb_two_steps_match_algorithm_2_by_hand():
    """w = (3, 4), b = 1; lr 0.1, betas (0.9, 0.999), eps 0, lambda 0.1.

    Step 1, g = (1, -2): m^ = g and v^ = g^2, so r = sign(g) = (1, -1); u = r + 0.1 w = (1.3, -0.6),
    ||u|| = sqrt(2.05) = 1.43178211, ||w|| = 5, trust ratio 3.49215148;
    w1 = w - 0.1 * 3.49215148 * u = (2.54602031, 4.20952909). Bias (g 0.5): r = 1, b1 = 0.9.
    Step 2, g = (0.5, 0.5): m = 0.09 g1 + 0.1 g2 = (0.14, -0.13), m^ = m / 0.19;
    v = 0.000999 g1^2 + 0.001 g2^2 = (0.001249, 0.004246), v^ = v / 0.001999;
    r = (0.93217964, -0.46946817), u = r + 0.1 w1 = (1.18678167, -0.04851526),
    ratio ||w1|| / ||u|| = 4.14185983, w2 = (2.05447198, 4.22962343).
    Bias (g -1): m = -0.055, v = 0.00124975, r = -0.36610353, b2 = 0.9 + 0.036610353 = 0.93661035.
    """
    layer = nn.Linear(2, 1)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[3.0, 4.0]]))
        layer.bias.fill_(1.0)
    groups = [{"params": [layer.weight], "weight_decay": 0.1},
              {"params": [layer.bias], "weight_decay": 0.0, "trust_ratio": False}]
    opt = Lamb(groups, lr=0.1, betas=(0.9, 0.999), eps=0.0)
    for g, gb, want, want_b in (([1.0, -2.0], 0.5, [2.54602031, 4.20952909], 0.9),
                                ([0.5, 0.5], -1.0, [2.05447198, 4.22962343], 0.93661035)):
        layer.weight.grad = torch.tensor([g])
        layer.bias.grad = torch.tensor([gb])
        opt.step()
        assert torch.allclose(layer.weight, torch.tensor([want]), atol=1e-7), layer.weight
        assert torch.allclose(layer.bias, torch.tensor([want_b]), atol=1e-7), layer.bias


def test_lamb_zero_weight_takes_a_plain_adam_step():
    p = nn.Parameter(torch.zeros(3))
    opt = Lamb([p], lr=0.5, eps=0.0, weight_decay=0.01)
    p.grad = torch.tensor([2.0, -1.0, 0.5])
    opt.step()
    assert torch.allclose(p.detach(), torch.tensor([-0.5, 0.5, -0.5]))  # ratio 1, r = sign(g)


def test_lamb_optimizer_exempts_bert_biases_and_layernorms_from_trust_ratio():
    from ember.config import ModelConfig
    from ember.models.encoder import Encoder

    model = Encoder(ModelConfig(vocab_size=50, hidden_size=8, num_layers=1, num_heads=2, intermediate_size=16,
                                max_position=16))
    opt = build_optimizer(model, TrainConfig(optimizer="lamb", weight_decay=0.01))
    assert isinstance(opt, Lamb)
    names = {id(p): n for n, p in model.named_parameters()}
    for group in opt.param_groups:
        for p in group["params"]:
            exempt = names[id(p)].endswith("bias") or "norm" in names[id(p)].lower()
            assert group["trust_ratio"] is not exempt, names[id(p)]
            assert (group["weight_decay"] == 0.0) is exempt, names[id(p)]
    set_lr(opt, 0.3)
    assert all(g["lr"] == 0.3 for g in opt.param_groups)
    assert opt.state_dict()["param_groups"][0]["trust_ratio"] is True  # saved with the checkpoint


def test_lamb_bert_mini_trains_at_four_times_the_batch(wiki_prepared, tmp_path):
    """bert-mini (tiny dims) at batch 64 = 4 x 16 with lr scaled by sqrt(4) (You et al. §5) and
    warm-up: the masked-LM loss falls well below its start."""
    from run_helpers import recipe_config, short_run

    cfg = recipe_config("bert-mini", wiki_prepared, "train.optimizer=lamb", "train.max_steps=60",
                        "train.batch_size=64", "train.micro_batch_size=32", "train.lr=1e-2",
                        "train.lr_scaling=sqrt", "train.lr_base_batch=16", "train.warmup_ratio=0.2",
                        "train.weight_decay=0.01", "train.log_every=1", "train.eval_every=0",
                        "train.save_every=0", "train.num_threads=1")
    records = [r for r in short_run(cfg, tmp_path / "run") if r["split"] == "train"]
    first = sum(r["loss"] for r in records[:3]) / 3
    last = sum(r["loss"] for r in records[-3:]) / 3
    assert last < first - 0.5, (first, last)
    assert max(r["lr"] for r in records) == pytest.approx(2e-2)  # 1e-2 x sqrt(64 / 16)


def test_lr_scaling_rules_for_a_grown_batch():
    from ember.errors import EmberError
    from ember.train.scaling import effective_config

    base = TrainConfig(lr=1e-4, batch_size=1024, lr_base_batch=256)
    assert effective_config(base, 1).lr == 1e-4  # lr_scaling "none"
    assert effective_config(dataclasses.replace(base, lr_scaling="linear"), 1).lr == pytest.approx(4e-4)
    assert effective_config(dataclasses.replace(base, lr_scaling="sqrt"), 1).lr == pytest.approx(2e-4)
    with pytest.raises(EmberError, match="needs train.lr_base_batch"):
        effective_config(TrainConfig(lr_scaling="linear"), 1)
    with pytest.raises(EmberError, match="choose one of none, linear, sqrt"):
        effective_config(TrainConfig(lr_scaling="cubic"), 1)
