"""The task-adapter interface that `ember finetune` / `evaluate` / `predict` drive, and its registry.

A fine-tuning task is everything that differs between, say, SST-2 and CoNLL-2003 NER: how a
split is read and turned into features, which head sits on the encoder, and how predictions
are scored. The training loop, checkpointing, best-on-dev selection and seeds are shared
(``ember.train.finetune``). Every head takes an ``ember.models.Encoder`` backbone, so every
task works with every family (BERT, RoBERTa, ALBERT, ELECTRA, DistilBERT).

Registry: GLUE-style tasks map to ``ember.tasks.glue_adapter.GlueAdapter`` (wrapping ``ember.tasks.readers.glue`` specs),
``conll2003`` to ``ember.tasks.tagging.ConllNerAdapter`` and ``squad``/``squad2`` to
``ember.tasks.qa.task.SquadAdapter``. Non-GLUE adapters are imported lazily by module
path, so a missing optional module only matters when its task is asked for. Custom tasks on
a user's files (``ember.tasks.custom``) are described by a record, kept in RUN/task.json;
``get_adapter(record)`` rebuilds them.
"""

from __future__ import annotations

import copy
import importlib
import inspect
from pathlib import Path
from typing import Protocol, runtime_checkable

from tokenizers import Tokenizer
from torch import nn

from ember.errors import EmberError
from ember.model_config import SEQ2SEQ_FAMILIES
from ember.tasks.readers.glue import TASKS


@runtime_checkable
class TaskAdapter(Protocol):
    """What a task provides. Optional extras, looked up with ``getattr``:

    * ``hparams: BertHParams`` - fine-tuning defaults (else ``BertHParams()``);
    * ``report_splits: tuple[str, ...]`` - splits also scored after training (e.g. test);
    * ``language: str`` - the language of the task's texts (else "en"), for XLM's language ids;
    * ``model_config(model) -> ModelConfig`` - the backbone's shape for this task, when a
      family fine-tunes another shape than it pre-trains (XLNet: no memory);
    * ``run_tokenizer(tokenizer) -> Tokenizer`` - the tokenizer a fine-tuned run keeps, when
      a family reads another input layout than the tokenizer's template (XLNet);
    * ``predict_file(module, tokenizer, max_length, path, batch_size, device) -> (rows, n_truncated)``
      and ``rows_to_tsv(rows) -> str`` - for ``ember predict``.
    """

    name: str
    display_name: str
    main_metric: str

    def load(self, split: str, tokenizer: Tokenizer, max_length: int, limit: int | None = None,
             path: str | Path | None = None) -> tuple[list, list[dict]]:
        """(examples, features) of a split of the shared data, or of ``path`` in the task's format."""

    def build_module(self, backbone: nn.Module, pad_id: int) -> nn.Module:
        """The task model: ``make_batch(features, rng)``, ``forward(batch) -> (loss, metrics)``."""

    def score(self, module: nn.Module, examples: list, features: list[dict], batch_size: int,
              device: str) -> dict[str, float]:
        """The task's official metrics of ``module`` on labelled examples (flat name -> float)."""

    def label_names(self) -> list[str] | None:
        """Output label names written to RUN/labels.json (None: the task has no label set)."""


# task name -> "module:Class" of adapters outside GLUE (imported on first use).
LAZY_ADAPTERS = {
    "conll2003": "ember.tasks.tagging:ConllNerAdapter",
    "squad": "ember.tasks.qa.task:SquadAdapter",
    "squad2": "ember.tasks.qa.task:SquadAdapter",
    "nsmc": "ember.tasks.sentiment:SentimentAdapter",
    "rusentiment": "ember.tasks.sentiment:SentimentAdapter",
    "rusentimentbinary": "ember.tasks.sentiment:SentimentAdapter",  # positive/negative, SST-2's labels
}
ALIASES = {"conll": "conll2003", "conll03": "conll2003", "ner": "conll2003"}
# Custom tasks on the user's own files (`ember finetune --task classify --train F --dev F`):
# kind -> "module:function" that rebuilds the adapter from its task record (RUN/task.json).
CUSTOM_TASKS = {kind: "ember.tasks.custom:from_record"
                for kind in ("classify", "pair", "regression", "tag", "qa", "text2text")}
TASK_RECORD = "task.json"  # in a run folder: what rebuilds a custom task (the adapter's ``record()``)

# Backbone families whose input format or head differs from the encoders' ([CLS] head, the
# tokenizer's template): family -> "module:function" that turns a task's encoder adapter
# into that family's (or refuses the task with a clear message). Families not listed use
# the encoder adapters as they are. A new family that fine-tunes differently adds one line.
FAMILY_ADAPTERS = {
    "gpt": "ember.tasks.families.gpt:adapt",  # GPT-1's input transformations, §3.3
    "gpt2": "ember.tasks.families.gpt:adapt",
    "xlnet": "ember.tasks.families.xlnet:adapt",  # A <sep> B <sep> <cls>, left padding, last-token summary
    "t5": "ember.tasks.text2text.task:adapt",  # every task as text to text, Raffel et al. 2020 §2.4
    # BART's heads on the decoder's final states (Lewis et al. 2020 §3.1-3.2) for classification and
    # SQuAD; text to text on T5's adapters for the rest, or for every task with task.text2text=true
    "bart": "ember.tasks.families.bart:adapt",
    "lstm": "ember.tasks.families.lstm:adapt",  # Dai & Le 2015: classifier on the LSTM's last state
}
# Any model with language embeddings (XLM's, ``model.num_languages`` > 0) reads a language id
# per token: the task's adapter is wrapped to give its features the task's language.
LANGUAGE_ADAPTER = "ember.tasks.families.language_ids:adapt"


