"""RUN/embedding.json: how a run turns hidden states into one sentence vector by default.

    {"pooling": "mean", "normalize": true, "max_length": 256,
     "source": "sentence-transformers modules.json, 1_Pooling/config.json, sentence_bert_config.json"}

``pooling``: ``mean`` (average of every real token's last-layer state, [CLS] and [SEP]
included, as sentence-transformers' mean pooling does) or ``cls`` (the first token's state);
``normalize``: L2-normalise the vector (a ``Normalize`` module); ``max_length``: tokens per
input before truncation (0 = the run's own length). ``ember convert --from-hf`` writes it for a
sentence-transformers folder (``ember.interop.sentence_transformers``); /embed, ``ember embed``,
``ember.embed`` and ``ember evaluate --zero-shot`` use it as their defaults, and their own
options override it. A run without the file embeds with mean pooling, unnormalised, at the
run's length. Unknown keys are ignored, so a newer file still loads.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ember.errors import EmberError
from ember.fileio import atomic_write_text

EMBEDDING_FILE = "embedding.json"
POOLINGS = ("mean", "cls")  # sentence vectors; /embed also offers "none" (one vector per token)


@dataclass(frozen=True)
class EmbeddingDefaults:
    pooling: str = "mean"
    normalize: bool = False
    max_length: int = 0  # 0: the run's own max length
    source: str = ""  # where the settings came from (shown to users, never interpreted)

    def check(self, where: str) -> "EmbeddingDefaults":
        if self.pooling not in POOLINGS:
            raise EmberError(f"{where}: pooling {self.pooling!r} is not one ember computes; "
                             f"choose one of {', '.join(POOLINGS)}")
        if not isinstance(self.normalize, bool):
            raise EmberError(f"{where}: normalize must be true or false, not {self.normalize!r}")
        if isinstance(self.max_length, bool) or not isinstance(self.max_length, int) or self.max_length < 0:
            raise EmberError(f"{where}: max_length must be a whole number of tokens >= 0, not {self.max_length!r}")
        return self


def read_embedding_defaults(run_dir: str | Path) -> EmbeddingDefaults | None:
    """The run's embedding.json, checked; None when the run has none."""
    path = Path(run_dir) / EMBEDDING_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise EmberError(f"{path}: not valid JSON ({exc}); fix or delete it (the defaults are then mean "
                         "pooling, unnormalised)") from None
    if not isinstance(data, dict):
        raise EmberError(f"{path}: expected a JSON object like {{\"pooling\": \"mean\"}}, got {type(data).__name__}")
    known = {k: data[k] for k in ("pooling", "normalize", "max_length", "source") if k in data}
    return EmbeddingDefaults(**known).check(str(path))


def write_embedding_defaults(run_dir: str | Path, defaults: EmbeddingDefaults) -> Path:
    path = Path(run_dir) / EMBEDDING_FILE
    atomic_write_text(path, json.dumps(asdict(defaults.check(str(path))), indent=2) + "\n")
    return path
