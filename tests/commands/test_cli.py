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
