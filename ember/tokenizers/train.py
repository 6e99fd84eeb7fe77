"""Train, save and load subword tokenizers with the Hugging Face ``tokenizers`` library.

Three kinds, each set up the way its reference model family did it:

- ``wordpiece`` (BERT): BertNormalizer, BertPreTokenizer, ``##`` continuation prefix,
  ``[CLS] A [SEP] B [SEP]`` with token_type_ids 0/1.
- ``bpe`` (RoBERTa / GPT-2): byte-level BPE, so there are no unknown characters;
  ``<s> A </s> </s> B </s>`` with all token_type_ids 0 as in RoBERTa.
- ``unigram`` (SentencePiece as used by T5 / ALBERT): NFKC, Metaspace ``▁`` word marker and,
  by default, T5's layout (Raffel et al. 2020, §2.2 and the released vocabulary):
  ``<pad>``=0, ``</s>``=1, ``<unk>``=2, the learnt pieces, then 100 sentinels
  ``<extra_id_99>`` ... ``<extra_id_0>`` (``ember.tokenizers.sentinels``), and ``</s>``
  appended to every sequence (``A </s>``, ``A </s> B </s>``, all segment 0). With BERT-style
  ``--special-tokens [PAD] [UNK] [CLS] [SEP] [MASK]`` it gets the BERT template (ALBERT).

Any kind can carry sentinels (``sentinels=N``, default 100 for unigram, 0 otherwise); a
vocabulary with sentinels needs no cls/mask token (T5 has neither).

Lower-casing never strips accents: BERT's accent stripping decomposes text with NFD and
drops combining marks, which turns Hangul syllables into jamo and "й" into "и". For Korean
and Russian corpora that destroys the text, so we lower-case without it.

The kind is not stored separately: ``tokenizer_kind`` reads it back from the model type.

Reproducible: the same text gives the same wordpiece or bpe tokenizer.json on every run. For
WordPiece that takes two training passes (``_deterministic_wordpiece``: the trainer's own ids for
its "##" symbols come in hash order and decide merges tied in count) and a renumbering
(``_renumber_wordpiece``). Unigram's trainer is not reproducible: its piece scores differ
between runs in the third decimal, so pieces can change places and ids; a run keeps the
tokenizer.json it was prepared with.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from ember.errors import EmberError
from ember.tokenizers.sentinels import T5_SENTINELS, add_sentinels, has_sentinels

KINDS = ("wordpiece", "bpe", "unigram")
BERT_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# RoBERTa's order, so ids match its checkpoints: <s>=0, <pad>=1, </s>=2, <unk>=3, <mask>=4.
ROBERTA_SPECIAL_TOKENS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
# GPT-2's document separator (Radford et al. 2019): byte-level BPE vocabularies get it as id 5,
# after RoBERTa's five, so causal-LM packing joins documents with a token of its own.
END_OF_TEXT = "<|endoftext|>"
# T5's SentencePiece ids: <pad>=0 (also the decoder's start token), </s>=1, <unk>=2.
T5_SPECIAL_TOKENS = ["<pad>", "</s>", "<unk>"]
# Sentinels appended to a new vocabulary unless the caller says otherwise.
DEFAULT_SENTINELS = {"unigram": T5_SENTINELS}
# Roles a vocabulary with sentinels may lack: T5 has no [CLS] and masks with sentinels.
SENTINEL_OPTIONAL_ROLES = ("cls", "mask")

# Role → the spellings we accept for it, in order of preference. XLNet's SentencePiece
# vocabulary has <s>/</s> (bos/eos) besides its <cls>/<sep>, so <cls>/<sep> come first.
ROLE_CANDIDATES = {
    "pad": ("[PAD]", "<pad>"),
    "unk": ("[UNK]", "<unk>"),
    "cls": ("[CLS]", "<cls>", "<s>"),
    "sep": ("[SEP]", "<sep>", "</s>"),
    "mask": ("[MASK]", "<mask>"),
}

_MODEL_KIND = {"WordPiece": "wordpiece", "BPE": "bpe", "Unigram": "unigram"}


def default_special_tokens(kind: str) -> list[str]:
    if kind == "bpe":
        return ROBERTA_SPECIAL_TOKENS + [END_OF_TEXT]
    return list(T5_SPECIAL_TOKENS if kind == "unigram" else BERT_SPECIAL_TOKENS)


def _role_tokens(special_tokens: list[str], sentinels: int = 0) -> dict[str, str]:
    """Map each role (pad/unk/cls/sep/mask) to its token in ``special_tokens``; with
    sentinels, cls and mask may be absent (T5's layout)."""
    roles = {}
    for role, candidates in ROLE_CANDIDATES.items():
        token = next((c for c in candidates if c in special_tokens), None)
        if token is not None:
            roles[role] = token
        elif not (sentinels and role in SENTINEL_OPTIONAL_ROLES):
            raise EmberError(
                f"special tokens {special_tokens} have no {role} token "
                f"(expected one of {', '.join(candidates)})"
                + ("" if role not in SENTINEL_OPTIONAL_ROLES else
                   "; a T5-style vocabulary without it needs sentinels (--sentinels 100)")
            )
    return roles


def _build(kind: str, lowercase: bool, roles: dict[str, str]) -> Tokenizer:
    """An untrained tokenizer with normalizer, pre-tokenizer and decoder for ``kind``."""
    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token=roles["unk"], continuing_subword_prefix="##"))
        tok.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=lowercase
        )
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
    elif kind == "bpe":
        # No unk token: byte-level BPE can spell any input from its 256-byte alphabet.
        tok = Tokenizer(models.BPE())
        if lowercase:
            tok.normalizer = normalizers.Lowercase()
        # add_prefix_space: a sentence's first word gets the same tokens as mid-sentence,
        # which matters because prepare tokenizes sentence by sentence and packs them.
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        tok.decoder = decoders.ByteLevel()
    elif kind == "unigram":
        tok = Tokenizer(models.Unigram())
        norms = [normalizers.NFKC()] + ([normalizers.Lowercase()] if lowercase else [])
        tok.normalizer = normalizers.Sequence(norms)
        # Whitespace runs split words and are dropped, as SentencePiece's default
        # remove_extra_whitespaces does (and transformers' T5 tokenizer): no stray "▁" piece
        # before a special token or at the end of a text.
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always"),
        ])
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    else:
        raise EmberError(f"unknown tokenizer kind {kind!r}; choose one of {', '.join(KINDS)}")
    return tok


