"""Which standing instruction a later one updates: the same topic, and a new value of the same type.

Users rarely repeat the words of an instruction when they change it: "cloud spend stays below $800" becomes
"keep the cloud bill under five hundred dollars", "the branch feat/orders-pagination" becomes "move your work to
the branch feat/orders-v2". What stays is the *topic* (a distinctive content word: "cloud", "branch", "demo")
and the *type* of the value (money, a date, a version, a size, a count of some unit, an identifier, a person or
product name). A fixed list of concepts cannot cover what users talk about, so supersession is decided here
from those two, for any wording:

* the slot (``proxy.engine.standing.slots``) holds the statement's concept and its topic words: stemmed content words,
  with generic ones ("budget", "thing", "month", "customer", common verbs) left out; a noun that names a kind
  of thing ("host", "branch", "ticket") is written ``noun@qualifier`` with the word right before it
  ("staging host" -> ``host@stag``), so that the staging host and the production host stay two items;
* ``same_topic`` says whether a new statement updates an old one: the same kind family, the same value type,
  and a shared topic word; where both name a kind of thing, the same thing with the same qualifier.

A rule's value is its polarity ("never", "allowed"); a rule is lifted only by one about the same words.
"""

from __future__ import annotations

import re

from proxy.engine.standing.lexicon import COUNT_UNIT, DATE, DURATION, GENERIC, MONEY, SIZE, stem

# Kinds whose typed values can update each other: a date first booked (decision) then made a deadline
# (constraint), an owner first assigned (decision) then named again (name).
TYPED_FAMILY = {"constraint": "fact", "decision": "fact", "name": "fact", "rule": "rule", "preference": "preference",
                "goal": "goal"}  # fmt: skip
POLARITY = {"never": "no", "always": "yes", "allowed": "yes", "not required": "no"}
_VERSION = re.compile(r"^(?:[A-Za-z][\w.+#-]*\s+)?v?\d+(?:\.\d+){0,3}(?:\.x)?$")
_IDENT = re.compile(r"[\w.-]*[\d_/:@#][\w./:@#-]*|[\w]+-[\w-]+")
_PROPER = re.compile(r"^(?:[A-Z][\w.+#'-]*)(?:\s+[A-Z][\w'-]*){0,2}$")


def value_type(value: str, concept: str) -> str:
    """The type of an instruction's ``value``: what another value must be to replace it."""
    if concept in ("status", "task"):
        return concept
    if value in POLARITY:
        return "polarity"
    if MONEY.search(value):
        return "money"
    if DATE.search(value):
        return "date"
    if SIZE.search(value):
        return "size"
    if DURATION.search(value):
        return "duration"
    if concept == "version" or _VERSION.fullmatch(value.strip()):
        return "version"
    if count := COUNT_UNIT.search(value):
        return "count " + stem(count.group(1).lower())
    if _IDENT.fullmatch(value.strip("`\"' ")):
        return "identifier"
    if _PROPER.fullmatch(value.strip()):  # who (a contact, an owner) is not what (a product, a place)
        return "person" if concept in ("contact", "owner") else "proper"
    return "text"


def _words(slot: str) -> tuple[str, set[str]]:
    """A slot's concept and topic words: after " ~ " where a concept slot carries them, else after its first."""
    key, _, topics = slot.partition(" ~ ")
    concept, _, rest = key.partition(" ")
    words = topics if topics else rest
    return concept, {w for w in words.split() if w.split("@")[0] not in GENERIC}


def _plain(words: set[str]) -> set[str]:
    return {part for w in words for part in w.split("@") if part and part not in GENERIC}


def same_topic(new: tuple[str, str, str], old: tuple[str, str, str]) -> bool:
    """Whether the statement ``new`` (kind, slot, value) updates ``old``, said in other words."""
    (new_kind, new_slot, new_value), (old_kind, old_slot, old_value) = new, old
    if TYPED_FAMILY.get(new_kind) != TYPED_FAMILY.get(old_kind):
        return False
    new_concept, new_words = _words(new_slot)
    old_concept, old_words = _words(old_slot)
    kind = value_type(new_value, new_concept)
    if kind != value_type(old_value, old_concept) or kind in ("text", "task"):
        return False
    if kind == "polarity":  # lifting or restoring an order (perhaps with a reason added)
        small, large = sorted((set(new_slot.split()), set(old_slot.split())), key=len)
        return POLARITY[new_value] != POLARITY[old_value] and len(small) >= 2 and small <= large
    new_things = {w.split("@")[0]: w for w in new_words if "@" in w}
    old_things = {w.split("@")[0]: w for w in old_words if "@" in w}
    if new_things and old_things:  # both name a kind of thing: the same one, qualified alike
        return any(new_things[t] == old_things[t] for t in new_things.keys() & old_things.keys())
    if not new_words and not old_words:
        return new_concept == old_concept
    return bool(_plain(new_words) & _plain(old_words))
