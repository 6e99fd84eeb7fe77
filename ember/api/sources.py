"""What ``ember.load`` accepts: an ember run folder, an `ember export` folder, or a Hugging Face
checkpoint folder, told apart by the files they hold.

A Hugging Face folder is converted once (``ember convert --from-hf``'s code) into a run folder
in a cache, ``$EMBER_CACHE`` or ``~/.cache/ember``, under ``hf-runs/<key>``; ``key`` hashes the
checkpoint's config, tokenizer files and weights (their bytes, not their dates) and the
conversion's version. Why a folder rather than memory: everything that runs a model (the
predictor with every backend, the ONNX and int8 exports, ``to_hf``) takes a run folder, so one
code path serves a run and a checkpoint alike; the next ``ember.load`` of the same checkpoint
skips the conversion; and the converted run can be opened and checked like any other. An
edited checkpoint hashes differently and is converted again. The folder is written under a
temporary name and renamed into place, so an interrupted conversion leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from ember.errors import EmberError

CONVERSION_VERSION = "1"  # bump when the conversion's output changes, so caches are rebuilt
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "merges.txt",
                      "special_tokens_map.json")
HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


def cache_root() -> Path:
    return Path(os.environ.get("EMBER_CACHE") or Path.home() / ".cache" / "ember")


def is_hf_checkpoint(path: Path) -> bool:
    """A Hugging Face folder (config.json) rather than an ember run or export (config.yaml)."""
    return (path / "config.json").is_file() and not (path / "config.yaml").is_file()


def layout(path: Path) -> str:
    """"run", "export" or "hf"; anything else is an EmberError saying what each layout holds."""
    if not path.exists():
        raise EmberError(f"{path} does not exist; pass a run folder, an `ember export` folder or a Hugging "
                         "Face checkpoint folder")
    if not path.is_dir():
        raise EmberError(f"{path} is a file; ember.load takes a folder (a run, an `ember export` folder or a "
                         "Hugging Face checkpoint folder)")
    if (path / "config.yaml").is_file():
        return "export" if (path / "export.json").is_file() else "run"
    if is_hf_checkpoint(path):
        return "hf"
    held = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
    shown = ", ".join(held[:12]) + (", ..." if len(held) > 12 else "") if held else "nothing"
    raise EmberError(f"{path} is none of the folders ember.load reads (it holds {shown}): an ember run "
                     "(config.yaml + model.safetensors, from `ember pretrain` / `ember finetune` / `ember "
                     "convert`), an `ember export` folder (config.yaml + export.json), or a Hugging Face "
                     "checkpoint (config.json + model.safetensors or pytorch_model.bin + a tokenizer)")


def _checkpoint_key(hf_dir: Path) -> str:
    digest = hashlib.sha256(f"ember-hf-run {CONVERSION_VERSION}\n".encode())
    weights = [hf_dir / name for name in HF_WEIGHTS if (hf_dir / name).is_file()]
    if not weights:
        raise EmberError(f"{hf_dir} has config.json but neither model.safetensors nor pytorch_model.bin; "
                         "a Hugging Face checkpoint folder needs its weights")
    for file in [hf_dir / "config.json", *(hf_dir / n for n in HF_TOKENIZER_FILES), weights[0],
                 *_sentence_transformers_files(hf_dir)]:
        if file.is_file():
            digest.update(f"{file.name}\n".encode())
            with open(file, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()[:24]


def _sentence_transformers_files(hf_dir: Path) -> list[Path]:
    """The files a sentence-transformers folder's conversion reads besides the model's own (its
    pipeline, pooling and max length: ember.interop.sentence_transformers), so that editing one
    converts the checkpoint again. An unreadable modules.json is the conversion's to report."""
    import json

    modules_file = hf_dir / "modules.json"
    if not modules_file.is_file():
        return []
    try:
        modules = json.loads(modules_file.read_text(encoding="utf-8"))
        folders = sorted({str(m.get("path", "") or "") for m in modules if isinstance(m, dict)} - {""})
    except (ValueError, TypeError, AttributeError, UnicodeDecodeError):
        folders = []
    # the top folder's config.json is the model's own (already hashed); a module folder's is its settings
    files = [modules_file, hf_dir / "sentence_bert_config.json"]
    files += [hf_dir / folder / name for folder in folders for name in ("config.json", "sentence_bert_config.json")]
    return [f for f in files if f.is_file()]


def run_of_hf_folder(hf_dir: Path) -> Path:
    """The cached run folder converted from ``hf_dir`` (converted now if it is not there yet)."""
    from ember.interop.convert import import_hf

    target = cache_root() / "hf-runs" / _checkpoint_key(hf_dir)
    if (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        import_hf(hf_dir, tmp)
        (tmp / "source.txt").write_text(f"converted by ember.load from {hf_dir.resolve()}\n")
        if target.exists():  # another process converted it meanwhile: keep theirs
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
