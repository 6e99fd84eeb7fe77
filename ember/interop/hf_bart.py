"""BART and mBART <-> Hugging Face ``transformers`` (BartForConditionalGeneration, BartModel,
MBartForConditionalGeneration, MBartModel).

Both are ember family "bart" (ember.models.encoder_decoder with BART's options, ember.presets
._bart): model_type "mbart" is the pre-LN variant (``pre_layer_norm=True``, a final
``layer_norm`` per stack, Liu et al. 2020 §2.1) and is exported under that name again.

Names: transformers keeps the whole model under ``model.`` in the conditional-generation class
and numbers nothing: ``self_attn`` / ``encoder_attn`` / ``fc1``/``fc2`` and their norms map to
ember's ``self_attention`` / ``cross_attention`` / ``ffn.up``/``ffn.down``; the learned position
table ``embed_positions`` (max_position + 2 rows, ember.nn.embeddings.OffsetPositions) and
``layernorm_embedding`` live in each stack. The embedding table ``shared`` is stored once (the
stacks' ``embed_tokens`` and ``lm_head`` are tied copies, checked and dropped on import);
``final_logits_bias`` travels as it is.

One size per model: ember's stacks share num_heads and the feed-forward width, so a checkpoint
whose encoder and decoder differ there is refused.

Task heads (Lewis et al. 2020 §3.1-3.2, ``ember.tasks.families.bart``): (M)BartForSequence
Classification's ``classification_head.dense`` / ``.out_proj`` are ember's ``dense`` /
``classifier``, (M)BartForQuestionAnswering's ``qa_outputs`` keeps its name (a tagging run's
token layer has no transformers class and is refused). These classes have
no LM layer: a fine-tuned run's ``final_logits_bias`` (which its head never reads) is not
exported, and an imported one starts from zeros.
"""

from __future__ import annotations

import dataclasses

import torch

from ember.config import ModelConfig, model_preset
from ember.errors import EmberError
from ember.interop.common import rename
from ember.interop.families import module_rules, pop_tied_decoder

MODEL_TYPE = "bart"
MODEL_TYPES = ("bart", "mbart")
OBJECTIVE = "bart"  # what an imported BART was pre-trained with (Lewis et al. 2020, §2.2)
# fine-tuning class suffix -> its head's (HF module, ember module) pairs
HEADS = {
    "ForSequenceClassification": [("classification_head.dense", "dense"), ("classification_head.out_proj", "classifier")],
    "ForQuestionAnswering": [("qa_outputs", "qa_outputs")],
}


def _names() -> list[tuple[str, str]]:
    """(HF module, ember module) pairs, HF names without the leading ``model.``."""
    pairs = [("shared", "backbone.shared")]
    for stack in ("encoder", "decoder"):
        hf, ours = f"{stack}.layers.{{i}}", f"backbone.{stack}.layers.{{i}}"
        attentions = [("self_attn", "self_attention")] + ([("encoder_attn", "cross_attention")] if stack == "decoder" else [])
        for a, b in attentions:
            pairs += [(f"{hf}.{a}.{p}_proj", f"{ours}.{b}.{q}") for p, q in (("q", "q"), ("k", "k"), ("v", "v"), ("out", "out"))]
            pairs.append((f"{hf}.{a}_layer_norm", f"{ours}.{b}_norm"))
        pairs += [(f"{hf}.fc1", f"{ours}.ffn.up"), (f"{hf}.fc2", f"{ours}.ffn.down"),
                  (f"{hf}.final_layer_norm", f"{ours}.ffn_norm"),
                  (f"{stack}.embed_positions", f"backbone.{stack}.position"),
                  (f"{stack}.layernorm_embedding", f"backbone.{stack}.embedding_norm"),
                  (f"{stack}.layer_norm", f"backbone.{stack}.final_norm")]
    return pairs


_BIAS = ("final_logits_bias", "backbone.final_logits_bias")  # a bare buffer, not module.weight/.bias


# ---- config ---------------------------------------------------------------------------------

def config_from_hf(hf: dict) -> ModelConfig:
    model_type = hf.get("model_type")
    if model_type not in MODEL_TYPES:
        raise EmberError(f"config.json has model_type={model_type!r}; this importer reads BART and mBART")
    for enc, dec in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if hf.get(enc, 16) != hf.get(dec, 16) and dec in hf:
            raise EmberError(f"config.json has {enc}={hf.get(enc)} but {dec}={hf.get(dec)}; ember's BART uses "
                             "one size for both stacks")
    mbart = model_type == "mbart"
    layers = hf.get("encoder_layers", 12)
    start = hf.get("decoder_start_token_id")
    return dataclasses.replace(
        model_preset("mbart-large" if mbart else "bart-large"),
        vocab_size=hf.get("vocab_size", 50265), hidden_size=hf.get("d_model", 1024), num_layers=layers,
        num_decoder_layers=hf.get("decoder_layers", layers), num_heads=hf.get("encoder_attention_heads", 16),
        intermediate_size=hf.get("encoder_ffn_dim", 4096), max_position=hf.get("max_position_embeddings", 1024),
        hidden_act=hf.get("activation_function", "gelu"), dropout=hf.get("dropout", 0.1),
        attention_dropout=hf.get("attention_dropout", 0.0), initializer_range=hf.get("init_std", 0.02),
        pad_token_id=hf.get("pad_token_id", 1), scale_embedding=bool(hf.get("scale_embedding", mbart)),
        decoder_start_token_id=2 if start is None else int(start),
    )


