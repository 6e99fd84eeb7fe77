"""BART and MASS pre-training: batches from real Wikipedia blocks, losses equal to transformers'
on the same weights, MASS's two limits (Song et al. 2019, §2.3), the recipes, and `ember
pretrain --recipe bart-mini` on real text (loss falls; the run exports and generates as
transformers does)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember.config import apply_overrides, load_yaml, run_config_from_dict
from ember.errors import EmberError
from ember.objectives.mass import mass_example
from ember.recipes import recipe_path

TINY = ["model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64", "model.num_layers=2",
        "model.max_position=64", "data.max_seq_length=64", "data.eval_examples=32", "train.batch_size=8",
        "train.grad_accum=1", "train.log_every=1", "train.eval_every=0", "train.save_every=0",
        "train.num_threads=1", "train.lr=3e-3"]


def recipe(name: str, prepared, *extra: str):
    return run_config_from_dict(apply_overrides(load_yaml(recipe_path(name)),
                                                TINY + [f"data.prepared={prepared}", *extra]), where=name)


def objective(name: str, prepared, *extra: str):
    from ember.objectives import build_objective
    from ember.tokenizers import load_tokenizer, special_token_ids

    cfg = recipe(name, prepared, "model.vocab_size=1000", *extra)
    tok = prepared / "tokenizer.json"
    return build_objective(cfg, {**special_token_ids(load_tokenizer(tok)), "tokenizer_path": str(tok)})


def test_bart_batches_of_real_blocks_are_noised_inputs_and_original_targets(wiki_bpe):
    from ember.data.shards import TokenCorpus

    module = objective("bart-mini", wiki_bpe, "noising.unit=token")  # the recipe's word units: below
    data = module.build_dataset(TokenCorpus(wiki_bpe, "train"), None, 0)
    blocks = [data.example(i) for i in (0, 1, 7, 30)]
    batch = module.make_batch(blocks, np.random.default_rng(0))
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    for r, block in enumerate(blocks):
        n_in, n_out = int(mask[r].sum()), int((labels[r] != -100).sum())
        assert labels[r, :n_out].tolist() == [0, *block.tokens.tolist(), 2]  # <s> document </s>
        assert ids[r, 0] == 0 and ids[r, n_in - 1] == 2 and (ids[r, n_in:] == 1).all()  # <s> ... </s> <pad>..
        body = ids[r, 1:n_in - 1].numpy()
        masks = int((body == 4).sum())
        assert n_in - 2 == len(block.tokens) - np.ceil(0.3 * len(block.tokens)) + masks  # one <mask> per span
        assert (labels[r, n_out:] == -100).all()
    again = module.make_batch(blocks, np.random.default_rng(1))
    assert torch.equal(again["labels"], labels) and not torch.equal(again["input_ids"], ids)  # dynamic noise
    words = objective("bart-mini", wiki_bpe)  # noising.unit=word: a <mask> never splits a word
    batch = words.make_batch(blocks, np.random.default_rng(0))
    continues = words.noise.continues_word
    for r in range(len(blocks)):
        row = batch["input_ids"][r, 1:int(batch["attention_mask"][r].sum())].numpy()  # after <s>, up to </s>
        after_mask = row[1:][row[:-1] == 4]
        assert not continues[after_mask[after_mask != 4]].any()


def test_bart_and_mass_losses_equal_transformers_loss():
    """The objectives' batches through ember and BartForConditionalGeneration on the same weights:
    the same mean cross-entropy (MASS passes its masked decoder inputs to both)."""
    from bart_helpers import EOS, ember_from_hf, tiny_hf_bart

    from ember.config import NoisingConfig
    from ember.data.sentence_blocks import SentenceBlock
    from ember.objectives.bart import BartDenoising, BartNoise
    from ember.objectives.mass import MassObjective

    hf = tiny_hf_bart(seed=21)
    rng = np.random.default_rng(0)
    blocks = [SentenceBlock(rng.integers(5, 99, n), np.array([n // 2, n])) for n in (20, 13, 30)]
    bart = BartDenoising(ember_from_hf(hf), BartNoise(NoisingConfig(kinds="infill,permute,rotate"), 4,
                                                      np.arange(5, 99)), 0, EOS, 1, 38)
    mass = MassObjective(ember_from_hf(hf), 0.5, 4, EOS, 1, 39)
    for module in (bart, mass):
        batch = module.make_batch(blocks, np.random.default_rng(3))
        extra = {k: batch[k] for k in ("decoder_input_ids", "decoder_attention_mask") if k in batch}
        with torch.no_grad():
            loss, metrics = module.eval()(batch)
            ref = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"],
                     **extra).loss
        torch.testing.assert_close(loss, ref, atol=1e-5, rtol=0)
        assert metrics["loss"][1] == int((batch["labels"] != -100).sum())


def test_mass_fragment_is_half_the_sentence_with_decoder_inputs_at_their_positions():
    x = np.arange(10, 30)  # m = 20
    source, decoder, labels = mass_example(x, 0.5, 4, 2, np.random.default_rng(5))
    (frag,) = np.nonzero(labels != -100)
    u, v = int(frag[0]), int(frag[-1]) + 1
    assert v - u == 10 and np.array_equal(frag, np.arange(u, v))  # k = 50% of m, contiguous
    assert source.tolist() == [*x[:u], *[4] * 10, *x[v:], 2]  # the fragment masked in the encoder
    assert labels[u:v].tolist() == x[u:v].tolist()
    expected = np.full(20, 4)
    expected[u + 1:v] = x[u:v - 1]  # shifted right inside the fragment, [M] elsewhere
    assert decoder.tolist() == expected.tolist()
    starts = {int(np.nonzero(mass_example(x, 0.5, 4, 2, np.random.default_rng(s))[2] != -100)[0][0]) for s in range(30)}
    assert len(starts) > 5  # the fragment's start is drawn


def test_mass_limits_k1_is_bert_mlm_and_k_m_is_a_language_model():
    """§2.3: k = 1 predicts one masked token from the encoder alone (every decoder input [M]), as
    BERT's MLM; k = m masks the whole encoder input and the decoder reads the sequence shifted
    right, as GPT's LM."""
    x = np.arange(10, 30)
    source, decoder, labels = mass_example(x, 1 / 20, 4, 2, np.random.default_rng(0))
    assert (labels != -100).sum() == 1 and (decoder == 4).all()
    (u,) = np.nonzero(labels != -100)[0]
    assert source[u] == 4 and (np.delete(source[:-1], u) == np.delete(x, u)).all()
    source, decoder, labels = mass_example(x, 1.0, 4, 2, np.random.default_rng(0))
    assert (source[:-1] == 4).all() and source[-1] == 2
    assert decoder.tolist() == [4, *x[:-1]] and labels.tolist() == x.tolist()


