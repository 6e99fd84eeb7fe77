"""The knowledge-effect table and chart, computed from ``knowledge_effect.py``'s records alone (a
saved table.json can be re-rendered).

The statistics are ``_seed_table``'s (means, spreads, paired differences to the baseline). K-BERT's
paper reports gains of a point or less on most tasks and none on some (Liu et al. 2020,
Tables 1-2); with three seeds a difference smaller than its spread is no effect.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _seed_table  # noqa: E402

NAMES = {"baseline": "no knowledge", "kbert": "K-BERT (WordNet)", "ernie": "ERNIE fusion (TransE)",
         "ernie-dea": "ERNIE fusion + dEA pre-training", "kbert+ernie": "K-BERT + ERNIE"}


def summarize(records: list[dict]) -> dict:
    """records (one per task, variant, seed) -> {task: {split: {variant: stats (+ vs baseline)}}}."""
    return _seed_table.summarize(records, reference="baseline")


def render_markdown(result: dict) -> str:
    table, meta = result["table"], result["meta"]
    lines = [f"# Knowledge in the encoder: {meta['checkpoint']}", "",
             f"{meta['machine']}. Seeds {', '.join(map(str, meta['seeds']))}; train limit "
             f"{meta['train_limit'] or 'none'}, {meta['epochs']} epoch(s), lr {meta['lr']}, max length "
             f"{meta['max_length']}. K-BERT graph: {meta['graph']} (k = {meta['max_triples']}); entities: "
             f"{meta['entities']}. Main metric x 100 (SST-2 accuracy; CoNLL-2003 entity F1), mean ± sample "
             "std over seeds; delta = mean paired difference to the baseline ± its std (seeds won).", ""]
    lines += _seed_table.table_lines(table, meta["variants"], NAMES)
    if result.get("knowledge"):
        lines += ["", "What the knowledge did to the inputs (training sentences):", ""]
        lines += [f"- {task} {variant}: {line}" for (task, variant), line in
                  ((tuple(k.split("/", 1)), v) for k, v in result["knowledge"].items())]
    lines += ["", "Read honestly: a delta within its spread (or won on fewer than all seeds) is no evidence of "
              "an effect; K-BERT's own gains were about a point on some Chinese tasks and none on others.", ""]
    return "\n".join(lines)


def write_chart(result: dict, path: Path) -> Path | None:
    """Bars of each variant's mean per task/split with the seeds as dots; None without matplotlib."""
    return _seed_table.bar_chart(result["table"], result["meta"]["variants"], NAMES, path,
                                 f"Knowledge in {result['meta']['checkpoint']} ({len(result['meta']['seeds'])} seeds)",
                                 "accuracy / entity F1 (x100)")