def config_to_hf(cfg: ModelConfig, architectures: list[str], extra: dict | None = None) -> dict:
    _check_config(cfg)
    return {
        "model_type": "mbart" if cfg.pre_layer_norm else "bart", "architectures": architectures,
        "is_encoder_decoder": True, "vocab_size": cfg.vocab_size, "d_model": cfg.hidden_size,
        "encoder_layers": cfg.num_layers, "decoder_layers": cfg.num_decoder_layers or cfg.num_layers,
        "encoder_attention_heads": cfg.num_heads, "decoder_attention_heads": cfg.num_heads,
        "encoder_ffn_dim": cfg.intermediate_size, "decoder_ffn_dim": cfg.intermediate_size,
        "max_position_embeddings": cfg.max_position, "activation_function": cfg.hidden_act,
        "dropout": cfg.dropout, "attention_dropout": cfg.attention_dropout, "activation_dropout": cfg.dropout,
        "init_std": cfg.initializer_range, "scale_embedding": cfg.scale_embedding,
        "pad_token_id": cfg.pad_token_id, "decoder_start_token_id": cfg.decoder_start_id,
        "forced_eos_token_id": None,  # ember's generate does not force </s> at the length limit
        "classifier_dropout": 0.0,  # ember's BART classifier: transformers' default (ember.tasks.families.bart)
        "tie_word_embeddings": True,
        **(extra or {}),
    }


# ---- weights --------------------------------------------------------------------------------

def _check_config(cfg: ModelConfig) -> None:
    if cfg.family != MODEL_TYPE:
        raise EmberError(f"this is a {cfg.family} model; the BART interop handles family bart only")
    bart_shape = (cfg.position_kind, cfg.norm_kind, cfg.linear_bias, cfg.embedding_norm, cfg.final_logits_bias,
                  cfg.scale_decoder_outputs, cfg.tie_word_embeddings)
    if bart_shape != ("learned", "layer", True, True, True, False, True):
        raise EmberError("this bart model's options (position_kind, norm_kind, linear_bias, embedding_norm, "
                         "final_logits_bias, scale_decoder_outputs, tie_word_embeddings) differ from BART's; "
                         "transformers' BART cannot express them")


def state_from_hf(hf_state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """(M)BartForConditionalGeneration or (M)BartModel weights -> ember ``backbone.*`` names."""
    _check_config(cfg)
    hf = {k.removeprefix("model."): v for k, v in hf_state.items() if not k.endswith(".version")}
    head = _take_head(hf, _head(hf, ours=False), ours=False)
    if not any(k.startswith("decoder.") for k in hf):
        raise EmberError("this BART checkpoint has no decoder; ember's BART is the whole encoder-decoder")
    copies = [k for k in ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight") if k in hf]
    if not copies:
        raise EmberError("this BART checkpoint has no embedding table (shared.weight / *.embed_tokens.weight)")
    hf["shared.weight"] = hf.pop(copies[0])
    for name in copies[1:] + ["lm_head.weight"]:
        pop_tied_decoder(hf, name, "shared.weight")  # tied copies of the one table
    bias = hf.pop(_BIAS[0], None)
    out, unmatched = rename(hf, module_rules(_names())[0])
    if unmatched:
        raise EmberError(f"unrecognised weights in the BART checkpoint: {', '.join(unmatched[:5])}; ember reads "
                         "(M)BartForConditionalGeneration / (M)BartModel")
    # BartModel has no logits bias: zeros, what BartForConditionalGeneration starts from
    out[_BIAS[1]] = bias if bias is not None else torch.zeros(1, cfg.vocab_size)
    return {**out, **head}


def state_to_hf(state: dict[str, torch.Tensor], cfg: ModelConfig,
                architecture: str | None = None) -> dict[str, torch.Tensor]:
    """ember weights -> transformers names of ``architecture`` (default: the conditional-generation
    class; the base model has no ``model.`` prefix and no logits bias)."""
    _check_config(cfg)
    architecture = architecture or hf_architecture(state, cfg)
    base = architecture.endswith("Model")
    state = dict(state)
    head = _take_head(state, _head(state, ours=True), ours=True)
    bias = state.pop(_BIAS[1], None)
    out, unmatched = rename(state, module_rules(_names(), "" if base else "model.")[1])
    if unmatched:
        raise EmberError(f"these weights have no BART counterpart in transformers: {', '.join(unmatched[:5])}")
    if not base and not head and bias is not None:  # the task classes have no LM layer
        out[_BIAS[0]] = bias
    return {k: v.contiguous() for k, v in {**out, **head}.items()}


def _head(state: dict, ours: bool) -> str | None:
    """The task class suffix (``HEADS``) whose head ``state`` holds (ember's names when ``ours``)."""
    side = 1 if ours else 0
    for suffix, pairs in HEADS.items():
        if all(any(k.startswith(pair[side] + ".") for k in state) for pair in pairs):
            return suffix
    return None


def _take_head(state: dict, suffix: str | None, ours: bool) -> dict:
    """Remove the head's tensors from ``state`` and return them with the other side's names."""
    if suffix is None:
        return {}
    pairs = HEADS[suffix]
    names = [k for k in state if any(k.startswith(pair[1 if ours else 0] + ".") for pair in pairs)]
    return rename({k: state.pop(k) for k in names}, module_rules(pairs)[1 if ours else 0])[0]


def hf_architecture(state: dict[str, torch.Tensor], cfg: ModelConfig | None = None) -> str:
    if "classifier.weight" in state and "dense.weight" not in state:  # the token layer (BartTokenClassifier)
        raise EmberError("transformers has no BartForTokenClassification, so a BART tagging run has no Hugging "
                         "Face form: serve the run folder (ember serve), or export it with ember export --format "
                         "onnx or int8")
    mbart = cfg is not None and cfg.pre_layer_norm or any(k.startswith("backbone.encoder.final_norm.") for k in state)
    return ("MBart" if mbart else "Bart") + (_head(state, ours=True) or "ForConditionalGeneration")
