"""Search terms of a user's message, for auto-recall: which words say *which* earlier message is wanted.

Words of at least 3 characters, or containing a digit, minus ``STOPWORDS``. Identifiers (a digit, an inner
capital as in ``iPhone`` or ``ABC``, or joined parts as in ``ABC-4711``, ``foo_bar``, ``v1.2``) weigh most and
match exactly (joined parts as an FTS5 phrase); a capitalised word inside a sentence (a name) and a long word
weigh a little more. Other words of 4+ letters match by prefix of a light stem (``sisters`` → ``"sister"*``)
and also as written, which weighs more ("units" must not drown among "unit tests"). At most ``MAX_TERMS``
terms, heaviest first. Patterns have no nested quantifiers: linear on any input.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

MAX_QUERY_CHARS = 4000  # of the user's message, read for terms
MAX_TERMS = 16
MAX_PHRASE_PARTS = 6  # of an identifier such as a URL: the rest is left out of the phrase
IDENTIFIER_BONUS = 2.0
NAME_BONUS = 1.0
LONG_WORD_BONUS = 0.5  # words of LONG_WORD letters or more
EXACT_FORM_BONUS = 0.5  # a word in the form the user wrote it, beyond its stem's prefix match
LONG_WORD = 8
# Function words, question words and the verbs people use to ask about the past ("remind me what I said
# earlier"): they say nothing about *which* message is wanted. Words under 3 letters are dropped anyway.
_STOPWORD_TEXT = """
    about above after again against all also and any are aren because been before being below between both but
    can cannot could couldn did didn does doesn doing don down during each else ever few for from further had
    has have having her here hers herself him himself his how into isn its itself just let like more most
    myself nor not now off once only other our ours out over own same she should some such than that the their
    theirs them then there these they this those through too under until very was wasn were what when where
    which while who whom whose why will with would you your yours yourself
    tell told remind recall remember said say says saying mention mentioned earlier previously already
    ago please know knew thing things something anything talked discussed conversation okay yes hey
    hello thanks thank get got
    """
STOPWORDS = frozenset(_STOPWORD_TEXT.split())
_TOKEN = re.compile(r"[^\W_]+")  # what FTS5's unicode61 tokenizer keeps: runs of letters and digits
# A word, or parts joined by one separator each (ABC-4711, foo_bar, v1.2.3, host:port/path).
_WORD = re.compile(r"[^\W_]+(?:[-_./:#][^\W_]+)*")
_STEM_SUFFIXES = ("ies", "ied", "ing", "ed", "es", "s")
_PREFIX_MIN = 4


@dataclass(frozen=True)
class Term:
    """One search term: folded parts (one for a word, several for a phrase), matched exactly or, for a
    single part, as a prefix."""

    parts: tuple[str, ...]
    prefix: bool
    weight: float


def _fold(word: str) -> str:
    """Lowercase without diacritics, as the ``unicode61 remove_diacritics 2`` tokenizer folds."""
    if word.isascii():
        return word.lower()
    decomposed = unicodedata.normalize("NFKD", word)
    return "".join(c for c in decomposed if not unicodedata.combining(c)).lower()


def _stem(word: str) -> str:
    """A light English stem, kept at least ``_PREFIX_MIN`` letters long: a prefix to match word forms by."""
    if len(word) < 5:
        return word
    for suffix in _STEM_SUFFIXES:
        if word.endswith(suffix) and not (suffix == "s" and word.endswith("ss")):
            stem = word[: -len(suffix)]
            if len(stem) >= _PREFIX_MIN:
                return stem
    return word


def _identifier(word: str) -> bool:
    return any(c.isdigit() for c in word) or any(c.isupper() for c in word[1:])


def _phrase(word: str, pieces: Sequence[str], shouting: bool) -> bool:
    """Whether joined parts are one identifier (ABC-4711, foo_bar, Jean-Luc, example.com), not words that
    happen to touch ("e.g.", "and/or", "well-known")."""
    if any(c.isdigit() for c in word) or "_" in word or (not shouting and _identifier(word)):
        return True
    if any(c in word for c in "./:#"):
        return all(len(p) >= 2 for p in pieces) and any(len(p) >= 3 and _fold(p) not in STOPWORDS for p in pieces)
    return False


def query_terms(query: str) -> list[Term]:
    """The weighted search terms of a user's message, heaviest first (ties: first mentioned), at most
    ``MAX_TERMS``; empty when it holds only stopwords."""
    text = query[:MAX_QUERY_CHARS]
    shouting = not any(c.islower() for c in text)  # ALL CAPS: capitals mark neither names nor identifiers
    found: dict[tuple[tuple[str, ...], bool], tuple[float, int]] = {}

    def add(parts: tuple[str, ...], prefix: bool, weight: float, position: int) -> None:
        key = (parts, prefix)
        old = found.get(key)
        if old is None or weight > old[0]:
            found[key] = (weight, old[1] if old else position)

    previous_end = 0
    for position, match in enumerate(_WORD.finditer(text)):
        word = match.group()
        gap = text[previous_end : match.start()]
        sentence_start = previous_end == 0 or any(c in gap for c in ".!?\n")
        previous_end = match.end()
        pieces = _TOKEN.findall(word)
        if len(pieces) > 1 and _phrase(word, pieces, shouting):
            parts = tuple(_fold(p) for p in pieces[:MAX_PHRASE_PARTS])
            add(parts, False, 1.0 + IDENTIFIER_BONUS, position)
            continue
        for piece in pieces:  # a single word, or the words of a hyphenated one ("well-known")
            folded = _fold(piece)
            if any(c.isdigit() for c in piece):
                add((folded,), False, 1.0 + IDENTIFIER_BONUS, position)
                continue
            if len(folded) < 3 or folded in STOPWORDS:
                continue
            if not shouting and _identifier(piece):  # iPhone, ABC, NaN
                add((folded,), False, 1.0 + IDENTIFIER_BONUS, position)
                continue
            weight = 1.0
            if not shouting and piece[0].isupper() and not sentence_start:
                weight += NAME_BONUS
            if len(folded) >= LONG_WORD:
                weight += LONG_WORD_BONUS
            stem = _stem(folded) if folded.isalpha() else folded
            if stem in STOPWORDS:  # "remembered", "mentions"
                continue
            prefix = folded.isalpha() and len(stem) >= _PREFIX_MIN
            add((stem,), prefix, weight, position)
            if prefix and folded != stem:
                # The word as written counts too, and more: "units" must not drown among "unit tests".
                add((folded,), False, weight + EXACT_FORM_BONUS, position)
    ordered = sorted(found.items(), key=lambda item: (-item[1][0], item[1][1]))
    return [Term(parts, prefix, weight) for (parts, prefix), (weight, _) in ordered[:MAX_TERMS]]


class Matcher:
    """Finds terms in a folded token list in one pass: exact parts by dict, prefixes by their first
    ``_PREFIX_MIN`` letters, phrases by their first part."""

    def __init__(self, terms: Sequence[Term]) -> None:
        self.terms = list(terms)
        self.exact: dict[str, list[int]] = {}
        self.prefixes: dict[str, list[int]] = {}
        for index, term in enumerate(self.terms):
            head = term.parts[0]
            if term.prefix:
                self.prefixes.setdefault(head[:_PREFIX_MIN], []).append(index)
            else:
                self.exact.setdefault(head, []).append(index)

    def hits(self, folded: Sequence[str]) -> list[tuple[int, int]]:
        """(token position, term index) of every occurrence, in token order."""
        found: list[tuple[int, int]] = []
        for position, token in enumerate(folded):
            for index in self.exact.get(token, ()):
                parts = self.terms[index].parts
                if len(parts) == 1 or tuple(folded[position : position + len(parts)]) == parts:
                    found.append((position, index))
            for index in self.prefixes.get(token[:_PREFIX_MIN], ()):
                if token.startswith(self.terms[index].parts[0]):
                    found.append((position, index))
        return found


def token_positions(text: str) -> tuple[list[int], list[str]]:
    starts: list[int] = []
    folded: list[str] = []
    for match in _TOKEN.finditer(text):
        starts.append(match.start())
        folded.append(_fold(match.group()))
    return starts, folded


def content_words(text: str) -> set[str]:
    """The words of ``text`` that carry content, folded: those with a digit (two characters or more) and those
    of three letters or more that are not ``STOPWORDS``. Auto-recall compares an excerpt's with the forwarded
    context's to tell whether the excerpt adds anything."""
    out: set[str] = set()
    for token in set(_TOKEN.findall(text)):  # each distinct token once: a long context repeats most of its words
        word = _fold(token)
        numeric = not word.isalpha() and any(map(str.isdigit, word))  # (a letter is never a digit)
        if (numeric and len(word) >= 2) or (not numeric and len(word) >= 3 and word not in STOPWORDS):
            out.add(word)
    return out
