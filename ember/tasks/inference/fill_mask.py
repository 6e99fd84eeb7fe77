"""Masked-LM inference: the MLM head of a pre-training run, and fill-mask (top-k per [MASK]).

Any run whose weights hold an MLM head (``mlm.*``: BERT, RoBERTa, ALBERT, SpanBERT, an imported
``XForMaskedLM``) is served by ``MaskedLM``: the backbone and that head, nothing else (the NSP,
SOP or SBO heads a run may also carry are left unloaded). ``FillMaskMethod`` decodes its
logits; ``FillMask`` is the same for one text at a time (`ember fill-mask`, the quickstart).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from ember.errors import EmberError, RequestError
from ember.nn.heads import MaskedLMHead
from ember.tasks.inference.methods import encode_texts, softmax, token_view
from ember.tasks.inference.requests import body_schema, check_fields, int_field, string_schema, text_field


class MaskedLM(nn.Module):
    """Backbone + MLM head (state names ``backbone.*``, ``mlm.*`` as in every MLM objective)."""

    logits_axes = {0: "batch", 1: "seq"}  # (B, T, V)
    compare_view = staticmethod(token_view)

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        cfg = backbone.config
        self.backbone = backbone
        self.mlm = MaskedLMHead(cfg.hidden_size, cfg.vocab_size, cfg.hidden_act, cfg.layer_norm_eps,
                                cfg.embedding_size or None)

    def head_logits(self, out, attention_mask: torch.Tensor) -> torch.Tensor:  # (B, T, V)
        return self.mlm(out.last_hidden_state, self.backbone.word_embeddings)


class FillMaskMethod:
    """``fill-mask``: a text with mask tokens -> the top-k tokens and probabilities per mask."""

    name = "fill-mask"
    inputs = {"text": None}  # one text per request
    request_schema = body_schema(
        "A text with the tokenizer's mask token(s) -> the most likely tokens and their probabilities per mask.",
        {"text": string_schema("the text, with one or more mask tokens (e.g. [MASK])"),
         "top_k": {"type": "integer", "minimum": 1, "maximum": 100, "default": 5,
                   "description": "tokens returned per mask"}},
        {"text": "the capital of france is [MASK] .", "top_k": 5}, required=("text",))

    def __init__(self, ctx) -> None:
        self.encoder, self.tokenizer, self.max_length = ctx.encoder(), ctx.tokenizer, ctx.max_length
        self.mask_id = ctx.special["mask"]
        self.mask_token = self.tokenizer.id_to_token(self.mask_id)
        # The page at / (ember.serve.page): the example carries this vocabulary's mask token.
        self.form = {"title": "Fill mask", "view": "fill-mask", "fields": [
            {"name": "text", "label": f"Text with {self.mask_token}", "type": "textarea",
             "default": f"The capital of France is {self.mask_token}."},
            {"name": "top_k", "label": "Top k", "type": "number", "default": 5, "min": 1, "max": 100}]}

    def parse(self, data: dict, limits) -> dict:
        """{"text": str with mask tokens, "top_k": int (default 5)}."""
        check_fields(data, {"text", "top_k"})
        if "text" not in data:
            raise RequestError(422, "'text' is required")
        return {"texts": [text_field(data["text"], "text", limits)], "pairs": None,
                "top_k": int_field(data, "top_k", 5, 1, 100)}

    def __call__(self, requests, forward) -> list:
        rows, flags, spans = encode_texts(self.encoder, requests)
        outs = forward(rows, False)
        responses = []
        for req, s in zip(requests, spans):
            (logits, _), (ids, _), cut = outs[s][0], rows[s][0], flags[s][0]
            positions = [p for p, t in enumerate(ids) if t == self.mask_id]
            if not positions:
                where = f" within the first {self.max_length} tokens" if cut else ""
                responses.append(RequestError(422, f"no {self.mask_token} token in 'text'{where}; write e.g. "
                                              f"'Paris is the capital of {self.mask_token}.'"))
                continue
            masks = []
            for p in positions:
                probs = softmax(logits[p].astype(np.float64))
                top = np.argsort(-probs, kind="stable")[: req["top_k"]]
                masks.append([{"token": self.tokenizer.id_to_token(int(t)), "probability": float(probs[t])}
                              for t in top])
            responses.append({"masks": masks, "truncated": cut})
        return responses


class FillMask:
    """`ember fill-mask`: the top-k tokens for each mask token of one text."""

    def __init__(self, run_dir: str | Path, device: str = "cpu") -> None:
        from ember.config import ENCODER_FAMILIES
        from ember.models import build_backbone
        from ember.runs.checkpoint import load_weights
        from ember.runs.folder import check_family, load_run_config
        from ember.tokenizers import load_tokenizer, special_token_ids

        run_dir = Path(run_dir)
        cfg = load_run_config(run_dir, expect_kind="pretrain")
        check_family(run_dir, cfg, ENCODER_FAMILIES)  # every encoder family, given an MLM head
        self.tokenizer = load_tokenizer(run_dir / "tokenizer.json")
        self.special = special_token_ids(self.tokenizer)
        state = load_weights(run_dir / "model.safetensors")
        if "mlm.dense.weight" not in state:
            raise EmberError(f"{run_dir} has no masked-LM head (objective {cfg.objective!r}, e.g. an ELECTRA "
                             "discriminator or an imported encoder without its MLM head); fill-mask needs a "
                             "model pre-trained with masked LM")
        self.model = load_masked_lm(build_backbone(cfg.model), state, run_dir).to(device).eval()
        self.device = device
        self.mask_token = self.tokenizer.id_to_token(self.special["mask"])

    @torch.no_grad()
    def __call__(self, text: str, top_k: int = 5) -> list[list[tuple[str, float]]]:
        """For each mask in ``text``: [(token, probability), ...] best first."""
        enc = self.tokenizer.encode(text)
        ids = torch.tensor([enc.ids], device=self.device)
        positions = (ids[0] == self.special["mask"]).nonzero().flatten()
        if len(positions) == 0:
            raise EmberError(f"no {self.mask_token} token in the text; write e.g. "
                             f"'Paris is the capital of {self.mask_token}.'")
        max_pos = self.model.backbone.config.max_position
        if ids.shape[1] > max_pos:
            raise EmberError(f"the text has {ids.shape[1]} tokens; the model takes at most {max_pos}")
        mask = torch.ones_like(ids)
        out = self.model.backbone(ids, mask, torch.tensor([enc.type_ids], device=self.device))
        logits = self.model.head_logits(out, mask)
        results = []
        for pos in positions.tolist():
            top = logits[0, pos].softmax(-1).topk(top_k)
            results.append([(self.tokenizer.id_to_token(i), float(p))
                            for p, i in zip(top.values.tolist(), top.indices.tolist())])
        return results


def load_masked_lm(backbone: nn.Module, state: dict, where) -> MaskedLM:
    """A ``MaskedLM`` with a run's backbone and MLM head; other heads in ``state`` are ignored,
    and a pooler may be missing (imported ``XForMaskedLM`` checkpoints have none; MLM never uses it)."""
    model = MaskedLM(backbone)
    missing, unexpected = model.load_state_dict(
        {k: v for k, v in state.items() if k.startswith(("backbone.", "mlm."))}, strict=False)
    if unexpected or [k for k in missing if not k.startswith("backbone.pooler.")]:  # e.g. more layers than config.yaml
        raise EmberError(f"{where}: the weights do not fit the run's config.yaml (missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]})")
    return model


class MaskedLMProvider:
    """What a pre-training run with an MLM head serves: fill-mask (and, as every encoder, embed)."""

    kind = "fill-mask"
    task = "mlm"
    graph = True
    load_strict = False  # NSP/SOP/SBO heads in the run are not part of the inference model

    def __init__(self, cfg, state_keys=()) -> None:
        self.display_name = f"{cfg.model.family} masked LM"

    def build_module(self, backbone: nn.Module, pad_id: int) -> MaskedLM:
        return MaskedLM(backbone)

    def inference_methods(self, ctx) -> list:
        return [FillMaskMethod(ctx)]
