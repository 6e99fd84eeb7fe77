"""T5's sentinel tokens ``<extra_id_0>`` ... ``<extra_id_{N-1}>`` (Raffel et al. 2020, §3.1.4).

Span corruption replaces every corrupted span of the input with its own sentinel and the
target spells each sentinel followed by the span it stands for. T5 keeps them at the END of
the vocabulary and counts down: the T5 code's ``sentinel_id(vocabulary)`` is
``vocab_size - 1``, so ``<extra_id_0>`` has the last id, ``<extra_id_1>`` the one before, and
``<extra_id_99>`` comes right after the learnt pieces (the layout of transformers'
``T5Tokenizer``: ``<pad>``=0, ``</s>``=1, ``<unk>``=2, pieces, ``<extra_id_99>`` ... ``<extra_id_0>``).

They are added as special tokens, so the text ``<extra_id_3>`` always encodes to that one id
(text-to-text inputs may spell them) and decoding with ``skip_special_tokens`` drops them.
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer

from ember.errors import EmberError

SENTINEL_FORMAT = "<extra_id_{}>"
T5_SENTINELS = 100  # T5's SentencePiece vocabulary: 32,000 pieces + 100 sentinels


def sentinel_token(i: int) -> str:
    return SENTINEL_FORMAT.format(i)


def add_sentinels(tok: Tokenizer, n: int) -> None:
    """Append ``n`` sentinels after the current vocabulary, ``<extra_id_0>`` last (T5's order)."""
    if n < 0:
        raise EmberError(f"--sentinels {n}: the number of sentinel tokens cannot be negative")
    tok.add_special_tokens([AddedToken(sentinel_token(i), special=True, normalized=False)
                            for i in reversed(range(n))])


def has_sentinels(tok: Tokenizer) -> bool:
    return tok.token_to_id(sentinel_token(0)) is not None


def decode_with_sentinels(tok: Tokenizer, ids: list[int]) -> str:
    """``ids`` as text with their sentinels spelled out (the other special tokens dropped, as
    ``decode`` drops them): what a span-corruption model writes is "<extra_id_0> capital <extra_id_1>",
    and plain ``decode`` showed only " capital" (or nothing, for a run of sentinels)."""
    prefix = SENTINEL_FORMAT.split("{")[0]  # "<extra_id_"
    text, run = [], []
    for i in ids:
        token = tok.id_to_token(i)
        if token is not None and token.startswith(prefix):
            text += [tok.decode(run), token]
            run = []
        else:
            run.append(i)
    text.append(tok.decode(run))
    return " ".join(t.strip() for t in text if t.strip())


def sentinel_ids(tok: Tokenizer, where: str = "the tokenizer") -> list[int]:
    """Ids of ``<extra_id_0>``, ``<extra_id_1>``, ... in sentinel order (the i-th corrupted
    span gets entry i), as many as the vocabulary has consecutively from 0."""
    ids = []
    while (token_id := tok.token_to_id(sentinel_token(len(ids)))) is not None:
        ids.append(token_id)
    if not ids:
        raise EmberError(
            f"{where} has no sentinel tokens ({sentinel_token(0)}, {sentinel_token(1)}, ...): a "
            "tokenizer without sentinels cannot be used for span corruption (T5's denoising "
            "objectives put one in place of each corrupted span). Retrain it with "
            "`ember tokenizer train --kind unigram` (T5's layout with 100 sentinels) or add "
            "`--sentinels 100` to any other kind, then re-run `ember prepare`")
    return ids
