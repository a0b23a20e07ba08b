"""The ledger of standing instructions at work: kept current at ingest, forwarded once compaction started.

``proxy.engine.standing.ledger`` finds the statements and decides what they replace; this module is where the engine
meets the store and the assembled request:

* **at ingest** (``said`` outside the write lock, ``record`` inside the transaction that appends the
  messages): each new message's statements become items, and the items they update are marked superseded
  by the seq of that message (a fork made before it keeps them current);
* **at assembly** (``Standing``): the current items whose message is no longer forwarded raw, within the
  ledger's share of the budget, as one block right after the instructions. The block changes only when what
  is forwarded raw changes (a compaction, an eviction) or when a new statement supersedes one of its items:
  between those moments it is byte-identical (prompt caches).
* A superseded item's words must not come back through older material: in the summaries and the recall
  excerpts that are forwarded, its sentence and a distinctive value ("$800", "metric units") are replaced by
  a marker (``mask``). A deterministic function of stored data, so it too changes only at those moments.
"""

from __future__ import annotations

import asyncio
import functools
import re
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from proxy import tokens
from proxy.dialects import Dialect
from proxy.engine.render import strip_reasoning
from proxy.engine.standing import ledger
from proxy.engine.standing.ledger import Statement
from proxy.engine.standing.proposals import Plan
from proxy.store.base import Reads, Writes
from proxy.store.records import LedgerItem, SummaryRecord
from proxy.types import Message

OFF_LOOP_CHARS = 4000  # a message's text beyond which extraction runs in a worker thread
MARKER = "[superseded]"
MAX_MASKED = 200  # newest superseded items masked in older material (each adds one pattern)
POLARITIES = frozenset({"never", "always", "allowed", "not required"})  # a rule's value: too common to mask

Said = list[tuple[str, list[Statement]]]  # per new message: (role, its statements)


def new_item_id() -> str:
    return "led_" + secrets.token_hex(8)


async def said(dialect: Dialect, message: Message) -> tuple[str, list[Statement]]:
    """(role, statements) of one incoming message; extraction in a worker thread when its text is long."""
    role = dialect.role(message)
    text = ""
    if role in ledger.SETTERS:
        text = strip_reasoning(dialect.text(message))
    elif message.get("role") == "user" and isinstance(message.get("content"), list):
        # A user message that carries tool results (the Messages format) may also carry the user's own words.
        role, text = "user", "\n".join(_typed_text(message["content"]))
    if not text:
        return role, []
    if len(text) > OFF_LOOP_CHARS:
        return role, await asyncio.to_thread(ledger.extract, text, role)
    return role, ledger.extract(text, role)


def read_statements(message: Message, dialect: Dialect | None = None) -> tuple[str, list[Statement]]:
    """(role, statements) of one message, read on the calling thread (``said`` is its ingest form)."""
    from proxy.dialects.chat import CHAT

    dialect = dialect or CHAT
    role = dialect.role(message)
    text = ""
    if role in ledger.SETTERS:
        text = strip_reasoning(dialect.text(message))
    elif message.get("role") == "user" and isinstance(message.get("content"), list):
        role, text = "user", "\n".join(_typed_text(message["content"]))
    return role, ledger.extract(text, role) if text else []


async def record(tx: Writes, conversation_id: str, start: int, new: Said) -> int:
    """Store the statements of the messages just appended at seqs ``start``…: new items, and the current
    items each one supersedes (a pinned item's pin passes to its update). Returns the items added."""
    if not any(statements for _, statements in new):
        return 0
    current = await tx.ledger(conversation_id)
    added = 0
    now = time.time()
    for offset, (role, statements) in enumerate(new):
        if not statements:
            continue
        seq = start + offset
        rows = await tx.messages(conversation_id, seq, seq + 1)
        message_id = rows[0].id if rows else 0
        for statement, superseded in ledger.reconcile(current, statements, role):
            pinned = any(item.id in superseded and item.state == "pinned" for item in current)
            item = LedgerItem(
                id=new_item_id(), conversation_id=conversation_id, kind=statement.kind, slot=statement.slot,
                value=statement.value, text=statement.text, seq=seq, message_id=message_id, role=role,
                created_at=now, state="pinned" if pinned else "active",
            )  # fmt: skip
            await tx.add_ledger_items([item])
            if superseded:
                await tx.supersede_ledger_items(superseded, item.id, seq)
            current = [
                replace(c, superseded_seq=seq, superseded_by=item.id) if c.id in superseded else c for c in current
            ]
            current.append(item)
            added += 1
    return added


