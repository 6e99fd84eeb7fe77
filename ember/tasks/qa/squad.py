"""SQuAD 1.1 / 2.0: a strict JSON reader, the article-level split, and stride-window features.

Reader. The official layout is ``{"version", "data": [{"title", "paragraphs": [{"context",
"qas": [{"id", "question", "answers": [{"text", "answer_start"}], "is_impossible"}]}]}]}``.
v1.1 has no ``is_impossible`` (every question has answers); v2.0 marks unanswerable questions
with ``is_impossible: true`` and ``answers: []`` (their ``plausible_answers`` are not used for
scoring, so they are ignored). Every answer must sit in its context at ``answer_start``: a
mismatch is an ``EmberError`` naming the file, the question id and the JSON path, never a
silently dropped question (which would change the score's denominator).

Split. Only half of the official SQuAD 2.0 dev set exists here (16 articles), so training and
evaluation data come from one file, split by *article* so no paragraph or topic is seen at
both ends: articles are ordered by the SHA-1 of their title and the first
``ceil(eval_fraction * n)`` form "dev", the rest "train". The order depends on titles only,
not on the file order or any seed, so the split is the same on every machine.

Features (BERT, Devlin et al. 2019 §4.2-4.3; Google's ``run_squad.py``). The question is cut to
``max_query_length`` tokens and packed as ``[CLS] question [SEP] window [SEP]`` (or the
tokenizer's own template, e.g. RoBERTa's ``<s> q </s></s> c </s>``). A context longer than
fits is covered by windows whose starts move by ``doc_stride`` tokens (BERT's meaning: the
step, not the overlap). A window that does not hold the whole answer is labelled with the
[CLS] position for both start and end - the "no answer" target of SQuAD 2.0 and BERT's
"out of span" target for 1.1 (XLNet's template ``q <sep> c <sep> <cls>`` puts it last). Character offsets come from the fast tokenizer, so spans map
back to the exact context characters for WordPiece and byte-level BPE alike.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from tokenizers import Tokenizer

from ember.errors import EmberError

SPLITS = ("train", "dev")


@dataclass(frozen=True)
class SquadExample:
    qid: str
    title: str
    question: str
    context: str
    answers: tuple[tuple[str, int], ...]  # (text, answer_start); empty = unanswerable
    is_impossible: bool

    @property
    def answer_texts(self) -> list[str]:
        return [text for text, _ in self.answers]


# -- reader ---------------------------------------------------------------------------------
def _expect(value, kind, file: Path, where: str, what: str, qid: str | None = None):
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        about = f" (question id {qid!r})" if qid is not None else ""
        raise EmberError(f"{file}: {where}{about}: {what} must be a {names}, got "
                         f"{type(value).__name__}; is this an official SQuAD JSON file?")
    return value


def read_squad(path: str | Path, limit: int | None = None, labelled: bool = True) -> list[SquadExample]:
    """Every question of a SQuAD v1.1/v2.0 JSON file, in file order (first ``limit`` if given).

    ``labelled=False`` (``ember predict``) accepts questions without answers.
    """
    file = Path(path)
    if not file.is_file():
        raise EmberError(f"SQuAD file not found: {file}")
    try:
        with open(file, encoding="utf-8") as fh:
            root = json.load(fh)
    except json.JSONDecodeError as exc:
        raise EmberError(f"{file}: not valid JSON ({exc.msg} at line {exc.lineno}, "
                         f"column {exc.colno})") from None
    except UnicodeDecodeError as exc:  # SQuAD files are UTF-8 JSON; a byte that is not names its place
        raise EmberError(f"{file}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
                         "SQuAD files are UTF-8 JSON") from None
    _expect(root, dict, file, "top level", "the document")
    if "data" not in root:
        raise EmberError(f"{file}: no 'data' list at the top level; expected the official SQuAD "
                         "layout {\"version\": ..., \"data\": [...]}")
    examples: list[SquadExample] = []
    seen: dict[str, str] = {}
    for a, article in enumerate(_expect(root["data"], list, file, "data", "'data'")):
        where_a = f"data[{a}]"
        _expect(article, dict, file, where_a, "an article")
        title = str(article.get("title", f"article-{a}"))
        paragraphs = _expect(article.get("paragraphs"), list, file, where_a, "'paragraphs'")
        for p, para in enumerate(paragraphs):
            where_p = f"{where_a}.paragraphs[{p}]"
            _expect(para, dict, file, where_p, "a paragraph")
            context = _expect(para.get("context"), str, file, where_p, "'context'")
            for q, qa in enumerate(_expect(para.get("qas"), list, file, where_p, "'qas'")):
                where = f"{where_p}.qas[{q}]"
                _expect(qa, dict, file, where, "a question")
                qid = qa.get("id")
                if not isinstance(qid, str) or not qid:
                    raise EmberError(f"{file}: {where}: question has no string 'id'")
                if qid in seen:
                    raise EmberError(f"{file}: {where}: question id {qid!r} repeats {seen[qid]}; "
                                     "ids must be unique (predictions are keyed by id)")
                seen[qid] = where
                examples.append(_read_question(qa, qid, title, context, file, where, labelled))
                if limit is not None and len(examples) >= limit:
                    return examples
    if not examples:
        raise EmberError(f"{file}: holds no questions")
    return examples


def _read_question(qa: dict, qid: str, title: str, context: str, file: Path,
                   where: str, labelled: bool = True) -> SquadExample:
    question = _expect(qa.get("question"), str, file, where, "'question'", qid)
    impossible = _expect(qa.get("is_impossible", False), bool, file, where, "'is_impossible'", qid)
    raw = _expect(qa.get("answers", []), list, file, where, "'answers'", qid)
    answers = []
    for k, answer in enumerate(raw):
        at = f"{where}.answers[{k}]"
        _expect(answer, dict, file, at, "an answer", qid)
        text = _expect(answer.get("text"), str, file, at, "'text'", qid)
        start = answer.get("answer_start")
        if not isinstance(start, int) or isinstance(start, bool):
            raise EmberError(f"{file}: {at} (question id {qid!r}): 'answer_start' must be an "
                             f"integer, got {start!r}")
        if context[start:start + len(text)] != text:
            found = context[max(start, 0):max(start, 0) + len(text)]
            raise EmberError(f"{file}: {at} (question id {qid!r}): answer {text!r} is not at "
                             f"character {start} of the context (found {found!r}); fix "
                             "'answer_start'")
        answers.append((text, start))
    if impossible and answers:
        raise EmberError(f"{file}: {where} (question id {qid!r}): is_impossible is true but it "
                         f"has {len(answers)} answers; unanswerable questions have 'answers': []")
    if labelled and not impossible and not answers:
        raise EmberError(f"{file}: {where} (question id {qid!r}): no answers; mark the question "
                         "'is_impossible': true (SQuAD 2.0) or give at least one answer")
    return SquadExample(qid, title, question, context, tuple(answers), impossible)


def split_by_article(examples: Sequence[SquadExample], split: str,
                     eval_fraction: float = 0.25) -> list[SquadExample]:
    """The "train" or "dev" share of ``examples``, by article (see the module docstring)."""
    if split not in SPLITS:
        raise EmberError(f"unknown SQuAD split {split!r}; choose one of {', '.join(SPLITS)}")
    if not 0.0 < eval_fraction < 1.0:
        raise EmberError(f"eval_fraction={eval_fraction} must lie strictly between 0 and 1")
    titles = list(dict.fromkeys(ex.title for ex in examples))
    if len(titles) < 2:
        raise EmberError(f"cannot split {len(titles)} article(s) into train and dev by article")
    ordered = sorted(titles, key=lambda t: hashlib.sha1(t.encode("utf-8")).hexdigest())
    n_eval = min(len(titles) - 1, max(1, math.ceil(eval_fraction * len(titles))))
    dev = set(ordered[:n_eval])
    return [ex for ex in examples if (ex.title in dev) == (split == "dev")]


# -- features -------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Layout:
    """Where the tokenizer's template puts its special tokens around question and context."""

    prefix: list[int]  # ids before the question, e.g. [CLS]
    middle: list[int]  # between question and context, e.g. [SEP] or </s></s>
    suffix: list[int]  # after the context, e.g. [SEP], or XLNet's <sep> <cls>
    types: tuple[list[int], int, list[int], int, list[int]]  # token types: prefix, question, middle, context, suffix

    def cls_index(self, length: int) -> int:
        """The no-answer position of a window of ``length`` tokens: the template's first token
        ([CLS], <s>), or, when nothing precedes the question, its last (XLNet's <cls>)."""
        return 0 if self.prefix else length - 1


