"""NSMC (Korean) and RuSentiment (Russian): readers on the real files and on malformed ones,
the carved dev split, RuSentiment's weighted F1, and Hangul/Cyrillic surviving the tokenizer
and `prepare` paths."""

from __future__ import annotations

import collections
import gzip
import unicodedata

import numpy as np
import pytest

from conftest import real_data
from ember.errors import EmberError
from ember.tasks.sentiment import (SENTIMENT_TASKS, SentimentAdapter, in_dev, mangled_letters, read_file,
                                   read_split)


def _has_jamo(text: str) -> bool:
    # Conjoining jamo (U+1100-U+11FF) appear only when Hangul syllables were NFD-decomposed.
    return any("\u1100" <= ch <= "\u11ff" for ch in text)


# --- readers on the real files -------------------------------------------------------------

def test_nsmc_reviews_with_a_bare_carriage_return_stay_one_row():
    train = read_file(real_data("nsmc", "ratings_train.txt"), "nsmc")
    assert len(train) == 150_000
    assert collections.Counter(ex.label for ex in train) == {0: 75_053, 1: 74_947}
    # Line 2304 of the raw crawl holds a "\r" inside the review; universal newlines would cut it.
    broken = train[2302]
    assert broken.text_a == '"로망은 어디에!!"\r 각색되긴했지만... 재미있었음!! 책도 꼭 보시길 추천합니다~!!'
    assert broken.label == 1 and sum("\r" in ex.text_a for ex in train) == 38


def test_carved_dev_is_deterministic_disjoint_and_keeps_duplicates_together():
    real_data("rusentiment")
    task = SENTIMENT_TASKS["rusentiment"]
    train, dev = read_split(task, "train"), read_split(task, "dev")
    assert len(train) + len(dev) == 21_268 + 6_950
    assert abs(len(dev) / (len(train) + len(dev)) - task.dev_fraction) < 0.01
    assert not {ex.text_a for ex in train} & {ex.text_a for ex in dev}  # duplicates land together
    assert [ex.text_a for ex in read_split(task, "dev")] == [ex.text_a for ex in dev]
    assert in_dev("같은 리뷰", 0.5) == in_dev("같은 리뷰", 0.5)
    assert read_split(task, "train", limit=10) == train[:10]


def test_rusentiment_reads_quoted_multiline_csv_texts():
    real_data("rusentiment")
    test = read_split("rusentiment", "test")
    assert len(test) == 2_967
    names = SENTIMENT_TASKS["rusentiment"].spec.labels
    assert collections.Counter(names[ex.label] for ex in test) == {
        "neutral": 1420, "positive": 536, "speech": 407, "skip": 346, "negative": 258}
    assert test[0].text_a == "Александр, тебе к лицу эта пушка :)\n"
    assert test[3].text_a.count("\n") == 2 and names[test[3].label] == "skip"


# --- malformed files: file:line errors ---------------------------------------------------------

NSMC_HEADER = "id\tdocument\tlabel\n"


@pytest.mark.parametrize("body, where, what", [
    ("1\t좋아요\t1\n2\t별로\t3\n", ":3:", "label '3' is not a NSMC label"),
    ("1\t좋아요\t1\n2\t별로\n3\t최고\t1\n", ":3:", "expected 3 tab-separated fields"),
    ("1\t좋아요\t1\n2\t\t0\n", ":3:", "empty 'document' field"),
    ("1\t좋\n아요\t1\n", ":2:", "expected 3 tab-separated fields .*found 2"),  # a review cut by a newline
    ("1\t좋아요\t1\n\n2\t별로\t0\n", ":3:", "blank line"),
])
def test_nsmc_malformed_rows_name_file_and_line(tmp_path, body, where, what):
    path = tmp_path / "ratings.txt"
    path.write_text(NSMC_HEADER + body, encoding="utf-8")
    with pytest.raises(EmberError, match=f"ratings.txt{where}.*{what}"):
        read_file(path, "nsmc")


def test_nsmc_bad_header_and_bad_bytes(tmp_path):
    path = tmp_path / "r.txt"
    path.write_text("id\ttext\tlabel\n1\t좋아요\t1\n", encoding="utf-8")
    with pytest.raises(EmberError, match=r"r.txt:1: header .* does not fit NSMC"):
        read_file(path, "nsmc")
    path.write_bytes(NSMC_HEADER.encode() + b"1\t\xc7\xd1\t1\n")  # EUC-KR, not UTF-8
    with pytest.raises(EmberError, match=r"r.txt:2: not valid UTF-8"):
        read_file(path, "nsmc")


