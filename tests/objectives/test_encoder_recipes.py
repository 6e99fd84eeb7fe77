"""Recipes of the encoder families: every recipe loads and trains a step's worth of its
objective; RoBERTa (byte-level BPE, FULL-SENTENCES) and DistilBERT pre-train on real text,
and the DistilBERT run (no token types, no pooler) fine-tunes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import TINY_MODEL, bpe_corpus, real_data
from ember.cli import main
from ember.recipes import RECIPES_DIR, recipe_path
from ember.config import apply_overrides, load_yaml, run_config_from_dict

# Encoder, XLNet and T5 recipes (WordPiece corpus fixture; T5's with sentinels); GPT recipes need
# a BPE corpus with an end-of-text token and are stepped in objectives/test_gpt_pretraining.py,
# XLM recipes a corpus with language codes (objectives/test_xlm_pretraining.py), ernie-dea an
# encoder to continue and entity embeddings (objectives/test_ernie_dea.py), continue-mlm a run to
# continue (train/test_continued_pretraining.py).
RECIPES = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")
                 if not p.stem.startswith(("gpt", "elmo", "xlm", "ernie-dea", "continue-mlm")))
# Small, fast runs: loss must still fall from ~ln(V) towards the unigram entropy.
QUICK_RUN = ["--max-steps", "40", "--batch-size", "16", "--grad-accum", "1", "--lr", "3e-3",
             "--no-progress", "--set", "train.log_every=1", "--set", "train.eval_every=40",
             "--set", "train.save_every=40", "--set", "train.warmup_ratio=0.1"]


def recipe(name: str, *overrides: str):
    return run_config_from_dict(apply_overrides(load_yaml(recipe_path(name)), list(overrides)))


def train_losses(run) -> list[float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["mlm_loss"] for r in records if r["split"] == "train"]


def with_sets(overrides: list[str]) -> list[str]:
    return [arg for item in overrides for arg in ("--set", item)]


@pytest.fixture(scope="module")
def phrase_prepared(wiki_prepared, tmp_path_factory):
    """The wiki_prepared documents again, with ERNIE phrase/entity flags from the detector."""
    from ember.data.prepare import prepare_corpus

    out = tmp_path_factory.mktemp("phrases") / "prepared"
    prepare_corpus([real_data("wiki-en", "AA", "wiki_00.gz")], wiki_prepared / "tokenizer.json", out,
                   max_docs=150, valid_fraction=0.05, progress=False, phrases="detect")
    return out


@pytest.mark.parametrize("name", RECIPES)
def test_every_recipe_builds_its_objective_and_data_and_takes_a_step(name, wiki_prepared, request):
    from ember.data.shards import TokenCorpus
    from ember.objectives import build_objective
    from ember.objectives.setup import objective_dataset

    cfg = recipe(name)
    # ERNIE-style phrase masking needs a corpus prepared with phrase flags, T5's objectives one
    # whose vocabulary has sentinels.
    prepared = request.getfixturevalue("phrase_prepared") if cfg.data.masking == "phrase" else wiki_prepared
    if cfg.model.family == "t5":
        prepared = request.getfixturevalue("wiki_t5_prepared")
    cfg = recipe(name, *TINY_MODEL, f"data.prepared={prepared}")
    assert cfg.kind == "pretrain"
    corpus = TokenCorpus(prepared, "train")
    special = corpus.special_token_ids
    torch.manual_seed(0)
    module = build_objective(cfg, {**special, "tokenizer_path": str(corpus.tokenizer_path)})
    data = objective_dataset(module, corpus, cfg.data, cfg.train.seed, special["sep"])
    batch = module.make_batch([data.example(i, 0) for i in range(4)], np.random.default_rng(0))
    loss, metrics = module(batch)
    loss.backward()
    assert torch.isfinite(loss) and "loss" in metrics
    assert batch["input_ids"].shape[1] <= cfg.data.max_seq_length
    assert cfg.train.batch_size % cfg.train.grad_accum == 0


def test_packed_sequences_carry_the_real_corpus_phrase_flags(phrase_prepared):
    from ember.data.packing import PackedSentenceDataset
    from ember.data.shards import TokenCorpus

    corpus = TokenCorpus(phrase_prepared, "train")
    assert corpus.has_joins
    sep = corpus.special_token_ids["sep"]
    data = PackedSentenceDataset(corpus, 64, cross_documents=True, sep_id=sep)
    pairs = [data.example(i) for i in range(len(data))]
    assert all(len(p.joins_a) == len(p.tokens_a) for p in pairs)
    assert not any(p.joins_a[p.tokens_a == sep].any() for p in pairs)
    packed = np.concatenate([p.joins_a[p.tokens_a != sep] for p in pairs])
    stored = np.concatenate([corpus.joins(r.start, r.stop) for r in map(corpus.doc_sentences, range(corpus.num_docs))])
    np.testing.assert_array_equal(packed, stored.astype(bool))
    assert packed.any()  # the detector found phrases, so the check is not vacuous


@pytest.mark.parametrize("name", [n for n in RECIPES if n.startswith("roberta-")])
def test_roberta_recipes_follow_the_paper(name):
    cfg = recipe(name)
    assert (cfg.objective, cfg.model.family, cfg.data.packing) == ("mlm", "roberta", "full_sentences")
    assert (cfg.train.adam_beta2, cfg.train.adam_eps, cfg.data.static_masks) == (0.98, 1e-6, 0)
    assert cfg.train.warmup_steps or cfg.train.warmup_ratio
    assert cfg.model.type_vocab_size == 1 and cfg.model.layer_norm_eps == 1e-5


@pytest.mark.parametrize("name", [n for n in RECIPES if n.startswith("albert-")])
def test_albert_recipes_train_mlm_and_sop_on_shared_factorized_layers(name):
    from ember.objectives import build_objective

    cfg = recipe(name, *TINY_MODEL)
    assert cfg.objective == "albert" and recipe(name).data.max_seq_length == 128
    assert (cfg.model.share_layers, cfg.model.embedding_size) == ("all", 128)
    module = build_objective(cfg, {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4})
    assert module.pair_mode == "sop" and module.sop is not None and module.nsp is None


def test_distilbert_recipe_is_six_bert_base_layers_without_token_types_or_pooler():
    cfg = recipe("distilbert")
    m = cfg.model
    assert (m.family, m.num_layers, m.hidden_size, m.num_heads, m.intermediate_size) == \
        ("distilbert", 6, 768, 12, 3072)
    assert m.type_vocab_size == 0 and not m.pooler
    # Sanh et al. 2019 §3: MLM without NSP, dynamic masking, large batches by accumulation
    assert cfg.objective == "mlm" and cfg.data.static_masks == 0
    assert cfg.train.grad_accum > 1 and cfg.train.batch_size >= 256


@pytest.fixture(scope="module")
def bpe_prepared(tmp_path_factory):
    """Byte-level BPE (RoBERTa's tokenizer kind, 2k vocab) and shards of real Wikipedia."""
    return bpe_corpus(tmp_path_factory.mktemp("bpe"), 2000, 150, 0.05)


def test_roberta_mini_pretraining_loss_goes_down_on_real_text_with_byte_level_bpe(bpe_prepared, tmp_path, capsys):
    from ember.data.packing import build_pretraining_dataset
    from ember.data.shards import TokenCorpus

    corpus = TokenCorpus(bpe_prepared, "train")
    special = corpus.special_token_ids
    assert (special["cls"], special["pad"], special["sep"]) == (0, 1, 2)  # <s> <pad> </s>, RoBERTa's ids
    run = tmp_path / "roberta"
    code = main(["pretrain", "--recipe", "roberta-mini", "--data", str(bpe_prepared), "--out", str(run),
                 *QUICK_RUN, *with_sets(TINY_MODEL)])
    assert code == 0
    # the last line says how the run ended: its last held-out evaluation, as metrics.jsonl has it
    held_out = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    held_out = [r for r in held_out if r["split"] == "eval"][-1]
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("stopped at step 40 after ") and f"held-out loss {held_out['loss']:.4g}," in last
    losses = train_losses(run)
    assert len(losses) == 40
    assert np.mean(losses[-10:]) < np.mean(losses[:5]) - 0.6
    # The run trained on FULL-SENTENCES sequences: some cross a document with </s> between.
    cfg = recipe(str(run / "config.yaml"))
    assert cfg.data.packing == "full_sentences" and cfg.model.pad_token_id == special["pad"]
    data = build_pretraining_dataset(corpus, cfg.data, "none", 0, special["sep"])
    assert any((data.example(i).tokens_a == special["sep"]).any() for i in range(len(data)))


@pytest.fixture(scope="module")
def distilbert_run(wiki_prepared, tmp_path_factory):
    run = tmp_path_factory.mktemp("distilbert") / "run"
    code = main(["pretrain", "--recipe", "distilbert", "--data", str(wiki_prepared), "--out", str(run),
                 *QUICK_RUN, *with_sets(TINY_MODEL)])
    assert code == 0
    return run


def test_distilbert_pretraining_loss_goes_down_on_real_text(distilbert_run):
    from ember.runs.checkpoint import load_weights

    losses = train_losses(distilbert_run)
    assert np.mean(losses[-10:]) < np.mean(losses[:5]) - 0.6
    names = list(load_weights(distilbert_run / "model.safetensors"))
    assert any(n.startswith("backbone.layers.1.") for n in names)
    assert not any("token_type" in n or "pooler" in n or n.startswith(("nsp.", "sop.")) for n in names)


def test_distilbert_run_fine_tunes_without_token_types_or_pooler(distilbert_run, tmp_path):
    from ember.runs.checkpoint import load_weights

    real_data("glue", "RTE")
    # The CLI path end to end, on a sentence-pair task: segment B's token_type_ids of 1 meet
    # a backbone without token-type embeddings, and [CLS]'s last hidden state replaces the pooler.
    out = tmp_path / "rte"
    code = main(["finetune", "--task", "rte", "--init", str(distilbert_run), "--out", str(out),
                 "--train-limit", "128", "--epochs", "1", "--max-length", "64", "--no-progress"])
    assert code == 0
    result = json.loads((out / "results.json").read_text())
    assert result["init"] == str(distilbert_run) and 0.0 <= result["metrics"]["accuracy"] <= 1.0
    weights = load_weights(out / "model.safetensors")
    assert not any("token_type" in n or "pooler" in n for n in weights)
    assert {n.split(".")[0] for n in weights} == {"backbone", "classifier"}


def test_distilbert_classifier_starts_from_the_run_and_fits_real_sentences(distilbert_run):
    from ember.config import RunConfig
    from ember.tasks.readers.glue import get_task
    from ember.tokenizers import load_tokenizer, special_token_ids
    from ember.tasks.base import get_adapter
    from ember.tasks.task_model import build_task_module
    from ember.runs.init import load_init

    real_data("glue", "SST-2")
    model_cfg, state, tokenizer_path = load_init(str(distilbert_run))
    assert model_cfg.family == "distilbert" and model_cfg.type_vocab_size == 0 and not model_cfg.pooler
    spec, tokenizer = get_task("sst2"), load_tokenizer(tokenizer_path)
    _, features = get_adapter(spec).load("train", tokenizer, 64, limit=32)
    torch.manual_seed(0)  # the classifier layer's initialisation; makes the fit below deterministic
    module = build_task_module(RunConfig(kind="finetune", model=model_cfg), get_adapter(spec), state,
                              special_token_ids(tokenizer)["pad"])
    for name, value in module.backbone.state_dict().items():
        torch.testing.assert_close(value, state[name])  # every backbone tensor is the pre-trained one
    # Gradient reaches the backbone through [CLS]'s hidden state alone: 32 real SST-2
    # sentences are fitted (dropout off so the fit is deterministic).
    module.eval()
    batch = module.make_batch(features)
    opt = torch.optim.Adam(module.parameters(), lr=3e-3)
    for _ in range(80):
        loss, metrics = module(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.2 and metrics["accuracy"] == (32, 32), (loss.item(), metrics)


@pytest.mark.parametrize("recipe", ["bert-mini", "spanbert-mini", "electra-mini"])
def test_masking_recipes_refuse_a_t5_vocabulary_in_one_line_before_writing(recipe, wiki_t5_prepared, tmp_path,
                                                                           capsys):
    """A T5 corpus (sentinels, no [MASK]) given to a masked-LM recipe: one message that says what
    is missing and what to do, no traceback, no run folder."""
    run = tmp_path / recipe
    assert main(["pretrain", "--recipe", recipe, "--data", str(wiki_t5_prepared), "--out", str(run),
                 *QUICK_RUN, *with_sets(TINY_MODEL)]) == 1
    err = capsys.readouterr().err
    assert "needs a mask token ([MASK], <mask>), and this corpus's tokenizer has none" in err
    assert "Traceback" not in err and not run.exists()
