"""A run's task model as one inference graph, and what serving needs to know about it.

``InferenceGraph.forward(input_ids, attention_mask, token_type_ids)`` returns the task's
logits and every layer's hidden states from ONE backbone pass, so a single exported graph
(ONNX, int8) serves both the task endpoint and ``/embed``:

    classify   logits (B, num_labels)      [CLS] (through the pooler when there is one)
    tag        logits (B, T, num_labels)   per token (CoNLL NER)
    answer     logits (B, 2, T)            start / end per token; padding set to -1e4 (SQuAD)
    fill-mask  logits (B, T, V)            MLM head over the vocabulary (pre-training runs)
    hidden_states (L + 1, B, T, H)         embeddings output first, then each layer

The heads are applied exactly as the task modules' own ``logits`` methods do (dropout is a
no-op in eval mode); ``tests/test_serve_export.py`` checks the graph against them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ember.config import DECODER_FAMILIES, RunConfig
from ember.errors import EmberError

# kind -> the HTTP endpoints a model of that kind serves (besides /healthz and /embed).
KIND_ENDPOINTS = {"classify": "/classify", "tag": "/tag", "answer": "/answer", "fill-mask": "/fill-mask"}
ADAPTER_KINDS = {"ConllNerAdapter": "tag", "SquadAdapter": "answer"}


@dataclass
class ServeInfo:
    """What the predictor and the exporters need besides the weights."""

    kind: str  # classify | tag | answer | fill-mask | generate (GPT runs, serve/generation.py)
    task: str  # sst2, conll2003, squad2, ... or "mlm" / "clm" for a pre-training run
    display_name: str
    labels: list[str] | None
    max_length: int  # default truncation length (the run's task.max_length)
    max_position: int
    num_layers: int
    hidden_size: int
    family: str
    special: dict[str, int]  # pad/unk/cls/sep/mask ids (eot/pad for a causal LM)
    cfg: RunConfig = field(repr=False)

    @property
    def is_regression(self) -> bool:
        return self.kind == "classify" and self.labels == ["score"]

    @property
    def pad_id(self) -> int:
        return self.special["pad"]

    def summary(self) -> dict:
        return {"kind": self.kind, "task": self.task, "display_name": self.display_name,
                "labels": self.labels, "max_length": self.max_length, "family": self.family,
                "num_layers": self.num_layers, "hidden_size": self.hidden_size}


def is_causal_lm(run_dir: str | Path) -> bool:
    """Whether a run folder holds a GPT-1/GPT-2 decoder (served by /generate, serve/generation.py)."""
    from ember.runs.folder import load_run_config

    return load_run_config(Path(run_dir)).model.family in DECODER_FAMILIES


def describe(run_dir: str | Path):
    """(ServeInfo, tokenizer) of a run folder or an export folder (both hold config.yaml)."""
    from ember.tokenizers import load_tokenizer, special_token_ids
    from ember.runs.folder import load_run_config

    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir)
    tokenizer = load_tokenizer(run_dir / "tokenizer.json")
    m = cfg.model
    if m.family in DECODER_FAMILIES:
        return _describe_causal_lm(run_dir, cfg, tokenizer), tokenizer
    special = special_token_ids(tokenizer)
    common = dict(max_position=m.max_position, num_layers=m.num_layers, hidden_size=m.hidden_size,
                  family=m.family, special=special, cfg=cfg)
    if cfg.kind == "pretrain":
        return ServeInfo("fill-mask", "mlm", f"{m.family} masked LM", None,
                         min(cfg.data.max_seq_length, m.max_position), **common), tokenizer
    from ember.tasks.glue_adapter import GlueAdapter
    from ember.tasks.base import get_adapter

    if not cfg.task.name:  # e.g. a classifier imported with `ember convert --from-hf`
        raise EmberError(f"{run_dir}/config.yaml names no task (task.name), so the head's meaning is "
                         "unknown; fine-tune it with `ember finetune --task ...` or set task.name")
    adapter = get_adapter(cfg.task.name)
    # The adapter class says which head the run has (imported lazily, like the registry does).
    kind = "classify" if isinstance(adapter, GlueAdapter) else ADAPTER_KINDS.get(type(adapter).__name__)
    if kind is None:
        raise EmberError(f"{run_dir}: serving does not support {adapter.display_name} models yet")
    labels_file = run_dir / "labels.json"
    labels = json.loads(labels_file.read_text()) if labels_file.is_file() else adapter.label_names()
    return ServeInfo(kind, adapter.name, adapter.display_name, labels, cfg.task.max_length, **common), tokenizer


def _describe_causal_lm(run_dir: Path, cfg: RunConfig, tokenizer) -> ServeInfo:
    """A GPT-1/GPT-2 pre-training run: served by /generate (serve.generation), not by a graph.
    Its context is the training block length, within the positions (as `ember fewshot`)."""
    from ember.tokenizers import end_of_text_id

    m = cfg.model
    if cfg.kind != "pretrain":
        raise EmberError(f"{run_dir} holds a fine-tuned {m.family} classifier, which `ember serve` does not "
                         "serve yet; classify with `ember predict`, or serve the GPT pre-training run it "
                         "started from (/generate)")
    eot = end_of_text_id(tokenizer)  # GPT vocabularies may have no pad/cls/mask: pad with end-of-text
    context = min(cfg.data.max_seq_length, m.max_position)
    return ServeInfo("generate", "clm", f"{m.family} causal LM", None, context, m.max_position,
                     m.num_layers, m.hidden_size, m.family, {"eot": eot, "pad": eot}, cfg)


def build_module(info: ServeInfo, state_keys) -> nn.Module:
    """The task module of ``info`` with fresh (unloaded) weights; ``state_keys`` picks the
    pre-training sentence head (NSP or SOP) so a strict load fits."""
    from ember.models import build_backbone

    if info.kind == "generate":
        raise EmberError(f"{info.display_name} runs have no inference graph to export (ONNX, int8 file): "
                         "`ember serve RUN` generates with PyTorch (fp32 or --int8), and `ember convert "
                         "--to-hf` writes a Hugging Face folder")
    backbone = build_backbone(info.cfg.model)
    if info.kind == "fill-mask":
        from ember.config import DataConfig
        from ember.objectives.bert import BertPretraining

        keys = set(state_keys)
        if "mlm.dense.weight" not in keys:
            raise EmberError("this pre-training run has no masked-LM head (e.g. an ELECTRA discriminator); "
                             "serve a fine-tuned run or an MLM pre-training run")
        sentence = "nsp" if "nsp.weight" in keys else "sop" if "sop.weight" in keys else "none"
        return BertPretraining(backbone, info.special, DataConfig(), sentence)
    from ember.tasks.base import get_adapter

    return get_adapter(info.task).build_module(backbone, info.pad_id)


def load_module(run_dir: str | Path, info: ServeInfo) -> nn.Module:
    """The fp32 task module of a run folder (RUN/model.safetensors), in eval mode."""
    from ember.runs.checkpoint import load_weights

    state = load_weights(Path(run_dir) / "model.safetensors")
    module = build_module(info, state.keys())
    # Runs imported from HF masked-LM checkpoints carry no pooler; the MLM never uses it.
    missing, unexpected = module.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if not k.startswith("backbone.pooler.")]:
        raise EmberError(f"{run_dir}/model.safetensors does not fit its config.yaml "
                         f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    return module.eval()


class InferenceGraph(nn.Module):
    def __init__(self, module: nn.Module, kind: str) -> None:
        super().__init__()
        if kind not in KIND_ENDPOINTS:
            raise ValueError(f"unknown model kind {kind!r}")
        self.module = module
        self.kind = kind

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor,
                need_hidden: bool = True):
        m = self.module
        out = m.backbone(input_ids, attention_mask, token_type_ids, output_hidden_states=need_hidden)
        h = out.last_hidden_state  # (B, T, H)
        if self.kind == "classify":
            pooled = out.pooled if out.pooled is not None else h[:, 0]
            logits = m.classifier(pooled)  # (B, L)
        elif self.kind == "tag":
            logits = m.classifier(h)  # (B, T, L)
        elif self.kind == "answer":
            pad = attention_mask == 0
            start, end = m.qa_outputs(h).unbind(-1)  # (B, T) each
            logits = torch.stack([start.masked_fill(pad, -1e4), end.masked_fill(pad, -1e4)], dim=1)
        else:
            logits = m.mlm(h, m.backbone.word_embeddings)  # (B, T, V)
        if not need_hidden:
            return logits, None
        return logits, torch.stack(out.hidden_states)  # (L + 1, B, T, H)