def task_names() -> list[str]:
    return sorted(TASKS) + sorted(LAZY_ADAPTERS)


def _load(target: str, what: str):
    module_name, _, name = target.partition(":")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise EmberError(f"{what} needs {module_name}.{name}, which cannot be loaded ({exc}); "
                         "this ember installation does not support it yet") from None


def get_adapter(task: str | TaskAdapter, model=None, language: str = "", settings=None) -> TaskAdapter:
    """The adapter of a task name (case and ``-``/``_`` insensitive, as ``get_task``), for the
    backbone family of ``model`` (a ModelConfig; None = an encoder); ``language`` overrides the
    language of the task's texts (``task.language``; "" = the task's own); ``settings``, a run's
    TaskConfig, gives the adapter the run's task options it takes (a T5 run's decoding,
    ``task.num_beams`` / ``task.length_penalty``)."""
    adapter = _get_adapter(task)
    if language:
        adapter = copy.copy(adapter)  # never change an adapter the caller passed in
        adapter.language, adapter.language_given = language, True
    family = getattr(model, "family", None)
    if getattr(adapter, "needs_decoder", False) and family not in SEQ2SEQ_FAMILIES:
        raise EmberError(f"--task {adapter.name} trains a model to write its target texts, which takes an "
                         f"encoder-decoder: this is a {family or 'bert'} model. Start from a T5 run (ember pretrain "
                         "--recipe t5-mini, or a T5 checkpoint imported with ember convert --from-hf)")
    if family in FAMILY_ADAPTERS:
        adapt = _load(FAMILY_ADAPTERS[family], f"fine-tuning a {family} model")
        # a family whose form of a task depends on the run's task settings takes them (BART: task.text2text)
        adapter = adapt(adapter, model, settings) if "settings" in inspect.signature(adapt).parameters \
            else adapt(adapter, model)
    if getattr(model, "num_languages", 0):
        adapter = _load(LANGUAGE_ADAPTER, "a model with language embeddings")(adapter, model)
    if settings is not None:
        apply_task_settings(adapter, settings)
    return adapter


def apply_task_settings(adapter, settings) -> None:
    """The run's task options an adapter takes (``settings``, a TaskConfig): a text-to-text run's
    decoding and template set; a template set other than T5's is refused elsewhere."""
    templates = getattr(settings, "templates", "t5")
    if hasattr(adapter, "set_templates"):
        adapter.set_templates(templates)
    elif templates != "t5":
        raise EmberError(f"task.templates={templates} writes tasks as text for a text-to-text run (T5, BART); "
                         f"this {adapter.display_name} run has a head per task: drop task.templates")
    if hasattr(adapter, "set_decoding"):
        adapter.set_decoding(settings)


def _get_adapter(task: str | dict | TaskAdapter) -> TaskAdapter:
    from ember.tasks.readers.glue import TaskSpec, get_task
    from ember.tasks.glue_adapter import GlueAdapter

    if isinstance(task, TaskSpec):
        return GlueAdapter(task)
    if isinstance(task, dict):  # a custom task's record (RUN/task.json)
        kind = task.get("kind")
        if kind not in CUSTOM_TASKS:
            raise EmberError(f"task record of kind {kind!r}; known kinds: {', '.join(CUSTOM_TASKS)}")
        return _load(CUSTOM_TASKS[kind], f"custom task {kind!r}")(task)
    if not isinstance(task, str):
        return task

    key = task.lower().replace("-", "").replace("_", "")
    key = ALIASES.get(key, key)
    if key in CUSTOM_TASKS:
        raise EmberError(f"--task {key} fine-tunes on your own files: give --train FILE and --dev FILE "
                         "(a run folder of such a task keeps them in its task.json)")
    if key in LAZY_ADAPTERS:
        cls = _load(LAZY_ADAPTERS[key], f"task {task!r}")
        # One class may serve several names (squad / squad2): it then takes the name.
        return cls(key) if inspect.signature(cls).parameters else cls()
    try:
        return GlueAdapter(get_task(key))
    except EmberError:
        raise EmberError(f"unknown task {task!r}; known tasks: {', '.join(task_names())}; or your own "
                         f"files with --task {'|'.join(CUSTOM_TASKS)} --train FILE --dev FILE") from None


def read_task_record(run_dir: str | Path) -> dict | None:
    """The custom task record of a run folder (None for a built-in task's run)."""
    import json

    path = Path(run_dir) / TASK_RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise EmberError(f"{path}: unreadable ({exc}); it describes the run's task and cannot be rebuilt "
                         "from config.yaml alone") from None
    if not isinstance(record, dict):
        raise EmberError(f"{path}: expected a JSON object describing the task")
    return record


def write_task_record(run_dir: str | Path, adapter) -> None:
    """RUN/task.json for an adapter that has a ``record()`` (custom tasks); nothing otherwise."""
    import json

    from ember.fileio import atomic_write_text

    record = None
    while adapter is not None and not callable(record):  # through a family's wrapper (T5, GPT, ...)
        record = getattr(adapter, "record", None)
        adapter = getattr(adapter, "inner", None) or getattr(adapter, "base", None)
    if callable(record):
        atomic_write_text(Path(run_dir) / TASK_RECORD, json.dumps(record(), indent=2))