def _template_layout(encoding) -> _Layout:
    """Read the special-token layout off a real (question, context) encoding (any template)."""
    seq = encoding.sequence_ids
    ids, types = encoding.ids, encoding.type_ids
    q_pos = [i for i, s in enumerate(seq) if s == 0]
    c_pos = [i for i, s in enumerate(seq) if s == 1]
    if not q_pos or not c_pos:
        raise EmberError("the question or the context encodes to no tokens")
    prefix = list(range(0, q_pos[0]))
    middle = list(range(q_pos[-1] + 1, c_pos[0]))
    suffix = list(range(c_pos[-1] + 1, len(ids)))
    if not prefix and not suffix:
        raise EmberError("the tokenizer's pair template puts no special token before the question or after the "
                         "context; extractive QA needs one ([CLS], <s>, XLNet's <cls>) as the no-answer position")
    layout_types = ([types[i] for i in prefix], types[q_pos[0]], [types[i] for i in middle], types[c_pos[0]],
                    [types[i] for i in suffix])
    return _Layout([ids[i] for i in prefix], [ids[i] for i in middle], [ids[i] for i in suffix], layout_types)


def _answer_tokens(offsets: list[tuple[int, int]], start_char: int, end_char: int) -> tuple[int, int]:
    """First and last context token overlapping characters [start_char, end_char)."""
    first = next(i for i, (s, e) in enumerate(offsets) if e > start_char)
    last = max(i for i, (s, e) in enumerate(offsets) if s < end_char)
    return first, last


