"""XLNet <-> Hugging Face ``transformers`` (XLNetModel / XLNetLMHeadModel, and the fine-tuned
XLNetForSequenceClassification / XLNetForTokenClassification / XLNetForQuestionAnsweringSimple).

transformers keeps the original TF layout: the attention projections are parameters of shape
(H, heads, d) applied with einsum ("ibh,hnd->ibnd"), the output projection ``o`` (H, heads, d)
the other way round ("ibnd,hnd->ibh"). ember's are bias-free ``nn.Linear`` layers over the
flattened heads, so q/k/v/r weights are (heads*d, H) = reshape(H, heads*d).T and ``o`` is
(H, heads*d) = reshape(H, heads*d). The relative biases r_w/r_r/r_s and the segment vectors keep
their (heads, d) / (2, heads, d) shapes; ``mask_emb`` (1, 1, H) becomes (H,). The LM output
layer ``lm_loss`` is tied to the word embeddings (a checkpoint with an untied one is refused);
its bias is ember's ``backbone.lm_bias`` (zeros when a base XLNetModel is imported).

Task heads (``ember.tasks.families.xlnet``): the sequence summary ``sequence_summary.summary`` (last
token, Linear(H, H), tanh) is ember's ``summary`` and ``logits_proj`` its ``classifier``; the
token classifier and the start/end layer keep their names (``classifier``, ``qa_outputs``).
A fine-tuned model exports without the LM layer's bias, which those classes do not have.

Config: ``mem_len``/``reuse_len`` None in transformers (keep everything) is 0 in ember (no
memory / reuse every position); transformers' XLNet has no position limit, so ember's
``max_position`` (the segment length trained on) is taken as the published 512.
"""

from __future__ import annotations

import dataclasses

import torch

from ember.config import ModelConfig
from ember.errors import EmberError
from ember.interop.common import rename
from ember.interop.families import module_rules, pop_tied_decoder

MODEL_TYPE = "xlnet"
OBJECTIVE = "plm"  # an imported XLNet run continues with the permutation LM (ember.interop.convert)
# XLNet's tokenizer pads on the left: its sequence summary reads the last position (<cls>).
# transformers runs tokenizer.json as it is (its template: a fine-tuned run's is XLNet's
# ``A <sep> B <sep> <cls>``, ember.tasks.families.xlnet) only as a PreTrainedTokenizerFast; its
# BertTokenizer would put BERT's own [CLS] A [SEP] template back on a WordPiece vocabulary.
TOKENIZER_SETTINGS = {"padding_side": "left", "tokenizer_class": "PreTrainedTokenizerFast"}
_PREFIX = "transformer."
_ACTIVATIONS = ("gelu", "gelu_new", "relu", "silu")
# Modules with .weight/.bias that map one to one.
_NAMES = [
    ("word_embedding", "backbone.word_embedding"),
    ("layer.{i}.rel_attn.layer_norm", "backbone.layers.{i}.attention_norm"),
    ("layer.{i}.ff.layer_norm", "backbone.layers.{i}.ffn_norm"),
    ("layer.{i}.ff.layer_1", "backbone.layers.{i}.ffn.up"),
    ("layer.{i}.ff.layer_2", "backbone.layers.{i}.ffn.down"),
]
_PROJECTIONS = ("q", "k", "v", "r")  # (H, n, d) <-> Linear (n*d, H)
_BIASES = {"r_w_bias": "r_w_bias", "r_r_bias": "r_r_bias", "r_s_bias": "segment.bias",
           "seg_embed": "segment.embed"}
# Fine-tuning heads: transformers class -> (HF module, ember module) pairs, outside ``transformer.``.
HEADS = {
    "XLNetForSequenceClassification": [("sequence_summary.summary", "summary"), ("logits_proj", "classifier")],
    "XLNetForTokenClassification": [("classifier", "classifier")],
    "XLNetForQuestionAnsweringSimple": [("qa_outputs", "qa_outputs")],
}
# The sequence summary ember's classifier computes (transformers' XLNetConfig defaults).
SUMMARY = {"summary_type": "last", "summary_use_proj": True, "summary_activation": "tanh"}


