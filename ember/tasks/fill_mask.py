"""Fill-mask inference with a pre-trained MLM: the top-k tokens for each [MASK]."""

from __future__ import annotations

from pathlib import Path

import torch

from ember.errors import EmberError


class FillMask:
    def __init__(self, run_dir: str | Path, device: str = "cpu") -> None:
        from ember.config import ENCODER_FAMILIES, DataConfig
        from ember.models import build_backbone
        from ember.objectives.bert import BertPretraining
        from ember.tokenizers import load_tokenizer, special_token_ids
        from ember.runs.checkpoint import load_weights
        from ember.runs.folder import check_family, load_run_config

        run_dir = Path(run_dir)
        cfg = load_run_config(run_dir, expect_kind="pretrain")
        check_family(run_dir, cfg, ENCODER_FAMILIES)  # every encoder family, given an MLM head
        self.tokenizer = load_tokenizer(run_dir / "tokenizer.json")
        self.special = special_token_ids(self.tokenizer)
        state = load_weights(run_dir / "model.safetensors")
        if "mlm.dense.weight" not in state:
            raise EmberError(f"{run_dir} has no masked-LM head (objective {cfg.objective!r}, e.g. an ELECTRA "
                             "discriminator); fill-mask needs a model pre-trained with masked LM")
        # The sentence head (NSP for BERT, SOP for ALBERT) is loaded for a strict fit but unused.
        sentence_task = "nsp" if "nsp.weight" in state else "sop" if "sop.weight" in state else "none"
        self.model = BertPretraining(build_backbone(cfg.model), self.special, DataConfig(), sentence_task)
        # A run imported from an XForMaskedLM checkpoint has no pooler weights; MLM never uses it.
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected or [k for k in missing if not k.startswith("backbone.pooler.")]:
            raise EmberError(f"{run_dir}/model.safetensors does not fit its config.yaml "
                             f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
        self.model.to(device).eval()
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
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                 "token_type_ids": torch.tensor([enc.type_ids], device=self.device)}
        logits, _ = self.model.logits(batch)
        results = []
        for pos in positions.tolist():
            probs = logits[0, pos].softmax(-1)
            top = probs.topk(top_k)
            results.append([(self.tokenizer.id_to_token(i), float(p))
                            for p, i in zip(top.values.tolist(), top.indices.tolist())])
        return results
