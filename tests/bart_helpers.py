"""Helpers shared by the BART / mBART / MASS tests: tiny random transformers models (built
locally, never downloaded) and the matching ember backbone."""

from __future__ import annotations

import torch

from hf_interop_helpers import perturb

from ember.interop import hf_bart
from ember.models import build_backbone
from ember.runs.init import backbone_weights

VOCAB = 99
BOS, PAD, EOS = 0, 1, 2  # BART's <s> <pad> </s>; </s> also starts decoding
SCALE = 0.2  # weights moved this far off init: outputs depend strongly on every tensor


def hf_config(mbart: bool = False, attn: str = "sdpa", **overrides):
    """A tiny (M)BartConfig: 2 encoder and 3 decoder layers of 32, 4 heads, 40 positions; no
    dropout, no forced </s> (ember's generate does not force it unless asked)."""
    import transformers

    cls = transformers.MBartConfig if mbart else transformers.BartConfig
    return cls(**{
        "vocab_size": VOCAB, "d_model": 32, "encoder_layers": 2, "decoder_layers": 3, "encoder_attention_heads": 4,
        "decoder_attention_heads": 4, "encoder_ffn_dim": 48, "decoder_ffn_dim": 48, "max_position_embeddings": 40,
        "dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0, "pad_token_id": PAD,
        "bos_token_id": BOS, "eos_token_id": EOS, "decoder_start_token_id": EOS, "forced_eos_token_id": None,
        "scale_embedding": mbart,  # as the released mBART (mbart-large-cc25); BART's default is off
        "attn_implementation": attn, **overrides})


def tiny_hf_bart(mbart: bool = False, seed: int = 0, attn: str = "sdpa", cls_name: str | None = None, **overrides):
    """(M)BartForConditionalGeneration (or ``cls_name``) with every weight moved off its init and
    a random final_logits_bias (a buffer, which ``perturb`` does not touch)."""
    import transformers

    torch.manual_seed(seed)
    name = cls_name or ("MBartForConditionalGeneration" if mbart else "BartForConditionalGeneration")
    model = getattr(transformers, name)(hf_config(mbart, attn, **overrides))
    perturb(model, seed, scale=SCALE)
    if hasattr(model, "final_logits_bias"):
        g = torch.Generator().manual_seed(seed + 100)
        model.final_logits_bias.copy_(torch.randn(model.final_logits_bias.shape, generator=g))
    return model.eval()


def ember_from_hf(hf_model):
    """ember's EncoderDecoder (BART options) with the weights of ``hf_model`` (eval mode)."""
    cfg = hf_bart.config_from_hf(hf_model.config.to_dict())
    model = build_backbone(cfg).eval()
    model.load_state_dict(backbone_weights(hf_bart.state_from_hf(hf_model.state_dict(), cfg)), strict=True)
    return model


def bart_style_tokenizer(words: list[str]):
    """A Unigram tokenizer in BART's layout: <s>=0 <pad>=1 </s>=2 <unk>=3 <mask>=4, then one piece
    per word of ``words`` (so "w3" is one token), with ``<s> $A </s>`` as its template (BART's)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    vocab = [(t, 0.0) for t in specials] + [("▁" + w, -float(i + 1)) for i, w in enumerate(words)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=3))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.add_special_tokens(specials)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
                                                       special_tokens=[("<s>", 0), ("</s>", 2)])
    return tok


def bart_task_run(root, task: str, seed: int = 0):
    """A run folder holding a seeded random tiny BART with the paper's ``task`` head (§3.1-3.2:
    ``sst2`` / ``rte`` / ``stsb`` classifier or ``squad2`` span layer), as `ember finetune
    --init <bart run>` writes it; the tokenizer is ``bart_style_tokenizer``'s, heads widened so
    predictions are not ties of noise."""
    import json

    from ember.config import RunConfig, TaskConfig, model_preset, save_yaml
    from ember.runs.checkpoint import save_weights
    from ember.tasks.base import get_adapter

    import dataclasses

    root.mkdir(parents=True, exist_ok=True)
    tok = bart_style_tokenizer([f"w{i}" for i in range(90)] + ["the", "a", "film", "fine", "dull"])
    tok.save(str(root / "tokenizer.json"))
    model = dataclasses.replace(model_preset("bart-tiny"), vocab_size=tok.get_vocab_size(), hidden_size=32,
                                num_heads=2, intermediate_size=64, max_position=64, pad_token_id=PAD,
                                decoder_start_token_id=EOS)
    cfg = RunConfig(kind="finetune", objective="bart", model=model, task=TaskConfig(name=task, max_length=48))
    torch.manual_seed(seed)
    adapter = get_adapter(task, model, settings=cfg.task)
    module = adapter.build_module(build_backbone(model), PAD)
    with torch.no_grad():
        for name in ("classifier", "qa_outputs"):
            if hasattr(module, name):
                getattr(module, name).weight.mul_(50)
    save_yaml(cfg, root / "config.yaml")
    save_weights(module.state_dict(), root / "model.safetensors")
    if adapter.label_names() is not None:
        (root / "labels.json").write_text(json.dumps(adapter.label_names()))
    return root
