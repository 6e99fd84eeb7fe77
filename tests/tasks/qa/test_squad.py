"""SQuAD reader (v1.1/v2.0, malformed files), article split, and stride-window features."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

import pytest
from conftest import make_wordpiece, real_data

from ember.errors import EmberError
from ember.tasks.qa.squad import SquadExample, featurize_squad, read_squad, split_by_article
from ember.tasks.metrics.squad import normalize_answer


def squad_file() -> Path:
    return real_data("squad2-dev-half", "dev-v2.0.json")


@functools.lru_cache(maxsize=None)
def squad_tokenizer(kind: str = "wordpiece", vocab_size: int = 1500):
    """A tokenizer of ``kind`` trained with ember on the real SQuAD contexts and questions."""
    from ember.tokenizers import train_tokenizer

    examples = read_squad(squad_file())
    texts = list(dict.fromkeys(ex.context for ex in examples)) + [ex.question for ex in examples]
    folder = Path(tempfile.mkdtemp(prefix="squad-tok-"))
    (folder / "texts.txt").write_text("\n\n".join(t.replace("\n", " ") for t in texts), encoding="utf-8")
    return train_tokenizer([folder / "texts.txt"], kind=kind, vocab_size=vocab_size, progress=False)


def _write(tmp_path: Path, root) -> Path:
    path = tmp_path / "squad.json"
    path.write_text(root if isinstance(root, str) else json.dumps(root), encoding="utf-8")
    return path


CONTEXT = "Normandy is a region in France. Rollo led the Norse."


def _v2(qas, context=CONTEXT):
    return {"version": "v2.0", "data": [{"title": "Normans", "paragraphs": [{"context": context, "qas": qas}]}]}


# -- reader ---------------------------------------------------------------------------------
def test_squad2_reader_keeps_answers_and_unanswerable(tmp_path):
    qas = [
        {"id": "a1", "question": "Where is Normandy?", "is_impossible": False,
         "answers": [{"text": "France", "answer_start": 24}, {"text": "in France", "answer_start": 21}]},
        {"id": "n1", "question": "Who led the Danes?", "is_impossible": True, "answers": [],
         "plausible_answers": [{"text": "Rollo", "answer_start": 32}]},
    ]
    examples = read_squad(_write(tmp_path, _v2(qas)))
    assert [ex.qid for ex in examples] == ["a1", "n1"]
    assert examples[0].answers == (("France", 24), ("in France", 21)) and not examples[0].is_impossible
    assert examples[1].answers == () and examples[1].is_impossible and examples[1].title == "Normans"


def test_squad1_reader_without_is_impossible(tmp_path):
    qas = [{"id": "a1", "question": "Who led the Norse?", "answers": [{"text": "Rollo", "answer_start": 32}]}]
    (ex,) = read_squad(_write(tmp_path, {"version": "1.1", **_v2(qas)}))
    assert ex.answer_texts == ["Rollo"] and not ex.is_impossible


@pytest.mark.parametrize("qas, message", [
    ([{"id": "q7", "question": "?", "answers": [{"text": "France", "answer_start": 3}]}],
     r"data\[0\]\.paragraphs\[0\]\.qas\[0\]\.answers\[0\] \(question id 'q7'\): answer 'France' is not at character 3"),
    ([{"id": "q7", "question": "?", "answers": []}],
     r"qas\[0\] \(question id 'q7'\): no answers; mark the question 'is_impossible'"),
    ([{"id": "q7", "question": "?", "is_impossible": True, "answers": [{"text": "Rollo", "answer_start": 32}]}],
     r"question id 'q7'\): is_impossible is true but it has 1 answers"),
    ([{"id": "q7", "question": "?", "answers": [{"text": "Rollo", "answer_start": "32"}]}],
     r"answers\[0\] \(question id 'q7'\): 'answer_start' must be an integer"),
    ([{"id": "q7", "question": 5, "answers": []}],
     r"qas\[0\] \(question id 'q7'\): 'question' must be a str"),
    ([{"id": "q7", "question": "?", "answers": [{"text": "Rollo", "answer_start": 32}]},
      {"id": "q7", "question": "?", "answers": [{"text": "Rollo", "answer_start": 32}]}],
     r"qas\[1\]: question id 'q7' repeats data\[0\]\.paragraphs\[0\]\.qas\[0\]"),
    ([{"question": "?", "answers": []}], r"qas\[0\]: question has no string 'id'"),
])
def test_squad_reader_malformed_questions_name_file_id_and_path(tmp_path, qas, message):
    path = _write(tmp_path, _v2(qas))
    with pytest.raises(EmberError, match=message) as err:
        read_squad(path)
    assert str(path) in str(err.value)


def test_squad_reader_malformed_documents(tmp_path):
    with pytest.raises(EmberError, match=r"squad\.json: not valid JSON .* line 1"):
        read_squad(_write(tmp_path, '{"data": [}'))
    with pytest.raises(EmberError, match="no 'data' list"):
        read_squad(_write(tmp_path, {"version": "v2.0"}))
    with pytest.raises(EmberError, match=r"data\[0\]\.paragraphs\[0\]: 'context' must be a str"):
        read_squad(_write(tmp_path, {"data": [{"paragraphs": [{"qas": []}]}]}))
    with pytest.raises(EmberError, match="SQuAD file not found"):
        read_squad(tmp_path / "absent.json")


def test_squad2_real_file_reads_every_question():
    examples = read_squad(squad_file())
    assert len(examples) == 6078
    assert sum(ex.is_impossible for ex in examples) == 3168
    assert len({ex.title for ex in examples}) == 16


def test_squad_article_split_is_disjoint_complete_and_order_independent():
    examples = read_squad(squad_file())
    train, dev = split_by_article(examples, "train"), split_by_article(examples, "dev")
    assert {ex.title for ex in train}.isdisjoint({ex.title for ex in dev})
    assert len(train) + len(dev) == len(examples)
    assert len({ex.title for ex in dev}) == 4  # ceil(0.25 * 16)
    # The split depends on titles only: reversing the file's article order changes nothing.
    again = split_by_article(list(reversed(examples)), "dev")
    assert {ex.qid for ex in again} == {ex.qid for ex in dev}
    with pytest.raises(EmberError, match="unknown SQuAD split"):
        split_by_article(examples, "test")


# -- features -------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_squad_windows_cover_every_context_token_and_answers_map_back(kind):
    tok = squad_tokenizer(kind)
    examples = read_squad(squad_file(), limit=300)
    max_length, stride = 96, 32
    features = featurize_squad(examples, tok, max_length, doc_stride=stride, max_query_length=24)
    by_example: dict[int, list[dict]] = {}
    for f in features:
        assert len(f["input_ids"]) == len(f["token_type_ids"]) == len(f["offsets"]) <= max_length
        by_example.setdefault(f["example_index"], []).append(f)
    assert len(by_example) == len(examples) and len(features) > len(examples)  # some contexts split
    exact = answered = 0
    for index, ex in enumerate(examples):
        # Every token of the whole context appears in some window.
        full = tok.encode(ex.question, ex.context)
        # (Byte-level BPE splits one character into several tokens with equal offsets: compare
        # offsets as sets here, with multiplicity below.)
        want = sorted(tuple(o) for o, s in zip(full.offsets, full.sequence_ids) if s == 1)
        got = {o for f in by_example[index] for o in f["offsets"] if o is not None}
        assert got == set(want)
        # Each token is the "max context" of exactly one window.
        central = [o for f in by_example[index] for o, m in zip(f["offsets"], f["max_context"]) if m]
        assert sorted(central) == want
        for f in by_example[index]:
            s, e = f["start_position"], f["end_position"]
            if s == f["cls_index"]:
                assert e == f["cls_index"]
                continue
            text, start = ex.answers[0]
            span = ex.context[f["offsets"][s][0]:f["offsets"][e][1]]
            # The labelled tokens cover the answer's characters, and no more than its tokens.
            assert f["offsets"][s][0] <= start and f["offsets"][e][1] >= start + len(text)
            answered += 1
            exact += span == text
    assert answered > 100
    assert exact / answered > 0.97  # the rest are answers cut mid-token, e.g. "Norman" in "Normans"


def _long_example(answer_word: str = "target") -> SquadExample:
    words = [f"w{i % 80}" for i in range(60)] + [answer_word] + [f"w{i % 80}" for i in range(20)]
    context = " ".join(words)
    start = context.index(answer_word)
    return SquadExample("q", "t", "the a", context, ((answer_word, start),), False)


def test_squad_answer_outside_window_is_labelled_cls():
    tok = make_wordpiece([f"w{i}" for i in range(80)] + ["the", "a", "target"])
    ex = _long_example()
    # 3 specials + 2 question tokens leave room for 20 context tokens per window.
    features = featurize_squad([ex], tok, max_length=25, doc_stride=10, max_query_length=64)
    tokens = [tok.id_to_token(i) for i in features[0]["input_ids"][:5]]
    assert tokens == ["[CLS]", "the", "a", "[SEP]", "w0"]
    assert features[0]["token_type_ids"][:5] == [0, 0, 0, 0, 1] and features[0]["token_type_ids"][-1] == 1
    # 81 context tokens, room 20, stride 10: windows start at 0, 10, ..., 70 (70..80 ends it).
    starts = [f["offsets"][4] for f in features]
    assert len(features) == 8 and all(len(f["input_ids"]) <= 25 for f in features)
    holding = [i for i, f in enumerate(features) if f["start_position"] != 0]
    # The answer is context token 60: in windows starting at 50 (tokens 50..69) and 60 (60..80),
    # not at 0..40 (ends 19..59) nor at 70.
    assert holding == [5, 6]
    for i in holding:
        f = features[i]
        assert f["start_position"] == f["end_position"]
        assert tok.id_to_token(f["input_ids"][f["start_position"]]) == "target"
    for i in (0, 1, 2, 3, 4, 7):
        assert features[i]["start_position"] == features[i]["end_position"] == features[i]["cls_index"] == 0
    assert starts[0] == (0, 2)


def test_squad_question_is_cut_to_max_query_length_and_too_small_max_length_fails():
    tok = make_wordpiece([f"w{i}" for i in range(80)] + ["the", "a", "target"])
    ex = SquadExample("q", "t", " ".join(["a"] * 30), "w1 target w2", (("target", 3),), False)
    (f,) = featurize_squad([ex], tok, max_length=64, doc_stride=8, max_query_length=5)
    assert f["input_ids"][:7] == [2] + [tok.token_to_id("a")] * 5 + [3]
    assert tok.id_to_token(f["input_ids"][f["start_position"]]) == "target"
    with pytest.raises(EmberError, match="leaves no room for the context"):
        featurize_squad([ex], tok, max_length=8, doc_stride=8, max_query_length=5)


def test_roberta_bpe_squad_features_use_the_pair_template():
    tok = squad_tokenizer("bpe")
    ex = read_squad(squad_file(), limit=1)[0]
    (f, *_) = featurize_squad([ex], tok, max_length=128, doc_stride=64, max_query_length=32)
    tokens = [tok.id_to_token(i) for i in f["input_ids"]]
    sep = tokens.index("</s>")
    assert tokens[0] == "<s>" and tokens[sep + 1] == "</s>" and tokens[-1] == "</s>"
    assert set(f["token_type_ids"]) == {0}
    assert normalize_answer(ex.context[f["offsets"][f["start_position"]][0]:
                                       f["offsets"][f["end_position"]][1]]) == "france"


def test_squad_reader_for_prediction_accepts_questions_without_answers(tmp_path):
    path = _write(tmp_path, _v2([{"id": "p1", "question": "Who led the Norse?"}]))
    (ex,) = read_squad(path, labelled=False)
    assert ex.answers == () and not ex.is_impossible
    with pytest.raises(EmberError, match="'p1'\\): no answers"):
        read_squad(path)