def _trainer(kind: str, vocab_size: int, special_tokens: list[str], min_frequency: int,
             roles: dict[str, str], progress: bool):
    if kind == "wordpiece":
        return trainers.WordPieceTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=special_tokens,
            continuing_subword_prefix="##", show_progress=progress,
        )
    if kind == "bpe":
        return trainers.BpeTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=special_tokens,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=progress,
        )
    # Unigram has no min_frequency: it prunes by likelihood instead.
    return trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=special_tokens, unk_token=roles["unk"],
        show_progress=progress,
    )


def _deterministic_wordpiece(train, special_tokens: list[str], empty: Tokenizer, unk: str) -> Tokenizer:
    """WordPiece in two passes, so that the same text gives the same pieces on every run.

    The trainer gives its "##c" symbols (a character inside a word) ids in the order it meets
    them in a hash map, which changes from run to run, and a merge tied in count goes to the pair
    with the lower ids: a large vocabulary came out with a few different rare pieces each run (21
    of 30,522 on wiki-en). Pass 1 finds the "##c" symbols; pass 2 is given them up front, in
    code-point order, as extra special tokens (which fixes their ids; they are in the vocabulary
    either way), and the pieces it learns go into ``empty`` with only the real special tokens.
    Costs one more training pass (~45 s for all of wiki-en here)."""
    first = train(special_tokens)
    symbols = sorted(t for t in first.get_vocab(with_added_tokens=False)
                     if len(t) == 3 and t.startswith("##") and t not in special_tokens)
    second = train(special_tokens + symbols)
    empty.model = models.WordPiece(second.get_vocab(with_added_tokens=False), unk_token=unk,
                                   continuing_subword_prefix="##")
    empty.add_special_tokens(special_tokens)
    return empty


def _renumber_wordpiece(tok: Tokenizer, special_tokens: list[str], unk: str) -> None:
    """Give a trained WordPiece vocabulary ids that do not change from run to run.

    The trainer numbers its pieces differently each time: its "##" characters come out in
    another order on every run (which pieces it learns is fixed by ``_deterministic_wordpiece``).
    WordPiece encodes by greedy longest match over the set of pieces, so ids carry no meaning
    beyond the special tokens': those keep theirs (in the order given), then single characters,
    "##" characters and longer pieces follow, each group in code-point order."""
    vocab = tok.get_vocab(with_added_tokens=False)
    rest = sorted((t for t in vocab if t not in special_tokens),
                  key=lambda t: (0 if len(t) == 1 else 1 if len(t) == 3 and t.startswith("##") else 2, t))
    ordered = [t for t in special_tokens if t in vocab] + rest
    tok.model = models.WordPiece({t: i for i, t in enumerate(ordered)}, unk_token=unk,
                                 continuing_subword_prefix="##")


