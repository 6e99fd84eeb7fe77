"""XLNet's fine-tuning heads against transformers, on tiny random models built locally with
perturbed weights: the sequence classifier (last-token summary, left-padded sentence pairs),
the token classifier and the simple span head, converted both ways; and a fine-tuned ember
classifier exported with `ember convert --to-hf` giving transformers the same logits (and its
exported tokenizer the same inputs)."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import real_data  # noqa: E402
from hf_interop_helpers import ATOL, load_hf, perturb, write_hf_folder  # noqa: E402
from xlnet_xlm_helpers import finetune_args, sst2_wordpiece, xlnet_pretraining_run  # noqa: E402

from ember.cli import main  # noqa: E402
from ember.errors import EmberError  # noqa: E402
from ember.interop import hf_xlnet  # noqa: E402
from ember.models import build_backbone  # noqa: E402
from ember.tasks.featurize import collate  # noqa: E402
from ember.tasks.qa.head import QuestionAnswering  # noqa: E402
from ember.tasks.tagging import TokenClassifier  # noqa: E402
from ember.tasks.families.xlnet import PAD_TYPE_ID, XLNetClassifier  # noqa: E402

VOCAB, PAD, SEP, CLS = 99, 5, 4, 3


def tiny_hf(cls, seed: int = 0, **options):
    torch.manual_seed(seed)
    config = transformers.XLNetConfig(vocab_size=VOCAB, d_model=32, n_layer=2, n_head=4, d_inner=48, dropout=0.0,
                                      pad_token_id=PAD, mem_len=None, **options)
    return perturb(cls(config), seed, scale=0.1)


def pair_features(seed: int = 1) -> list[dict]:
    """Sentence pairs laid out as XLNet reads them, ``A <sep> B <sep> <cls>`` (types 0/1/2), of
    different lengths so that left padding is exercised."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n_a, n_b in ((6, 4), (3, 2), (9, 7)):
        a, b = (torch.randint(6, VOCAB, (n,), generator=g).tolist() for n in (n_a, n_b))
        out.append({"input_ids": a + [SEP] + b + [SEP, CLS],
                    "token_type_ids": [0] * (n_a + 1) + [1] * (n_b + 1) + [2]})
    return out


def ember_module(hf, build):
    cfg = hf_xlnet.config_from_hf(hf.config.to_dict())
    module = build(build_backbone(cfg))
    module.load_state_dict(hf_xlnet.state_from_hf(hf.state_dict(), cfg), strict=True)
    return module.eval()


def test_xlnet_sequence_classification_hf_parity_on_left_padded_pairs():
    hf = tiny_hf(transformers.XLNetForSequenceClassification, num_labels=3)
    ours = ember_module(hf, lambda b: XLNetClassifier(b, 3, PAD))
    batch = ours.make_batch(pair_features())
    # XLNet's layout: padding on the left, with pad ids, mask 0 and token type 3
    assert batch["attention_mask"][1].tolist() == [0] * 11 + [1] * 8  # 8 of 19 tokens
    assert batch["token_type_ids"][1, :11].tolist() == [PAD_TYPE_ID] * 11 and batch["input_ids"][1, 0] == PAD
    with torch.no_grad():
        ref = hf(batch["input_ids"], attention_mask=batch["attention_mask"],
                 token_type_ids=batch["token_type_ids"], use_mems=False).logits
        logits = ours.logits(batch)
    assert ref.abs().max() > 0.1  # a real signal, not a near-zero head
    torch.testing.assert_close(logits, ref, atol=ATOL, rtol=0)
    # The same rows padded on the right (as the server pads) give the same logits: the
    # summary reads each row's last real token, its <cls>.
    right = collate(pair_features(), PAD)
    with torch.no_grad():
        torch.testing.assert_close(ours.logits(right), ref, atol=ATOL, rtol=0)
    # and back: ember's names map onto transformers' one to one
    back = hf_xlnet.state_to_hf(ours.state_dict(), hf_xlnet.config_from_hf(hf.config.to_dict()))
    assert set(back) == set(hf.state_dict()) and hf_xlnet.hf_architecture(ours.state_dict()) == \
        "XLNetForSequenceClassification"
    for name, tensor in back.items():
        torch.testing.assert_close(tensor, hf.state_dict()[name], atol=0, rtol=0)


