"""RoBERTa parity with Hugging Face transformers (tiny random models built locally), the
family registry, `ember convert` with a real byte-level BPE tokenizer, and fine-tuning
from an HF folder."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import real_data  # noqa: E402
from hf_interop_helpers import (  # noqa: E402
    assert_close_where, load_all_but_pooler, load_hf, padded_batch, perturb, write_hf_folder,
)

from ember.config import DataConfig, ModelConfig  # noqa: E402
from ember.errors import EmberError  # noqa: E402
from ember.interop import hf_roberta  # noqa: E402
from ember.interop.families import import_checkpoint, interop_for_family, interop_for_hf_config  # noqa: E402
from ember.models import build_backbone  # noqa: E402
from ember.objectives.bert import BertPretraining  # noqa: E402
from ember.tasks.classification import SequenceClassifier  # noqa: E402

# RoBERTa's special-token order (ember.tokenizers.ROBERTA_SPECIAL_TOKENS): <s> <pad> </s> <unk> <mask>
SPECIAL = {"cls": 0, "pad": 1, "sep": 2, "unk": 3, "mask": 4}
TIED = ("lm_head.decoder.weight", "lm_head.decoder.bias")


def tiny_config(vocab: int = 98, **kw):
    return transformers.RobertaConfig(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=66, type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **kw)


def ember_mlm(hf_model) -> BertPretraining:
    cfg, state = import_checkpoint(hf_model.config.to_dict(), hf_model.state_dict())
    module = BertPretraining(build_backbone(cfg), SPECIAL, DataConfig(), sentence_task="none").eval()
    return load_all_but_pooler(module, state)


def test_family_registry_dispatches_by_family_and_model_type():
    assert interop_for_family("roberta") is hf_roberta
    assert interop_for_hf_config({"model_type": "roberta"}) is hf_roberta
    assert interop_for_hf_config({}).MODEL_TYPE == "bert"  # pre-model_type BERT checkpoints
    for family in ("bert", "roberta", "albert", "distilbert"):
        assert interop_for_family(family).MODEL_TYPE == family
    with pytest.raises(EmberError, match="no Hugging Face interop for model family 'elmo'"):
        interop_for_family("elmo")
    with pytest.raises(EmberError, match="model_type='pegasus'"):  # (BART is imported now: docs/bart.md)
        interop_for_hf_config({"model_type": "pegasus"})
    assert interop_for_hf_config({"model_type": "mbart"}).MODEL_TYPE == "bart"


def test_roberta_hf_parity_mlm_logits_on_padded_batch():
    hf = perturb(transformers.RobertaForMaskedLM(tiny_config()), seed=0)
    ours = ember_mlm(hf)
    # 66 HF rows - (pad 1 + 1) reserved = 64 positions numbered from 0.
    assert ours.backbone.config.max_position == 64
    ids, mask = padded_batch(98, SPECIAL["pad"])
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        mlm, sentence = ours.logits({"input_ids": ids, "attention_mask": mask})
        hidden = ours.backbone(ids, mask, output_hidden_states=True).hidden_states
    assert sentence is None
    assert_close_where(mlm, ref.logits, mask)
    for a, b in zip(hidden, ref.hidden_states, strict=True):
        assert_close_where(a, b, mask)


def test_roberta_hf_export_back_loads_into_transformers(tmp_path):
    hf = perturb(transformers.RobertaForMaskedLM(tiny_config()), seed=1)
    ours = ember_mlm(hf)
    cfg = ours.backbone.config
    arch = hf_roberta.hf_architecture(ours.state_dict())
    assert arch == "RobertaForMaskedLM"
    hf_state = hf_roberta.state_to_hf(ours.state_dict(), cfg)
    # The reserved rows come back as zeros in front of the 64 learned ones.
    pos = hf_state["roberta.embeddings.position_embeddings.weight"]
    assert pos.shape == (66, 32) and not pos[:2].any()
    again = load_hf(transformers.RobertaForMaskedLM,
                    write_hf_folder(hf_state, hf_roberta.config_to_hf(cfg, [arch]), tmp_path / "hf"), TIED)
    ids, mask = padded_batch(98, SPECIAL["pad"], seed=2)
    with torch.no_grad():
        assert_close_where(again(input_ids=ids, attention_mask=mask).logits,
                           hf(input_ids=ids, attention_mask=mask).logits, mask)


def test_roberta_hf_parity_sequence_classifier_head_is_pooler_plus_classifier():
    """RobertaClassificationHead (dense -> tanh -> out_proj on <s>) == ember pooler + classifier."""
    hf = perturb(transformers.RobertaForSequenceClassification(tiny_config(num_labels=3)), seed=3)
    cfg, state = import_checkpoint(hf.config.to_dict(), hf.state_dict())
    ours = SequenceClassifier(build_backbone(cfg), 3, SPECIAL["pad"]).eval()
    ours.load_state_dict(state, strict=True)
    ids, mask = padded_batch(98, SPECIAL["pad"], seed=4)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask).logits
        torch.testing.assert_close(ours.logits({"input_ids": ids, "attention_mask": mask}), ref, atol=1e-5, rtol=0)
    back = hf_roberta.state_to_hf(ours.state_dict(), cfg)
    assert set(back) == {k for k in hf.state_dict() if not k.endswith("position_ids")}
    for key, value in back.items():
        expected = hf.state_dict()[key]
        if key.endswith("position_embeddings.weight"):  # reserved rows come back as zeros
            value, expected = value[2:], expected[2:]
        torch.testing.assert_close(value, expected, atol=0, rtol=0)


@pytest.fixture(scope="module")
def wiki_bpe(tmp_path_factory):
    """A byte-level BPE tokenizer (RoBERTa specials) trained on ~20 real Wikipedia articles."""
    from ember.tokenizers import train_tokenizer

    source = real_data("wiki-en", "AA", "wiki_00.gz")
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    train_tokenizer([source], kind="bpe", vocab_size=600, max_documents=20, progress=False).save(str(path))
    return path


def real_sentences(n: int = 4) -> list[str]:
    from ember.data.readers import DocumentReader

    lines = []
    for doc in DocumentReader([real_data("wiki-en", "AA", "wiki_00.gz")]):
        lines += [line for line in doc.text.splitlines() if 40 < len(line) < 200]
        if len(lines) >= 50:
            break
    return lines[:n]


def test_roberta_convert_cli_round_trip_with_real_bpe_tokenizer(tmp_path, wiki_bpe):
    """HF folder -> `ember convert --from-hf` -> `ember convert --to-hf` -> transformers:
    same logits, and AutoTokenizer reproduces ember's token ids on real text."""
    from ember.cli import main
    from ember.tasks.inference.fill_mask import FillMask
    from ember.tokenizers import load_tokenizer

    tok = load_tokenizer(wiki_bpe)
    hf = perturb(transformers.RobertaForMaskedLM(tiny_config(vocab=tok.get_vocab_size())), seed=5)
    hf_dir = tmp_path / "hf"
    hf.save_pretrained(hf_dir)
    (hf_dir / "tokenizer.json").write_bytes(wiki_bpe.read_bytes())
    assert main(["convert", "--from-hf", str(hf_dir), "--out", str(tmp_path / "run")]) == 0
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert "family: roberta" in saved and "objective: mlm" in saved
    assert main(["convert", "--to-hf", str(tmp_path / "run"), "--out", str(tmp_path / "out")]) == 0

    out = tmp_path / "out"
    assert json.loads((out / "config.json").read_text())["architectures"] == ["RobertaForMaskedLM"]
    assert (out / "vocab.json").is_file() and (out / "merges.txt").is_file()
    again = load_hf(transformers.RobertaForMaskedLM, out, TIED)
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    texts = real_sentences()
    for text in texts:
        assert hf_tok(text)["input_ids"] == tok.encode(text).ids
    enc = hf_tok(texts, padding=True, truncation=True, return_tensors="pt")  # model_max_length 64
    assert "token_type_ids" not in enc  # RoBERTa has one segment
    with torch.no_grad():
        assert_close_where(again(**enc).logits, hf(**enc).logits, enc["attention_mask"])

    # fill-mask on the imported run: the same top token as transformers at the <mask>.
    words = texts[0].split()[:10]
    masked = " ".join(words[:4] + ["<mask>"] + words[5:])
    top = FillMask(tmp_path / "run")(masked, top_k=1)[0][0][0]
    enc = hf_tok(masked, return_tensors="pt")
    where = (enc["input_ids"][0] == SPECIAL["mask"]).nonzero().item()
    with torch.no_grad():
        best = hf(**enc).logits[0, where].argmax().item()
    assert top == hf_tok.convert_ids_to_tokens(best)


