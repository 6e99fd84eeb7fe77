"""`ember convert --long N` (ember.interop.long): a trained encoder made long as in Longformer §5,
on tiny random runs and on the real all-MiniLM-L6-v2 checkpoint with real Wikipedia text."""

from __future__ import annotations

import gzip
import re

import pytest
import torch

from conftest import real_data
from ember.cli import main
from ember.config import ModelConfig, RunConfig
from ember.errors import EmberError
from ember.interop.long import lengthen
from ember.models import build_backbone
from ember.runs.checkpoint import load_weights, save_weights
from ember.runs.folder import load_run_config, write_run_files


def tiny(**kw) -> ModelConfig:
    return ModelConfig(**{"vocab_size": 96, "hidden_size": 32, "num_layers": 2, "num_heads": 4,
                          "intermediate_size": 37, "max_position": 16, "dropout": 0.0,
                          "attention_dropout": 0.0, **kw})


def state_of(cfg: ModelConfig) -> dict:
    torch.manual_seed(0)
    return {f"backbone.{k}": v for k, v in build_backbone(cfg).state_dict().items()}


@pytest.mark.parametrize("family,share", [("bert", "none"), ("albert", "all"), ("roberta", "none")])
def test_long_convert_copies_positions_and_local_projections(family, share):
    cfg = tiny(family=family, share_layers=share)
    state = state_of(cfg)
    long_cfg, long_state = lengthen(cfg, state, 40, 8, global_first=1)
    assert (long_cfg.attention, long_cfg.max_position, long_cfg.attention_window) == ("longformer", 40, "8")
    old = state["backbone.embeddings.position.weight"]
    new = long_state["backbone.embeddings.position.weight"]
    assert new.shape == (40, 32)
    torch.testing.assert_close(new[16:32], old, rtol=0, atol=0)  # Longformer §5: the table copied over
    torch.testing.assert_close(new[32:], old[:8], rtol=0, atol=0)
    qkv = state["backbone.layers.0.attention.qkv.weight"]
    torch.testing.assert_close(long_state["backbone.layers.0.attention.key_global.weight"], qkv[32:64], rtol=0, atol=0)
    model = build_backbone(long_cfg)
    model.load_state_dict({k.removeprefix("backbone."): v for k, v in long_state.items()})  # every key fits


def test_long_convert_refuses_what_it_cannot_make_long():
    cfg = tiny()
    with pytest.raises(EmberError, match="shorter than the model's 16 positions"):
        lengthen(cfg, state_of(cfg), 8, 4)
    with pytest.raises(EmberError, match="positive even number"):
        lengthen(cfg, state_of(cfg), 64, 7)
    t5 = tiny(family="t5")
    with pytest.raises(EmberError, match="cannot make this t5 model long.*not family 't5'"):
        lengthen(t5, {}, 64, 8)


def refused(args: list[str], capsys) -> str:
    assert main(args) == 1
    return capsys.readouterr().err


def test_long_convert_cli_from_run_writes_a_long_run_or_nothing(tmp_path, tiny_tokenizer_path, capsys):
    run = tmp_path / "run"
    cfg = tiny()
    write_run_files(run, RunConfig(model=cfg, objective="mlm"), tiny_tokenizer_path)
    save_weights(state_of(cfg), run / "model.safetensors")
    out = tmp_path / "long"
    err = refused(["convert", "--from-run", str(run), "--out", str(out), "--long", "64", "--window", "5"], capsys)
    assert "positive even number" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()  # refused before anything was written
    assert "give --long N" in refused(["convert", "--from-run", str(run), "--out", str(out)], capsys)
    assert "export the long run with --to-hf afterwards" in refused(
        ["convert", "--to-hf", str(run), "--out", str(out), "--long", "64"], capsys)
    assert not out.exists()
    assert main(["convert", "--from-run", str(run), "--out", str(out), "--long", "64", "--window", "4,8",
                 "--global-tokens", "1"]) == 0
    long = load_run_config(out)
    assert (long.model.max_position, long.model.attention_windows, long.model.attention_global) == (64, (4, 8), 1)
    assert (out / "tokenizer.json").is_file()
    # the separator a QA head on the long model reads to put the question under global attention
    from ember.tokenizers import load_tokenizer

    assert cfg.sep_token_id == -1 and long.model.sep_token_id == load_tokenizer(tiny_tokenizer_path).token_to_id("[SEP]")
    assert "backbone.layers.1.attention.value_global.bias" in load_weights(out / "model.safetensors")


