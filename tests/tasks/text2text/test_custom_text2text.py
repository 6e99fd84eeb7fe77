"""Your own text-to-text files (`ember finetune --task text2text --train F --dev F`, a T5 run):
real sentences written by the test into input/target files, read, encoded, fine-tuned into a
tiny T5 from random init, evaluated, predicted and served from the run folder alone; and the
refusals (an encoder run, missing or empty columns)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from conftest import real_data
from t5_helpers import TINY_T5, one_thread, t5_glue_tokenizer  # noqa: F401

import ember
from ember.config import model_preset
from ember.errors import EmberError
from ember.tasks.base import get_adapter
from ember.tasks.custom import custom_task

pytestmark = pytest.mark.usefixtures("one_thread")


def first_words(text: str, n: int = 2) -> str:
    return " ".join(text.split()[:n])


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def sst2_sentences(split: str, limit: int | None = None) -> list[str]:
    from ember.tasks.readers.glue import read_examples

    real_data("glue", "SST-2", "dev.tsv")
    return [ex.text_a for ex in read_examples("sst2", split, limit=limit)]


@pytest.fixture(scope="module")
def lead_files(tmp_path_factory):
    """A free-text task on real SST-2 phrases: given a phrase's first four words, write its first
    two (a copy that needs the decoder to align with the input)."""
    root = tmp_path_factory.mktemp("text2text")

    def rows(split: str, limit: int | None, prefix: str) -> list[dict]:
        phrases = [s for s in sst2_sentences(split, limit) if len(s.split()) >= 4]
        return [{"id": f"{prefix}{i}", "source": first_words(s, 4), "target": first_words(s)}
                for i, s in enumerate(phrases)]

    train = write_jsonl(root / "train.jsonl", rows("train", 3000, "t"))
    dev = write_jsonl(root / "dev.jsonl", rows("dev", None, "d")[:300])
    return root, train, dev


def test_text2text_task_reads_input_and_target_columns_and_encodes_them_for_t5(lead_files, t5_glue_tokenizer):
    from ember.tokenizers import load_tokenizer

    _, train, dev = lead_files
    adapter = get_adapter(custom_task("text2text", train, dev), model_preset("t5-tiny"))
    record = adapter.inner.record()
    assert (record["kind"], record["text_column"], record["label_column"]) == ("text2text", "source", "target")
    tok = load_tokenizer(t5_glue_tokenizer)
    examples, features = adapter.load("dev", tok, 128, limit=3)
    first = first_words(sst2_sentences("dev", 1)[0], 4)
    assert examples[0].source == first and examples[0].target == first_words(first)
    eos = tok.token_to_id("</s>")
    # the input as written (no prefix) then </s>; the target's ids then </s>
    assert features[0]["input_ids"] == tok.encode(first, add_special_tokens=False).ids + [eos]
    assert features[0]["labels"] == tok.encode(first_words(first), add_special_tokens=False).ids + [eos]
    assert adapter.main_metric == "f1" and adapter.label_names() is None
    longest = max(len(f["labels"]) for f in features)
    assert adapter.encoder(tok, 128).budget(64) == min(max(2 * longest, 32), 64)  # twice the longest target seen
    assert adapter.inner.record()["longest_target"] == longest  # kept for predict (RUN/task.json)


def test_text2text_says_which_targets_the_tokenizer_cannot_spell(lead_files, t5_glue_tokenizer, tmp_path, capsys):
    """A target the tokenizer maps to <unk> (Japanese for an English vocabulary) or rewrites ("½" ->
    "1⁄2" under NFKC) can never be matched exactly; fine-tuning said nothing. The real SST-2 phrases
    are all spelled, so they get no note."""
    from ember.tokenizers import load_tokenizer

    _, train, dev = lead_files
    tok = load_tokenizer(t5_glue_tokenizer)
    get_adapter(custom_task("text2text", train, dev), model_preset("t5-tiny")).load("dev", tok, 128, limit=20)
    assert "cannot spell" not in capsys.readouterr().err
    odd = write_jsonl(tmp_path / "odd.jsonl", [{"source": "a fine film", "target": "a fine film"},
                                               {"source": "japan", "target": "日本"},
                                               {"source": "a half", "target": "½ cup"}])
    get_adapter(custom_task("text2text", train, odd), model_preset("t5-tiny")).load("dev", tok, 128)
    err = capsys.readouterr().err
    assert "cannot spell 2 of 3 targets as written (e.g. '日本' comes back as" in err


def test_text2text_columns_are_found_or_named_and_bad_files_are_refused(tmp_path):
    rows = [{"question": "where is the cat ?", "answer": "on the mat"}, {"question": "who ?", "answer": "me"}]
    train, dev = write_jsonl(tmp_path / "a.jsonl", rows), write_jsonl(tmp_path / "b.jsonl", rows[::-1])
    assert custom_task("text2text", train, dev).record()["text_column"] == "question"
    named = write_jsonl(tmp_path / "c.jsonl", [{"body": "x y", "reply": "y"}] * 2)
    other = write_jsonl(tmp_path / "d.jsonl", [{"body": "x y", "reply": "x"}] * 2)
    assert custom_task("text2text", named, other, text_column="body", label_column="reply").record()["label_column"] \
        == "reply"
    with pytest.raises(EmberError, match="no input text column.*its columns are: body, reply.*--text-column"):
        custom_task("text2text", named, other)
    with pytest.raises(EmberError, match="no target text column.*its columns are: body, reply.*--label-column"):
        custom_task("text2text", named, other, text_column="body")
    empty = write_jsonl(tmp_path / "e.jsonl", [{"input": "a b", "target": "a"}, {"input": "c d", "target": " "}])
    with pytest.raises(EmberError, match=r"e\.jsonl:2: the 'target' cell is empty"):
        custom_task("text2text", empty, train, text_column="input", label_column="target")
    with pytest.raises(EmberError, match="join two texts into the input"):
        custom_task("text2text", train, dev, text_pair_column="answer")
    with pytest.raises(EmberError, match="the same column"):
        custom_task("text2text", train, dev, text_column="answer", label_column="answer")


def test_text2text_needs_an_encoder_decoder_run(lead_files):
    _, train, dev = lead_files
    for family in ("bert-mini", "gpt2-mini", "xlnet-mini"):
        with pytest.raises(EmberError, match="takes an encoder-decoder.*Start from a T5 run"):
            get_adapter(custom_task("text2text", train, dev), model_preset(family))


@pytest.fixture(scope="module")
def lead_run(lead_files, t5_glue_tokenizer):
    """A tiny T5 from random init, 10 epochs on the 2,196 training phrases of 4+ words (690 steps,
    T5's Adafactor at lr 0.02: a from-scratch model needs more than T5's fine-tuning 1e-3)."""
    root, train, dev = lead_files
    result = ember.finetune("text2text", root / "run", train=train, dev=dev, init="random", model="t5-tiny",
                            tokenizer=str(t5_glue_tokenizer), epochs=10, lr=0.02, max_length=24, progress=False,
                            overrides=TINY_T5)
    return root / "run", result


def test_text2text_fine_tuning_learns_to_write_the_target_of_real_phrases(lead_run):
    run, result = lead_run
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r["loss"] for r in records if r["split"] == "train"]
    assert np.mean(train[-3:]) < 0.3 * train[0]
    m = result.metrics
    assert set(m) == {"exact_match", "f1", "bleu", "rouge1", "rouge2", "rougeL", "rougeLsum", "invalid"} and m["invalid"] == 0.0
    # 300 real dev phrases the model never saw (a random init writes none of them: EM 0)
    assert m["exact_match"] > 40 and m["f1"] > 55 and m["f1"] >= m["exact_match"]
    saved = json.loads((run / "results.json").read_text())
    assert saved["metrics"]["f1"] == pytest.approx(m["f1"])
    assert json.loads((run / "task.json").read_text())["kind"] == "text2text"


def test_text2text_run_evaluates_predicts_and_serves_from_its_folder(lead_files, lead_run, tmp_path):
    from ember.cli import main
    from ember.serve.predictor import load_predictor
    from ember.serve.requests import Limits

    _, _, dev = lead_files
    run, result = lead_run
    assert ember.evaluate(run)["metrics"]["f1"] == pytest.approx(result.metrics["f1"])  # rebuilt from task.json
    # `ember predict` on the dev inputs alone (a CSV without the target column) writes what evaluation scored
    pairs = [json.loads(line) for line in dev.read_text().splitlines()]
    with open(tmp_path / "new.csv", "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([["id", "source"], *[[p["id"], p["source"]] for p in pairs]])
    assert main(["predict", str(run), "--input", str(tmp_path / "new.csv"), "--out", str(tmp_path / "p.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [p["id"] for p in pairs] and all(r["valid"] for r in rows)
    exact = np.mean([r["prediction"] == p["target"] for r, p in zip(rows, pairs)])
    assert 100 * exact == pytest.approx(result.metrics["exact_match"])
    predictor = load_predictor(run, "")
    assert "generate" in predictor.methods
    texts = [p["source"] for p in pairs[:6]]
    served = predictor.run("generate", [predictor.parse("generate", {"texts": texts, "max_new_tokens": 8}, Limits())])
    # greedy decoding either way: 8 served tokens are the start of `ember predict`'s output (which
    # decodes within the budget fine-tuning sized on its targets, kept in RUN/task.json)
    for r, row in zip(served[0]["results"], rows):
        assert row["output"].startswith(r["text"]) and row["prediction"] == row["output"]


def test_text2text_takes_rows_from_python(lead_files, t5_glue_tokenizer, tmp_path):
    """A list of dicts and a DataFrame with other column names, written to the run's inputs (tuples,
    read by position, go without names: the rule of every custom kind's Python data)."""
    pd = pytest.importorskip("pandas")
    _, train, dev = lead_files
    pairs = [json.loads(line) for line in train.read_text().splitlines()[:64]]
    dicts = [{"phrase": p["source"], "lead": p["target"]} for p in pairs]
    frame = pd.DataFrame({"phrase": [p["source"] for p in pairs[:32]], "lead": [p["target"] for p in pairs[:32]]})
    result = ember.finetune("text2text", tmp_path / "run", train=dicts, dev=frame, column="phrase",
                            label_column="lead", init="random", model="t5-tiny", tokenizer=str(t5_glue_tokenizer),
                            epochs=1, max_length=24, progress=False, overrides=TINY_T5)
    written = [json.loads(line) for line in (tmp_path / "run" / "inputs" / "train.jsonl").read_text().splitlines()]
    assert written[0] == {"phrase": pairs[0]["source"], "lead": pairs[0]["target"]} and len(written) == 64
    assert set(result.metrics) >= {"exact_match", "f1", "bleu"}
    tuples = ember.finetune("text2text", tmp_path / "tuples", train=[(p["source"], p["target"]) for p in pairs],
                            dev=[(p["source"], p["target"]) for p in pairs[:16]], init="random", model="t5-tiny",
                            tokenizer=str(t5_glue_tokenizer), epochs=1,
                            max_length=24, progress=False, overrides=TINY_T5)
    assert json.loads((tmp_path / "tuples" / "task.json").read_text())["text_column"] == "input"
    assert tuples.metrics["f1"] >= 0