def _set_post_processor(tok: Tokenizer, kind: str, roles: dict[str, str]) -> None:
    if "cls" not in roles:  # T5: only </s> is appended, to each segment; one segment id
        eos = roles["sep"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"$A {eos}", pair=f"$A {eos} $B {eos}", special_tokens=[(eos, tok.token_to_id(eos))])
        return
    cls, sep = roles["cls"], roles["sep"]
    ids = {t: tok.token_to_id(t) for t in (cls, sep)}
    if kind == "bpe":
        template = processors.TemplateProcessing(
            single=f"{cls} $A {sep}",
            pair=f"{cls} $A {sep} {sep} $B {sep}",
            special_tokens=list(ids.items()),
        )
        # ByteLevel(trim_offsets) keeps character offsets off the leading space (QA spans).
        tok.post_processor = processors.Sequence(
            [processors.ByteLevel(trim_offsets=True), template]
        )
    else:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls} $A {sep}",
            pair=f"{cls} $A {sep} $B:1 {sep}:1",
            special_tokens=list(ids.items()),
        )


def train_tokenizer(
    files: list[str | Path] | str | Path,
    kind: str = "wordpiece",
    vocab_size: int = 30522,
    lowercase: bool = True,
    special_tokens: list[str] | None = None,
    min_frequency: int = 2,
    max_documents: int | None = None,
    progress: bool = True,
    fmt: str = "auto",
    text_field: str = "text",
    sentinels: int | None = None,
    alpha: float = 0.5,
    seed: int = 0,
) -> Tokenizer:
    """Train a ``kind`` tokenizer on the documents of ``files`` (files, folders, globs).

    Documents are streamed (see ``ember.data.readers``) into ``train_from_iterator``, so
    compressed dumps of any size work. ``max_documents`` caps the number of non-empty
    documents read. Special tokens come first in the vocabulary, in the order given;
    ``sentinels`` (default: 100 for unigram, else 0) T5 sentinels come last, and
    ``vocab_size`` counts them (T5: 32,000 pieces + 100 sentinels = 32,100).

    A shared multilingual vocabulary (XLM, Lample & Conneau 2019 §3.1): ``files`` maps
    language codes to their inputs ({"en": [...], "ru": [...]}), or is an
    ``ember.data.language_mix.LanguageBalancedSentences``; the trainer then sees sentences
    resampled so language i has the share q_i ~ p_i^alpha (``max_documents`` per language,
    ``seed`` fixes the resample).
    """
    from ember.data.language_mix import LanguageBalancedSentences
    from ember.data.readers import DocumentReader

    if kind not in KINDS:
        raise EmberError(f"unknown tokenizer kind {kind!r}; choose one of {', '.join(KINDS)}")
    if special_tokens is None:
        special_tokens = default_special_tokens(kind)
    special_tokens = list(dict.fromkeys(special_tokens))  # de-duplicate, keep order
    if sentinels is None:
        sentinels = DEFAULT_SENTINELS.get(kind, 0)
    if vocab_size - sentinels <= len(special_tokens):
        raise EmberError(f"vocab size {vocab_size} leaves no room beyond the {len(special_tokens)} special "
                         f"tokens and {sentinels} sentinels")
    if max_documents is not None and max_documents <= 0:
        raise EmberError("max_documents must be positive")
    roles = _role_tokens(special_tokens, sentinels)

    if isinstance(files, dict):
        files = LanguageBalancedSentences(files, alpha, seed, max_documents, fmt, text_field)
    if isinstance(files, LanguageBalancedSentences):  # it reports empty languages itself
        balanced = files

        def texts() -> Iterator[str]:  # the same seeded resample on every pass
            return iter(balanced)

        def check_read() -> None:
            pass
    else:
        reader = DocumentReader(files, fmt=fmt, text_field=text_field)

        def texts() -> Iterator[str]:
            for i, doc in enumerate(reader):
                if max_documents is not None and i >= max_documents:
                    return
                yield doc.text

        def check_read() -> None:
            if reader.documents == 0:
                raise EmberError(f"no text to train on: read {reader.describe_inputs()} "
                                 f"({reader.empty_skipped} empty documents)")

    def train(specials: list[str]) -> Tokenizer:
        tok = _build(kind, lowercase, roles)
        with _training(kind, vocab_size, sentinels, progress):
            tok.train_from_iterator(texts(), trainer=_trainer(kind, vocab_size - sentinels, specials, min_frequency,
                                                              roles, progress))
        check_read()
        return tok

    if kind == "wordpiece":
        tok = _deterministic_wordpiece(train, special_tokens, _build(kind, lowercase, roles), roles["unk"])
        _renumber_wordpiece(tok, special_tokens, roles["unk"])
    else:
        tok = train(special_tokens)
    add_sentinels(tok, sentinels)
    _set_post_processor(tok, kind, roles)
    return tok


