"""Entity embeddings on disk: a vocabulary of entity names and one vector per name.

ERNIE (Zhang et al. 2019, §4.1) feeds the encoder "knowledge embeddings trained on Wikidata by
TransE" and keeps them fixed. The files here hold such a table, row i = the i-th name:

* ember's own layout (``ember kg embed``): ``entities.tsv`` (one name per line),
  ``relations.tsv``, ``embeddings.safetensors`` with tensors ``entities`` (N, d) and
  ``relations`` (R, d), and ``transe.json`` (how they were trained);
* OpenKE's layout, as ERNIE's released embeddings come: ``entity2id.txt`` (a count line, then
  ``name<TAB>id`` lines) and ``entity2vec.vec`` (one whitespace-separated vector per line, in id
  order).

A vocabulary that does not match its vectors (other counts, ids out of range, a name twice)
is refused: row i would silently be another entity's vector.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ember.errors import EmberError

VOCAB, RELATIONS, TENSORS, INFO = "entities.tsv", "relations.tsv", "embeddings.safetensors", "transe.json"


@dataclass
class EntityEmbeddings:
    names: list[str]
    vectors: torch.Tensor  # (N, d) float32
    relation_names: list[str] | None = None
    relation_vectors: torch.Tensor | None = None  # (R, d)
    source: str = ""

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def save(self, folder: str | Path, info: dict | None = None) -> None:
        """Write ember's layout into ``folder`` (each file atomically)."""
        import json

        from safetensors.torch import save as save_tensors

        from ember.fileio import atomic_write_bytes, atomic_write_text

        folder = Path(folder)
        tensors = {"entities": self.vectors.detach().float().contiguous()}
        if self.relation_vectors is not None:
            tensors["relations"] = self.relation_vectors.detach().float().contiguous()
        atomic_write_bytes(folder / TENSORS, save_tensors(tensors))
        atomic_write_text(folder / VOCAB, "".join(f"{n}\n" for n in self.names))
        if self.relation_names is not None:
            atomic_write_text(folder / RELATIONS, "".join(f"{n}\n" for n in self.relation_names))
        if info is not None:
            atomic_write_text(folder / INFO, json.dumps(info, indent=2))


def read_names(path: Path) -> list[str]:
    """One name per line, row i = line i + 1; an empty line would shift every later row."""
    lines = path.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline
    names, seen = [], {}
    for lineno, line in enumerate(lines, 1):
        name = line.strip()
        if not name:
            raise EmberError(f"{path}:{lineno}: empty line; row i of the vectors belongs to line i, so "
                             "every line must name an entity")
        if name in seen:
            raise EmberError(f"{path}:{lineno}: entity {name!r} is listed twice (first at line {seen[name]}); "
                             "each name must have one row")
        seen[name] = lineno
        names.append(name)
    return names


def _openke(folder: Path) -> EntityEmbeddings:
    ids_path, vec_path = folder / "entity2id.txt", folder / "entity2vec.vec"
    lines = ids_path.read_text(encoding="utf-8").splitlines()
    try:
        count = int(lines[0].strip())
    except (IndexError, ValueError):
        raise EmberError(f"{ids_path}:1: expected the number of entities (OpenKE's entity2id.txt)") from None
    names: list[str | None] = [None] * count
    for lineno, line in enumerate(lines[1:], 2):
        if not line.strip():
            continue
        name, _, index = line.rpartition("\t")
        try:
            row = int(index)
        except ValueError:
            raise EmberError(f"{ids_path}:{lineno}: expected name<TAB>id, got {line[:60]!r}") from None
        if not 0 <= row < count or names[row] is not None:
            raise EmberError(f"{ids_path}:{lineno}: id {row} is out of range 0..{count - 1} or repeated")
        names[row] = name.strip()
    missing = [i for i, n in enumerate(names) if n is None]
    if missing:
        raise EmberError(f"{ids_path} announces {count} entities but has no name for id {missing[0]} "
                         f"({len(missing)} ids missing)")
    rows = [line.split() for line in vec_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if len(rows) != count:
        raise EmberError(f"{ids_path} names {count} entities but {vec_path} has {len(rows)} vectors: the "
                         "vocabulary and the embedding file do not belong together")
    if len({len(r) for r in rows}) != 1:
        raise EmberError(f"{vec_path}: vectors of different lengths ({sorted({len(r) for r in rows})[:3]})")
    try:
        vectors = torch.tensor([[float(x) for x in r] for r in rows], dtype=torch.float32)
    except ValueError as exc:
        raise EmberError(f"{vec_path}: not a number ({exc})") from None
    return EntityEmbeddings(list(names), vectors, source=str(folder))


def load_entity_embeddings(path: str | Path) -> EntityEmbeddings:
    """Entity embeddings from a folder in ember's or OpenKE's layout (see the module docstring)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(path)
    if (folder / "entity2id.txt").is_file() and (folder / "entity2vec.vec").is_file():
        return _openke(folder)
    if not (folder / VOCAB).is_file() or not (folder / TENSORS).is_file():
        raise EmberError(f"{folder}: no entity embeddings here; expected {VOCAB} + {TENSORS} (written by "
                         "`ember kg embed TRIPLES --out DIR`) or OpenKE's entity2id.txt + entity2vec.vec")
    names = read_names(folder / VOCAB)
    try:
        tensors = load_file(str(folder / TENSORS))
    except (SafetensorError, OSError) as exc:
        raise EmberError(f"{folder / TENSORS}: unreadable ({exc})") from None
    vectors = tensors.get("entities")
    if vectors is None or vectors.dim() != 2:
        raise EmberError(f"{folder / TENSORS}: expected an (N, d) tensor named 'entities'")
    if vectors.shape[0] != len(names):
        raise EmberError(f"{folder / VOCAB} lists {len(names)} entities but {folder / TENSORS} has "
                         f"{vectors.shape[0]} rows: the vocabulary and the embedding file do not belong "
                         "together (write both with one `ember kg embed` run)")
    relation_names = read_names(folder / RELATIONS) if (folder / RELATIONS).is_file() else None
    relations = tensors.get("relations")
    if relation_names is not None and relations is not None and relations.shape[0] != len(relation_names):
        raise EmberError(f"{folder / RELATIONS} lists {len(relation_names)} relations but {folder / TENSORS} "
                         f"has {relations.shape[0]} relation rows")
    return EntityEmbeddings(names, vectors.float(), relation_names, relations, source=str(folder))
