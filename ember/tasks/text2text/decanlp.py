"""decaNLP's template set: every task as a question over a context (McCann et al. 2018, "The Natural
Language Decathlon: Multitask Learning as Question Answering").

decaNLP casts each of its ten tasks as (question, context) -> answer, the answer a word or a span,
so one model can be trained on all of them without task-specific parts. Its SST question is
"Is this review negative or positive?" over the review; its MNLI question is
'Hypothesis: "<hypothesis>" -- entailment, neutral, or contradiction?' over the context
'Premise: "<premise>"'; SQuAD is its own question over its paragraph. A text-to-text model reads
the pair as one input, T5's SQuAD layout (Raffel et al. 2020, Appendix D)::

    question: Is this review negative or positive? context: <sentence>          -> negative | positive
    question: Hypothesis: "<s2>" -- entailment or not_entailment? context: Premise: "<s1>"
    question: <question> context: <paragraph>                                   -> the answer (SQuAD)

Tasks decaNLP does not have follow its two patterns, with ember's wording: a single sentence is
asked "Is this <noun> <w1>, ..., or <wn>?" (the label words in label order, as SST's question
lists them), a pair puts one sentence in the question, named, and lists the label words after
"--" (MNLI's form; QNLI's question is the question, its sentence the context), and STS-B asks
for a score "from 0.0 to 5.0". Your own classify/pair tasks in a mixture ask with their prefix first
("question: likes: Is this text no or yes? context: ..."; ember's, so two such tasks with one label
set are told apart, as their T5 prefixes tell them). Targets, parsing and scoring are T5's (``GlueTemplate``: label
words, STS-B rounded to 0.2, invalid outputs count as wrong); SQuAD and your own texts keep the
T5 set's templates, which already are a question over a context or plain input -> target.
"""

from __future__ import annotations

from ember.errors import EmberError
from ember.tasks.text2text.templates import GlueTemplate, clean, stsb_target, template_for

TEMPLATE_SETS = ("t5", "decanlp")  # task.templates: T5's prefixes (.templates), decaNLP's questions (here)

# single-sentence tasks: the noun the question asks about (decaNLP's SST: "review")
SINGLE = {"sst2": "review", "nsmc": "review", "cola": "sentence", "rusentiment": "text", "classify": "text"}
# pair tasks: ((question's name for it, Example attribute), (context's name, attribute)); MNLI's form
PAIRS = {
    "rte": (("Hypothesis", "text_b"), ("Premise", "text_a")),
    "snli": (("Hypothesis", "text_b"), ("Premise", "text_a")),  # decaNLP's MNLI question, verbatim
    "mrpc": (("Sentence 2", "text_b"), ("Sentence 1", "text_a")),
    "stsb": (("Sentence 2", "text_b"), ("Sentence 1", "text_a")),
    "qnli": (("Question", "text_a"), ("Sentence", "text_b")),
    "pair": (("Sentence 2", "text_b"), ("Sentence 1", "text_a")),
}


def choices(words) -> str:
    """The label words as a question lists them: "a or b", "a, b, or c" (decaNLP's MNLI)."""
    words = list(words)
    return words[0] if len(words) == 1 else (", ".join(words[:-1]) + ("," if len(words) > 2 else "")
                                              + f" or {words[-1]}")


class QuestionTemplate(GlueTemplate):
    """A classification or STS-B task as a question over a context (module docstring); targets,
    parsing and scoring are ``GlueTemplate``'s."""

    def __init__(self, name: str, spec, prefix: str | None = None) -> None:
        pair = PAIRS.get(name, PAIRS["pair"]) if spec.text_b is not None or name in PAIRS else None
        lead = f"{prefix}: " if prefix else ""  # your own task's, in a mixture (module docstring)
        attrs = (("question", pair[0][1]), ("context", pair[1][1])) if pair else (("context", "text_a"),)
        super().__init__(name, spec, ("question:", attrs))  # is_pair: two text fields
        if self.is_regression:
            lo, hi = spec.score_range or (0.0, 5.0)
            ask = f"how similar, from {stsb_target(lo)} to {stsb_target(hi)}?"
        else:
            ask = f"{choices(self.words)}?"
        if pair:
            (q_name, self.q_attr), (c_name, self.c_attr) = pair
            self.parts = (f'question: {lead}{q_name}: "', f'" -- {ask} context: {c_name}: "', '"')
        else:
            self.q_attr, self.c_attr = None, "text_a"
            self.parts = (f"question: {lead}Is this {SINGLE.get(name, 'text')} {ask} context:",)

    def pieces(self, example) -> list[tuple[str, bool]]:
        if self.q_attr is None:
            return [(self.parts[0], False), (clean(getattr(example, self.c_attr)), True)]
        opening, middle, closing = self.parts
        return [(opening, False), (clean(getattr(example, self.q_attr)), True), (middle, False),
                (clean(getattr(example, self.c_attr)), True), (closing, False)]


def decanlp_template(adapter):
    """The decaNLP-style template of a task's encoder adapter; tasks already a question over a
    context (SQuAD, your own qa) or free text keep the T5 set's (whose refusals they share)."""
    name = adapter.name
    if name in SINGLE or name in PAIRS:
        return QuestionTemplate(name, adapter.spec, getattr(adapter, "input_prefix", None))
    return template_for(adapter)


def template_in_set(adapter, templates: str):
    """The template of a task's encoder adapter in the set ``templates`` (``task.templates``)."""
    if templates not in TEMPLATE_SETS:
        raise EmberError(f"task.templates={templates!r}: choose {' or '.join(TEMPLATE_SETS)} (T5's task prefixes, "
                         "or decaNLP's questions over a context)")
    return decanlp_template(adapter) if templates == "decanlp" else template_for(adapter)
