"""Text-to-text fine-tuning of an encoder-decoder (T5, Raffel et al. 2020): every task is text in,
text out, with one model, one loss and one decoding procedure.

``adapt`` is registered for the ``t5`` family in ``ember.tasks.base.FAMILY_ADAPTERS``: it turns a
task's encoder adapter into ``Text2TextAdapter``, so `ember finetune --task sst2 --init <t5 run>`
(and ``ember.finetune``, `ember glue`, `ember evaluate`, `ember predict`, `ember serve`) train
and use this. The task's reader and official metric stay the encoder adapter's; what changes:

* Inputs and targets are text (``ember.tasks.text2text.templates``: the prefixes of Appendix D,
  labels as words, STS-B scores as "3.8"), turned into ids by ``ember.tasks.text2text.encoding``
  (prefixes never cut, </s> at the end; a target beyond the decoder's limit is an error).
* The task model (``Text2TextModel``) is the backbone alone: ``forward`` is the seq2seq loss
  with teacher forcing (ember.nn.lm_loss.seq2seq_loss, the pre-training loss), no new head,
  so a fine-tuned run holds exactly T5ForConditionalGeneration's weights (`ember convert
  --to-hf` exports it as is).
* Predictions are greedy decodes (T5 decodes greedily but for its long-output tasks, which get
  beam search, §3.7: ``--set task.num_beams=4 --set task.length_penalty=0.6``), batched by input length, of at most the longest valid target + 1 tokens
  (the extra one shows a model that goes on past a label), parsed back to a class id, score
  or span. Invalid outputs count as wrong and their share is the metric ``invalid``. Your own
  input -> target files (``--task text2text``, ``ember.tasks.text2text.custom``) decode free
  text, scored by exact match, token F1, BLEU and ROUGE.

Fine-tuning defaults (``T5_TRAIN``, ``Text2TextAdapter.hparams``): the paper fine-tunes with
Adafactor at a constant learning rate of 0.001 (§3.1.3) - the T5 code's Adafactor, with
update clipping and steps scaled by each parameter's RMS (``train.adafactor_*`` defaults) -
and no weight decay; ember does the same with no warm-up and no gradient clipping (Adafactor
clips its updates instead). The paper's batch (128 inputs of 512 tokens) and step count
(2^18) are beyond a CPU; ember keeps the encoder tasks' batch 32, 3 epochs and max length 128
(SQuAD: 512, T5's input length, since a text-to-text model cannot slide windows over a long
context), so a T5 and a BERT fine-tune on the same examples for the same number of steps.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ember.errors import EmberError
from ember.nn.lm_loss import seq2seq_loss
from ember.tasks.featurize import note_truncated
from ember.tasks.readers.glue import BertHParams
from ember.tasks.text2text.encoding import (
    NO_GRAPH_REASON,
    Text2TextEncoder,
    batched_decode,
    same_text,
)
from ember.tasks.text2text.decanlp import template_in_set
from ember.tasks.text2text.templates import template_for

# TrainConfig defaults of every text-to-text fine-tuning (see the module docstring).
T5_TRAIN = {"optimizer": "adafactor", "schedule": "constant", "weight_decay": 0.0, "max_grad_norm": 0.0}
T5_LR = 1e-3  # Raffel et al. 2020, §3.1.3: "a constant learning rate of 0.001"
SQUAD_INPUT_LENGTH = 512  # T5's input length (§3.1.3); the context is cut, not windowed


def _note_unspellable_targets(enc, examples, where: str) -> None:
    """Free-text targets the tokenizer cannot give back (a character it maps to <unk>, or rewrites
    as NFKC does: "½" -> "1⁄2"): no output can match them exactly, which the user should know
    before reading exact match. Compared as exact match compares, whitespace-normalised."""
    lost = []
    for ex in examples:
        target = getattr(ex, "target", None)
        if target is None:
            continue
        back = enc.tokenizer.decode(enc.ids(target))
        if not same_text(back, target):
            lost.append((target, back))
    if lost:
        target, back = lost[0]
        print(f"note: {where}: the tokenizer cannot spell {len(lost)} of {len(examples)} targets as written "
              f"(e.g. {target[:40]!r} comes back as {back[:40]!r}), so exact match cannot reach them; a tokenizer "
              "trained on text holding their characters can", file=sys.stderr)


def _pad(rows: list[list[int]], value: int) -> torch.Tensor:
    out = torch.full((len(rows), max(len(r) for r in rows)), value, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, :len(row)] = torch.as_tensor(row, dtype=torch.long)
    return out


class Text2TextModel(nn.Module):
    """The task model of every text-to-text task: the encoder-decoder itself (no new head)."""

    def __init__(self, backbone: nn.Module, pad_id: int) -> None:
        super().__init__()
        if not hasattr(backbone, "decode"):
            raise EmberError("text-to-text fine-tuning trains the whole encoder-decoder, but the backbone has no "
                             "decoder (--features freezes an encoder for a classifier head): drop --features")
        self.backbone, self.pad_id = backbone, pad_id

    def make_batch(self, features: list[dict], rng=None) -> dict[str, torch.Tensor]:
        """input_ids / attention_mask (B, S) padded on the right, labels (B, T) with -100 after each target."""
        input_ids = _pad([f["input_ids"] for f in features], self.pad_id)
        lengths = torch.tensor([len(f["input_ids"]) for f in features])[:, None]  # (B, 1)
        mask = (torch.arange(input_ids.shape[1])[None, :] < lengths).long()
        return {"input_ids": input_ids, "attention_mask": mask, "labels": _pad([f["labels"] for f in features], -100)}

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        return seq2seq_loss(self.backbone, batch)

    @torch.no_grad()
    def generate(self, features: list[dict], max_new_tokens: int, eos_id: int, batch_size: int = 64,
                 num_beams: int = 1, length_penalty: float = 1.0) -> list[list[int]]:
        was_training = self.training
        self.eval()
        try:
            return batched_decode(self.backbone, [f["input_ids"] for f in features], max_new_tokens, eos_id,
                                  batch_size, num_beams, length_penalty)
        finally:
            self.train(was_training)


class Text2TextAdapter:
    """A task fine-tuned text to text: the encoder adapter's reader and official metric, T5's
    format, loss and decoding (see the module docstring)."""

    graph = False  # served by a decoding loop on the PyTorch model (ember.serve.predictor)
    no_graph_reason = NO_GRAPH_REASON

    def __init__(self, inner, model_cfg) -> None:
        self.inner, self.template, self.templates = inner, template_for(inner), "t5"
        self.decoder_limit = model_cfg.max_position  # the most tokens ember decodes
        self.name, self.display_name, self.kind = inner.name, inner.display_name, self.template.kind
        self.report_splits = getattr(inner, "report_splits", ())
        self.train_defaults = dict(T5_TRAIN)
        self.decoding = {"num_beams": 1, "length_penalty": 1.0}  # greedy; ``set_decoding`` from task.*
        self.max_new_tokens = 0  # 0: the encoder's budget for the task (``decode_budget``)
        self._encoder: Text2TextEncoder | None = None
        self._tokenizer = None

    @property
    def main_metric(self) -> str:
        # SQuAD 2.0's tuned_f1 needs a no-answer score per question; a decoder says its answer
        # (or "unanswerable") instead, so F1 is its official number.
        return "f1" if self.kind == "answer" else self.inner.main_metric

    @property
    def hparams(self) -> BertHParams:
        hp = getattr(self.inner, "hparams", BertHParams())
        return BertHParams(learning_rate=T5_LR, batch_size=hp.batch_size, epochs=hp.epochs, warmup_ratio=0.0,
                           max_length=SQUAD_INPUT_LENGTH if self.kind == "answer" else hp.max_length)

    def label_names(self):
        return self.inner.label_names()

    def set_decoding(self, task_cfg) -> None:
        """Decode as the run's ``task.num_beams`` / ``task.length_penalty`` / ``task.max_new_tokens``
        say (greedy, within the task's budget, by default)."""
        if task_cfg.num_beams < 1 or task_cfg.length_penalty <= 0:
            raise EmberError(f"task.num_beams={task_cfg.num_beams}, task.length_penalty={task_cfg.length_penalty}: "
                             "use 1 beam (greedy) or more, and a positive length penalty (T5: 4 beams, 0.6)")
        if not 0 <= task_cfg.max_new_tokens <= self.decoder_limit:
            raise EmberError(f"task.max_new_tokens={task_cfg.max_new_tokens}: decode between 1 and "
                             f"{self.decoder_limit} tokens (model.max_position, the most tokens ember decodes), "
                             "or 0 for the task's own budget")
        self.decoding = {"num_beams": task_cfg.num_beams, "length_penalty": task_cfg.length_penalty}
        self.max_new_tokens = task_cfg.max_new_tokens

    def set_templates(self, templates: str) -> None:
        """Write the task as the run's ``task.templates`` says: "t5" (Appendix D's prefixes) or
        "decanlp" (a question over a context; ember.tasks.text2text.decanlp)."""
        if templates != self.templates:
            self.template, self.templates, self._encoder = template_in_set(self.inner, templates), templates, None

    def decode_budget(self, encoder: Text2TextEncoder) -> int:
        """Tokens to decode per output: ``task.max_new_tokens``, else the task's own budget."""
        return self.max_new_tokens or encoder.budget(self.decoder_limit)

    def encoder(self, tokenizer, max_length: int) -> Text2TextEncoder:
        """The encoder for this tokenizer and length (checked once: it can spell every label)."""
        enc = self._encoder
        if enc is None or self._tokenizer is not tokenizer or enc.max_length != max_length:
            enc = Text2TextEncoder(self.template, tokenizer, max_length)
            enc.check_targets()
            if hasattr(self.inner, "longest_target"):  # your own targets: the budget fine-tuning sized
                enc.longest_target = self.inner.longest_target()
            self._encoder, self._tokenizer = enc, tokenizer
        return enc

    def load(self, split, tokenizer, max_length, limit=None, path=None):
        examples = self.inner.read(split, path, limit)
        enc = self.encoder(tokenizer, max_length)
        features, n_truncated = enc(examples, self.decoder_limit,
                                    where=f"{self.display_name} {split if path is None else path}: ")
        if hasattr(self.inner, "note_longest_target"):  # kept in RUN/task.json for predict and evaluate
            self.inner.note_longest_target(enc.longest_target)
        if n_truncated:
            note_truncated(f"{self.display_name} {split if path is None else path}", n_truncated, len(examples),
                           "text-to-text inputs", max_length)
        if self.kind == "generate":
            _note_unspellable_targets(enc, examples, f"{self.display_name} {split if path is None else path}")
        return examples, features

    def build_module(self, backbone, pad_id) -> Text2TextModel:
        return Text2TextModel(backbone, pad_id)

    def outputs(self, module: Text2TextModel, features, batch_size: int = 64) -> list[str]:
        """The output text of each feature, decoded as ``decoding`` says (the encoder of the last ``load``)."""
        enc = self._encoder
        if enc is None:
            raise EmberError("load() the examples first: the outputs are decoded with their tokenizer")
        ids = module.generate(features, self.decode_budget(enc), enc.eos_id, batch_size, **self.decoding)
        return [enc.tokenizer.decode(x) for x in ids]

    def score(self, module, examples, features, batch_size, device) -> dict[str, float]:
        parsed = [self.template.parse(out, ex) for out, ex in zip(self.outputs(module, features, batch_size), examples)]
        invalid = float(np.mean([not p.valid for p in parsed]))
        if self.kind == "generate":  # your own targets, scored as text (ember.tasks.text2text.custom)
            return {**self.inner.metrics_of([p.value for p in parsed], examples), "invalid": invalid}
        if self.kind == "answer":
            from ember.tasks.metrics.squad import squad_evaluate

            gold = {ex.qid: ex.answer_texts for ex in examples}
            preds = {ex.qid: p.value for ex, p in zip(examples, parsed)}
            metrics = squad_evaluate(gold, preds, wrong={ex.qid for ex, p in zip(examples, parsed) if not p.valid})
        else:
            labels = np.asarray([ex.label for ex in examples])
            preds = np.asarray([self.template.scored(p, y) for p, y in zip(parsed, labels)])
            metrics = self.inner.metrics_of(preds, labels)
        return {**metrics, "invalid": invalid}

    # -- `ember predict`: the task's input file in, one decoded and parsed output per row out
    def predict_file(self, module, tokenizer, max_length, path, batch_size, device):
        examples = self.inner.read_inputs(path)
        features, n_truncated = self.encoder(tokenizer, max_length)(examples)
        rows = []
        for ex, out in zip(examples, self.outputs(module, features, batch_size)):
            p = self.template.parse(out, ex)
            value = p.value if p.valid else None  # a QA parse keeps the text it rejected; "output" shows it
            if p.valid and self.kind == "classify" and not self.template.is_regression:
                value = self.template.words[value]
            rows.append({"id": getattr(ex, "guid", None) or ex.qid, "prediction": value, "valid": p.valid,
                         "output": out})
        return rows, n_truncated

    def rows_to_tsv(self, rows) -> str:
        """id, prediction (empty when the output is invalid), valid, and the raw output."""
        lines = ["id\tprediction\tvalid\toutput"]
        for r in rows:
            cells = [r["id"], "" if r["prediction"] is None else str(r["prediction"]), str(r["valid"]).lower(),
                     r["output"]]
            lines.append("\t".join(c.replace("\t", " ").replace("\n", " ") for c in cells))
        return "\n".join(lines) + "\n"

    # -- serving (ember.serve): the PyTorch model in a decoding loop, no exported graph
    def load_model(self, run_dir: str | Path):
        from ember.tasks.text2text.methods import load_model

        return load_model(run_dir)

    def inference_methods(self, ctx) -> list:
        from ember.tasks.text2text.methods import (
            Seq2SeqGenerateMethod,
            Text2TextAnswerMethod,
            Text2TextClassifyMethod,
        )

        from ember.tasks.inference.scoring import Seq2SeqScoreMethod

        if self.kind == "generate" and self.template.prefix:  # your own texts with a prefix (a mixture's)
            from ember.tasks.text2text.methods import Text2TextGenerateMethod

            return [Text2TextGenerateMethod(self, ctx), Seq2SeqScoreMethod(ctx)]
        generic = [Seq2SeqGenerateMethod(ctx), Seq2SeqScoreMethod(ctx)]
        if self.kind == "generate":  # free text out: generate is the task's own method
            return generic
        task_method = Text2TextAnswerMethod if self.kind == "answer" else Text2TextClassifyMethod
        return [task_method(self, ctx), *generic]


def adapt(adapter, model) -> Text2TextAdapter:
    """The text-to-text form of a task's encoder adapter (a task without a template is refused)."""
    return Text2TextAdapter(adapter, model)
