"""BART's task heads (Lewis et al. 2020 §3.1-3.2) against transformers' BartForSequence
Classification and BartForQuestionAnswering, on tiny random models built locally with every
weight moved off its init: logits to 1e-5 on right-padded batches, names both ways, and
`ember convert --from-hf` / `--to-hf` through the CLI."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from bart_helpers import BOS, EOS, PAD, VOCAB, bart_style_tokenizer, ember_from_hf, tiny_hf_bart  # noqa: E402
from hf_interop_helpers import ATOL, assert_close_where, load_hf  # noqa: E402
from t5_helpers import one_thread  # noqa: E402,F401

from ember.cli import main  # noqa: E402
from ember.errors import EmberError  # noqa: E402
from ember.interop import hf_bart  # noqa: E402
from ember.models import build_backbone  # noqa: E402
from ember.runs.checkpoint import load_weights  # noqa: E402
from ember.runs.folder import load_run_config  # noqa: E402
from ember.tasks.families.bart import BartClassifier, BartQuestionAnswering, BartTokenClassifier  # noqa: E402
from ember.tasks.featurize import collate  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
TIED = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight")


def pair_features(seed: int = 1) -> list[dict]:
    """Sentence pairs as BART reads them, ``<s> A </s></s> B </s>``, of different lengths (so
    rows are right-padded), with a </s> inside each A too (the head reads the last one;
    transformers asks every row to hold as many)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n_a, n_b in ((6, 4), (3, 2), (9, 7)):
        a, b = (torch.randint(5, VOCAB, (n,), generator=g).tolist() for n in (n_a, n_b))
        out.append({"input_ids": [BOS, *a, EOS, EOS, *b, EOS], "token_type_ids": [0] * (n_a + n_b + 4)})
    for f in out:
        f["input_ids"][2] = EOS
    return out


def ember_module(hf, build):
    cfg = hf_bart.config_from_hf(hf.config.to_dict())
    module = build(build_backbone(cfg))
    module.load_state_dict(hf_bart.state_from_hf(hf.state_dict(), cfg), strict=True)
    return module.eval()


def assert_names_map_back(ours, hf, arch: str) -> None:
    """ember's names map onto transformers' one to one (and the tensors are the same)."""
    cfg = hf_bart.config_from_hf(hf.config.to_dict())
    assert hf_bart.hf_architecture(ours.state_dict(), cfg) == arch
    back = hf_bart.state_to_hf(ours.state_dict(), cfg)
    theirs = {k: v for k, v in hf.state_dict().items() if k not in TIED}
    assert set(back) == set(theirs)
    for name, tensor in back.items():
        torch.testing.assert_close(tensor, theirs[name], atol=0, rtol=0)


@pytest.mark.parametrize("mbart", [False, True], ids=["bart", "mbart"])
def test_bart_classification_hf_parity_on_padded_pairs(mbart):
    """The final </s> state of the decoder through dense/tanh/out_proj: transformers' logits."""
    name = "MBartForSequenceClassification" if mbart else "BartForSequenceClassification"
    hf = tiny_hf_bart(mbart, seed=11, cls_name=name, num_labels=3)
    ours = ember_module(hf, lambda b: BartClassifier(b, 3, PAD))
    batch = ours.make_batch(pair_features())
    assert batch["attention_mask"][1].tolist() == [1] * 9 + [0] * 11  # right padding
    with torch.no_grad():
        ref = hf(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        logits = ours.logits(batch)
    assert ref.abs().max() > 0.1  # a real signal, not a near-zero head
    torch.testing.assert_close(logits, ref, atol=ATOL, rtol=0)
    assert_names_map_back(ours, hf, name)


@pytest.mark.parametrize("mbart", [False, True], ids=["bart", "mbart"])
def test_bart_question_answering_hf_parity_on_padded_pairs(mbart):
    """Start/end logits from the decoder's final states equal transformers' at every real token."""
    name = "MBartForQuestionAnswering" if mbart else "BartForQuestionAnswering"
    hf = tiny_hf_bart(mbart, seed=12, cls_name=name)
    ours = ember_module(hf, lambda b: BartQuestionAnswering(b, PAD))
    batch = collate(pair_features(seed=3), PAD)
    with torch.no_grad():
        ref = hf(batch["input_ids"], attention_mask=batch["attention_mask"])
        start, end = ours.logits(batch)
    mask = batch["attention_mask"]
    assert ref.start_logits.std() > 0.1
    assert_close_where(start, ref.start_logits, mask)
    assert_close_where(end, ref.end_logits, mask)
    assert_names_map_back(ours, hf, name)


@pytest.mark.parametrize("mbart", [False, True], ids=["bart", "mbart"])
def test_bart_token_classification_reads_bartmodel_last_hidden_state(mbart):
    """§3.2's tagger: transformers has no BartForTokenClassification, so its backbone part is
    checked: the states ember's token layer reads are BartModel's last_hidden_state (the same
    input to both stacks, the decoder's shifted right) at every real token of a right-padded
    batch, to 1e-5, and its logits (and per-word predictions) are the token layer on them."""
    hf = tiny_hf_bart(mbart, seed=15, cls_name="MBartModel" if mbart else "BartModel")
    ours = BartTokenClassifier(ember_from_hf(hf), 9, PAD).eval()
    features = pair_features(seed=4)
    batch = ours.make_batch(features)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask).last_hidden_state  # (B, T, H)
        states = ours.backbone_pass(ids, mask).last_hidden_state
        logits = ours.logits(batch)
    assert ref.std() > 0.1
    assert_close_where(states, ref, mask)
    assert_close_where(logits, ours.classifier(ref), mask)
    for f in features:  # every token a "word": a prediction per real position
        f["word_starts"] = list(range(len(f["input_ids"])))
    for f, words in zip(features, ours.predict(features, batch_size=2)):
        n = len(f["input_ids"])
        with torch.no_grad():
            alone = ours.classifier(hf(torch.tensor([f["input_ids"]])).last_hidden_state[0])  # unpadded
        assert words.tolist() == alone.argmax(-1)[:n].tolist()


