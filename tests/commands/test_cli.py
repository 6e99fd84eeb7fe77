"""The command line: every verb has help, and bad input gives one clear message, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ember.cli import COMMAND_MODULES, build_parser, main


def ember(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ember", *args], capture_output=True, text=True, **kw)


def test_every_verb_is_registered_and_has_help(capsys):
    parser = build_parser()
    verbs = set(parser._subparsers._group_actions[0].choices)
    assert {m.replace("_", "-") for m in COMMAND_MODULES} <= verbs | {"tokenizer"}
    for verb in sorted(verbs):
        args = [verb, "train", "--help"] if verb == "tokenizer" else [verb, "--help"]
        with pytest.raises(SystemExit) as exit_info:
            main(args)
        assert exit_info.value.code == 0
        assert len(capsys.readouterr().out) > 200  # a real description, not a stub


def test_pretrain_help_names_every_shipped_recipe():
    import re

    from ember.recipes import recipe_names

    description = build_parser()._subparsers._group_actions[0].choices["pretrain"].description
    missing = [name for name in recipe_names() if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", description)]
    assert missing == []  # a recipe added to ember/recipes is listed in `ember pretrain --help`


def test_unknown_task_is_one_clear_line(tmp_path):
    done = ember("finetune", "--task", "nosuchtask", "--init", "random", "--model", "bert-tiny",
                 "--tokenizer", str(tmp_path / "missing.json"), "--out", str(tmp_path / "run"))
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "ember finetune: error:" in done.stderr


def test_pretrain_without_prepared_data_says_what_to_do(tmp_path):
    done = ember("pretrain", "--data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "run"))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert str(tmp_path / "nowhere") in done.stderr


def test_unknown_recipe_lists_the_known_ones(tmp_path):
    done = ember("pretrain", "--recipe", "bert-huge", "--out", str(tmp_path / "run"))
    assert done.returncode == 1 and "bert-mini" in done.stderr


def test_bad_override_names_the_setting(tmp_path):
    done = ember("pretrain", "--set", "train.lrr=1", "--out", str(tmp_path / "run"))
    assert done.returncode == 1 and "lrr" in done.stderr and "valid" in done.stderr


@pytest.mark.parametrize("verb", [["pretrain"], ["finetune", "--task", "sst2"], ["kg", "embed"], ["quickstart"]])
def test_a_bad_time_budget_is_a_usage_error_not_a_traceback(verb, tmp_path):
    flag = "--pretrain-time" if verb == ["quickstart"] else "--max-time"
    done = ember(*verb, flag, "20x", "--out", str(tmp_path / "run"))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"argument {flag}: cannot read duration '20x'; write e.g. 90s, 20m or 1.5h" in done.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("verb", [["finetune", "--task", "sst2", "--out", "x"], ["glue", "r", "--out", "x"],
                                  ["fewshot", "r", "--task", "sst2"]])
def test_a_mistyped_seed_list_is_a_usage_error_not_a_traceback(verb):
    done = ember(*verb, "--seeds", "1,x")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "argument --seeds: expected comma-separated integers, e.g. 1,2,3; got '1,x'" in done.stderr


@pytest.mark.parametrize("verb,flag", [(["fewshot", "r", "--task", "sst2"], "--shots"), (["fewshot", "r", "--task", "sst2"], "--seeds"),
                                       (["glue", "r", "--out", "x"], "--seeds"), (["finetune", "--task", "sst2", "--out", "x"], "--seeds")])
def test_a_repeated_value_in_a_seed_or_shot_list_is_a_usage_error(verb, flag):
    """fewshot --shots 1,1 ran k=1 twice and reported it as "6 seeds"; a repeated seed ran twice."""
    done = ember(*verb, flag, "1,2,1")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"argument {flag}: 1 given more than once in '1,2,1'" in done.stderr


def test_resuming_a_run_that_is_not_there_says_so(tmp_path):
    done = ember("pretrain", "--out", str(tmp_path / "nothere"), "--resume")
    assert done.returncode == 1 and "there is no run in" in done.stderr and "data.prepared" not in done.stderr


@pytest.mark.parametrize("args,message", [
    (["fewshot", "r", "--task", "sst2", "--limit", "0"], "argument --limit: expected 1 or more, got 0"),
    (["finetune", "--task", "sst2", "--out", "o", "--train-limit", "-5"], "argument --train-limit: expected 1 or more"),
    (["distill", "--method", "kd", "--teacher", "t", "--out", "o", "--train-limit", "x"],
     "argument --train-limit: expected a whole number, got 'x'"),
    (["generate", "r", "--prompt", "x", "--num-beams", "0"], "argument --num-beams: expected 1 or more, got 0"),
])
def test_counts_below_one_are_usage_errors(args, message):
    """--limit 0 reached torch (bincount of an empty float tensor), --train-limit -5 a ValueError,
    --num-beams 0 was taken silently: each is argparse's one line now."""
    done = ember(*args)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_glue_with_no_task_data_fails_and_says_where_it_looked(wiki_prepared, tmp_path):
    done = subprocess.run([sys.executable, "-m", "ember", "glue", "random", "--model", "bert-tiny", "--tokenizer",
                           str(wiki_prepared / "tokenizer.json"), "--tasks", "rte", "--out", str(tmp_path / "g")],
                          capture_output=True, text=True, env={**__import__("os").environ, "EMBER_DATA": str(tmp_path)})
    assert done.returncode == 1 and "no task's data was found: RTE" in done.stderr, done.stderr


