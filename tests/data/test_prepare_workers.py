"""`ember prepare --workers N`: splitting and tokenizing on N processes writes the same shards,
byte for byte, as one process."""

from __future__ import annotations

import json

import pytest

from conftest import real_data
from ember.data.prepare import prepare_corpus

VOLATILE = ("created", "seconds")  # the only meta.json fields that may differ between runs


def files_of(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
            and p.name != "meta.json"}


def meta_of(folder):
    meta = json.loads((folder / "meta.json").read_text())
    return {k: v for k, v in meta.items() if k not in VOLATILE}


@pytest.mark.parametrize("phrases", ["none", "detect"])
def test_prepare_on_two_processes_matches_one_byte_for_byte(wiki_prepared, tmp_path, phrases):
    source = real_data("wiki-en", "AA", "wiki_00.gz")
    tok = wiki_prepared / "tokenizer.json"
    common = dict(max_docs=60, valid_fraction=0.1, batch_docs=7, shard_tokens=60_000, progress=False,
                  phrases=phrases, phrase_sample_docs=60)  # many small batches and several shards
    one = prepare_corpus([source], tok, tmp_path / "one", workers=1, **common)
    two = prepare_corpus([source], tok, tmp_path / "two", workers=2, **common)
    assert one["tokens"] == two["tokens"] > 0
    a, b = files_of(tmp_path / "one"), files_of(tmp_path / "two")
    assert len([p for p in a if p.name.endswith(".tokens.bin")]) > 2  # several shards were written
    assert a.keys() == b.keys() and all(a[k] == b[k] for k in a)
    assert meta_of(tmp_path / "one") == meta_of(tmp_path / "two")


def test_prepare_workers_cli_refuses_zero(tmp_path, capsys):
    from ember.cli import main

    assert main(["prepare", "x.txt", "--tokenizer", "t.json", "--out", str(tmp_path / "o"), "--workers", "0"]) == 1
    assert "--workers 0" in capsys.readouterr().err
