"""docs/api.md runs as written: every ```python block, in order, in one namespace, in a folder
laid out as the page says (tiny runs built here, the real all-MiniLM-L6-v2, real SST-2 rows
as data/reviews.csv). A block that raises fails the test; none is skipped."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

from api_helpers import tiny_runs
from conftest import real_data

DOCS = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, code) of each ```python block."""
    return [(text[: m.start()].count("\n") + 2, m.group(1)) for m in re.finditer(r"```python\n(.*?)```", text, re.S)]


@pytest.fixture
def docs_folder(wiki_prepared, tmp_path, monkeypatch):
    """runs/{sst2,conll2003,squad2,mlm,gpt2-tiny,wiki}, models/all-MiniLM-L6-v2, data/reviews.csv."""
    pytest.importorskip("pandas")
    pytest.importorskip("datasets")
    pytest.importorskip("onnxruntime")
    from ember.tasks.readers.glue import read_examples

    minilm = real_data("checkpoints", "all-MiniLM-L6-v2")
    built = tiny_runs(tmp_path / "runs", wiki_prepared / "tokenizer.json")
    (tmp_path / "runs" / "gpt2-tiny").symlink_to(built["gpt"])
    (tmp_path / "runs" / "wiki").symlink_to(wiki_prepared)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "all-MiniLM-L6-v2").symlink_to(minilm)
    import pandas as pd

    rows = read_examples("sst2", "train", limit=300)
    (tmp_path / "data").mkdir()
    pd.DataFrame({"review": [ex.text_a for ex in rows],
                  "sentiment": ["positive" if ex.label else "negative" for ex in rows]}).to_csv(
        tmp_path / "data" / "reviews.csv", index=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path / "cache"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tmp_path
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_every_python_example_in_docs_api_md_runs(docs_folder, capsys):
    blocks = python_blocks(DOCS.read_text(encoding="utf-8"))
    assert len(blocks) >= 9, "docs/api.md lost its examples"
    namespace: dict = {"__name__": "docs_api"}
    for line, code in blocks:
        try:
            exec(compile(code, f"{DOCS}:{line}", "exec"), namespace)
        except Exception as exc:  # name the block in the failure
            pytest.fail(f"docs/api.md block at line {line} failed: {type(exc).__name__}: {exc}")
    printed = capsys.readouterr().out
    # A few things the page promises, checked on what the blocks printed and wrote.
    assert "['classify', 'embed']" in printed and "(3, 64) float32" in printed
    assert "AttributeError" in printed and "has no 'generate' method; it has: classify, embed" in printed
    assert "none of the folders ember.load reads" in printed and "has no text column 'text'" in printed
    assert "'pooling' must be one of mean, cls, none" in printed
    assert (docs_folder / "runs" / "my-sst2" / "inputs" / "train.tsv").is_file()
    assert (docs_folder / "runs" / "report.html").is_file() and (docs_folder / "exported" / "sst2-hf" / "config.json").is_file()
    assert os.listdir(docs_folder / "cache" / "hf-runs")  # MiniLM converted once, cached