@pytest.mark.parametrize("arch", ["XLNetForTokenClassification", "XLNetForQuestionAnsweringSimple"])
def test_xlnet_token_heads_hf_parity_on_right_padded_pairs(arch):
    cls = getattr(transformers, arch)
    tagger = arch.endswith("TokenClassification")
    hf = tiny_hf(cls, seed=2, num_labels=5 if tagger else 2)  # the span head: start and end
    build = (lambda b: TokenClassifier(b, 5, PAD)) if tagger else (lambda b: QuestionAnswering(b, PAD))
    ours = ember_module(hf, build)
    batch = collate(pair_features(seed=3), PAD)
    with torch.no_grad():
        ref = hf(batch["input_ids"], attention_mask=batch["attention_mask"], token_type_ids=batch["token_type_ids"],
                 use_mems=False)
        got = ours.logits(batch)
    real = batch["attention_mask"].bool()
    if tagger:
        torch.testing.assert_close(got[real], ref.logits[real], atol=ATOL, rtol=0)
    else:
        torch.testing.assert_close(got[0][real], ref.start_logits[real], atol=ATOL, rtol=0)
        torch.testing.assert_close(got[1][real], ref.end_logits[real], atol=ATOL, rtol=0)
    cfg = hf_xlnet.config_from_hf(hf.config.to_dict())
    assert hf_xlnet.hf_architecture(ours.state_dict()) == arch
    assert set(hf_xlnet.state_to_hf(ours.state_dict(), cfg)) == set(hf.state_dict())


def test_xlnet_import_refuses_a_sequence_summary_ember_does_not_compute(tmp_path):
    hf = tiny_hf(transformers.XLNetForSequenceClassification, num_labels=2, summary_type="first")
    folder = write_hf_folder(hf.state_dict(), {**hf.config.to_dict(), "architectures": ["XLNetForSequenceClassification"]},
                             tmp_path / "hf")
    with pytest.raises(EmberError, match="summary_type"):
        hf_xlnet.config_from_hf(json.loads((folder / "config.json").read_text()))


def test_xlnet_finetuned_classifier_converts_to_hf_with_the_same_logits_and_inputs(tmp_path):
    """ember finetune (real RTE pairs) -> ember convert --to-hf -> transformers: the same logits
    on ember's own left-padded dev batch, and the exported tokenizer encodes a pair as ember did;
    then --from-hf gives back a run with the same weights."""
    from ember.runs.checkpoint import load_weights
    from ember.runs.folder import load_run_config
    from ember.tasks.task_model import load_run_adapter, load_task_module
    from ember.tokenizers import load_tokenizer

    real_data("glue", "RTE", "dev.tsv")
    pre = xlnet_pretraining_run(tmp_path, sst2_wordpiece(tmp_path))
    run = tmp_path / "rte"
    assert main(finetune_args("rte", pre, run, "--train-limit", "32", "--epochs", "1")) == 0
    cfg = load_run_config(run)
    assert cfg.model.mem_len == 0  # fine-tuned without memory, whatever the pre-training used
    tokenizer = load_tokenizer(run / "tokenizer.json")
    adapter = load_run_adapter(run, cfg)
    module = load_task_module(run, cfg, adapter, cfg.model.pad_token_id)
    examples, features = adapter.load("dev", tokenizer, cfg.task.max_length, limit=12)
    batch = module.make_batch([{**f, "label": None} for f in features])

    out = tmp_path / "hf"
    assert main(["convert", "--to-hf", str(run), "--out", str(out)]) == 0
    hf = load_hf(transformers.XLNetForSequenceClassification, out)
    assert json.loads((out / "config.json").read_text())["id2label"] == {"0": "entailment", "1": "not_entailment"}
    with torch.no_grad():
        ref = hf(batch["input_ids"], attention_mask=batch["attention_mask"],
                 token_type_ids=batch["token_type_ids"]).logits
        torch.testing.assert_close(module.logits(batch), ref, atol=ATOL, rtol=0)

    hf_tok = transformers.AutoTokenizer.from_pretrained(str(out))
    assert hf_tok.padding_side == "left"
    enc = hf_tok([ex.text_a for ex in examples[:3]], [ex.text_b for ex in examples[:3]], truncation=True,
                 max_length=cfg.task.max_length)
    for i in range(3):
        assert enc["input_ids"][i] == features[i]["input_ids"]
        assert enc["token_type_ids"][i] == features[i]["token_type_ids"]

    back = tmp_path / "back"
    assert main(["convert", "--from-hf", str(out), "--out", str(back)]) == 0
    theirs, ours = load_weights(back / "model.safetensors"), load_weights(run / "model.safetensors")
    assert set(theirs) == set(ours)
    for name in ours:
        if name != "backbone.lm_bias":  # the classifier export has no LM layer
            torch.testing.assert_close(theirs[name], ours[name], atol=0, rtol=0)
