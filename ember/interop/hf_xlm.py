"""XLM <-> Hugging Face ``transformers`` (XLMModel / XLMWithLMHeadModel /
XLMForSequenceClassification).

XLM (Lample & Conneau 2019) is ember's post-LN Encoder with language embeddings: token +
position (+ language) embeddings, LayerNorm, then blocks of attention -> add -> LayerNorm,
FFN (4H, GELU or ReLU) -> add -> LayerNorm. Where transformers' XLMModel differs, and why
the Encoder needs no XLM code path for parity:

- It multiplies hidden states by the padding mask after the embeddings and after every
  layer. Padded keys are masked out of attention, so those zeros never reach a real token:
  outputs agree at every real position (pad outputs are undefined in both).
- Token types are looked up in the word-embedding table. XLM models are used with
  language ids instead; ember's XLM has no segment embeddings (type_vocab_size 0) and
  ignores token_type_ids, so compare without them.
- ``causal`` is a config flag there; ember's ``model.causal`` does the same (the CLM models).

Names: ``transformer.`` prefix in head models; q/k/v fused into ember's one projection;
``pred_layer.proj`` is tied to the word embeddings, so only its bias travels (``lm.bias``,
ember.nn.heads.TiedLMHead); ``sequence_summary.summary`` (first token -> linear, no
activation) is ember's classifier on the first token without a pooler. ``id2lang`` <->
``model.languages``. The adaptive softmax (``asm``) has no ember counterpart.
"""

from __future__ import annotations

import dataclasses

import torch

from ember.config import ModelConfig, model_preset
from ember.errors import EmberError
from ember.interop.families import (
    check_exportable, hf_tensors, module_rules, pop_tied_decoder, rename_from_hf, rename_to_hf,
)

MODEL_TYPE = "xlm"
_PREFIX = "transformer."
_QKV = ("q_lin", "k_lin", "v_lin")
_ENCODER = [
    ("embeddings", "backbone.embeddings.word"),
    ("position_embeddings", "backbone.embeddings.position"),
    ("lang_embeddings", "backbone.embeddings.language"),
    ("layer_norm_emb", "backbone.embeddings.norm"),
    *[(f"attentions.{{i}}.{n}", f"qkv.{{i}}.{n}") for n in _QKV],
    ("attentions.{i}.out_lin", "backbone.layers.{i}.attention.out"),
    ("layer_norm1.{i}", "backbone.layers.{i}.attention_norm"),
    ("ffns.{i}.lin1", "backbone.layers.{i}.ffn.up"),
    ("ffns.{i}.lin2", "backbone.layers.{i}.ffn.down"),
    ("layer_norm2.{i}", "backbone.layers.{i}.ffn_norm"),
]
_FROM_ENCODER, _TO_ENCODER = module_rules(_ENCODER, _PREFIX)
_FROM_CLS, _TO_CLS = module_rules([("sequence_summary.summary", "classifier")])
_FROM_HF = _FROM_ENCODER + _FROM_CLS + [(r"pred_layer\.proj\.bias", "lm.bias")]
_TO_HF = _TO_ENCODER + _TO_CLS + [(r"lm\.bias", "pred_layer.proj.bias")]
_WORD = "embeddings.weight"
_DECODER = "pred_layer.proj.weight"


def _codes(hf: dict) -> str:
    """HF's id2lang ({"0": "en", ...}) as ember's "en,ru" (empty when absent)."""
    id2lang = hf.get("id2lang") or {}
    return ",".join(str(id2lang[k]) for k in sorted(id2lang, key=int))


