"""Which interop module handles which encoder family, and helpers the family modules share.

Every family module (``hf_bert``, ``hf_roberta``, ``hf_albert``, ``hf_distilbert``,
``hf_electra``) has the same interface:

    MODEL_TYPE                                  HF ``config.json`` "model_type"
    config_from_hf(hf: dict) -> ModelConfig
    config_to_hf(cfg, architectures, extra) -> dict
    state_from_hf(hf_state, cfg) -> ember state dict   (``backbone.*``, ``mlm.*``, ``nsp.*``,
                                                        ``sop.*``, ``classifier.*``)
    state_to_hf(state, cfg) -> HF state dict (names of the architecture below)
    hf_architecture(state) -> str               e.g. "RobertaForMaskedLM"
    objective_for(model_cfg) -> str             optional: the objective of an imported LM head
                                                when its weights alone do not tell (XLM)

Modules are imported lazily so a family still being written cannot break the others.
"""

from __future__ import annotations

import importlib
import re
from types import ModuleType

import torch

from ember.config import ModelConfig
from ember.errors import EmberError
from ember.interop.common import fuse_qkv, rename, split_qkv

FAMILIES = {
    "bert": "ember.interop.hf_bert",
    "roberta": "ember.interop.hf_roberta",
    "albert": "ember.interop.hf_albert",
    "distilbert": "ember.interop.hf_distilbert",
    "electra": "ember.interop.hf_electra",
    "gpt2": "ember.interop.hf_gpt2",
    "gpt": "ember.interop.hf_gpt1",  # GPT-1; transformers calls it "openai-gpt"
    "t5": "ember.interop.hf_t5",
    "bart": "ember.interop.hf_bart",  # BART and mBART (Lewis et al. 2020; Liu et al. 2020)
    "xlnet": "ember.interop.hf_xlnet",
    "xlm": "ember.interop.hf_xlm",  # XLMWithLMHeadModel (Lample & Conneau 2019)
    # not a family of its own: a RoBERTa-style encoder with model.attention=longformer
    "longformer": "ember.interop.hf_longformer",
    "big_bird": "ember.interop.hf_big_bird",  # likewise: a BERT-style encoder with model.attention=bigbird
}
# A long-input attention variant exports to its own transformers layout, whatever the family.
ATTENTION_LAYOUTS = {"longformer": "longformer", "bigbird": "big_bird"}
# HF model_type -> ember family where the two names differ.
_MODEL_TYPES = {"openai-gpt": "gpt", "mbart": "bart"}


def interop_for_family(family: str) -> ModuleType:
    """The interop module of an ember model family (``ModelConfig.family``)."""
    try:
        name = FAMILIES[family]
    except KeyError:
        raise EmberError(f"no Hugging Face interop for model family {family!r}; "
                         f"supported: {', '.join(FAMILIES)}") from None
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        raise EmberError(f"Hugging Face interop for {family!r} is not available in this ember "
                         f"version ({name} is missing)") from None


def interop_for_model(cfg: ModelConfig) -> ModuleType:
    """The interop module that exports a model: its attention variant's layout (a BERT made long
    is a transformers Longformer), else its family's."""
    if cfg.attention == "reformer" or cfg.reversible:  # no layout of the family holds them
        raise EmberError("a model with model.attention=reformer or model.reversible=true has no transformers "
                         "layout to export to (transformers' ReformerModel differs in its embeddings: axial "
                         "positions, no LayerNorm); keep it as an ember run")
    return interop_for_family(ATTENTION_LAYOUTS.get(cfg.attention, cfg.family))


def interop_for_hf_config(hf: dict) -> ModuleType:
    """The interop module for an HF ``config.json`` dict, chosen by its ``model_type``.

    Checkpoints converted from the original TF BERT release predate ``model_type``; they
    are read as BERT.
    """
    model_type = hf.get("model_type", "bert")
    family = _MODEL_TYPES.get(model_type, model_type)  # otherwise the names coincide
    if family not in FAMILIES:
        known = [t for t, f in _MODEL_TYPES.items()] + [f for f in FAMILIES if f not in _MODEL_TYPES.values()]
        raise EmberError(f"config.json has model_type={model_type!r}; ember imports "
                         f"{', '.join(known)} checkpoints")
    return interop_for_family(family)