def wiki_text(words: int) -> str:
    """The first ``words`` words of real Wikipedia articles (wiki-en/AA/wiki_00.gz), tags removed."""
    with gzip.open(real_data("wiki-en", "AA", "wiki_00.gz"), "rt", encoding="utf-8") as fh:
        text = re.sub(r"<[^>]+>", " ", fh.read(400_000))
    return " ".join(text.split()[:words])


def encode(tokenizer, text: str, length: int) -> torch.Tensor:
    return torch.tensor([tokenizer.encode(text).ids[:length]])


@pytest.fixture(scope="module")
def minilm_runs(tmp_path_factory):
    """all-MiniLM-L6-v2 imported, and made long: 4,096 positions, window 512."""
    minilm = real_data("checkpoints", "all-MiniLM-L6-v2")
    root = tmp_path_factory.mktemp("minilm")
    assert main(["convert", "--from-hf", str(minilm), "--out", str(root / "minilm")]) == 0
    assert main(["convert", "--from-run", str(root / "minilm"), "--out", str(root / "long"), "--long", "4096",
                 "--window", "512"]) == 0
    return root / "minilm", root / "long"


def backbone(run):
    model = build_backbone(load_run_config(run).model).eval()
    model.load_state_dict({k.removeprefix("backbone."): v for k, v in load_weights(run / "model.safetensors").items()})
    return model


def real_ids(run, length: int) -> torch.Tensor:
    from ember.tokenizers import load_tokenizer

    ids = encode(load_tokenizer(run / "tokenizer.json"), wiki_text(6000), length)
    assert ids.shape[1] == length
    return ids


def test_long_convert_minilm_matches_original_on_short_real_text_and_runs_4096_tokens(minilm_runs):
    short, long = (backbone(run) for run in minilm_runs)
    assert long.config.max_position == 4096 and long.config.attention == "longformer"
    ids = real_ids(minilm_runs[1], 4096)
    with torch.no_grad():  # window 512 covers 200 tokens: the original's hidden states
        torch.testing.assert_close(long(ids[:, :200]).last_hidden_state, short(ids[:, :200]).last_hidden_state,
                                   atol=1e-5, rtol=0)
        out = long(ids).last_hidden_state
    assert out.shape == (1, 4096, 384) and torch.isfinite(out).all()


def test_long_convert_minilm_exports_to_transformers_longformer_with_equal_outputs(minilm_runs, tmp_path):
    transformers = pytest.importorskip("transformers")
    from hf_interop_helpers import load_hf

    long_run = minilm_runs[1]
    assert main(["convert", "--to-hf", str(long_run), "--out", str(tmp_path / "hf")]) == 0
    hf = load_hf(transformers.LongformerModel, tmp_path / "hf")
    ids = real_ids(long_run, 700)  # longer than the window: the band and the global row both matter
    glob = torch.zeros_like(ids)
    glob[:, 0] = 1  # [CLS]
    with torch.no_grad():
        ref = hf(input_ids=ids, global_attention_mask=glob).last_hidden_state
        ours = backbone(long_run)(ids, global_attention_mask=glob).last_hidden_state
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)


def test_long_convert_bigbird_adds_no_weights_and_keeps_the_family():
    cfg = tiny(family="electra")
    long_cfg, long_state = lengthen(cfg, state_of(cfg), 64, attention="bigbird", block=4, random_blocks=1)
    assert (long_cfg.family, long_cfg.attention, long_cfg.attention_block) == ("electra", "bigbird", 4)
    assert set(long_state) == set(state_of(cfg))
    with pytest.raises(EmberError, match="attention_block=0 must be >= 1"):
        lengthen(cfg, state_of(cfg), 64, attention="bigbird", block=0)


