"""Supersession by topic: the items a new statement may repeat or replace, without comparing it with every one.

``ledger.supersedes(new, old)`` holds in two cases, and each one needs the two statements to share something
that can be looked up:

* the same kind family and the same slot key (``ledger._key``: the slot before " ~ "): both are filed under
  that key (the family is left out of it: two families rarely share a slot, and the index cannot import the
  ledger's table of them);
* ``topics.same_topic``: the same typed family (``topics.TYPED_FAMILY``) and the same value type
  (``topics.value_type``; never "text" nor "task"), and then

  - for a value that is a polarity ("never", "allowed"): opposite polarities, and the smaller of the two
    slots' word sets (at least two words) inside the larger one. Each item is filed under every pair of its
    slot words and under its *least pair* (its two least words); a statement looks up the items that hold its
    own least pair, and the items whose least pair is a pair of its words. Whichever of the two sets is the
    smaller, its least pair is in both, so one of the two lookups finds them (a pair, not a word: the words of
    orders are common ones, "push", "branch", and a word alone would match most orders with most others);
  - for any other value: a shared plain topic word (``topics._plain`` of ``topics._words``; where both slots
    name a kind of thing, the same ``noun@qualifier``, whose noun is such a word), or, when neither slot has a
    topic word, the same concept.

So the keys below are a *superset* condition of ``supersedes``: a pair that shares no key is never compared,
and ``reconcile`` gets the same answer as when it compares every pair (``tests/engine/standing/
test_index.py`` holds it to that over the readers' own output). The keys follow the readers: a change to
``supersedes``, ``_key``, ``same_topic``, ``_words`` or ``_plain`` must be mirrored here, and that test says
when it was not.

An ``Index`` holds entries (items, or the statements of one message) in the order they were filed, and
answers ``near(statement)`` in that order; an exhaustive one answers with every entry, which is the
all-pairs reconcile the benchmark and the tests compare with.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Iterator
from typing import Generic, Protocol, TypeVar

from proxy.engine.standing.topics import POLARITY, TYPED_FAMILY, _plain, _words, value_type

Key = tuple[str, ...]


class Topical(Protocol):
    """What the index reads of an item or a statement."""

    @property
    def kind(self) -> str: ...
    @property
    def slot(self) -> str: ...
    @property
    def value(self) -> str: ...


T = TypeVar("T", bound=Topical)


def slot_key(slot: str) -> str:
    """``ledger._key``: what a slot is before the topic words a concept slot carries after " ~ "."""
    return slot.partition(" ~ ")[0]


@functools.lru_cache(maxsize=16384)
def keys(kind: str, slot: str, value: str) -> tuple[frozenset[Key], frozenset[Key]]:
    """(the keys an item of this kind, slot and value is filed under, the keys a statement of them looks up).
    ``supersedes(a, b)`` implies that ``a``'s lookups meet ``b``'s filing keys (and, the relation being
    symmetric in what it reads, the other way round)."""
    filed: set[Key] = {("slot", slot_key(slot))}
    looked = set(filed)
    family = str(TYPED_FAMILY.get(kind))
    concept, words = _words(slot)
    kind_of_value = value_type(value, concept)
    if kind_of_value == "polarity":
        sign = POLARITY[value]
        other = "no" if sign == "yes" else "yes"
        pairs = list(itertools.combinations(sorted(set(slot.split())), 2))
        if pairs:  # (an order of fewer than two words is never lifted by another)
            least = pairs[0]
            filed |= {("pair", family, sign, *pair) for pair in pairs}
            filed.add(("least", family, sign, *least))
            looked.add(("pair", family, other, *least))
            looked |= {("least", family, other, *pair) for pair in pairs}
            # the same order with another figure (``ledger._refigured``): the same sign, looked up alike
            looked.add(("pair", family, sign, *least))
            looked |= {("least", family, sign, *pair) for pair in pairs}
    elif kind_of_value not in ("text", "task"):
        topic = {("topic", family, kind_of_value, w) for w in _plain(words)}
        if not words:
            topic.add(("concept", family, kind_of_value, concept))
        filed |= topic
        looked |= topic
    return frozenset(filed), frozenset(looked)


class Index(Generic[T]):
    """Entries filed by topic, in the order they were added; ``exhaustive``: every entry is near every
    statement (the all-pairs comparison)."""

    def __init__(self, entries: Iterable[T] = (), *, exhaustive: bool = False) -> None:
        self.exhaustive = exhaustive
        self._entries: dict[int, T] = {}
        self._under: dict[Key, list[int]] = {}
        self._next = 0
        for entry in entries:
            self.add(entry)

    def sibling(self) -> Index[T]:
        """An empty index of the same mode (for another kind of entry, or another message)."""
        return Index(exhaustive=self.exhaustive)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[T]:
        return iter(self._entries.values())

    def add(self, entry: T) -> int:
        """File ``entry``; its position (for ``remove``)."""
        position = self._next
        self._next += 1
        self._entries[position] = entry
        if not self.exhaustive:
            for key in keys(entry.kind, entry.slot, entry.value)[0]:
                self._under.setdefault(key, []).append(position)
        return position

    def remove(self, position: int) -> None:
        """Forget the entry at ``position`` (its keys' lists are cleaned as they are read)."""
        self._entries.pop(position, None)

    def near(self, statement: Topical) -> list[tuple[int, T]]:
        """(position, entry) of every entry that ``statement`` may repeat or supersede, in filing order."""
        if self.exhaustive:
            return list(self._entries.items())
        found: set[int] = set()
        for key in keys(statement.kind, statement.slot, statement.value)[1]:
            positions = self._under.get(key)
            if positions is None:
                continue
            live = [p for p in positions if p in self._entries]
            if len(live) < len(positions):
                self._under[key] = live
            found.update(live)
        return [(p, self._entries[p]) for p in sorted(found)]
