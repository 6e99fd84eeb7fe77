"""A linear layer and its cross-entropy in one step, for vocabulary-sized outputs (the MLM head).

``F.cross_entropy(F.linear(x, W, b), targets)`` with (N, V) logits makes three more (N, V)
tensors: log-softmax's output, the NLL gradient (a zero tensor with one entry per row) and
log-softmax's input gradient; accuracy adds an argmax pass. At bert-mini's 608 masked rows x
30,522 words each is 74 MB, and on the CPU a fresh tensor that size costs as much to touch
for the first time (page faults) as to compute. Here the logits are the only (N, V) tensor:
in place, row max (which is also the prediction), exp, row sum, then the rows become the loss
gradient softmax - one-hot, which the backward feeds straight into its two products. The
loss is log(sum exp(z - max)) + max - z_target, so no probability is logged (no underflow).

The same reductions as ``F.cross_entropy(..., reduction="mean" | "none")``; the gradient is
prepared during the forward (as in fused "linear cross-entropy" kernels, e.g. Liger-Kernel), so
it costs nothing extra when backward runs and is skipped when gradients are off. Per-row losses
keep each row's gradient unscaled, and the backward scales the products' small operands by the
rows' upstream gradients (x (N, K) and the (N, K) result), never the (N, V) buffer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from ember.nn import onednn

PROFILER_RANGE = "ember.softmax_cross_entropy"
# Rows normalised together: 16 x 30,522 floats (1.95 MB) stay in a 2 MB L2 cache through the
# chunk's eight passes (Intel Xeon, 608 rows: 42.9 ms against 55.6 with 64 rows; same bits).
ROWS_PER_CHUNK = 16


def _product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (M, K) @ weight (N, K)^T + bias, no autograd, through oneDNN where it applies."""
    if onednn.applies(x, weight):
        return onednn.gemm(x, weight, bias)
    return F.linear(x, weight, bias)


def _logits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """(N, V) logits, and the bias still to be added (None when it is in). oneDNN adds the bias
    inside its GEMM for free; BLAS's addmm would first broadcast it into the whole (N, V) output
    (a 74 MB pass at bert-mini that cost ~20 ms on an Intel Xeon), so on that path the bias is
    added chunk by chunk while the rows are in the cache (``_softmax_rows_``). bf16 logits keep it
    in the product, so they round where autocast's F.linear rounds them."""
    if bias is None or onednn.applies(x, weight) or x.dtype != torch.float32:
        return _product(x, weight, bias), None
    return _product(x, weight, None), bias


def _softmax_rows_(logits: torch.Tensor, targets: torch.Tensor, grad_scale: float | None,
                   bias: torch.Tensor | None = None, bias_grad: torch.Tensor | None = None):
    """In place over (N, V) logits (plus ``bias`` (V,) if given, added here), chunk by chunk.
    Returns per-row fp32 losses (N,) and which rows argmax predicts correctly (N,) bool. With
    ``grad_scale`` the rows end as grad_scale * (softmax - one-hot); without, as scratch. A
    ``bias_grad`` (V,) receives the column sums of those rows, taken while each chunk is in the
    cache (the backward would otherwise read the whole (N, V) buffer once more for it).
    Statistics are always taken in fp32: a bf16 chunk is widened while it is in the cache and
    its gradient rounded back to bf16, as autocast's ordinary path rounds the logits' gradient
    before the backward products."""
    n = logits.shape[0]
    losses = torch.empty(n, dtype=torch.float32, device=logits.device)
    hits = torch.zeros(n, dtype=torch.bool, device=logits.device)
    with torch.profiler.record_function(PROFILER_RANGE):  # benchmarks/speed/pretrain_profile.py's "head and loss"
        target_logit = logits.gather(1, targets[:, None]).squeeze(1).float()  # before the rows change
        if bias is not None:
            target_logit += bias[targets]
        for start in range(0, n, ROWS_PER_CHUNK):
            rows = slice(start, start + ROWS_PER_CHUNK)
            chunk = logits[rows]
            work = chunk if chunk.dtype == torch.float32 else chunk.float()  # (R, V) fp32
            if bias is not None:
                work.add_(bias)
            top = work.amax(1)  # values only: max with indices is ~8x slower on the CPU
            hits[start + _argmax_hits(work, top, target_logit[rows], targets[rows])] = True
            work.sub_(top[:, None]).exp_()
            total = work.sum(1)
            losses[rows] = total.log() + top - target_logit[rows]
            if grad_scale is not None:
                work.mul_((grad_scale / total)[:, None])
                work[torch.arange(work.shape[0], device=work.device), targets[rows]] -= grad_scale
                if bias_grad is not None:
                    bias_grad += work.sum(0)
                if work is not chunk:
                    chunk.copy_(work)
    return losses, hits


