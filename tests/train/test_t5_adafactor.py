"""Adafactor (Shazeer & Stern 2018) and T5's inverse-square-root schedule (Raffel et al. 2020, §3.1.2)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from ember.config import TrainConfig
from ember.errors import EmberError
from ember.train.adafactor import Adafactor
from ember.train.optim import build_optimizer, lr_factor


def _tiny_module(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    # a matrix (factored), a vector (full second moment) and a rank-3 tensor (factored over
    # its last two axes)
    module = nn.Module()
    module.weight = nn.Parameter(torch.randn(6, 5))
    module.bias = nn.Parameter(torch.randn(5) * 0.01)  # RMS below eps2: the step-size floor
    module.cube = nn.Parameter(torch.randn(2, 3, 4))
    return module


def _run(module: nn.Module, optimizer, lrs: list[float], start: int = 0) -> None:
    """Steps ``start``.. of a fixed stream of random gradients (the same for every optimizer)."""
    gen = torch.Generator().manual_seed(1)
    for t, lr in enumerate(lrs):
        # a large gradient on step 3 makes update clipping act
        grads = [torch.randn(p.shape, generator=gen) * (30.0 if t == 2 else 1.0) for p in module.parameters()]
        if t < start:
            continue
        for group in optimizer.param_groups:
            group["lr"] = lr
        for p, g in zip(module.parameters(), grads):
            p.grad = g
        optimizer.step()


@pytest.mark.parametrize("scale_parameter,beta1,weight_decay", [
    (True, None, 0.0),  # T5's setting
    (False, None, 0.0),
    (True, 0.9, 0.01),
])
def test_t5_adafactor_matches_transformers(scale_parameter, beta1, weight_decay):
    from transformers.optimization import Adafactor as HFAdafactor

    ours, theirs = _tiny_module(), _tiny_module()
    opt_ours = Adafactor(ours.parameters(), lr=1e-2, decay_rate=0.8, clip_threshold=1.0,
                         scale_parameter=scale_parameter, beta1=beta1 or 0.0, weight_decay=weight_decay)
    opt_theirs = HFAdafactor(theirs.parameters(), lr=1e-2, eps=(1e-30, 1e-3), clip_threshold=1.0,
                             decay_rate=-0.8, beta1=beta1, weight_decay=weight_decay,
                             scale_parameter=scale_parameter, relative_step=False, warmup_init=False)
    lrs = [1e-2, 1e-2, 1e-2, 5e-3, 5e-3]
    _run(ours, opt_ours, lrs)
    _run(theirs, opt_theirs, lrs)
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)
    assert not torch.equal(ours.weight, _tiny_module().weight)  # it did move


def test_t5_adafactor_first_step_by_hand():
    """Algorithm 4 at t = 1 (beta2_1 = 0) on G = [[1, 2], [3, 4]], X = 0.5 everywhere.

    Row means of G^2: (2.5, 12.5); column means: (5, 10); mean of rows 7.5, so
    V = R C / mean(R) = [[5/3, 10/3], [25/3, 50/3]] and U = G / sqrt(V), with
    U^2 = [[3/5, 6/5], [27/25, 24/25]]: RMS(U) = sqrt(0.96) < d = 1, no clipping.
    alpha = max(1e-3, RMS(X) = 0.5) * rho (0.1) = 0.05.
    """
    x = nn.Parameter(torch.full((2, 2), 0.5, dtype=torch.float64))
    x.grad = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
    opt = Adafactor([x], lr=0.1)
    opt.step()
    u = torch.tensor([[1 / math.sqrt(5 / 3), 2 / math.sqrt(10 / 3)],
                      [3 / math.sqrt(25 / 3), 4 / math.sqrt(50 / 3)]], dtype=torch.float64)
    torch.testing.assert_close(x.detach(), 0.5 - 0.05 * u, atol=1e-12, rtol=0)
    state = opt.state[x]
    assert state["step"] == 1
    torch.testing.assert_close(state["row"], torch.tensor([2.5, 12.5], dtype=torch.float64))
    torch.testing.assert_close(state["col"], torch.tensor([5.0, 10.0], dtype=torch.float64))
    assert "sq" not in state  # factored: n + m numbers, not n * m


def test_t5_adafactor_update_clipping_and_decay_by_hand():
    """Algorithm 5 (a vector), no parameter scaling. Step 1: V = G^2, U = sign(G). Step 2 with
    G = 10: beta2_2 = 1 - 2^-0.8, V = beta2 * 1 + (1 - beta2) * 100, U = 10 / sqrt(V) > 1 in
    RMS, so update clipping rescales it to RMS exactly d = 1: U = (1, 1)."""
    x = nn.Parameter(torch.zeros(2, dtype=torch.float64))
    opt = Adafactor([x], lr=0.5, scale_parameter=False)
    x.grad = torch.tensor([1.0, -1.0], dtype=torch.float64)
    opt.step()
    torch.testing.assert_close(x.detach(), torch.tensor([-0.5, 0.5], dtype=torch.float64))
    x.grad = torch.tensor([10.0, 10.0], dtype=torch.float64)
    opt.step()
    beta2 = 1 - 2 ** -0.8
    torch.testing.assert_close(opt.state[x]["sq"], torch.full((2,), beta2 + (1 - beta2) * 100, dtype=torch.float64))
    assert 10 / math.sqrt(beta2 + (1 - beta2) * 100) > 1  # so clipping acts
    torch.testing.assert_close(x.detach(), torch.tensor([-1.0, 0.0], dtype=torch.float64))


def test_t5_adafactor_state_dict_resumes_exactly():
    whole, first = _tiny_module(), _tiny_module()
    opt_whole = Adafactor(whole.parameters(), lr=1e-2)
    _run(whole, opt_whole, [1e-2] * 5)
    opt_first = Adafactor(first.parameters(), lr=1e-2)
    _run(first, opt_first, [1e-2] * 3)
    state = copy.deepcopy(opt_first.state_dict())
    resumed = Adafactor(first.parameters(), lr=1e-2)
    resumed.load_state_dict(state)
    _run(first, resumed, [1e-2] * 5, start=3)
    for a, b in zip(whole.parameters(), first.parameters()):
        assert torch.equal(a, b)


def test_t5_inverse_sqrt_schedule_is_constant_then_one_over_sqrt_step():
    # T5: lr = 1/sqrt(max(n, 10^4)); here peak lr 0.01 = 1/sqrt(10^4) times the factor
    cfg = TrainConfig(schedule="inverse_sqrt", lr=0.01, warmup_steps=10_000, max_steps=2 ** 19)
    for step in (0, 1, 5000, 10_000, 40_000, 2 ** 19 - 1):
        assert cfg.lr * lr_factor(step, cfg) == pytest.approx(1 / math.sqrt(max(step, 10_000)), rel=1e-12)
    assert lr_factor(40_000, cfg) == 0.5


def test_t5_build_optimizer_picks_adafactor_with_the_config_settings():
    module = nn.Linear(4, 3)
    cfg = TrainConfig(optimizer="adafactor", lr=0.01, weight_decay=0.0, adafactor_decay_rate=0.5,
                      adafactor_clip_threshold=2.0, adafactor_scale_parameter=False)
    opt = build_optimizer(module, cfg)
    assert isinstance(opt, Adafactor)
    group = opt.param_groups[0]
    assert (group["decay_rate"], group["clip_threshold"], group["scale_parameter"], group["beta1"]) == \
        (0.5, 2.0, False, 0.0)
    assert isinstance(build_optimizer(module, TrainConfig()), torch.optim.AdamW)
    with pytest.raises(EmberError, match="train.optimizer='sgd'"):
        build_optimizer(module, TrainConfig(optimizer="sgd"))
    with pytest.raises(EmberError, match="adafactor_decay_rate"):
        Adafactor(module.parameters(), lr=0.01, decay_rate=-0.8)  # HF's sign convention is caught
