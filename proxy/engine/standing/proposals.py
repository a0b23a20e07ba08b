"""Standing instructions proposed by the summary model, kept only where the user's own words bear them out.

The summary model reads every message whose items the block will show, at the moment they leave the raw
view (the leaf pass). It is asked, at no extra call, to list after its notes the standing instructions it
found, in any language it reads: the kind, the exact words, and the earlier instruction each one changes or
lifts (``PROMPT``). A model's word is not evidence, so a proposal is kept only when (``accept``):

* its quote is verbatim (whitespace, case and typographic quotes aside) in the *own prose* of a message of the
  run from the user or the instructions (``speech.own_prose``): never from a tool, an assistant turn, code, or
  text the user quoted or pasted;
* the sentence around it is the speaker's own standing word (``speech.not_own``: no reported speech,
  hypothetical, hedge or log line) and no instruction override;
* what it changes or lifts is a current item said before it (named by its id, or by its words).

The deterministic reader stays: a weak or failing summariser adds nothing and takes nothing away.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.dialects import Dialect
from proxy.engine.facts import sentences
from proxy.engine.injection import is_instruction_override
from proxy.engine.neutralise import defang_markers
from proxy.engine.standing.ledger import FAMILY, LIFTERS, Statement
from proxy.engine.standing.lexicon import content_words
from proxy.engine.standing.slots import classify
from proxy.engine.standing.speech import normalise, not_own, own_prose
from proxy.redaction import redact_secrets
from proxy.store.records import LEDGER_KINDS, LedgerItem
from proxy.types import Message

HEADER = "STANDING:"
PROMPT = (
    "Then write a line '" + HEADER + "' and under it each instruction the USER set to hold from now on (a rule, a "
    "limit, a preference, a goal, a decision, a name), one per line as: kind | the user's exact words | the "
    "id of the earlier instruction it changes or lifts, if any. Write '" + HEADER + " none' if there is none."
)
MAX_PROPOSALS = 24  # per leaf pass: a model that lists everything it read is not reading for instructions
MIN_QUOTE, MAX_QUOTE = 8, 400
_KINDS = {
    "rule": "rule", "order": "rule", "instruction": "rule", "policy": "rule", "constraint": "constraint",
    "limit": "constraint", "deadline": "constraint", "budget": "constraint", "requirement": "constraint",
    "preference": "preference", "style": "preference", "goal": "goal", "task": "goal", "status": "goal",
    "plan": "goal", "decision": "decision", "choice": "decision", "name": "name", "identifier": "name",
}  # fmt: skip
_LINE = re.compile(r"^\s*(?:[-*•]|\d+[.)])?\s*\[?(?P<kind>[A-Za-z]{3,12})\]?\s*[|:]\s*(?P<rest>.+)$")
_ID = re.compile(r"\bled_[0-9a-f]{16}\b")
_LIFT_WORD = re.compile(r"\b(?:lifts?|lifted|revokes?|revoked|cancels?|removes?|drops?)\b", re.I)


@dataclass(frozen=True)
class Plan:
    """One accepted proposal: the statement to record at ``seq`` by ``role``, the ids of the items it replaces
    or lifts, and ``existing``: the id of an item that already holds it (then only its changes are applied)."""

    seq: int
    role: str
    statement: Statement
    changes: tuple[str, ...] = ()
    existing: str | None = None


SO_FAR = 20  # the newest current items shown to the summariser, so that it can say which one a statement changes


def standing_so_far(items: Sequence[LedgerItem]) -> str:
    """The current items as the summariser sees them before the material (id and words, neutralised), so that
    it can name what a new statement changes or lifts; '' when there are none."""
    current = [item for item in items if item.current][-SO_FAR:]
    if not current:
        return ""
    lines = [f"{item.id} | {item.kind} | {defang_markers(' '.join(item.text.split()))}" for item in current]
    return "<standing_so_far>\n" + "\n".join(lines) + "\n</standing_so_far>\n\n"


def split(answer: str) -> tuple[str, str]:
    """(the notes, the standing section) of a summariser's answer; the section is '' when it wrote none."""
    index = answer.find(HEADER)
    if index < 0:
        return answer, ""
    return answer[:index].rstrip(), answer[index + len(HEADER) :].strip()


