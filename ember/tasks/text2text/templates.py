"""The text-to-text form of each fine-tuning task: input text, target text, and outputs parsed back
(Raffel et al. 2020, §2.4 "Input and Output Format" and Appendix D).

T5 casts every task as "feed the model some text, train it to produce some target text": the
input starts with a task prefix and names each field, the target is the label as a word
(Appendix D; the label words are the T5 code's, i.e. the GLUE label names, which ember's
``TaskSpec.label_names`` already hold):

    sst2 sentence: <sentence>                           -> negative | positive
    cola sentence: <sentence>                           -> unacceptable | acceptable
    mrpc sentence1: <s1> sentence2: <s2>                -> not_equivalent | equivalent
    rte sentence1: <s1> sentence2: <s2>                 -> entailment | not_entailment
    stsb sentence1: <s1> sentence2: <s2>                -> 3.8
    qnli question: <question> sentence: <sentence>      -> entailment | not_entailment
    mnli hypothesis: <hypothesis> premise: <premise>    -> entailment | neutral | contradiction
    question: <question> context: <context>             -> the answer text (SQuAD)

* SNLI stands in for MNLI here (as in `ember glue`), so it takes MNLI's format and prefix:
  same labels, same kind of pairs, and a released T5 checkpoint (trained on the paper's
  multi-task mixture) answers it as it answers MNLI.
* NSMC and RuSentiment are not in the paper; they take the single-sentence GLUE pattern
  ("nsmc sentence: ...", "rusentiment sentence: ...") with their label names as words.
* STS-B (§2.4): "we simply rounded any score to the nearest increment of 0.2 and converted the
  result to a literal string representation of the number" (2.57 -> "2.6"); as the T5 code,
  round(5 x) / 5 with one decimal, halves to even (tf.round's rule and Python's).
* Your own data (``ember.tasks.custom``): classify and pair take the GLUE pattern with the
  kind as prefix ("classify sentence: ...", "pair sentence1: ... sentence2: ...") and the
  training file's labels as the words; qa takes SQuAD's; regression is refused (STS-B's 0.2
  rounding on a 0-5 scale does not fit an arbitrary target).
* Your own input -> target pairs (``ember.tasks.text2text.custom``, ``--task text2text``): the
  input as written, no prefix; every output is valid and is scored as text (``text_metrics``).
* In a mixture (``ember.train.multitask``) each of your own tasks has a prefix of its own, kept in
  its task.json (``input_prefix``; by default its name, as T5 names each task, App. D): "tickets
  sentence: ...", "tickets question: ... context: ...", "summarize: <input>"; "" is no prefix
  (your text2text inputs as written, with the prefix your file holds; "sentence: ...").
* SQuAD (Appendix D): "question: ... context: ...", no task prefix; the target is the first
  reference answer (the one BERT trains on too). SQuAD 2.0 is not in the paper: ember's
  target for an unanswerable question is the word "unanswerable" (``NO_ANSWER``).

Outputs that are not a valid label "count as wrong" (§2.4). Classification: an invalid output
is scored as a wrong class (the one after the gold label; for a binary task the other label,
which is the T5 code's rule for F1); STS-B: -1.0, the T5 code's default for an output that
is no number, also for numbers outside the task's score range (the paper: "if the model
outputs a string corresponding to a number between 1 and 5"; STS-B's scores run from 0).
SQuAD: an output is valid when its normalised words (the official normalisation) are a run
of the context's normalised words (or, SQuAD 2.0, the no-answer word); an invalid output
scores EM = F1 = 0. The share of invalid outputs is reported as the metric ``invalid``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.errors import EmberError

NO_ANSWER = "unanswerable"  # the target of an unanswerable SQuAD 2.0 question (ember's choice)
WRONG_SCORE = -1.0  # an STS-B output that is no score in range (t5 code: string_to_float's default)

# task -> (prefix, ((field name, Example attribute), ...)): Appendix D's formats.
GLUE_FORMATS = {
    "sst2": ("sst2", (("sentence", "text_a"),)),
    "cola": ("cola", (("sentence", "text_a"),)),
    "mrpc": ("mrpc", (("sentence1", "text_a"), ("sentence2", "text_b"))),
    "rte": ("rte", (("sentence1", "text_a"), ("sentence2", "text_b"))),
    "stsb": ("stsb", (("sentence1", "text_a"), ("sentence2", "text_b"))),
    "qnli": ("qnli", (("question", "text_a"), ("sentence", "text_b"))),
    "snli": ("mnli", (("hypothesis", "text_b"), ("premise", "text_a"))),  # premise is SNLI's text_a
    "nsmc": ("nsmc", (("sentence", "text_a"),)),
    "rusentiment": ("rusentiment", (("sentence", "text_a"),)),
}
SQUAD_TASKS = ("squad", "squad2")


@dataclass(frozen=True)
class Parsed:
    """A decoded output read back: a class id, a score or an answer text; None when invalid."""

    value: int | float | str | None
    valid: bool


def stsb_target(score: float) -> str:
    """STS-B's target text: the score rounded to the nearest 0.2, one decimal (2.57 -> "2.6")."""
    return f"{round(score * 5) / 5:.1f}"