def test_text2text_beam_search_setting_reaches_predict_and_equals_the_generation_library(lead_files, lead_run,
                                                                                         tmp_path):
    """task.num_beams / task.length_penalty in a run's config.yaml, or --num-beams / --length-penalty /
    --max-new-tokens on the command line: `ember predict` (and evaluate, serving) decode with them;
    each output equals ember.seq2seq_generation's (beam search checked token for token against
    transformers' generate in tests/tasks/text2text/test_t5_generate.py)."""
    import dataclasses
    import shutil

    from ember.cli import main
    from ember.config import TaskConfig, load_yaml, run_config_from_dict, save_yaml
    from ember.seq2seq_generation import Seq2SeqGenerationConfig, load_seq2seq_lm, seq2seq_generate_ids
    from ember.tasks.task_model import load_run_adapter

    _, _, dev = lead_files
    run, _ = lead_run
    beams = tmp_path / "beams"
    shutil.copytree(run, beams)
    cfg = run_config_from_dict(load_yaml(beams / "config.yaml"))
    save_yaml(dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, num_beams=4, length_penalty=0.6)),
              beams / "config.yaml")
    pairs = [json.loads(line) for line in dev.read_text().splitlines()[:24]]
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": p["id"], "source": p["source"]} for p in pairs])
    model, tok = load_seq2seq_lm(run)
    inputs = [tok.encode(p["source"], add_special_tokens=False).ids + [tok.token_to_id("</s>")] for p in pairs]
    beam = {"num_beams": 4, "length_penalty": 0.6}
    outputs = {}
    record = json.loads((run / "task.json").read_text())
    budget = min(max(2 * record["longest_target"], 32), cfg.model.max_position)  # twice the longest target
    assert record["longest_target"] > 2
    rebuilt = load_run_adapter(run, cfg)  # what `ember predict` builds: no targets read, the recorded budget
    assert rebuilt.decode_budget(rebuilt.encoder(tok, cfg.task.max_length)) == budget < cfg.model.max_position
    for name, folder, flags, setting in (
            ("greedy", run, [], {}), ("config", beams, [], beam),
            ("flags", run, ["--num-beams", "4", "--length-penalty", "0.6"], beam),
            ("short", run, ["--max-new-tokens", "2", "--no-progress"], {"max_new_tokens": 2})):
        assert main(["predict", str(folder), "--input", str(source), "--out", str(tmp_path / "p.jsonl"), *flags]) == 0
        rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
        gen = Seq2SeqGenerationConfig(**{"max_new_tokens": budget, **setting})
        expected = [tok.decode(ids) for ids in seq2seq_generate_ids(model, inputs, gen, tok.token_to_id("</s>"))]
        outputs[name] = [r["output"] for r in rows]
        assert [" ".join(o.split()) for o in outputs[name]] == [" ".join(e.split()) for e in expected], name
    assert outputs["flags"] == outputs["config"] != outputs["greedy"]
    from_python = ember.predict(run, source, num_beams=4, length_penalty=0.6)  # ember.predict takes them too
    assert [r["output"] for r in from_python] == outputs["flags"]
    assert all(len(tok.encode(o, add_special_tokens=False).ids) <= 2 for o in outputs["short"])
    assert load_run_adapter(beams, run_config_from_dict(load_yaml(beams / "config.yaml"))).decoding == beam
    scored = ember.evaluate(beams)["metrics"]
    assert set(scored) >= {"exact_match", "f1", "bleu"}
    flagged = ember.evaluate(run, num_beams=4, length_penalty=0.6)
    assert flagged["metrics"] == scored  # the same decoding as the config's, and the result says which
    assert flagged["decoding"] == {"num_beams": 4, "length_penalty": 0.6, "max_new_tokens": budget}
    assert ember.evaluate(run, max_new_tokens=1)["metrics"]["exact_match"] < scored["exact_match"]
    adapter = get_adapter(custom_task("text2text", *lead_files[1:]), model_preset("t5-tiny"))
    with pytest.raises(EmberError, match="task.num_beams=0"):
        adapter.set_decoding(TaskConfig(num_beams=0))
    with pytest.raises(EmberError, match=r"task.max_new_tokens=9999: decode between 1 and \d+ tokens"):
        adapter.set_decoding(TaskConfig(max_new_tokens=9999))
