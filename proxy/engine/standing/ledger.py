"""The standing-instructions ledger: what the user or the agent set to hold from then on, kept current and shown.

A long session's rules ("never push to main"), hard constraints ("budget cap is $800"), preferences, goals and
task state, decisions and names are stated once and acted on without being asked about again, so a summary that
keeps a few facts by score loses most of them. The ledger keeps each as an item (``proxy.store.records.
LedgerItem``) with the message it came from, replaces it when a later statement updates it, also in other words
(``proxy.engine.standing.topics``: the same kind family and slot, or the same topic with a value of the same type), and
is forwarded as one block right after the instructions once compaction has started.

This module is the deterministic core, with no store and no I/O:

* ``extract``: the standing instructions in one message's text, by who said it (the user and the instructions
  every kind, the agent its plan and task state; tool output nothing; an instruction override is never an item);
* ``reconcile``: which of them to add, and which current items each one supersedes;
* ``select``: the current items that fit a token budget, most important first when it must shrink, returned
  in source order so that the block only grows at its end (prompt caches keep its prefix);
* ``render``: the block the model sees, every item neutralised, byte-stable for the same items.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from proxy import tokens
from proxy.engine.facts import sentences
from proxy.engine.injection import is_instruction_override
from proxy.engine.neutralise import neutralise_cached
from proxy.engine.standing.changes import changes, lifted
from proxy.engine.standing.cues import typed_value
from proxy.engine.standing.index import Index
from proxy.engine.standing.languages import detect, foreign
from proxy.engine.standing.lexicon import GENERIC, content_words
from proxy.engine.standing.slots import classify
from proxy.engine.standing.speech import negated, not_own, own_prose
from proxy.engine.standing.terse import one_off
from proxy.engine.standing.topics import POLARITY, same_topic, value_type
from proxy.redaction import KNOWN_MARKER, MARKER, redact_secrets
from proxy.store.records import LEDGER_KINDS, LedgerItem

MAX_INPUT_CHARS = 20_000  # a message's standing instructions are in its prose, not in a pasted megabyte
SETTERS = {
    "user": LEDGER_KINDS,
    "system": LEDGER_KINDS,
    "developer": LEDGER_KINDS,
    # The agent's own turns set only its plan and task state ("Plan for the refactor: …"): what it decides is a
    # proposal until the user agrees ("we'll use PostgreSQL"), and is in the summaries.
    "assistant": ("goal",),
}
# Kinds that can update each other: "you may push to main now" (a rule) lifts "never push to main", and
# "keep p99 under 200 ms" is a limit whichever of the two a phrasing lands on.
ASSISTANT_ROLES = frozenset({"assistant", "model"})
LIFTERS = frozenset({"user", "system", "developer"})  # who may lift an item, or say that it changed
FAMILY = {"rule": "rule", "constraint": "rule", "preference": "preference", "goal": "goal", "decision": "decision",
          "name": "decision"}  # fmt: skip
OPEN_TAG = '<standing_instructions source="lcm-proxy">'
CLOSE_TAG = "</standing_instructions>"
# The block shows what holds in the order it was said. When the proxy is not sure that a later line replaces an
# earlier one it keeps both, so the header says which wins: never a replaced value shown as the current one alone.
INTRO = (
    "Set earlier in this conversation and still in force, in the order they were said (the messages were "
    "summarised); where two lines are about the same thing, the later one overrides the earlier:"
)
COMPACT_INTRO = "Still in force, in the order said (a later line overrides an earlier one):"
_ASSISTANT_ACTION = re.compile(
    r"\b(?:let's|let us|I'll|I will|I'm going to)\s+(?:use|run|try|check)\s+\S+\s+to\s", re.I
)
_ROLE = re.compile(r"[a-z]{1,20}")
_KIND_PREFIX = re.compile(
    r"^(?:[\w'-]+\s+){0,2}(?:rules?|constraints?|preferences?|facts?|goal state|goals?|decisions?|requirements?"
    r"|polic(?:y|ies)|fyi|note)\s*:\s+(?=\S)",
    re.I,
)


@dataclass(frozen=True)
class Statement:
    kind: str  # one of LEDGER_KINDS
    slot: str  # normalised topic key: same kind family + same slot => the newer supersedes the older
    value: str  # the part an update changes, as written ("$800", "five hundred dollars", "metric units")
    text: str  # the sentence as stated, whitespace collapsed, credentials masked, at most ~300 characters

    @property
    def negative(self) -> bool:
        """Whether it forbids or refuses what it names (``speech.negated``): compared in every repeat test."""
        return negated(self.text)


def extract(text: str, role: str) -> list[Statement]:
    """The standing instructions in one message's ``text``, in order; of two in one message about the same
    slot, only the later. ``role`` says who may set what (``SETTERS``); a tool's output sets nothing."""
    kinds = SETTERS.get(role, ())
    if not kinds or not text:
        return []
    # Code, quoted lines, pasted documents and a client's own reminders are material, not what the speaker
    # sets: a web page or a README quoted in a message must not become a standing rule (``speech.own_prose``).
    prose = own_prose(redact_secrets(text[:MAX_INPUT_CHARS]))
    found: dict[tuple[str, str], Statement] = {}
    # The language of the whole message (a sentence in it may be too short to tell), detected only when a sentence
    # is neither plainly English nor plainly not (lingua costs more than reading most messages).
    language = functools.cache(lambda: detect(prose))
    for whole in sentences(prose):
        if foreign(whole, language):  # "Eine Regel: …": English cues in German prose misread it (``languages``)
            continue
        parts = _clauses(whole)
        read = [s for s in (_read(part, role, kinds) for part in parts) if s is not None] if len(parts) > 1 else []
        if len(read) < 2:  # one instruction (or none) in the sentence: read it whole, with its context, unless
            # only its part reads ("I only review small PRs, so no drive-by refactors, ever")
            read = [s for s in (_read(whole, role, kinds),) if s is not None] or read
        for statement in read:
            key = (FAMILY.get(statement.kind, statement.kind), statement.slot)
            found.pop(key, None)
            found[key] = statement
    return list(found.values())