def test_mass_fragment_is_80_percent_mask_10_random_10_unchanged_in_the_encoder():
    """BERT's replacement, which MASS keeps: of 10,000 fragment tokens, [M] 80%, a random token of
    the vocabulary 10%, unchanged 10% (binomial sd <= 0.4 points: 2 points of tolerance); the
    decoder's inputs and the targets are the original fragment whatever the encoder sees."""
    from ember.objectives.mass import MassObjective

    x = np.arange(10, 1010)  # m = 1000, k = 500
    vocab, seen = 5000, {"mask": 0, "random": 0, "kept": 0}
    randoms = []
    for seed in range(20):
        source, decoder, labels = mass_example(x, 0.5, 4, 2, np.random.default_rng(seed), 0.8, 0.1, vocab)
        (frag,) = np.nonzero(labels != -100)
        u, v = int(frag[0]), int(frag[-1]) + 1
        assert (source[:u] == x[:u]).all() and (source[v:-1] == x[v:]).all() and source[-1] == 2
        assert labels[u:v].tolist() == x[u:v].tolist()
        expected = np.full(1000, 4)
        expected[u + 1:v] = x[u:v - 1]
        assert decoder.tolist() == expected.tolist()
        got = source[u:v]
        # a random draw equal to the token itself or to [M] (2 in 5,000) counts as kept / masked
        seen["mask"] += int((got == 4).sum())
        seen["kept"] += int((got == x[u:v]).sum())
        swapped = (got != 4) & (got != x[u:v])
        seen["random"] += int(swapped.sum())
        randoms += got[swapped].tolist()
    total = sum(seen.values())
    assert total == 20 * 500
    assert abs(seen["mask"] / total - 0.8) < 0.02, seen
    assert abs(seen["random"] / total - 0.1) < 0.02 and abs(seen["kept"] / total - 0.1) < 0.02, seen
    assert min(randoms) >= 0 and max(randoms) < vocab and len(set(randoms)) > 500  # spread over the vocabulary
    with pytest.raises(EmberError, match="mass_mask_prob"):
        MassObjective(torch.nn.Identity(), 0.5, 4, 2, 1, 39, mask_prob=0.8, random_prob=0.3)


