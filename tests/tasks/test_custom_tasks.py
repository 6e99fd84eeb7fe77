"""Custom tasks on a user's own files (`ember finetune --task classify|pair|regression|tag|qa`):
real data rewritten by the test into the layouts people have, then fine-tuned, evaluated,
predicted and served from the run folder alone; and the bad-input messages."""

from __future__ import annotations

import csv
import json

import pytest

import ember
from conftest import real_data
from ember.errors import EmberError
from ember.tasks.readers.glue import read_examples

TINY = ["model.hidden_size=64", "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=128",
        "model.max_position=128"]
QUICK = dict(max_length=64, lr=1e-3, batch_size=32, progress=False)


def write_csv(path, header, rows):
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def sst2_as_csv(folder, train_n=600):
    """SST-2 with other column names and string labels, as a spreadsheet export would have it."""
    names = {0: "neg", 1: "pos"}
    train = read_examples("sst2", "train", limit=train_n)
    dev = read_examples("sst2", "dev")
    write_csv(folder / "reviews-train.csv", ["id", "review", "sentiment"],
              [(f"r{i}", ex.text_a, names[ex.label]) for i, ex in enumerate(train)])
    write_csv(folder / "reviews-dev.csv", ["id", "review", "sentiment"],
              [(f"d{i}", ex.text_a, names[ex.label]) for i, ex in enumerate(dev)])
    return folder / "reviews-train.csv", folder / "reviews-dev.csv"


@pytest.fixture(scope="module")
def sst2_custom(wiki_prepared, tmp_path_factory):
    """A custom classify run on SST-2-as-CSV and the built-in sst2 run with the same settings."""
    real_data("glue", "SST-2")
    root = tmp_path_factory.mktemp("custom")
    train, dev = sst2_as_csv(root)
    tok = str(wiki_prepared / "tokenizer.json")
    common = dict(model="bert-tiny", tokenizer=tok, overrides=TINY, epochs=1, **QUICK)
    custom = ember.finetune("classify", root / "custom", train=train, dev=dev, column="review",
                            label_column="sentiment", **common)
    builtin = ember.finetune("sst2", root / "builtin", train_limit=600, **common)
    return root, custom, builtin


def test_custom_classify_on_sst2_csv_matches_the_builtin_task_exactly(sst2_custom):
    root, custom, builtin = sst2_custom
    # Same texts, same label ids (neg < pos, as 0 < 1), same seed: the same model and dev accuracy.
    assert custom.metrics["accuracy"] == builtin.metrics["accuracy"]
    assert set(custom.metrics) == {"accuracy", "f1_macro"}
    record = json.loads((root / "custom" / "task.json").read_text())
    assert record["kind"] == "classify" and record["labels"] == ["neg", "pos"]
    assert (record["text_column"], record["label_column"]) == ("review", "sentiment")
    assert json.loads((root / "custom" / "labels.json").read_text()) == ["neg", "pos"]
    assert not (root / "builtin" / "task.json").exists()  # built-in tasks need no record


def test_custom_classify_from_a_dataframe_matches_the_csv_run(sst2_custom, wiki_prepared, tmp_path):
    """The same SST-2 rows as pandas DataFrames (ember.finetune from a notebook): written to
    RUN/inputs/*.jsonl, the same labels and the same dev accuracy as the CSV files."""
    pd = pytest.importorskip("pandas")
    root, custom, _ = sst2_custom
    train = pd.read_csv(root / "reviews-train.csv")
    dev = pd.read_csv(root / "reviews-dev.csv")
    run = ember.finetune("classify", tmp_path / "frame", model="bert-tiny", tokenizer=str(wiki_prepared / "tokenizer.json"),
                         overrides=TINY, epochs=1, train=train, dev=dev, column="review", label_column="sentiment",
                         **QUICK)
    assert run.metrics["accuracy"] == custom.metrics["accuracy"]
    assert json.loads((tmp_path / "frame" / "task.json").read_text())["labels"] == ["neg", "pos"]
    assert (tmp_path / "frame" / "inputs" / "train.jsonl").is_file()
    assert ember.evaluate(tmp_path / "frame")["metrics"]["accuracy"] == pytest.approx(custom.metrics["accuracy"])
    # rows from Python beside a file: both read under the same column names
    mixed = ember.finetune("classify", tmp_path / "mixed", model="bert-tiny", tokenizer=str(wiki_prepared / "tokenizer.json"),
                           overrides=TINY, epochs=1, train=train, dev=root / "reviews-dev.csv", column="review",
                           label_column="sentiment", **QUICK)
    assert mixed.metrics["accuracy"] == custom.metrics["accuracy"]


