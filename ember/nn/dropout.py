"""Dropout that is cheap on CPU, and attention that uses it while training.

Why: on CPU, ``F.dropout`` draws one Bernoulli sample per element, which costs more than
the matmul it follows. Measured with one thread (CPU time, 32 x 4 x 128 x 128 attention
probabilities, bert-mini's shape): F.dropout ~20 ms, the batched attention matmul ~9 ms.
Scaled dot-product attention with dropout_p > 0 has no fused CPU kernel either and pays
the same Bernoulli cost inside. Here one 64-bit random draw gives four 15-bit uniform
numbers (the low 15 bits of its four 16-bit words: the top word's sign bit is always 0); an
element is kept when its number is >= round(p * 32768), so the drop rate is p to within 1/65536
(0.1 -> 0.100006), and the kept values are scaled by the exact inverse keep rate so the
expectation is unchanged (Srivastava et al. 2014 "inverted" dropout). The multiplier is built
in integer arithmetic, clamp(number, threshold - 1, threshold) - threshold + 1, then cast and
scaled, which is ~2x cheaper than a bool mask converted to float (torch's bool -> float cast is
not vectorised: ~3.2 of ~3.8 ms for those probabilities on an Intel Xeon) and, in int16, ~1.2x
(fp32) to ~1.8x (bf16) cheaper than the same arithmetic in fp32; the masks are the ones the bool
version drew, so runs written before the change resume to the losses they logged.
Random numbers come from torch's default generator, so torch.manual_seed still makes runs
(and ember's exact resume) reproducible. Off CPU, torch's own kernels are used.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

_LEVELS = 32768  # 15 bits per uniform draw


def keep_mask(shape: torch.Size, p: float, device) -> torch.Tensor:
    """int16 (shape): 0 where dropped, 1 where kept (the draws described in the module docstring).
    Drawn whole, the random stream is the same however a product that uses it is then split."""
    n = math.prod(shape)
    bits = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_()
    numbers = bits.view(torch.int16)[:n].view(shape) & (_LEVELS - 1)  # four uniform 15-bit numbers per draw
    threshold = int(round(p * _LEVELS))
    # in the integers, where every number is exact (bf16 is not) and each pass moves 2 bytes an
    # element: 0 below the threshold, 1 from it on (clamped before the shift, so nothing overflows)
    return numbers.clamp_(threshold - 1, threshold).sub_(threshold - 1)


def _scale_of(keep: torch.Tensor, p: float, dtype) -> torch.Tensor:
    """The inverted-dropout multiplier of ``keep_mask``: 0 where dropped, 1/keep_rate where kept."""
    threshold = int(round(p * _LEVELS))
    return keep.to(dtype).mul_(_LEVELS / (_LEVELS - threshold))


def _keep_scale(shape: torch.Size, p: float, device, dtype) -> torch.Tensor:
    """Inverted-dropout multiplier (shape): 0 where dropped, 1/keep_rate where kept."""
    return _scale_of(keep_mask(shape, p, device), p, dtype)


class _SoftmaxDroppedProduct(torch.autograd.Function):
    """dropout(softmax(scores), p) @ v keeping, for the backward, the probabilities (which the
    softmax keeps anyway) and the 2-byte keep mask instead of the dropped probabilities and a
    4-byte multiplier: the attention's largest tensors are stored once, not three times (a
    Longformer layer training 4,096 tokens: 1,057 -> ~830 MB). The backward rebuilds the dropped
    probabilities with the same operations and runs the softmax's own backward kernel in place on
    the probabilities' gradient, so values and gradients are those of the plain ops, bit for bit,
    with one probabilities-sized buffer alive at a time beside the saved ones (full attention over
    4,096 tokens: 805 MB a buffer)."""

    @staticmethod
    def forward(ctx, scores: torch.Tensor, v: torch.Tensor, p: float):
        out, probs, keep = softmax_dropout_forward(scores, v, p)
        ctx.mark_dirty(scores)  # the softmax wrote over them: the probabilities are an output too (unused)
        ctx.set_materialize_grads(False)  # and get no zero gradient the size of the probabilities
        ctx.save_for_backward(probs, v, keep)
        ctx.p = p
        return out, probs

    @staticmethod
    @once_differentiable  # no double backward: a create_graph=True caller gets an error, not wrong numbers
    def backward(ctx, grad: torch.Tensor, _unused_grad_probs: None):
        if grad is None:  # the context was not used
            return None, None, None
        probs, v, keep = ctx.saved_tensors
        return (*softmax_dropout_backward(grad, probs, v, keep, ctx.p, *ctx.needs_input_grad[:2]), None)


def softmax_dropout_forward(scores: torch.Tensor, v: torch.Tensor, p: float
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dropout(softmax(scores)) @ v, the probabilities, the keep mask): the forward arithmetic of
    ``softmax_dropped_product``, for autograd functions (no gradient is recorded here). The softmax
    is written over ``scores`` (the same kernel and numbers as scores.softmax(-1)), so the scores,
    probabilities, mask and multiplier are never all alive at once."""
    probs = torch.ops.aten._softmax.out(scores, -1, False, out=scores)
    keep = keep_mask(probs.shape, p, probs.device)
    return dropped_product(probs, keep, v, p), probs, keep


