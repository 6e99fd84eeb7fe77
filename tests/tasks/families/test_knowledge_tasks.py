"""Fine-tuning with knowledge (ember.tasks.families.knowledge): K-BERT and ERNIE inputs on real SST-2 and
CoNLL-2003 sentences with the committed WordNet sample, the run folder reloaded for evaluate and
predict, and every refusal of the issue's bad-input list."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from conftest import KG_SAMPLE, real_data
from ember.cli import main
from ember.config import ModelConfig, RunConfig
from ember.errors import EmberError
from ember.knowledge.graph import read_triples
from ember.knowledge.transe import TransESettings, train_transe
from ember.tasks.base import get_adapter
from ember.tasks.families.knowledge import with_knowledge

TINY = ["model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64", "model.num_layers=2",
        "model.max_position=128"]


@pytest.fixture(scope="module")
def minilm_tokenizer():
    from ember.tokenizers import load_tokenizer

    return real_data("checkpoints", "all-MiniLM-L6-v2", "tokenizer.json"), load_tokenizer(
        real_data("checkpoints", "all-MiniLM-L6-v2", "tokenizer.json"))


@pytest.fixture(scope="module")
def transe_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("transe")
    train_transe(read_triples(KG_SAMPLE), TransESettings(dim=8, epochs=1, held_out=0), progress=False).embeddings.save(out)
    return out


@pytest.fixture(scope="module")
def small_data_root(tmp_path_factory):
    """The first sentences of the real SST-2 and CoNLL-2003 files, as a data root (fast runs)."""
    root = tmp_path_factory.mktemp("data")
    for name, n in (("train.tsv", 301), ("dev.tsv", 101)):
        lines = real_data("glue", "SST-2", name).read_text(encoding="utf-8").splitlines()[:n]
        (root / "glue" / "SST-2").mkdir(parents=True, exist_ok=True)
        (root / "glue" / "SST-2" / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    (root / "conll2003").mkdir()
    for name, n in (("train.txt", 150), ("dev.txt", 40), ("test.txt", 40)):
        blocks = real_data("conll2003", name).read_text(encoding="utf-8").split("\n\n")[:n]
        (root / "conll2003" / name).write_text("\n\n".join(blocks) + "\n\n", encoding="utf-8")
    return root


def knowledge_cfg(**knowledge) -> RunConfig:
    cfg = RunConfig(kind="finetune", model=ModelConfig(vocab_size=30522))
    return dataclasses.replace(cfg, knowledge=dataclasses.replace(cfg.knowledge, **knowledge))


def test_kbert_on_real_sst2_sentences_keeps_each_sentence_and_hangs_wordnet_on_it(minilm_tokenizer):
    _, tok = minilm_tokenizer
    real_data("glue", "SST-2", "dev.tsv")
    cfg, adapter = with_knowledge(knowledge_cfg(graph=str(KG_SAMPLE), max_triples=2), get_adapter("sst2"))
    examples, features = adapter.load("dev", tok, 96, limit=200)
    _, plain = get_adapter("sst2").load("dev", tok, 96, limit=200)
    stats = adapter.knowledge_inputs(tok).stats
    assert stats.sentences == 200 and stats.with_knowledge > 150 and stats.branches > 400
    for f, p in zip(features, plain):
        visible, soft = f["visible"], f["position_ids"]
        sentence = visible[0]  # what [CLS] sees: the sentence's own tokens, nothing injected
        assert len(f["input_ids"]) <= 96
        assert [t for t, s in zip(f["input_ids"], sentence) if s] == p["input_ids"]  # the text is untouched
        assert [q for q, s in zip(soft, sentence) if s] == list(range(len(p["input_ids"])))
        assert all(q <= h for h, q in enumerate(soft))  # soft positions never run ahead of hard ones
        assert f["label"] == p["label"]
    # e.g. "film" is_a "movie" hangs on the sentences that mention a film
    film = tok.token_to_id("film")
    assert any(film in f["input_ids"] and len(f["input_ids"]) > len(p["input_ids"]) for f, p in zip(features, plain))


def test_kbert_and_ernie_finetune_on_sst2_then_evaluate_and_predict_from_the_run(
        minilm_tokenizer, transe_dir, small_data_root, tmp_path, monkeypatch):
    import ember

    torch.set_num_threads(1)
    monkeypatch.setenv("EMBER_DATA", str(small_data_root))
    tok_path, _ = minilm_tokenizer
    out = tmp_path / "sst2"
    result = ember.finetune("sst2", out, model="bert-tiny", tokenizer=str(tok_path), overrides=TINY,
                            knowledge=str(KG_SAMPLE), relations="is_a,synonym", max_triples=1,
                            entities=str(transe_dir), fusion_layers=1, epochs=1, lr=1e-3, max_length=64,
                            progress=False)
    assert 0.0 <= result.metrics["accuracy"] <= 1.0
    saved = (out / "config.yaml").read_text()
    assert "num_entities: " in saved and "entity_dim: 8" in saved
    graph = read_triples(out / "knowledge.tsv")
    assert set(graph.relations()) == {"is_a", "synonym"}  # the filtered graph the run was trained with
    assert (out / "entities.tsv").read_text().count("\n") == len(read_triples(KG_SAMPLE).entities())
    assert ember.evaluate(out)["metrics"] == pytest.approx(result.metrics)  # same inputs rebuilt from the run
    source = tmp_path / "in.tsv"
    source.write_text("sentence\nan utterly charming film about a dog\na dull , lifeless mess\n")
    assert main(["predict", str(out), "--input", str(source), "--out", str(tmp_path / "p.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["prediction"] in ("negative", "positive", "0", "1") for r in rows)
    from ember.serve.graph import describe

    with pytest.raises(EmberError, match="does not serve or export yet: its inputs carry knowledge.*"
                                         "use `ember predict`"):  # not plain text inputs
        describe(out)
    assert main(["export", str(out), "--format", "onnx", "--out", str(tmp_path / "exported")]) == 1  # refused too
    assert not (tmp_path / "exported").exists()


def test_kbert_conll_tagging_labels_words_only_and_reloads(minilm_tokenizer, small_data_root, tmp_path, monkeypatch,
                                                            capsys):
    import ember

    torch.set_num_threads(1)
    monkeypatch.setenv("EMBER_DATA", str(small_data_root))
    tok_path, tok = minilm_tokenizer
    cfg, adapter = with_knowledge(knowledge_cfg(graph=str(KG_SAMPLE)), get_adapter("conll2003"))
    sentences, features = adapter.load("dev", tok, 128)
    assert f"knowledge (dev, {len(sentences)} sentences): " in capsys.readouterr().err  # the line names its split
    for s, f in zip(sentences, features):
        labelled = [i for i, y in enumerate(f["labels"]) if y != -100]
        assert labelled == [p for p in f["word_starts"] if p >= 0]  # first token of each word, never injected
        assert all(f["visible"][0, p] for p in labelled)  # every labelled token is a sentence token
    assert sum(len(f["input_ids"]) for f in features) > sum(len(s.words) for s in sentences) * 1.5  # knowledge in
    out = tmp_path / "ner"
    result = ember.finetune("conll2003", out, model="bert-tiny", tokenizer=str(tok_path), overrides=TINY,
                            knowledge=str(KG_SAMPLE), epochs=1, lr=1e-3, progress=False)
    assert "test" in result.result["other_splits"]
    assert ember.evaluate(out)["metrics"] == pytest.approx(result.metrics)


@pytest.mark.parametrize("family", ["gpt2", "t5", "xlnet"])
def test_a_family_that_cannot_take_a_visible_matrix_is_refused(family):
    cfg = dataclasses.replace(knowledge_cfg(graph=str(KG_SAMPLE)), model=ModelConfig(family=family))
    with pytest.raises(EmberError, match=f"needs a bidirectional encoder .*a {family} model cannot take a visible "
                                         "matrix"):
        with_knowledge(cfg, get_adapter("sst2"))


def test_other_bad_knowledge_options_are_refused_before_anything_is_written(tmp_path):
    causal = dataclasses.replace(knowledge_cfg(graph=str(KG_SAMPLE)), model=ModelConfig(causal=True))
    with pytest.raises(EmberError, match="a causal encoder cannot"):
        with_knowledge(causal, get_adapter("sst2"))
    features = dataclasses.replace(knowledge_cfg(graph=str(KG_SAMPLE)),
                                   task=dataclasses.replace(RunConfig().task, features=True))
    with pytest.raises(EmberError, match="--features freezes the encoder"):
        with_knowledge(features, get_adapter("sst2"))
    ulmfit = dataclasses.replace(knowledge_cfg(entities="x"), task=dataclasses.replace(RunConfig().task,
                                                                                      gradual_unfreeze=True))
    with pytest.raises(EmberError, match="fusion layers .* have no place there yet"):
        with_knowledge(ulmfit, get_adapter("sst2"))
    with pytest.raises(EmberError, match="sentence classification and tagging tasks; SQuAD"):
        with_knowledge(knowledge_cfg(graph=str(KG_SAMPLE)), get_adapter("squad"))
    with pytest.raises(EmberError, match="give the graph too"):
        with_knowledge(knowledge_cfg(relations="is_a"), get_adapter("sst2"))
    with pytest.raises(EmberError, match="'hypernym', which .* does not have"):
        with_knowledge(knowledge_cfg(graph=str(KG_SAMPLE), relations="hypernym"), get_adapter("sst2"))
    with pytest.raises(EmberError, match="no entity embeddings here"):
        with_knowledge(knowledge_cfg(entities=str(tmp_path)), get_adapter("sst2"))
    with pytest.raises(EmberError, match="at most k triples per entity; k=0"):
        with_knowledge(knowledge_cfg(graph=str(KG_SAMPLE), max_triples=0), get_adapter("sst2"))


def test_finetune_command_line_sets_the_knowledge_section():
    from ember.api.finetune import finetune_config
    from ember.cli import build_parser
    from ember.commands.finetune import settings_from_args

    args = build_parser().parse_args(["finetune", "--task", "sst2", "--out", "x", "--knowledge", "kg.tsv",
                                      "--relations", "is_a", "--max-triples", "1", "--entities", "emb",
                                      "--fusion-layers", "2"])
    cfg = finetune_config("sst2", ModelConfig(), **settings_from_args(args))
    assert (cfg.knowledge.graph, cfg.knowledge.relations, cfg.knowledge.max_triples, cfg.knowledge.entities,
            cfg.knowledge.fusion_layers) == ("kg.tsv", "is_a", 1, "emb", 2)


def test_a_knowledge_run_missing_its_graph_file_says_so(minilm_tokenizer, small_data_root, tmp_path, monkeypatch):
    import ember

    monkeypatch.setenv("EMBER_DATA", str(small_data_root))
    tok_path, _ = minilm_tokenizer
    out = tmp_path / "run"
    ember.finetune("sst2", out, model="bert-tiny", tokenizer=str(tok_path), overrides=TINY, knowledge=str(KG_SAMPLE),
                   epochs=1, max_length=32, train_limit=32, progress=False)
    (out / "knowledge.tsv").unlink()
    with pytest.raises(EmberError, match="fine-tuned with knowledge but has no knowledge.tsv"):
        ember.evaluate(out)
