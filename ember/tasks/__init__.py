"""Fine-tuning tasks: how each task is read, featurized, fitted with a head, answered and scored.

The floors, bottom to top (each package's docstring says what it may import; tests/test_layering.py
checks it):

* ``readers/``   files -> examples (GLUE-style TSV and the task specs, CoNLL, your CSV/TSV/JSONL);
* ``metrics/``   each benchmark's official metric (GLUE, CoNLL entity F1, SQuAD EM/F1, BLEU/ROUGE);
* ``inference/`` what a trained model answers (embed, fill-mask, generate, score, few-shot) and the
  request checks the HTTP server shares;
* here, the encoder heads and task adapters: ``classification`` + ``glue_adapter`` (sentence (pair)
  classification and regression), ``sentiment`` (NSMC, RuSentiment), ``tagging`` (CoNLL NER), and
  ``qa/`` (SQuAD); with the plumbing they share (``featurize``, ``batching``, ``wrapped``);
* ``families/`` (GPT, XLNet, LSTM, XLM language ids, ELMo features, knowledge graphs) and
  ``text2text/`` (T5): adapters that turn an encoder task into another family's;
* ``base`` (the adapter interface and the registry of task names and families), ``custom`` (your own
  files, for every head) and ``task_model`` (build / load / score a run's task model) on top.

Adding a task: its reader in ``readers/``, its adapter beside ``glue_adapter`` (or in ``qa/``), one
line in ``base.LAZY_ADAPTERS``. Adding a family: one module in ``families/``, one line in
``base.FAMILY_ADAPTERS``.
"""

from ember.tasks.featurize import Featurized, collate, encode_examples
from ember.tasks.readers.glue import (
    TASKS,
    BertHParams,
    Example,
    TaskSpec,
    get_task,
    read_examples,
    read_tsv_examples,
)
from ember.tasks.metrics.classification import compute_metrics

__all__ = [
    "TASKS",
    "BertHParams",
    "Example",
    "Featurized",
    "TaskSpec",
    "collate",
    "compute_metrics",
    "encode_examples",
    "get_task",
    "read_examples",
    "read_tsv_examples",
]