def _argmax_hits(chunk: torch.Tensor, top: torch.Tensor, target_logit: torch.Tensor,
                 targets: torch.Tensor) -> torch.Tensor:
    """The rows of ``chunk`` (R, V) whose ``argmax == target``, as indices. A row whose target
    logit is below the row maximum ``top`` misses, so argmax (which also finds the first of tied
    maxima) runs only on the others: its cost follows the accuracy instead of the row count."""
    maybe = (target_logit >= top).nonzero().squeeze(1)  # (h,) rows whose target reaches the maximum
    if maybe.numel() == 0:
        return maybe
    return maybe[chunk[maybe].argmax(1) == targets[maybe]]


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, targets, per_row):
        logits, pending_bias = _logits(x, weight, bias)  # (N, V), owned here: reused in place
        wants_grad = any(ctx.needs_input_grad[:3])
        # fp32 rows of the mean sum into the bias gradient in the forward; bf16 rows are summed in
        # the backward as they were rounded, as autocast's ordinary path sums them, and per-row
        # losses there too, once their upstream gradients are known
        early = (torch.zeros(logits.shape[1], dtype=torch.float32, device=logits.device)
                 if ctx.needs_input_grad[2] and logits.dtype == torch.float32 and not per_row else None)
        # the rows end as d(loss)/d(logits): of the mean (1/N each) or of each row's own loss
        scale = (1.0 if per_row else 1.0 / x.shape[0]) if wants_grad else None
        losses, hits = _softmax_rows_(logits, targets, scale, pending_bias, early)
        ctx.has_bias = bias is not None
        ctx.bias_grad = early
        if wants_grad:
            ctx.save_for_backward(x, weight, logits)
        if per_row:
            ctx.mark_non_differentiable(hits)
            return losses, hits
        correct = hits.sum()
        ctx.mark_non_differentiable(correct)
        return losses.mean(), correct

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss, _grad_hits):
        x, weight, grad_logits = ctx.saved_tensors
        # the products are linear in the gradient, so the upstream gradient (a scalar for the
        # mean, one number per row for per-row losses) scales their (small) operands and outputs
        # instead of the (N, V) buffer, which must stay as saved for a second backward
        rows = grad_loss if grad_loss.dim() == 0 else grad_loss[:, None]  # broadcasts over (N, K)
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = _product(grad_logits, weight.t(), None).mul_(rows)  # (N, V) @ (V, K)
        if ctx.needs_input_grad[1]:
            # the gradient scales x (N, K) before the product, not the (V, K) result: a pass over
            # 50x fewer numbers at bert-mini (608 rows, 30,522 words), the same bits when a
            # scalar gradient is a power of two (1, or 1 / grad_accum)
            xs = x * rows.to(x.dtype)
            use_onednn = onednn.applies(grad_logits, xs)
            gw = onednn.weight_gradient(grad_logits, xs) if use_onednn else grad_logits.t() @ xs  # (V, K)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            early = ctx.bias_grad
            if early is not None:
                gb = early * grad_loss
            elif grad_loss.dim() == 0:
                gb = grad_logits.sum(0).mul_(grad_loss)
            else:  # sum over rows weighted by each row's gradient: (1, N) @ (N, V)
                gb = (grad_loss.to(grad_logits.dtype)[None] @ grad_logits)[0]
        return gx, gw, gb, None, None


def fused_dtype(x: torch.Tensor, weight: torch.Tensor) -> torch.dtype | None:
    """The dtype the fused step multiplies in, or None for the ordinary path: fp32 inputs; on the
    CPU also bf16 inputs, and bf16 under bf16 autocast (the dtype autocast would give F.linear),
    the rows being normalised in fp32 either way. bf16 on other devices (CUDA) is not measured
    here and takes the ordinary path, as does anything while tracing, exporting or compiling
    (they need ordinary nodes)."""
    if onednn.is_recording():
        return None
    device = x.device.type
    if torch.is_autocast_enabled(device):
        autocast_bf16 = torch.get_autocast_dtype(device) == torch.bfloat16
        return torch.bfloat16 if device == "cpu" and autocast_bf16 else None
    if x.dtype != weight.dtype:
        return None
    if x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and device == "cpu"):
        return x.dtype
    return None


def fusable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the fused step may run (``fused_dtype``); benchmarks switch it off here."""
    return fused_dtype(x, weight) is not None


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         targets: torch.Tensor, reduction: str = "mean") -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy of ``F.linear(x, weight, bias)`` against ``targets``, and which rows predict
    their target (argmax), without keeping the logits. x (N, K), weight (V, K), bias (V,),
    targets (N,) in [0, V). ``reduction="mean"`` -> (loss scalar, correct count as a 0-dim long
    tensor); ``"none"`` -> (per-row fp32 losses (N,), per-row hits (N,) bool), for callers that
    weigh or report rows apart (XLM's per-language losses)."""
    if x.dim() != 2 or targets.shape != (x.shape[0],):
        raise ValueError(f"linear_cross_entropy wants x (N, K) and targets (N,); got {tuple(x.shape)} "
                         f"and {tuple(targets.shape)}")
    if reduction not in ("mean", "none"):
        raise ValueError(f"linear_cross_entropy's reduction is 'mean' or 'none', not {reduction!r}")
    per_row = reduction == "none"
    if not fusable(x, weight) or x.shape[0] == 0:  # no rows: F.cross_entropy's mean of nothing (nan)
        logits = F.linear(x, weight, bias).float()
        hits = logits.argmax(-1) == targets
        return F.cross_entropy(logits, targets, reduction=reduction), hits if per_row else hits.sum()
    dtype = fused_dtype(x, weight)
    # cast as autocast would (these casts are autograd nodes, so fp32 parameters get fp32
    # gradients), then keep autocast out of the step's own products
    x, weight = x.to(dtype), weight.to(dtype)
    bias = None if bias is None else bias.to(dtype)
    with torch.autocast(x.device.type, enabled=False):
        return _LinearCrossEntropy.apply(x, weight, bias, targets, per_row)
