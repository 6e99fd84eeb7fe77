"""`ember pretrain --init RUN` (ember.api.continued) for every pre-training family: a GPT-1, a
GPT-2, a T5, a BART, a MASS run, an XLNet, an XLM and Dai & Le's SA-LSTM, each pre-trained here
for a few steps on real text (Wikipedia; English + Russian for XLM) and continued with its own
objective on the same shards, tokenized with the init's tokenizer. The MLM encoders are in
test_continued_pretraining.py."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import real_data
from ember.cli import main
from ember.runs.checkpoint import load_weights
from ember.runs.folder import load_run_config
from run_helpers import env, kill_after_checkpoint, train_losses

# 2 layers x 32 (4H feed-forward), 64 positions, blocks of 32 tokens: every family steps in well under a second
SHAPE = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=128",
         "model.max_position=64"]
STEPS = ["data.max_seq_length=32", "data.eval_examples=8", "train.batch_size=4", "train.grad_accum=1",
         "train.log_every=1", "train.eval_every=0", "train.save_every=0", "train.num_threads=1"]
NO_DROPOUT = ["model.dropout=0", "model.attention_dropout=0"]  # settings the init leaves free: losses comparable

# family -> (the init's recipe, its corpus fixture, model settings beyond SHAPE, the objective it continues with)
FAMILIES = {
    "gpt2": ("gpt2-mini", "wiki_bpe", [], "clm"),
    "gpt": ("gpt1-mini", "wiki_bpe", [], "clm"),
    "t5": ("t5-mini", "wiki_t5_prepared", ["model.head_dim=16"], "span_corruption"),
    "bart": ("bart-mini", "wiki_bpe", [], "bart"),
    "mass": ("mass-mini", "wiki_bpe", [], "mass"),  # a BART-shaped run pre-trained with MASS
    "xlnet": ("xlnet-mini", "wiki_prepared", ["model.mem_len=16"], "plm"),
    "xlm": ("xlm-mini", "en_ru", [], "xlm_mlm"),
    "lstm": ("sa-lstm", "wiki_prepared", ["model.embedding_size=16"], "seq_autoencoder"),  # Dai & Le's SA-LSTM
}


def sets(*items: str) -> list[str]:
    return [a for s in items for a in ("--set", s)]


@pytest.fixture(scope="module")
def inits(request, tmp_path_factory):
    """family -> (init run, its prepared corpus): made on first use, 3 steps of its own recipe."""
    made = {}

    def get(family: str):
        if family not in made:
            recipe, corpus, model, _ = FAMILIES[family]
            prepared = request.getfixturevalue(corpus)
            run = tmp_path_factory.mktemp(family) / "init"
            assert main(["pretrain", "--recipe", recipe, "--data", str(prepared), "--out", str(run), "--max-steps",
                         "3", "--lr", "1e-3", "--no-progress", *sets(*SHAPE, *model, *STEPS)]) == 0
            made[family] = run, prepared
        return made[family]

    return get


def continued_setup(init, prepared, out, *overrides):
    """The objective module `ember pretrain --init` trains, before its first step."""
    from ember.api.pretrain import pretrain_config
    from ember.objectives.setup import setup_pretraining

    cfg = pretrain_config(None, out, prepared, list(overrides), init=init)
    torch.manual_seed(cfg.train.seed)
    return cfg, setup_pretraining(cfg, out, False, False)


def init_loss_on_first_batch(init: Path, run: Path, scratch: Path) -> float:
    """The loss of the init's own weights on the continued run's first batch: the run's objective
    built afresh from its saved settings (random weights, no --init), then every tensor of the
    init's model.safetensors loaded strictly, and one training step's forward on the batch the
    trainer draws first (its order, its corruption seed)."""
    from ember.objectives.setup import setup_pretraining
    from ember.train.loop import Trainer

    cfg = load_run_config(run)
    setup = setup_pretraining(dataclasses.replace(cfg, init=""), scratch, False, False)
    setup.module.load_state_dict(load_weights(init / "model.safetensors"))  # strict: heads included
    trainer = Trainer(setup.module, setup.train_data, setup.cfg.train, scratch, progress=False)
    metrics, _ = trainer.train_step(trainer.module)
    return metrics["loss"]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_continued_pretraining_starts_from_the_init_exactly_and_continues_its_own_objective(
        family, inits, tmp_path):
    init, prepared = inits(family)
    objective = FAMILIES[family][3]
    cfg, setup = continued_setup(init, prepared, tmp_path / "probe")
    init_cfg, state = load_run_config(init), load_weights(init / "model.safetensors")
    assert (cfg.objective, cfg.model, cfg.init) == (objective, init_cfg.model, str(init))
    assert cfg.data.max_seq_length == 64  # the family recipe's 128 or 256 tokens, cut to the init's 64 positions
    own = setup.module.state_dict()
    assert set(own) == set(state)  # the same objective: its heads (lm.bias, final_logits_bias, ...) all come along
    for name, tensor in own.items():
        assert torch.equal(tensor, state[name]), name  # exact: the init's tensors themselves
    run = tmp_path / "run"
    assert main(["pretrain", "--init", str(init), "--data", str(prepared), "--out", str(run), "--max-steps", "8",
                 "--lr", "5e-3", "--no-progress", *sets(*STEPS, *NO_DROPOUT, "train.warmup_steps=1")]) == 0
    saved = load_run_config(run)
    assert saved.objective == objective and saved.model == dataclasses.replace(init_cfg.model, dropout=0.0,
                                                                               attention_dropout=0.0)
    assert json.loads((run / "recipe.json").read_text())["recipe"] == FAMILIES[family][0]
    losses = [loss for _, loss in sorted(train_losses(run).items())]
    assert len(losses) == 8 and all(loss == loss for loss in losses)
    # the first step's forward is the init model on the run's first batch: the same module code, batch,
    # seeds and thread count on both sides, so the same float operations in the same order
    assert losses[0] == init_loss_on_first_batch(init, run, tmp_path / "scratch")
    # it trains on: held-out loss below the init's, on the same held-out examples with the same masks
    # (both runs evaluate data.eval_examples of 32 tokens at their end; 3 steps from random is far from the floor)
    assert held_out_loss(run) < held_out_loss(init)


def held_out_loss(run: Path) -> float:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
            if json.loads(line)["split"] == "eval"][-1]["loss"]


def refused(args: list[str], capsys) -> str:
    assert main(args) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    return err


def encoder_init(folder: Path, prepared: Path, embedding: dict | None = None) -> Path:
    """A tiny BERT run (random backbone, no MLM head) over ``prepared``'s tokenizer, with an
    embedding.json and a labels.json when asked, as an imported sentence encoder or a classifier has."""
    from ember.config import ModelConfig, RunConfig
    from ember.data.shards import TokenCorpus
    from ember.models import build_backbone
    from ember.runs.checkpoint import save_weights
    from ember.runs.folder import write_run_files

    cfg = ModelConfig(family="bert", vocab_size=2000, hidden_size=32, num_layers=2, num_heads=2,
                      intermediate_size=64, max_position=64)
    write_run_files(folder, RunConfig(model=cfg, objective="mlm"), TokenCorpus(prepared, "train").tokenizer_path)
    torch.manual_seed(0)
    save_weights({f"backbone.{k}": v for k, v in build_backbone(cfg).state_dict().items()},
                 folder / "model.safetensors")
    if embedding is not None:
        (folder / "embedding.json").write_text(json.dumps(embedding))
        (folder / "labels.json").write_text(json.dumps(["negative", "positive"]))
    return folder


def test_continued_pretraining_refuses_an_objective_or_setting_that_does_not_fit_the_init_before_writing(
        inits, wiki_prepared, wiki_t5_prepared, tmp_path, capsys):
    gpt2, bpe = inits("gpt2")
    t5, t5_corpus = inits("t5")
    xlnet, wordpiece = inits("xlnet")
    out = tmp_path / "out"

    def args(init, data, *extra):
        return ["pretrain", "--init", str(init), "--data", str(data), "--out", str(out), "--max-steps", "1",
                "--no-progress", *extra]  # (a step budget, should a refusal ever fail to come)

    err = refused(args(gpt2, bpe, "--recipe", "continue-mlm"), capsys)  # an MLM objective on a decoder
    assert "objective 'mlm' (from continue-mlm.yaml) does not fit it" in err and "continues with clm" in err
    err = refused(args(encoder_init(tmp_path / "bert", wiki_prepared), wiki_prepared, "--recipe", "gpt2-mini"), capsys)
    assert "objective 'clm'" in err and "bert model continues with mlm, bert, albert, spanbert" in err
    err = refused(args(t5, t5_corpus, "--recipe", "bart-mini"), capsys)
    assert "objective 'bart'" in err and "span_corruption" in err and "without --recipe: t5-mini" in err
    err = refused(args(xlnet, wordpiece, *sets("objective=mlm")), capsys)
    assert "objective 'mlm' (from --set objective)" in err and "continues with plm" in err
    # the checks every init has: the weights fix the shape, the shards the tokenizer, --out its own folder
    assert "model.num_heads" in refused(args(t5, t5_corpus, *sets("model.num_heads=4")), capsys)
    assert "model.mem_len" in refused(args(gpt2, bpe, *sets("model.mem_len=8")), capsys)  # memory is XLNet's
    err = refused(args(gpt2, t5_corpus), capsys)
    assert "2,000-token vocabulary" in err and "1,000 tokens" in err and "--tokenizer" in err
    assert "where this command reads" in refused(args(gpt2, bpe)[:5] + ["--out", str(gpt2)], capsys)
    assert not out.exists() and load_run_config(gpt2).init == ""  # nothing half-written, the init untouched


def test_continued_xlnet_takes_a_memory_length_and_xlm_chooses_tlm_on_parallel_data(inits, tmp_path):
    """XLNet's memory is context, not weights: a continued run may set its length. An XLM init on a
    corpus with parallel pairs continues with MLM and TLM mixed (xlm-mini's comment); here its
    tokenizer prepares real en + ru text and a few hand-made translation pairs."""
    from ember.api.pretrain import pretrain_config

    xlnet, wordpiece = inits("xlnet")
    cfg = pretrain_config(None, tmp_path / "x", wordpiece, ["model.mem_len=24"], init=xlnet)
    assert (cfg.objective, cfg.model.mem_len, load_run_config(xlnet).model.mem_len) == ("plm", 24, 16)
    xlm, _ = inits("xlm")
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"en\tru\t{en}\t{ru}\n" for en, ru in [
        ("The cat sleeps.", "Кошка спит."), ("I like tea.", "Я люблю чай."), ("The house is old.", "Дом старый."),
        ("He reads a book.", "Он читает книгу."), ("It is cold today.", "Сегодня холодно."),
        ("Where is the station?", "Где вокзал?"), ("She writes letters.", "Она пишет письма."),
        ("The river is wide.", "Река широкая.")] * 3))
    prepared = tmp_path / "parallel"
    assert main(["prepare", "--lang", f"en={real_data('wiki-en', 'AA', 'wiki_00.gz')}", "--lang",
                 f"ru={real_data('ruslit', 'Chekhov') / '*.txt'}", "--parallel", str(pairs), "--languages", "en,ru",
                 "--max-docs", "6", "--valid-fraction", "0.2", "--tokenizer", str(xlm / "tokenizer.json"),
                 "--out", str(prepared), "--no-progress"]) == 0
    run = tmp_path / "run"
    assert main(["pretrain", "--init", str(xlm), "--data", str(prepared), "--out", str(run), "--max-steps", "2",
                 "--no-progress", *sets(*STEPS)]) == 0
    assert load_run_config(run).objective == "xlm_mlm_tlm"
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(r["split"] == "train" and "tlm_loss" in r for r in logged)


def test_continued_bart_resume_after_kill_reproduces_the_losses(inits, tmp_path):
    """One family beyond MLM (BART: its own setup sets the decoder start) killed after a
    checkpoint and resumed: bit-for-bit the uninterrupted run's losses. Every family resumes
    through the same trainer and checkpoints."""
    init, prepared = inits("bart")

    def cmd(run: Path, *extra: str) -> list[str]:
        return [sys.executable, "-m", "ember", "pretrain", "--init", str(init), "--data", str(prepared), "--out",
                str(run), "--max-steps", "6", "--no-progress", *sets(*STEPS[:-2], "train.save_every=2"), *extra]

    whole = tmp_path / "whole"
    done = subprocess.run(cmd(whole), env=env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    losses = train_losses(whole)
    assert sorted(losses) == list(range(1, 7))
    run = tmp_path / "run"
    kill_after_checkpoint(cmd(run), run, step=2)
    done = subprocess.run(cmd(run, "--resume"), env=env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resumed from" in done.stdout
    assert train_losses(run) == losses


def test_continued_pretraining_carries_the_inits_embedding_defaults_not_its_labels(wiki_prepared, tmp_path):
    """RUN/embedding.json (cls pooling, normalised, as an imported sentence encoder may say) goes to
    the continued run, so `ember embed` pools as the init did; labels.json names a task head that
    a pre-training run does not have, so it stays behind. A checkpoint of the run carries it on."""
    import ember

    defaults = {"pooling": "cls", "normalize": True, "max_length": 16, "source": "test"}
    init = encoder_init(tmp_path / "init", wiki_prepared, defaults)
    run = tmp_path / "run"
    assert main(["pretrain", "--init", str(init), "--data", str(wiki_prepared), "--out", str(run), "--max-steps",
                 "2", "--no-progress", *sets(*STEPS[:-2], "train.save_every=1")]) == 0
    assert json.loads((run / "embedding.json").read_text()) == defaults
    assert not (run / "labels.json").exists()
    texts = ["The river flows north.", "A short history of the town and its old bridge."]
    vectors = ember.embed(run, texts)
    assert torch.equal(torch.from_numpy(vectors), torch.from_numpy(ember.embed(run, texts, pooling="cls",
                                                                                normalize=True)))
    assert not torch.allclose(torch.from_numpy(vectors), torch.from_numpy(ember.embed(run, texts, pooling="mean")))
    again = tmp_path / "again"
    assert main(["pretrain", "--init", str(run / "checkpoints" / "step-00000001"), "--data", str(wiki_prepared),
                 "--out", str(again), "--max-steps", "1", "--no-progress", *sets(*STEPS)]) == 0
    assert json.loads((again / "embedding.json").read_text()) == defaults


def test_continued_pretraining_of_the_real_minilm_folder_keeps_its_sentence_transformers_pooling(tmp_path):
    """all-MiniLM-L6-v2 as an HF folder: its modules.json says mean pooling and Normalize, its
    sentence_bert_config.json 256 tokens; the continued run embeds that way by default."""
    from ember.data.prepare import prepare_corpus

    checkpoint = real_data("checkpoints", "all-MiniLM-L6-v2")
    prepare_corpus([real_data("wiki-en", "AA", "wiki_00.gz")], checkpoint / "tokenizer.json", tmp_path / "wiki",
                   max_docs=4, valid_fraction=0.0, progress=False)
    run = tmp_path / "run"
    assert main(["pretrain", "--init", str(checkpoint), "--data", str(tmp_path / "wiki"), "--out", str(run),
                 "--max-steps", "1", "--no-progress", *sets(*STEPS, "train.batch_size=2")]) == 0
    saved = json.loads((run / "embedding.json").read_text())
    assert (saved["pooling"], saved["normalize"], saved["max_length"]) == ("mean", True, 256)


def test_continued_t5_keeps_an_untied_lm_head_and_bart_its_final_logits_bias(inits, wiki_t5_prepared, tmp_path):
    """The heads that are not the embeddings: T5 v1.1's own lm_head (tie_word_embeddings false)
    and BART's final_logits_bias (a buffer, zeros in a run from scratch: here set to random
    values, as a released BART's are not zeros) start the continued run as the init has them."""
    import shutil

    from ember.runs.checkpoint import save_weights

    t5 = tmp_path / "t5-v1.1"
    assert main(["pretrain", "--recipe", "t5-mini", "--data", str(wiki_t5_prepared), "--out", str(t5), "--max-steps",
                 "1", "--no-progress", *sets(*SHAPE, "model.head_dim=16", "model.tie_word_embeddings=false",
                                             "model.hidden_act=gated-gelu_new", *STEPS)]) == 0
    _, setup = continued_setup(t5, wiki_t5_prepared, tmp_path / "probe-t5")
    head = load_weights(t5 / "model.safetensors")["backbone.lm_head.weight"]
    assert torch.equal(setup.module.state_dict()["backbone.lm_head.weight"], head)
    bart, bpe = inits("bart")
    changed = tmp_path / "bart"
    shutil.copytree(bart, changed)
    state = load_weights(bart / "model.safetensors")
    state["backbone.final_logits_bias"] = torch.randn_like(state["backbone.final_logits_bias"])
    save_weights(state, changed / "model.safetensors")
    _, setup = continued_setup(changed, bpe, tmp_path / "probe-bart")
    assert torch.equal(setup.module.backbone.final_logits_bias, state["backbone.final_logits_bias"])


@pytest.mark.parametrize("family", ["gpt2", "t5", "bart", "xlnet", "xlm"])
def test_continued_pretraining_from_a_transformers_folder_starts_from_its_heads_exactly(family, inits, tmp_path):
    """The init exported with `ember convert --to-hf` (GPT2LMHeadModel, T5ForConditionalGeneration,
    BartForConditionalGeneration, XLNetLMHeadModel, XLMWithLMHeadModel) and given to --init as an HF
    folder: the family's objective, and every tensor of the objective - the output biases that
    travel as final_logits_bias, lm_loss.bias and pred_layer.proj.bias included - is the run's."""
    from ember.data.prepare import prepare_corpus

    init, prepared = inits(family)
    hf = tmp_path / "hf"
    assert main(["convert", "--to-hf", str(init), "--out", str(hf)]) == 0
    if family != "xlm":  # as documented: shards of the init's own tokenizer (GPT-2's export frames no <s> </s>);
        # XLM's corpus needs its language streams, and its exported tokenizer.json is the run's
        prepared = tmp_path / "wiki"
        prepare_corpus([real_data("wiki-en", "AA", "wiki_00.gz")], hf / "tokenizer.json", prepared, max_docs=4,
                       valid_fraction=0.0, progress=False)
    cfg, setup = continued_setup(hf, prepared, tmp_path / "probe")
    assert cfg.objective == FAMILIES[family][3] and cfg.model.family == load_run_config(init).model.family
    state = load_weights(init / "model.safetensors")
    own = setup.module.state_dict()
    assert set(own) == set(state)
    for name, tensor in own.items():
        assert torch.equal(tensor, state[name]), name  # the export and import move tensors, never compute them
