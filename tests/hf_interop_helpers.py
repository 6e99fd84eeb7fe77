"""Helpers shared by the per-family Hugging Face parity tests (tiny random models, built
locally - nothing is downloaded)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

ATOL = 1e-5


def perturb(model, seed: int = 0, scale: float = 0.05):
    """Move every parameter off its init value (LayerNorm ones, zero biases, zero pad rows),
    so a wrongly mapped tensor cannot hide behind a default (and, with a larger ``scale``,
    logits are far from uniform so argmax ties cannot occur)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model.eval()


def padded_batch(vocab: int, pad_id: int, first_real: int = 5, batch: int = 3, length: int = 17, seed: int = 1):
    """(ids, attention_mask): random real tokens, row 1 right-padded from position 11."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(first_real, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1, 11:] = 0
    ids[1, 11:] = pad_id
    return ids, mask


def assert_close_where(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> None:
    """Equal to ATOL at real (non-pad) positions; pad outputs are undefined in both libraries."""
    keep = mask.bool()
    torch.testing.assert_close(a[keep], b[keep], atol=ATOL, rtol=0)


def load_all_but_pooler(module, state: dict):
    """Load ``state``; only a pooler may be missing (XForMaskedLM checkpoints have none)."""
    missing, unexpected = module.load_state_dict(state, strict=False)
    assert not unexpected and all(k.startswith("backbone.pooler.") for k in missing), (missing, unexpected)
    return module


def write_hf_folder(state: dict, config: dict, folder: Path) -> Path:
    """An HF checkpoint folder from a state dict and config dict (what export_hf writes)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"), {"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def load_hf(cls, folder: Path, tied: tuple[str, ...] = ()):
    """``cls.from_pretrained(folder)`` asserting that every weight was found and used, apart
    from the decoder weights transformers re-ties to the embeddings."""
    model, info = cls.from_pretrained(folder, output_loading_info=True)
    assert not info["unexpected_keys"], info["unexpected_keys"]
    assert not [k for k in info["missing_keys"] if k not in tied], info["missing_keys"]
    return model.eval()