def test_custom_classify_run_evaluates_predicts_and_serves_from_its_folder(sst2_custom, tmp_path, capsys):
    from ember.serve.predictor import load_predictor
    from ember.serve.requests import Limits

    root, custom, _ = sst2_custom
    run = root / "custom"
    assert ember.evaluate(run)["metrics"]["accuracy"] == pytest.approx(custom.metrics["accuracy"])
    # a predict file without the label column, in JSONL with the run's text column
    source = tmp_path / "new.jsonl"
    source.write_text('{"id": "a", "review": "a gripping , beautifully acted film"}\n'
                      '{"id": "b", "review": "a dull , lifeless mess"}\n')
    from ember.cli import main

    capsys.readouterr()
    assert main(["predict", str(run), "--input", str(source), "--out", str(tmp_path / "p.jsonl")]) == 0
    assert "predicting new.jsonl" in capsys.readouterr().err  # the progress bar, on stderr
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["a", "b"]
    # decoding settings are a T5 run's: refused here before anything is written
    assert main(["predict", str(run), "--input", str(source), "--out", str(tmp_path / "q.jsonl"), "--num-beams", "4"]) == 1
    assert "--num-beams: only a text-to-text (T5) run decodes" in capsys.readouterr().err
    assert not (tmp_path / "q.jsonl").exists()
    assert main(["evaluate", str(run), "--no-progress"]) == 0
    printed = capsys.readouterr()
    # stdout is the JSON alone (notes such as truncation go to stderr): `ember evaluate RUN | jq` works
    assert "evaluating" not in printed.err and "truncated 66 of 872" in printed.err
    # the note names the setting, not one verb's flag (the quickstart and the Python API have no --max-length)
    assert "a larger task.max_length keeps more" in printed.err
    assert json.loads(printed.out)["metrics"]["accuracy"] == pytest.approx(custom.metrics["accuracy"])
    assert all(r["prediction"] in ("neg", "pos") and set(r["probabilities"]) == {"neg", "pos"} for r in rows)
    # the same predictions as CSV, a spreadsheet's format
    assert main(["predict", str(run), "--input", str(source), "--out", str(tmp_path / "p.csv"), "--no-progress"]) == 0
    with open(tmp_path / "p.csv", newline="", encoding="utf-8") as fh:
        table = list(csv.DictReader(fh))
    assert [(t["id"], t["prediction"], float(t["p_pos"])) for t in table] == \
        [(r["id"], r["prediction"], r["probabilities"]["pos"]) for r in rows]
    assert main(["predict", str(run), "--input", str(source), "--out", str(tmp_path)]) == 1
    assert "is a folder; name the predictions file" in capsys.readouterr().err
    assert main(["predict", str(run), "--input", str(source), "--out", str(tmp_path / "p.json")]) == 1
    assert "name the file .jsonl" in capsys.readouterr().err and not (tmp_path / "p.json").exists()
    (tmp_path / "header.csv").write_text("id,review,sentiment\n")  # nothing under the header: one line, not a ValueError
    assert main(["evaluate", str(run), "--file", str(tmp_path / "header.csv")]) == 1
    assert "header.csv: no rows" in capsys.readouterr().err
    assert ember.predict(run, source) == rows  # the verb's rows, from Python
    predictor = load_predictor(run, "")
    served = predictor.run("classify", [predictor.parse("classify", {"texts": ["a gripping , beautifully acted film",
                                                                             "a dull , lifeless mess"]}, Limits())])
    labels = [r["label"] for r in served[0]["results"]]
    assert labels == [r["prediction"] for r in rows]  # serving and `ember predict` agree