@pytest.mark.parametrize("body, where, what", [
    # The bad label sits on line 5: the quoted text before it spans lines 2-4.
    ('positive,"раз\nдва\nтри"\nangry,текст\n', ":5:", "label 'angry' is not a RuSentiment label"),
    ('neutral,"не закрыта\nskip,текст\n', ":3:", r"bad CSV quoting \(the record starting at line 2\)"),
    ('neutral,"a"b\n', ":2:", "bad CSV quoting"),
    ("neutral,a,b\n", ":2:", "expected 2 comma-separated fields"),
    ('neutral,"  "\n', ":2:", "empty 'text' field"),
])
def test_rusentiment_malformed_records_name_file_and_line(tmp_path, body, where, what):
    path = tmp_path / "posts.csv"
    path.write_text("label,text\n" + body, encoding="utf-8")
    with pytest.raises(EmberError, match=f"posts.csv{where}.*{what}"):
        read_file(path, "rusentiment")


def test_prediction_files_may_lack_the_label_column(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text('text\n"первая\nстрока"\nвторая\n', encoding="utf-8")
    rows = read_file(path, "rusentiment", require_label=False)
    assert [(r.text_a, r.label) for r in rows] == [("первая\nстрока", None), ("вторая", None)]
    with pytest.raises(EmberError, match="header"):
        read_file(path, "rusentiment")


# --- metrics -----------------------------------------------------------------------------------

class _FixedLogits:
    """Stands in for a classifier: returns one-hot logits of the given predictions."""

    def __init__(self, preds, num_labels):
        self.logits = np.eye(num_labels, dtype=np.float32)[preds]

    def predict(self, features, batch_size, device):
        return self.logits


def test_rusentiment_weighted_and_macro_f1_by_hand():
    # labels 0..4 = positive, negative, neutral, speech, skip
    y = [0, 0, 0, 1, 1, 2, 2, 2, 2, 3]
    p = [0, 0, 1, 1, 2, 2, 2, 2, 0, 2]
    # per class: TP/FP/FN -> F1 = 2TP / (2TP + FP + FN)
    # 0: 2/1/1 -> 4/6; 1: 1/1/1 -> 2/4; 2: 3/2/1 -> 6/9; 3: 0/0/1 -> 0; 4: absent everywhere -> 0
    f1 = [4 / 6, 2 / 4, 6 / 9, 0.0, 0.0]
    support = [3, 2, 4, 1, 0]
    adapter = SentimentAdapter("rusentiment")
    scores = adapter.score(_FixedLogits(p, 5), None, [{"label": v} for v in y], 64, "cpu")
    assert scores["f1_weighted"] == pytest.approx(sum(f * s for f, s in zip(f1, support)) / 10)
    assert scores["f1_macro"] == pytest.approx(sum(f1) / 5)  # all 5 classes count, as in the paper
    assert scores["accuracy"] == pytest.approx(0.6)
    assert set(scores) == {"f1_weighted", "f1_macro", "accuracy"} and adapter.main_metric == "f1_weighted"


# --- Hangul and Cyrillic through tokenizer training, fine-tuning features and prepare -----------

@pytest.fixture(scope="module")
def korean_tokenizer(tmp_path_factory):
    from ember.tokenizers import train_tokenizer

    tok = train_tokenizer([real_data("nsmc", "unlabeled.txt.gz")], fmt="lines", vocab_size=3000,
                          max_documents=3000, progress=False)
    path = tmp_path_factory.mktemp("ko") / "tokenizer.json"
    tok.save(str(path))
    return path


def _squash(text: str) -> str:
    return "".join(text.lower().split())


def test_nsmc_features_keep_hangul_syllables(korean_tokenizer):
    from ember.tokenizers import load_tokenizer, special_token_ids

    tok = load_tokenizer(korean_tokenizer)
    unk = special_token_ids(tok)["unk"]
    examples, features = SentimentAdapter("nsmc").load("test", tok, 128, limit=300)
    assert len(features) == 300 and mangled_letters(tok, [ex.text_a for ex in examples]) == ""
    clean = 0
    for ex, f in zip(examples, features):
        pieces = tok.encode(ex.text_a).tokens
        assert f["input_ids"] == tok.encode(ex.text_a).ids[:128]
        assert not any(_has_jamo(t) for t in pieces)
        if unk not in f["input_ids"] and len(f["input_ids"]) < 128:
            assert _squash(tok.decode(f["input_ids"])) == _squash(unicodedata.normalize("NFC", ex.text_a))
            clean += 1
    assert clean > 200  # unknown characters (emoji, rare Hanja) only in a few reviews


def test_prepare_reads_nsmc_unlabeled_one_review_per_line(korean_tokenizer, tmp_path):
    from ember.data.prepare import prepare_corpus
    from ember.data.shards import TokenCorpus
    from ember.tokenizers import load_tokenizer

    source = real_data("nsmc", "unlabeled.txt.gz")
    stats = prepare_corpus([source], korean_tokenizer, tmp_path / "ko", fmt="lines", max_docs=400,
                           valid_fraction=0.0, progress=False)
    assert stats["docs"] == 400 and not stats["warnings"]
    with gzip.open(source, "rt", encoding="utf-8") as fh:
        lines = [ln.strip() for ln, _ in zip(fh, range(2000)) if ln.strip()][:400]
    tok = load_tokenizer(korean_tokenizer)
    corpus = TokenCorpus(tmp_path / "ko", "train")
    assert corpus.num_docs == 400
    for d in range(0, 400, 37):  # tokenizer trained on these lines: every character is known
        got = " ".join(tok.decode(corpus.sentence(s).tolist()) for s in corpus.doc_sentences(d))
        assert not _has_jamo(got) and _squash(got) == _squash(lines[d])


def test_prepare_and_tokenizer_keep_cyrillic_letters_of_ruslit(tmp_path):
    """Cyrillic file names through a glob (the folders also hold info.csv, which must not be read)."""
    from ember.data.prepare import prepare_corpus
    from ember.data.readers import expand_inputs
    from ember.data.shards import TokenCorpus
    from ember.tokenizers import load_tokenizer, train_tokenizer

    pattern = str(real_data("ruslit", "Chekhov") / "*.txt")
    files = expand_inputs([pattern])
    assert files and all(f.suffix == ".txt" for f in files) and any("Агафья" in f.name for f in files)
    tok = train_tokenizer([pattern], fmt="text", vocab_size=4000, max_documents=300, progress=False)
    tok.save(str(tmp_path / "tokenizer.json"))
    prepare_corpus([pattern], tmp_path / "tokenizer.json", tmp_path / "ru", fmt="text", max_docs=60,
                   valid_fraction=0.0, progress=False)
    tok = load_tokenizer(tmp_path / "tokenizer.json")
    corpus = TokenCorpus(tmp_path / "ru", "train")
    text = " ".join(tok.decode(corpus.sentence(s).tolist()) for d in range(corpus.num_docs)
                    for s in corpus.doc_sentences(d))
    assert "й" in text and "ё" in text and "\u0306" not in text and "\u0308" not in text
    # RuSentiment posts through the same tokenizer: й and ё kept, only case folded.
    examples, features = SentimentAdapter("rusentiment").load("test", tok, 128, limit=200)
    with_short_i = [(ex, f) for ex, f in zip(examples, features) if "й" in ex.text_a.lower()]
    assert with_short_i and all("й" in tok.decode(f["input_ids"]) for _, f in with_short_i
                                if tok.token_to_id("[UNK]") not in f["input_ids"])


def test_accent_stripping_tokenizers_are_flagged():
    from tokenizers import Tokenizer, models, normalizers

    stripping = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    stripping.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    lost = mangled_letters(stripping, ["한국 영화", "Йошкар-Ола, ёлка"])
    assert set("한국영화йё") <= set(lost.lower())
    keeping = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    keeping.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=False)
    assert mangled_letters(keeping, ["한국 영화", "Йошкар-Ола, ёлка"]) == ""


