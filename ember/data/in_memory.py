"""A list of ready-made examples (features) as a training dataset for ``ember.train.loop.Trainer``.

The Trainer reads any object with ``len()`` and ``example(index, epoch)``; fine-tuning,
distillation and the ELMo feature runs hold their featurized examples in memory, and the
epoch does not change them (corruption, where there is any, happens in ``make_batch``).
"""

from __future__ import annotations

from typing import Any, Sequence


class InMemoryData:
    def __init__(self, examples: Sequence[Any]) -> None:
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    def example(self, index: int, epoch: int) -> Any:
        return self.examples[index]