def config_from_hf(hf: dict) -> ModelConfig:
    from ember.config import model_preset

    if hf.get("model_type") != MODEL_TYPE:
        raise EmberError(f"config.json has model_type={hf.get('model_type')!r}; this importer reads xlnet")
    attn_type = hf.get("attn_type", "bi")
    if attn_type == "uni" and hf.get("same_length"):
        raise EmberError("config.json sets same_length=true with attn_type=uni (every query sees "
                         "the same number of keys); ember's XLNet does not implement it")
    if not hf.get("tie_word_embeddings", True):
        raise EmberError("this XLNet checkpoint does not tie its LM layer to the embeddings; ember ties them")
    act = hf.get("ff_activation", "gelu")
    if act not in _ACTIVATIONS:
        raise EmberError(f"config.json has ff_activation={act!r}; ember reads {', '.join(_ACTIVATIONS)}")
    h, heads = hf.get("d_model", 1024), hf.get("n_head", 16)
    if hf.get("d_head") not in (None, h // heads):
        raise EmberError(f"config.json has d_head={hf['d_head']}; ember's XLNet uses d_model/n_head = {h // heads}")
    if "XLNetForSequenceClassification" in (hf.get("architectures") or []):
        differs = {k: hf[k] for k, v in SUMMARY.items() if k in hf and hf[k] != v}
        if hf.get("summary_proj_to_labels"):
            differs["summary_proj_to_labels"] = True
        if differs:
            raise EmberError(f"this XLNetForSequenceClassification's sequence summary differs from XLNet's "
                             f"({differs}): ember's classifier reads the last token through Linear(H, H) "
                             f"and tanh ({SUMMARY})")
    pad = hf.get("pad_token_id")
    return dataclasses.replace(
        model_preset("xlnet-large"),
        vocab_size=hf.get("vocab_size", 32000), hidden_size=h, num_layers=hf.get("n_layer", 24),
        num_heads=heads, intermediate_size=hf.get("d_inner", 4 * h), hidden_act=act,
        dropout=hf.get("dropout", 0.1), attention_dropout=hf.get("dropout", 0.1),
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12), initializer_range=hf.get("initializer_range", 0.02),
        pad_token_id=5 if pad is None else pad, mem_len=hf.get("mem_len") or 0,
        reuse_len=hf.get("reuse_len") or 0, clamp_len=hf.get("clamp_len", -1),
        bi_data=bool(hf.get("bi_data", False)), attn_type=attn_type,
    )


def config_to_hf(cfg: ModelConfig, architectures: list[str], extra: dict | None = None) -> dict:
    return {
        "model_type": MODEL_TYPE, "architectures": architectures,
        "vocab_size": cfg.vocab_size, "d_model": cfg.hidden_size, "n_layer": cfg.num_layers,
        "n_head": cfg.num_heads, "d_head": cfg.hidden_size // cfg.num_heads, "d_inner": cfg.intermediate_size,
        "ff_activation": cfg.hidden_act, "attn_type": cfg.attn_type, "initializer_range": cfg.initializer_range,
        "layer_norm_eps": cfg.layer_norm_eps, "dropout": cfg.dropout,
        "mem_len": cfg.mem_len or None, "reuse_len": cfg.reuse_len or None, "clamp_len": cfg.clamp_len,
        "bi_data": cfg.bi_data, "same_length": False, "use_mems_eval": True, "use_mems_train": False,
        "pad_token_id": cfg.pad_token_id, "tie_word_embeddings": True,
        **SUMMARY, "summary_last_dropout": cfg.dropout,
        **(extra or {}),
    }


def _check_exportable(cfg: ModelConfig) -> None:
    if cfg.family != MODEL_TYPE:
        raise EmberError(f"this is a {cfg.family} model, not XLNet")
    if cfg.dropout != cfg.attention_dropout:
        raise EmberError(f"transformers' XLNet has one dropout rate; this model has dropout={cfg.dropout} "
                         f"and attention_dropout={cfg.attention_dropout}")


