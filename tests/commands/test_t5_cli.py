"""The command line on T5 runs: `ember generate` (input texts, beams) equals
ember.seq2seq_generation, `ember finetune --init T5_RUN` then evaluate / predict / convert
--to-hf (T5ForConditionalGeneration gives the same logits), `ember glue` on a T5 run, and the
options of the other kind of generator refused."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import real_data
from t5_helpers import one_thread, t5_glue_tokenizer, t5_run_folder  # noqa: F401

from ember.cli import main
from ember.seq2seq_generation import (
    Seq2SeqGenerationConfig,
    load_seq2seq_lm,
    seq2seq_generate_text,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pretrain_run(tmp_path_factory, t5_glue_tokenizer):
    return t5_run_folder(tmp_path_factory.mktemp("t5-cli") / "pre", t5_glue_tokenizer, seed=4)


@pytest.fixture(scope="module")
def rte_run(tmp_path_factory, pretrain_run):
    """`ember finetune --task rte --init <T5 pre-training run>` on 96 real RTE pairs, 2 epochs."""
    real_data("glue", "RTE", "train.tsv")
    out = tmp_path_factory.mktemp("t5-rte") / "run"
    assert main(["finetune", "--task", "rte", "--init", str(pretrain_run), "--out", str(out), "--train-limit", "96",
                 "--epochs", "2", "--max-length", "64", "--lr", "0.01", "--set", "train.log_every=1", "--no-progress"]) == 0
    return out


def test_ember_generate_on_a_t5_run_prints_what_seq2seq_generate_text_gives(pretrain_run, capsys, tmp_path):
    texts = ["The river Thames flows through London .", "a gem of a film"]
    model, tok = load_seq2seq_lm(pretrain_run)
    for extra, cfg in (([], Seq2SeqGenerationConfig(max_new_tokens=6)),
                       (["--num-beams", "3", "--length-penalty", "0.6", "--early-stopping"],
                        Seq2SeqGenerationConfig(max_new_tokens=6, num_beams=3, length_penalty=0.6, early_stopping=True)),
                       (["--temperature", "0.8", "--seed", "3"],
                        Seq2SeqGenerationConfig(max_new_tokens=6, temperature=0.8, seed=3))):
        capsys.readouterr()
        assert main(["generate", str(pretrain_run), "--input", texts[0], "--prompt", texts[1], "--max-new-tokens", "6",
                     "--no-progress", *extra]) == 0
        printed = capsys.readouterr().out.splitlines()
        assert printed == seq2seq_generate_text(model, tok, [texts[1], texts[0]], cfg), extra  # prompts first
    out = tmp_path / "out.jsonl"
    assert main(["generate", str(pretrain_run), "--input", texts[0], "--max-new-tokens", "6", "--out", str(out)]) == 0
    row = json.loads(out.read_text())
    assert row == {"input": texts[0], "output": seq2seq_generate_text(model, tok, texts[:1],
                                                                      Seq2SeqGenerationConfig(max_new_tokens=6))[0]}


def test_ember_generate_refuses_the_other_generators_options(pretrain_run, tmp_path, capsys):
    from gpt_helpers import make_gpt_run

    assert main(["generate", str(pretrain_run), "--input", "a", "--tldr"]) == 1
    assert "--tldr is GPT-2's prompt trick" in capsys.readouterr().err
    gpt = make_gpt_run(tmp_path)
    for flags, message in ((["--input", "a"], "--input is for T5"), (["--prompt", "a", "--num-beams", "2"],
                                                                      "--num-beams is for T5")):
        assert main(["generate", str(gpt), *flags]) == 1
        assert message in capsys.readouterr().err
    assert main(["generate", str(pretrain_run), "--input", "a", "--num-beams", "2", "--temperature", "0.5"]) == 1
    assert "beam search is deterministic here" in capsys.readouterr().err


def test_ember_finetune_init_t5_run_trains_text_to_text_with_t5_defaults(rte_run, pretrain_run):
    from ember.runs.folder import load_run_config

    result = json.loads((rte_run / "results.json").read_text())
    assert result["task"] == "RTE" and set(result["metrics"]) == {"accuracy", "invalid"}
    assert result["init"] == str(pretrain_run) and result["steps"] == 6
    cfg = load_run_config(rte_run)
    assert (cfg.train.optimizer, cfg.train.schedule, cfg.train.lr) == ("adafactor", "constant", 0.01)
    assert json.loads((rte_run / "labels.json").read_text()) == ["entailment", "not_entailment"]
    records = [json.loads(line) for line in (rte_run / "metrics.jsonl").read_text().splitlines()]
    train = [r["loss"] for r in records if r["split"] == "train"]
    assert train[-1] < train[0]  # the targets are learnt (from ~ln V towards the two label words)


def test_ember_evaluate_and_predict_a_text_to_text_run(rte_run, tmp_path, capsys):
    from ember.tasks.task_model import evaluate_run

    result = json.loads((rte_run / "results.json").read_text())
    assert evaluate_run(rte_run)["metrics"] == result["metrics"]
    assert main(["evaluate", str(rte_run)]) == 0
    rows = tmp_path / "in.tsv"
    rows.write_text("index\tsentence1\tsentence2\n0\tA cat sat on the mat.\tA cat sat.\n"
                    "1\tIt rained all day in Paris.\tParis was dry.\n")
    for out in (tmp_path / "p.jsonl", tmp_path / "p.tsv"):
        assert main(["predict", str(rte_run), "--input", str(rows), "--out", str(out)]) == 0
    got = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [r["id"] for r in got] == ["in-0", "in-1"] and all(set(r) == {"id", "prediction", "valid", "output"}
                                                              for r in got)
    assert all((r["prediction"] in ("entailment", "not_entailment")) == r["valid"] for r in got)
    lines = (tmp_path / "p.tsv").read_text().splitlines()
    assert lines[0] == "id\tprediction\tvalid\toutput" and len(lines) == 3


def test_ember_convert_to_hf_of_a_fine_tuned_t5_run_gives_t5_for_conditional_generation(rte_run, tmp_path):
    transformers = pytest.importorskip("transformers")
    from ember.tokenizers import load_tokenizer

    assert main(["convert", "--to-hf", str(rte_run), "--out", str(tmp_path / "hf")]) == 0
    hf = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "hf").eval()
    ours, _ = load_seq2seq_lm(rte_run)
    tok = load_tokenizer(rte_run / "tokenizer.json")
    ids = torch.tensor([tok.encode("rte sentence1: A cat sat on the mat. sentence2: A cat sat.").ids])
    labels = torch.tensor([tok.encode("entailment").ids])
    with torch.no_grad():
        theirs = hf(input_ids=ids, labels=labels).logits
        mine = ours.lm_logits(ours(ids, decoder_input_ids=ours.shift_right(labels)).last_hidden_state)
    torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=0)


def test_ember_glue_runs_on_a_t5_run(pretrain_run, tmp_path):
    from ember.experiments.glue import run_glue

    real_data("glue", "SST-2", "train.tsv")
    results = run_glue(str(pretrain_run), tmp_path / "glue", tasks=["sst2", "stsb"], seeds=[1], train_limit=64,
                       epochs=1, max_length=48, progress=False)
    columns = {c["task"]: c for c in results["columns"] if c["task"] in ("sst2", "stsb")}
    assert all(c["status"] == "done" for c in columns.values())
    run = json.loads((tmp_path / "glue" / "runs" / "stsb-seed1" / "results.json").read_text())
    assert {"pearson", "spearman", "invalid"} <= set(run["metrics"])
    assert "SST-2" in (tmp_path / "glue" / "glue.md").read_text()
