"""XLM data: language-balanced sampling (alpha), the multilingual BPE, `ember prepare` with
language codes and parallel TSV files, and the TLM/MLM inputs the objective lays out."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import make_wordpiece, real_data
from ember.config import DataConfig, XlmConfig, model_preset
from ember.errors import EmberError

# The hand-made vocabulary of the golden tests: [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4, then:
WORDS = ["the", "cat", "sat", "on", "mat", "dog", "кошка", "сидела", "на", "коврике", "собака"]
ID = {w: i + 5 for i, w in enumerate(WORDS)}
SPECIAL = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}


@pytest.fixture
def word_tokenizer(tmp_path):
    path = tmp_path / "tokenizer.json"
    make_wordpiece(WORDS).save(str(path))
    return path


def write(path, text: str):
    path.write_text(text, encoding="utf-8")
    return path


def xlm_module(mode: str, languages: str = "en,ru", causal: bool = False):
    import dataclasses

    from ember.models import build_backbone
    from ember.objectives.xlm import XlmPretraining

    cfg = dataclasses.replace(model_preset("xlm-mini"), vocab_size=len(WORDS) + 5, hidden_size=32, num_heads=2,
                              intermediate_size=128, num_layers=1, num_languages=2, languages=languages,
                              causal=causal)
    return XlmPretraining(build_backbone(cfg), SPECIAL, DataConfig(max_seq_length=32), XlmConfig(), mode)


# ---- alpha sampling ------------------------------------------------------------------------

def test_xlm_language_probs_golden():
    from ember.data.language_mix import language_probs

    # p = (0.9, 0.1); sqrt -> (0.9487, 0.3162): q = 3/4, 1/4 exactly (XLM §3.1, alpha 0.5)
    np.testing.assert_allclose(language_probs([900, 100], 0.5), [0.75, 0.25])
    np.testing.assert_allclose(language_probs([900, 100], 1.0), [0.9, 0.1])
    np.testing.assert_allclose(language_probs([900, 100], 0.0), [0.5, 0.5])
    with pytest.raises(EmberError, match="alpha=1.5"):
        language_probs([1, 2], 1.5)
    with pytest.raises(EmberError, match="every language needs some text"):
        language_probs([10, 0], 0.5)


def test_xlm_balanced_sentences_resample_to_q_deterministically(tmp_path):
    from ember.data.language_mix import LanguageBalancedSentences

    en = write(tmp_path / "en.txt", "\n\n".join(f"English sentence number {i}." for i in range(90)))
    ru = write(tmp_path / "ru.txt", "\n\n".join(f"Русское предложение {i}." for i in range(10)))
    mix = LanguageBalancedSentences({"en": [en], "ru": [ru]}, alpha=0.5, seed=3)
    fed = list(mix)
    assert mix.counts == {"en": 90, "ru": 10}
    assert mix.probs == pytest.approx({"en": 0.75, "ru": 0.25})
    # 100 sentences in all, q_i * 100 of each language: ru sentences 2.5 times each on average
    assert sum(s.startswith("Русское") for s in fed) == mix.fed["ru"]
    assert 20 <= mix.fed["ru"] <= 30 and 65 <= mix.fed["en"] <= 85
    assert fed == list(LanguageBalancedSentences({"en": [en], "ru": [ru]}, alpha=0.5, seed=3))
    assert fed != list(LanguageBalancedSentences({"en": [en], "ru": [ru]}, alpha=0.5, seed=4))


def test_xlm_multilingual_bpe_on_real_text_gives_russian_more_vocabulary():
    """A shared BPE on wiki-en + ruslit (English ~9x the sentences): balancing with alpha 0.5
    cuts held-out Russian words (Chekhov, unseen) into fewer pieces than alpha 1 (corpus
    proportions), and alpha 0 fewer still; English pays a little."""
    from ember.data.readers import DocumentReader
    from ember.tokenizers import train_tokenizer

    langs = {"en": [real_data("wiki-en", "AA", "wiki_00.gz")], "ru": [str(real_data("ruslit", "Gogol") / "*.txt")]}
    held = [d.text for d, _ in zip(DocumentReader(str(real_data("ruslit", "Chekhov") / "*.txt")), range(40))]

    def pieces_per_word(alpha):
        tok = train_tokenizer(langs, kind="bpe", vocab_size=1000, lowercase=False, max_documents=20,
                              alpha=alpha, progress=False)
        return sum(len(tok.encode(t, add_special_tokens=False).ids) for t in held) / sum(len(t.split()) for t in held)

    proportional, balanced, uniform = pieces_per_word(1.0), pieces_per_word(0.5), pieces_per_word(0.0)
    assert uniform < balanced < proportional
    assert proportional - balanced > 0.2  # measured 4.38 -> 3.76 pieces per word


def test_xlm_mixed_dataset_draws_sources_from_q_and_walks_permutations():
    from ember.data.language_mix import MixedDataset, language_probs

    class Items:
        def __init__(self, name, n):
            self.name, self.n = name, n

        def __len__(self):
            return self.n

        def example(self, i, epoch=0):
            return self.name, i

    data = MixedDataset([Items("en", 900), Items("ru", 100)], language_probs([900, 100], 0.5), seed=1)
    assert len(data) == 1000
    epoch0 = [data.example(i, 0) for i in range(1000)]
    ru = [i for name, i in epoch0 if name == "ru"]
    assert abs(len(ru) - 250) < 5 * np.sqrt(1000 * 0.25 * 0.75)
    assert sorted(ru[:100]) == list(range(100))  # ru is drawn ~2.5x its size: whole permutations
    en = [i for name, i in epoch0 if name == "en"]
    assert len(set(en)) == len(en)  # en is drawn less than its size: no repeats within the epoch
    assert epoch0 == [MixedDataset(data.sources, data.probs, seed=1).example(i, 0) for i in range(1000)]
    assert epoch0 != [data.example(i, 1) for i in range(1000)]


# ---- prepare with language codes ------------------------------------------------------------

PAIRS = "the cat sat on the mat\tкошка сидела на коврике\n\nthe dog\tсобака\n"


def test_xlm_prepare_parallel_and_tlm_inputs_golden(tmp_path, word_tokenizer):
    """Parallel TSV -> prepared pairs -> TLM inputs: token ids, positions restarted on the
    target side, language ids per side, and which tokens are masked for a fixed seed
    (Lample & Conneau 2019 Fig. 2)."""
    from ember.data.multilingual import prepare_multilingual
    from ember.data.shards import TokenCorpus

    tsv = write(tmp_path / "pairs.tsv", PAIRS)
    stats = prepare_multilingual({}, [(("en", "ru"), tsv)], word_tokenizer, tmp_path / "prep",
                                 valid_fraction=0, progress=False)
    assert stats["languages"] == ["en", "ru"] and [s["name"] for s in stats["streams"]] == ["en-ru"]
    corpus = TokenCorpus(tmp_path / "prep", "train")
    module = xlm_module("tlm")
    data = module.build_dataset(corpus, DataConfig(max_seq_length=32), seed=0)
    examples = sorted((data.example(i, 0) for i in range(len(data))), key=lambda e: -len(e.input_ids))
    first = examples[0]
    the, cat, sat, on, mat = (ID[w] for w in ("the", "cat", "sat", "on", "mat"))
    koshka, sidela, na, kovrike = (ID[w] for w in ("кошка", "сидела", "на", "коврике"))
    assert first.input_ids.tolist() == [2, the, cat, sat, on, the, mat, 3, 2, koshka, sidela, na, kovrike, 3]
    assert first.position_ids.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5]
    assert first.language_ids.tolist() == [0] * 8 + [1] * 6
    assert first.maskable.tolist() == [False] + [True] * 6 + [False, False] + [True] * 4 + [False]
    second = examples[1]
    assert second.input_ids.tolist() == [2, the, ID["dog"], 3, 2, ID["собака"], 3]
    assert second.position_ids.tolist() == [0, 1, 2, 3, 0, 1, 2]

    batch = module.make_batch([first, second], np.random.default_rng(0))
    assert batch["input_ids"].shape == (2, 14)
    assert batch["attention_mask"][1].tolist() == [1] * 7 + [0] * 7
    assert batch["language_ids"][1, :7].tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert batch["position_ids"][0].tolist() == first.position_ids.tolist()
    labels = batch["labels"]
    # round(15% of 10 maskable) = 2 (numpy rounds half to even: 1.5 -> 2); 15% of 3 -> at least 1
    assert (labels[0] != -100).sum() == 2 and (labels[1] != -100).sum() == 1
    # Golden for seed 0: "sat" on the English side and "на" on the Russian side of pair 0, "the"
    # in pair 1, each replaced by [MASK] (=4).
    assert (labels[0] != -100).nonzero().flatten().tolist() == [3, 11]
    assert (labels[1] != -100).nonzero().flatten().tolist() == [1]
    assert labels[0, 3] == sat and labels[0, 11] == na and labels[1, 1] == the
    assert batch["input_ids"][0].tolist() == [2, the, cat, 4, on, the, mat, 3, 2, koshka, sidela, 4, kovrike, 3]
    assert batch["input_ids"][1].tolist()[:7] == [2, 4, ID["dog"], 3, 2, ID["собака"], 3]
    # Masks fall on both sides: over many seeds the Russian side holds ~4/10 of pair 0's.
    target = [int((module.make_batch([first], np.random.default_rng(s))["labels"][0, 8:] != -100).sum())
              for s in range(300)]
    assert 0.32 < sum(target) / 600 < 0.48


def test_xlm_tlm_pair_is_cut_to_fit_longer_side_first():
    from ember.objectives.xlm import lay_out_pair

    seq = lay_out_pair(np.arange(100, 140), np.arange(200, 205), (0, 1), 2, 3, max_length=24)
    assert len(seq.input_ids) == 24  # 20 tokens: the 5 target tokens kept, the source cut to 15
    assert seq.input_ids.tolist()[-7:] == [2, 200, 201, 202, 203, 204, 3]
    both = lay_out_pair(np.arange(100, 140), np.arange(200, 240), (0, 1), 2, 3, max_length=24)
    assert both.position_ids.tolist() == list(range(12)) * 2  # each side cut to half


def test_xlm_prepare_bad_parallel_lines_name_file_and_line(tmp_path, word_tokenizer):
    from ember.data.multilingual import prepare_multilingual

    def run(text, pair=("en", "ru"), languages=None):
        tsv = write(tmp_path / "bad.tsv", text)
        prepare_multilingual({}, [(pair, tsv)], word_tokenizer, tmp_path / "out", languages=languages,
                             progress=False, overwrite=True)

    with pytest.raises(EmberError, match=r"bad.tsv:3: expected 2 tab-separated columns .* found 1"):
        run("the cat\tкошка\n\nthe dog\t\n")  # target side missing
    with pytest.raises(EmberError, match=r"bad.tsv:2: the source side is empty"):
        run("en\tru\tthe cat\tкошка\nen\tru\t \tсобака\n", pair=None, languages=["en", "ru"])
    with pytest.raises(EmberError, match="declare the corpus's languages"):
        run("en\tru\tthe cat\tкошка\n", pair=None)
    with pytest.raises(EmberError, match=r"bad.tsv:2: unknown language code 'de'; the corpus's languages are en, ru"):
        run("en\tru\tthe cat\tкошка\nen\tde\tthe dog\tHund\n", pair=None, languages=["en", "ru"])
    with pytest.raises(EmberError, match=r"bad.tsv:1: expected 4 tab-separated columns"):
        run("the cat\tкошка\n", pair=None, languages=["en", "ru"])
    with pytest.raises(EmberError, match="unknown language code.*de.*not in --languages en,ru"):
        run("the cat\tкошка\n", pair=("en", "de"), languages=["en", "ru"])
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("out.tmp-*"))  # nothing half-written


def test_xlm_prepare_cli_real_monolingual_streams_and_parallel(tmp_path):
    """`ember tokenizer train --lang` + `ember prepare --lang --parallel` on real wiki-en and
    ruslit text: one stream per language (contiguous documents), one per language pair; the
    stored tokens are the tokenizer's own."""
    from ember.cli import main
    from ember.data.multilingual import corpus_streams
    from ember.data.shards import TokenCorpus
    from ember.tokenizers import load_tokenizer

    en, ru = real_data("wiki-en", "AA", "wiki_00.gz"), str(real_data("ruslit", "Chekhov") / "*.txt")
    assert main(["tokenizer", "train", "--kind", "bpe", "--vocab-size", "800", "--no-lowercase", "--max-documents",
                 "10", "--lang", f"en={en}", "--lang", f"ru={ru}", "--out", str(tmp_path / "tok"),
                 "--no-progress"]) == 0
    tsv = write(tmp_path / "pairs.tsv", "ru\ten\tКошка спит.\tThe cat sleeps.\nen\tru\tI like tea.\tЯ люблю чай.\n")
    assert main(["prepare", "--lang", f"ru={ru}", "--lang", f"en={en}", "--parallel", str(tsv),
                 "--languages", "en,ru", "--max-docs", "10", "--valid-fraction", "0.2", "--tokenizer",
                 str(tmp_path / "tok"), "--out", str(tmp_path / "prep"), "--no-progress"]) == 0
    meta = json.loads((tmp_path / "prep" / "meta.json").read_text())
    assert meta["multilingual"]["languages"] == ["en", "ru"]  # --languages fixes the ids
    train = TokenCorpus(tmp_path / "prep", "train")
    codes, streams = corpus_streams(train)
    assert [(s.name, s.kind, s.languages) for s in streams] == [
        ("ru", "mono", ("ru",)), ("en", "mono", ("en",)), ("ru-en", "parallel", ("ru", "en")),
        ("en-ru", "parallel", ("en", "ru"))]
    assert streams[0].docs.start == 0 and streams[0].docs.stop == streams[1].docs.start
    assert sum(len(s.docs) for s in streams) == train.num_docs
    tok = load_tokenizer(tmp_path / "prep" / "tokenizer.json")
    text = tok.decode(train.doc_tokens(streams[0].docs.start).tolist())
    assert sum("а" <= ch <= "я" for ch in text) > 100  # Russian, kept as Cyrillic
    stored = []  # the one en-ru pair, in whichever split the holdout put it
    for split in ("train", "valid"):
        corpus = TokenCorpus(tmp_path / "prep", split)
        for s in corpus_streams(corpus)[1]:
            if s.name == "en-ru" and len(s.docs):
                stored.append([corpus.sentence(i).tolist() for i in corpus.doc_sentences(s.docs.start)])
    assert stored == [[tok.encode("I like tea.", add_special_tokens=False).ids,
                       tok.encode("Я люблю чай.", add_special_tokens=False).ids]]


