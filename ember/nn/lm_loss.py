"""Language-model losses shared by objectives and tasks; they live in ``nn`` so tasks need not
import from objectives (DESIGN: nn <- models <- objectives/tasks).

* ``next_token_loss``: the causal LM loss (GPT-1 §3.1 eq. 1, GPT-2 §2), for the ``clm``
  pre-training objective (ember.objectives.clm) and GPT-1 fine-tuning's auxiliary LM loss
  (ember.tasks.families.gpt, §3.2 eq. 5).
* ``seq2seq_loss``: an encoder-decoder's teacher-forced loss on target tokens (Raffel et al.
  2020, §3.1.4: "maximum likelihood"), for T5's denoising objectives
  (ember.objectives.span_corruption) and text-to-text fine-tuning (ember.tasks.text2text.task).
* ``token_loss``: mean cross-entropy and accuracy of an LM head given as F.linear's (input,
  weight, bias) - a backbone's ``lm_projection`` - without keeping the (rows x vocabulary)
  logits (ember.nn.linear_cross_entropy). The two losses above and the MLM/PLM losses use it.
"""

from __future__ import annotations

import torch

from ember.nn.linear_cross_entropy import linear_cross_entropy


def token_loss(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
               name: str) -> tuple[torch.Tensor, dict]:
    """Mean cross-entropy of the logits ``F.linear(x, weight, bias)`` (N, V) against targets (N,),
    with ``{name}_loss`` and ``{name}_acc`` metrics as (sum, count)."""
    loss, correct = linear_cross_entropy(x, weight, bias, targets)
    n = int(targets.numel())
    return loss, {f"{name}_loss": (loss.item() * n, n), f"{name}_acc": (int(correct), n)}


def next_token_loss(backbone, hidden: torch.Tensor, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """Mean cross-entropy of the next-token logits at t (the ``backbone``'s ``lm_projection`` of
    hidden (B, T, H)) against input_ids at t + 1; padding (attention_mask 0) is never a target.
    Metrics ``lm_loss``/``lm_acc`` as (sum, count)."""
    targets = input_ids[:, 1:]  # (B, T-1)
    rows = hidden[:, :-1]
    if attention_mask is None:
        rows, targets = rows.reshape(-1, rows.shape[-1]), targets.reshape(-1)
    else:
        where = attention_mask[:, 1:] != 0
        rows, targets = rows[where], targets[where]
    return token_loss(*backbone.lm_projection(rows), targets, "lm")


def seq2seq_loss(backbone, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
    """Mean cross-entropy over the target tokens of an encoder-decoder ``backbone`` (``shift_right``,
    ``lm_projection``, keyword decoder inputs: ember.models.encoder_decoder).

    ``batch``: input_ids / attention_mask (B, S) and labels (B, T), each row's targets a
    prefix followed by -100. The decoder reads the targets shifted right behind the start
    token (teacher forcing), or ``decoder_input_ids`` (+ ``decoder_attention_mask``) when the
    batch has them (MASS: targets anywhere in the row); the LM head runs on target positions only. Metrics ``loss`` and
    ``token_acc`` as (sum, count)."""
    labels = batch["labels"]  # (B, T)
    mask = batch["attention_mask"]
    targets = labels != -100  # (B, T); a prefix of each row unless the batch brings decoder inputs
    if "decoder_input_ids" in batch:  # given (MASS: masked positions), with their own mask
        decoder_ids, decoder_mask = batch["decoder_input_ids"], batch.get("decoder_attention_mask")
    else:
        decoder_ids, decoder_mask = backbone.shift_right(labels), None if bool(targets.all()) else targets.long()
    out = backbone(batch["input_ids"], None if bool(mask.all()) else mask, decoder_input_ids=decoder_ids,
                   decoder_attention_mask=decoder_mask)
    hidden = out.last_hidden_state[targets]  # (N, H): only positions with a target
    loss, metrics = token_loss(*backbone.lm_projection(hidden), labels[targets], "token")
    return loss, {"loss": metrics["token_loss"], "token_acc": metrics["token_acc"]}