# Where one sentence holds several instructions: "no emojis, ever, and keep replies under 150 words", "rules:
# squash merges; no force-push". Plain commas stay: "When you commit, always sign the commit" is one order.
_CLAUSE_BREAK = re.compile(
    r"\s*(?:;|\s[-–—]\s|,\s*(?:and|but|also|plus|so)\s+"
    r"|\s+and\s+(?:also\s+)?(?=(?:never|always|don't|do not|please|keep|make sure|use|no|every|each|all|any"
    r"|nothing|none)\b))\s*",
    re.I,
)
_LABEL = re.compile(
    r"^[^:]{0,60}\b(?:rules?|notes?|reminders?|constraints?|preferences?|requirements?|policy|update)\s*:\s*", re.I
)


def _clauses(sentence: str) -> list[str]:
    """The parts of ``sentence`` that may each set an instruction (at most 6; one part when it does not split)."""
    body = sentence[label.end() :] if (label := _LABEL.match(sentence)) else sentence
    parts = [p.strip(" ,.") for p in _CLAUSE_BREAK.split(body)[:6]]
    return [p for p in parts if len(p) >= 8] or [sentence]


def _read(sentence: str, role: str, kinds: Collection[str]) -> Statement | None:
    """What one sentence (or clause) states, if anything: a lift, an instruction, or a change."""
    if is_instruction_override(sentence) or not_own(sentence) or one_off(sentence):
        return None  # an override, someone else's rule, a hypothetical, a hedge, a log or code line, a one-off
    if role == "assistant" and _ASSISTANT_ACTION.search(sentence):
        return None  # "Let's use ripgrep to find the call sites": a step of the work, not a decision
    if role in LIFTERS and (topic := lifted(sentence)) and (words := content_words(topic)):
        return Statement("lift", words, "lifted", sentence)
    classified = classify(sentence, kinds)
    if classified is None:
        if role in LIFTERS and changes(sentence) and (words := content_words(sentence)):
            return Statement("follow", words, typed_value(sentence) or "", sentence)
        return None
    kind, slot, value = classified
    if MARKER in value or KNOWN_MARKER in value:
        return None  # "the API key is [REDACTED]": nothing worth keeping
    return Statement(kind, slot, value, sentence)