def test_evaluate_on_a_folder_that_is_not_a_run(tmp_path):
    done = ember("evaluate", str(tmp_path))
    assert done.returncode == 1 and "not an ember run folder" in done.stderr


def test_evaluate_on_a_multi_seed_folder_names_its_seed_runs(tmp_path, capsys):
    """`ember finetune --seeds 2,10` writes RUN/seed-2 and RUN/seed-10 (and summary.json): a verb
    given RUN itself says which folders to pass instead of "not a run folder"."""
    from ember.cli import main

    for seed in (10, 2):
        (tmp_path / f"seed-{seed}").mkdir()
        (tmp_path / f"seed-{seed}" / "config.yaml").write_text("kind: finetune\n")
    (tmp_path / "summary.json").write_text("{}")
    for verb in (["evaluate"], ["serve", "--port", "0"], ["predict", "--input", "x.tsv", "--out", "y.tsv"]):
        assert main([verb[0], str(tmp_path), *verb[1:]]) == 1
        err = capsys.readouterr().err
        assert "holds one fine-tuning run per seed (seed-2, seed-10;" in err and f"{tmp_path / 'seed-2'}" in err, verb
    assert main(["finetune", "--task", "sst2", "--init", str(tmp_path), "--out", str(tmp_path / "again")]) == 1
    err = capsys.readouterr().err
    assert "holds one fine-tuning run per seed (seed-2, seed-10;" in err and not (tmp_path / "again").exists()


def test_fill_mask_without_mask_token_explains(wiki_prepared, tmp_path):
    from conftest import TINY_MODEL

    sets = [a for s in TINY_MODEL + ["train.eval_every=0", "train.save_every=0"] for a in ("--set", s)]
    done = ember("pretrain", "--data", str(wiki_prepared), "--out", str(tmp_path / "run"), "--max-steps", "2",
                 "--no-progress", *sets)
    assert done.returncode == 0, done.stderr
    done = ember("fill-mask", str(tmp_path / "run"), "paris is nice")
    assert done.returncode == 1 and "[MASK]" in done.stderr
    done = ember("fill-mask", str(tmp_path / "run"), "paris is [MASK] .")
    assert done.returncode == 0 and "mask 1:" in done.stdout
    for flag in ("--prompt", "--input"):  # an encoder writes no text: said once, whichever flag
        done = ember("generate", str(tmp_path / "run"), flag, "paris is")
        assert done.returncode == 1 and "holds a bert model; ember generate writes text with GPT runs" in done.stderr
        assert "fill-mask" in done.stderr


@pytest.mark.parametrize("setting", ["train.parallel=zero", "train.optimizer=lams", "train.device=cuda:7",
                                     "train.clock=wall-clock", "train.schedule=cosine"])
def test_a_bad_train_setting_is_refused_before_the_run_folder_is_written(setting, wiki_prepared, tmp_path):
    """Pre-training and fine-tuning (the real MiniLM on SST-2) refuse a bad train.* value in one
    line and leave no folder, so the corrected command runs without --overwrite."""
    from conftest import real_data

    minilm = real_data("checkpoints", "all-MiniLM-L6-v2")
    for verb in (["pretrain", "--data", str(wiki_prepared), "--set", "train.max_steps=1"],
                 ["finetune", "--task", "sst2", "--init", str(minilm), "--train-limit", "8", "--epochs", "0.5"]):
        done = ember(*verb, "--out", str(tmp_path / "run"), "--set", setting)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert f"error: {setting.split('=')[0]}" in done.stderr, done.stderr
        assert not (tmp_path / "run").exists()


