"""Embeddings from any encoder: pooled hidden states of a chosen layer (or a scalar mix of all).

``EmbedMethod`` reads the hidden states that every inference graph returns beside its head's
logits, so every encoder run embeds: a fine-tuned one, an MLM pre-training run, an ELECTRA
discriminator, an imported ``BertModel`` without any head. ``EmbeddingModel`` is the
inference model of a run that has no head to serve (its "logits" are the last hidden states).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ember.errors import RequestError
from ember.runs.embedding import EmbeddingDefaults
from ember.tasks.inference.methods import encode_texts, softmax, token_view
from ember.tasks.inference.requests import TEXT_FIELDS, body_schema, check_fields, int_field, parse_texts

POOLINGS = ("mean", "cls", "none")


class EmbeddingModel(nn.Module):
    """A backbone alone; ``head_logits`` = the last hidden states (B, T, H)."""

    logits_axes = {0: "batch", 1: "seq"}

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone

    def head_logits(self, out, attention_mask: torch.Tensor) -> torch.Tensor:
        return out.last_hidden_state

    @staticmethod
    def compare_view(logits: np.ndarray, mask: np.ndarray, regression: bool = False):
        valid, _ = token_view(logits, mask)
        return valid, None  # hidden states have no prediction to agree on


class EmbedMethod:
    """``embed``: texts -> mean / [CLS] / per-token vectors of a layer or an ELMo-style scalar mix."""

    name = "embed"
    inputs = {"text": "texts", "text_pair": "text_pairs"}  # per-input fields, single -> plural
    # The page at / (ember.serve.page) shows the cosine similarities of a few sentences.
    form = {"title": "Embed", "view": "embed", "fields": [
        {"name": "texts", "label": "Sentences (one per line)", "type": "lines",
         "default": "A man is playing a guitar.\nSomeone is playing an instrument.\n"
                    "The stock market fell sharply today.\nShare prices dropped."},
        {"name": "pooling", "label": "Pooling", "type": "select", "options": ["mean", "cls"], "default": "mean"},
        {"name": "normalize", "type": "hidden", "value": True}]}
    request_schema = body_schema(
        "Texts -> vectors: pooled over tokens (mean or [CLS]) or per token, from one layer or a softmax-"
        "weighted mix of all layers (ELMo's scalar mix).",
        {**TEXT_FIELDS,
         "pooling": {"type": "string", "enum": ["mean", "cls", "none"], "default": "mean",
                     "description": "mean over tokens, the [CLS] vector, or none (one vector per token)"},
         "layer": {"type": "integer", "default": -1, "description": "0 = embeddings, 1..L the layers, -1 the last"},
         "layer_weights": {"type": "array", "items": {"type": "number"},
                           "description": "one weight per layer, embeddings first (L + 1), softmax-mixed; "
                           "instead of 'layer'"},
         "normalize": {"type": "boolean", "default": False, "description": "scale each vector to unit length"}},
        {"texts": ["a cat sat on the mat", "a dog lay on the rug"], "pooling": "mean", "normalize": True})

    def __init__(self, ctx) -> None:
        self.encoder, self.tokenizer = ctx.encoder(), ctx.tokenizer
        self.num_layers, self.hidden_size = ctx.num_layers, ctx.hidden_size
        self.defaults = ctx.embedding or EmbeddingDefaults()  # RUN/embedding.json, e.g. sentence-transformers'

    def parse(self, data: dict, limits) -> dict:
        """Texts as for /classify, plus pooling (mean | cls | none = per token), layer (0 =
        embeddings, -1 = last) or layer_weights (one per layer incl. embeddings, softmax-mixed),
        normalize. Pooling and normalize default to the run's (RUN/embedding.json; else mean,
        unnormalised)."""
        check_fields(data, {"text", "texts", "text_pair", "text_pairs", "pooling", "layer", "layer_weights",
                            "normalize"})
        req = parse_texts({k: v for k, v in data.items() if k in ("text", "texts", "text_pair", "text_pairs")},
                          limits)
        pooling = data.get("pooling", self.defaults.pooling)
        if pooling not in POOLINGS:
            raise RequestError(422, f"'pooling' must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        n = self.num_layers + 1
        if "layer" in data and "layer_weights" in data:
            raise RequestError(422, "send 'layer' or 'layer_weights', not both")
        layer = int_field(data, "layer", -1, -n, n - 1)
        weights = data.get("layer_weights")
        if weights is not None:
            if (not isinstance(weights, list) or len(weights) != n
                    or not all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in weights)):
                raise RequestError(422, f"'layer_weights' must be a list of {n} numbers (embeddings + "
                                   f"{self.num_layers} layers)")
            if not all(abs(w) < 1e6 for w in weights):
                raise RequestError(422, "'layer_weights' must be finite numbers below 1e6 in size")
        normalize = data.get("normalize", self.defaults.normalize)
        if not isinstance(normalize, bool):
            raise RequestError(422, f"'normalize' must be true or false, not {type(normalize).__name__}")
        return {**req, "pooling": pooling, "layer": layer, "layer_weights": weights, "normalize": normalize}

    def __call__(self, requests, forward) -> list[dict]:
        rows, flags, spans = encode_texts(self.encoder, requests)
        # Only the layers these requests read come back (a scalar mix reads them all).
        n = self.num_layers + 1
        if any(req["layer_weights"] is not None for req in requests):
            layers, at = True, {i: i for i in range(n)}
        else:
            layers = sorted({req["layer"] % n for req in requests})
            at = {layer: i for i, layer in enumerate(layers)}
        outs = forward(rows, layers)
        responses = []
        for req, s in zip(requests, spans):
            results = []
            for (_, hidden), (ids, _), cut in zip(outs[s], rows[s], flags[s]):
                if req["layer_weights"] is not None:
                    # ELMo's scalar mix (Peters et al. 2018, eq. 1) with fixed weights: softmax(w)
                    w = softmax(np.asarray(req["layer_weights"], dtype=np.float64))
                    states = np.tensordot(w, hidden, axes=1)  # (n, H)
                else:
                    states = hidden[at[req["layer"] % n]]  # (n, H)
                if req["pooling"] == "none":
                    vectors = states
                    result = {"tokens": [self.tokenizer.id_to_token(t) for t in ids]}
                else:
                    vectors = states[0] if req["pooling"] == "cls" else states.mean(0)  # no padding here
                    result = {}
                if req["normalize"]:
                    vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
                key = "embeddings" if req["pooling"] == "none" else "embedding"
                result.update({key: np.asarray(vectors, dtype=np.float32).tolist(), "truncated": cut})
                results.append(result)
            responses.append({"results": results, "truncated": any(flags[s]), "dimension": int(self.hidden_size)})
        return responses


class EmbeddingProvider:
    """What an encoder run without a head to serve offers: embed only (every encoder run has it)."""

    kind = "embed"
    task = "embed"
    graph = True
    load_strict = False  # any pre-training heads in the run are not part of the inference model

    def __init__(self, cfg, state_keys=()) -> None:
        self.display_name = f"{cfg.model.family} encoder"

    def build_module(self, backbone: nn.Module, pad_id: int) -> EmbeddingModel:
        return EmbeddingModel(backbone)

    def inference_methods(self, ctx) -> list:
        return []
