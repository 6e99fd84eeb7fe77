"""LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning: Training BERT in 76
minutes"), Algorithm 2: Adam's update rescaled layer by layer by a trust ratio, so a large
global batch (and the larger learning rate it calls for) moves every layer by a step
proportional to its own weight norm.

For each tensor x^(i) (a "layer") with gradient g_t, step t = 1, 2, ...:

    m_t = beta1 m_{t-1} + (1 - beta1) g_t
    v_t = beta2 v_{t-1} + (1 - beta2) g_t^2
    m^_t = m_t / (1 - beta1^t),   v^_t = v_t / (1 - beta2^t)          bias correction
    r_t = m^_t / (sqrt(v^_t) + eps)                                    Adam's direction
    u_t = r_t + lambda x_t                                             decoupled weight decay
    x_{t+1} = x_t - eta_t * phi(||x_t||) / ||u_t|| * u_t               layer-wise trust ratio

with phi the identity (the paper's choice in its experiments). When ||x_t|| or ||u_t|| is 0
(a zero-initialised tensor) the ratio is 1, a plain Adam step. Biases and normalisation
parameters take no trust ratio and no weight decay (the paper follows BERT's exclusions;
``trust_ratio: False`` in their parameter group, set by ``ember.train.optim``).

Under FSDP a tensor is sharded across ranks (a DTensor): its norms are reduced over the
shards (``full_tensor``), so the ratio is the whole layer's, as in one process.
"""

from __future__ import annotations

import math

import torch

from ember.train.tensorwise import TensorwiseOptimizer


def _norm(x: torch.Tensor) -> float:
    """||x||_2 of the whole tensor, also when ``x`` is an FSDP shard (a DTensor)."""
    n = torch.linalg.vector_norm(x)
    if hasattr(n, "full_tensor"):  # DTensor: a partial sum over the shards, reduced here
        n = n.full_tensor()
    return float(n)


class Lamb(TensorwiseOptimizer):
    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, trust_ratio: bool = True) -> None:
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "trust_ratio": trust_ratio}
        super().__init__(params, defaults)

    def _update(self, p: torch.Tensor, group: dict) -> None:
        beta1, beta2 = group["betas"]
        g = p.grad
        state = self.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        state["step"] += 1
        t = int(state["step"])
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.mul_(beta1).add_(g, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        # r_t = m^_t / (sqrt(v^_t) + eps)
        update = (m / (1 - beta1 ** t)) / ((v / (1 - beta2 ** t)).sqrt() + group["eps"])
        if group["weight_decay"]:
            update.add_(p, alpha=group["weight_decay"])
        ratio = 1.0
        if group["trust_ratio"]:
            w_norm, u_norm = _norm(p), _norm(update)
            ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 and math.isfinite(u_norm) else 1.0
        p.add_(update, alpha=-group["lr"] * ratio)
