"""Sentence (pair) classification and regression tasks (GLUE-style ``ember.tasks.readers.glue`` specs).

The task adapter of SST-2, CoLA, MRPC, RTE, STS-B, QNLI, SNLI (and, through subclasses,
NSMC and RuSentiment): it reads a split with the spec's reader, encodes it with the
tokenizer's own template (``[CLS] a [SEP] b [SEP]``), puts a ``SequenceClassifier`` on the
backbone and scores with the task's official metric (``ember.tasks.metrics.classification``). Other
backbones change the input format and the head through their own subclass (GPT-1:
``ember.tasks.families.gpt``), chosen in ``ember.tasks.base.get_adapter``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


class GlueAdapter:
    """Sentence (pair) classification / regression (``ember.tasks.readers.glue`` specs, [CLS] head)."""

    kind = "classify"  # its inference method (``inference_methods``)

    def __init__(self, spec) -> None:
        self.spec = spec
        self.language = spec.language  # of the texts (``task.language`` overrides it)

    name = property(lambda self: self.spec.name)
    display_name = property(lambda self: self.spec.display_name)
    main_metric = property(lambda self: self.spec.main_metric)
    hparams = property(lambda self: self.spec.bert_hparams)

    @property
    def report_splits(self) -> tuple[str, ...]:
        """Scored with the best-on-dev weights after training (``ember.train.finetune.other_splits``):
        ``test`` where the task's test file is here and labelled (MRPC), never chosen on."""
        from ember.tasks.readers.glue import has_labels

        return ("test",) if has_labels(self.spec, "test") else ()

    def label_names(self) -> list[str]:
        spec = self.spec
        return list(spec.label_names or spec.labels) if spec.labels else ["score"]

    def read(self, split, path=None, limit=None) -> list:
        """The labelled examples of a split (or of ``path`` in the task's layout)."""
        from ember.tasks.readers.glue import read_examples

        return read_examples(self.spec, split, path=path, limit=limit)

    def load(self, split, tokenizer, max_length, limit=None, path=None):
        examples = self.read(split, path, limit)
        features, n_truncated = self.encode(examples, tokenizer, max_length)
        if n_truncated:
            from ember.tasks.featurize import note_truncated

            note_truncated(f"{self.spec.display_name} {split if path is None else path}", n_truncated, len(examples),
                           "examples", max_length)
        return examples, features

    def build_module(self, backbone, pad_id):
        from ember.tasks.classification import SequenceClassifier

        return SequenceClassifier(backbone, self.spec.num_labels, pad_id)

    def inference_methods(self, ctx) -> list:
        from ember.tasks.classification import ClassifyMethod

        return [ClassifyMethod(ctx)]

    def score(self, module, examples, features, batch_size, device):
        from ember.tasks.classification import predictions_from_logits

        logits = module.predict(features, batch_size, device)
        labels = np.asarray([f["label"] for f in features])
        return self.metrics_of(predictions_from_logits(logits, self.spec.is_regression), labels)

    def metrics_of(self, predictions, labels) -> dict[str, float]:
        """The task's official metrics of class ids (or scores) against the gold labels; every
        head of the task (a [CLS] classifier, a text-to-text decoder) is scored through here."""
        from ember.tasks.metrics.classification import compute_metrics

        return compute_metrics(self.spec, predictions, labels)

    def encode(self, examples, tokenizer, max_length):
        """Examples -> features (the tokenizer's own [CLS]/[SEP] template)."""
        from ember.tasks.featurize import encode_examples

        return encode_examples(examples, tokenizer, max_length)

    def read_inputs(self, path) -> list:
        """The examples of a user's file for `ember predict` (TSV in the task's layout or JSONL;
        labels optional)."""
        from ember.tasks.readers.glue import read_tsv_examples

        if Path(path).suffix == ".jsonl":
            from ember.tasks.readers.jsonl_input import read_jsonl_examples

            return read_jsonl_examples(path, self.spec)
        return read_tsv_examples(path, self.spec)

    def predict_file(self, module, tokenizer, max_length, path, batch_size, device):
        examples = self.read_inputs(path)
        features, n_truncated = self.encode(examples, tokenizer, max_length)
        logits = module.predict(features, batch_size, device)
        names = self.label_names()
        rows = []
        for ex, row in zip(examples, logits):
            if module.is_regression:
                rows.append({"id": ex.guid, "prediction": float(row[0])})
            else:
                probs = np.exp(row - row.max())
                probs /= probs.sum()
                rows.append({"id": ex.guid, "prediction": names[int(row.argmax())],
                             "probabilities": {n: round(float(p), 6) for n, p in zip(names, probs)}})
        return rows, n_truncated

    def rows_to_tsv(self, rows):
        """id, prediction and one p_<label> column per label (classification)."""
        names = [] if self.spec.is_regression else self.label_names()
        lines = ["\t".join(["id", "prediction"] + [f"p_{n}" for n in names])]
        for r in rows:
            lines.append("\t".join([r["id"], str(r["prediction"])] + [str(r["probabilities"][n]) for n in names]))
        return "\n".join(lines) + "\n"