def clean(text: str) -> str:
    """Whitespace runs as one space, none at the ends: the T5 code joins an input's pieces with
    spaces and collapses runs (``_string_join``), and SentencePiece drops the ends' spaces."""
    return " ".join(text.split())


def input_text(template, example) -> str:
    """The whole input as text, e.g. "sst2 sentence: it 's a charming ... journey ." (the token
    ids ember feeds are this text's, piece by piece, then </s>)."""
    return " ".join(text for text, _ in template.pieces(example))


def _normalised_run(text: str, context: str) -> bool:
    """Are the normalised words of ``text`` a contiguous run of those of ``context``?"""
    from ember.tasks.metrics.squad import normalize_answer

    words, within = normalize_answer(text).split(), normalize_answer(context).split()
    n = len(words)
    return n > 0 and any(within[i:i + n] == words for i in range(len(within) - n + 1))


class GlueTemplate:
    """Sentence (pair) classification or STS-B regression as text (see the module docstring)."""

    kind = "classify"

    def __init__(self, name: str, spec, fmt=None) -> None:
        self.prefix, self.fields = fmt or GLUE_FORMATS[name]
        self.spec = spec
        self.words = () if spec.is_regression else tuple(spec.label_names or spec.labels)

    @property
    def is_regression(self) -> bool:
        return self.spec.is_regression

    @property
    def is_pair(self) -> bool:
        return len(self.fields) == 2

    def pieces(self, example) -> list[tuple[str, bool]]:
        """(text, may be truncated) in input order: "sst2 sentence:", the sentence, ..."""
        out = []
        for i, (field, attr) in enumerate(self.fields):
            out += [(_prefixed(self.prefix if i == 0 else "", f"{field}:"), False), (clean(getattr(example, attr)), True)]
        return out

    def target(self, example) -> str:
        return stsb_target(example.label) if self.is_regression else self.words[example.label]

    def target_texts(self) -> list[str]:
        """Every valid target: the label words, or the 26 scores 0.0 ... 5.0."""
        if self.is_regression:
            lo, hi = self.spec.score_range or (0.0, 5.0)
            return [stsb_target(k / 5) for k in range(round(lo * 5), round(hi * 5) + 1)]
        return list(self.words)

    def parse(self, output: str, example=None) -> Parsed:
        text = output.strip()
        if not self.is_regression:
            return Parsed(self.words.index(text), True) if text in self.words else Parsed(None, False)
        try:
            score = float(text)
        except ValueError:
            return Parsed(None, False)
        lo, hi = self.spec.score_range or (0.0, 5.0)
        return Parsed(score, True) if lo <= score <= hi else Parsed(None, False)  # NaN fails both

    def scored(self, parsed: Parsed, gold):
        """What the metric sees: the parsed value, or for an invalid output a wrong one."""
        if parsed.valid:
            return parsed.value
        return WRONG_SCORE if self.is_regression else (int(gold) + 1) % len(self.words)