def test_roberta_import_reads_vocab_json_and_merges(tmp_path, wiki_bpe):
    """A RoBERTa folder with only vocab.json + merges.txt: the tokenizer ember builds gives
    transformers' RobertaTokenizer ids; <mask> absorbs the space before it (lstrip), as in
    the released roberta-base tokenizer."""
    from ember.interop.convert import import_hf
    from ember.tokenizers import load_tokenizer

    tok = load_tokenizer(wiki_bpe)
    hf = perturb(transformers.RobertaForMaskedLM(tiny_config(vocab=tok.get_vocab_size())), seed=6)
    hf_dir = tmp_path / "hf"
    hf.save_pretrained(hf_dir)
    tok.model.save(str(hf_dir))  # vocab.json + merges.txt, no tokenizer.json
    run = import_hf(hf_dir, tmp_path / "run")
    ours = load_tokenizer(run / "tokenizer.json")
    ref = transformers.RobertaTokenizer.from_pretrained(hf_dir)
    for text in real_sentences() + ["two  spaces\tand a tab"]:
        assert ours.encode(text).ids == ref(text)["input_ids"]
    assert ours.encode("first", "second").ids == ref("first", "second")["input_ids"]
    assert ours.encode("is <mask>").ids == [0, ours.token_to_id("is"), SPECIAL["mask"], 2]  # no space piece