@pytest.mark.slow
def test_finetune_cli_on_rusentiment_reports_dev_and_test(tmp_path, capsys):
    """A tiny random BERT, 64 posts: dev carved from train selects, test reported beside it."""
    import json

    import torch

    from conftest import make_wordpiece
    from ember.cli import main

    real_data("rusentiment")
    tok_path = tmp_path / "tokenizer.json"
    make_wordpiece(list("абвгдеёжзийклмнопрстуфхцчшщъыьэюя")).save(str(tok_path))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        code = main(["finetune", "--task", "rusentiment", "--model", "bert-tiny", "--tokenizer", str(tok_path),
                     "--out", str(tmp_path / "run"), "--train-limit", "64", "--epochs", "1", "--max-length",
                     "32", "--no-progress"])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    result = json.loads((tmp_path / "run" / "results.json").read_text())
    assert result["split"] == "dev" and set(result["metrics"]) == {"f1_weighted", "f1_macro", "accuracy"}
    assert set(result["other_splits"]["test"]) == {"f1_weighted", "f1_macro", "accuracy"}
    assert json.loads((tmp_path / "run" / "labels.json").read_text()) == list(SENTIMENT_TASKS["rusentiment"].spec.labels)
    assert "RuSentiment test (seed" in capsys.readouterr().out
    # `ember evaluate --split test` reloads the best weights: the same test numbers.
    assert main(["evaluate", str(tmp_path / "run"), "--split", "test"]) == 0
    evaluated = json.loads(capsys.readouterr().out)  # the JSON result alone (notes go to stderr)
    assert evaluated["metrics"] == pytest.approx(result["other_splits"]["test"])
    # `ember predict` on an unlabelled CSV with a quoted two-line post.
    (tmp_path / "posts.csv").write_text('text\n"Ура!\nПобеда"\nгрустно\n', encoding="utf-8")
    assert main(["predict", str(tmp_path / "run"), "--input", str(tmp_path / "posts.csv"),
                 "--out", str(tmp_path / "pred.tsv")]) == 0
    rows = (tmp_path / "pred.tsv").read_text().splitlines()
    assert rows[0].split("\t")[:2] == ["id", "prediction"] and len(rows) == 3
    assert all(r.split("\t")[1] in SENTIMENT_TASKS["rusentiment"].spec.labels for r in rows[1:])
