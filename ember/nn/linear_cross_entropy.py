"""A linear layer and its cross-entropy in one step, for vocabulary-sized outputs (the MLM head).

``F.cross_entropy(F.linear(x, W, b), targets)`` with (N, V) logits makes three more (N, V)
tensors: log-softmax's output, the NLL gradient (a zero tensor with one entry per row) and
log-softmax's input gradient; accuracy adds an argmax pass. At bert-mini's 608 masked rows x
30,522 words each is 74 MB, and on the CPU a fresh tensor that size costs as much to touch
for the first time (page faults) as to compute. Here the logits are the only (N, V) tensor:
in place, row max (which is also the prediction), exp, row sum, then the rows become the loss
gradient softmax - one-hot, which the backward feeds straight into its two products. The
loss is log(sum exp(z - max)) + max - z_target, so no probability is logged (no underflow).

The same reduction as ``F.cross_entropy(..., reduction="mean")``; the gradient is prepared
during the forward (as in fused "linear cross-entropy" kernels, e.g. Liger-Kernel), so it
costs nothing extra when backward runs and is skipped when gradients are off.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from ember.nn import onednn

PROFILER_RANGE = "ember.softmax_cross_entropy"
ROWS_PER_CHUNK = 64  # rows normalised together: 64 x 30,522 floats (7.8 MB) stay in the cache


def _product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (M, K) @ weight (N, K)^T + bias, no autograd, through oneDNN where it applies."""
    if onednn.applies(x, weight):
        return onednn.gemm(x, weight, bias)
    return F.linear(x, weight, bias)


def _softmax_rows_(logits: torch.Tensor, targets: torch.Tensor, grad_scale: float | None):
    """In place over (N, V) logits, chunk by chunk. Returns per-row losses (N,) and the number
    of rows whose largest logit is the target's. With ``grad_scale`` the rows end as
    grad_scale * (softmax - one-hot); without, as exp(z - max) (scratch)."""
    n = logits.shape[0]
    losses = torch.empty(n, dtype=logits.dtype, device=logits.device)
    correct = torch.zeros((), dtype=torch.long, device=logits.device)
    with torch.profiler.record_function(PROFILER_RANGE):  # benchmarks/pretrain_profile.py's "head and loss"
        target_logit = logits.gather(1, targets[:, None]).squeeze(1)  # before the rows change
        for start in range(0, n, ROWS_PER_CHUNK):
            rows = slice(start, start + ROWS_PER_CHUNK)
            chunk = logits[rows]
            top, predicted = chunk.max(1)
            correct += (predicted == targets[rows]).sum()
            chunk.sub_(top[:, None]).exp_()
            total = chunk.sum(1)
            losses[rows] = total.log() + top - target_logit[rows]
            if grad_scale is not None:
                chunk.mul_((grad_scale / total)[:, None])
        if grad_scale is not None:
            logits[torch.arange(n, device=logits.device), targets] -= grad_scale
    return losses, correct


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, targets):
        logits = _product(x, weight, bias)  # (N, V), owned here: reused in place
        wants_grad = any(ctx.needs_input_grad[:3])
        losses, correct = _softmax_rows_(logits, targets, 1.0 / x.shape[0] if wants_grad else None)
        ctx.has_bias = bias is not None
        if wants_grad:
            ctx.save_for_backward(x, weight, logits)  # logits now hold d(mean loss)/d(logits)
        ctx.mark_non_differentiable(correct)
        return losses.mean(), correct

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss, _grad_correct):
        x, weight, grad_logits = ctx.saved_tensors
        # the products are linear in the gradient, so the upstream scalar scales their (small)
        # outputs instead of the (N, V) buffer, which must stay as saved for a second backward
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = _product(grad_logits, weight.t(), None).mul_(grad_loss)  # (N, V) @ (V, K)
        if ctx.needs_input_grad[1]:
            use_onednn = onednn.applies(grad_logits, x)
            gw = onednn.weight_gradient(grad_logits, x) if use_onednn else grad_logits.t() @ x
            gw.mul_(grad_loss)  # (V, K)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = grad_logits.sum(0).mul_(grad_loss)
        return gx, gw, gb, None


def fusable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the fused step may run: fp32 (half-precision logits are normalised in fp32 by the
    ordinary path), not under autocast (which must see F.linear to cast it) and not while
    tracing, exporting or compiling (they need ordinary nodes)."""
    if x.dtype != torch.float32 or weight.dtype != torch.float32:
        return False
    return not onednn.needs_ordinary_ops(x.device.type)


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy of ``F.linear(x, weight, bias)`` against ``targets``, and how many rows
    predict their target (argmax), without keeping the logits. x (N, K), weight (V, K),
    bias (V,), targets (N,) in [0, V) -> (loss scalar, correct count as a 0-dim long tensor)."""
    if x.dim() != 2 or targets.shape != (x.shape[0],):
        raise ValueError(f"linear_cross_entropy wants x (N, K) and targets (N,); got {tuple(x.shape)} "
                         f"and {tuple(targets.shape)}")
    if not fusable(x, weight) or x.shape[0] == 0:  # no rows: F.cross_entropy's mean of nothing (nan)
        logits = F.linear(x, weight, bias).float()
        return F.cross_entropy(logits, targets), (logits.argmax(-1) == targets).sum()
    return _LinearCrossEntropy.apply(x, weight, bias, targets)