def parse(section: str) -> list[dict[str, Any]]:
    """The proposals of a standing section: ``{"kind", "quote", "changes", "lifts"}`` per line it can read."""
    out: list[dict[str, Any]] = []
    for line in section.splitlines()[: MAX_PROPOSALS * 2]:
        match = _LINE.match(line)
        if not match:
            continue
        parts = [p.strip().strip("\"'“”„«»") for p in match.group("rest").split("|")]
        if not parts[0]:
            continue
        link = " ".join(parts[1:])
        target = _ID.search(link)
        out.append({
            "kind": match.group("kind").lower(), "quote": parts[0], "changes": target.group(0) if target else None,
            "lifts": bool(target and _LIFT_WORD.search(link)),
        })  # fmt: skip
        if len(out) >= MAX_PROPOSALS:
            break
    return out


def _fold(text: str) -> str:
    return " ".join(normalise(text).casefold().split())


def accept(
    offered: Sequence[Mapping[str, Any]], messages: Mapping[int, Message], items: Sequence[LedgerItem],
    dialect: Dialect | None = None,
) -> list[Plan]:  # fmt: skip
    """The proposals for the messages ``messages`` (by seq) that their own words bear out, as plans."""
    from proxy.dialects.chat import CHAT

    dialect = dialect or CHAT
    prose: dict[int, tuple[str, str, str]] = {}  # seq -> (role, own prose, folded)
    for seq, message in sorted(messages.items()):
        role = dialect.role(message)
        if role in LIFTERS:
            text = own_prose(redact_secrets(dialect.text(message)[:20_000]))
            prose[seq] = (role, text, _fold(text))
    plans: list[Plan] = []
    for proposal in list(offered)[:MAX_PROPOSALS]:
        plan = _accept_one(proposal, prose, items)
        if plan is not None and not any(p.statement.text == plan.statement.text for p in plans):
            plans.append(plan)
    return plans


def _accept_one(
    proposal: Mapping[str, Any], prose: Mapping[int, tuple[str, str, str]], items: Sequence[LedgerItem]
) -> Plan | None:
    kind = _KINDS.get(str(proposal.get("kind") or "").lower())
    quote = str(proposal.get("quote") or "").strip()
    if kind is None or not MIN_QUOTE <= len(quote) <= MAX_QUOTE:
        return None
    folded = _fold(quote)
    for seq, (role, text, folded_text) in prose.items():
        if folded not in folded_text:
            continue
        sentence = _sentence_of(text, folded) or quote
        if not_own(sentence) or is_instruction_override(sentence):
            return None
        statement = _statement(kind, sentence)
        changes = _target(proposal, seq, items)
        existing = next((i.id for i in items if i.seq == seq and i.current and _fold(i.text) == _fold(sentence)), None)
        if proposal.get("lifts") and changes:
            statement = Statement(statement.kind, statement.slot, "lifted", statement.text)
        return Plan(seq, role, statement, changes, existing)
    return None


def _sentence_of(text: str, folded_quote: str) -> str | None:
    for sentence in sentences(text):
        folded = _fold(sentence)
        if folded_quote in folded or (len(folded) >= MIN_QUOTE and folded in folded_quote):
            return sentence
    return None


def _statement(kind: str, sentence: str) -> Statement:
    """The statement of ``sentence``: the deterministic reader's slot and value when it reads it as the same
    kind family, else the sentence's own content words and the sentence as its value."""
    found = classify(normalise(sentence), LEDGER_KINDS)
    if found is not None and FAMILY.get(found[0]) == FAMILY.get(kind):
        return Statement(found[0], found[1], found[2], sentence)
    return Statement(kind, content_words(sentence) or "said", sentence[:120], sentence)


def _target(proposal: Mapping[str, Any], seq: int, items: Sequence[LedgerItem]) -> tuple[str, ...]:
    """The current item said before ``seq`` that the proposal names as what it changes (by id or words)."""
    named = proposal.get("changes")
    if not named:
        return ()
    named = str(named)
    for item in reversed(items):
        if item.current and item.seq < seq and (item.id == named or _fold(item.text) == _fold(named)):
            return (item.id,)
    folded = _fold(named)
    for item in reversed(items):
        if item.current and item.seq < seq and len(folded) >= MIN_QUOTE and folded in _fold(item.text):
            return (item.id,)
    return ()
