"""Token classification (NER) on top of any encoder, and the CoNLL-2003 task adapter.

BERT (Devlin et al., 2019, §5.3) tags a word by "the representation of the first sub-token as
the input to the token-level classifier over the NER label set": words are split into
sub-tokens, only each word's first sub-token carries a label and a loss, the other sub-tokens
are ignored (label -100), and a prediction for the first sub-token is the word's prediction.

Word -> sub-token alignment comes from the fast tokenizer itself (``encode(words,
is_pretokenized=True).word_ids``), so it is right for any tokenizer.json: WordPiece,
byte-level BPE (RoBERTa) or Unigram (ALBERT). Sentences longer than ``max_length`` sub-tokens
are truncated; their cut-off words get no prediction (they count as ``O``, so truncation
can only lower recall, never flatter the score) and the number of such sentences is reported.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import nn

from ember.errors import EmberError
from ember.nn.linear_head import BackboneWithLinearHead
from ember.tasks.batching import length_sorted_batches
from ember.tasks.featurize import collate, extra_inputs, note_truncated
from ember.tasks.readers.glue import BertHParams
from ember.tasks.inference.methods import token_view
from ember.tasks.inference.requests import body_schema

IGNORE = -100  # cross_entropy's ignore_index: non-first sub-tokens, specials, padding


class Tagged(NamedTuple):
    """``features[i]`` = {"input_ids", "token_type_ids", "labels" (T,), "word_starts" (n_words,)}."""

    features: list[dict]
    n_truncated: int


def encode_words(word_seqs: Sequence[Sequence[str]], tokenizer: Tokenizer, max_length: int,
                 label_seqs: Sequence[Sequence[int]] | None = None) -> Tagged:
    """Sub-token ids for pre-split words; ``word_starts[w]`` = position of word w's first
    sub-token, or -1 when the word was truncated away or the tokenizer produced no token for it.
    """
    tok = Tokenizer.from_str(tokenizer.to_str())  # private copy: keep the caller's settings
    tok.no_padding()
    n_special = tok.num_special_tokens_to_add(False)
    if max_length <= n_special:
        raise EmberError(f"max_length={max_length} leaves no room for words: the tokenizer adds "
                         f"{n_special} special tokens to each sentence")
    tok.enable_truncation(max_length)
    encodings = tok.encode_batch([list(words) for words in word_seqs], is_pretokenized=True) if word_seqs else []
    features, n_truncated = [], 0
    for i, (words, enc) in enumerate(zip(word_seqs, encodings)):
        word_starts = [-1] * len(words)
        prev = None
        for position, w in enumerate(enc.word_ids):
            if w is not None and w != prev:
                word_starts[w] = position
            prev = w
        n_truncated += bool(enc.overflowing)
        feature = {"input_ids": enc.ids, "token_type_ids": enc.type_ids, "word_starts": word_starts}
        if label_seqs is not None:
            labels = [IGNORE] * len(enc.ids)
            for w, position in enumerate(word_starts):
                if position >= 0:
                    labels[position] = label_seqs[i][w]
            feature["labels"] = labels
        features.append(feature)
    return Tagged(features, n_truncated)


def collate_tagged(features: Sequence[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """``collate``'s (B, T) inputs plus ``labels`` (B, T) int64, padding = -100."""
    batch = collate([{**f, "label": None} for f in features], pad_id)
    if all("labels" in f for f in features):
        labels = torch.full(batch["input_ids"].shape, IGNORE, dtype=torch.long)
        for row, f in enumerate(features):
            labels[row, : len(f["labels"])] = torch.as_tensor(f["labels"], dtype=torch.long)
        batch["labels"] = labels
    return batch


