"""A run's inference model as one graph, and what serving needs to know about the run.

``describe(run)`` reads a run (or export) folder and finds its *provider*
(``ember.tasks.inference.methods``): a fine-tuned run's task adapter, or for a pre-training run the
entry of its objective in ``ember.tasks.inference.pretrained``. The provider builds the inference model
on the backbone and names the methods it serves; nothing here knows about particular tasks.

``InferenceGraph.forward(input_ids, attention_mask, token_type_ids)`` runs ONE backbone pass
and returns the head's logits (``module.head_logits``: (B, C) per sequence, (B, T, C) per
token, (B, 2, T) start/end, as the module's ``logits_axes`` say) and every layer's hidden
states (L + 1, B, T, H), so a single exported graph (ONNX, int8) serves the task's methods
and ``embed``. ``tests/test_serve_export.py`` checks the graph against the task modules.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from ember.config import RunConfig
from ember.errors import EmberError


@dataclass
class ServeInfo:
    """What the predictor and the exporters need besides the weights."""

    kind: str  # the run's main method (classify, tag, answer, fill-mask, embed, generate, ...)
    task: str  # sst2, conll2003, squad2, ... or "mlm" / "clm" / "embed" for a pre-training run
    display_name: str
    labels: list[str] | None
    max_length: int  # default truncation length (the run's task.max_length / training length)
    max_position: int
    num_layers: int
    hidden_size: int
    family: str
    special: dict[str, int]  # pad/unk/cls/sep/mask ids (eot/pad for a causal LM)
    cfg: RunConfig = field(repr=False)
    provider: object = field(repr=False, default=None)  # task adapter or pre-training provider
    embedding: object = None  # RUN/embedding.json's defaults (ember.runs.embedding), if the run has one

    @property
    def is_regression(self) -> bool:
        return self.labels == ["score"]

    @property
    def pad_id(self) -> int:
        return self.special["pad"]

    @property
    def has_graph(self) -> bool:
        """False for models served by their own decoding loop (generation), not a graph."""
        return getattr(self.provider, "graph", True)

    def summary(self) -> dict:
        out = {"kind": self.kind, "task": self.task, "display_name": self.display_name,
               "labels": self.labels, "max_length": self.max_length, "family": self.family,
               "num_layers": self.num_layers, "hidden_size": self.hidden_size}
        if self.embedding is not None:
            out["embedding"] = {"pooling": self.embedding.pooling, "normalize": self.embedding.normalize}
        return out


def special_ids(tokenizer) -> dict[str, int]:
    """pad/unk/cls/sep/mask ids; a GPT vocabulary without them pads with end-of-text."""
    from ember.tokenizers import end_of_text_id, special_token_ids

    try:
        return special_token_ids(tokenizer)
    except EmberError:
        eot = end_of_text_id(tokenizer)
        return {"eot": eot, "pad": eot}


def weight_names(run_dir: Path) -> list[str]:
    """The tensor names stored in a run's weights (read from the header, no tensors loaded)."""
    from safetensors import safe_open

    path = Path(run_dir) / "model.safetensors"
    if not path.is_file():
        raise EmberError(f"{path} is missing: the run has no final weights yet (finish or resume "
                         "its training, or import a checkpoint with `ember convert`)")
    with safe_open(str(path), "pt") as fh:
        return list(fh.keys())


EXPORT_MANIFEST = "export.json"


def read_manifest(path: Path) -> dict | None:
    """The manifest of an `ember export` folder (None for a run folder)."""
    file = Path(path) / EXPORT_MANIFEST
    if not file.is_file():
        return None
    try:
        return json.loads(file.read_text())
    except ValueError as exc:
        raise EmberError(f"{file}: not valid JSON ({exc}); export the run again") from None


def export_state_keys(path: Path, manifest: dict) -> list[str]:
    """The weight names of the inference model an export holds (they choose a pre-training run's
    provider: an MLM head means fill-mask). Exports record them; older ones only said their kind."""
    if "state_keys" in manifest:
        return manifest["state_keys"]
    if manifest.get("format") == "int8":
        from safetensors import safe_open

        from ember.serve.quantize import INT8_FILE

        with safe_open(str(path / INT8_FILE), "pt") as fh:
            return [k.replace(".weight_int8", ".weight") for k in fh.keys()]
    return ["mlm.dense.weight"] if manifest.get("model", {}).get("kind") == "fill-mask" else []


def _provider(run_dir: Path, cfg: RunConfig, keys):
    if cfg.kind == "pretrain":
        from ember.tasks.inference.pretrained import pretrained_provider

        return pretrained_provider(cfg, keys)
    from ember.tasks.task_model import load_run_adapter

    if not cfg.task.name:  # e.g. a classifier imported with `ember convert --from-hf`
        raise EmberError(f"{run_dir}/config.yaml names no task (task.name), so the head's meaning is "
                         "unknown; fine-tune it with `ember finetune --task ...` or set task.name")
    adapter = load_run_adapter(run_dir, cfg)  # with its tuned settings (SQuAD 2.0's threshold)
    if getattr(adapter, "inference_methods", None) is None:
        why = getattr(adapter, "not_served_reason", "")
        raise EmberError(f"{run_dir} holds a fine-tuned {cfg.model.family} {adapter.display_name} model, which "
                         f"ember does not serve or export yet{': ' + why if why else ''}; use `ember predict` or "
                         "`ember evaluate` on the run folder")
    return adapter