def test_mass_recipe_batches_of_real_blocks_replace_the_fragment_80_10_10(wiki_bpe):
    """mass-mini on real Wikipedia blocks: the recipe's objective keeps 80/10/10 in the encoder
    (over the fragment tokens of 200 blocks: shares within 3 points), the decoder reads and the
    labels hold the original fragment."""
    from ember.data.shards import TokenCorpus

    module = objective("mass-mini", wiki_bpe)
    assert (module.mask_prob, module.random_prob) == (0.8, 0.1)
    data = module.build_dataset(TokenCorpus(wiki_bpe, "train"), None, 0)
    blocks = [data.example(i) for i in range(200)]
    batch = module.make_batch(blocks, np.random.default_rng(0))
    masked = kept = total = 0
    for r, block in enumerate(blocks):
        x = torch.as_tensor(block.tokens)
        frag = (batch["labels"][r] != -100).nonzero().squeeze(1)
        u, v = int(frag[0]), int(frag[-1]) + 1
        assert torch.equal(batch["labels"][r, u:v], x[u:v]) and torch.equal(batch["decoder_input_ids"][r, u + 1:v],
                                                                             x[u:v - 1])
        got = batch["input_ids"][r, u:v]
        masked, kept, total = masked + int((got == 4).sum()), kept + int((got == x[u:v]).sum()), total + v - u
    assert total > 4000  # binomial sd of the shares <= 0.7 points: 3 points is > 4 sd
    assert abs(masked / total - 0.8) < 0.03 and abs(kept / total - 0.1) < 0.03, (masked, kept, total)


@pytest.mark.slow
def test_bart_clear_errors_nothing_written(wiki_t5_prepared, tmp_path, capsys):
    """A tokenizer without a mask token, a corpus without sentence boundaries asked to permute,
    and a T5 model: one EmberError line each, no run folder."""
    from conftest import real_data

    from ember.cli import main
    from ember.data.prepare import prepare_corpus

    run = tmp_path / "run"
    assert main(["pretrain", "--recipe", "bart-mini", "--data", str(wiki_t5_prepared), "--out", str(run),
                 "--max-steps", "2", "--no-progress", *[a for s in TINY for a in ("--set", s)]]) == 1
    err = capsys.readouterr().err
    assert "objective bart needs a mask token" in err and "Traceback" not in err and not run.exists()

    from ember.data.sentences import split_sentences

    sst = real_data("glue", "SST-2", "dev.tsv")  # real sentences, one per document
    texts = [line.split("\t")[0] for line in sst.read_text().splitlines()[1:400]]
    lines = tmp_path / "sentences.txt"
    lines.write_text("\n".join(t for t in texts if len(split_sentences(t)) == 1))
    tok = tmp_path.parent / "tokenizer.json"
    from ember.tokenizers import train_tokenizer

    train_tokenizer([lines], kind="bpe", vocab_size=400, lowercase=False, progress=False).save(str(tok))
    prepare_corpus([lines], tok, tmp_path / "sst", fmt="lines", valid_fraction=0.05, progress=False)
    tiny = [a for s in TINY for a in ("--set", s)]
    assert main(["pretrain", "--recipe", "bart-mini", "--data", str(tmp_path / "sst"), "--out", str(run),
                 "--max-steps", "2", "--no-progress", *tiny]) == 1
    err = capsys.readouterr().err
    assert "no sentence boundaries" in err and "Traceback" not in err and not run.exists()
    assert main(["pretrain", "--recipe", "bart-mini", "--data", str(tmp_path / "sst"), "--out", str(run),
                 "--set", "model.preset=t5-tiny", "--max-steps", "2", "--no-progress", *tiny]) == 1
    assert "needs a BART-style encoder-decoder" in capsys.readouterr().err and not run.exists()