def test_custom_classify_export_and_distill_use_the_task_record(sst2_custom, tmp_path):
    from ember.serve.export import export_run

    root, _, _ = sst2_custom
    run = root / "custom"
    export_run(run, "int8", tmp_path / "int8", limit=64)
    assert json.loads((tmp_path / "int8" / "task.json").read_text())["kind"] == "classify"
    student = ember.distill("kd", run, tmp_path / "student", student="teacher", unlabeled=["task"], epochs=1,
                            progress=False)
    assert json.loads((tmp_path / "student" / "task.json").read_text())["labels"] == ["neg", "pos"]
    assert "accuracy" in ember.evaluate(tmp_path / "student")["metrics"]
    assert student.metrics["accuracy"] > 0


def test_custom_classify_seeds_write_a_summary(wiki_prepared, tmp_path):
    real_data("glue", "SST-2")
    train, dev = sst2_as_csv(tmp_path, train_n=200)
    result = ember.finetune("classify", tmp_path / "seeds", model="bert-tiny", tokenizer=str(wiki_prepared / "tokenizer.json"),
                            overrides=TINY, epochs=1, seeds=[1, 2], train=train, dev=dev,
                            column="review", label_column="sentiment", **QUICK)
    summary = json.loads((tmp_path / "seeds" / "summary.json").read_text())
    assert summary["task"] == "classify (reviews-train.csv)" and summary["seeds"] == [1, 2]
    assert len(summary["metrics"]["accuracy"]["values"]) == 2
    for seed in (1, 2):
        assert (tmp_path / "seeds" / f"seed-{seed}" / "task.json").is_file()
    assert result.summary["accuracy"]["mean"] == pytest.approx(sum(summary["metrics"]["accuracy"]["values"]) / 2)
    # one seed into that folder trained a new run beside seed-1/ and seed-2/: refused, naming seed-1's folder
    with pytest.raises(EmberError, match=r"holds the runs of several seeds \(seed-1, seed-2\).*seeds/seed-1\)"):
        ember.finetune("classify", tmp_path / "seeds", model="bert-tiny", tokenizer=str(wiki_prepared / "tokenizer.json"),
                       overrides=TINY, epochs=1, seeds=[1], train=train, dev=dev, column="review",
                       label_column="sentiment", resume=True, **QUICK)
    assert not (tmp_path / "seeds" / "config.yaml").exists()


def test_custom_pair_and_regression_find_the_usual_columns(wiki_prepared, tmp_path):
    """STS-B rewritten as JSONL with sentence1/sentence2/score: regression finds the pair itself."""
    from ember.tasks.custom import custom_task

    real_data("glue", "STS-B")
    for split, n in (("train", 200), ("dev", 100)):
        rows = read_examples("stsb", split, limit=n)
        (tmp_path / f"{split}.jsonl").write_text("".join(
            json.dumps({"sentence1": ex.text_a, "sentence2": ex.text_b, "score": ex.label}) + "\n" for ex in rows))
    adapter = custom_task("regression", tmp_path / "train.jsonl", tmp_path / "dev.jsonl")
    assert (adapter.spec.text_a, adapter.spec.text_b, adapter.spec.label_column) == ("sentence1", "sentence2", "score")
    examples = adapter.read("dev")
    assert [ex.label for ex in examples] == [ex.label for ex in read_examples("stsb", "dev", limit=100)]
    result = ember.finetune("regression", tmp_path / "run", model="bert-tiny", tokenizer=str(wiki_prepared / "tokenizer.json"),
                            overrides=TINY, epochs=1, train=tmp_path / "train.jsonl",
                            dev=tmp_path / "dev.jsonl", **QUICK)
    assert set(result.metrics) == {"pearson", "spearman"}
    # pair classification: RTE as TSV with premise/hypothesis columns
    real_data("glue", "RTE")
    for split in ("train", "dev"):
        rows = read_examples("rte", split, limit=50)
        write_tsv = [("premise", "hypothesis", "label")] + [(ex.text_a, ex.text_b, ["yes", "no"][ex.label]) for ex in rows]
        with open(tmp_path / f"{split}.tsv", "w", newline="", encoding="utf-8") as fh:
            csv.writer(fh, delimiter="\t").writerows(write_tsv)
    pair = custom_task("pair", tmp_path / "train.tsv", tmp_path / "dev.tsv")
    assert (pair.spec.text_a, pair.spec.text_b) == ("premise", "hypothesis") and pair.label_names() == ["no", "yes"]