def supersedes(new: Statement, old: Statement | LedgerItem) -> bool:
    """Whether ``new`` replaces ``old``: the same thing, said later: the same kind family and slot key, or
    (``proxy.engine.standing.topics``) the same topic with a value of the same type."""
    if FAMILY.get(new.kind) == FAMILY.get(old.kind) and _key(new.slot) == _key(old.slot):
        return True
    return same_topic((new.kind, new.slot, new.value), (old.kind, old.slot, old.value)) or _refigured(new, old)


def _refigured(new: Statement, old: Statement | LedgerItem) -> bool:
    """The same order said again with another figure of the same type ("standup at 10 from now on" after
    "standup is always at 9:30"): every word of the shorter order's slot is in the longer's."""
    if new.value not in POLARITY or new.value != old.value or FAMILY.get(new.kind) != FAMILY.get(old.kind):
        return False
    small, large = sorted((set(new.slot.split()), set(old.slot.split())), key=len)
    first, second = typed_value(new.text) or "", typed_value(old.text) or ""
    same_type = value_type(first, "") == value_type(second, "")
    return len(small) >= 2 and small <= large and bool(first and second) and same_type and _norm(first) != _norm(second)


def _key(slot: str) -> str:
    return slot.partition(" ~ ")[0]


def _repeats(new: Statement, old: Statement | LedgerItem) -> bool:
    """The same thing said again, the same way round: "Please answer in French" does not repeat "Don't answer
    in French", it reverses it; and an order with another figure in it ("at 5 from now on" after "always 6pm")
    changes it."""
    return (
        supersedes(new, old)
        and _norm(new.value) == _norm(old.value)
        and negated(new.text) == negated(old.text)
        and (new.value not in POLARITY or _norm(typed_value(new.text) or "") == _norm(typed_value(old.text) or ""))
    )


def _norm(value: str) -> str:
    return " ".join(value.casefold().split())


def reconcile(
    current: Sequence[LedgerItem],
    new: Sequence[Statement],
    role: str = "user",
    *,
    index: Index[LedgerItem] | None = None,
) -> list[tuple[Statement, list[str]]]:
    """For the statements of one new message, in order: each statement to add, with the ids of the current
    items it supersedes. One that repeats a current item (same kind family, slot and value), or one added
    just before it, is not added. A statement is compared only with the items and statements that share a
    topic key with it (``proxy.engine.standing.index``: the same answer as comparing every pair); ``index``
    holds the open items of ``current`` when the caller keeps one, else it is built here."""
    # A dropped item is still replaced by its update (else restoring it later would make two current budgets),
    # but restating it adds it again: the user says it holds. What the user or the instructions set, an
    # assistant's turn never replaces ("we decided the budget is $5,000" leaves the user's cap in force).
    open_items = index if index is not None else Index(item for item in current if item.superseded_seq is None)
    said: Index[Statement] = Index(exhaustive=open_items.exhaustive)  # this message's statements added so far
    added: dict[int, tuple[Statement, list[str]]] = {}
    for statement in new:
        if statement.kind in ("lift", "follow"):  # about whatever it shares the most topic words with
            pool = [i for i in (current or open_items) if i.current and _may_replace(role, i.role)]
            if change := _change(statement, pool):
                added[said.add(change[0])] = change
            continue
        near = [item for _, item in open_items.near(statement)]
        earlier = said.near(statement)
        live = [item for item in near if item.current]
        if any(_repeats(statement, item) for item in live) or any(_repeats(statement, s) for _, s in earlier):
            continue
        for position, s in earlier:
            if supersedes(statement, s):
                said.remove(position)
                del added[position]
        replaced = [item.id for item in near if _may_replace(role, item.role) and supersedes(statement, item)]
        added[said.add(statement)] = (statement, replaced)
    return list(added.values())


