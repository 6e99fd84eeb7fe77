"""What the studies from the real checkpoint share (features_vs_finetune, finetune_stability,
distill_study): the checkpoint imported once as a run folder, one thread per run, and the small
WordPiece tokenizer their --smoke runs train on."""

from __future__ import annotations

from pathlib import Path

import torch

from _bench import load, machine
from ember.errors import EmberError
from ember.paths import data_root


def start_study(args) -> Path:
    """One thread, the output folder, the machine line; a smoke tokenizer for --smoke runs."""
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"{machine()}; {load()}", flush=True)
    args.smoke_tokenizer = str(smoke_tokenizer(out)) if args.smoke else ""
    return out


def choices(text: str, known, what: str) -> list[str]:
    """A comma-separated option (--variants, --methods) as a list, each checked against ``known``."""
    picked = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in picked if v not in known]
    if unknown:
        raise EmberError(f"unknown {what}(s) {unknown}; choose from {', '.join(known)}")
    return picked


def prepare_init(args, out: Path) -> str:
    """The checkpoint as an ember run folder (imported once), or a small random model for --smoke."""
    if args.smoke:
        return "random"
    checkpoint = Path(args.checkpoint) if args.checkpoint else data_root() / "checkpoints" / "all-MiniLM-L6-v2"
    init = out / "init"
    if not (init / "model.safetensors").is_file():
        from ember.cli import main as ember_cli

        if ember_cli(["convert", "--from-hf", str(checkpoint), "--out", str(init)]):
            raise EmberError(f"could not import {checkpoint} (the message above says why)")
    return str(init)


def smoke_tokenizer(out: Path) -> Path:
    """A WordPiece tokenizer trained on the CoNLL-2003 training words (smoke runs only)."""
    from ember.tokenizers import train_tokenizer

    path = out / "smoke-tokenizer.json"
    if not path.is_file():
        words = [line.split()[0] for line in (data_root() / "conll2003" / "train.txt").read_text().splitlines()[:20000]
                 if line.strip() and not line.startswith("-DOCSTART-")]
        text = out / "smoke-words.txt"
        text.write_text(" ".join(words) + "\n")
        train_tokenizer([text], vocab_size=1000, fmt="lines", progress=False).save(str(path))
    return path