def test_bart_classifier_refuses_inputs_not_ending_with_eos():
    ours = ember_module(tiny_hf_bart(seed=13, cls_name="BartForSequenceClassification", num_labels=2),
                        lambda b: BartClassifier(b, 2, PAD))
    features = pair_features()
    features[0]["input_ids"][-1] = 7
    with pytest.raises(EmberError, match="final </s>"):
        ours.logits(ours.make_batch(features))


@pytest.mark.parametrize("arch", ["BartForSequenceClassification", "BartForQuestionAnswering"])
def test_bart_task_heads_convert_both_ways_through_the_cli(arch, tmp_path):
    """save_pretrained folder -> `ember convert --from-hf` -> a fine-tuned run -> `--to-hf`:
    transformers loads the export with nothing missing or left over, and the original, the
    run's module and the export give the same logits on a padded batch."""
    classify = arch.endswith("Classification")
    hf = tiny_hf_bart(seed=14, cls_name=arch, **({"num_labels": 2} if classify else {}))
    hf_dir, run, out = tmp_path / "hf", tmp_path / "run", tmp_path / "back"
    hf.save_pretrained(hf_dir)
    bart_style_tokenizer([f"w{i}" for i in range(VOCAB - 5)]).save(str(hf_dir / "tokenizer.json"))
    assert main(["convert", "--from-hf", str(hf_dir), "--out", str(run)]) == 0
    cfg = load_run_config(run)
    assert (cfg.kind, cfg.model.family) == ("finetune", "bart")
    build = (lambda b: BartClassifier(b, 2, PAD)) if classify else (lambda b: BartQuestionAnswering(b, PAD))
    ours = build(build_backbone(cfg.model)).eval()
    ours.load_state_dict(load_weights(run / "model.safetensors"), strict=True)
    assert main(["convert", "--to-hf", str(run), "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [arch] and config["eos_token_id"] == EOS
    back = load_hf(getattr(transformers, arch), out, tied=TIED)
    batch = collate(pair_features(seed=5), PAD)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        ref, again = hf(ids, attention_mask=mask), back(ids, attention_mask=mask)
        if classify:
            assert config["num_labels"] == 2
            torch.testing.assert_close(ours.logits(batch), ref.logits, atol=ATOL, rtol=0)
            torch.testing.assert_close(again.logits, ref.logits, atol=ATOL, rtol=0)
        else:
            start, end = ours.logits(batch)
            for got, theirs, want in ((start, again.start_logits, ref.start_logits),
                                      (end, again.end_logits, ref.end_logits)):
                assert_close_where(got, want, mask)
                assert_close_where(theirs, want, mask)


@pytest.mark.parametrize("task", ["rte", "squad2", "conll2003"])
def test_bart_head_runs_export_to_onnx_and_hf_verified_on_real_dev_inputs(task, tmp_path):
    """`ember export --format onnx / hf` of BART head runs: the ONNX graph (one pass through the
    decoder's states) and transformers' Bart*ForX class answer real RTE pairs / SQuAD questions /
    CoNLL sentences as the run does (the export's own verification, tolerance 1e-3, fails the
    command otherwise); a tagging run has no transformers class, which `--format hf` says."""
    from bart_helpers import bart_task_run
    from conftest import real_data

    from ember.serve.export import export_run

    real_data(*{"rte": ("glue", "RTE", "dev.tsv"), "squad2": ("squad2-dev-half", "dev-v2.0.json"),
                "conll2003": ("conll2003", "dev.txt")}[task])
    run = bart_task_run(tmp_path / task, task)
    if task == "conll2003":
        with pytest.raises(EmberError, match="transformers has no BartForTokenClassification"):
            export_run(run, "hf", tmp_path / "hf")
        assert not (tmp_path / "hf").exists()  # nothing half-written
    for fmt in ("onnx",) if task == "conll2003" else ("onnx", "hf"):
        checked = export_run(run, fmt, tmp_path / f"{task}-{fmt}", limit=8)["verification"]
        # ONNX Runtime's kernels sum in another order than PyTorch's: float32 rounding, not 0
        assert checked["max_abs_diff"] < 1e-4 and checked["prediction_agreement"] == 1.0, checked