def test_roberta_finetune_from_hf_folder_trains_and_exports_classifier(tmp_path, wiki_bpe):
    """`ember finetune --init HF_FOLDER` on real RTE (a few steps; its dev set is the smallest
    to score), then the classifier
    exports to RobertaForSequenceClassification with the same logits."""
    from ember.cli import main
    from ember.interop.convert import export_hf
    from ember.tokenizers import load_tokenizer
    from ember.tasks.base import get_adapter
    from ember.tasks.task_model import load_task_module
    from ember.runs.folder import load_run_config

    real_data("glue", "RTE")
    tok = load_tokenizer(wiki_bpe)
    hf = perturb(transformers.RobertaForMaskedLM(tiny_config(vocab=tok.get_vocab_size())), seed=7)
    hf_dir = tmp_path / "hf"
    hf.save_pretrained(hf_dir)
    (hf_dir / "tokenizer.json").write_bytes(wiki_bpe.read_bytes())
    run = tmp_path / "rte"
    assert main(["finetune", "--task", "rte", "--init", str(hf_dir), "--out", str(run), "--train-limit", "32",
                 "--epochs", "1", "--batch-size", "16", "--max-length", "48", "--no-progress"]) == 0
    cfg = load_run_config(run)
    assert cfg.model.family == "roberta" and cfg.model.pooler  # fresh pooler = RoBERTa's head dense
    ours = load_task_module(run, cfg, get_adapter("rte", cfg.model), SPECIAL["pad"])
    word = ours.backbone.embeddings.word.weight
    assert word.shape == hf.roberta.embeddings.word_embeddings.weight.shape

    exported = load_hf(transformers.RobertaForSequenceClassification, export_hf(run, tmp_path / "out"))
    enc = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")(*real_sentences(2), padding=True,
                                                                       truncation=True, return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(exported(**enc).logits, ours.logits(dict(enc)), atol=1e-5, rtol=0)


def test_roberta_bad_inputs_give_clear_errors():
    cfg = ModelConfig(family="roberta", vocab_size=50, hidden_size=32, num_layers=2, num_heads=2,
                      intermediate_size=40, max_position=20, type_vocab_size=1, pad_token_id=1)
    state = BertPretraining(build_backbone(cfg), SPECIAL, DataConfig(), "none").state_dict()
    with pytest.raises(EmberError, match="no factorized embeddings"):
        hf_roberta.state_to_hf(state, dataclasses.replace(cfg, embedding_size=16))
    with pytest.raises(EmberError, match="post-LayerNorm"):
        hf_roberta.state_to_hf(state, dataclasses.replace(cfg, pre_layer_norm=True))
    nsp = BertPretraining(build_backbone(cfg), SPECIAL, DataConfig(), "nsp").state_dict()
    with pytest.raises(EmberError, match="no RoBERTa counterpart.*nsp"):
        hf_roberta.state_to_hf(nsp, cfg)
    unpooled = dataclasses.replace(cfg, pooler=False)
    classifier = SequenceClassifier(build_backbone(unpooled), 2, 1).state_dict()
    with pytest.raises(EmberError, match="without a pooler"):
        hf_roberta.state_to_hf(classifier, unpooled)
    with pytest.raises(EmberError, match="leaves no positions"):
        hf_roberta.config_from_hf({**tiny_config().to_dict(), "max_position_embeddings": 2})
    with pytest.raises(EmberError, match="decoder"):
        hf_roberta.config_from_hf(tiny_config(is_decoder=True).to_dict())
