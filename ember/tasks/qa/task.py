"""`--task squad` / `--task squad2`: SQuAD as a fine-tuning task adapter.

The adapter ties the reader and features (``squad.py``), the QA head and decoding (``qa.py``)
and the official metrics (``squad_metrics.py``) behind the task interface ``ember finetune``
drives: ``load`` -> (examples, features), ``build_module``, ``score`` -> metrics.

Data. Only ``squad2-dev-half`` (half of the official SQuAD 2.0 dev set) is available, so both
splits come from it, split by article (``squad.split_by_article``: 4 of the 16 articles, picked
by the SHA-1 of their titles, form "dev"; the other 12 "train"). ``path=`` reads a whole
SQuAD JSON file of the user's instead.

Versions. ``squad2`` trains and scores with unanswerable questions: the reported exact/f1 use
the no-answer threshold ``null_threshold`` (0.0 = the arg-max decision), and best_f1 /
best_f1_thresh give the threshold tuned on the evaluated questions, as the official script
reports it. ``squad`` is SQuAD 1.1-style: unanswerable questions are left out of both
splits and the best span is always the answer.

``ember predict`` reads a SQuAD JSON file whose questions may lack answers and writes, per
question, the prediction ("" = no answer at ``null_threshold``), the best span, its no-answer
score and the top n-best spans.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ember.errors import EmberError
from ember.paths import data_path
from ember.tasks.readers.glue import BertHParams
from ember.tasks.qa.head import QuestionAnswering, decode_answers
from ember.tasks.qa.squad import SPLITS, SquadExample, featurize_squad, read_squad, split_by_article
from ember.tasks.metrics.squad import squad_evaluate
from ember.tasks.inference.requests import body_schema

VERSIONS = {"squad": "SQuAD 1.1", "squad2": "SQuAD 2.0"}
# BERT (Devlin et al. 2019) §4.2: SQuAD 1.1 for 3 epochs, lr 5e-5, batch 32; §4.3: SQuAD 2.0 for
# 2 epochs, lr 5e-5, batch 48. Max length 384 is run_squad.py's max_seq_length.
HPARAMS = {
    "squad": BertHParams(learning_rate=5e-5, batch_size=32, epochs=3.0, max_length=384),
    "squad2": BertHParams(learning_rate=5e-5, batch_size=48, epochs=2.0, max_length=384),
}
DEFAULT_FILE = ("squad2-dev-half", "dev-v2.0.json")


class SquadAdapter:
    """`--task squad` / `--task squad2`: extractive QA with the official EM/F1 (see the module docstring)."""

    kind = "answer"  # its inference method (``inference_methods``)
    language = "en"

    def __init__(self, version: str = "squad2", doc_stride: int = 128, max_query_length: int = 64,
                 n_best: int = 20, max_answer_length: int = 30, null_threshold: float = 0.0,
                 eval_fraction: float = 0.25) -> None:
        if version not in VERSIONS:
            raise EmberError(f"unknown SQuAD version {version!r}; choose one of {', '.join(VERSIONS)}")
        self.name, self.display_name = version, VERSIONS[version]
        self.hparams = HPARAMS[version]
        self.doc_stride, self.max_query_length = doc_stride, max_query_length
        self.n_best, self.max_answer_length = n_best, max_answer_length
        self.null_threshold, self.eval_fraction = null_threshold, eval_fraction

    @property
    def with_no_answer(self) -> bool:
        return self.name == "squad2"

    @property
    def main_metric(self) -> str:
        """What picks the best checkpoint. SQuAD 2.0: F1 at the no-answer threshold tuned on dev
        (tuned_f1, the realizable form of the official best_f1), because that threshold is what
        the kept weights are used with (BERT §4.3); F1 at threshold 0 would rank checkpoints by
        a decision rule nobody applies."""
        return "tuned_f1" if self.with_no_answer else "f1"

    def label_names(self) -> None:
        return None

    def read(self, split: str, path: str | None = None, limit: int | None = None) -> list[SquadExample]:
        if path is None and split not in SPLITS and Path(split).suffix == ".json":
            path = split  # `--train-split FILE` / `--dev FILE`: the user's own SQuAD JSON, as GLUE tasks take TSVs
        if path is not None:
            examples = read_squad(path)
        else:
            examples = split_by_article(read_squad(data_path(*DEFAULT_FILE)), split, self.eval_fraction)
        if not self.with_no_answer:
            examples = [ex for ex in examples if not ex.is_impossible]
        if limit is not None:
            examples = examples[:limit]
        if not examples:
            raise EmberError(f"{self.display_name} {split}: no questions to use")
        return examples

    def load(self, split: str, tokenizer, max_length: int, limit: int | None = None,
             path: str | None = None) -> tuple[list[SquadExample], list[dict]]:
        examples = self.read(split, path, limit)
        features = featurize_squad(examples, tokenizer, max_length, self.doc_stride,
                                   self.max_query_length)
        return examples, features

    def build_module(self, backbone, pad_id: int) -> QuestionAnswering:
        return QuestionAnswering(backbone, pad_id)

    def inference_methods(self, ctx) -> list:
        return [AnswerMethod(self, ctx)]

    def answers(self, module: QuestionAnswering, examples: Sequence[SquadExample],
                features: Sequence[dict], batch_size: int = 64, device: str = "cpu"):
        logits = module.predict(features, batch_size, device)
        return decode_answers([ex.context for ex in examples], features, logits, self.n_best,
                              self.max_answer_length)

    def score(self, module: QuestionAnswering, examples: Sequence[SquadExample],
              features: Sequence[dict], batch_size: int = 64, device: str = "cpu") -> dict[str, float]:
        answers = self.answers(module, examples, features, batch_size, device)
        gold = {ex.qid: ex.answer_texts for ex in examples}
        preds = {ex.qid: a.text for ex, a in zip(examples, answers)}
        if not self.with_no_answer:
            return squad_evaluate(gold, preds)
        na = {ex.qid: a.null_minus_best for ex, a in zip(examples, answers)}
        return squad_evaluate(gold, preds, na, self.null_threshold)

    # -- settings tuned on dev (RUN/tuned.json), used by `ember evaluate` / `ember predict`
    def tune(self, module: QuestionAnswering, examples: Sequence[SquadExample], features: Sequence[dict],
             batch_size: int = 64, device: str = "cpu") -> tuple[dict, dict[str, float], dict[str, float]]:
        """(settings, metrics at the tuned settings, metrics at the current ones), one model pass.

        SQuAD 2.0 (BERT §4.3): the no-answer threshold that maximises F1 on these questions
        (tuned_f1_thresh: the official best_f1_thresh made tie-aware). SQuAD 1.1 has nothing to tune.
        """
        answers = self.answers(module, examples, features, batch_size, device)
        gold = {ex.qid: ex.answer_texts for ex in examples}
        preds = {ex.qid: a.text for ex, a in zip(examples, answers)}
        if not self.with_no_answer:
            metrics = squad_evaluate(gold, preds)
            return {}, metrics, metrics
        na = {ex.qid: a.null_minus_best for ex, a in zip(examples, answers)}
        current = squad_evaluate(gold, preds, na, self.null_threshold)
        settings = {"null_threshold": current["tuned_f1_thresh"]}
        return settings, squad_evaluate(gold, preds, na, settings["null_threshold"]), current

    def apply_tuned(self, settings: dict) -> None:
        if "null_threshold" in settings:
            self.null_threshold = float(settings["null_threshold"])

    def read_inputs(self, path) -> list[SquadExample]:
        """The questions of a SQuAD JSON file for `ember predict` (answers optional)."""
        return read_squad(path, labelled=False)

    # -- `ember predict`: a SQuAD JSON file in (answers optional), one answer per question out.
    def predict_file(self, module: QuestionAnswering, tokenizer, max_length: int, path, batch_size: int = 64,
                     device: str = "cpu", top_k: int = 5) -> tuple[list[dict], int]:
        """Rows {id, prediction, best_span, no_answer_score, nbest}; contexts are never cut (0)."""
        examples = self.read_inputs(path)
        features = featurize_squad(examples, tokenizer, max_length, self.doc_stride, self.max_query_length)
        rows = []
        for ex, answer in zip(examples, self.answers(module, examples, features, batch_size, device)):
            na = answer.null_minus_best
            null = self.with_no_answer and na > self.null_threshold
            rows.append({"id": ex.qid, "prediction": "" if null else answer.text, "best_span": answer.text,
                         "no_answer_score": round(na, 6) if self.with_no_answer else None,
                         "nbest": [{"text": t, "score": round(v, 6)} for t, v in answer.nbest[:top_k]]})
        return rows, 0

    def rows_to_tsv(self, rows: list[dict]) -> str:
        """id, prediction ("" = no answer) and the no-answer score (null - best span)."""
        lines = ["id\tprediction\tno_answer_score"]
        for r in rows:
            text = r["prediction"].replace("\t", " ").replace("\n", " ")
            lines.append(f"{r['id']}\t{text}\t{'' if r['no_answer_score'] is None else r['no_answer_score']}")
        return "\n".join(lines) + "\n"


class AnswerMethod:
    """``answer``: a question and its context -> the best span ("" = no answer for SQuAD 2.0 at the
    run's tuned threshold), its score, the no-answer score and the n-best spans. Contexts are
    read in overlapping windows (never cut); only overlong questions are truncated."""

    name = "answer"
    inputs = {"question": None, "context": None}  # one question and its context per request
    # The page at / (ember.serve.page) marks the answer in the context.
    form = {"title": "Answer", "view": "answer", "fields": [
        {"name": "question", "label": "Question", "type": "text", "default": "Where is the Eiffel Tower?"},
        {"name": "context", "label": "Context", "type": "textarea",
         "default": "The Eiffel Tower is a wrought-iron lattice tower in Paris, France. It was built "
                    "for the 1889 World's Fair and is named after the engineer Gustave Eiffel."},
        {"name": "top_k", "label": "Spans listed", "type": "number", "default": 3, "min": 1, "max": 20}]}
    request_schema = body_schema(
        "A question and its context -> the best answer span (\"\" = no answer, for SQuAD 2.0-style runs), "
        "its score, the no-answer score and the n-best spans.",
        {"question": {"type": "string", "description": "the question"},
         "context": {"type": "string", "description": "the text that holds the answer (read in overlapping windows)"},
         "top_k": {"type": "integer", "minimum": 1, "maximum": 20, "default": 3, "description": "n-best spans returned"}},
        {"question": "Where is the Eiffel Tower?", "context": "The Eiffel Tower is in Paris."},
        required=("question", "context"))

    def __init__(self, adapter: SquadAdapter, ctx) -> None:
        self.adapter, self.tokenizer, self.max_length = adapter, ctx.tokenizer, ctx.max_length

    def parse(self, data: dict, limits) -> dict:
        """{"question": str, "context": str, "top_k": int (n-best spans returned, default 3)}."""
        from ember.errors import RequestError
        from ember.tasks.inference.requests import check_fields, int_field, text_field

        check_fields(data, {"question", "context", "top_k"})
        for name in ("question", "context"):
            if name not in data:
                raise RequestError(422, f"'{name}' is required")
        return {"question": text_field(data["question"], "question", limits),
                "context": text_field(data["context"], "context", limits),
                "top_k": int_field(data, "top_k", 3, 1, 20)}

    def __call__(self, requests, forward) -> list[dict]:
        import numpy as np

        a = self.adapter
        examples = [SquadExample(str(i), "", r["question"], r["context"], (), False) for i, r in enumerate(requests)]
        features = featurize_squad(examples, self.tokenizer, self.max_length, a.doc_stride, a.max_query_length)
        outs = forward([(f["input_ids"], f["token_type_ids"]) for f in features], False)
        answers = decode_answers([ex.context for ex in examples], features,
                                 [(logits[0], logits[1]) for logits, _ in outs], a.n_best, a.max_answer_length)
        responses = []
        for req, ex, answer in zip(requests, examples, answers):
            question_tokens = len(self.tokenizer.encode(ex.question, add_special_tokens=False).ids)
            found = np.isfinite(answer.score)
            null = a.with_no_answer and answer.null_minus_best > a.null_threshold
            responses.append({
                "answer": "" if null else answer.text, "best_span": answer.text,
                "score": answer.score if found else None,
                "no_answer_score": answer.null_minus_best if a.with_no_answer and found else None,
                "nbest": [{"text": t, "score": v} for t, v in answer.nbest[: req["top_k"]]],
                "truncated": question_tokens > a.max_query_length,
            })
        return responses