@contextmanager
def _progress_on_stderr(progress: bool):
    """The Rust trainer's progress bars end with blank lines on the process's stdout (fd 1), where
    a caller's output goes (`ember tokenizer train ... > log`); point fd 1 at stderr meanwhile."""
    if not progress:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


@contextmanager
def _training(kind: str, vocab_size: int, sentinels: int, progress: bool):
    """The trainer's run, its progress off stdout and its one known refusal said in our words."""
    try:
        with _progress_on_stderr(progress):
            yield
    except Exception as e:
        if "not large enough to contain all chars" not in str(e):
            raise
        room = f" ({vocab_size - sentinels} after the {sentinels} sentinels)" if sentinels else ""
        raise EmberError(f"--vocab-size {vocab_size}{room} is smaller than the number of distinct characters "
                         f"in the corpus, which a {kind} vocabulary must all hold (a Korean or Chinese corpus "
                         "has thousands); raise --vocab-size") from None


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load a ``tokenizer.json`` (or a folder holding one) with a clear error if unusable."""
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise EmberError(
            f"tokenizer not found: {path}; train one with `ember tokenizer train`"
        )
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises a bare Exception for bad JSON/schema
        raise EmberError(f"{path}: not a valid tokenizer.json ({exc})") from None


def special_token_ids(tok: Tokenizer) -> dict[str, int]:
    """Ids of the pad/unk/cls/sep/mask tokens (BERT, RoBERTa or T5 spellings). A vocabulary
    with sentinels (T5) may lack cls and mask: its dict then has only pad/unk/sep (sep is
    T5's end-of-sequence ``</s>``)."""
    ids = {}
    optional = SENTINEL_OPTIONAL_ROLES if has_sentinels(tok) else ()
    for role, candidates in ROLE_CANDIDATES.items():
        for token in candidates:
            token_id = tok.token_to_id(token)
            if token_id is not None:
                ids[role] = token_id
                break
        else:
            if role in optional:
                continue
            raise EmberError(
                f"tokenizer has no {role} token (looked for {', '.join(candidates)}); "
                "add it with --special-tokens when training"
            )
    return ids


def role_id(special_ids: dict[str, int], role: str, needed_by: str) -> int:
    """``special_ids[role]``, or one clear error when the vocabulary has no such token (a T5
    sentinel vocabulary has no cls or mask: ``special_token_ids``)."""
    if role not in special_ids:
        raise EmberError(f"{needed_by} needs a {role} token ({', '.join(ROLE_CANDIDATES[role])}), and this corpus's "
                         "tokenizer has none (a T5 vocabulary with sentinels instead); prepare the corpus with a "
                         "WordPiece or BPE tokenizer (`ember tokenizer train`), or pre-train a T5 recipe on it")
    return special_ids[role]


def end_of_text_id(tok: Tokenizer) -> int:
    """The token that ends a document for causal LMs: GPT-2's ``<|endoftext|>`` (XLNet's
    ``<eod>``) when the vocabulary has it, else the separator (``</s>``, ``[SEP]``)."""
    for token in (END_OF_TEXT, "<eod>", "</s>", "[SEP]"):
        token_id = tok.token_to_id(token)
        if token_id is not None:
            return token_id
    raise EmberError(f"tokenizer has no end-of-text token (looked for {END_OF_TEXT}, </s>, [SEP]); "
                     f"train one with `ember tokenizer train --kind bpe` (it adds {END_OF_TEXT})")


def sequence_end_id(tok: Tokenizer) -> int:
    """The token that ends an encoder-decoder's sequences: ``</s>`` (T5's and BART's end of
    sequence, also BART's decoder start) when the vocabulary has it, else ``end_of_text_id``. A
    byte-level BPE of ember's has both </s> and GPT-2's <|endoftext|>; BART ends with </s>."""
    token_id = tok.token_to_id("</s>")
    return end_of_text_id(tok) if token_id is None else token_id


def tokenizer_kind(tok: Tokenizer) -> str:
    """'wordpiece', 'bpe' or 'unigram', read from the tokenizer's model."""
    name = type(tok.model).__name__
    if name not in _MODEL_KIND:
        raise EmberError(f"unsupported tokenizer model {name}")
    return _MODEL_KIND[name]

