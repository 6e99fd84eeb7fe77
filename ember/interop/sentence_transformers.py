"""sentence-transformers folders: where the encoder is, and how it pools (Reimers & Gurevych 2019).

A sentence-transformers model folder lists its pipeline in ``modules.json``: a ``Transformer``
(an HF encoder in the module's ``path``; "" = the folder itself, older models use
``0_Transformer/``), then a ``Pooling`` (its ``config.json`` names the mode: ``mean`` averages
the real tokens, ``cls`` takes the first), optionally a ``Normalize`` (L2). The Transformer's
``sentence_bert_config.json`` holds ``max_seq_length`` (inputs are truncated there).

ember reproduces Transformer -> Pooling (mean or cls) -> optional Normalize; anything else (a
``Dense`` projection, max or sqrt-length pooling, several modes concatenated) would give other
vectors than the checkpoint's, so it is refused before anything is written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ember.errors import EmberError
from ember.runs.embedding import EmbeddingDefaults

MODULES_FILE = "modules.json"
# Pooling config flag -> ember's pooling name (None: a mode ember does not compute).
_POOLING_FLAGS = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": None,
    "pooling_mode_mean_sqrt_len_tokens": None,
    "pooling_mode_weightedmean_tokens": None,
    "pooling_mode_lasttoken": None,
}


@dataclass(frozen=True)
class SentenceTransformerFolder:
    model_dir: Path  # the HF encoder's folder (config.json, weights, tokenizer)
    defaults: EmbeddingDefaults
    lowercase: bool  # sentence_bert_config.json do_lower_case: inputs are lower-cased first
    dimension: int | None  # the Pooling module's word_embedding_dimension


def _json(path: Path, what: str):
    if not path.is_file():
        raise EmberError(f"{path} is missing; a sentence-transformers folder needs it ({what})")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise EmberError(f"{path}: not valid JSON ({exc})") from None


def _kind(module: dict) -> str:
    """"sentence_transformers.models.Pooling" -> "Pooling" (older and newer spellings alike)."""
    return str(module.get("type", "")).rsplit(".", 1)[-1]


def read_sentence_transformers(folder: str | Path) -> SentenceTransformerFolder | None:
    """The folder's pipeline, checked; None when ``folder`` has no modules.json (a plain HF folder)."""
    folder = Path(folder)
    modules = _json(folder / MODULES_FILE, "the module list") if (folder / MODULES_FILE).is_file() else None
    if modules is None:
        return None
    where = folder / MODULES_FILE
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise EmberError(f"{where}: expected a list of modules ({{\"type\": ..., \"path\": ...}})")
    kinds = [_kind(m) for m in modules]
    supported = ["Transformer", "Pooling", "Normalize"]
    for i, (module, kind) in enumerate(zip(modules, kinds)):
        if kind not in supported or kinds.index(kind) != i:
            raise EmberError(
                f"{where}: module {i} is {module.get('type')!r} (path {module.get('path')!r}); ember "
                "reproduces Transformer -> Pooling (mean or cls) -> Normalize pipelines only, so its "
                "vectors would differ from this checkpoint's. To use just the encoder, import a copy of "
                "the folder without modules.json")
    if kinds[:1] != ["Transformer"] or kinds != [k for k in supported if k in kinds]:
        raise EmberError(f"{where}: modules {kinds} are not in the order Transformer, Pooling, Normalize")
    model_dir = folder / str(modules[0].get("path", "") or "")
    settings = {}
    if (model_dir / "sentence_bert_config.json").is_file():
        settings = _json(model_dir / "sentence_bert_config.json", "max_seq_length")
    max_length = settings.get("max_seq_length") or 0
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 0:
        raise EmberError(f"{model_dir / 'sentence_bert_config.json'}: max_seq_length must be a whole "
                         f"number, not {max_length!r}")
    pooling, dimension = "mean", None  # a Transformer alone: sentence-transformers' own default is mean
    if "Pooling" in kinds:
        pool_dir = folder / str(modules[kinds.index("Pooling")].get("path", ""))
        pool_cfg = _json(pool_dir / "config.json", "the pooling mode")
        pooling = _pooling_mode(pool_cfg, pool_dir / "config.json")
        dimension = pool_cfg.get("word_embedding_dimension")
    source = ", ".join(str(p.relative_to(folder)) for p in
                       [where, *([pool_dir / "config.json"] if "Pooling" in kinds else []),
                        model_dir / "sentence_bert_config.json"] if p.is_file())
    defaults = EmbeddingDefaults(pooling, "Normalize" in kinds, max_length, f"sentence-transformers: {source}")
    return SentenceTransformerFolder(model_dir, defaults.check(str(where)), bool(settings.get("do_lower_case")),
                                     dimension)


def _pooling_mode(cfg: dict, where: Path) -> str:
    on = [flag for flag in _POOLING_FLAGS if cfg.get(flag)]
    unknown = sorted(k for k, v in cfg.items() if k.startswith("pooling_mode") and v and k not in _POOLING_FLAGS)
    if unknown or len(on) != 1 or _POOLING_FLAGS[on[0]] is None:
        named = ", ".join(unknown + on) or "none"
        raise EmberError(f"{where}: pooling {named} is not supported; ember pools with exactly one of "
                         "pooling_mode_mean_tokens (mean) or pooling_mode_cls_token (cls), so this "
                         "checkpoint's vectors cannot be reproduced")
    return _POOLING_FLAGS[on[0]]


def write_sentence_transformers(out_dir: Path, defaults: EmbeddingDefaults, hidden_size: int, max_position: int) -> None:
    """The pipeline files of ``defaults`` beside an exported HF encoder in ``out_dir`` (the folder is
    the Transformer module, path ""), so that sentence-transformers, and ember's own import, pool,
    normalise and truncate as the run does: a run imported from such a folder goes back out whole."""
    pool_flags = {flag: _POOLING_FLAGS[flag] == defaults.pooling for flag in _POOLING_FLAGS}
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if defaults.normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (out_dir / "2_Normalize").mkdir(exist_ok=True)  # Normalize has no settings; its folder is still expected
    (out_dir / "1_Pooling").mkdir(exist_ok=True)
    (out_dir / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": hidden_size, **pool_flags}, indent=2) + "\n")
    (out_dir / MODULES_FILE).write_text(json.dumps(modules, indent=2) + "\n")
    (out_dir / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": defaults.max_length or max_position, "do_lower_case": False}, indent=2) + "\n")