def config_from_hf(hf: dict) -> ModelConfig:
    if hf.get("model_type") != MODEL_TYPE:
        raise EmberError(f"config.json has model_type={hf.get('model_type')!r}; this importer reads XLM")
    if hf.get("asm"):
        raise EmberError("this XLM checkpoint uses an adaptive softmax (asm=true), which ember has no "
                         "counterpart for; only the plain tied prediction layer is supported")
    if not hf.get("is_encoder", True):
        raise EmberError("this XLM checkpoint is a decoder (is_encoder=false); ember imports encoders")
    if "XLMForSequenceClassification" in (hf.get("architectures") or []) and (
            hf.get("summary_type", "first") != "first" or hf.get("summary_activation") == "tanh"
            or not hf.get("summary_use_proj", True) or not hf.get("summary_proj_to_labels", True)):
        raise EmberError("ember's classifier reads the first token through one linear layer; this "
                         "checkpoint's sequence summary (summary_type/activation/proj) differs")
    n_langs = hf.get("n_langs", 1)
    languages = n_langs if n_langs > 1 and hf.get("use_lang_emb", True) else 0
    h = hf.get("emb_dim", hf.get("hidden_size", 2048))
    pad = hf.get("pad_token_id", hf.get("pad_index", 2))
    return dataclasses.replace(
        model_preset("xlm-mini"),
        vocab_size=hf.get("vocab_size", hf.get("n_words", 30145)), hidden_size=h,
        num_layers=hf.get("n_layers", 12), num_heads=hf.get("n_heads", 16), intermediate_size=4 * h,
        max_position=hf.get("max_position_embeddings", 512),
        hidden_act="gelu" if hf.get("gelu_activation", True) else "relu",
        dropout=hf.get("dropout", 0.1), attention_dropout=hf.get("attention_dropout", 0.1),
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12), initializer_range=hf.get("init_std", 0.02),
        pad_token_id=2 if pad is None else pad, num_languages=languages,
        languages=_codes(hf) if languages else "",
        sinusoidal_positions=bool(hf.get("sinusoidal_embeddings", False)), causal=bool(hf.get("causal", False)),
    )


def config_to_hf(cfg: ModelConfig, architectures: list[str], extra: dict | None = None) -> dict:
    if cfg.hidden_act not in ("gelu", "relu"):
        raise EmberError(f"XLM in transformers has GELU (exact) or ReLU activations, not {cfg.hidden_act!r}")
    if cfg.intermediate_size != 4 * cfg.hidden_size:
        raise EmberError(f"XLM in transformers has a 4 x hidden feed-forward; this model's is "
                         f"{cfg.intermediate_size} for hidden {cfg.hidden_size}")
    if cfg.type_vocab_size or cfg.pooler:
        raise EmberError("XLM in transformers has no segment embeddings and no pooler; this model has "
                         f"type_vocab_size={cfg.type_vocab_size}, pooler={cfg.pooler}")
    codes = cfg.language_codes or [str(i) for i in range(cfg.num_languages)]
    out = {
        "model_type": MODEL_TYPE, "architectures": architectures,
        "vocab_size": cfg.vocab_size, "emb_dim": cfg.hidden_size, "n_layers": cfg.num_layers,
        "n_heads": cfg.num_heads, "dropout": cfg.dropout, "attention_dropout": cfg.attention_dropout,
        "gelu_activation": cfg.hidden_act == "gelu", "sinusoidal_embeddings": cfg.sinusoidal_positions,
        "causal": cfg.causal, "asm": False, "n_langs": max(1, cfg.num_languages),
        "use_lang_emb": cfg.num_languages > 1, "max_position_embeddings": cfg.max_position,
        "layer_norm_eps": cfg.layer_norm_eps, "init_std": cfg.initializer_range,
        "pad_token_id": cfg.pad_token_id, "is_encoder": True, "summary_type": "first",
        "summary_use_proj": True, "summary_activation": None, "summary_proj_to_labels": True,
        "tie_word_embeddings": True,
        **(extra or {}),
    }
    if cfg.num_languages > 1:
        out["id2lang"] = {str(i): c for i, c in enumerate(codes)}
        out["lang2id"] = {c: i for i, c in enumerate(codes)}
    return out


def state_from_hf(hf_state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    hf = hf_tensors(hf_state, _PREFIX)
    pop_tied_decoder(hf, _DECODER, _WORD)
    return rename_from_hf(hf, _FROM_HF, _QKV, cfg.num_layers, "XLM")


def state_to_hf(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    check_exportable(cfg, "XLM")
    out = rename_to_hf(state, _TO_HF, _QKV, cfg.num_layers, "XLM")
    if hf_architecture(state) == "XLMModel":  # a base model's names carry no "transformer." prefix
        out = {k.removeprefix(_PREFIX): v for k, v in out.items()}
    return out


def hf_architecture(state: dict[str, torch.Tensor]) -> str:
    if any(k.startswith("classifier.") for k in state):
        return "XLMForSequenceClassification"
    if "lm.bias" in state:
        return "XLMWithLMHeadModel"
    return "XLMModel"


def objective_for(model_cfg: ModelConfig) -> str:
    """The ember objective an imported XLM LM head was trained with: causal or masked LM."""
    return "xlm_clm" if model_cfg.causal else "xlm_mlm"
