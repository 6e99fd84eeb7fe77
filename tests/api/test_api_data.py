"""`ember.finetune` / `ember.evaluate` on data from Python: real SST-2 and MRPC rows as DataFrames
(their own column names, labels as words), `datasets` objects and tuples, written into the run
as files in the task's layout; and the bad input of in-memory data."""

from __future__ import annotations

import pytest
import torch

from conftest import real_data

import ember
from ember.errors import EmberError


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def init(wiki_prepared):
    """A tiny random BERT (2 x 32) with the real-Wikipedia WordPiece, as an ember Init."""
    import dataclasses

    from ember.config import model_preset
    from ember.runs.init import Init

    cfg = dataclasses.replace(model_preset("bert-tiny"), vocab_size=2000, hidden_size=32, num_heads=2,
                              intermediate_size=64, max_position=64)
    return Init(cfg, None, wiki_prepared / "tokenizer.json")


def sst2_frame(split: str, n: int):
    """Real SST-2 rows as a user's table: other column names, labels as words."""
    pd = pytest.importorskip("pandas")
    from ember.tasks.readers.glue import read_examples

    real_data("glue", "SST-2")
    examples = read_examples("sst2", split, limit=n)
    return pd.DataFrame({"review": [ex.text_a for ex in examples],
                         "sentiment": ["positive" if ex.label else "negative" for ex in examples]})


def test_finetune_and_evaluate_from_dataframes_write_the_data_into_the_run(init, tmp_path):
    from ember.runs.folder import load_run_config

    train, dev = sst2_frame("train", 96), sst2_frame("dev", 48)
    out = tmp_path / "sst2"
    result = ember.finetune("sst2", out, init, train=train, dev=dev, column="review", label_column="sentiment",
                            lr=1e-3, epochs=1, max_length=48, progress=False)
    cfg = load_run_config(out)
    assert cfg.task.train_split == str((out / "inputs" / "train.tsv").resolve())
    assert result.result["train_examples"] == 96 and 0 <= result.metrics["accuracy"] <= 1
    # The run is a run like any other: evaluate re-reads its dev file, or takes the rows again.
    assert ember.evaluate(out)["metrics"] == pytest.approx(result.metrics)
    again = ember.evaluate(out, data=dev, column="review", label_column="sentiment")
    assert again["metrics"] == pytest.approx(result.metrics) and again["split"] == "data from Python (48 examples)"
    datasets = pytest.importorskip("datasets")
    from_dataset = ember.evaluate(out, data=datasets.Dataset.from_pandas(dev), column="review",
                                  label_column="sentiment")
    assert from_dataset["metrics"] == pytest.approx(result.metrics)
    tuples = list(zip(dev["review"], [int(s == "positive") for s in dev["sentiment"]]))
    assert ember.evaluate(out, data=tuples)["metrics"] == pytest.approx(result.metrics)
    # A resume must get the same rows; overwrite starts over with the new ones.
    with pytest.raises(EmberError, match="differs from the data the run was started with"):
        ember.finetune("sst2", out, init, train=train.iloc[:50], dev=dev, column="review",
                       label_column="sentiment", epochs=1, resume=True, progress=False)
    ember.finetune("sst2", out, init, train=train.iloc[:50], dev=dev, column="review", label_column="sentiment",
                   epochs=1, max_length=48, overwrite=True, progress=False)
    assert len((out / "inputs" / "train.tsv").read_text().splitlines()) == 51


def test_library_calls_leave_the_callers_random_state_and_thread_count(init, tmp_path):
    """In a notebook: fine-tuning seeded torch's global generator and set one thread for good, and
    loading a model drew its initial weights from the caller's generator. Each call now leaves
    both as it found them (real SST-2 rows)."""
    torch.set_num_threads(2)
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    out = tmp_path / "sst2"
    ember.finetune("sst2", out, init, train=sst2_frame("train", 32), dev=sst2_frame("dev", 16), column="review",
                   label_column="sentiment", epochs=1, max_length=32, num_threads=1, seed=7, progress=False)
    assert torch.get_num_threads() == 2
    model = ember.load(out, threads=1)
    assert torch.get_num_threads() == 2
    probabilities = model.classify(["a gripping film", "a dull mess"])
    assert torch.get_num_threads() == 2 and len(probabilities) == 2
    ember.evaluate(out)
    ember.embed(out, ["a gripping film"])
    assert torch.equal(torch.rand(4), expected)


def test_pair_task_rows_with_quotes_and_line_breaks_round_trip_through_the_task_reader(tmp_path):
    """MRPC (CSV-style quoting) and SST-2 (no quoting): what the reader reads is what was given,
    but for tabs / line breaks, which become spaces."""
    from ember.api.task_data import write_split
    from ember.tasks.readers.glue import get_task, read_examples

    real_data("glue", "MRPC")
    mrpc = read_examples("mrpc", "dev", limit=30)
    rows = [(ex.text_a, ex.text_b, ex.label) for ex in mrpc] + [('He said "no"\tand left.', 'A "quoted"\nline', 1)]
    path = write_split(get_task("mrpc"), rows, tmp_path / "mrpc.tsv", "rows")
    back = read_examples("mrpc", str(path))
    assert [(b.text_a, b.text_b, b.label) for b in back[:30]] == [(ex.text_a, ex.text_b, ex.label) for ex in mrpc]
    assert (back[-1].text_a, back[-1].text_b) == ('He said "no" and left.', 'A "quoted" line')
    sst = write_split(get_task("sst2"), {"sentence": ['"quoted" start', "plain"], "label": ["positive", 0]},
                      tmp_path / "sst2.tsv", "columns")
    assert [(b.text_a, b.label) for b in read_examples("sst2", str(sst))] == [('"quoted" start', 1), ("plain", 0)]


