"""Family-independent pieces of HF interop: reading weights, renaming with rules, fused QKV."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from ember.errors import EmberError


def read_hf_config(hf_dir: Path) -> dict:
    path = Path(hf_dir) / "config.json"
    if not path.is_file():
        raise EmberError(f"{hf_dir} has no config.json; pass a Hugging Face checkpoint folder")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise EmberError(f"{path}: not valid JSON ({exc})") from None


def read_hf_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    """model.safetensors (preferred) or pytorch_model.bin, loaded with weights_only=True."""
    hf_dir = Path(hf_dir)
    st, pt = hf_dir / "model.safetensors", hf_dir / "pytorch_model.bin"
    if st.is_file():
        from safetensors.torch import load_file

        return load_file(str(st))
    if pt.is_file():
        return torch.load(pt, map_location="cpu", weights_only=True)
    if list(hf_dir.glob("*.index.json")):
        raise EmberError(f"{hf_dir}: sharded checkpoints are not supported yet; merge the shards first")
    raise EmberError(f"{hf_dir} has neither model.safetensors nor pytorch_model.bin")


def rename(state: dict[str, torch.Tensor], rules: list[tuple[str, str]]) -> tuple[dict, list[str]]:
    """Rename keys with the first matching (regex, replacement) rule; returns (renamed, unmatched)."""
    out, unmatched = {}, []
    compiled = [(re.compile(pattern), repl) for pattern, repl in rules]
    for key, value in state.items():
        for pattern, repl in compiled:
            if pattern.fullmatch(key):
                out[pattern.sub(repl, key)] = value
                break
        else:
            unmatched.append(key)
    return out, unmatched


def fuse_qkv(state: dict, prefix_in: str, prefix_out: str, num_layers: int,
             names=("query", "key", "value")) -> None:
    """Concatenate separate q/k/v Linear weights (H, H) x 3 into one (3H, H), in place."""
    for i in range(num_layers):
        for kind in ("weight", "bias"):
            parts = [state.pop(f"{prefix_in.format(i=i)}.{n}.{kind}") for n in names]
            state[f"{prefix_out.format(i=i)}.{kind}"] = torch.cat(parts, dim=0)


def split_qkv(state: dict, prefix_in: str, prefix_out: str, num_layers: int,
              names=("query", "key", "value")) -> None:
    """Inverse of ``fuse_qkv``."""
    for i in range(num_layers):
        for kind in ("weight", "bias"):
            fused = state.pop(f"{prefix_in.format(i=i)}.{kind}")
            for name, part in zip(names, fused.chunk(3, dim=0)):
                state[f"{prefix_out.format(i=i)}.{name}.{kind}"] = part.clone()
