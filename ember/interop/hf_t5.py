"""T5 <-> Hugging Face ``transformers`` (T5ForConditionalGeneration, T5Model, T5EncoderModel).

Names: HF numbers the sub-layers of a block (``layer.0`` self-attention, ``layer.1``
cross-attention in the decoder, then the feed-forward); ember names them. The relative
position bias lives in HF's first block of each stack and in ember's stack itself. The
embedding table ``shared`` is stored once (HF's ``encoder/decoder.embed_tokens`` are tied
copies, checked and dropped on import).

v1.0 vs v1.1: the feed-forward (``feed_forward_proj`` "relu" | "gated-gelu", where HF's
gated-gelu is the tanh GELU, ember's "gated-gelu_new") and the LM head: v1.0 applies the
shared embeddings to h * d_model^-0.5, v1.1 has an own ``lm_head`` without rescaling. Old
config.json files say ``tie_word_embeddings: false`` for v1.1; transformers 5 always writes
``tie_word_embeddings: true`` and records the rescaling as ``scale_decoder_outputs``, which
is what decides here when present. Export writes both, so either version reads the folder.

Partial checkpoints: T5Model is T5ForConditionalGeneration without ``lm_head`` (complete for
v1.0, whose head is the embedding matrix); T5EncoderModel has no decoder. ember's T5 is the
whole encoder-decoder with its head, so it imports neither of the incomplete ones; it
exports all three (``state_to_hf(..., architecture=...)``).
"""

from __future__ import annotations

import dataclasses

import torch

from ember.config import ModelConfig, model_preset
from ember.errors import EmberError
from ember.interop.common import rename
from ember.interop.families import module_rules, pop_tied_decoder

MODEL_TYPE = "t5"
OBJECTIVE = "span_corruption"  # what an imported T5 was pre-trained with (Raffel et al. 2020, §3.1.4)
ARCHITECTURES = ("T5ForConditionalGeneration", "T5Model", "T5EncoderModel")
_GATED = "gated-"
# HF's decoder had a never-used cross-attention position bias in old checkpoints (it ignores it too).
_IGNORED = ("decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",)


def _attention(hf: str, ours: str) -> list[tuple[str, str]]:
    return [(f"{hf}.{a}", f"{ours}.{b}") for a, b in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "out"))]


def _names(cfg: ModelConfig) -> list[tuple[str, str]]:
    """(HF module, ember module) pairs of the whole model; "{i}" is a block index."""
    ffn = [("wi_0", "gate"), ("wi_1", "up")] if cfg.hidden_act.startswith(_GATED) else [("wi", "up")]
    ffn.append(("wo", "down"))
    pairs = [("shared", "backbone.shared"), ("lm_head", "backbone.lm_head")]
    for stack in ("encoder", "decoder"):
        hf, ours = f"{stack}.block.{{i}}.layer", f"backbone.{stack}.layers.{{i}}"
        pairs += _attention(f"{hf}.0.SelfAttention", f"{ours}.self_attention")
        pairs.append((f"{hf}.0.layer_norm", f"{ours}.self_attention_norm"))
        f = 1
        if stack == "decoder":
            pairs += _attention(f"{hf}.1.EncDecAttention", f"{ours}.cross_attention")
            pairs.append((f"{hf}.1.layer_norm", f"{ours}.cross_attention_norm"))
            f = 2
        pairs += [(f"{hf}.{f}.DenseReluDense.{a}", f"{ours}.ffn.{b}") for a, b in ffn]
        pairs.append((f"{hf}.{f}.layer_norm", f"{ours}.ffn_norm"))
        pairs.append((f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias",
                      f"backbone.{stack}.position_bias.embedding"))
        pairs.append((f"{stack}.final_layer_norm", f"backbone.{stack}.final_norm"))
    return pairs


# ---- config ---------------------------------------------------------------------------------

def _act_from_hf(proj: str) -> str:
    from ember.nn.activations import activation

    gated, _, name = proj.rpartition("-")
    if gated not in ("", "gated"):
        raise EmberError(f"config.json feed_forward_proj={proj!r}; expected 'relu', 'gated-gelu' or '[gated-]ACT'")
    name = "gelu_new" if proj == "gated-gelu" else name  # transformers' gated-gelu is the tanh GELU
    activation(name)  # an unknown activation is an EmberError naming the choices
    return _GATED + name if gated else name


def _act_to_hf(act: str) -> str:
    if act == _GATED + "gelu":
        raise EmberError("model.hidden_act='gated-gelu' (exact GELU) has no transformers spelling: its "
                         "feed_forward_proj 'gated-gelu' means the tanh GELU, ember's 'gated-gelu_new'")
    return "gated-gelu" if act == _GATED + "gelu_new" else act


