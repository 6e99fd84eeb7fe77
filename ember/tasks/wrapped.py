"""A task adapter built on another: it changes a few of its methods and hands the rest on.

A backbone family that reads the same tasks differently (XLNet's input layout and sequence
summary, ``ember.tasks.families.xlnet``) or needs an extra input per token (XLM's language ids,
``ember.tasks.families.language_ids``) wraps the task's own adapter instead of subclassing each adapter
class: names, metrics, readers, scoring, tuned settings and inference methods stay the
task's, whatever the task is.
"""

from __future__ import annotations


class WrappedAdapter:
    def __init__(self, base) -> None:
        self.base = base

    def __getattr__(self, name: str):
        # Called only for what the wrapper itself does not define.
        if name == "base":  # not set yet (copy/pickle): no recursion through self.base
            raise AttributeError(name)
        return getattr(self.base, name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base!r})"