def test_long_convert_minilm_to_bigbird_on_real_wiki_text_and_transformers_big_bird(minilm_runs, tmp_path):
    transformers = pytest.importorskip("transformers")
    from hf_interop_helpers import load_hf

    minilm, _ = minilm_runs
    bird_run = tmp_path / "bird"
    assert main(["convert", "--from-run", str(minilm), "--out", str(bird_run), "--long", "4096",
                 "--attention", "bigbird", "--block", "64", "--random-blocks", "3"]) == 0
    short, bird = backbone(minilm), backbone(bird_run)
    assert (bird.config.attention, bird.config.max_position) == ("bigbird", 4096)
    ids = real_ids(bird_run, 4096)
    with torch.no_grad():  # 300 <= (5 + 2*3) * 64 tokens: full attention, the original's states
        torch.testing.assert_close(bird(ids[:, :300]).last_hidden_state, short(ids[:, :300]).last_hidden_state,
                                   atol=1e-5, rtol=0)
        out = bird(ids).last_hidden_state
    assert out.shape == (1, 4096, 384) and torch.isfinite(out).all()
    assert main(["convert", "--to-hf", str(bird_run), "--out", str(tmp_path / "hf")]) == 0
    hf = load_hf(transformers.BigBirdModel, tmp_path / "hf")
    assert hf.config.attention_type == "block_sparse"
    with torch.no_grad():  # 1,000 real tokens: block-sparse in both
        ref = hf(input_ids=ids[:, :1000]).last_hidden_state
        ours = bird(ids[:, :1000]).last_hidden_state
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)


def test_long_convert_reformer_shares_the_trained_query_projection_and_refuses_export(tmp_path):
    cfg = tiny(family="roberta")
    state = state_of(cfg)
    long_cfg, long_state = lengthen(cfg, state, 64, attention="reformer", chunk=8, hashes=3)
    assert (long_cfg.attention, long_cfg.attention_chunk, long_cfg.attention_hashes) == ("reformer", 8, 3)
    qkv = state["backbone.layers.1.attention.qkv.weight"]
    torch.testing.assert_close(long_state["backbone.layers.1.attention.query_key.weight"], qkv[:32], rtol=0, atol=0)
    torch.testing.assert_close(long_state["backbone.layers.1.attention.value.bias"],
                               state["backbone.layers.1.attention.qkv.bias"][64:], rtol=0, atol=0)
    assert not any(".qkv." in k for k in long_state)
    model = build_backbone(long_cfg).eval()
    model.load_state_dict({k.removeprefix("backbone."): v for k, v in long_state.items()})  # every key fits
    with torch.no_grad():
        assert torch.isfinite(model(torch.randint(5, 96, (2, 61))).last_hidden_state).all()
    with pytest.raises(EmberError, match="cannot make this roberta model long: model.attention_buckets=3"):
        lengthen(cfg, state, 64, attention="reformer", buckets=3)
    from ember.interop.families import interop_for_model

    with pytest.raises(EmberError, match="model.attention=reformer or model.reversible=true has no transformers"):
        interop_for_model(long_cfg)


def test_long_convert_minilm_to_reformer_runs_4096_real_tokens(minilm_runs, tmp_path):
    minilm, _ = minilm_runs
    run = tmp_path / "reformer"
    assert main(["convert", "--from-run", str(minilm), "--out", str(run), "--long", "4096", "--attention",
                 "reformer", "--chunk", "64", "--hashes", "2"]) == 0
    model = backbone(run)
    assert (model.config.attention, model.config.max_position, model.config.attention_chunk) == ("reformer", 4096, 64)
    ids = real_ids(run, 4096)
    with torch.no_grad():
        out = model(ids).last_hidden_state
    assert out.shape == (1, 4096, 384) and torch.isfinite(out).all()