def test_xlm_mlm_streams_are_sentences_joined_by_separator(tmp_path, word_tokenizer):
    from ember.data.blocks import TokenBlockDataset
    from ember.data.multilingual import SentenceView, corpus_streams, prepare_multilingual
    from ember.data.shards import TokenCorpus
    from ember.objectives.xlm import lay_out_stream

    en = write(tmp_path / "en.txt", "The cat sat on the mat. The dog sat on the mat.\n\nThe mat.\n")
    ru = write(tmp_path / "ru.txt", "Кошка сидела на коврике. Собака.\n")
    prepare_multilingual({"en": [en], "ru": [ru]}, [], word_tokenizer, tmp_path / "prep", valid_fraction=0,
                         progress=False)
    corpus = TokenCorpus(tmp_path / "prep", "train")
    _, (s_en, s_ru) = corpus_streams(corpus)
    blocks = TokenBlockDataset(SentenceView(corpus, s_en.docs), 5, eot_id=SPECIAL["sep"])
    stream = np.concatenate([blocks.example(i) for i in range(len(blocks))]).tolist()
    # "the cat sat on the mat . [SEP] the dog sat on the mat . [SEP] the mat . [SEP]": 20 tokens,
    # 4 blocks of 5
    t, c, s, o, d, m = (ID[w] for w in ("the", "cat", "sat", "on", "dog", "mat"))
    dot = 1  # "." is not in the hand-made vocabulary: [UNK]
    assert stream == [t, c, s, o, t, m, dot, 3, t, d, s, o, t, m, dot, 3, t, m, dot, 3]
    seq = lay_out_stream(blocks.example(0), 1, SPECIAL["cls"])
    assert seq.input_ids.tolist() == [2, t, c, s, o, t]
    assert seq.position_ids.tolist() == list(range(6)) and seq.language_ids.tolist() == [1] * 6
    assert seq.maskable.tolist() == [False] + [True] * 5
    module = xlm_module("mlm", languages="ru,en")  # the model's ids decide: en = 1, ru = 0
    data = module.build_dataset(corpus, DataConfig(max_seq_length=6), seed=0)
    assert len(data) == 4 + 1  # ru: 9 tokens -> one block of 5
    langs = [int(data.example(i, e).language_ids[0]) for e in range(6) for i in range(len(data))]
    assert set(langs) == {0, 1}


