"""Fine-tuning tasks: readers, task specs, featurization and official metrics."""

from ember.tasks.featurize import Featurized, collate, encode_examples
from ember.tasks.glue import (
    TASKS,
    BertHParams,
    Example,
    TaskSpec,
    get_task,
    read_examples,
    read_tsv_examples,
)
from ember.tasks.metrics import compute_metrics

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