@pytest.mark.parametrize("name", ["bart-mini", "bart-base", "mass-mini"])
def test_bart_recipes_load_with_the_papers_settings(name):
    from ember.config import model_preset

    cfg = run_config_from_dict(load_yaml(recipe_path(name)), where=name)
    assert cfg.model == model_preset("bart-base" if name == "bart-base" else "bart-mini")
    assert cfg.objective == ("mass" if name == "mass-mini" else "bart")
    t = cfg.train
    assert (t.adam_beta2, t.adam_eps, t.weight_decay, t.schedule) == (0.98, 1e-6, 0.01, "linear")  # RoBERTa's
    if cfg.objective == "bart":  # §5.1: infilling of 30% in Poisson(3) spans + permutation of all sentences
        n = cfg.noising
        assert (n.kinds, n.mask_ratio, n.poisson_lambda, n.permute_ratio, n.unit) == ("infill,permute", 0.3, 3.0, 1.0,
                                                                                       "word")
    else:
        assert cfg.noising.mass_ratio == 0.5  # §4.1: k = 50% of m


# -- end to end on real text ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def bart_run(wiki_bpe, tmp_path_factory):
    from run_helpers import train_losses

    from ember.train.pretrain import run_pretraining

    run = tmp_path_factory.mktemp("bart-mini") / "run"
    run_pretraining(recipe("bart-mini", wiki_bpe, "train.max_steps=60", "model.vocab_size=1000"), run, progress=False)
    return run, train_losses(run)


@pytest.mark.slow
def test_bart_pretrain_recipe_trains_on_real_wiki_and_the_loss_falls(bart_run):
    from ember.runs.folder import load_run_config

    run, losses = bart_run
    assert sorted(losses) == list(range(1, 61))
    first, last = np.mean([losses[s] for s in range(1, 11)]), np.mean([losses[s] for s in range(51, 61)])
    assert last < first - 0.5, (first, last)  # from ~ln(1000) = 6.9 towards the frequent pieces
    cfg = load_run_config(run)
    assert (cfg.objective, cfg.model.family, cfg.model.decoder_start_token_id, cfg.model.pad_token_id) == ("bart", "bart", 2, 1)


@pytest.mark.slow
def test_bart_trained_run_exports_and_generates_as_transformers(bart_run, tmp_path):
    """The pre-trained run, exported with `ember convert --to-hf`: transformers' generate on a
    real sentence (greedy and beam 4, no repeated 3-grams, at least 5 tokens) gives ember's tokens."""
    transformers = pytest.importorskip("transformers")
    from ember.interop.convert import export_hf
    from ember.seq2seq_generation import Seq2SeqGenerationConfig, load_seq2seq_lm, seq2seq_generate_ids

    run, _ = bart_run
    out = export_hf(run, tmp_path / "hf")
    hf = transformers.BartForConditionalGeneration.from_pretrained(out).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    model, ember_tok = load_seq2seq_lm(run)
    text = ["The city is the capital of the region and lies on the river.", "He was born in 1950."]
    encoded = [ember_tok.encode(t).ids for t in text]
    assert encoded == [tok(t)["input_ids"] for t in text] and encoded[0][0] == 0 and encoded[0][-1] == 2
    batch = tok(text, return_tensors="pt", padding=True)
    for opts in (dict(max_new_tokens=12), dict(max_new_tokens=12, num_beams=4, no_repeat_ngram_size=3, min_new_tokens=5)):
        with torch.no_grad():
            ref = hf.generate(**batch, do_sample=False, **opts)
        ref = [r[1:][:r[1:].index(2)] if 2 in r[1:] else r[1:] for r in ref.tolist()]  # after the start </s>, up to the next
        assert seq2seq_generate_ids(model, encoded, Seq2SeqGenerationConfig(**opts), 2) == ref


@pytest.mark.slow
def test_bart_generate_cli_on_the_trained_run(bart_run, capsys):
    """`ember generate RUN --input ...` decodes a BART run from </s> and prints what
    seq2seq_generate_text writes, with the decoding constraints passed through."""
    from ember.cli import main
    from ember.seq2seq_generation import Seq2SeqGenerationConfig, load_seq2seq_lm, seq2seq_generate_text

    run, _ = bart_run
    text = "The river <mask> through the city."
    args = ["--max-new-tokens", "10", "--num-beams", "2", "--no-repeat-ngram-size", "2", "--min-new-tokens", "4"]
    assert main(["generate", str(run), "--input", text, *args]) == 0
    printed = capsys.readouterr().out.strip()
    model, tok = load_seq2seq_lm(run)
    cfg = Seq2SeqGenerationConfig(max_new_tokens=10, num_beams=2, no_repeat_ngram_size=2, min_new_tokens=4)
    (expected,) = seq2seq_generate_text(model, tok, [text], cfg)
    assert printed == expected.strip() and len(tok.encode(expected, add_special_tokens=False).ids) >= 3
