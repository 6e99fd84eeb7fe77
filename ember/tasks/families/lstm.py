"""Fine-tuning Dai & Le's LSTM as a classifier ("Semi-supervised Sequence Learning", 2015, §2-4).

The pre-trained LSTM (LM-LSTM or SA-LSTM, ember.objectives.dai_le) keeps its weights; a linear
layer after dropout reads the label off its states, with ``model.lstm_pooling``:

* ``last`` (the paper's classifier): the top layer's state after the last token, h_n (B, H) -
  the sequence ends with the tokenizer's [SEP], as in pre-training.
* ``linear_gain`` (the paper's "linear label gain", §3): a prediction z_t at every step, the loss
  sum_t w_t CE(z_t, y) with w_t = t/n normalised over the row (``ember.nn.pooling``), which sends
  gradient into the early steps directly. The prediction is the same weighting of the steps'
  log-probabilities, sum_t w_t log p_t(y) (returned as the head's logits), so what is served is
  the score the loss trained; for regression (STS-B) the weighted mean of the steps' outputs.

Embedding dropout (``model.embedding_dropout``), dropout on the states (``model.dropout``) and
gradient clipping (``train.max_grad_norm``) are the paper's regularisers; each can be set at
fine-tuning (``--set model.dropout=0.5``). Inputs are the tokenizer's own framing, as for BERT
(``[CLS] a [SEP]``; a pair ``[CLS] a [SEP] b [SEP]`` is read as one sequence).

``adapt`` (``ember.tasks.base.FAMILY_ADAPTERS["lstm"]``) turns any sentence (pair) classification
or regression adapter (GLUE, NSMC, RuSentiment, ...) into the LSTM's: same reading, scoring,
prediction files and ``classify`` method for serving, the LSTM head and LSTM learning rates.
Token tagging and question answering need a per-token Transformer encoder and are refused.
"""

from __future__ import annotations

import dataclasses

import torch

from ember.errors import EmberError
from ember.nn.pooling import linear_gain_weights
from ember.tasks.classification import SequenceClassifier

# Fine-tuning defaults for the LSTM (replacing BERT's 2e-5): Adam at 1e-3 as in pre-training,
# batch 32 and 3 epochs as BERT's, 10% warm-up.
LSTM_LEARNING_RATE = 1e-3


class LstmClassifier(SequenceClassifier):
    """Dropout + linear layer on the LSTM's states; parameters ``backbone.*``, ``classifier.*``."""

    # Read by ember.serve.onnx_export: the ONNX graph of a packed LSTM is not one ember checks.
    onnx_refusal = ("an LSTM classifier (model family lstm, Dai & Le 2015) has no ONNX export: each row's LSTM "
                    "runs packed to its own length, which ember's ONNX export does not reproduce. Serve the run "
                    "folder in PyTorch (`ember serve RUN`, or `ember serve RUN --int8` for int8 Linear layers) or export "
                    "it with `ember export RUN --format int8`")

    def __init__(self, backbone, num_labels: int, pad_id: int, pooling: str = "last") -> None:
        super().__init__(backbone, num_labels, pad_id)
        self.pooling = pooling

    def step_logits(self, out) -> torch.Tensor:
        """A prediction at every step (B, T, num_labels)."""
        return self.classifier(self.dropout(out.last_hidden_state))

    def head_logits(self, out, attention_mask: torch.Tensor) -> torch.Tensor:  # (B, num_labels)
        if self.pooling == "last":
            return self.classifier(self.dropout(out.final_state[0][-1]))  # top layer's h_n (B, H)
        return self._gain_pooled(self.step_logits(out), linear_gain_weights(attention_mask))

    def _gain_pooled(self, steps: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """sum_t w_t log p_t (classification) or sum_t w_t z_t (regression): (B, num_labels)."""
        per_step = steps if self.is_regression else steps.float().log_softmax(-1)
        return (weights.unsqueeze(-1) * per_step).sum(dim=1)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        if self.pooling == "last":
            return super().forward(batch)
        mask = batch["attention_mask"]
        out = self.backbone(batch["input_ids"], mask)
        steps, weights = self.step_logits(out).float(), linear_gain_weights(mask)  # (B, T, C), (B, T)
        labels = batch["labels"]
        n = int(labels.shape[0])
        if self.is_regression:
            errors = (steps.squeeze(-1) - labels.float()[:, None]) ** 2  # (B, T)
            loss = (weights * errors).sum(dim=1).mean()
            return loss, {"loss": (loss.item() * n, n)}
        nll = -steps.log_softmax(-1).gather(-1, labels[:, None, None].expand(-1, steps.shape[1], 1)).squeeze(-1)
        loss = (weights * nll).sum(dim=1).mean()  # (B, T) per-step CE, weighted t/n, mean over rows
        correct = (self._gain_pooled(steps, weights).argmax(-1) == labels).sum().item()
        return loss, {"loss": (loss.item() * n, n), "accuracy": (correct, n)}


class LstmTaskAdapter:
    """A sentence (pair) task's adapter with the LSTM classifier as its head; everything else
    (reading, scoring, labels, ``predict_file``, ``inference_methods``) is the task's own."""

    def __init__(self, task_adapter, pooling: str) -> None:
        self.task_adapter, self.pooling = task_adapter, pooling

    def __getattr__(self, name: str):
        if name == "task_adapter":  # not set yet (copy.copy): no recursion
            raise AttributeError(name)
        return getattr(self.task_adapter, name)

    @property
    def hparams(self):
        return dataclasses.replace(self.task_adapter.hparams, learning_rate=LSTM_LEARNING_RATE)

    def build_module(self, backbone, pad_id: int) -> LstmClassifier:
        from ember.tasks.families.feature_transfer import FeatureBackbone

        if isinstance(backbone, FeatureBackbone):  # its pooled output has no LSTM final state: a traceback at step 1
            raise EmberError("--features mixes a Transformer encoder's layers; an LSTM run (Dai & Le 2015) fine-tunes "
                             "whole, from its final state or pooled outputs: drop --features (ELMo's layer mix is "
                             "`ember elmo-features`)")
        return LstmClassifier(backbone, self.task_adapter.spec.num_labels, pad_id, self.pooling)


def adapt(adapter, model) -> LstmTaskAdapter:
    """The LSTM form of a task's adapter; only sentence (pair) classification and regression."""
    from ember.tasks.glue_adapter import GlueAdapter

    if not isinstance(adapter, GlueAdapter):
        raise EmberError(f"{adapter.display_name} is a per-token task (tagging or question answering), which "
                         "needs a Transformer encoder; an LSTM run (model family lstm, Dai & Le 2015) "
                         "fine-tunes on sentence classification and regression (GLUE-style tasks, nsmc, "
                         "rusentiment). Use a bert-*/roberta-* run for this task")
    return LstmTaskAdapter(adapter, model.lstm_pooling)


def not_served(cfg, state_keys):
    """``ember.tasks.inference.pretrained`` entry of the LSTM objectives: a pre-trained LSTM has no head to serve."""
    raise EmberError(f"a {cfg.objective} pre-training run (Dai & Le's LSTM) has no inference endpoint: fine-tune "
                     "it as a classifier (`ember finetune --task nsmc --init RUN`) and serve that run's /classify")
