"""ELMo (Peters et al. 2018): char CNN, highway, word vocabulary, biLM causality, the bilm
objective on real Wikipedia text, ELMo layers + ScalarMix, the "bank" test, exact resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import real_data
from ember.config import ElmoConfig
from ember.models.elmo import ElmoBiLM, reverse_padded, sentence_layers
from ember.nn.char_cnn import CharCNN
from ember.nn.highway import Highway
from ember.nn.pooling import concat_pool
from ember.nn.scalar_mix import ScalarMix
from ember.tokenizers.words import BOW_CHAR, EOW_CHAR, WordVocab, tokenize_words

TINY = ElmoConfig(char_dim=8, filters="1:8,2:8,3:16", highway_layers=1, max_word_chars=12,
                  projection_dim=16, num_layers=2, hidden_size=24, dropout=0.0, vocab_size=300)
TINY_SETS = ["elmo.char_dim=8", "elmo.filters=1:8,2:8,3:16", "elmo.max_word_chars=12",
             "elmo.projection_dim=16", "elmo.hidden_size=24", "elmo.vocab_size=300",
             "elmo.max_corpus_words=12000", "elmo.valid_every=2", "data.eval_examples=16",
             "train.batch_size=8", "train.log_every=1", "train.warmup_steps=0", "train.num_threads=1"]


# -- char CNN and highway -------------------------------------------------------------------
def test_char_cnn_shapes_and_max_pool_over_time():
    cnn = CharCNN(num_chars=10, char_dim=2, filters=[(1, 3), (2, 4)])
    assert cnn(torch.randint(0, 10, (2, 5, 6))).shape == (2, 5, 7)
    with torch.no_grad():
        cnn.embed.weight.zero_()
        cnn.embed.weight[3] = torch.tensor([1.0, 0.0])  # char 3 lights up dim 0
        cnn.embed.weight[4] = torch.tensor([0.0, 2.0])  # char 4 lights up dim 1
        for conv in cnn.convs:
            conv.weight.zero_()
            conv.bias.zero_()
        cnn.convs[0].weight[0, 0, 0] = 1.0  # width-1 filter 0: "is there a 3"
        cnn.convs[1].weight[0, 0, 0] = 1.0  # width-2 filter 0: "3 followed by 4"
        cnn.convs[1].weight[0, 1, 1] = 1.0
    words = torch.tensor([[3, 4, 0, 0, 0, 0], [0, 0, 0, 3, 4, 0], [4, 3, 0, 0, 0, 0], [1, 2, 1, 2, 1, 2]])
    out = cnn(words)
    # max over time: the n-gram is found wherever it sits in the word
    assert out[0, 0] == 1.0 and out[1, 0] == 1.0 and out[2, 0] == 1.0 and out[3, 0] == 0.0
    assert out[0, 3] == 3.0 and out[1, 3] == 3.0  # 1 (char 3 at t) + 2 (char 4 at t+1)
    assert out[2, 3] == 1.0  # "4 3" then padding: at best the 3 as the bigram's first half
    assert out[3, 3] == 0.0


def test_char_cnn_rejects_words_shorter_than_widest_filter():
    from ember.errors import EmberError

    with pytest.raises(EmberError, match="widest filter"):
        CharCNN(10, 2, [(4, 3)])(torch.zeros(1, 3, dtype=torch.long))


def test_highway_is_gated_mix_of_transform_and_carry():
    torch.manual_seed(0)
    hw = Highway(6, num_layers=1)
    x = torch.randn(4, 6)
    t = torch.sigmoid(hw.gates[0](x))
    expected = t * torch.relu(hw.transforms[0](x)) + (1 - t) * x
    torch.testing.assert_close(hw(x), expected)
    with torch.no_grad():
        hw.gates[0].bias.fill_(-50.0)  # gate closed: carry the input unchanged
    torch.testing.assert_close(hw(x), x)


# -- words and characters --------------------------------------------------------------------
def test_tokenize_words_splits_punctuation_and_clitics():
    assert tokenize_words("It's the U.S. bank-account, isn't it?") == [
        "It", "'s", "the", "U", ".", "S", ".", "bank", "-", "account", ",", "is", "n't", "it", "?"]
    # the GLUE SST-2 text is already split this way: tokenizing it again changes nothing
    assert tokenize_words("it 's a charming journey . ") == ["it", "'s", "a", "charming", "journey", "."]


def test_word_vocab_and_char_ids_on_real_text(tmp_path):
    from ember.data.word_corpus import WordCorpus

    corpus = WordCorpus(real_data("wiki-en", "AA", "wiki_00.gz"), max_words=40, max_corpus_words=20000)
    vocab = WordVocab.build(corpus.counts, 500, max_word_chars=12)
    assert vocab.words[:3] == ["<unk>", "<s>", "</s>"] and len(vocab) == 500
    top = sorted(corpus.counts, key=lambda w: -corpus.counts[w])[:5]
    assert all(vocab.word_id(w) < 10 for w in top)  # most frequent words come first
    rare = min(corpus.counts, key=lambda w: (corpus.counts[w], w))
    assert vocab.word_id(rare) == vocab.unk_id or corpus.counts[rare] > 0
    assert vocab.word_id("zzqxjv-not-a-word") == vocab.unk_id
    ids = vocab.char_ids("café")
    assert ids[0] == BOW_CHAR and bytes(int(c) - 1 for c in ids[1:6]).decode() == "café"
    assert ids[6] == EOW_CHAR and not ids[7:].any()
    long = vocab.char_ids("internationalization")  # 20 letters, 10 slots left for them
    assert bytes(int(c) - 1 for c in long[1:11]).decode() == "internatio" and long[11] == EOW_CHAR
    assert not np.array_equal(vocab.char_ids("<s>"), vocab.char_ids("</s>"))
    vocab.save(tmp_path / "words.json")
    again = WordVocab.load(tmp_path / "words.json")
    assert again.words == vocab.words and again.max_word_chars == 12
    # a real sentence: <s> words </s>, one char row per word
    data = corpus.dataset("train", vocab)
    chars, word_ids = data.example(0)
    assert word_ids[0] == vocab.bos_id and word_ids[-1] == vocab.eos_id and chars.shape == (len(word_ids), 12)


def test_lowercase_vocab_normalizes_lookups():
    vocab = WordVocab(["<unk>", "<s>", "</s>", "bank"], lowercase=True, max_word_chars=10)
    assert vocab.word_id("Bank") == 3 and np.array_equal(vocab.char_ids("BANK"), vocab.char_ids("bank"))
    assert vocab.words_of("Open a Bank") == ["open", "a", "bank"]


# -- the biLM ------------------------------------------------------------------------------
def _chars(vocab: WordVocab, sentences: list[list[str]]):
    encoded = [vocab.encode_sentence(s) for s in sentences]
    t = max(len(ids) for _, ids in encoded)
    chars = torch.zeros(len(encoded), t, vocab.max_word_chars, dtype=torch.long)
    mask = torch.zeros(len(encoded), t, dtype=torch.long)
    for i, (ch, ids) in enumerate(encoded):
        chars[i, : len(ids)] = torch.from_numpy(ch.astype(np.int64))
        mask[i, : len(ids)] = 1
    return chars, mask


def tiny_vocab():
    return WordVocab(["<unk>", "<s>", "</s>"], max_word_chars=TINY.max_word_chars)


def test_reverse_padded_reverses_within_each_length():
    x = torch.arange(8.0).view(2, 4, 1)
    out = reverse_padded(x, torch.tensor([4, 2]))
    assert out[:, :, 0].tolist() == [[3, 2, 1, 0], [5, 4, 6, 7]]
    torch.testing.assert_close(reverse_padded(out, torch.tensor([4, 2])), x)


def test_elmo_forward_lm_cannot_see_future_and_backward_cannot_see_past():
    torch.manual_seed(0)
    model = ElmoBiLM(TINY).eval()
    vocab = tiny_vocab()
    base = "the cat sat on the mat today".split()
    future = base[:3] + "under a green tree yesterday".split()  # same up to word 3
    past = "a dog once ran".split() + base[4:]  # same from word 4 on ("the mat today")
    chars, mask = _chars(vocab, [base, future, past])
    out = model(chars, mask)
    k = 3 + 1  # position of "sat"... +1 for <s>: positions 0..3 are <s> the cat sat
    for f in out.forward:
        torch.testing.assert_close(f[0, :k], f[1, :k])  # no peeking at the future
        assert not torch.allclose(f[0, k:9], f[1, k:9])
    n_same = len(base) - 4 + 1  # "the mat today </s>"
    for b in out.backward:
        torch.testing.assert_close(b[0, -n_same:], b[2, -n_same:])  # no peeking at the past
        assert not torch.allclose(b[0, : -n_same], b[2, : -n_same])
    # padding a sentence (batched with a longer one) changes none of its vectors
    short_chars, short_mask = _chars(vocab, [base[:3]])
    alone = model(short_chars, short_mask)
    padded = model(*_chars(vocab, [base[:3], base]))
    for a, b in zip(alone.forward + alone.backward, padded.forward + padded.backward):
        torch.testing.assert_close(a[0], b[0, :5], atol=1e-6, rtol=1e-5)


def test_elmo_layers_are_token_then_fwd_bwd_and_scalar_mix_combines_them():
    torch.manual_seed(0)
    model = ElmoBiLM(TINY).eval()
    chars, mask = _chars(tiny_vocab(), [["some", "words", "here"]])
    layers = model.layers(chars, mask)
    p = TINY.projection_dim
    assert len(layers) == TINY.num_layers + 1 and all(h.shape == (1, 5, 2 * p) for h in layers)
    torch.testing.assert_close(layers[0][..., :p], layers[0][..., p:])  # [x; x]
    out = model(chars, mask)
    torch.testing.assert_close(layers[2], torch.cat([out.forward[1], out.backward[1]], -1))
    mix = ScalarMix(len(layers))
    with torch.no_grad():
        mix.weights.copy_(torch.tensor([-30.0, -30.0, 30.0]))  # all weight on the top layer
        mix.gamma.fill_(2.0)
    torch.testing.assert_close(mix(layers, mask), 2.0 * layers[2], atol=1e-5, rtol=1e-5)


def test_elmo_bank_contextual_vectors_differ_static_layer_same():
    torch.manual_seed(0)
    model = ElmoBiLM(TINY).eval()
    vocab = tiny_vocab()
    account, river = sentence_layers(model, vocab, ["open a bank account", "on the river bank"])
    a, r = account[2], river[3]  # "bank": (L+1, 2P)
    torch.testing.assert_close(a[0], r[0])  # token layer: context-free, same vector
    for j in range(1, TINY.num_layers + 1):
        assert not torch.allclose(a[j], r[j], atol=1e-4)  # biLSTM layers: context changes them


def test_concat_pool_is_last_max_mean_over_real_tokens():
    h = torch.tensor([[[1.0, -1.0], [3.0, -2.0], [2.0, 5.0]], [[4.0, 0.0], [9.0, 9.0], [9.0, 9.0]]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    out = concat_pool(h, mask)
    expected = torch.tensor([[2.0, 5.0, 3.0, 5.0, 2.0, 2.0 / 3.0], [4.0, 0.0, 4.0, 0.0, 4.0, 0.0]])
    torch.testing.assert_close(out, expected)
    # a bidirectional LSTM passes its own h_T (forward at the end, backward at the start)
    last = torch.tensor([[7.0, 7.0], [8.0, 8.0]])
    torch.testing.assert_close(concat_pool(h, mask, last=last)[:, :2], last)


# -- training: the objective, the CLI and exact resume -------------------------------------
@pytest.mark.slow
def test_bilm_loss_goes_down_on_real_wiki_text():
    from ember.config import RunConfig
    from ember.data.word_corpus import WordCorpus
    from ember.objectives import build_objective

    corpus = WordCorpus(real_data("wiki-en", "AA", "wiki_00.gz"), max_words=30, max_corpus_words=12000,
                        valid_every=2)
    vocab = WordVocab.build(corpus.counts, 300, max_word_chars=TINY.max_word_chars)
    train, valid = corpus.dataset("train", vocab), corpus.dataset("valid", vocab)
    torch.manual_seed(0)
    module = build_objective(RunConfig(objective="bilm", elmo=TINY), {"vocab_size": len(vocab)})
    rng = np.random.default_rng(0)
    held_out = module.make_batch([valid.example(i) for i in range(min(32, len(valid)))], rng)

    def valid_loss():
        module.eval()
        with torch.no_grad():
            return module(held_out)[1]

    before = valid_loss()
    opt = torch.optim.Adam(module.parameters(), lr=3e-3)
    module.train()
    order = np.random.default_rng(1).permutation(len(train))
    for step in range(40):
        batch = module.make_batch([train.example(int(i)) for i in order[step * 8 : step * 8 + 8]], rng)
        loss, _ = module(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        module.train()
    after = valid_loss()
    for name in ("fwd_loss", "bwd_loss"):
        b, a = before[name][0] / before[name][1], after[name][0] / after[name][1]
        assert a < b - 1.0, (name, b, a)  # from ~log(300) = 5.7 down by more than a nat


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _pretrain_cmd(run, steps: int) -> list[str]:
    cmd = [sys.executable, "-m", "ember", "pretrain", "--recipe", "elmo-mini", "--data",
           str(real_data("wiki-en", "AA", "wiki_00.gz")), "--out", str(run), "--max-steps", str(steps),
           "--no-progress", "--set", "train.save_every=3", "--set", "train.eval_every=3"]
    for s in TINY_SETS:
        cmd += ["--set", s]
    return cmd


@pytest.fixture(scope="module")
def elmo_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("elmo") / "run"
    done = subprocess.run(_pretrain_cmd(run, 6), env=_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return run


def test_elmo_pretrain_cli_writes_run_and_held_out_perplexity(elmo_run):
    records = [json.loads(line) for line in (elmo_run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["split"] == "eval"]
    assert [r["step"] for r in evals] == [3, 6]
    assert all(r["fwd_ppl"] > 1 and r["bwd_ppl"] > 1 for r in evals)
    assert (elmo_run / "words.json").is_file() and (elmo_run / "model.safetensors").is_file()
    from ember.models.elmo import load_elmo

    model, vocab = load_elmo(elmo_run)
    assert len(vocab) == 300 and model.cfg.projection_dim == 16


@pytest.mark.slow
def test_elmo_pretrain_resume_is_exact(elmo_run, tmp_path):
    """Killed (SIGKILL) after its step-3 checkpoint, then resumed: same weights at step 6."""
    from run_helpers import kill_after_checkpoint

    from ember.runs.checkpoint import load_weights

    run = tmp_path / "run"
    cmd = _pretrain_cmd(run, 6)
    kill_after_checkpoint(cmd, run, 3)
    resumed = subprocess.run(cmd + ["--resume"], env=_env(), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout
    a, b = load_weights(elmo_run / "model.safetensors"), load_weights(run / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)


@pytest.mark.slow
def test_elmo_features_cli_trains_with_and_without_elmo(elmo_run, tmp_path):
    real_data("glue", "SST-2", "train.tsv")
    for flag, name in (([], "elmo"), (["--no-elmo"], "static")):
        out = tmp_path / name
        done = subprocess.run([sys.executable, "-m", "ember", "elmo-features", "--elmo", str(elmo_run),
                               "--task", "sst2", "--out", str(out), "--train-limit", "64", "--epochs", "1",
                               "--hidden-size", "16", "--embedding-dim", "16", "--no-progress", *flag],
                              env=_env(), capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        result = json.loads((out / "results.json").read_text())
        assert result["use_elmo"] == (name == "elmo") and 0.0 <= result["best_dev"] <= 1.0
        assert result["metric"] == "accuracy"
        assert result["dev_examples"] == 872 and (out / "model.safetensors").is_file()
        assert ("layer_weights" in result) == (name == "elmo")
    # the same command again: refused before the features are computed (no progress, no ELMo pass)
    again = subprocess.run([sys.executable, "-m", "ember", "elmo-features", "--elmo", str(elmo_run), "--task", "sst2",
                            "--out", str(tmp_path / "elmo"), "--train-limit", "64"], env=_env(), capture_output=True,
                           text=True)
    assert again.returncode == 1 and "already holds a run" in again.stderr and "ELMo features" not in again.stderr


@pytest.mark.slow
def test_elmo_tagger_scores_conll_entities(elmo_run, tmp_path):
    """The same task model as a CoNLL-2003 tagger over frozen ELMo features (entity F1 on dev)."""
    real_data("conll2003", "train.txt")
    from ember.train.elmo_features import run_elmo_features

    result = run_elmo_features("conll2003", tmp_path / "ner", str(elmo_run), train_limit=32, epochs=1,
                               batch_size=16, embedding_dim=8, hidden_size=8, progress=False)
    assert result["metric"] == "f1" and result["dev_examples"] == 3250
    assert 0.0 <= result["best_dev"] <= 1.0 and len(result["layer_weights"]) == 3
    metrics = [json.loads(line) for line in (tmp_path / "ner" / "metrics.jsonl").read_text().splitlines()]
    assert {"precision", "recall", "f1", "token_accuracy"} <= set(metrics[-1])