async def record_proposed(tx: Writes, conversation_id: str, plans: Sequence[Plan]) -> int:
    """Store what the summariser read and the proxy verified (``proposals.accept``), in the transaction that
    swaps its summary in: new items, the items each one replaces or lifts (only those still current and said
    before it), and for a statement the ledger already holds, only what it changes. Returns the items added."""
    if not plans:
        return 0
    current = await tx.ledger(conversation_id)
    added = 0
    for plan in plans:
        live = {item.id: item for item in current if item.current}
        named = [i for i in plan.changes if i in live and live[i].seq < plan.seq and i != plan.existing]
        if plan.existing is not None:
            if named and plan.existing in live:
                await tx.supersede_ledger_items(named, plan.existing, plan.seq)
                current = _superseded(current, named, plan.existing, plan.seq)
            continue
        rows = await tx.messages(conversation_id, plan.seq, plan.seq + 1)
        for statement, superseded in ledger.reconcile(current, [plan.statement], plan.role):
            ids = [*superseded, *(i for i in named if i not in superseded)]
            item = LedgerItem(
                id=new_item_id(), conversation_id=conversation_id, kind=statement.kind, slot=statement.slot,
                value=statement.value, text=statement.text, seq=plan.seq, message_id=rows[0].id if rows else 0,
                role=plan.role, created_at=time.time(),
            )  # fmt: skip
            await tx.add_ledger_items([item])
            if ids:
                await tx.supersede_ledger_items(ids, item.id, plan.seq)
            current = [*_superseded(current, ids, item.id, plan.seq), item]
            added += 1
    return added


def _superseded(items: list[LedgerItem], ids: Sequence[str], by: str, seq: int) -> list[LedgerItem]:
    return [replace(i, superseded_seq=seq, superseded_by=by) if i.id in ids else i for i in items]


@dataclass(frozen=True)
class Standing:
    """A conversation's ledger as one request sees it: its items, and the pattern of what went stale."""

    items: list[LedgerItem]
    stale: re.Pattern[str] | None

    @classmethod
    async def read(cls, q: Reads, conversation_id: str) -> Standing:
        return cls.of(await q.ledger(conversation_id, include_superseded=True))

    @classmethod
    def of(cls, items: list[LedgerItem]) -> Standing:
        return cls(items, stale_pattern(items))

    def reserve(self, room: int) -> int:
        """Tokens to keep for the block: what all current items take within ``room`` (those still forwarded
        raw too, so that the reserve does not change when a compaction hides them, only when items do)."""
        return tokens.count_text(ledger.render(ledger.select(self.items, room))) + 2 if self.items else 0

    def block(self, first_raw: int, room: int) -> tuple[str, tuple[str, ...]]:
        """(the block, the ids of its items): the current items set in messages before ``first_raw`` (those
        after it are forwarded raw, in the user's own words) that fit ``room`` tokens."""
        hidden = [item for item in self.items if item.current and item.seq < first_raw]
        chosen = ledger.select(hidden, room)
        return ledger.render(chosen), tuple(item.id for item in chosen)

    def mask(self, text: str) -> str:
        """``text`` with superseded items' sentences and distinctive values replaced by ``MARKER`` (cached: a
        summary is masked once per set of stale items, not on every request)."""
        return _masked(self.stale, text) if self.stale is not None and text else text

    def mask_recalled(self, block: str) -> str:
        """A recall block with its excerpts masked (its header and closing tag are the proxy's own words)."""
        if self.stale is None:
            return block
        head, _, rest = block.partition("\n")
        intro, _, rest = rest.partition("\n")
        body, _, footer = rest.rpartition("\n")
        return "\n".join([head, intro, self.mask(body), footer])

    def masked_summaries(self, summaries: Sequence[SummaryRecord]) -> list[SummaryRecord]:
        out = []
        for summary in summaries:
            content = self.mask(summary.content)
            out.append(summary if content == summary.content else replace(summary, content=content))
        return out


def stale_pattern(items: Sequence[LedgerItem]) -> re.Pattern[str] | None:
    """What of the superseded items must not come back: each one's sentence, and its value where that is
    distinctive and no current item holds it. Linear: one alternation of escaped literals."""
    current_values = {_fold(item.value) for item in items if item.current}
    current_texts = {_fold(item.text) for item in items if item.current}
    phrases: set[str] = set()
    stale = [item for item in items if item.superseded_seq is not None]
    for item in stale[-MAX_MASKED:]:
        text = " ".join(item.text.split())
        if _fold(text) not in current_texts:  # "never push to main", lifted, then set again: in force
            phrases.add(text)
        value = " ".join(item.value.split())
        if _distinctive(value) and _fold(value) not in current_values:
            phrases.add(value)
    if not phrases:
        return None
    alternatives = "|".join(re.escape(p) for p in sorted(phrases, key=len, reverse=True))
    return re.compile(rf"(?<![\w$€£]){alternatives}(?!\w)", re.I)


def _typed_text(parts: list[object]) -> list[str]:
    """The text parts of a content list (not the tool results among them)."""
    out = []
    for part in parts:
        if isinstance(part, dict) and part.get("type") in ("text", "input_text") and isinstance(part.get("text"), str):
            out.append(part["text"])
    return out


def _fold(value: str) -> str:
    return " ".join(value.casefold().split())


def _distinctive(value: str) -> bool:
    """Whether a value can be masked wherever it occurs: a figure, an amount, a date or an identifier ("$800",
    "Python 3.9", "orders-stg-2"), not words any text may hold ("German", "the user", "ship the release")."""
    return _fold(value) not in POLARITIES and len(value) >= 2 and _DISTINCTIVE.search(value) is not None


_DISTINCTIVE = re.compile(r"\d|[$€£¥]|\w[-_./:]\w|[a-z][A-Z]")


@functools.lru_cache(maxsize=4096)
def _masked(pattern: re.Pattern[str], text: str) -> str:
    return pattern.sub(MARKER, text)