def _head(state: dict, ours: bool) -> str | None:
    """The fine-tuning class whose head ``state`` holds (ember's names when ``ours``), None for a
    language model. The sequence classifier comes first: it has a ``classifier`` too."""
    side = 1 if ours else 0
    for arch, pairs in HEADS.items():
        if all(any(k.startswith(pair[side] + ".") for k in state) for pair in pairs):
            return arch
    return None


def _take_head(state: dict, head: str | None, ours: bool) -> dict:
    """Remove ``head``'s tensors from ``state`` and return them renamed to the other side."""
    if head is None:
        return {}
    pairs = HEADS[head]
    names = [k for k in state if any(k.startswith(pair[1 if ours else 0] + ".") for pair in pairs)]
    return rename({k: state.pop(k) for k in names}, module_rules(pairs)[1 if ours else 0])[0]


def state_from_hf(hf_state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """XLNetModel, XLNetLMHeadModel or fine-tuned (``HEADS``) tensors -> ember names."""
    hf = {k.removeprefix(_PREFIX): v for k, v in hf_state.items()}
    heads = _take_head(hf, _head(hf, ours=False), ours=False)
    pop_tied_decoder(hf, "lm_loss.weight", "word_embedding.weight")
    hidden = cfg.hidden_size
    out = {"backbone.lm_bias": hf.pop("lm_loss.bias", torch.zeros(cfg.vocab_size)), **heads}
    if "mask_emb" in hf:
        out["backbone.mask_emb"] = hf.pop("mask_emb").reshape(hidden)
    for i in range(cfg.num_layers):
        src, dst = f"layer.{i}.rel_attn.", f"backbone.layers.{i}.attention."
        for name in _PROJECTIONS:
            if src + name in hf:
                out[dst + name + ".weight"] = hf.pop(src + name).reshape(hidden, -1).t()
        if src + "o" in hf:
            out[dst + "o.weight"] = hf.pop(src + "o").reshape(hidden, -1)
        for theirs, ours in _BIASES.items():
            if src + theirs in hf:
                out[dst + ours] = hf.pop(src + theirs)
    renamed, unmatched = rename(hf, module_rules(_NAMES)[0])
    if unmatched:
        raise EmberError(f"unrecognised weights in the XLNet checkpoint: {', '.join(unmatched[:5])}; "
                         "ember reads XLNetModel and XLNetLMHeadModel")
    return {k: v.contiguous() for k, v in {**out, **renamed}.items()}


def state_to_hf(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """ember state -> XLNetLMHeadModel names (``transformer.*`` and ``lm_loss.bias``), or a
    fine-tuned model's (``transformer.*`` and its head, ``HEADS``)."""
    _check_exportable(cfg)
    state = dict(state)
    hidden, heads = cfg.hidden_size, cfg.num_heads
    head = _head(state, ours=True)
    lm_bias = state.pop("backbone.lm_bias")
    out = _take_head(state, head, ours=True) if head else {"lm_loss.bias": lm_bias}
    out[_PREFIX + "mask_emb"] = state.pop("backbone.mask_emb").reshape(1, 1, hidden)
    for i in range(cfg.num_layers):
        src, dst = f"backbone.layers.{i}.attention.", f"{_PREFIX}layer.{i}.rel_attn."
        for name in _PROJECTIONS:
            out[dst + name] = state.pop(src + name + ".weight").t().reshape(hidden, heads, -1)
        out[dst + "o"] = state.pop(src + "o.weight").reshape(hidden, heads, -1)
        for theirs, ours in _BIASES.items():
            out[dst + theirs] = state.pop(src + ours)
    renamed, unmatched = rename(state, module_rules(_NAMES, _PREFIX)[1])
    if unmatched:
        raise EmberError(f"these weights have no XLNet counterpart in transformers: {', '.join(unmatched[:5])}")
    return {k: v.contiguous() for k, v in {**out, **renamed}.items()}


def hf_architecture(state: dict[str, torch.Tensor]) -> str:
    # A pre-trained model's LM layer is the tied embedding matrix plus lm_bias, always present.
    return _head(state, ours=True) or "XLNetLMHeadModel"