def _change(statement: Statement, live: Sequence[LedgerItem]) -> tuple[Statement, list[str]] | None:
    """A revocation or a change the reader could not read as an instruction, against the current items it is
    about (those sharing the most topic words with it; none: it is about nothing in force, and is dropped).
    A revocation lifts them all. A change is shown after the latest of them, in its kind and slot (so a later
    update replaces both); it replaces that item only on evidence: a new value of the same type."""
    words = topic_words(statement.slot)
    # A change that carries a value ("now is 1800 kcal a day, not 2000") is about an item with a value of that
    # type first: shared words count, and the same type of value counts for two of them.
    kind = value_type(statement.value, "") if statement.kind == "follow" and statement.value else ""
    typed = {item.id for item in live if kind and kind != "text" and _item_type(item) == kind}
    scored = [
        (len(words & (topic_words(item.slot) | topic_words(content_words(item.text)))) + 2 * (item.id in typed), item)
        for item in live
    ]
    best = max((n for n, _ in scored), default=0)
    if best == 0 or (typed and best == 2 and len(typed) > 1):
        return None  # about nothing in force, or only a type that several items share
    related = [item for n, item in scored if n == best]
    if statement.kind == "lift":
        return replace(statement, kind=related[-1].kind, slot=related[-1].slot), [item.id for item in related]
    item = related[-1]
    update = replace(statement, kind=item.kind, slot=item.slot, value=statement.value or "changed")
    concept = item.slot.partition(" ")[0]
    same_type = bool(statement.value) and value_type(statement.value, concept) == value_type(item.value, concept)
    if same_type and _norm(statement.value) == _norm(item.value):
        return None  # said again
    return update, [item.id] if same_type and value_type(item.value, concept) != "text" else []


def _item_type(item: LedgerItem) -> str:
    concept = item.slot.partition(" ")[0]
    found = value_type(item.value, concept)
    if found in ("text", "polarity") and (typed := typed_value(item.text)):
        return value_type(typed, concept)
    return found


def topic_words(slot: str) -> set[str]:
    """The distinctive topic words of a slot (generic ones and short ones left out)."""
    key, _, topics = slot.partition(" ~ ")
    words = (topics or key).replace("@", " ").split()
    return {w for w in words if w not in GENERIC and len(w) > 2}


def _may_replace(role: str, owner: str) -> bool:
    return role not in ASSISTANT_ROLES or owner in ASSISTANT_ROLES


def _priority(item: LedgerItem) -> tuple[int, int, int, str]:
    kind = LEDGER_KINDS.index(item.kind) if item.kind in LEDGER_KINDS else len(LEDGER_KINDS)
    return (0 if item.state == "pinned" else 1, kind, -item.seq, item.id)


def _source_order(items: Sequence[LedgerItem]) -> list[LedgerItem]:
    return sorted(items, key=lambda item: (item.seq, item.id))


def select(items: Sequence[LedgerItem], room: int, compact: bool = False) -> list[LedgerItem]:
    """The current items whose rendered block fits ``room`` tokens: pinned first, then by kind (rules,
    constraints, preferences, goals, decisions, names), newer before older within a kind; returned in source
    order (seq, then id), so that adding an item only appends to the block."""
    budget = room - tokens.count_text(_block([], compact))
    chosen: list[LedgerItem] = []
    for item in sorted((item for item in items if item.current), key=_priority):
        cost = tokens.count_text(_line(item, compact))  # its line break merges with the line's last token, mostly
        if cost <= budget:
            chosen.append(item)
            budget -= cost
    # Counting lines one by one can differ from counting the block by a token: drop the least important.
    while chosen and tokens.count_text(render(_source_order(chosen), compact)) > room:
        chosen.remove(max(chosen, key=_priority))
    return _source_order(chosen)


def _line(item: LedgerItem, compact: bool = False) -> str:
    text = neutralise_cached(" ".join(item.text.split()))
    role = item.role if _ROLE.fullmatch(item.role) else "unknown"
    if compact:  # a small window: the words only, without a kind label (an agent's item still says who set it)
        text = _KIND_PREFIX.sub("", text, count=1) or text
        return f"- {text}" if role in LIFTERS else f"- ({role}) {text}"
    label = item.kind if role == "user" else f"{item.kind}, {role}"
    return f"- [{label}] {text} (msg_{item.message_id})"


def _block(lines: Sequence[str], compact: bool = False) -> str:
    return "\n".join([OPEN_TAG, COMPACT_INTRO if compact else INTRO, *lines, CLOSE_TAG])


def render(items: Sequence[LedgerItem], compact: bool = False) -> str:
    """The block the model sees, one line per item in the order given ('' when there is none): each item's
    text neutralised (cached: the block is rendered again on every request), so it can neither close the
    block nor forge one of the proxy's tags. ``compact`` (small windows): a short header, and each line only the
    words as said, without kind or source."""
    return _block([_line(item, compact) for item in items], compact) if items else ""