def conll_subset(source, target, keep=("PER", "LOC"), limit=None):
    """CoNLL-2003 with only some entity types (others -> O), as `word POS tag` (three columns)."""
    lines, sentences = [], 0
    for line in source.read_text(encoding="utf-8").splitlines():
        fields = line.split()
        if not fields:
            if lines and lines[-1]:
                lines.append("")
                sentences += 1
                if limit and sentences >= limit:
                    break
            continue
        if fields[0] == "-DOCSTART-":
            continue
        tag = fields[3] if fields[3][2:] in keep else "O"
        lines.append(f"{fields[0]} {fields[1]} {tag}")
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return target


def test_custom_tag_learns_a_subset_of_conll_tags(wiki_prepared, tmp_path):
    from ember.serve.predictor import load_predictor
    from ember.serve.requests import Limits

    folder = real_data("conll2003")
    train = conll_subset(folder / "train.txt", tmp_path / "train.conll", limit=2000)
    dev = conll_subset(folder / "dev.txt", tmp_path / "dev.conll", limit=200)
    result = ember.finetune("tag", tmp_path / "run", model="bert-tiny", tokenizer=str(wiki_prepared / "tokenizer.json"),
                            overrides=TINY, epochs=3, train=train, dev=dev, **{**QUICK, "lr": 3e-3})
    run = tmp_path / "run"
    labels = json.loads((run / "labels.json").read_text())
    assert labels == ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
    assert {"accuracy", "precision", "recall", "f1"} <= set(result.metrics)
    # word accuracy beats tagging everything O, so the head learned something about entities
    gold = [t for line in dev.read_text().splitlines() if line for t in [line.split()[-1]]]
    assert result.metrics["accuracy"] > sum(t == "O" for t in gold) / len(gold)
    assert result.metrics["f1"] > 0.1  # entity-level, over PER and LOC only
    assert ember.evaluate(run)["metrics"] == pytest.approx(result.metrics)
    predictor = load_predictor(run, "")
    tagged = predictor.run("tag", [predictor.parse("tag", {"text": "John Smith lives in Paris ."}, Limits())])
    assert set(tagged[0]["results"][0]["tags"]) <= set(labels)


def test_custom_tag_with_a_tag_set_that_is_not_iob_scores_word_accuracy(tmp_path):
    from ember.tasks.readers.conll import read_conll
    from ember.tasks.custom import custom_task

    folder = real_data("conll2003")
    for split, n in (("train", 30), ("dev", 10)):  # part-of-speech tags (the second column) as the labels
        rows = [json.dumps({"tokens": list(s.words), "pos": list(s.pos)})
                for s in read_conll(folder / f"{split}.txt", limit=n)]
        (tmp_path / f"{split}.jsonl").write_text("\n".join(rows) + "\n")
    adapter = custom_task("tag", tmp_path / "train.jsonl", tmp_path / "dev.jsonl", label_column="pos")
    assert adapter.main_metric == "accuracy" and not adapter.bio and "NNP" in adapter.labels


def squad_slice(source, target, articles, per_article):
    data = json.loads(source.read_text(encoding="utf-8"))
    out = []
    for article in [data["data"][i] for i in articles]:
        paragraphs, n = [], 0
        for para in article["paragraphs"]:
            if n >= per_article:
                break
            paragraphs.append(para)
            n += len(para["qas"])
        out.append({"title": article["title"], "paragraphs": paragraphs})
    target.write_text(json.dumps({"version": "v2.0", "data": out}))
    return target