class SquadTemplate:
    """Extractive QA as text: "question: ... context: ..." -> the answer (module docstring)."""

    kind = "answer"
    is_regression = False
    is_pair = True

    def __init__(self, with_no_answer: bool, prefix: str = "") -> None:
        self.no_answer = NO_ANSWER if with_no_answer else None
        self.prefix = prefix  # your own qa task in a mixture: "NAME question: ..." (T5's SQuAD has none)

    def pieces(self, example) -> list[tuple[str, bool]]:
        return [(_prefixed(self.prefix, "question:"), False), (clean(example.question), True), ("context:", False),
                (clean(example.context), True)]

    def target(self, example) -> str:
        if example.answers:
            return clean(example.answers[0][0])
        if self.no_answer is None:
            raise EmberError(f"question {example.qid!r} has no answer; SQuAD 1.1 needs one (use squad2)")
        return self.no_answer

    def target_texts(self) -> list[str]:
        return [self.no_answer] if self.no_answer else []

    def parse(self, output: str, example) -> Parsed:
        text = output.strip()
        if self.no_answer is not None and text == self.no_answer:
            return Parsed("", True)
        return Parsed(text, _normalised_run(text, example.context))


class FreeTextTemplate:
    """Your own input -> target texts (``ember.tasks.text2text.custom``): the input as written, no
    prefix; any output is valid and is scored against the target as text."""

    kind = "generate"
    is_regression = False
    is_pair = False

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix  # in a mixture: "NAME: <input>" (T5's "summarize: ..."); "" feeds it as written

    def pieces(self, example) -> list[tuple[str, bool]]:
        return ([(f"{self.prefix}:", False)] if self.prefix else []) + [(clean(example.source), True)]

    def target(self, example) -> str:
        return clean(example.target)

    def target_texts(self) -> list[str]:
        return []  # free text: nothing to check against the tokenizer in advance

    def parse(self, output: str, example=None) -> Parsed:
        return Parsed(clean(output), True)


def _prefixed(prefix: str, text: str) -> str:
    return f"{prefix} {text}" if prefix else text


def custom_format(kind: str, is_pair: bool):
    """The input format of a custom classify/pair task: "classify sentence: ..." or "pair
    sentence1: ... sentence2: ...", the task kind as its prefix (as "sst2" / "mrpc" are)."""
    if is_pair:
        return kind, (("sentence1", "text_a"), ("sentence2", "text_b"))
    return kind, (("sentence", "text_a"),)


def template_for(adapter):
    """The text-to-text template of a task's encoder adapter, or an EmberError naming the task."""
    name = adapter.name
    if name in GLUE_FORMATS:
        return GlueTemplate(name, adapter.spec)
    if name in SQUAD_TASKS:
        return SquadTemplate(name == "squad2")
    prefix = getattr(adapter, "input_prefix", None)  # your own task's, in a mixture (None: the kind's form)
    if name in ("classify", "pair"):  # your own labelled texts: the GLUE pattern, the labels as words
        return GlueTemplate(name, adapter.spec, custom_format(name if prefix is None else prefix,
                                                              adapter.spec.text_b is not None))
    if name == "qa":
        return SquadTemplate(adapter.with_no_answer, prefix or "")
    if name == "text2text":  # your own input -> target texts
        return FreeTextTemplate(prefix or "")
    if name == "regression":
        raise EmberError("--task regression with a T5 model: T5 predicts a number as text rounded to STS-B's "
                         "0.2 steps on its 0-5 scale (Raffel et al. 2020, §2.4), which does not fit an arbitrary "
                         "target; fine-tune regression with an encoder run (bert, roberta, electra, ...)")
    known = ", ".join(list(GLUE_FORMATS) + list(SQUAD_TASKS))
    raise EmberError(f"--task {name}: {adapter.display_name} has no text-to-text template, so a T5 (encoder-"
                     "decoder) model cannot be fine-tuned on it. T5 casts classification, regression and "
                     f"question answering as text (Raffel et al. 2020, §2.4); tasks with a template: {known}. "
                     "Fine-tune this task with an encoder run (bert, roberta, electra, ...) instead")


def input_format(template) -> tuple[str, ...]:
    """The fixed text of a template's inputs (prefixes, field names, a decaNLP question): two tasks
    of one text-to-text model whose inputs share it could not be told apart."""
    from types import SimpleNamespace

    blank = SimpleNamespace(text_a="", text_b="", question="", context="", source="")
    return tuple(text for text, cut in template.pieces(blank) if not cut)

