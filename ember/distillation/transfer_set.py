"""The transfer set: the examples a task student learns from, and the teacher's soft targets.

Hinton et al. 2015 train the student on a "transfer set" labelled by the teacher. Here it
is the union of
- sentences from unlabeled text files (any format ``ember prepare`` reads: Wikipedia
  extractor output, plain text, one sentence per line, JSONL), split with ember's sentence
  splitter - for single-sentence tasks;
- the task's training text (``--unlabeled task``), without labels unless the hard-label loss
  is on (alpha < 1), in which case the labelled examples keep their gold label.

The teacher's logits for the whole set are computed once and cached in one ``.npz`` file,
written atomically, keyed by a fingerprint of the teacher's weights and every example's ids,
so a resumed or repeated run reuses them and a changed set is never paired with stale ones.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np

from ember.errors import EmberError
from ember.fileio import atomic_write_bytes, sha256_file

MIN_WORDS = 4  # shorter "sentences" are mostly Wikipedia titles and list fragments


def read_sentences(inputs: list[str], limit: int, min_words: int = MIN_WORDS) -> list[tuple[str, str]]:
    """Up to ``limit`` (where, sentence) pairs from text files, in file order."""
    from ember.data.readers import DocumentReader
    from ember.data.sentences import split_sentences

    reader = DocumentReader(inputs)
    out: list[tuple[str, str]] = []
    for doc in reader:
        for k, sentence in enumerate(split_sentences(doc.text)):
            if len(sentence.split()) >= min_words:
                out.append((f"{doc.source}:{doc.line}#{k}", sentence))
                if len(out) >= limit:
                    return out
    if not out:
        raise EmberError(f"no sentence of {min_words}+ words in {reader.describe_inputs()}")
    return out


def build_transfer_set(adapter, tokenizer, max_length: int, unlabeled: list[str], max_unlabeled: int,
                       train_limit: int | None, keep_labels: bool,
                       task_unlabeled: int | None = None) -> tuple[list[dict], dict]:
    """Features (input_ids, token_type_ids, label or None) and counts of where they came from.

    ``unlabeled``: file/folder paths, and/or the word ``task`` for the task's training text
    (its first ``task_unlabeled`` examples, default ``train_limit``). The first ``train_limit``
    training examples keep their gold label when ``keep_labels`` (the hard-label loss is on),
    so a teacher trained on N labelled examples can teach on N + more unlabeled ones.
    """
    from ember.tasks.featurize import encode_examples
    from ember.tasks.readers.glue import Example

    spec = adapter.spec
    files = [u for u in unlabeled if u != "task"]
    features: list[dict] = []
    counts = {"task_train": 0, "task_train_labelled": 0, "unlabeled_sentences": 0}
    if keep_labels or "task" in unlabeled:
        limit = train_limit
        if "task" in unlabeled and task_unlabeled is not None:
            limit = task_unlabeled if train_limit is None or not keep_labels else max(task_unlabeled, train_limit)
        _, train = adapter.load("train", tokenizer, max_length, limit=limit)
        n_labelled = min(len(train), train_limit if train_limit is not None else len(train)) if keep_labels else 0
        features += [dict(f, label=f["label"] if i < n_labelled else None) for i, f in enumerate(train)]
        counts["task_train"] = len(train)
        counts["task_train_labelled"] = n_labelled
    if files:
        if spec.is_pair:
            raise EmberError(f"{spec.display_name} classifies sentence pairs; single sentences from "
                             "text files do not fit it. Use --unlabeled task (its training pairs)")
        sentences = read_sentences(files, max_unlabeled)
        examples = [Example(guid, text, None, None) for guid, text in sentences]
        encoded, _ = encode_examples(examples, tokenizer, max_length)
        features += encoded
        counts["unlabeled_sentences"] = len(encoded)
    if not features:
        raise EmberError("the transfer set is empty: pass --unlabeled FILES and/or --unlabeled task, "
                         "or use the labelled training set with --alpha below 1")
    return features, counts


def fingerprint(teacher_weights: Path, features: list[dict]) -> str:
    """SHA-256 over the teacher's weights file and every example's ids and segment ids."""
    h = hashlib.sha256(sha256_file(Path(teacher_weights)).encode())
    for f in features:
        h.update(np.asarray(f["input_ids"], dtype=np.int64).tobytes())
        h.update(np.asarray(f["token_type_ids"], dtype=np.int64).tobytes())
        h.update(b"|")
    return h.hexdigest()


def cached_teacher_logits(teacher, features: list[dict], cache: Path, teacher_weights: Path,
                          batch_size: int, device: str, progress: bool = True) -> np.ndarray:
    """(N, C) float32 teacher logits for ``features``, read from ``cache`` or computed and saved."""
    key = fingerprint(teacher_weights, features)
    cache = Path(cache)
    if cache.is_file():
        with np.load(cache) as stored:
            if str(stored["fingerprint"]) == key and stored["logits"].shape[0] == len(features):
                return stored["logits"]
        raise EmberError(f"{cache} holds teacher logits for another teacher or transfer set; delete it "
                         "or choose another --logits-cache")
    chunk = 4096
    starts = range(0, len(features), chunk)
    if progress:
        from tqdm import tqdm

        starts = tqdm(starts, desc="teacher labels the transfer set", unit="chunk", dynamic_ncols=True)
    logits = np.concatenate([teacher.predict(features[s : s + chunk], batch_size, device) for s in starts])
    buffer = io.BytesIO()
    np.savez(buffer, logits=logits.astype(np.float32), fingerprint=np.asarray(key))
    atomic_write_bytes(cache, buffer.getvalue())
    return logits