def test_custom_qa_on_a_squad_slice_tunes_its_threshold(wiki_prepared, tmp_path):
    source = real_data("squad2-dev-half", "dev-v2.0.json")
    train = squad_slice(source, tmp_path / "train.json", [0, 1], 40)
    dev = squad_slice(source, tmp_path / "dev.json", [2], 30)
    result = ember.finetune("qa", tmp_path / "run", model="bert-tiny", tokenizer=str(wiki_prepared / "tokenizer.json"),
                            overrides=TINY, epochs=1, train=train, dev=dev,
                            **{**QUICK, "max_length": 128})
    assert json.loads((tmp_path / "run" / "task.json").read_text())["with_no_answer"] is True
    assert (tmp_path / "run" / "tuned.json").is_file()
    assert {"exact", "f1", "HasAns_f1", "NoAns_f1", "best_f1", "tuned_f1"} <= set(result.metrics)
    again = ember.evaluate(tmp_path / "run")
    assert again["metrics"]["f1"] == pytest.approx(result.metrics["f1"])


# -- bad input: one clear message each, nothing written ------------------------------------------


def _refused(tmp_path, kind, match, **files):
    out = tmp_path / "never"
    with pytest.raises(EmberError, match=match):
        ember.finetune(kind, out, model="bert-tiny", tokenizer="unused.json", **files)
    assert not out.exists()


def test_custom_regression_reads_glue_style_tsv_whose_quotes_are_text(tmp_path):
    """Rows copied from the real STS-B dev.tsv (lines 690-760, some sentences opening with an
    unmatched quote) were refused as "bad CSV quoting"; a TSV whose lines all split into the
    header's fields is read as the GLUE readers read it, quotes kept."""
    from ember.tasks.custom import custom_task

    source = real_data("glue", "STS-B", "dev.tsv").read_text(encoding="utf-8").splitlines()
    (tmp_path / "sts.tsv").write_text("\n".join([source[0]] + source[689:760]) + "\n", encoding="utf-8")
    (tmp_path / "train.tsv").write_text("\n".join(source[:40]) + "\n", encoding="utf-8")
    adapter = custom_task("regression", tmp_path / "train.tsv", tmp_path / "sts.tsv")
    got = adapter.read("dev")
    want = read_examples("stsb", "dev")[688:759]
    assert [(e.text_a, e.text_b, e.label) for e in got] == [(e.text_a, e.text_b, e.label) for e in want]
    assert sum(e.text_b.startswith('"') or e.text_a.startswith('"') for e in got) >= 3
    # a TSV that quotes the way pandas writes it still reads as quoted (a tab inside a quoted text)
    (tmp_path / "quoted.tsv").write_text('text\tlabel\n"a\tb ""c"""\t1.5\nplain\t2\n')
    (tmp_path / "train2.tsv").write_text("text\tlabel\nfine\t1\nok\t2\n")
    rows = custom_task("regression", tmp_path / "train2.tsv", tmp_path / "quoted.tsv").read("dev")
    assert [(e.text_a, e.label) for e in rows] == [('a\tb "c"', 1.5), ("plain", 2.0)]


def test_custom_task_refuses_a_missing_column_and_lists_the_columns(tmp_path, capsys):
    train = write_csv(tmp_path / "t.csv", ["body", "queue"], [("printer on fire", "it"), ("refund", "billing")])
    dev = write_csv(tmp_path / "d.csv", ["body", "queue"], [("x", "it")])
    _refused(tmp_path, "classify", r"no column 'text_body'.*its columns are: body, queue",
             train=train, dev=dev, column="text_body", label_column="queue")
    _refused(tmp_path, "classify", r"no text column among the usual names.*its columns are: body, queue.*--text-column",
             train=train, dev=dev, label_column="queue")
    # the command line says the same, without a traceback
    from ember.cli import main

    assert main(["finetune", "--task", "classify", "--train", str(train), "--dev", str(dev), "--text-column",
                 "text_body", "--out", str(tmp_path / "cli"), "--model", "bert-tiny", "--tokenizer", "x.json"]) == 1
    assert "its columns are: body, queue" in capsys.readouterr().err and not (tmp_path / "cli").exists()


