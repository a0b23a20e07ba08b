"""Words as the PostgreSQL store's full-text columns hold them, made in Python on both sides: the ``tsvector``
stored with a message or summary, and the ``tsquery`` a search sends.

Why not ``to_tsvector``: PostgreSQL's parser and ``lower()`` follow the database's locale. Under ``C`` (a
common default) every non-ASCII letter is a separator ("Zürich" became ``z`` and ``rich``, Greek and Chinese
vanished), and under no locale does the ``simple`` configuration drop diacritics, which the query side does
(``proxy.engine.terms``) and SQLite's ``unicode61 remove_diacritics 2`` tokenizer does. Here a word is a run of
letters and digits (Python's ``[^\\W_]``, as ``terms`` reads a question), lowercased without diacritics, the
same on every server; both are typed input (``CAST(%s AS tsvector)``, ``CAST(%s AS tsquery)``), which no locale or
text-search configuration touches.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator, Sequence

from proxy.store.base import Phrase

MAX_CHARS = 100_000  # of a text, indexed: the rest of a longer text is not searchable by its words
MAX_LEXEME_BYTES = 2046  # PostgreSQL's limit for one word ("max 2046 bytes"; to_tsvector skips longer ones)
MAX_POSITIONS = 256  # PostgreSQL keeps at most this many positions of one word
MAX_POSITION = 16383  # later words are all at this position
MAX_VECTOR_BYTES = 900_000  # distinct words of one text, far below the 1 MB a tsvector may hold
_TOKEN = re.compile(r"[^\W_]+")


def fold(word: str) -> str:
    """Lowercase without diacritics (as ``proxy.engine.terms`` folds the words of a question)."""
    if word.isascii():
        return word.lower()
    decomposed = unicodedata.normalize("NFKD", word)
    return "".join(c for c in decomposed if not unicodedata.combining(c)).lower()


def lexemes(text: str) -> Iterator[str]:
    """The folded words of ``text``, in order (folding may split a word: "½" is "1", "2")."""
    for match in _TOKEN.finditer(text):
        word = fold(match.group())
        if _TOKEN.fullmatch(word):
            yield word
        else:
            yield from _TOKEN.findall(word)


def tsvector(text: str) -> str:
    """``tsvector`` input for the first ``MAX_CHARS`` characters of ``text``: each word with its positions."""
    positions: dict[str, list[int]] = {}
    size = 0
    for position, word in enumerate(lexemes(text[:MAX_CHARS]), start=1):
        seen = positions.get(word)
        if seen is None:
            cost = len(word.encode())
            if cost > MAX_LEXEME_BYTES or size + cost > MAX_VECTOR_BYTES:
                continue
            size += cost
            positions[word] = seen = []
        if len(seen) < MAX_POSITIONS and (not seen or seen[-1] < MAX_POSITION):
            seen.append(min(position, MAX_POSITION))
    return " ".join(f"{_quoted(word)}:{','.join(map(str, at))}" for word, at in positions.items())


def term_queries(phrases: Sequence[Phrase]) -> list[str]:
    """``tsquery`` input for each of ``phrases`` (distinct, in order): a phrase's words joined by ``<->``, a
    prefix marked ``:*``. Parts are folded here too: callers may pass words as a user typed them."""
    terms: dict[str, None] = {}
    for phrase in phrases:
        words = [word for part in phrase.parts for word in lexemes(part)]
        words = [word for word in words if len(word.encode()) <= MAX_LEXEME_BYTES]
        if not words:
            continue
        if len(words) == 1:
            terms[_quoted(words[0]) + (":*" if phrase.prefix else "")] = None
        else:
            terms["(" + " <-> ".join(map(_quoted, words)) + ")"] = None
    return list(terms)


def _quoted(word: str) -> str:
    # Words are letters and digits only; quoting keeps them literal all the same.
    return "'" + word.replace("\\", "\\\\").replace("'", "''") + "'"
