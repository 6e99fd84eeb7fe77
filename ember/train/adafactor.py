"""Adafactor (Shazeer & Stern 2018), the optimizer T5 pre-trains with (Raffel et al. 2020, §3.1.2).

For a weight matrix X (n x m) with gradient G_t, Algorithm 4 of the paper:

    beta2_t = 1 - t^(-c)                                      increasing decay (§7.1), c = 0.8
    R_t = beta2_t R_{t-1} + (1 - beta2_t) (G_t^2 + eps1) 1_m  row statistics      (n,)
    C_t = beta2_t C_{t-1} + (1 - beta2_t) 1_n^T (G_t^2 + eps1) column statistics  (m,)
    V_t = R_t C_t / (1_n^T R_t)                               rank-1 second moment (n, m)
    U_t = G_t / sqrt(V_t)
    U_t <- U_t / max(1, RMS(U_t) / d)                         update clipping (§6), d = 1
    alpha_t = max(eps2, RMS(X_{t-1})) rho_t                   relative step size, eps2 = 1e-3
    X_t = X_{t-1} - alpha_t U_t

Vectors (biases, norm scales) keep a full second moment V_t = beta2_t V_{t-1} + (1 - beta2_t)
(G_t^2 + eps1) (Algorithm 5). A tensor of rank > 2 is factored over its last two axes. No
momentum (T5's setting; ``beta1 > 0`` keeps an exponential average of the scaled updates),
no bias correction (beta2_1 = 0 makes the first estimate exact).

rho_t is the learning rate the trainer sets on each step (``group["lr"]``): T5 uses the
inverse-square-root schedule 1/sqrt(max(t, 10^4)), which is also the paper's own relative
step size min(10^-2, 1/sqrt(t)) (``ember.train.optim``, schedule ``inverse_sqrt``). With
``scale_parameter=False``, alpha_t = rho_t: an absolute step size.

Keeping row and column *means* instead of sums changes R and 1^T R by the same factor m,
which cancels in V_t. Optimizer state (per tensor): ``step`` (int), ``row``/``col`` or ``sq``,
and ``momentum`` when beta1 > 0; all of it is in ``state_dict()``, so resume is exact.
"""

from __future__ import annotations

import torch

from ember.errors import EmberError
from ember.train.tensorwise import TensorwiseOptimizer


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x.pow(2).mean().sqrt()


class Adafactor(TensorwiseOptimizer):
    def __init__(self, params, lr: float, decay_rate: float = 0.8, clip_threshold: float = 1.0,
                 eps1: float = 1e-30, eps2: float = 1e-3, scale_parameter: bool = True,
                 beta1: float = 0.0, weight_decay: float = 0.0) -> None:
        if not 0.0 < decay_rate <= 1.0:
            raise EmberError(f"train.adafactor_decay_rate={decay_rate}: beta2_t = 1 - t^-c needs 0 < c <= 1 "
                             "(T5 and the paper use 0.8)")
        if clip_threshold <= 0:
            raise EmberError(f"train.adafactor_clip_threshold={clip_threshold} must be positive (the paper: 1.0)")
        if not 0.0 <= beta1 < 1.0:
            raise EmberError(f"train.adafactor_beta1={beta1} must be in [0, 1) (0 = no momentum, as T5)")
        defaults = dict(lr=lr, decay_rate=decay_rate, clip_threshold=clip_threshold, eps1=eps1,
                        eps2=eps2, scale_parameter=scale_parameter, beta1=beta1, weight_decay=weight_decay)
        super().__init__(params, defaults)

    def _update(self, p: torch.Tensor, group: dict) -> None:
        if p.grad.is_sparse:
            raise EmberError("Adafactor does not support sparse gradients")
        low = p.dtype in (torch.float16, torch.bfloat16)  # statistics and update in fp32 for these
        grad = p.grad.float() if low else p.grad
        state = self.state[p]
        factored = grad.dim() >= 2
        if not state:
            state["step"] = 0
            if factored:
                state["row"] = grad.new_zeros(grad.shape[:-1])  # (..., n)
                state["col"] = grad.new_zeros(grad.shape[:-2] + grad.shape[-1:])  # (..., m)
            else:
                state["sq"] = torch.zeros_like(grad)
            if group["beta1"] > 0:
                state["momentum"] = torch.zeros_like(grad)
        state["step"] += 1
        beta2 = 1.0 - state["step"] ** -group["decay_rate"]
        sq_grad = grad.square().add_(group["eps1"])  # G_t^2 + eps1
        if factored:
            row, col = state["row"], state["col"]
            row.lerp_(sq_grad.mean(dim=-1), 1.0 - beta2)  # beta2 R + (1 - beta2) new
            col.lerp_(sq_grad.mean(dim=-2), 1.0 - beta2)
            v = row.unsqueeze(-1) * col.unsqueeze(-2) / row.mean(dim=-1, keepdim=True).unsqueeze(-1)
        else:
            v = state["sq"].lerp_(sq_grad, 1.0 - beta2)
        update = grad / v.sqrt()  # U_t
        update.div_(torch.clamp(_rms(update) / group["clip_threshold"], min=1.0))
        param = p.float() if low else p
        step_size = group["lr"]  # rho_t
        if group["scale_parameter"]:
            step_size = step_size * max(group["eps2"], _rms(param).item())  # alpha_t
        update.mul_(step_size)
        if group["beta1"] > 0:
            update = state["momentum"].lerp_(update, 1.0 - group["beta1"])
        if group["weight_decay"]:  # decoupled, scaled like the step (X <- X - alpha wd X)
            param.mul_(1.0 - group["weight_decay"] * step_size)
        param.sub_(update)
        if param is not p:
            p.copy_(param)