def test_custom_task_refuses_an_empty_label_cell_with_file_and_line(tmp_path):
    train = tmp_path / "t.csv"
    train.write_text('text,label\n"a fine, fine film",pos\n"multi\nline text",neg\nno label here,\n')
    dev = write_csv(tmp_path / "d.csv", ["text", "label"], [("x", "pos")])
    _refused(tmp_path, "classify", rf"{train}:5: empty 'label' cell", train=train, dev=dev)


def test_custom_task_refuses_an_unseen_dev_label(tmp_path):
    train = write_csv(tmp_path / "t.csv", ["text", "label"], [("a", "pos"), ("b", "neg")])
    dev = write_csv(tmp_path / "d.csv", ["text", "label"], [("a", "pos"), ("c", "neutral")])
    _refused(tmp_path, "classify", rf"{dev}:3: label 'neutral' does not occur in the training file.*neg, pos",
             train=train, dev=dev)


def test_custom_regression_refuses_a_target_that_is_not_a_number(tmp_path):
    train = write_csv(tmp_path / "t.csv", ["text", "score"], [("a", "1.5"), ("b", "high")])
    dev = write_csv(tmp_path / "d.csv", ["text", "score"], [("a", "2")])
    _refused(tmp_path, "regression", rf"{train}:3: the 'score' cell 'high' is not a number",
             train=train, dev=dev)


def test_custom_task_refuses_a_jsonl_line_that_is_not_an_object(tmp_path):
    train = tmp_path / "t.jsonl"
    train.write_text('{"text": "a", "label": 1}\n["b", 0]\n')
    dev = tmp_path / "d.jsonl"
    dev.write_text('{"text": "a", "label": 1}\n')
    _refused(tmp_path, "classify", rf"{train}:2: expected a JSON object.*got a JSON list",
             train=train, dev=dev)


def test_custom_tag_refuses_more_tags_than_words(tmp_path):
    train = tmp_path / "t.jsonl"
    train.write_text('{"tokens": ["EU", "rejects"], "tags": ["B-ORG", "O"]}\n'
                     '{"tokens": ["Peter", "Blackburn"], "tags": ["B-PER", "I-PER", "O"]}\n')
    dev = tmp_path / "d.jsonl"
    dev.write_text('{"tokens": ["EU"], "tags": ["B-ORG"]}\n')
    _refused(tmp_path, "tag", rf"{train}:2: 3 tags for 2 words", train=train, dev=dev)


def test_builtin_task_takes_train_files_but_refuses_test_and_missing_files(tmp_path):
    """A built-in task reads train=/dev= files in its own layout (as --train-split); test= is for
    custom tasks; a missing file is named before anything is written."""
    with pytest.raises(EmberError, match="test= is for your own data"):
        ember.finetune("sst2", tmp_path / "x", test="a.csv")
    with pytest.raises(EmberError, match=r"train=.*a\.tsv: no such file"):
        ember.finetune("sst2", tmp_path / "x", train=tmp_path / "a.tsv")
    assert not (tmp_path / "x").exists()
    with pytest.raises(EmberError, match="--task classify fine-tunes on your own files"):
        from ember.tasks.base import get_adapter

        get_adapter("classify")


# -- Hugging Face datasets as input (local only) ---------------------------------------------------