def test_bad_in_memory_data_gets_one_clear_message_each(init, tmp_path):
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"text": ["a fine film", "a dull one"], "stars": [5, 1]})
    cases = [
        (dict(train=frame), "no label column \\(looked for 'label'\\); its columns: text, stars"),
        (dict(train=frame, label_column="rating"), "has no label column 'rating'; its columns: text, stars"),
        (dict(train=frame, label_column="stars"), "row 0 has label 5, not a SST-2 label; valid: 0 or 'negative'"),
        (dict(train=[]), "train= data is empty: pass at least one row"),
        (dict(train=["a fine film"]), "row 0 is str; give \\(text, label\\) tuples"),
        (dict(train=frame, train_split="dev"), "train= and train_split= both give the train data"),
        (dict(column="text"), "name the columns of train= / dev= data; pass the data too"),
    ]
    for kwargs, message in cases:
        with pytest.raises(EmberError, match=message):
            ember.finetune("sst2", tmp_path / "bad", init, epochs=1, progress=False, **kwargs)
    with pytest.raises(EmberError, match="works for the sentence \\(pair\\) tasks"):
        ember.finetune("conll2003", tmp_path / "bad2", init, train=[("John", "B-PER")], progress=False)
    with pytest.raises(EmberError, match="row 0 has no second text; MRPC classifies sentence pairs"):
        ember.finetune("mrpc", tmp_path / "bad3", init, train=[("one sentence", None, 1)], progress=False)
    assert not (tmp_path / "bad" / "config.yaml").exists()


def test_a_step_budget_for_runs_counted_in_epochs_is_refused_not_replaced(init, tmp_path):
    """ember.finetune(overrides=["train.max_steps=3"]) ran 24 steps, distill("kd", max_steps=4) 6:
    the epochs set the steps. Both are refused before anything is written, naming the way out."""
    with pytest.raises(EmberError, match="fine-tuning lasts a number of epochs.*epochs=0.1"):
        ember.finetune("sst2", tmp_path / "ft", init, overrides=["train.max_steps=3"], progress=False)
    with pytest.raises(EmberError, match="task-level distillation \\(kd\\) lasts a number of epochs"):
        ember.distill("kd", tmp_path / "no-teacher-needed", tmp_path / "kd", max_steps=4, progress=False)
    assert not (tmp_path / "ft").exists() and not (tmp_path / "kd").exists()


def test_wrong_argument_types_are_one_line_each_and_one_override_may_be_a_string(init, tmp_path):
    """Path(123) was a TypeError from inside; overrides="train.max_steps=3" was read character by
    character ("override 't' must look like section.key=value")."""
    for call, message in [(lambda: ember.load(123), "path= takes a folder path \\(a str or pathlib.Path\\), not int"),
                          (lambda: ember.evaluate(5), "run= takes a folder path"),
                          (lambda: ember.finetune("sst2", None, init), "out= takes a folder path"),
                          (lambda: ember.finetune("sst2", tmp_path / "x", init, overrides=[3]),
                           "overrides= takes a list of strings; it holds int 3")]:
        with pytest.raises(EmberError, match=message):
            call()
    with pytest.raises(EmberError, match="fine-tuning lasts a number of epochs"):  # the one override, read whole
        ember.finetune("sst2", tmp_path / "x", init, overrides="train.max_steps=3", progress=False)


def test_a_saved_datasets_folder_is_read_and_without_the_package_says_what_to_install(init, tmp_path, monkeypatch):
    """A folder from Dataset.save_to_disk as fine-tuning data (real SST-2 rows); without the
    optional `datasets` package the same call names it."""
    import sys

    datasets = pytest.importorskip("datasets")
    frame = sst2_frame("train", 64)
    datasets.Dataset.from_pandas(frame).save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": datasets.Dataset.from_pandas(frame)}).save_to_disk(str(tmp_path / "dict"))
    result = ember.finetune("sst2", tmp_path / "run", init, train=tmp_path / "saved", column="review",
                            label_column="sentiment", epochs=1, max_length=48, progress=False,
                            eval_split=str(real_data("glue", "SST-2", "dev.tsv")))
    assert result.result["train_examples"] == 64
    with pytest.raises(EmberError, match="holds a DatasetDict with splits \\['train'\\]; pass one split"):
        ember.finetune("sst2", tmp_path / "run2", init, train=tmp_path / "dict", progress=False)
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if it were not installed
    with pytest.raises(EmberError, match="needs the optional package `datasets` \\(pip install datasets\\)"):
        ember.finetune("sst2", tmp_path / "run3", init, train=tmp_path / "saved", progress=False)