def test_finetune_under_torchrun_is_refused_before_writing(tmp_path):
    """Fine-tuning trains in one process; started by torchrun (WORLD_SIZE > 1, as torchrun sets it)
    each rank would write the same folder. One line, nothing written, on SST-2 and on a CSV."""
    import os

    from conftest import real_data

    minilm = str(real_data("checkpoints", "all-MiniLM-L6-v2"))
    table = tmp_path / "reviews.csv"
    table.write_text("text,label\na fine film,pos\na dull mess,neg\n")
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "1"}
    for task in (["--task", "sst2"], ["--task", "classify", "--train", str(table), "--dev", str(table)]):
        done = ember("finetune", *task, "--init", minilm, "--out", str(tmp_path / "run"), env=env)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert "trains in one process, and torchrun started 2" in done.stderr
        assert not (tmp_path / "run").exists()


def test_out_naming_the_commands_own_input_is_refused_even_with_overwrite(wiki_prepared, tmp_path):
    """--overwrite deleted --out before reading from it: `pretrain --data D --out D` lost the corpus,
    `finetune --init R --out R` the pre-trained run. Both are refused, and both stay whole."""
    import shutil

    from conftest import TINY_MODEL

    corpus = tmp_path / "corpus"
    shutil.copytree(wiki_prepared, corpus)
    sets = [a for s in TINY_MODEL + ["train.eval_every=0", "train.save_every=0"] for a in ("--set", s)]
    done = ember("pretrain", "--data", str(corpus), "--out", str(corpus), "--overwrite", "--max-steps", "1", *sets)
    assert done.returncode == 1 and "is where this command reads" in done.stderr, done.stderr
    assert (corpus / "meta.json").is_file()
    run = tmp_path / "run"
    assert ember("pretrain", "--data", str(corpus), "--out", str(run), "--max-steps", "1", "--no-progress",
                 *sets).returncode == 0
    kept = sorted(p.name for p in run.iterdir())
    done = ember("finetune", "--task", "sst2", "--init", str(run), "--out", str(run), "--overwrite",
                 "--train-limit", "8", "--max-length", "32")
    assert done.returncode == 1 and "is where this command reads" in done.stderr, done.stderr
    assert sorted(p.name for p in run.iterdir()) == kept


def test_elmo_given_token_shards_says_it_reads_raw_text(wiki_prepared, tmp_path):
    """ELMo reads words from raw text; a prepared corpus (what every other recipe takes) was read
    as text and failed on meta.json's first line."""
    done = ember("pretrain", "--recipe", "elmo-mini", "--data", str(wiki_prepared), "--out", str(tmp_path / "run"),
                 "--max-steps", "1", "--no-progress")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "holds token shards from `ember prepare`, but ELMo pre-training reads raw text" in done.stderr
    assert not (tmp_path / "run").exists()


def test_pretrain_sizes_the_vocabulary_to_the_corpus_tokenizer(wiki_prepared, tmp_path):
    """A recipe written for 30,522 tokens on a smaller tokenizer gets the tokenizer's size."""
    import json

    from conftest import TINY_MODEL

    from ember.runs.folder import load_run_config

    tiny = [s for s in TINY_MODEL if not s.startswith("model.vocab_size=")]
    sets = [a for s in tiny + ["train.eval_every=0", "train.save_every=0"] for a in ("--set", s)]
    done = ember("pretrain", "--data", str(wiki_prepared), "--out", str(tmp_path / "run"), "--max-steps", "1",
                 "--no-progress", *sets)
    assert done.returncode == 0, done.stderr
    corpus_vocab = json.loads((wiki_prepared / "meta.json").read_text())["tokenizer"]["vocab_size"]
    assert corpus_vocab != 30522
    assert load_run_config(tmp_path / "run").model.vocab_size == corpus_vocab
    # an explicit setting wins
    done = ember("pretrain", "--data", str(wiki_prepared), "--out", str(tmp_path / "run2"), "--max-steps", "1",
                 "--no-progress", *sets, "--set", f"model.vocab_size={corpus_vocab + 8}")
    assert done.returncode == 0, done.stderr
    assert load_run_config(tmp_path / "run2").model.vocab_size == corpus_vocab + 8


@pytest.mark.parametrize("spelling", ["--max-docs", "--max-documents"])
def test_tokenizer_and_prepare_take_either_spelling_of_the_document_limit(spelling):
    parser = build_parser()
    tok = parser.parse_args(["tokenizer", "train", "corpus", "--kind", "bpe", "--vocab-size", "100", "--out", "t.json",
                             spelling, "7"])
    prep = parser.parse_args(["prepare", "corpus", "--tokenizer", "t.json", "--out", "shards", spelling, "7"])
    assert tok.max_documents == 7 and prep.max_docs == 7