def test_custom_classify_reads_saved_datasets_folders_and_json_arrays(wiki_prepared, tmp_path):
    """SST-2 as a `datasets` Dataset with a ClassLabel column, saved with save_to_disk (train)
    and written with to_json(lines=False) (dev): the same examples as the CSV files."""
    datasets = pytest.importorskip("datasets")
    from ember.tasks.custom import custom_task

    real_data("glue", "SST-2")
    features = datasets.Features({"sentence": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["neg", "pos"])})
    splits = {}
    for split, n in (("train", 300), ("dev", 100)):
        rows = read_examples("sst2", split, limit=n)
        splits[split] = datasets.Dataset.from_dict({"sentence": [ex.text_a for ex in rows],
                                                    "label": [ex.label for ex in rows]}, features=features)
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "sst2-ds"))
    splits["dev"].to_json(str(tmp_path / "dev.json"), lines=False)  # ClassLabel ids, as load_dataset writes
    with pytest.raises(EmberError, match="DatasetDict with the splits train, dev; pass one split's folder"):
        custom_task("classify", tmp_path / "sst2-ds", tmp_path / "dev.json")
    adapter = custom_task("classify", tmp_path / "sst2-ds" / "train", tmp_path / "sst2-ds" / "dev")
    assert adapter.label_names() == ["neg", "pos"]  # the ClassLabel names, not 0/1
    assert [(ex.text_a, ex.label) for ex in adapter.read("dev")] == [
        (ex.text_a, ex.label) for ex in read_examples("sst2", "dev", limit=100)]
    # a JSON array file holds the ClassLabel ids, which the training folder's names do not include
    with pytest.raises(EmberError, match=r"dev.json\[0\]: label '1' does not occur in the training file.*neg, pos"):
        custom_task("classify", tmp_path / "sst2-ds" / "train", tmp_path / "dev.json")
    result = ember.finetune("classify", tmp_path / "run", model="bert-tiny", tokenizer=str(wiki_prepared / "tokenizer.json"),
                            overrides=TINY, epochs=1, train=tmp_path / "sst2-ds" / "train",
                            dev=tmp_path / "sst2-ds" / "dev", **QUICK)
    assert json.loads((tmp_path / "run" / "labels.json").read_text()) == ["neg", "pos"]
    assert "accuracy" in result.metrics


def test_custom_task_resumes_from_its_task_record_without_the_options(wiki_prepared, tmp_path):
    real_data("glue", "SST-2")
    train, dev = sst2_as_csv(tmp_path, train_n=100)
    common = dict(model="bert-tiny", tokenizer=str(wiki_prepared / "tokenizer.json"), overrides=TINY, epochs=1,
                  **QUICK)
    first = ember.finetune("classify", tmp_path / "run", train=train, dev=dev, column="review",
                           label_column="sentiment", **common)
    again = ember.finetune("classify", tmp_path / "run", resume=True, **common)  # files and columns from task.json
    assert again.metrics == first.metrics


# -- other families on your own data ------------------------------------------------------------


def test_custom_classify_fine_tunes_a_t5_text_to_text_and_rebuilds_from_its_folder(tmp_path):
    """A T5 run on SST-2-as-CSV: "classify sentence: ..." -> the file's own label words; the
    record is written through the text-to-text wrapper, so evaluate works from the folder alone.
    Regression, whose targets have no text form T5 defines, is refused before anything is written."""
    from t5_helpers import TINY_T5, glue_t5_tokenizer

    from ember.tasks.base import get_adapter
    from ember.tasks.text2text.templates import input_text

    real_data("glue", "SST-2")
    tok = glue_t5_tokenizer(tmp_path / "t5tok.json")
    train, dev = sst2_as_csv(tmp_path, train_n=64)
    run = ember.finetune("classify", tmp_path / "t5", model="t5-tiny", tokenizer=str(tok), overrides=TINY_T5,
                         epochs=1, train=train, dev=dev, column="review", label_column="sentiment",
                         train_limit=64, max_length=64, progress=False)
    record = json.loads((tmp_path / "t5" / "task.json").read_text())
    assert record["labels"] == ["neg", "pos"]
    again = ember.evaluate(tmp_path / "t5")["metrics"]
    assert again == pytest.approx(run.metrics) and set(again) >= {"accuracy", "invalid"}
    assert "combined" not in again  # GLUE's leaderboard mean is not a custom task's metric, on any head
    from ember.config import model_preset

    adapter = get_adapter(record, model_preset("t5-tiny"))
    example = adapter.inner.read("dev")[0]
    assert input_text(adapter.template, example).startswith("classify sentence: ")
    assert adapter.template.target_texts() == ["neg", "pos"]
    rows = [("a fine film", "4.5"), ("a dull mess", "1.0")]
    scores, dev_scores = (write_csv(tmp_path / f"{n}.csv", ["text", "score"], rows) for n in ("scores", "dev-scores"))
    with pytest.raises(EmberError, match="regression with a T5 model"):
        ember.finetune("regression", tmp_path / "reg", model="t5-tiny", tokenizer=str(tok), overrides=TINY_T5,
                       train=scores, dev=dev_scores, progress=False)
    assert not (tmp_path / "reg").exists()
