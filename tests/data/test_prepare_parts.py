"""`ember prepare --part i/N` and `--merge`: 3 parts of real Wikipedia files merged give the
token, sentence and document files of one run byte for byte; bad parts are refused."""

from __future__ import annotations

import json
import random
import tracemalloc

import pytest
from conftest import real_data

from ember.cli import main
from ember.data import parts as parts_mod
from ember.data.parts import merge_parts, parse_part, part_files, prepare_part
from ember.data.prepare import prepare_corpus
from ember.errors import EmberError

OPTIONS = {"valid_fraction": 0.05, "seed": 3, "shard_tokens": 150_000}  # several shards, across parts


@pytest.fixture(scope="module")
def wiki_files():
    root = real_data("wiki-en", "AA")
    return [root / f"wiki_0{i}.gz" for i in range(4)]


@pytest.fixture(scope="module")
def tokenizer(wiki_prepared):
    return wiki_prepared.parent / "tokenizer.json"


def bin_files(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*.bin"))}


def test_prepare_three_parts_merged_equal_one_run_byte_for_byte(wiki_files, tokenizer, tmp_path):
    one = tmp_path / "one"
    prepare_corpus(wiki_files, tokenizer, one, progress=False, **OPTIONS)
    parts = []
    for i in (3, 1, 2):  # any order, any machine
        parts.append(tmp_path / f"part{i}")
        prepare_part(wiki_files, tokenizer, parts[-1], f"{i}/3", progress=False, **OPTIONS)
    assert sorted(f for p in parts for f in json.loads((p / "meta.json").read_text())["part"]["files"]) == \
        sorted(str(f) for f in wiki_files)
    merged = tmp_path / "merged"
    merge_parts(parts, merged)
    want, got = bin_files(one), bin_files(merged)
    assert len(want) >= 2 * 3 and sorted(got) == sorted(want)  # train and valid, several shards each
    for name in want:
        assert got[name] == want[name], name
    meta_one, meta_merged = (json.loads((d / "meta.json").read_text()) for d in (one, merged))
    assert meta_merged["splits"] == meta_one["splits"]
    assert meta_merged["text_bytes"] == meta_one["text_bytes"] and meta_merged["num_files"] == 4
    assert (merged / "tokenizer.json").read_bytes() == tokenizer.read_bytes()


def test_prepare_merge_memory_stays_flat_as_the_corpus_grows(tokenizer, tmp_path, monkeypatch):
    """The merge's Python-heap peak (tracemalloc, numpy included; the parts are memory-mapped)
    grows by less than 256 KiB for 4x the documents (all of one size, one shard per part;
    their ids as int64 would add megabytes): documents are routed in chunks of CHUNK_DOCS."""
    monkeypatch.setattr(parts_mod, "CHUNK_DOCS", 16)
    words = "the city river north was founded in and of a by its".split()
    rng = random.Random(0)

    def peak(docs_per_file: int) -> int:
        root = tmp_path / str(docs_per_file)
        files = []
        for f in range(2):
            files.append(root / f"in{f}.txt")
            root.mkdir(exist_ok=True)
            files[-1].write_text("\n".join(" ".join(rng.choice(words) for _ in range(60)) + "."
                                           for _ in range(docs_per_file)) + "\n")
        parts = [root / "p1", root / "p2"]
        for i, part in enumerate(parts, 1):
            prepare_part(files, tokenizer, part, f"{i}/2", fmt="lines", progress=False, valid_fraction=0.05,
                         shard_tokens=10**9)  # one shard per part: the chunks alone bound the memory
        tracemalloc.start()
        try:
            merge_parts(parts, root / "merged")
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small, large = peak(500), peak(2000)
    assert large - small < 256 * 1024, (small, large)


def test_prepare_part_shares_are_contiguous_nonempty_and_cover_the_files(tmp_path):
    files = []
    for i, size in enumerate([50, 1, 1, 1, 1, 30]):
        files.append(tmp_path / f"f{i}.txt")
        files[-1].write_bytes(b"x" * size)
    shares = [part_files(files, i, 3) for i in (1, 2, 3)]
    assert sum(shares, []) == files and all(shares)
    assert shares[0] == files[:1]  # the big first file alone is half of the bytes
    with pytest.raises(EmberError, match="only 6 file"):
        part_files(files, 1, 7)
    # four near-equal files (the real wiki_00..03, 365-390 kB) in two parts: 2 + 2, not 3 + 1
    wiki = [real_data("wiki-en", "AA", f"wiki_0{i}.gz") for i in range(4)]
    assert [len(part_files(wiki, i, 2)) for i in (1, 2)] == [2, 2]
    assert [len(part_files(wiki, i, 4)) for i in (1, 2, 3, 4)] == [1, 1, 1, 1]


@pytest.mark.parametrize("text", ["0/3", "4/3", "2/0", "two/3", "2"])
def test_prepare_part_outside_1_to_n_is_refused(text):
    with pytest.raises(EmberError, match="--part"):
        parse_part(text)


def test_prepare_part_cli_refuses_bad_part_and_merge_refuses_mixed_tokenizers(wiki_files, tokenizer, tmp_path,
                                                                                capsys):
    assert main(["prepare", str(wiki_files[0]), "--tokenizer", str(tokenizer), "--out", str(tmp_path / "x"),
                 "--part", "4/3", "--no-progress"]) == 1
    assert "i must be in 1..N (here 1..3)" in capsys.readouterr().err and not (tmp_path / "x").exists()
    from ember.tokenizers import train_tokenizer

    other = tmp_path / "other.json"
    train_tokenizer([wiki_files[1]], vocab_size=500, max_documents=20, progress=False).save(str(other))
    two = wiki_files[:2]
    prepare_part(two, tokenizer, tmp_path / "p1", "1/2", progress=False)
    prepare_part(two, other, tmp_path / "p2", "2/2", progress=False)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("earlier work")
    assert main(["prepare", "--merge", str(tmp_path / "p1"), str(tmp_path / "p2"), "--out", str(tmp_path / "out"),
                 "--overwrite"]) == 1
    err = capsys.readouterr().err
    assert "part 2" in err and "same tokenizer" in err
    assert (tmp_path / "out" / "keep.txt").read_text() == "earlier work"  # nothing written is lost
    with pytest.raises(EmberError, match=r"missing part\(s\) \[2\]"):
        merge_parts([tmp_path / "p1"], tmp_path / "out2")