def import_checkpoint(hf_config: dict, hf_state: dict[str, torch.Tensor]) -> tuple[ModelConfig, dict]:
    """HF config + weights -> (ModelConfig, ember state dict), the family chosen by model_type.

    The config keeps the family's pooler even when the checkpoint has none (transformers
    builds ``XForMaskedLM`` with ``add_pooling_layer=False``): fine-tuning then starts the
    pooler fresh, as transformers' ``XForSequenceClassification`` does from such a
    checkpoint, and masked-LM inference never reads it.
    """
    interop = interop_for_hf_config(hf_config)
    cfg = interop.config_from_hf(hf_config)
    hf_state, qa_head = split_qa_head(interop, hf_state)
    return cfg, {**interop.state_from_hf(hf_state, cfg), **qa_head}


# Extractive QA (BERT §4.2): every encoder family's ``…ForQuestionAnswering`` is the encoder (without
# a pooler) and ``qa_outputs`` = Linear(H, 2) on its last hidden states, named as ember's QA head
# (ember.tasks.qa.head), so the head travels as it is. XLNet maps its own heads (hf_xlnet.HEADS);
# BigBird's QA head has more layers, XLM's ``…ForQuestionAnswering`` is the beam-search head.
QA_PREFIX = "qa_outputs."
QA_MODEL_TYPES = ("bert", "roberta", "albert", "electra", "distilbert", "longformer")


def _generic_qa(interop: ModuleType) -> bool:
    return getattr(interop, "MODEL_TYPE", None) in QA_MODEL_TYPES


def split_qa_head(interop: ModuleType, state: dict) -> tuple[dict, dict]:
    """(state without the QA head, the QA head's tensors) where the family's QA head is the generic one."""
    if not _generic_qa(interop):
        return state, {}
    head = {k: v for k, v in state.items() if k.startswith(QA_PREFIX)}
    return {k: v for k, v in state.items() if k not in head}, head


def export_state(interop: ModuleType, state: dict, cfg: ModelConfig) -> tuple[str, dict]:
    """(transformers architecture, HF state dict) of an ember state dict; a QA run exports as the
    family's ``…ForQuestionAnswering`` (no pooler, as transformers builds it)."""
    state, head = split_qa_head(interop, state)
    if not head:
        return interop.hf_architecture(state), interop.state_to_hf(state, cfg)
    encoder = {k: v for k, v in state.items() if k.startswith("backbone.") and not k.startswith("backbone.pooler.")}
    base = interop.hf_architecture(encoder)
    if not base.endswith("Model"):
        raise EmberError(f"a QA run's encoder exported as {base}; expected a base model")
    return base.removesuffix("Model") + "ForQuestionAnswering", {**interop.state_to_hf(encoder, cfg), **head}


# ---- helpers shared by the family modules -------------------------------------------------
#
# A family's name map is a list of (HF module, ember module) pairs; each pair renames that
# module's ``.weight``/``.bias`` both ways. "{i}" stands for a layer index. The q/k/v
# projections map to temporary ``qkv.{i}.<name>`` entries that are fused into ember's one
# (3H, H) ``attention.qkv`` projection on import and split again on export.

_BUFFERS = ("position_ids", "token_type_ids")  # non-persistent buffers some old files carry


def _pattern(name: str) -> str:
    return re.escape(name).replace(re.escape("{i}"), r"(\d+)") + r"\.(weight|bias)"


def _replacement(name: str) -> str:
    return name.replace("{i}", r"\1") + (r".\2" if "{i}" in name else r".\1")


def module_rules(pairs: list[tuple[str, str]], hf_prefix: str = "") -> tuple[list, list]:
    """(HF -> ember rules, ember -> HF rules) for ``rename``; HF names get ``hf_prefix``
    on export (e.g. "roberta." for the encoder inside a head model)."""
    from_hf = [(_pattern(hf), _replacement(ours)) for hf, ours in pairs]
    to_hf = [(_pattern(ours), _replacement(hf_prefix + hf)) for hf, ours in pairs]
    return from_hf, to_hf


