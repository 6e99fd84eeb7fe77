"""Your own text-to-text data: any input text -> any target text (translation, summarisation,
rewriting, short answers), fine-tuned into an encoder-decoder (T5, Raffel et al. 2020).

    ember finetune --task text2text --train pairs.jsonl --dev pairs-dev.jsonl --init runs/t5-mini

Files are CSV, TSV or JSON Lines (``ember.tasks.readers.table_files``) with an input column
(``--text-column``; by default the first of ``input``, ``inputs``, ``source``, ``text``,
``document``, ``question``) and a target column (``--label-column``; ``target``, ``targets``,
``output``, ``summary``, ``answer``, ``label``). The input is fed as written, with no task
prefix; in a mixture of several tasks in one model (``ember finetune --tasks``) it starts with the
task's own prefix, as T5's tasks do ("NAME: <input>", ``ember.tasks.text2text.templates``), or
with the one your file holds (``prefix=``, empty). The target is the text to produce.
Whitespace runs count as one space in both.

There is no label set, so every decoded output is valid, and it is scored against its target
by ``ember.tasks.metrics.text``: exact match, SQuAD's token F1 (the run's main metric, which
picks the best epoch: it credits partial outputs, where exact match is all or nothing),
corpus BLEU (sacrebleu's default) and ROUGE-1/2/L/Lsum F-measures (rouge-score's defaults), all
on a 0-100 scale.

Only an encoder-decoder can be fine-tuned to produce text here: ``ember.tasks.base.get_adapter``
refuses this task for an encoder, GPT, XLNet or LSTM run before anything is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ember.errors import EmberError
from ember.tasks.readers.custom_files import CustomFiles
from ember.tasks.readers.glue import BertHParams
from ember.tasks.readers.table_files import Table, pick_column, read_table, text_cell

KIND = "text2text"
INPUT_COLUMNS = ("input", "inputs", "source", "text", "document", "question")
TARGET_COLUMNS = ("target", "targets", "output", "summary", "answer", "label")


@dataclass(frozen=True)
class TextPair:
    """One row: its id, the input text, and the target text (None in an unlabelled file)."""

    guid: str
    source: str
    target: str | None


def text2text_columns(table: Table, text: str | None, target: str | None) -> dict:
    """The input and target columns of a text2text file: the named ones, or the usual names."""
    source = pick_column(table, text, INPUT_COLUMNS, "--text-column", "input text")
    target = pick_column(table, target, TARGET_COLUMNS, "--label-column", "target text")
    if source == target:
        raise EmberError(f"{table.source}: the input and the target are the same column {source!r}; name the "
                         "target with --label-column")
    return {"text_column": source, "label_column": target}


class CustomText2TextAdapter(CustomFiles):
    """The task's reader and metric; ``ember.tasks.text2text.task.Text2TextAdapter`` wraps it for a T5 run."""

    needs_decoder = True  # ember.tasks.base.get_adapter: only an encoder-decoder produces text
    main_metric = "f1"
    hparams = BertHParams()  # batch 32, 3 epochs, max length 128 (the T5 wrapper sets its lr and optimizer)

    def __init__(self, record: dict) -> None:
        self._init_record(record)
        self.name, self.display_name = KIND, self.display
        self.tables: dict[Path, Table] = {}

    def discover(self) -> None:
        """Nothing to discover: targets are free text, not a label set."""

    # The decoding budget (twice the longest target, ``Text2TextEncoder.budget``) is sized on
    # the targets fine-tuning read (train and dev) and kept in the record, so a later `ember
    # predict` on inputs alone, or `ember evaluate` on another file, decodes within the same
    # budget as fine-tuning's evaluations, not up to the decoder's limit.
    def longest_target(self) -> int:
        """Tokens (with </s>) of the longest target the run was fine-tuned and evaluated on; 0: unknown."""
        return int(self.record_data.get("longest_target", 0))

    def note_longest_target(self, tokens: int) -> None:
        self.record_data["longest_target"] = max(self.longest_target(), tokens)

    def label_names(self) -> None:
        return None

    def read(self, split, path=None, limit=None) -> list[TextPair]:
        return self._pairs(self.split_file(split, path), require_target=True)[:limit]

    def read_inputs(self, path) -> list[TextPair]:
        return self._pairs(Path(path), require_target=False)

    def _pairs(self, file: Path, require_target: bool) -> list[TextPair]:
        if file not in self.tables:
            self.tables[file] = read_table(file)
        table, source, target = self.tables[file], self.record_data["text_column"], self.record_data["label_column"]
        pick_column(table, source, (), f"the run's input column {source!r}", "")
        if require_target:
            pick_column(table, target, (), f"the run's target column {target!r}", "")
        pairs = []  # an input file's targets, if it has any, are not read: predict only decodes
        for n, (where, row) in enumerate(table.rows):
            pairs.append(TextPair(str(row.get("id", row.get("guid", f"{file.stem}-{n}"))), text_cell(row, source, where),
                                  text_cell(row, target, where) if require_target else None))
        if not pairs:
            raise EmberError(f"{file}: no rows")
        return pairs

    def metrics_of(self, outputs: list[str], examples: list[TextPair]) -> dict[str, float]:
        from ember.tasks.metrics.text import generation_metrics

        return generation_metrics(outputs, [ex.target for ex in examples])
