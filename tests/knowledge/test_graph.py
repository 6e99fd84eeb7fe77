"""Triples files (file:line errors, relation filters), WordNet 3.0 -> triples, the committed sample."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import KG_SAMPLE
from ember.cli import main
from ember.errors import EmberError
from ember.knowledge.graph import Triple, read_triples, write_triples
from ember.knowledge.wordnet import wordnet_triples

WORDNET = Path("/usr/share/wordnet")

# A miniature WordNet 3.0 database in the real file formats (wndb(5WN)): a licence line, an
# instance hypernym (@i), a part holonym (#p), a hypernym (@), a lexical pointer (ignored) and
# adjectives with syntactic markers.
DATA = {
    "noun": ["  1 This software and database is being provided to you, the LICENSEE, by",
             "00000100 15 n 02 Beijing 0 Peking 0 003 @i 00000200 n 0000 #p 00000300 n 0000 + 00000600 v 0101 | capital",
             "00000200 15 n 02 national_capital 0 capital 0 001 @ 00000400 n 0000 | a capital city",
             "00000300 15 n 01 China 0 000 | a country",
             "00000400 15 n 01 city 0 000 | a large town"],
    "verb": ["00000600 41 v 01 beijing 0 000 00 | (made up)"],
    "adj": ["00000500 00 s 02 galore(ip) 0 plenty(p) 0 000 | abundant"],
    "adv": [],
}
INDEX = {
    "noun": ["  1 This software and database is being provided to you, the LICENSEE, by",
             "beijing n 1 3 @ #p + 1 0 00000100", "peking n 1 2 @ #p 1 0 00000100",
             "national_capital n 1 1 @ 1 0 00000200", "capital n 1 1 @ 1 0 00000200",
             "china n 1 0 1 0 00000300", "city n 1 0 1 0 00000400"],
    "verb": [], "adj": ["galore a 1 0 1 0 00000500", "plenty a 1 0 1 0 00000500"], "adv": [],
}


@pytest.fixture
def mini_wordnet(tmp_path):
    for pos in DATA:
        (tmp_path / f"data.{pos}").write_text("".join(f"{line}  \n" for line in DATA[pos]))
        (tmp_path / f"index.{pos}").write_text("".join(f"{line}  \n" for line in INDEX[pos]))
    return tmp_path


def test_wordnet_conversion_golden_on_a_miniature_database(mini_wordnet):
    got = {(t.head, t.relation, t.tail) for t in wordnet_triples(mini_wordnet)}
    assert got == {
        ("beijing", "instance_of", "national capital"), ("beijing", "part_of", "china"),
        ("beijing", "synonym", "peking"), ("peking", "instance_of", "national capital"),
        ("peking", "part_of", "china"), ("peking", "synonym", "beijing"),
        ("national capital", "is_a", "city"), ("national capital", "synonym", "capital"),
        ("capital", "is_a", "city"), ("capital", "synonym", "national capital"),
        ("galore", "synonym", "plenty"), ("plenty", "synonym", "galore"),
    }
    first = wordnet_triples(mini_wordnet, heads=["Beijing"], max_per_head=2)
    assert first == [Triple("beijing", "instance_of", "national capital"), Triple("beijing", "part_of", "china")]


def test_kg_build_cli_writes_a_triples_file_and_refuses_a_folder_without_wordnet(mini_wordnet, tmp_path, capsys):
    out = tmp_path / "wn.tsv"
    assert main(["kg", "build", "--wordnet", str(mini_wordnet), "--out", str(out)]) == 0
    assert len(read_triples(out)) == 12
    assert main(["kg", "build", "--wordnet", str(tmp_path / "nothing"), "--out", str(out)]) == 1
    assert "data.noun not found: --wordnet wants the folder" in capsys.readouterr().err


@pytest.mark.skipif(not (WORDNET / "data.noun").is_file(), reason="WordNet 3.0 not installed (apt-get install wordnet-base)")
def test_real_wordnet_beijing_and_dog():
    triples = wordnet_triples(WORDNET, heads=["beijing", "dog"])
    assert Triple("beijing", "instance_of", "national capital") in triples
    assert Triple("beijing", "part_of", "china") in triples
    assert triples[[t.head for t in triples].index("dog")] == Triple("dog", "is_a", "canine")  # commonest sense first


def test_committed_sample_is_small_real_wordnet():
    assert KG_SAMPLE.stat().st_size < 1_000_000
    graph = read_triples(KG_SAMPLE)
    assert set(graph.relations()) == {"synonym", "is_a", "instance_of", "part_of"}
    assert Triple("beijing", "part_of", "china") in graph.triples
    assert max(len(v) for v in graph.by_head().values()) <= 4


@pytest.mark.parametrize("line, problem", [
    ("dog\tis_a", r"2 field\(s\)"), ("dog\tis_a\tcanine\textra", r"4 field\(s\)"),
    ("dog\t\tcanine", "an empty field")])
def test_triples_file_with_missing_or_extra_fields_names_file_and_line(tmp_path, line, problem):
    path = tmp_path / "kg.tsv"
    path.write_text(f"# a comment\n\ncat\tis_a\tfeline\n{line}\n")
    with pytest.raises(EmberError, match=rf"kg.tsv:4: expected head<TAB>relation<TAB>tail, got {problem}"):
        read_triples(path)


def test_relation_filter_keeps_its_relations_and_refuses_unknown_ones(tmp_path):
    path = tmp_path / "kg.tsv"
    write_triples(path, [Triple("cat", "is_a", "feline"), Triple("cat", "synonym", "true cat"),
                         Triple("paw", "part_of", "cat")])
    assert [t.relation for t in read_triples(path, "is_a,part_of").triples] == ["is_a", "part_of"]
    with pytest.raises(EmberError, match=r"'hypernym', which .*kg.tsv does not have; its relations: is_a \(first at "
                                         r"line 1\), synonym \(first at line 2\), part_of"):
        read_triples(path, ["is_a", "hypernym"])
    with pytest.raises(EmberError, match="not found"):
        read_triples(tmp_path / "missing.tsv")
    (tmp_path / "empty.tsv").write_text("# nothing\n")
    with pytest.raises(EmberError, match="has no triples"):
        read_triples(tmp_path / "empty.tsv")
    with pytest.raises(EmberError, match="tab/newline"):
        write_triples(path, [Triple("a\tb", "r", "c")])