def hf_tensors(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """Drop a leading ``prefix`` (e.g. "roberta.") where present - head models keep the
    encoder under it, base models saved alone do not - and skip non-parameter buffers."""
    return {k.removeprefix(prefix): v for k, v in state.items() if not k.endswith(_BUFFERS)}


def rename_from_hf(state: dict, rules: list, qkv_names: tuple[str, str, str], qkv_layers: int,
                   family: str) -> dict[str, torch.Tensor]:
    """Rename HF tensors to ember names and fuse q/k/v; unknown tensors are an error."""
    out, unmatched = rename(state, rules)
    if unmatched:
        raise EmberError(f"unrecognised weights in the {family} checkpoint: {_some(unmatched)}; "
                         "ember reads the base model and its MLM / pre-training / sequence "
                         "classification heads")
    fuse_qkv(out, "qkv.{i}", "backbone.layers.{i}.attention.qkv", qkv_layers, qkv_names)
    return out


def rename_to_hf(state: dict, rules: list, qkv_names: tuple[str, str, str], qkv_layers: int,
                 family: str) -> dict[str, torch.Tensor]:
    """Split ember's fused q/k/v, then rename to HF names; tensors without an HF home are an error."""
    state = dict(state)
    split_qkv(state, "backbone.layers.{i}.attention.qkv", "qkv.{i}", qkv_layers, qkv_names)
    out, unmatched = rename(state, rules)
    if unmatched:
        raise EmberError(f"these weights have no {family} counterpart in transformers: {_some(unmatched)}")
    return {k: v.contiguous() for k, v in out.items()}


def _some(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def pop_tied_decoder(state: dict[str, torch.Tensor], decoder: str, word: str,
                     decoder_bias: str | None = None, bias: str | None = None) -> None:
    """Remove an MLM decoder that is tied to the word embeddings, in place.

    ember ties the decoder (V, E) to the word embeddings (as BERT does, following Press &
    Wolf 2017), so only the output bias travels. A checkpoint whose decoder differs from its
    embeddings cannot be represented and is refused rather than silently retied.
    """
    weight = state.pop(decoder, None)
    if weight is not None and word in state and not torch.equal(weight, state[word]):
        raise EmberError(f"this checkpoint's MLM decoder ({decoder}) is not tied to the word "
                         "embeddings; ember ties them, as the original models do")
    if decoder_bias is not None:
        extra = state.pop(decoder_bias, None)
        if extra is not None and bias in state and not torch.equal(extra, state[bias]):
            raise EmberError(f"this checkpoint's {decoder_bias} differs from {bias}; "
                             "transformers ties them, so the checkpoint is inconsistent")


def check_exportable(cfg: ModelConfig, family: str, *, factorized: bool = False,
                     sharing: tuple[str, ...] = ("none",)) -> None:
    """Refuse ember options that the family's transformers class cannot express."""
    if cfg.pre_layer_norm:
        raise EmberError(f"{family} in transformers is post-LayerNorm; this model was built with "
                         "model.pre_layer_norm=true and has no HF counterpart")
    if cfg.share_layers not in sharing:
        raise EmberError(f"{family} in transformers cannot express model.share_layers="
                         f"{cfg.share_layers!r} (exportable: {', '.join(sharing)})")
    e = cfg.embedding_size or cfg.hidden_size
    if not factorized and e != cfg.hidden_size:
        raise EmberError(f"{family} in transformers has no factorized embeddings; this model has "
                         f"embedding_size={e} != hidden_size={cfg.hidden_size}")


def drop_unused_pooler(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An MLM-only model never uses its pooler, and transformers' ``XForMaskedLM`` has none
    (``add_pooling_layer=False``): leave it out of the export. Base models keep theirs."""
    if not any(k.startswith("mlm.") for k in state) or any(k.startswith(("nsp.", "sop.", "classifier.")) for k in state):
        return state
    return {k: v for k, v in state.items() if not k.startswith("backbone.pooler.")}