def dropped_product(probs: torch.Tensor, keep: torch.Tensor, v: torch.Tensor, p: float,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """dropout(probs) @ v with ``keep_mask``'s mask: ``softmax_dropout_forward``'s product, for
    callers that form the probabilities a few rows at a time (``out``: where to write them)."""
    dropped = _scale_of(keep, p, probs.dtype).mul_(probs)  # the multiplier's buffer becomes the dropped probs
    return torch.matmul(dropped, v, out=out)


def softmax_dropout_backward(grad: torch.Tensor, probs: torch.Tensor, v: torch.Tensor, keep: torch.Tensor,
                             p: float, need_scores: bool = True, need_v: bool = True
                             ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(gradient of the scores, of v) given the output's ``grad``: ``softmax_dropout_forward``'s
    backward, autograd's numbers for the plain ops, with one probabilities-sized buffer alive at a
    time beside ``probs`` and ``keep``."""
    grad_scores = grad_v = None
    if need_v:  # the dropped probabilities, rebuilt as the forward built them
        grad_v = _scale_of(keep, p, probs.dtype).mul_(probs).transpose(-1, -2) @ grad
    if need_scores:
        # the probabilities' gradient (grad @ v^T) x keep x (1 / keep rate): the same numbers as
        # x multiplier (x 1 and x 0 are exact) without a multiplier-sized buffer beside it ...
        inverse = _scale_of(keep.new_ones(()), p, probs.dtype).item()  # 1 / keep rate, in the dtype
        grad_scores = _mul_keep_(grad @ v.transpose(-1, -2), keep).mul_(inverse)
        # ... then the softmax's backward kernel, writing over its input row by row (each row's
        # sum of grad x probs is taken before the row is written): autograd's own numbers
        torch.ops.aten._softmax_backward_data.out(grad_scores, probs, -1, probs.dtype, grad_input=grad_scores)
    return grad_scores, grad_v


def _mul_keep_(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """x *= keep (int16 0 / 1) in place, some rows at a time: a mixed-dtype in-place product casts
    its whole right side first (an x-sized temporary, 805 MB for full attention's gradient over
    4,096 tokens); slices keep that cast to ~4 MB."""
    width = x.shape[-1]
    flat_x, flat_keep = x.view(-1, width), keep.view(-1, width)
    step = max(1, (1 << 20) // width)
    for start in range(0, flat_x.shape[0], step):
        flat_x[start:start + step].mul_(flat_keep[start:start + step])
    return x


def softmax_dropped_product(scores: torch.Tensor, v: torch.Tensor, p: float) -> torch.Tensor:
    """``dropout(scores.softmax(-1), p) @ v`` on CPU (the same numbers and gradients), storing less
    for the backward; ``scores`` must be a fresh tensor nothing else reads (while gradients are
    recorded the softmax overwrites it), e.g. ``attention_scores``'s product. Under autocast the
    plain ops run: autocast casts the product's operands, and a backward outside it would
    multiply other dtypes than the forward did."""
    if (p == 0.0 or p >= 1.0 or scores.device.type != "cpu" or not torch.is_grad_enabled()
            or torch.is_autocast_enabled("cpu")):
        return dropout(scores.softmax(-1), p) @ v
    return _SoftmaxDroppedProduct.apply(scores, v, p)[0]


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, training)
    return x * _keep_scale(x.shape, p, x.device, x.dtype)


class Dropout(nn.Module):
    """Drop-in for ``nn.Dropout`` (same ``p`` attribute, no parameters) using ``dropout``."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def switch_off_dropout(module: nn.Module) -> int:
    """Every dropout of ``module`` set to 0 in place - ``Dropout`` / ``nn.Dropout`` modules and the
    attention modules' ``dropout_p`` - for the rest of training (BART §5.1); returns how many."""
    n = 0
    for m in module.modules():
        if isinstance(m, (Dropout, nn.Dropout)) and m.p:
            m.p, n = 0.0, n + 1
        if isinstance(getattr(m, "dropout_p", None), float) and m.dropout_p:
            m.dropout_p, n = 0.0, n + 1
    return n


def forms_probabilities(device: torch.device, dropout_p: float) -> bool:
    """Whether ``attend`` forms the attention probabilities itself (dropout on CPU) rather than
    calling SDPA: callers can then hand it inputs laid out for its batched products."""
    return dropout_p > 0.0 and device.type == "cpu"


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
           dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` for (B, heads, T, d) inputs (same arguments: a bool
    mask, True = may attend, or a float mask added to the logits; ``scale`` None = 1/sqrt(d));
    with dropout on CPU the probabilities are formed explicitly so ``dropout`` can be applied."""
    if not forms_probabilities(q.device, dropout_p):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                              is_causal=is_causal, scale=scale)
    if is_causal:  # query t sees keys <= t (SDPA's top-left aligned causal mask)
        causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        if attn_mask is None or attn_mask.dtype == torch.bool:
            attn_mask = causal if attn_mask is None else attn_mask & causal
        else:
            attn_mask = attn_mask.masked_fill(~causal, torch.finfo(attn_mask.dtype).min)
    return softmax_dropped_product(attention_scores(q, k, attn_mask, scale), v, dropout_p)


def attention_scores(q: torch.Tensor, k: torch.Tensor, attn_mask: torch.Tensor | None = None,
                     scale: float | None = None) -> torch.Tensor:
    """Masked attention logits (B, heads, T, S) of (B, heads, T, d) queries and (B, heads, S, d)
    keys: q.k * scale (1/sqrt(d) unless given), plus a float mask or -inf-like where a bool
    mask is False - what SDPA computes before its softmax."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q if scale == 1.0 else q * scale) @ k.transpose(-1, -2)  # 1.0: already scaled (T5, packed heads)
    if attn_mask is None:
        return scores
    if attn_mask.dtype == torch.bool:
        # Added as 0 / finfo.min, in place on the fresh product (its backward needs q and k only): one
        # pass forward and none backward, where masked_fill cloned the (B, heads, T, S) scores and, in the
        # backward, their gradient (12 copies a gpt2-mini step). The same values: score + finfo.min rounds
        # to finfo.min, and a masked position's probability is 0, so its gradient is 0 either way (a row
        # that masks every key, which no real input has, is uniform in both; only its gradient differs).
        blocked = torch.zeros(attn_mask.shape, dtype=scores.dtype, device=scores.device)
        return scores.add_(blocked.masked_fill_(~attn_mask, torch.finfo(scores.dtype).min))
    if attn_mask.dtype == scores.dtype and torch.broadcast_shapes(attn_mask.shape, scores.shape) == scores.shape:
        return scores.add_(attn_mask)  # in place on the fresh product, as above (a band's scores: 126 MB)
    return scores + attn_mask


def dropout_at_rows(x: torch.Tensor, p: float, training: bool, full_shape: tuple, rows, dim: int = 1) -> torch.Tensor:
    """``dropout`` of x, the rows ``rows`` (``ember.nn.query_rows.QueryRows``) along ``dim`` of a
    tensor of ``full_shape``, with the multiplier the whole tensor would have drawn there: the
    random stream, and so every later mask, is the one of the full computation."""
    if not training or p == 0.0 or x.device.type != "cpu" or p >= 1.0:
        return dropout(x, p, training)  # nothing to drop, or torch's own kernel (its own draws)
    return x * rows.gather(_keep_scale(torch.Size(full_shape), p, x.device, x.dtype), dim)