class TokenClassifier(BackboneWithLinearHead):
    """Dropout + one linear layer on every position of ``last_hidden_state`` (B, T, H) -> (B, T, L)."""

    logits_axes = {0: "batch", 1: "seq"}
    compare_view = staticmethod(token_view)

    def make_batch(self, features: list[dict], rng: np.random.Generator | None = None) -> dict:
        return collate_tagged(features, self.pad_id)

    def head_logits(self, out, attention_mask: torch.Tensor) -> torch.Tensor:  # (B, T, num_labels)
        return self.classifier(self.dropout(out.last_hidden_state))

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:  # (B, T, num_labels)
        out = self.backbone(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"),
                            **extra_inputs(batch))
        return self.head_logits(out, batch["attention_mask"])

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        logits = self.logits(batch).float()
        labels = batch["labels"]
        scored = labels != IGNORE
        n = int(scored.sum())
        # Mean over labelled words of the batch (first sub-tokens only); a batch without any
        # (every word lost to the tokenizer) contributes a zero loss rather than NaN.
        if n == 0:
            loss = logits.sum() * 0.0
        else:
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
        correct = int((logits.argmax(-1)[scored] == labels[scored]).sum())
        return loss, {"loss": (loss.item() * n, n), "word_accuracy": (correct, n)}

    @torch.no_grad()
    def predict(self, features: list[dict], batch_size: int = 64, device: str = "cpu") -> list[np.ndarray]:
        """Per sentence, a label id per word (-1 where the word has no sub-token), input order."""
        was_training = self.training
        self.eval()
        out: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * len(features)
        for idx in length_sorted_batches([len(f["input_ids"]) for f in features], batch_size):
            batch = collate_tagged([{k: v for k, v in features[i].items() if k != "labels"} for i in idx],
                                   self.pad_id)
            batch = {k: v.to(device) for k, v in batch.items()}
            token_preds = self.logits(batch).argmax(-1).cpu().numpy()  # (B, T)
            for row, i in enumerate(idx):
                starts = np.asarray(features[i]["word_starts"], dtype=np.int64)
                out[i] = np.where(starts >= 0, token_preds[row, np.maximum(starts, 0)], -1)
        self.train(was_training)
        return out


def word_tags(pred_ids: Sequence[np.ndarray], label_names: Sequence[str], outside: str = "O") -> list[list[str]]:
    """Label ids per word -> tag strings; words with no prediction (-1) become ``outside``."""
    return [[label_names[j] if j >= 0 else outside for j in ids] for ids in pred_ids]


def is_bio(labels: Sequence[str]) -> bool:
    """True for an IOB tag set (O, B-X, I-X): its tags spell entities. A custom tag set such as
    part-of-speech tags (``--task tag``) has no entities, only a tag per word."""
    return all(t == "O" or (t[:2] in ("B-", "I-") and len(t) > 2) for t in labels)


def entity_list(words: Sequence[str], tags: Sequence[str], bio: bool = True) -> list[dict]:
    """The entities IOB ``tags`` spell over ``words`` ([] for a tag set that is not IOB)."""
    from ember.tasks.metrics.ner import get_entities

    if not bio:
        return []
    return [{"type": t, "start": a, "end": b + 1, "text": " ".join(words[a : b + 1])}
            for t, a, b in get_entities(tags)]


# -- plain text -> words -----------------------------------------------------------------------

# CoNLL-2003 tokenization keeps abbreviations ("U.S.") and hyphenated / apostrophe words whole
# and splits other punctuation off, which this approximates for free text.
_WORD = re.compile(r"(?:[A-Za-z]\.){2,}|\w+(?:['’-]\w+)*|[^\w\s]")


def split_words(text: str) -> list[str]:
    return _WORD.findall(text)


