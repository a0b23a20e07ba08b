"""The admin service: what the admin HTTP API (``/lcm/...``, ``proxy.wire.admin``) and the operator's commands
(``proxy.cli.operator``, which formats them for a terminal) both show and do. Plain dicts, ready for JSON.

Every lookup takes the caller's scope (its tenant, or an end user within it); an id of another scope is
indistinguishable from an unknown one. The operator, who sees every tenant, passes None.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import orjson

from proxy import tokens
from proxy.dialects import Dialect, by_name
from proxy.engine.deletion import Deleter, Scrubber
from proxy.engine.engine import ContextEngine, RequestSummarizer
from proxy.engine.errors import InvalidArgument, NotFound
from proxy.engine.ingest import export_conversation
from proxy.engine.plan import view_message
from proxy.engine.recall import RecallTools
from proxy.engine.render import summary_block
from proxy.engine.standing import languages
from proxy.engine.standing.flow import spoken_text
from proxy.store.base import reads_for
from proxy.store.records import LEDGER_STATES, ConversationRecord, LedgerItem, MessageRecord
from proxy.types import Messages

MESSAGES_PAGE = 1000  # messages per page of ``GET /lcm/conversations/{id}/messages`` unless ``limit`` says
MESSAGES_PAGE_MAX = 2000
LANGUAGES_SCANNED = 10_000  # the newest messages whose language the ledger view counts (a few seconds at most)

PROXY_ID = re.compile(r"conv_[0-9a-f]{16}")


def names_by_key(name: str) -> bool:
    """Whether ``name`` may be a client's key rather than the proxy's id. A name shaped like the proxy's ids
    is an id only: another tenant's id answers as an unknown one, even where a client once sent it as its
    own key (then its conversation is reached by its id)."""
    return PROXY_ID.fullmatch(name) is None


def _messages_json(rows: Sequence[MessageRecord]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        message, files = view_message(row, stubbed=False)
        out.append(
            {
                "id": f"msg_{row.id}",
                "seq": row.seq,
                "role": row.role,
                "tokens": row.token_count,
                "files": files,
                "message": message,
            }
        )
    return out


def ledger_json(item: LedgerItem) -> dict[str, Any]:
    """One standing instruction as the API shows it: its message named as ``lcm_describe`` takes it."""
    data = asdict(item)
    data.pop("conversation_id")
    data["message_id"] = f"msg_{item.message_id}"
    return data


def _unread_tally(rows: Sequence[MessageRecord], dialect: Dialect) -> dict[str, int]:
    """Messages of ``rows`` that the deterministic reader does not read, by language (as forwarded: a document
    stored out of line is not the speaker's prose)."""
    return languages.tally(spoken_text(view_message(row, stubbed=False)[0], dialect) for row in rows)


def _conversation_json(c: ConversationRecord) -> dict[str, Any]:
    data = asdict(c)
    data.pop("instructions_json")
    data.pop("tenant")
    data.pop("deleted_at")  # always None here: a deleted conversation is never shown
    return data


class AdminViews:
    def __init__(self, engine: ContextEngine, recall: RecallTools) -> None:
        self.engine = engine
        self.recall = recall
        self.store = engine.store
        self.scrubber = Scrubber(engine.store)  # deletions made here are scrubbed in the background
        self.deleter = Deleter(engine.store, engine.files, self.scrubber)

    async def find(self, scope: str | None, name: str) -> ConversationRecord:
        """The tenant's conversation with this id, else the one its client calls so (the key it sends in
        ``X-LCM-Conversation-Id``): a client knows its own key, not necessarily the proxy's id. With no tenant
        (the operator's view of every tenant), a key several tenants use names none of them."""
        c = await self.store.read.conversation(scope, name)
        if c is None and names_by_key(name):
            if scope is not None:
                by_key = [c] if (c := await self.store.read.conversation_by_key(scope, name)) else []
            else:
                by_key = await self.store.read.conversations_by_key(name)
            if len(by_key) > 1:
                raise InvalidArgument(
                    f"conversation key {name} is used by several tenants: pass --tenant", param="tenant"
                )
            c = by_key[0] if by_key else None
        if c is None:
            raise NotFound(f"no conversation {name}")
        return c

    async def records(self, scope: str | None, limit: int) -> list[ConversationRecord]:
        """The tenant's conversations (None: every tenant's), most recently active first."""
        return await self.store.read.conversations(scope, limit)

    async def conversations(self, scope: str, limit: int) -> dict[str, Any]:
        return {"data": [_conversation_json(c) for c in await self.records(scope, limit)]}

    async def conversation(self, scope: str, conversation_id: str) -> dict[str, Any]:
        c = await self.find(scope, conversation_id)
        context = await self.store.read.context_summaries(c.id)
        return {**_conversation_json(c), "context_summaries": [s.id for s in context]}

    async def messages(
        self, scope: str, conversation_id: str, after: int | None = None, limit: int = MESSAGES_PAGE
    ) -> dict[str, Any]:
        """One page of the conversation's messages: those after seq ``after`` (from the first without it), at
        most ``limit``; ``next`` is the ``after`` of the next page (None: this was the last). Read and built
        off the event loop: a page of large messages is megabytes of JSON."""
        c = await self.find(scope, conversation_id)
        start = 0 if after is None else after + 1
        end = min(c.message_count, start + limit)
        rows = await self.store.search.messages(c.id, start, end) if start < end else []
        out = await asyncio.to_thread(_messages_json, rows)
        return {"data": out, "next": end - 1 if end < c.message_count else None}

    async def context(self, scope: str, conversation_id: str) -> dict[str, Any]:
        """What the last request forwarded (instructions and the auto-recall block excluded), with token counts:
        each summary and raw message marked ``sent`` or not (evicted to fit). Before any assembled request,
        the stored context as the next request would start from."""
        c = await self.find(scope, conversation_id)
        summaries, upto = await self.engine.compactor.view(c, c.message_count)
        recorded = await self.store.read.last_sent(c.id)
        last = orjson.loads(recorded) if recorded else None
        sent_ids = set(last["summaries"]) if last and last["upto"] == upto else {s.id for s in summaries}
        first_raw = last["first_raw"] if last and last["upto"] == upto else upto
        items: list[dict[str, Any]] = [
            {
                "kind": "summary",
                "id": s.id,
                "depth": s.depth,
                "tokens": tokens.count_text(summary_block(s)),
                "sent": s.id in sent_ids,
            }
            for s in summaries
        ]
        costs = await reads_for(self.store, c.message_count - upto).raw_token_counts(
            c.id, upto, c.message_count, c.stubbed_upto
        )
        items += [
            {"kind": "message", "seq": upto + i, "tokens": cost, "sent": upto + i >= first_raw}
            for i, cost in enumerate(costs)
        ]
        return {
            "conversation": c.id,
            "tokens": sum(i["tokens"] for i in items if i["sent"]),
            "stored_tokens": sum(i["tokens"] for i in items),
            "evicted": [i.get("id", i.get("seq")) for i in items if not i["sent"]],
            "items": items,
        }

    async def ledger(
        self,
        scope: str | None,
        conversation_id: str,
        include_superseded: bool = False,
        with_languages: bool = True,
    ) -> dict[str, Any]:
        """The conversation's standing instructions (``proxy.engine.standing.ledger``) with the message each came from, by
        seq: those in force and those the user dropped; ``include_superseded``: also those a later statement
        replaced; ``with_languages``: also which languages its messages are in that the deterministic reader does
        not read (``unread_languages``)."""
        c = await self.find(scope, conversation_id)
        await self.engine.reader.catch_up(c.id, c)  # its messages not read yet, first (``standing.reader``)
        items = await self.store.read.ledger(c.id, include_superseded)
        out: dict[str, Any] = {"object": "list", "data": [ledger_json(i) for i in items]}
        if with_languages:
            out["languages"] = await self.unread_languages(c)
        return out

    async def unread_languages(self, c: ConversationRecord) -> dict[str, Any]:
        """Which languages the conversation's user and system messages are in that the deterministic reader of
        standing instructions does not read (``proxy.engine.standing.languages``), with how many messages each:
        only the summary model's proposals set items from those. Counted now from the newest
        ``LANGUAGES_SCANNED`` stored messages, a page at a time, off the event loop."""
        start = max(0, c.message_count - LANGUAGES_SCANNED)
        dialect = by_name(c.dialect)
        counts: Counter[str] = Counter()
        for page in range(start, c.message_count, MESSAGES_PAGE):
            rows = await self.store.search.messages(c.id, page, min(c.message_count, page + MESSAGES_PAGE))
            counts.update(await asyncio.to_thread(_unread_tally, rows, dialect))
        return {
            "deterministic_reader": sorted(languages.READ),
            "not_read": [
                {"language": language, "messages": n}
                for language, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
            ],
            "scanned_from_seq": start,
            "scanned_messages": c.message_count - start,
        }

    async def set_ledger_state(
        self, scope: str | None, conversation_id: str, item_id: str, state: str
    ) -> dict[str, Any]:
        """The user pins an item (kept first when the ledger must shrink), drops it (never forwarded again) or
        makes it active again; the item as it is now."""
        if state not in LEDGER_STATES:
            raise InvalidArgument(f"'state' must be one of {', '.join(LEDGER_STATES)}", param="state")
        c = await self.find(scope, conversation_id)
        await self.engine.reader.catch_up(c.id, c)  # the item is changed in the ledger as it stands
        async with self.store.write() as tx:
            await tx.lock_conversation(c.id)
            # Read again under the lock: deleted meanwhile, it has no items to change.
            item = await tx.set_ledger_state(c.id, item_id, state) if await tx.conversation(scope, c.id) else None
        if item is None:
            raise NotFound(f"no ledger item {item_id} in conversation {c.id}")
        return ledger_json(item)

    async def summary(self, scope: str, summary_id: str) -> dict[str, Any]:
        summary = await self.store.read.summary(summary_id)
        # A deleted conversation's summaries that live forks still use are theirs to see (``proxy.engine.deletion``).
        owner = await self.store.read.conversation(scope, summary.conversation_id, deleted=True) if summary else None
        if summary is None or owner is None:
            raise NotFound(f"no summary {summary_id}")
        children = await self.store.read.child_summaries(summary.id)
        data = asdict(summary)
        data["file_ids"] = orjson.loads(summary.file_ids) if summary.file_ids else []
        data["children"] = [c.id for c in children]
        return data

    async def file(self, scope: str, file_id: str, start_line: int | None, end_line: int | None) -> dict[str, Any]:
        record = await self.store.read.file(scope, file_id)
        if record is None:
            raise NotFound(f"no file {file_id}")
        text = await self._described((scope, record.conversation_id or ""), file_id, start_line, end_line)
        data = asdict(record)
        data.pop("path")  # where it lives on disk is the operator's business, not the API's
        data.pop("tenant")
        return {**data, "described": text}

    async def describe(self, scope: str | None, item_id: str, start_line: int | None, end_line: int | None) -> str:
        """``lcm_describe`` of a summary, file or message, in the scope of the conversation (or tenant) that
        owns it."""
        q = self.store.read
        owner: tuple[str, str] | None = None  # (tenant, conversation)
        if item_id.startswith("sum_"):
            summary = await q.summary(item_id)
            # A deleted conversation kept for its forks owns what they share: the scope walks it as theirs do.
            conversation = await q.conversation(scope, summary.conversation_id, deleted=True) if summary else None
            owner = (conversation.tenant, conversation.id) if conversation else None
        elif item_id.startswith("file_"):
            owner = await q.file_owner(scope, item_id)
        elif item_id.startswith("msg_") and item_id[4:].isdigit():
            rows = await q.messages_by_id([int(item_id[4:])])
            conversation = await q.conversation(scope, rows[0].conversation_id, deleted=True) if rows else None
            owner = (conversation.tenant, conversation.id) if conversation else None
        if owner is None:
            raise NotFound(f"no summary, file or message {item_id}")
        return await self._described(owner, item_id, start_line, end_line)

    async def _described(
        self, owner: tuple[str, str], item_id: str, start_line: int | None, end_line: int | None
    ) -> str:
        scope = await self.recall.scope(*owner)
        args = {"id": item_id, "start_line": start_line, "end_line": end_line, "max_bytes": 200000}
        return await self.recall.run(
            scope, "lcm_describe", orjson.dumps({k: v for k, v in args.items() if v is not None}).decode()
        )

    async def grep(
        self, scope: str | None, conversation_id: str, pattern: str, mode: str, limit: int
    ) -> dict[str, Any]:
        c = await self.find(scope, conversation_id)
        sees = await self.recall.scope(c.tenant, c.id)
        # Not through ``run``: a bad pattern or mode is the caller's error (RecallError), not text for a model.
        result = await self.recall.grep(sees, {"pattern": pattern, "mode": mode, "limit": limit})
        return {"conversation": c.id, "result": result}

    async def compact(
        self, scope: str | None, conversation_id: str, summarizer: RequestSummarizer | None
    ) -> dict[str, Any]:
        c = await self.find(scope, conversation_id)
        report = await self.engine.compact(c.id, summarizer)  # after a running sweep of it, never beside it
        return {"conversation": c.id, **asdict(report)}

    async def export(self, scope: str | None, conversation_id: str) -> Messages:
        """The transcript exactly as the client last sent it, stored files restored."""
        c = await self.find(scope, conversation_id)
        return await export_conversation(self.store, self.engine.files, scope, c.id)

    async def delete(self, scope: str, conversation_id: str) -> dict[str, Any]:
        """Delete the tenant's conversation (by id or by its client's key): ``proxy.engine.deletion``."""
        c = await self.find(scope, conversation_id)
        return (await self.deleter.delete(scope, c.id, via="api")).as_json()

    def scrub(self, scope: str) -> dict[str, Any]:
        """Whether the scrub of the tenant's deletions made through this process is done (``Scrubber``)."""
        return self.scrubber.status(scope)