def describe(run_dir: str | Path, state_keys=None):
    """(ServeInfo, tokenizer) of a run folder or an export folder (both hold config.yaml)."""
    from ember.runs.embedding import read_embedding_defaults
    from ember.runs.folder import load_run_config
    from ember.tokenizers import load_tokenizer

    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir)
    tokenizer = load_tokenizer(run_dir / "tokenizer.json")
    keys = state_keys
    if keys is None and cfg.kind == "pretrain":  # the weights choose what a pre-training run serves
        manifest = read_manifest(run_dir)
        keys = export_state_keys(run_dir, manifest) if manifest is not None else weight_names(run_dir)
    provider = _provider(run_dir, cfg, keys)
    m = cfg.model
    if cfg.kind == "pretrain":
        labels, max_length = None, min(cfg.data.max_seq_length, m.max_position)
    else:
        labels_file = run_dir / "labels.json"
        labels = json.loads(labels_file.read_text()) if labels_file.is_file() else provider.label_names()
        max_length = cfg.task.max_length
    embedding = read_embedding_defaults(run_dir)  # e.g. a sentence-transformers folder's pooling
    if embedding is not None and embedding.max_length:
        max_length = min(embedding.max_length, m.max_position)
    # a pre-training provider names what it serves (mlm, clm, ...); a task adapter is its task
    task = provider.task if cfg.kind == "pretrain" else provider.name
    info = ServeInfo(getattr(provider, "kind", "") or "", task,
                     provider.display_name, labels, max_length, m.max_position, m.num_layers, m.hidden_size,
                     m.family, special_ids(tokenizer), cfg, provider, embedding)
    return info, tokenizer


def build_module(info: ServeInfo) -> nn.Module:
    """The inference model of ``info`` with fresh (unloaded) weights."""
    from ember.models import build_backbone

    if not info.has_graph:
        why = getattr(info.provider, "no_graph_reason", "")  # the provider may say why it has none
        raise EmberError(f"{info.display_name} runs have no inference graph to export (ONNX, int8 "
                         f"file){': ' + why if why else ''}. `ember serve RUN` runs them with PyTorch (fp32 or "
                         "--int8), and `ember convert --to-hf` writes a Hugging Face folder")
    backbone = build_backbone(info.cfg.model)
    if info.cfg.task.features:
        from ember.tasks.families.feature_transfer import FeatureBackbone

        backbone = FeatureBackbone.for_task(backbone, info.cfg.task)
    return info.provider.build_module(backbone, info.pad_id)


def load_module(run_dir: str | Path, info: ServeInfo) -> nn.Module:
    """The fp32 inference model of a run folder (RUN/model.safetensors), in eval mode."""
    from ember.runs.checkpoint import load_weights

    state = load_weights(Path(run_dir) / "model.safetensors")
    module = build_module(info)
    if not getattr(info.provider, "load_strict", True):  # heads the inference model does not use
        wanted = module.state_dict()
        state = {k: v for k, v in state.items() if k in wanted}
    # Runs imported from HF masked-LM checkpoints carry no pooler; the MLM never uses it.
    missing, unexpected = module.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if not k.startswith("backbone.pooler.")]:
        raise EmberError(f"{run_dir}/model.safetensors does not fit its config.yaml "
                         f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    return module.eval()


class InferenceGraph(nn.Module):
    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self.logits_axes = module.logits_axes

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor,
                need_hidden: bool | Sequence[int] = True):
        """(logits, hidden states (L + 1, B, T, H), or only the layers ``need_hidden`` lists)."""
        m = self.module
        # a head that reads another pass than the backbone's own says which (BART: the decoder's
        # states; a Longformer's QA head: the question under global attention)
        run = getattr(m, "backbone_pass", m.backbone)
        out = run(input_ids, attention_mask, token_type_ids, output_hidden_states=bool(need_hidden))
        logits = m.head_logits(out, attention_mask)
        if not need_hidden:
            return logits, None
        return logits, torch.stack(hidden_layers(out.hidden_states, need_hidden))


def hidden_layers(states: Sequence, need_hidden: bool | Sequence[int]) -> Sequence:
    """The hidden states a caller asked for: every layer (True) or the listed ones, in that
    order. An embedding request reads one layer; stacking all L + 1 (each (B, T, H)) into a new
    tensor was ~1% of a MiniLM embedding pass and L + 1 times the memory."""
    return [states[i] for i in need_hidden] if isinstance(need_hidden, (list, tuple)) else states
