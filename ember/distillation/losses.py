"""Distillation losses and layer maps, as plain functions of tensors.

Hinton et al. 2015 ("Distilling the Knowledge in a Neural Network"), DistilBERT (Sanh et al.
2019), TinyBERT (Jiao et al. 2020) and Patient KD (Sun et al. 2019). Every function here is
checked against a hand computation in tests/test_distill_losses.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ember.errors import EmberError


def soft_cross_entropy(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                       temperature: float = 1.0) -> torch.Tensor:
    """Hinton's soft-target loss: T^2 * mean_i( -sum_c p_T(c|i) log q_T(c|i) ).

    p_T = softmax(teacher / T), q_T = softmax(student / T); logits (N, C). The T^2 factor
    keeps the gradient's size independent of T (Hinton et al. 2015, §2), so the loss mixes
    with the hard-label loss at a fixed weight. It differs from KL(p_T || q_T) (DistilBERT's
    ``KLDivLoss * T^2``) only by the teacher's entropy, a constant: same gradients.
    """
    if temperature <= 0:
        raise EmberError(f"distillation temperature must be positive, got {temperature}")
    t = temperature
    targets = F.softmax(teacher_logits.float() / t, dim=-1)
    log_probs = F.log_softmax(student_logits.float() / t, dim=-1)
    return -(targets * log_probs).sum(-1).mean() * t * t


def logit_mse(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Mean squared error between logits (Ba & Caruana 2014; Tang et al. 2019 distil BiLSTMs)."""
    return F.mse_loss(student_logits.float(), teacher_logits.float())


def cosine_hidden_loss(student: torch.Tensor, teacher: torch.Tensor,
                       mask: torch.Tensor | None = None) -> torch.Tensor:
    """DistilBERT's cosine embedding loss: mean over real tokens of 1 - cos(h_s, h_t).

    student, teacher (B, T, H); mask (B, T) 1 = real token. Same as torch's
    CosineEmbeddingLoss with target +1, which DistilBERT's reference code applies to the last
    hidden states at non-padding positions.
    """
    if student.shape[-1] != teacher.shape[-1]:
        raise EmberError(f"the cosine loss needs equal widths, got student {student.shape[-1]} and "
                         f"teacher {teacher.shape[-1]}")
    cos = F.cosine_similarity(student.float(), teacher.float(), dim=-1)  # (B, T)
    if mask is None:
        return (1 - cos).mean()
    keep = mask.bool()
    return (1 - cos[keep]).mean()


def uniform_layer_map(student_layers: int, teacher_layers: int) -> list[int]:
    """TinyBERT's uniform strategy n = g(m) = m * N / M for m = 0..M (0 = embeddings).

    Returns [g(0), g(1), ..., g(M)]: student layer m learns from teacher layer g(m). N must be
    a multiple of M, as in the paper (4-layer student of a 12-layer teacher: 0, 3, 6, 9, 12).
    """
    m, n = student_layers, teacher_layers
    if m < 1 or n < m or n % m:
        raise EmberError(f"uniform layer mapping needs the teacher's layers ({n}) to be a multiple of "
                         f"the student's ({m}); choose a student with {n} / k layers")
    return [i * n // m for i in range(m + 1)]


def masked_mse(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """MSE over real tokens: student, teacher (B, T, H), mask (B, T). Padding is left out,
    so the loss does not depend on how a batch happened to be padded."""
    if mask is None:
        return F.mse_loss(student.float(), teacher.float())
    keep = mask.bool()
    return F.mse_loss(student.float()[keep], teacher.float()[keep])


def attention_mse(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """TinyBERT's attention loss, MSE between attention maps (B, heads, T, T).

    Rows of padding queries and columns of padding keys are left out (mask (B, T)). The
    paper's reference code compares pre-softmax scores; ember's encoder returns the softmax
    probabilities, which are bounded and need no -inf clean-up, so those are compared. When
    the head counts differ (bert-tiny has 2 heads, bert-mini 4) the maps are averaged over
    heads first - the paper assumes equal counts; averaging is our extension.
    """
    if student.shape[1] != teacher.shape[1]:
        student, teacher = student.mean(1, keepdim=True), teacher.mean(1, keepdim=True)
    s, t = student.float(), teacher.float()
    if mask is None:
        return F.mse_loss(s, t)
    m = mask.bool()
    pair = (m[:, None, :, None] & m[:, None, None, :]).expand_as(s)  # (B, heads, T, T)
    return F.mse_loss(s[pair], t[pair])


def pkd_layer_map(student_layers: int, teacher_layers: int, strategy: str) -> list[tuple[int, int]]:
    """(student layer, teacher layer) pairs of Patient KD, 1-based, for the M - 1 intermediate
    student layers (the last one is taught through the predictions by the KD loss).

    skip: teacher layers k, 2k, ... with k = N / M (12 -> 6: 2, 4, 6, 8, 10);
    last: the M - 1 teacher layers below the last (12 -> 6: 7, 8, 9, 10, 11). Sun et al. 2019, §3.
    """
    m, n = student_layers, teacher_layers
    if strategy not in ("skip", "last"):
        raise EmberError(f"--pkd-strategy {strategy!r}; choose skip or last")
    if m < 2:
        raise EmberError("Patient KD needs a student with at least 2 layers (it matches the "
                         "intermediate ones)")
    if strategy == "skip":
        if n % m:
            raise EmberError(f"PKD-skip needs the teacher's layers ({n}) to be a multiple of the "
                             f"student's ({m}); use --pkd-strategy last or another student depth")
        k = n // m
        return [(j, j * k) for j in range(1, m)]
    if n < m:
        raise EmberError(f"the teacher ({n} layers) must be at least as deep as the student ({m})")
    return [(j, n - m + j) for j in range(1, m)]


def patience_loss(student_cls: torch.Tensor, teacher_cls: torch.Tensor) -> torch.Tensor:
    """Patient KD's L_PT: squared distance of L2-normalised [CLS] states.

    student_cls, teacher_cls (L, B, H): the mapped layers' [CLS] vectors. Reduced as the
    reference code does (mean over layers, examples and hidden units: MSE of unit vectors), which
    is why its beta lies in the hundreds (Sun et al. 2019 search 100-500).
    """
    s = F.normalize(student_cls.float(), p=2, dim=-1)
    t = F.normalize(teacher_cls.float(), p=2, dim=-1)
    return F.mse_loss(s, t)
