"""Any encoder checkpoint in: HF folders of every encoder family, with or without a head, and
sentence-transformers folders, through `ember convert` and `--init`, then embeddings out that
equal transformers' own hidden states pooled the checkpoint's way. Bad folders: one clear
message each, and nothing written. (Tiny random models built locally; the real checkpoint is
in test_minilm_checkpoint.py.)"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from hf_interop_helpers import perturb  # noqa: E402

from ember.cli import main as ember_main  # noqa: E402
from ember.errors import EmberError  # noqa: E402

TEXTS = ["the w1 w2 a w3s", "w4 w5 w6 w7 w8 the w9 w10 w11", "a w12"]
SIZES = dict(vocab_size=98, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
             max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def tiny(arch: str):
    """A tiny HF model of class ``arch``, its weights moved off their init."""
    torch.manual_seed(0)
    if arch.startswith("Bert"):
        config = transformers.BertConfig(**SIZES)
    elif arch.startswith("Roberta"):  # the WordPiece test vocabulary pads with id 0
        config = transformers.RobertaConfig(**{**SIZES, "max_position_embeddings": 66}, type_vocab_size=1,
                                            pad_token_id=0)
    elif arch.startswith("Albert"):
        config = transformers.AlbertConfig(**SIZES, embedding_size=16)
    elif arch.startswith("Electra"):
        config = transformers.ElectraConfig(**SIZES, embedding_size=24)
    else:
        config = transformers.DistilBertConfig(vocab_size=98, dim=32, n_layers=2, n_heads=4, hidden_dim=37,
                                               max_position_embeddings=64, dropout=0.0, attention_dropout=0.0)
    return perturb(getattr(transformers, arch)(config))


def hf_folder(model, folder, tokenizer_path):
    model.save_pretrained(folder)
    shutil.copyfile(tokenizer_path, folder / "tokenizer.json")
    return folder


def hf_vectors(model, tokenizer_path, texts, pooling="mean", normalize=False, max_length=512):
    """Pooled last-layer states computed from transformers' own outputs (the reference)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    tok.enable_truncation(max_length)
    encoded = [tok.encode(t).ids for t in texts]
    width = max(map(len, encoded))
    ids = torch.zeros(len(texts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(encoded):
        ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
    inputs = {"input_ids": ids, "attention_mask": mask}
    if model.config.model_type != "distilbert":
        inputs["token_type_ids"] = torch.zeros_like(ids)
    with torch.no_grad():
        states = model(**inputs, output_hidden_states=True).hidden_states[-1]  # (B, T, H)
    if pooling == "cls":
        vectors = states[:, 0]
    else:
        m = mask[..., None].float()
        vectors = (states * m).sum(1) / m.sum(1)
    if normalize:
        vectors = torch.nn.functional.normalize(vectors, dim=-1)
    return vectors.numpy()


def convert(folder, out) -> None:
    assert ember_main(["convert", "--from-hf", str(folder), "--out", str(out)]) == 0


def write_sentence_transformers(folder, pooling="mean", normalize=True, max_length=None, sub="", extra=()):
    modules = [{"idx": 0, "name": "0", "path": sub, "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    modules += list(extra)
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    chosen = {"mean": "mean_tokens", "cls": "cls_token", "max": "max_tokens"}[pooling]
    flags = {f"pooling_mode_{m}": m == chosen for m in ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens")}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **flags}))
    if max_length:
        (folder / sub / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_length,
                                                                            "do_lower_case": False}))
    return folder


ARCHITECTURES = ["BertModel", "BertForMaskedLM", "RobertaModel", "AlbertModel", "ElectraModel",
                 "ElectraForPreTraining", "DistilBertModel"]


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_encoder_checkpoint_with_or_without_head_embeds_like_transformers(arch, tmp_path, tiny_tokenizer_path):
    import ember
    from ember.runs.checkpoint import load_weights
    from ember.runs.init import backbone_weights, load_init
    from ember.serve.predictor import load_predictor

    model = tiny(arch)
    convert(hf_folder(model, tmp_path / "hf", tiny_tokenizer_path), tmp_path / "run")
    assert not (tmp_path / "run" / "embedding.json").exists()  # a plain HF folder: mean, unnormalised
    got = ember.embed(tmp_path / "run", TEXTS)
    np.testing.assert_allclose(got, hf_vectors(model, tiny_tokenizer_path, TEXTS), atol=1e-5, rtol=0)
    assert "/embed" in load_predictor(tmp_path / "run").endpoints  # what `ember serve RUN` serves
    init = load_init(tmp_path / "hf")  # --init of the HF folder itself: the same backbone weights
    imported = backbone_weights(load_weights(tmp_path / "run" / "model.safetensors"))
    assert init.state.keys() == imported.keys()
    assert all(torch.equal(init.state[k], imported[k]) for k in imported)


def test_checkpoint_without_mlm_head_serves_embed_and_refuses_fill_mask_at_the_verb(tmp_path, tiny_tokenizer_path,
                                                                                    capsys):
    from ember.serve.predictor import load_predictor

    convert(hf_folder(tiny("BertModel"), tmp_path / "hf", tiny_tokenizer_path), tmp_path / "run")
    assert load_predictor(tmp_path / "run").endpoints == ["/embed"]
    assert ember_main(["fill-mask", str(tmp_path / "run"), "the [MASK] w1"]) == 1
    assert "no masked-LM head" in capsys.readouterr().err
    convert(hf_folder(tiny("BertForMaskedLM"), tmp_path / "hf-mlm", tiny_tokenizer_path), tmp_path / "mlm")
    assert load_predictor(tmp_path / "mlm").endpoints == ["/fill-mask", "/embed"]


def test_sentence_transformers_folder_sets_pooling_normalize_and_max_length_defaults(tmp_path, tiny_tokenizer_path):
    """cls pooling, no Normalize module, max_seq_length 6: /embed's and ember.embed's defaults;
    request options still override them."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    import ember
    from ember.serve.app import create_app
    from ember.serve.predictor import load_predictor

    model = tiny("BertModel")
    folder = write_sentence_transformers(hf_folder(model, tmp_path / "st", tiny_tokenizer_path), pooling="cls",
                                         normalize=False, max_length=6)
    convert(folder, tmp_path / "run")
    saved = json.loads((tmp_path / "run" / "embedding.json").read_text())
    assert (saved["pooling"], saved["normalize"], saved["max_length"]) == ("cls", False, 6)
    cls6 = hf_vectors(model, tiny_tokenizer_path, TEXTS, "cls", max_length=6)
    np.testing.assert_allclose(ember.embed(tmp_path / "run", TEXTS), cls6, atol=1e-5, rtol=0)
    predictor = load_predictor(tmp_path / "run")
    assert predictor.max_length == 6
    with TestClient(create_app(predictor)) as client:
        got = client.post("/embed", json={"texts": TEXTS}).json()
        np.testing.assert_allclose([r["embedding"] for r in got["results"]], cls6, atol=1e-5, rtol=0)
        assert [r["truncated"] for r in got["results"]] == [True, True, False]
        mean = client.post("/embed", json={"texts": TEXTS, "pooling": "mean", "normalize": True}).json()
        expected = hf_vectors(model, tiny_tokenizer_path, TEXTS, "mean", True, max_length=6)
        np.testing.assert_allclose([r["embedding"] for r in mean["results"]], expected, atol=1e-5, rtol=0)
        assert client.get("/healthz").json()["model"]["embedding"] == {"pooling": "cls", "normalize": False}


def test_sentence_transformers_encoder_in_a_subfolder_converts_and_inits(tmp_path, tiny_tokenizer_path):
    """The older layout: the HF encoder in 0_Transformer/, mean pooling + Normalize."""
    import ember
    from ember.runs.init import load_init

    model = tiny("BertModel")
    folder = tmp_path / "st"
    hf_folder(model, folder / "0_Transformer", tiny_tokenizer_path)
    write_sentence_transformers(folder, sub="0_Transformer", max_length=32)
    init = load_init(folder)
    assert init.tokenizer == folder / "0_Transformer" / "tokenizer.json" and init.model.num_layers == 2
    convert(folder, tmp_path / "run")
    vectors = ember.embed(tmp_path / "run", TEXTS)
    expected = hf_vectors(model, tiny_tokenizer_path, TEXTS, "mean", normalize=True)
    np.testing.assert_allclose(vectors, expected, atol=1e-5, rtol=0)
    assert np.linalg.norm(vectors, axis=1) == pytest.approx(1.0, abs=1e-6)
    # Overrides win over the folder's defaults.
    raw = ember.embed(tmp_path / "run", TEXTS, normalize=False, pooling="cls")
    np.testing.assert_allclose(raw, hf_vectors(model, tiny_tokenizer_path, TEXTS, "cls"), atol=1e-5, rtol=0)


def test_export_carries_the_embedding_defaults(tmp_path, tiny_tokenizer_path):
    import ember
    from ember.serve.export import export_run

    folder = write_sentence_transformers(hf_folder(tiny("BertModel"), tmp_path / "st", tiny_tokenizer_path))
    convert(folder, tmp_path / "run")
    export_run(tmp_path / "run", "int8", tmp_path / "int8", verify=False)
    assert (tmp_path / "int8" / "embedding.json").read_text() == (tmp_path / "run" / "embedding.json").read_text()
    vectors = ember.embed(tmp_path / "int8", TEXTS)
    assert np.linalg.norm(vectors, axis=1) == pytest.approx(1.0, abs=1e-5)  # the run's Normalize, on int8


# ---- bad folders: one clear message each, nothing written ---------------------------------------

def _drop(part: str):
    def drop(folder):
        from safetensors.torch import load_file, save_file

        state = load_file(folder / "model.safetensors")
        save_file({k: v for k, v in state.items() if part not in k}, folder / "model.safetensors")
    return drop


def _edit_config(**changes):
    def edit(folder):
        cfg = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**cfg, **changes}))
    return edit


def _other_tokenizer(folder):
    from conftest import make_wordpiece

    make_wordpiece([f"x{i}" for i in range(300)]).save(str(folder / "tokenizer.json"))


def _truncate_weights(folder):
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])


BAD_FOLDERS = {
    "unknown model type": (_edit_config(model_type="mpnet"), "model_type='mpnet'"),
    "token classification head": (_edit_config(architectures=["BertForTokenClassification"]),
                                  "architecture 'BertForTokenClassification' cannot be imported"),
    "a BERT decoder": (_edit_config(is_decoder=True), "decoder"),
    "no weights file": (lambda f: (f / "model.safetensors").unlink(), "neither model.safetensors nor"),
    "damaged weights": (_truncate_weights, "cannot read the weights"),
    "a layer missing": (_drop(".layer.1."), r"the weights lack .*qkv\.1\."),
    "a LayerNorm missing": (_drop("embeddings.LayerNorm"), r"the weights lack .*backbone\.embeddings\.norm"),
    "config vocabulary differs from the weights": (_edit_config(vocab_size=120), r"\(120, 32\).*vocab_size"),
    "tokenizer of another model": (_other_tokenizer, "the tokenizer has 305 tokens but the model's embeddings have 98"),
    "max pooling": (lambda f: write_sentence_transformers(f, pooling="max"),
                    "pooling pooling_mode_max_tokens is not supported"),
    "a Dense module": (lambda f: write_sentence_transformers(f, extra=[{"idx": 3, "name": "3", "path": "3_Dense",
                       "type": "sentence_transformers.models.Dense"}]), "module 3 is 'sentence_transformers.models.Dense'"),
    "pooling of another width": (lambda f: _wider_pooling(write_sentence_transformers(f)), "64-dimensional"),
}


def _wider_pooling(folder):
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 64,
                                                                  "pooling_mode_mean_tokens": True}))


@pytest.mark.parametrize("case", sorted(BAD_FOLDERS))
def test_bad_checkpoint_folder_gets_one_clear_message_and_nothing_is_written(case, tmp_path, tiny_tokenizer_path,
                                                                          capsys):
    from ember.runs.init import load_init

    spoil, message = BAD_FOLDERS[case]
    folder = hf_folder(tiny("BertModel"), tmp_path / "hf", tiny_tokenizer_path)
    spoil(folder)
    capsys.readouterr()  # transformers' own progress lines from save_pretrained
    out = tmp_path / "run"
    assert ember_main(["convert", "--from-hf", str(folder), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ember convert: error: ") and "Traceback" not in err
    assert __import__("re").search(message, err), err
    assert not out.exists()
    with pytest.raises(EmberError, match=message):  # --init reads the folder through the same checks
        load_init(folder)


def test_convert_refuses_a_folder_with_files_and_overwrite_replaces_it_whole(tmp_path, tiny_tokenizer_path, capsys):
    """`ember convert` writes --out whole or not at all: a folder with someone's files in it (here
    a fine-tuned run's log) is refused without --overwrite, --overwrite leaves none of the old
    files, and --out naming the folder being converted is refused in both directions."""
    folder = hf_folder(tiny("BertModel"), tmp_path / "hf", tiny_tokenizer_path)
    out = tmp_path / "run"
    out.mkdir()
    (out / "train_log.jsonl").write_text('{"step": 1}\n')
    assert ember_main(["convert", "--from-hf", str(folder), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "already exists" in err and "--overwrite" in err and "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == ["train_log.jsonl"]
    assert ember_main(["convert", "--from-hf", str(folder), "--out", str(out), "--overwrite"]) == 0
    assert not (out / "train_log.jsonl").exists() and (out / "model.safetensors").is_file()
    # importing the same checkpoint again into its own import needs no --overwrite (the README does)
    assert ember_main(["convert", "--from-hf", str(folder), "--out", str(out)]) == 0
    other = hf_folder(tiny("BertModel"), tmp_path / "hf2", tiny_tokenizer_path)
    assert ember_main(["convert", "--from-hf", str(other), "--out", str(out)]) == 1
    capsys.readouterr()
    for args in (["--to-hf", str(out), "--out", str(out)], ["--to-hf", str(out), "--out", str(tmp_path), "--overwrite"],
                 ["--from-hf", str(folder), "--out", str(folder), "--overwrite"]):
        assert ember_main(["convert", *args]) == 1
        assert "would replace the folder being converted" in capsys.readouterr().err
    assert (out / "model.safetensors").is_file() and (folder / "config.json").is_file()
    hf = tmp_path / "hf-out"
    assert ember_main(["convert", "--to-hf", str(out), "--out", str(hf)]) == 0
    assert transformers.BertModel.from_pretrained(hf) is not None
    # an empty folder is fine (made by the user beforehand)
    (tmp_path / "empty").mkdir()
    assert ember_main(["convert", "--to-hf", str(out), "--out", str(tmp_path / "empty")]) == 0
