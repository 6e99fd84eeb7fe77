"""Griffe extensions for the API reference (mkdocs.yml loads them; nothing of ember is imported).

- ``FieldComments``: ember's config dataclasses (``ember.config``, ``ember.model_config``)
  document each field with a comment, on the field's own line and/or in a block just above it,
  not with a docstring. Static analysis keeps no comments, so this reads them back from the
  source: the comment after the value, then the comment lines directly above (up to the
  previous statement or a blank line). An attribute that has a real docstring keeps it.
- ``DataclassFields``: a dataclass's fields as one table (name, type, comment, default).
- ``DoctestBlocks``: ``>>>`` examples in docstrings shown as code, not as nested quotes.
"""

from __future__ import annotations

import ast
import re
import tokenize
from typing import Any

import griffe

_TRAILING = re.compile(r"#\s?(.*)$")


def _trailing_comment(line: str) -> str:
    """The ``# ...`` at the end of a source line, if it is not inside a string."""
    try:
        tokens = list(tokenize.generate_tokens(iter([line + "\n"]).__next__))
    except (tokenize.TokenError, SyntaxError):  # an unfinished multi-line statement: look no further
        return ""
    for token in tokens:
        if token.type == tokenize.COMMENT:
            match = _TRAILING.match(token.string)
            return match.group(1).strip() if match else ""
    return ""


def _sentence(text: str) -> str:
    return text if text.endswith((".", "!", "?", ":")) else text + "."


class FieldComments(griffe.Extension):
    """Give class attributes without a docstring the comments around them."""

    def on_attribute_instance(self, *, node: ast.AST | griffe.ObjectNode, attr: griffe.Attribute,
                              agent: Any, **kwargs: Any) -> None:
        if attr.docstring is not None or not attr.parent or not attr.parent.is_class:
            return
        if not isinstance(agent, griffe.Visitor) or attr.lineno is None:
            return
        lines = agent.code.splitlines()
        above = []
        index = attr.lineno - 2  # the line above, 0-based
        while index >= 0 and lines[index].strip().startswith("#"):
            above.append(lines[index].strip().lstrip("#").strip())
            index -= 1
        above.reverse()
        end = attr.endlineno or attr.lineno
        trailing = _trailing_comment(lines[end - 1])
        # the field's own comment first, then the block above it (often a note on a group of fields)
        text = " ".join(_sentence(part) for part in (trailing, " ".join(above)) if part)
        if text:
            attr.docstring = griffe.Docstring(text, lineno=attr.lineno, endlineno=end, parent=attr)


_DOCTEST_FLAG = re.compile(r"\s*# doctest:.*$")


def fence_doctests(text: str) -> str:
    """Runs of ``>>>`` / ``...`` lines become a ``pycon`` code block (Markdown would read them
    as nested quotes), without their ``# doctest:`` flags."""
    out: list[str] = []
    block: list[str] = []
    for line in text.split("\n") + [""]:
        stripped = line.strip()
        if stripped.startswith(">>>") or (block and stripped.startswith("...")):
            block.append(_DOCTEST_FLAG.sub("", stripped))
            continue
        if block:
            out += ["```pycon", *block, "```"]
            block = []
        out.append(line)
    return "\n".join(out[:-1])


class DoctestBlocks(griffe.Extension):
    """Show docstrings' doctest examples as code."""

    def on_instance(self, *, node: ast.AST | griffe.ObjectNode, obj: griffe.Object, agent: Any,
                    **kwargs: Any) -> None:
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fence_doctests(obj.docstring.value)


_FACTORY = re.compile(r"^field\(default_factory=(?:lambda: )?(\w+)\(?\)?\)$")


def _default(value: Any) -> str:
    text = str(value)
    match = _FACTORY.match(text)
    return f"`{match.group(1)}()`" if match else f"`{text}`"


class DataclassFields(griffe.Extension):
    """A dataclass's fields as one table (an "Attributes" section of its docstring: name, type,
    the field's comments and its default) rather than a heading per field."""

    def on_class_members(self, *, node: ast.AST | griffe.ObjectNode, cls: griffe.Class, agent: Any,
                         **kwargs: Any) -> None:
        if "dataclass" not in cls.labels:
            return
        rows = []
        for name, member in cls.members.items():
            if name.startswith("_") or not member.is_attribute or "property" in member.labels:
                continue
            if member.annotation is None:
                continue
            words = member.docstring.value.strip() if member.docstring else ""
            default = f"Default: {_default(member.value)}." if member.value is not None else ""
            rows.append(f"    {name} ({member.annotation}): {' '.join(filter(None, (words, default)))}".rstrip())
        if not rows:
            return
        summary = cls.docstring.value if cls.docstring else f"The fields of `{cls.name}`."
        text = summary + "\n\nAttributes:\n" + "\n".join(rows)
        cls.docstring = griffe.Docstring(text, lineno=cls.lineno, endlineno=cls.lineno, parent=cls)
