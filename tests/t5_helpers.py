"""Helpers shared by the T5 tests: tiny random transformers T5 models (built locally, never
downloaded), the matching ember backbone, and a T5-layout tokenizer."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hf_interop_helpers import perturb

from ember.interop import hf_t5
from ember.models import build_backbone
from ember.runs.init import backbone_weights

VOCAB = 99
EOS = 1  # T5's </s>; the pad id 0 starts decoding


@pytest.fixture
def one_thread():
    """Tiny models on a shared 2-core machine: one intra-op thread. Two threads spin against
    other processes (measured: a t5-tiny training step 0.13 s with one thread, 4.1 s with two
    on a machine with load 8)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def hf_config(version: str = "v1_0", attn: str = "sdpa", **overrides):
    """A tiny T5Config: 2 encoder and 3 decoder layers, 3 heads of d_kv 8 != d_model / heads,
    few buckets with a short max distance so that the log-spaced buckets are exercised."""
    import transformers

    v1_1 = version == "v1_1"
    return transformers.T5Config(**{
        "vocab_size": VOCAB, "d_model": 32, "d_kv": 8, "d_ff": 48, "num_layers": 2, "num_decoder_layers": 3,
        "num_heads": 3, "relative_attention_num_buckets": 8, "relative_attention_max_distance": 20,
        "dropout_rate": 0.0, "feed_forward_proj": "gated-gelu" if v1_1 else "relu",
        "tie_word_embeddings": not v1_1, "decoder_start_token_id": 0, "pad_token_id": 0, "eos_token_id": EOS,
        "attn_implementation": attn, **overrides})


def tiny_hf_t5(version: str = "v1_0", seed: int = 0, attn: str = "sdpa", **overrides):
    """T5ForConditionalGeneration with every weight moved off its init. transformers 5 ties
    lm_head to the embeddings even for v1.1, so v1.1 gets its own head here, at ember's init
    scale d_model^-0.5: logits stay O(1), as a trained model's, where fp32 rounding sits well
    below 1e-5 (with an N(0, 1) head, logits of |20| differ by 1e-5 between transformers' own
    eager and SDPA attention)."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.T5ForConditionalGeneration(hf_config(version, attn, **overrides))
    if version == "v1_1":
        model.lm_head.weight = nn.Parameter(model.shared.weight.detach().clone() * model.config.d_model ** -0.5)
    return perturb(model, seed)


def ember_from_hf(hf_model):
    """ember's EncoderDecoder with the weights of ``hf_model`` (eval mode)."""
    cfg = hf_t5.config_from_hf(hf_model.config.to_dict())
    model = build_backbone(cfg).eval()
    model.load_state_dict(backbone_weights(hf_t5.state_from_hf(hf_model.state_dict(), cfg)), strict=True)
    return model


def t5_style_tokenizer(pieces: list[str]):
    """A Unigram tokenizer in T5's layout: <pad>=0, </s>=1, <unk>=2, then ``pieces``, with
    ``$A </s>`` as its template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + [(p, -float(i + 1)) for i, p in enumerate(pieces)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=2))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.add_special_tokens(["<pad>", "</s>", "<unk>"])
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", 1)])
    return tok



# -- text-to-text fine-tuning and serving (tests/tasks/text2text/test_t5_text2text.py, tests/serve/test_t5_serve.py,
#    tests/commands/test_t5_cli.py)

TINY_T5 = ["model.hidden_size=64", "model.head_dim=32", "model.num_heads=2", "model.intermediate_size=256",
           "model.num_layers=2", "model.max_position=64"]  # t5-tiny narrowed: fast on one thread


@pytest.fixture(scope="session")
def t5_glue_tokenizer(tmp_path_factory):
    """Path of ``glue_t5_tokenizer``, trained once per session."""
    return glue_t5_tokenizer(tmp_path_factory.mktemp("t5-glue-tok") / "tokenizer.json")


def glue_t5_tokenizer(path):
    """A T5-layout unigram tokenizer (<pad> </s> <unk>, 100 sentinels, cased; 2k pieces) trained on
    real SST-2 training sentences and the dev sentences of the other GLUE tasks, plus one line of
    T5's label words (so that "not_entailment" and "3.8" can be spelled). Written to ``path``."""
    from conftest import real_data

    from ember.tasks.readers.glue import read_examples
    from ember.tasks.text2text.templates import GLUE_FORMATS, NO_ANSWER, stsb_target
    from ember.tokenizers import train_tokenizer

    real_data("glue", "SST-2", "train.tsv")
    texts = [ex.text_a for ex in read_examples("sst2", "train", limit=6000)]
    for task in ("cola", "mrpc", "rte", "stsb", "qnli", "snli"):
        texts += [t for ex in read_examples(task, "dev", limit=300) for t in (ex.text_a, ex.text_b) if t]
    words = ["not_entailment not_equivalent unacceptable acceptable contradiction neutral", NO_ANSWER,
             " ".join(stsb_target(k / 5) for k in range(26)), " ".join(p for p, _ in GLUE_FORMATS.values())]
    corpus = path.parent / "t5-glue-corpus.txt"
    corpus.write_text("\n\n".join(texts + words), encoding="utf-8")
    train_tokenizer([corpus], kind="unigram", vocab_size=2000, lowercase=False, progress=False).save(str(path))
    return path


def t5_run_folder(root, tokenizer_path, kind: str = "pretrain", task: str = "sst2", seed: int = 0,
                  overrides=()):
    """A run folder holding a seeded random tiny T5: a span-corruption pre-training run, or (``kind``
    "finetune") a text-to-text ``task`` run as `ember finetune` writes it. Weights are the
    backbone's (``backbone.*``), with final-norm gains drawn from N(0, 1) so that greedy decoding
    does not repeat one token forever (see tests/tasks/text2text/test_t5_generate.py)."""
    import json
    import shutil

    from ember.config import RunConfig, TaskConfig, apply_overrides, run_config_from_dict, save_yaml, to_dict
    from ember.config import model_preset
    from ember.runs.checkpoint import save_weights
    from ember.tokenizers import load_tokenizer

    root.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tokenizer_path, root / "tokenizer.json")
    vocab = load_tokenizer(tokenizer_path).get_vocab_size()
    base = RunConfig(kind=kind, objective="span_corruption", model=model_preset("t5-tiny"),
                     task=TaskConfig(name=task if kind == "finetune" else "", max_length=48))
    values = apply_overrides(to_dict(base), [*TINY_T5, f"model.vocab_size={vocab}", "data.max_seq_length=48",
                                             *overrides])
    cfg = run_config_from_dict(values, where="t5_run_folder")
    torch.manual_seed(seed)
    backbone = build_backbone(cfg.model)
    with torch.no_grad():
        for stack in (backbone.encoder, backbone.decoder):
            stack.final_norm.weight.copy_(torch.randn(stack.final_norm.weight.shape))
    save_yaml(cfg, root / "config.yaml")
    save_weights({f"backbone.{k}": v for k, v in backbone.state_dict().items()}, root / "model.safetensors")
    if kind == "finetune":
        from ember.tasks.base import get_adapter

        labels = get_adapter(task, cfg.model).label_names()
        if labels is not None:
            (root / "labels.json").write_text(json.dumps(labels))
    return root