def _jsonl_sentences(path: Path) -> list[tuple[str, list[str]]]:
    """``{"words": [...]}`` (pre-split) or ``{"text": "..."}`` per line, optional ``id``."""
    import json

    from ember.tasks.readers.glue import _lines

    out = []
    for n, line in enumerate(_lines(path), 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EmberError(f"{path}:{n}: not valid JSON ({exc.msg}); write one object per line") from None
        words = row.get("words", row.get("tokens")) if isinstance(row, dict) else None
        if words is None and isinstance(row, dict) and isinstance(row.get("text"), str):
            words = split_words(row["text"])
        if not isinstance(words, list) or not words or not all(isinstance(w, str) and w for w in words):
            raise EmberError(f"{path}:{n}: expected {{\"words\": [\"EU\", ...]}} or {{\"text\": \"...\"}} "
                             "with at least one word")
        out.append((str(row.get("id", f"{path.stem}-{n}")), words))
    return out


# -- inference -------------------------------------------------------------------------------


class TagMethod:
    """``tag``: sentences (text split into CoNLL-like words, or pre-split words) -> a tag per word
    and the entities they spell."""

    name = "tag"
    inputs = {"text": "texts"}
    # The page at / (ember.serve.page) highlights the entities in the words.
    form = {"title": "Tag entities", "view": "tag", "fields": [
        {"name": "text", "label": "Text", "type": "textarea",
         "default": "John Smith flew from London to Paris with Lufthansa on Monday ."}]}
    request_schema = body_schema(
        "Sentences -> a tag per word and the entities the tags spell: free text (split into CoNLL-like "
        "words) or pre-split words.",
        {"text": {"type": "string", "description": "one sentence; send 'text', 'texts' or 'words'"},
         "texts": {"type": "array", "items": {"type": "string"}, "description": "several sentences"},
         "words": {"type": "array", "items": {"type": "array", "items": {"type": "string"}},
                   "description": "sentences already split into words"}},
        {"text": "EU rejects German call to boycott British lamb ."})

    def __init__(self, ctx) -> None:
        self.tokenizer, self.max_length, self.labels = ctx.tokenizer, ctx.max_length, ctx.labels
        self.bio = is_bio(self.labels)

    def parse(self, data: dict, limits) -> dict:
        """{"text": str} | {"texts": [str]} (split into words) | {"words": [[str]]} (pre-split)."""
        from ember.errors import RequestError
        from ember.tasks.inference.requests import check_fields, text_field, texts_field

        check_fields(data, {"text", "texts", "words"})
        if "words" not in data:
            words = [split_words(t) for t in texts_field(data, "text", "texts", limits)]
            empty = [i for i, w in enumerate(words) if not w]
            if empty:
                raise RequestError(422, f"text {empty[0]} has no words")
            return {"words": words}
        if "text" in data or "texts" in data:
            raise RequestError(422, "send 'words' or 'text'/'texts', not both")
        sentences = data["words"]
        if not isinstance(sentences, list) or not sentences:
            raise RequestError(422, "'words' must be a non-empty list of sentences, each a list of words")
        if len(sentences) > limits.max_texts:
            raise RequestError(422, f"'words' has {len(sentences)} sentences; the limit is {limits.max_texts}")
        out = []
        for i, words in enumerate(sentences):
            if not isinstance(words, list) or not words:
                raise RequestError(422, f"'words[{i}]' must be a non-empty list of words")
            out.append([text_field(w, f"words[{i}][{j}]", limits) for j, w in enumerate(words)])
        if sum(len(" ".join(w)) for w in out) > limits.max_chars * limits.max_texts:
            raise RequestError(422, "the sentences are too long in total")
        return {"words": out}

    def __call__(self, requests, forward) -> list[dict]:
        flat = [words for req in requests for words in req["words"]]
        features, _ = encode_words(flat, self.tokenizer, self.max_length)
        outs = forward([(f["input_ids"], f["token_type_ids"]) for f in features], False)
        responses, k = [], 0
        for req in requests:
            results = []
            for words in req["words"]:
                f, (logits, _) = features[k], outs[k]
                k += 1
                starts = np.asarray(f["word_starts"], dtype=np.int64)
                token_pred = logits.argmax(-1)
                tags = [self.labels[int(token_pred[p])] if p >= 0 else "O" for p in starts]
                # Cut-off words have no sub-token (-1); a full-length row with such words was truncated.
                cut = len(f["input_ids"]) >= self.max_length and bool((starts < 0).any())
                entities = entity_list(words, tags, self.bio)
                results.append({"words": words, "tags": tags, "entities": entities, "truncated": cut})
            responses.append({"results": results, "truncated": any(r["truncated"] for r in results)})
        return responses


# -- the task adapter --------------------------------------------------------------------------


class ConllNerAdapter:
    """`--task conll2003`: English NER, entity-level F1 (conlleval) on dev, also reported on test."""

    kind = "tag"  # its inference method (``inference_methods``)

    name = "conll2003"
    display_name = "CoNLL-2003"
    main_metric = "f1"
    language = "en"
    report_splits = ("test",)  # scored with the best-on-dev weights after training
    # BERT appendix A.3's grid (lr {5e-5, 3e-5, 2e-5}, batch 32, 3 epochs); 5e-5 suits NER's
    # per-word loss. 128 sub-tokens hold all but a handful of CoNLL sentences.
    hparams = BertHParams(learning_rate=5e-5, batch_size=32, epochs=3.0, warmup_ratio=0.1, max_length=128)

    # words -> features (a hook: K-BERT's adapter encodes with its knowledge, ember.tasks.families.knowledge)
    encode_words = staticmethod(encode_words)

    def __init__(self) -> None:
        from ember.tasks.readers.conll import LABELS

        self.labels = LABELS
        self.label_ids = {t: i for i, t in enumerate(LABELS)}

    def label_names(self) -> list[str]:
        return list(self.labels)

    def load(self, split: str, tokenizer: Tokenizer, max_length: int, limit: int | None = None,
             path: str | Path | None = None) -> tuple[list, list[dict]]:
        sentences = self.read(split, path, limit)
        labels = [[self.label_ids[t] for t in s.tags] for s in sentences]
        features, n_truncated = self.encode_words([s.words for s in sentences], tokenizer, max_length, labels)
        if n_truncated:
            note_truncated(f"{self.display_name} {split if path is None else path}", n_truncated, len(sentences),
                           "sentences", max_length, unit="sub-tokens", consequence="; their cut-off words count as O")
        return sentences, features

    def read(self, split: str, path: str | Path | None = None, limit: int | None = None) -> list:
        """Tagged sentences of a split (or of a CoNLL file ``path``), every tag in ``self.labels``."""
        from ember.tasks.readers.conll import read_split

        return read_split(split, path=path, limit=limit)

    def build_module(self, backbone: nn.Module, pad_id: int) -> TokenClassifier:
        return TokenClassifier(backbone, len(self.labels), pad_id)

    def inference_methods(self, ctx) -> list:
        return [TagMethod(ctx)]

    def score(self, module: TokenClassifier, examples: list, features: list[dict], batch_size: int,
              device: str) -> dict[str, float]:
        from ember.tasks.metrics.ner import entity_scores

        pred = word_tags(module.predict(features, batch_size, device), self.labels)
        return entity_scores([s.tags for s in examples], pred)

    def predict_file(self, module: TokenClassifier, tokenizer: Tokenizer, max_length: int, path: str | Path,
                     batch_size: int, device: str) -> tuple[list[dict], int]:
        """Tags for a CoNLL file (``.conll``/``.iob``: one word per line, tags optional) or plain
        text (one sentence per line, split into CoNLL-like words)."""
        from ember.tasks.readers.conll import read_conll
        from ember.tasks.readers.glue import _lines
        path = Path(path)
        if path.suffix in (".conll", ".iob", ".bio"):
            sentences = [(s.guid, list(s.words)) for s in read_conll(path, require_tags=False)]
        elif path.suffix == ".jsonl":
            sentences = _jsonl_sentences(path)
        else:
            sentences = [(f"{path.stem}-{n}", split_words(line)) for n, line in enumerate(_lines(path), 1)]
            sentences = [(guid, words) for guid, words in sentences if words]
        features, n_truncated = self.encode_words([w for _, w in sentences], tokenizer, max_length)
        tags = word_tags(module.predict(features, batch_size, device), self.labels)
        rows = []
        for (guid, words), sentence_tags in zip(sentences, tags):
            entities = entity_list(words, sentence_tags, is_bio(self.labels))
            rows.append({"id": guid, "words": words, "tags": sentence_tags, "entities": entities})
        return rows, n_truncated

    def rows_to_tsv(self, rows: list[dict]) -> str:
        """CoNLL-style output: ``word<TAB>tag`` per line, a blank line after each sentence."""
        return "".join("".join(f"{w}\t{t}\n" for w, t in zip(r["words"], r["tags"])) + "\n" for r in rows)