def config_from_hf(hf: dict) -> ModelConfig:
    if hf.get("model_type") != MODEL_TYPE:
        raise EmberError(f"config.json has model_type={hf.get('model_type')!r}; this importer reads T5")
    tied = hf["scale_decoder_outputs"] if "scale_decoder_outputs" in hf else hf.get("tie_word_embeddings") is not False
    dropout = hf.get("dropout_rate", 0.1)
    layers = hf.get("num_layers", 6)
    return dataclasses.replace(
        model_preset("t5-small"),
        vocab_size=hf.get("vocab_size", 32128), hidden_size=hf.get("d_model", 512), num_layers=layers,
        num_decoder_layers=hf.get("num_decoder_layers") or layers, num_heads=hf.get("num_heads", 8),
        head_dim=hf.get("d_kv", 64), intermediate_size=hf.get("d_ff", 2048),
        max_position=hf.get("n_positions", 512), hidden_act=_act_from_hf(hf.get("feed_forward_proj", "relu")),
        dropout=dropout, attention_dropout=dropout, layer_norm_eps=hf.get("layer_norm_epsilon", 1e-6),
        initializer_range=hf.get("initializer_factor", 1.0), pad_token_id=hf.get("pad_token_id", 0),
        relative_attention_num_buckets=hf.get("relative_attention_num_buckets", 32),
        relative_attention_max_distance=hf.get("relative_attention_max_distance", 128),
        tie_word_embeddings=bool(tied),
    )


def config_to_hf(cfg: ModelConfig, architectures: list[str], extra: dict | None = None) -> dict:
    return {
        "model_type": MODEL_TYPE, "architectures": architectures, "is_encoder_decoder": True,
        "vocab_size": cfg.vocab_size, "d_model": cfg.hidden_size,
        "d_kv": cfg.head_dim or cfg.hidden_size // cfg.num_heads, "d_ff": cfg.intermediate_size,
        "num_layers": cfg.num_layers,
        "num_decoder_layers": cfg.num_decoder_layers or cfg.num_layers, "num_heads": cfg.num_heads,
        "relative_attention_num_buckets": cfg.relative_attention_num_buckets,
        "relative_attention_max_distance": cfg.relative_attention_max_distance,
        "dropout_rate": cfg.dropout, "layer_norm_epsilon": cfg.layer_norm_eps,
        "initializer_factor": cfg.initializer_range, "feed_forward_proj": _act_to_hf(cfg.hidden_act),
        "n_positions": cfg.max_position, "pad_token_id": cfg.pad_token_id,
        "decoder_start_token_id": cfg.pad_token_id,  # T5 starts decoding from the pad token
        "tie_word_embeddings": cfg.tie_word_embeddings, "scale_decoder_outputs": cfg.tie_word_embeddings,
        **(extra or {}),
    }


# ---- weights --------------------------------------------------------------------------------

def _check_config(cfg: ModelConfig) -> None:
    if cfg.family != MODEL_TYPE:
        raise EmberError(f"this is a {cfg.family} model; the T5 interop handles family t5 only")


def state_from_hf(hf_state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """T5ForConditionalGeneration (or v1.0 T5Model) weights -> ember ``backbone.*`` names."""
    _check_config(cfg)
    hf = {k.removeprefix("transformer."): v for k, v in hf_state.items() if k not in _IGNORED}
    if not any(k.startswith("decoder.") for k in hf):
        raise EmberError("this T5 checkpoint has no decoder (a T5EncoderModel); ember's T5 is the whole "
                         "encoder-decoder: import a T5ForConditionalGeneration or T5Model checkpoint")
    copies = [k for k in ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight") if k in hf]
    if not copies:
        raise EmberError("this T5 checkpoint has no embedding table (shared.weight / *.embed_tokens.weight)")
    hf["shared.weight"] = hf.pop(copies[0])
    for name in copies[1:]:
        pop_tied_decoder(hf, name, "shared.weight")  # the stacks' tables are tied copies
    if cfg.tie_word_embeddings:
        pop_tied_decoder(hf, "lm_head.weight", "shared.weight")
    elif "lm_head.weight" not in hf:
        raise EmberError("this T5 v1.1 checkpoint (untied LM head) has no lm_head.weight (a T5Model); "
                         "import the T5ForConditionalGeneration checkpoint, which carries the head")
    out, unmatched = rename(hf, module_rules(_names(cfg))[0])
    if unmatched:
        raise EmberError(f"unrecognised weights in the T5 checkpoint: {', '.join(unmatched[:5])}; ember reads "
                         "T5ForConditionalGeneration / T5Model (check feed_forward_proj matches the weights)")
    return out


def state_to_hf(state: dict[str, torch.Tensor], cfg: ModelConfig,
                architecture: str = "T5ForConditionalGeneration") -> dict[str, torch.Tensor]:
    """ember weights -> HF names of ``architecture`` (T5Model drops the head, T5EncoderModel
    keeps the embeddings and the encoder)."""
    _check_config(cfg)
    if architecture not in ARCHITECTURES:
        raise EmberError(f"T5 exports to {', '.join(ARCHITECTURES)}, not {architecture}")
    out, unmatched = rename(state, module_rules(_names(cfg))[1])
    if unmatched:
        raise EmberError(f"these weights have no T5 counterpart in transformers: {', '.join(unmatched[:5])}")
    if architecture != "T5ForConditionalGeneration":
        out.pop("lm_head.weight", None)
    if architecture == "T5EncoderModel":
        out = {k: v for k, v in out.items() if not k.startswith("decoder.")}
    return {k: v.contiguous() for k, v in out.items()}


def hf_architecture(state: dict[str, torch.Tensor]) -> str:
    return "T5ForConditionalGeneration"  # the LM head is always there (tied or own)
