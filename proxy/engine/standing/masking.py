"""What of a superseded item must not come back through older material (``Standing.mask``).

In the summaries and recall excerpts that are forwarded, a superseded item's *sentence* is replaced by
``MARKER`` wherever it occurs. Its *value* ("$800", "Python 3.9", "orders-stg-2") is replaced only where a
later item replaced it (not where it was lifted with nothing in its place), only where no current item holds the
same value, and only inside a sentence that also names what the item was about (one of its topic words): the
budget of $800 that was replaced is hidden, an invoice of $800 in the same summary is not.

A deterministic function of the stored items, so the masked text changes only when the items do (prompt
caches). Linear: one alternation of escaped literals for the sentences, one for the values, and for each value
found, a look at its own sentence.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.engine.standing.ledger import topic_words
from proxy.store.records import LedgerItem

MARKER = "[superseded]"
MAX_MASKED = 200  # newest superseded items masked in older material
POLARITIES = frozenset({"never", "always", "allowed", "not required", "lifted", "changed"})  # too common to mask
_DISTINCTIVE = re.compile(r"\d|[$€£¥]|\w[-_./:]\w|[a-z][A-Z]")
_SENTENCE_END = re.compile(r"[.!?\n]")
# Concepts of a slot that say what it is about ("budget", "deadline"), beside its topic words; not the routes.
_NOT_TOPICS = frozenset({"limit", "use", "decision", "prefer", "said", "task", "status", "goal"})


@dataclass(frozen=True)
class Stale:
    """The compiled masks of one set of items (hashable: masked texts are cached per set)."""

    sentences: re.Pattern[str] | None
    values: re.Pattern[str] | None
    topics: tuple[tuple[str, re.Pattern[str]], ...]  # (folded value, what a sentence must name to hide it)

    def mask(self, text: str) -> str:
        return _masked(self, text)


def stale_of(items: Sequence[LedgerItem]) -> Stale | None:
    """The masks of ``items``' superseded entries, or None when nothing must be hidden."""
    current_values = {_fold(item.value) for item in items if item.current}
    current_texts = {_fold(item.text) for item in items if item.current}
    replaced_by = {item.id: item for item in items}
    phrases: set[str] = set()
    topics: dict[str, set[str]] = {}
    stale = [item for item in items if item.superseded_seq is not None]
    for item in stale[-MAX_MASKED:]:
        text = " ".join(item.text.split())
        if _fold(text) not in current_texts:  # "never push to main", lifted, then set again: in force
            phrases.add(text)
        value = " ".join(item.value.split())
        successor = replaced_by.get(item.superseded_by or "")
        lifted = successor is not None and _fold(successor.value) == "lifted"
        words = _about(item)
        if _distinctive(value) and _fold(value) not in current_values and not lifted and words:
            topics.setdefault(_fold(value), set()).update(words)
    if not phrases and not topics:
        return None
    return Stale(
        _alternation(phrases),
        _alternation(set(topics)),
        tuple((value, re.compile(r"\b(?:" + "|".join(sorted(map(re.escape, words))) + r")", re.I))
              for value, words in sorted(topics.items())),
    )  # fmt: skip


def _about(item: LedgerItem) -> set[str]:
    concept = item.slot.partition(" ")[0]
    words = topic_words(item.slot)
    if concept.isalpha() and concept not in _NOT_TOPICS and len(concept) > 2:
        words.add(concept)
    return {w for w in words if w.isalpha() or "-" in w}


def _alternation(phrases: set[str]) -> re.Pattern[str] | None:
    if not phrases:
        return None
    alternatives = "|".join(re.escape(p) for p in sorted(phrases, key=len, reverse=True))
    return re.compile(rf"(?<![\w$€£]){alternatives}(?!\w)", re.I)


def _fold(value: str) -> str:
    return " ".join(value.casefold().split())


def _distinctive(value: str) -> bool:
    """Whether a value can be told apart from ordinary words: a figure, an amount, a date or an identifier
    ("$800", "Python 3.9", "orders-stg-2"), not words any text may hold ("German", "the user")."""
    return _fold(value) not in POLARITIES and len(value) >= 2 and _DISTINCTIVE.search(value) is not None


@functools.lru_cache(maxsize=4096)
def _masked(stale: Stale, text: str) -> str:
    if stale.sentences is not None:
        text = stale.sentences.sub(MARKER, text)
    if stale.values is None:
        return text
    topics = dict(stale.topics)

    def value(match: re.Match[str]) -> str:
        start = max((m.end() for m in _SENTENCE_END.finditer(text, max(0, match.start() - 300), match.start())),
                    default=max(0, match.start() - 300))  # fmt: skip
        end_match = _SENTENCE_END.search(text, match.end(), match.end() + 300)
        sentence = text[start : end_match.start() if end_match else match.end() + 300]
        about = topics.get(_fold(match.group(0)))
        return MARKER if about is not None and about.search(sentence) else match.group(0)

    return stale.values.sub(value, text)
