"""A list of ready-made examples (features) as a training dataset for ``ember.train.loop.Trainer``.

The Trainer reads any object with ``len()`` and ``example(index, epoch)``; fine-tuning,
distillation and the ELMo feature runs hold their featurized examples in memory, and the
epoch does not change them (corruption, where there is any, happens in ``make_batch``).
Given the examples' lengths, the Trainer can group them into batches of similar length
(``ember.train.length_groups``), keeping examples of one group (``groups``) apart.
"""

from __future__ import annotations

from typing import Any, Sequence


class InMemoryData:
    def __init__(self, examples: Sequence[Any], lengths: Sequence[int] | None = None,
                 groups: Sequence[int] | None = None) -> None:
        """``lengths``: tokens per example, for length-grouped batches (``train.group_by_length``);
        ``groups``: which examples share a text (one paragraph's questions), kept apart in them."""
        for name, values in (("lengths", lengths), ("groups", groups)):
            if values is not None and len(values) != len(examples):
                raise ValueError(f"{len(values)} {name} for {len(examples)} examples")
        self.examples = examples
        self._lengths, self._groups = lengths, groups

    def __len__(self) -> int:
        return len(self.examples)

    def lengths(self) -> Sequence[int] | None:
        return self._lengths

    def groups(self) -> Sequence[int] | None:
        return self._groups

    def example(self, index: int, epoch: int) -> Any:
        return self.examples[index]
