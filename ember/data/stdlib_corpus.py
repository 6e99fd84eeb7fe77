"""A small fallback corpus built from text every machine has: the docstrings of Python's
standard library, read from source with ``ast`` (nothing is imported or executed).

Used by ``ember quickstart`` when the shared data folder is absent. Besides a pre-training
corpus (one document per module), it yields a small labelled task in the SST-2 file layout:
is a docstring's first sentence from a class (1) or from a function (0)?
"""

from __future__ import annotations

import ast
import random
import sysconfig
from pathlib import Path


def _stdlib_sources(limit: int) -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in sorted(root.rglob("*.py")) if "site-packages" not in p.parts and "test" not in p.parts]
    return files[:limit]


def _docstrings(path: Path) -> tuple[list[str], list[tuple[str, int]]]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return [], []
    texts, labelled = [], []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if not doc or len(doc) < 20:
                continue
            texts.append(" ".join(doc.split()))
            first = " ".join(doc.strip().split("\n\n")[0].split())
            if not isinstance(node, ast.Module) and 3 <= len(first.split()) <= 60:
                labelled.append((first.replace("\t", " "), int(isinstance(node, ast.ClassDef))))
    return texts, labelled


def build_stdlib_corpus(out_dir: Path, max_files: int = 2000) -> tuple[Path, Path]:
    """Write ``corpus.txt`` (blank-line separated documents) and ``glue/SST-2/{train,dev}.tsv``.

    Returns (corpus file, data root for the labelled task).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    corpus = out_dir / "corpus.txt"
    rows: list[tuple[str, int]] = []
    with open(corpus, "w", encoding="utf-8") as fh:
        for path in _stdlib_sources(max_files):
            texts, labelled = _docstrings(path)
            if texts:
                fh.write("\n".join(texts) + "\n\n")
            rows.extend(labelled)
    # Balance the classes (functions far outnumber classes) and split 85/15.
    rng = random.Random(0)
    classes = [r for r in rows if r[1] == 1]
    functions = [r for r in rows if r[1] == 0]
    rng.shuffle(functions)
    rows = classes + functions[: len(classes)]
    rng.shuffle(rows)
    cut = int(len(rows) * 0.85)
    task_dir = out_dir / "data" / "glue" / "SST-2"
    task_dir.mkdir(parents=True, exist_ok=True)
    for name, part in (("train.tsv", rows[:cut]), ("dev.tsv", rows[cut:])):
        lines = ["sentence\tlabel"] + [f"{text}\t{label}" for text, label in part]
        (task_dir / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return corpus, out_dir / "data"
