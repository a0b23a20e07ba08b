"""The ledger of standing instructions at work: kept current at ingest, forwarded once compaction started.

``proxy.engine.standing.ledger`` finds the statements and decides what they replace; this module is where the engine
meets the store and the assembled request:

* **at ingest**: each new message's statements become items, and the items they update are marked superseded
  by the seq of that message (a fork made before it keeps them current). The work is off the event loop and
  out of the write transaction: ``said_all`` reads a request's messages in one worker thread call, ``plan``
  reconciles them (in a worker thread, against the open items as read before the transaction, one index of
  them by topic, within the caps), and the transaction that appends the messages only writes the plan
  (``apply``), or finds that the ledger moved meanwhile and sends it back to be planned again;
* **at assembly** (``Standing``): the current items whose message is no longer forwarded raw, within the
  ledger's share of the budget, as one block right after the instructions. The block changes only when what
  is forwarded raw changes (a compaction, an eviction) or when a new statement supersedes one of its items:
  between those moments it is byte-identical (prompt caches).
* A superseded item's words must not come back through older material: in the summaries and the recall
  excerpts that are forwarded, its sentence, and its value where it was replaced and the sentence names what
  it was about, are replaced by a marker (``mask``, ``proxy.engine.standing.masking``). A deterministic
  function of stored data, so it too changes only at those moments.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from proxy import tokens
from proxy.dialects import CHAT, Dialect
from proxy.engine.render import strip_reasoning
from proxy.engine.standing import languages, ledger
from proxy.engine.standing.index import Index
from proxy.engine.standing.ledger import Statement
from proxy.engine.standing.masking import MAX_MASKED, Stale, stale_of
from proxy.engine.standing.proposals import Plan as Proposal
from proxy.store.base import Reads, Writes
from proxy.store.ledger import forked
from proxy.store.records import LedgerItem, SummaryRecord
from proxy.types import Message

# The caps keep a request's work and the ledger bounded, and never cost the promise that a replaced value is not
# shown as current: an update (a statement that supersedes an open item) is always written, whatever the
# counts, and only statements that would add a *new* item are left out, which is silence, never a stale value.
# An update takes the place of what it replaces, so the count of open items never grows past the cap.
# * Per message, the first MAX_NEW_PER_MESSAGE new items: people set standing instructions one or two at a
#   time (the benchmark scripts plant at most two per message); a message that sets dozens is a pasted
#   document or a probe, and its first ones are those its writer put first. (The last ones cannot be chosen
#   instead: which statement updates which is known only in order.)
# * Per conversation, no new item once MAX_OPEN_ITEMS items are open (current or dropped, not superseded):
#   the ledger block could not show more (its share of the budget is at most 2,000 tokens), and the open items
#   are what every later statement is compared with. Updates keep the count, so they go on being written.
MAX_NEW_PER_MESSAGE = 8
MAX_OPEN_ITEMS = 300
OFF_LOOP_WRITES = 256  # new items beyond which their rows are built in a worker thread
WRITE_CHUNK = 1000  # rows per insert (the loop runs between two)
OFF_LOOP_ITEMS = 64  # items read for a request beyond which ``Standing.of`` runs in a worker thread

Said = list[tuple[str, list[Statement]]]  # per new message: (role, its statements)
Signature = tuple[int, str, str, str, str, str, str]  # what a plan reads of an open item: all but its ids


def new_item_id() -> str:
    return "led_" + secrets.token_hex(8)


def spoken_text(message: Message, dialect: Dialect = CHAT) -> tuple[str, str]:
    """(role, text) of one message as the ledger reads it: the text of a message whose role may set items
    (``ledger.SETTERS``), reasoning stripped; for the others, an empty text."""
    role = dialect.role(message)
    text = ""
    if role in ledger.SETTERS:
        text = strip_reasoning(dialect.text(message))
    elif message.get("role") == "user" and isinstance(message.get("content"), list):
        # A user message that carries tool results (the Messages format) may also carry the user's own words.
        role, text = "user", "\n".join(_typed_text(message["content"]))
    return role, text


def read_statements(message: Message, dialect: Dialect = CHAT) -> tuple[str, list[Statement]]:
    """(role, statements) of one message, read on the calling thread (``said`` reads a request's off the loop)."""
    role, statements, _ = heard(message, dialect)
    return role, statements


class Heard(NamedTuple):
    """One message as ingest reads it: who said it, its statements, and, when the deterministic reader took
    none from a user or system message, the language it is in if that is one the reader does not read."""

    role: str
    statements: list[Statement]
    unread: str | None


def heard(message: Message, dialect: Dialect = CHAT) -> Heard:
    """Who said ``message``, the statements the deterministic reader takes from it (``ledger.extract`` reads
    only its sentences in a language it reads), and, when it took none from a user or system message, the
    language that message is in if the reader does not read it (``languages.spoken``; ~0.1-1.6 ms a message)."""
    role, text = spoken_text(message, dialect)
    statements = ledger.extract(text, role) if text else []
    language = None if statements or role not in languages.SPEAKERS else languages.spoken(role, text)
    return Heard(role, statements, language if languages.unread(language) else None)


async def said_all(dialect: Dialect, messages: Sequence[Message]) -> list[Heard]:
    """What each of a request's new ``messages`` says (``heard``), all read in one worker thread call:
    extraction costs about half a millisecond a sentence, and one request may bring thousands of messages."""
    if not messages:
        return []
    return await asyncio.to_thread(lambda: [heard(message, dialect) for message in messages])


async def said(dialect: Dialect, message: Message) -> tuple[str, list[Statement]]:
    """(role, statements) of one message, read in a worker thread."""
    role, statements, _ = (await said_all(dialect, [message]))[0]
    return role, statements


@dataclass(frozen=True)
class Write:
    """One item a plan adds, stated by the message ``offset`` places after the plan's start."""

    offset: int
    role: str
    statement: Statement
    state: str  # "pinned" when it replaces a pinned item (the pin passes to the update), else "active"
    replaces: tuple[int, ...]  # the items it supersedes: positions in the plan's basis
    replaced: tuple[int, int] | None = None  # (offset, write) of a later statement of the request superseding it


@dataclass(frozen=True)
class Plan:
    """What a request's statements change in a ledger whose open items were ``basis``: computed off the loop
    and before the write transaction (``plan``), written inside it (``apply``)."""

    start: int  # seq of the first message the statements come from
    count: int  # of messages, from ``start`` on
    basis: tuple[Signature, ...]  # the open items it was computed from, sorted
    writes: tuple[Write, ...]
    stated: bool  # whether the messages said anything at all (if not, there is nothing to check or write)
    left_out: int = 0  # statements the caps left out


def signature(item: LedgerItem) -> Signature:
    return (item.seq, item.kind, item.slot, item.value, item.text, item.role, item.state)


def plan(basis: Sequence[LedgerItem], start: int, new: Said, *, exhaustive: bool = False) -> Plan:
    """The plan of the statements ``new`` of the messages from seq ``start`` on, against the open items
    ``basis``: message by message, ``ledger.reconcile`` with one index of the open items kept up to date (each
    statement meets only the items that share a topic key with it; ``exhaustive``: every item, the all-pairs
    comparison), then the caps. CPU work with no I/O: run it in a worker thread (``plan_off_loop``)."""
    ordered = sorted((item for item in basis if item.superseded_seq is None), key=signature)
    index = Index(ordered, exhaustive=exhaustive)
    basis_at = {item.id: p for p, item in enumerate(ordered)}
    position = dict(basis_at)  # id -> position in the index (new items: "new:<write>")
    state = {item.id: item.state for item in ordered}
    writes: list[Write] = []
    left_out = 0
    for offset, (role, statements) in enumerate(new):
        fresh = 0
        for statement, superseded in ledger.reconcile((), statements, role, index=index) if statements else ():
            # An update replaces an item still open; one whose items an earlier statement of the message
            # replaced already (two may replace one item without replacing each other) would grow the ledger.
            if not any(item_id in position for item_id in superseded):
                if fresh >= MAX_NEW_PER_MESSAGE or len(index) >= MAX_OPEN_ITEMS:
                    left_out += 1
                    continue
                fresh += 1
            k = len(writes)
            for item_id in superseded:  # (two statements of one message may both replace an item: the later wins)
                if item_id in position:
                    index.remove(position.pop(item_id))
                if item_id not in basis_at:  # an item this request added for an earlier message
                    earlier = int(item_id.removeprefix("new:"))
                    writes[earlier] = replace(writes[earlier], replaced=(offset, k))
            pinned = any(state[item_id] == "pinned" for item_id in superseded)
            write = Write(offset, role, statement, "pinned" if pinned else "active",
                          tuple(sorted(basis_at[i] for i in superseded if i in basis_at)))  # fmt: skip
            writes.append(write)
            item_id = f"new:{k}"
            state[item_id] = write.state
            position[item_id] = index.add(_item(item_id, start, write))
    stated = any(statements for _, statements in new)
    return Plan(start, len(new), tuple(map(signature, ordered)), tuple(writes), stated, left_out)


async def plan_off_loop(basis: Sequence[LedgerItem], start: int, new: Said) -> Plan:
    """``plan`` in a worker thread (nothing to do on the loop when nothing was said)."""
    if not any(statements for _, statements in new):
        return Plan(start, len(new), (), (), stated=False)
    return await asyncio.to_thread(plan, basis, start, new)


def forked_basis(items: Sequence[LedgerItem], count: int) -> list[LedgerItem]:
    """The open items a fork of a conversation with ``items`` (superseded ones included) made at ``count``
    will hold: ``proxy.store.ledger.forked``'s copies (their ids aside, which a plan does not read)."""
    rows = forked(items, "", {item.seq: item.message_id for item in items}, count)
    return [item for item in (LedgerItem(*row) for row in rows) if item.superseded_seq is None]


class LedgerMoved(Exception):
    """The conversation's open items (or where its new messages start) are not those a plan was computed from:
    another request wrote meanwhile. Plan again from ``items`` and ``start``, what the transaction saw."""

    def __init__(self, items: list[LedgerItem], start: int) -> None:
        super().__init__("the ledger changed since the plan was made")
        self.items = items
        self.start = start


async def apply(tx: Writes, conversation_id: str, start: int, plan: Plan) -> int:
    """Write ``plan`` in the transaction that appended its messages at seqs ``start``…: its items, and the
    items each supersedes. Raises ``LedgerMoved`` (the caller rolls back, plans again off the loop and
    retries) when the open items are not the plan's basis. The work: one read of the open items (which the
    cap bounds; an index of their own), the rows built (in a worker thread when there are many), inserted in
    chunks, and one batched update of the items they replace. Returns the items added."""
    if not plan.stated:
        return 0
    items = await tx.ledger(conversation_id)
    ordered = sorted(items, key=signature)
    if plan.start != start or tuple(map(signature, ordered)) != plan.basis:
        raise LedgerMoved(items, start)
    if not plan.writes:
        return 0
    offsets = [write.offset for write in plan.writes]
    message_ids = await tx.message_ids(conversation_id, start + min(offsets), start + max(offsets) + 1)
    build = functools.partial(_rows, plan, conversation_id, message_ids, [item.id for item in ordered])
    rows, supersessions = await asyncio.to_thread(build) if len(plan.writes) > OFF_LOOP_WRITES else build()
    for chunk in range(0, len(rows), WRITE_CHUNK):
        await tx.add_ledger_items(rows[chunk : chunk + WRITE_CHUNK])
    if supersessions:
        await tx.supersede_ledger_batch(
            [(item_id, by, seq) for by, seq, replaced in supersessions for item_id in replaced]
        )
    return len(rows)


def _rows(
    plan: Plan, conversation_id: str, message_ids: dict[int, int], basis_ids: list[str]
) -> tuple[list[LedgerItem], list[tuple[str, int, list[str]]]]:
    """The plan's new items as rows, and (by, seq, ids) of the open items they replace. Of two items of one
    message that replace the same one, the later is its ``superseded_by`` (as when each was written in turn)."""
    ids = [new_item_id() for _ in plan.writes]
    now = time.time()
    rows = []
    last: dict[int, int] = {}  # basis position -> the write that replaces it last
    for k, write in enumerate(plan.writes):
        s, seq, replaced = write.statement, plan.start + write.offset, write.replaced
        rows.append(LedgerItem(
            ids[k], conversation_id, s.kind, s.slot, s.value, s.text, seq, message_ids.get(seq, 0), write.role, now,
            None if replaced is None else plan.start + replaced[0], None if replaced is None else ids[replaced[1]],
            write.state,
        ))  # fmt: skip
        for p in write.replaces:
            last[p] = k
    grouped: dict[int, list[str]] = {}
    for p, k in sorted(last.items()):
        grouped.setdefault(k, []).append(basis_ids[p])
    return rows, [(ids[k], plan.start + plan.writes[k].offset, grouped[k]) for k in sorted(grouped)]


def _item(item_id: str, start: int, write: Write) -> LedgerItem:
    s = write.statement
    return LedgerItem(item_id, "", s.kind, s.slot, s.value, s.text, start + write.offset, 0, write.role, 0.0,
                      state=write.state)  # fmt: skip


async def record_proposed(tx: Writes, conversation_id: str, plans: Sequence[Proposal]) -> int:
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
    stale: Stale | None

    @classmethod
    async def read(cls, q: Reads, conversation_id: str) -> Standing:
        """The open items and the newest replaced ones (those ``masking.stale_of`` masks): replaced items pile up
        as a conversation goes on, and this is read on every request."""
        items = await q.ledger(conversation_id, include_superseded=True, newest_superseded=MAX_MASKED)
        if len(items) > OFF_LOOP_ITEMS:  # the pattern of many stale items takes a while to compile
            return await asyncio.to_thread(cls.of, items)
        return cls.of(items)

    @classmethod
    def of(cls, items: list[LedgerItem]) -> Standing:
        return cls(items, stale_of(items))

    def reserve(self, room: int, compact: bool = False) -> int:
        """Tokens to keep for the block: what all current items take within ``room`` (those still forwarded
        raw too, so that the reserve does not change when a compaction hides them, only when items do)."""
        if not self.items:
            return 0
        return tokens.count_text(ledger.render(ledger.select(self.items, room, compact), compact)) + 2

    def block(self, first_raw: int, room: int, compact: bool = False) -> tuple[str, tuple[str, ...]]:
        """(the block, the ids of its items): the current items set in messages before ``first_raw`` (those
        after it are forwarded raw, in the user's own words) that fit ``room`` tokens; ``compact`` in small
        windows (``ledger.render``)."""
        hidden = [item for item in self.items if item.current and item.seq < first_raw]
        chosen = ledger.select(hidden, room, compact)
        return ledger.render(chosen, compact), tuple(item.id for item in chosen)

    def mask(self, text: str) -> str:
        """``text`` with superseded items' sentences and distinctive values replaced by ``MARKER`` (cached: a
        summary is masked once per set of stale items, not on every request)."""
        return self.stale.mask(text) if self.stale is not None and text else text

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


def _typed_text(parts: list[object]) -> list[str]:
    """The text parts of a content list (not the tool results among them)."""
    out = []
    for part in parts:
        if isinstance(part, dict) and part.get("type") in ("text", "input_text") and isinstance(part.get("text"), str):
            out.append(part["text"])
    return out
