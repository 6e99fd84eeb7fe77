"""Rule-based sentence splitting, fast enough to run over a whole Wikipedia dump.

BERT's NSP and SOP objectives and RoBERTa's DOC-SENTENCES packing need sentence boundaries,
but only approximately: a missed split makes a longer segment, a wrong split a shorter one.
So instead of a trained model (nltk punkt) we use one regex to find candidates and a few
cheap checks in Python:

- a candidate is ``.``, ``!``, ``?`` or ``…`` (possibly repeated, possibly followed by closing
  quotes/brackets), then whitespace;
- the next visible character must start a sentence: an upper-case letter (``str.isupper``, so
  Cyrillic and Greek work), a digit, or an opening quote/bracket;
- a ``.`` does not end a sentence after a known abbreviation (Mr., e.g., U.S., Jan.) or a
  single-letter initial (J. R. R. Tolkien). Decimals (3.14) never match because no
  whitespace follows the dot.

Newlines are hard boundaries (paragraphs, or one review per line in corpora without
sentence punctuation such as Korean NSMC).
"""

from __future__ import annotations

import re

# Lower-cased, without the final dot. Multi-dot forms ("e.g", "u.s") are matched on the
# whole token before the final dot.
ABBREVIATIONS = frozenset(
    """
    mr mrs ms dr prof sr jr st mt ft gen col lt sgt capt cmdr adm gov rep sen pres rev fr hon
    messrs mme mlle
    e.g i.e etc vs cf al approx ca c est dept univ assn bros inc ltd co corp plc llc no nos
    op vol vols pp fig figs eq eqs ed eds trans repr ch sec art para
    u.s u.k u.n u.s.a e.u d.c a.m p.m b.c a.d b.c.e c.e ph.d m.d b.a m.a
    jan feb mar apr jun jul aug sep sept oct nov dec
    mon tue tues wed thu thur thurs fri sat sun
    ave blvd rd hwy
    """.split()
)

# Punctuation run, optional closing quotes/brackets, then whitespace. Group 1 = the
# punctuation, group 2 = what follows it up to the whitespace. The lookahead rejects the
# common lower-case ASCII follower inside the regex engine (cheap); the full
# ``_starts_sentence`` test in Python handles the rest.
_CANDIDATE = re.compile(r"([.!?…]+)([\"'”’»)\]]*)\s+(?=[^a-z\s])")
_WORD_STOP = "(\"'“‘«["
_OPENERS = "\"'“‘«([¿¡"


def _starts_sentence(ch: str) -> bool:
    """True if ``ch`` can start a sentence: upper case (any script), digit, quote, bracket."""
    return ch.isupper() or ch.isdigit() or ch in _OPENERS


def _is_abbreviation(text: str, dot: int) -> bool:
    """True if the ``.`` at index ``dot`` closes an abbreviation or an initial."""
    # The word before the dot: back to whitespace (incl. no-break space) or an opener.
    start = dot
    while start > 0 and not text[start - 1].isspace() and text[start - 1] not in _WORD_STOP:
        start -= 1
    word = text[start:dot]
    if not word:
        return False
    if len(word) == 1 and word.isalpha():  # initial: "J. R. R. Tolkien", "Vitamin A."
        return True
    return word.lower() in ABBREVIATIONS


def _split_paragraph(text: str, out: list[str]) -> None:
    start = 0
    for match in _CANDIDATE.finditer(text):
        end = match.end()
        if end >= len(text) or not _starts_sentence(text[end]):
            continue
        punct = match.group(1)
        if punct == "." and not match.group(2) and _is_abbreviation(text, match.start(1)):
            continue
        sentence = text[start:end].strip()
        if sentence:
            out.append(sentence)
        start = end
    tail = text[start:].strip()
    if tail:
        out.append(tail)


def split_sentences(text: str) -> list[str]:
    """Split ``text`` into sentences: newlines first, then sentence punctuation.

    Returns the non-empty sentences, stripped, in order.
    """
    out: list[str] = []
    for paragraph in text.split("\n"):
        if paragraph and not paragraph.isspace():
            _split_paragraph(paragraph, out)
    return out