def featurize_squad(
    examples: Sequence[SquadExample],
    tokenizer: Tokenizer,
    max_length: int = 384,
    doc_stride: int = 128,
    max_query_length: int = 64,
) -> list[dict]:
    """Stride windows over each context; one feature dict per window.

    Each feature: ``input_ids``, ``token_type_ids`` (length L <= max_length), ``example_index``,
    ``cls_index`` (the no-answer position), ``start_position``/``end_position`` (token indices
    of the first answer, or ``cls_index`` when the window lacks it or there is none),
    ``offsets`` (L entries: (char_start, char_end) in the context for context tokens, None for
    question and special tokens) and ``max_context`` (L booleans: this window gives the token
    its most central view; decoding only starts answers there, as in BERT's run_squad) and
    ``group`` (the number of its context: training keeps one paragraph's questions and windows
    apart in length-grouped batches, ``ember.train.length_groups``).
    """
    if doc_stride <= 0 or max_query_length <= 0:
        raise EmberError(f"doc_stride ({doc_stride}) and max_query_length ({max_query_length}) "
                         "must be positive")
    tok = Tokenizer.from_str(tokenizer.to_str())  # private copy: no truncation/padding
    tok.no_truncation()
    tok.no_padding()
    encodings = tok.encode_batch([(ex.question, ex.context) for ex in examples])
    features: list[dict] = []
    layout = None
    contexts: dict[str, int] = {}
    for index, (ex, enc) in enumerate(zip(examples, encodings)):
        # Each Encoding attribute access copies the whole list out of Rust: read them once.
        seq, enc_ids, enc_offsets = enc.sequence_ids, enc.ids, enc.offsets
        if layout is None:
            layout = _template_layout(enc)
        q_ids = [i for i, s in zip(enc_ids, seq) if s == 0][:max_query_length]
        c_pos = [i for i, s in enumerate(seq) if s == 1]
        c_ids = [enc_ids[i] for i in c_pos]
        c_offsets = [tuple(enc_offsets[i]) for i in c_pos]
        n_special = len(layout.prefix) + len(layout.middle) + len(layout.suffix)
        room = max_length - n_special - len(q_ids)
        if room <= 0:
            raise EmberError(f"max_length={max_length} leaves no room for the context after a "
                             f"{len(q_ids)}-token question and {n_special} special tokens; raise "
                             "--max-length or lower max_query_length")
        answer = None
        if ex.answers and c_ids:
            text, start = ex.answers[0]  # BERT trains on the first reference answer
            answer = _answer_tokens(c_offsets, start, start + len(text))
        windows = _windows(len(c_ids), room, doc_stride)
        for w_start, w_len in windows:
            head = layout.prefix + q_ids + layout.middle
            ctx0 = len(head)
            ids = head + c_ids[w_start:w_start + w_len] + layout.suffix
            tp, tq, tm, tc, ts = layout.types
            types = tp + [tq] * len(q_ids) + tm + [tc] * w_len + ts
            offsets = [None] * len(ids)
            max_context = [False] * len(ids)
            for j in range(w_len):
                offsets[ctx0 + j] = c_offsets[w_start + j]
                max_context[ctx0 + j] = _is_max_context(windows, (w_start, w_len), w_start + j)
            cls_index = layout.cls_index(len(ids))
            start_pos = end_pos = cls_index
            if answer is not None and w_start <= answer[0] and answer[1] < w_start + w_len:
                start_pos, end_pos = ctx0 + answer[0] - w_start, ctx0 + answer[1] - w_start
            features.append({
                "input_ids": ids, "token_type_ids": types, "example_index": index,
                "group": contexts.setdefault(ex.context, len(contexts)),
                "cls_index": cls_index, "start_position": start_pos, "end_position": end_pos,
                "offsets": offsets, "max_context": max_context,
            })
    return features


def _windows(n_tokens: int, room: int, stride: int) -> list[tuple[int, int]]:
    """(start, length) of each window; starts advance by ``stride`` until the end is covered."""
    windows, start = [], 0
    while True:
        length = min(n_tokens - start, room)
        windows.append((start, length))
        if start + length >= n_tokens:
            return windows
        start += min(length, stride)


def _is_max_context(windows: list[tuple[int, int]], current: tuple[int, int], position: int) -> bool:
    """BERT's ``_check_is_max_context``: score = min(left, right context) + 0.01 * length."""
    best, best_window = None, None
    for start, length in windows:
        end = start + length - 1
        if not start <= position <= end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best is None or score > best:
            best, best_window = score, (start, length)
    return best_window == current