def test_xlm_objective_bad_setups_say_what_to_do(tmp_path, word_tokenizer):
    from ember.config import RunConfig
    from ember.data.multilingual import prepare_multilingual
    from ember.data.shards import TokenCorpus
    from ember.objectives import build_objective

    with pytest.raises(EmberError, match="model.causal=true"):
        build_objective(RunConfig(objective="xlm_clm", model=model_preset("xlm-mini")), SPECIAL)
    with pytest.raises(EmberError, match="tlm_fraction=1.0"):
        build_objective(RunConfig(objective="xlm_mlm_tlm", model=model_preset("xlm-mini"),
                                  xlm=XlmConfig(tlm_fraction=1.0)), SPECIAL)
    with pytest.raises(EmberError, match="not model family 'bert'"):
        build_objective(RunConfig(objective="xlm_mlm", model=model_preset("bert-mini")), SPECIAL)
    en = write(tmp_path / "en.txt", "The cat sat on the mat. " * 20)
    prepare_multilingual({"en": [en]}, [], word_tokenizer, tmp_path / "prep", valid_fraction=0, progress=False)
    corpus = TokenCorpus(tmp_path / "prep", "train")
    with pytest.raises(EmberError, match=r"needs parallel pairs \(--parallel SRC-TGT=FILE\)"):
        xlm_module("tlm").build_dataset(corpus, DataConfig(max_seq_length=8), 0)
    with pytest.raises(EmberError, match="language.*en.*that the model does not"):
        xlm_module("mlm", languages="de,ru").build_dataset(corpus, DataConfig(max_seq_length=8), 0)
    plain = tmp_path / "plain"
    from ember.data.prepare import prepare_corpus

    prepare_corpus([en], word_tokenizer, plain, valid_fraction=0, progress=False)
    with pytest.raises(EmberError, match="prepared without language codes"):
        xlm_module("mlm").build_dataset(TokenCorpus(plain, "train"), DataConfig(max_seq_length=8), 0)


