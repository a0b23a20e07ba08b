"""The SQLite store's long-running queries (``Searches``): FTS5 full-text search, the rows a regular-expression
scan reads, and the doctor's walk. They run on the store's search connection, an aiosqlite reader in its own
thread, never on the event loop."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.scopes import end_users_of
from proxy.store.base import Bounds, Hit, Phrase
from proxy.store.records import ConversationRecord, SummaryRecord
from proxy.store.sqlite.reads import CONV_COLUMNS, SUM_COLUMNS, Queries


def fts_query(phrases: Sequence[Phrase]) -> str:
    """FTS5 syntax for ``phrases``, OR-ed: each quoted (its parts are letters and digits only, so nothing in
    them is syntax), a prefix marked with ``*``."""
    return " OR ".join('"' + " ".join(p.parts) + '"' + ("*" if p.prefix else "") for p in phrases) or '""'


def within(bounds: Bounds, conversation_column: str, position: str) -> tuple[str, tuple[Any, ...]]:
    """SQL condition and arguments: ``position`` (``m.seq <`` or ``s.end_seq <=``) within ``bounds``."""
    if not bounds:
        return "0", ()
    clause = " OR ".join(f"({conversation_column} = ? AND {position} ?)" for _ in bounds)
    return f"({clause})", tuple(v for pair in bounds for v in pair)


_SUMMARY = ", ".join("s." + c.strip() for c in SUM_COLUMNS.split(","))


class SQLiteSearches(Queries):
    async def search_messages(
        self, conversation_id: str, phrases: Sequence[Phrase], before_seq: int, limit: int, *, max_chars: int = 1 << 30
    ) -> list[Hit]:
        rows = await self._all(
            "SELECT m.id, m.seq, m.role, substr(m.text, 1, ?), m.created_at FROM messages_fts f"
            " JOIN messages m ON m.id = f.rowid WHERE messages_fts MATCH ? AND m.conversation_id = ? AND m.seq < ?"
            " ORDER BY bm25(messages_fts), m.seq DESC LIMIT ?",
            (max_chars, fts_query(phrases), conversation_id, before_seq, limit),
        )
        return [(int(r[0]), int(r[1]), str(r[2]), str(r[3]), float(r[4])) for r in rows]

    async def scan_messages(self, conversation_id: str, before_seq: int, *, literal: str | None = None) -> list[Hit]:
        # ``instr`` on lower(): SQLite has no index for it, but it skips decoding rows that cannot match.
        where, args = ("AND instr(lower(text), ?) > 0", (literal.lower(),)) if literal else ("", ())
        rows = await self._all(
            f"SELECT id, seq, role, text, created_at FROM messages WHERE conversation_id = ? AND seq < ? {where}"
            " ORDER BY seq DESC",
            (conversation_id, before_seq, *args),
        )
        return [(int(r[0]), int(r[1]), str(r[2]), str(r[3]), float(r[4])) for r in rows]

    async def search_summaries(self, phrases: Sequence[Phrase], bounds: Bounds, limit: int) -> list[SummaryRecord]:
        visible, args = within(bounds, "s.conversation_id", "s.end_seq <=")
        rows = await self._all(
            f"SELECT {_SUMMARY} FROM summaries_fts f JOIN summaries s ON s.pk = f.rowid"
            f" WHERE summaries_fts MATCH ? AND {visible} ORDER BY bm25(summaries_fts) LIMIT ?",
            (fts_query(phrases), *args, limit),
        )
        return [SummaryRecord(*r) for r in rows]

    async def scan_summaries(self, bounds: Bounds) -> list[SummaryRecord]:
        visible, args = within(bounds, "s.conversation_id", "s.end_seq <=")
        rows = await self._all(f"SELECT {_SUMMARY} FROM summaries s WHERE {visible} ORDER BY s.pk DESC", args)
        return [SummaryRecord(*r) for r in rows]

    async def visible_file_ids(self, scope: str, bounds: Bounds) -> list[str]:
        visible, args = within(bounds, "m.conversation_id", "m.seq <")
        rows = await self._all(
            "SELECT DISTINCT f.id FROM files f JOIN message_files mf ON mf.file_id = f.id"
            f" JOIN messages m ON m.id = mf.message_id WHERE f.tenant = ? AND {visible} ORDER BY f.id",
            (scope, *args),
        )
        return [str(r[0]) for r in rows]

    async def file_visible(self, file_id: str, bounds: Bounds) -> bool:
        visible, args = within(bounds, "m.conversation_id", "m.seq <")
        row = await self._one(
            "SELECT 1 FROM message_files mf JOIN messages m ON m.id = mf.message_id WHERE mf.file_id = ?"
            f" AND {visible} LIMIT 1",
            (file_id, *args),
        )
        return row is not None

    async def message_seqs(self, conversation_id: str) -> list[int]:
        rows = await self._all("SELECT seq FROM messages WHERE conversation_id = ? ORDER BY seq", (conversation_id,))
        return [int(r[0]) for r in rows]

    async def context_items(self, conversation_id: str) -> list[tuple[str, bool]]:
        rows = await self._all(
            "SELECT ci.summary_id, s.id IS NOT NULL FROM context_items ci LEFT JOIN summaries s"
            " ON s.id = ci.summary_id WHERE ci.conversation_id = ? ORDER BY ci.ordinal",
            (conversation_id,),
        )
        return [(str(r[0]), bool(r[1])) for r in rows]

    async def payload_messages(self, conversation_id: str) -> list[tuple[int, int, str, str]]:
        rows = await self._all(
            "SELECT id, seq, original_json, payload_paths FROM messages"
            " WHERE conversation_id = ? AND payload_paths IS NOT NULL ORDER BY seq",
            (conversation_id,),
        )
        return [(int(r[0]), int(r[1]), str(r[2]), str(r[3])) for r in rows]

    async def summary_sources(self, summary_id: str) -> list[tuple[int | None, str | None, int | None]]:
        rows = await self._all(
            "SELECT ss.message_id, ss.child_summary_id, m.seq FROM summary_sources ss"
            " LEFT JOIN messages m ON m.id = ss.message_id WHERE ss.summary_id = ? ORDER BY ss.ordinal",
            (summary_id,),
        )
        return [(r[0], r[1], r[2]) for r in rows]

    async def all_files(self) -> list[tuple[str, str, str]]:
        rows = await self._all("SELECT id, path, sha256 FROM files ORDER BY id", ())
        return [(str(r[0]), str(r[1]), str(r[2])) for r in rows]

    async def idle_conversations(self, before: float | None, scope: str | None, limit: int) -> list[ConversationRecord]:
        rows = await self._all(
            f"SELECT {CONV_COLUMNS} FROM conversations WHERE deleted_at IS NULL AND (?1 IS NULL OR updated_at < ?1)"
            " AND (?2 IS NULL OR tenant = ?2 OR substr(tenant, 1, length(?4)) = ?4) ORDER BY updated_at, id LIMIT ?3",
            (before, scope, limit, end_users_of(scope)),
        )
        return [ConversationRecord(*r) for r in rows]