def test_xlm_mlm_tlm_mixes_streams_and_pairs_at_tlm_fraction(tmp_path, word_tokenizer):
    """xlm_mlm_tlm: a share xlm.tlm_fraction of sequences are TLM pairs, the rest MLM streams,
    and a batch of both trains (metrics apart)."""
    import dataclasses

    from ember.data.multilingual import prepare_multilingual
    from ember.data.shards import TokenCorpus

    en = write(tmp_path / "en.txt", "The cat sat on the mat. " * 200)
    ru = write(tmp_path / "ru.txt", "Кошка сидела на коврике. " * 200)
    tsv = write(tmp_path / "pairs.tsv", PAIRS * 20)
    prepare_multilingual({"en": [en], "ru": [ru]}, [(("en", "ru"), tsv)], word_tokenizer, tmp_path / "prep",
                         valid_fraction=0, progress=False)
    module = xlm_module("mlm_tlm")
    module.xlm = dataclasses.replace(module.xlm, tlm_fraction=0.3)
    data = module.build_dataset(TokenCorpus(tmp_path / "prep", "train"), DataConfig(max_seq_length=16), seed=0)
    examples = [data.example(i, e) for e in range(4) for i in range(len(data))]
    share = np.mean([e.pair for e in examples])
    assert abs(share - 0.3) < 5 * np.sqrt(0.3 * 0.7 / len(examples))
    batch = module.make_batch(examples[:16], np.random.default_rng(0))
    loss, metrics = module.train()(batch)
    loss.backward()
    assert metrics["tlm_loss"][1] + metrics["mlm_loss"][1] == int((batch["labels"] != -100).sum())
    assert module.backbone.embeddings.language.weight.grad.abs().sum() > 0
