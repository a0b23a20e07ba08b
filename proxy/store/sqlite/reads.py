"""The SQLite store's reads (``Reads``): usable on the event loop's plain ``sqlite3`` connection, on the
search connection (aiosqlite, its own thread) or inside a write transaction. Also the one place where SQLite's
"database is locked" becomes ``StoreBusy`` (``busy_is_retryable``)."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any

import aiosqlite

from proxy.store import running
from proxy.store.errors import StoreBusy
from proxy.store.records import ConversationRecord, FileRecord, MessageRecord, ResponseRecord, SummaryRecord
from proxy.store.sqlite.ledger import SQLiteLedgerReads

RESPONSE_COLUMNS = "id, scope, kind, conversation_id, position, previous_id, input_json, body_json, created_at"
CONV_COLUMNS = (
    "id, tenant, external_key, parent_id, fork_seq, instructions_json, message_count, token_count, "
    "created_at, updated_at, summarized_upto, stubbed_upto, last_model, deleted_at, dialect, continued, linked_to, "
    "ledger_upto"
)
MSG_COLUMNS = (
    "id, conversation_id, seq, role, original_json, payload_paths, forward_json, compact_json, text, "
    "token_count, sent_token_count, chain_hash, created_at, compact_token_count"
)
SUM_COLUMNS = (
    "id, conversation_id, kind, depth, start_seq, end_seq, content, token_count, source_token_count, "
    "earliest_at, latest_at, descendant_count, file_ids, summarizer_model, escalation, created_at"
)
FILE_COLUMNS = "id, tenant, conversation_id, name, mime, kind, bytes, sha256, path, exploration, created_at"

_BUSY = ("database is locked", "database is busy")


def is_busy(error: sqlite3.OperationalError) -> bool:
    return any(text in str(error) for text in _BUSY)


@contextlib.contextmanager
def busy_is_retryable() -> Iterator[None]:
    """The one place where SQLite's "database is locked" (another process held the write lock for longer than
    ``BUSY_TIMEOUT_MS``: several workers, the operator's CLI) becomes ``StoreBusy``, a retryable 503,
    instead of an internal error that tells clients never to retry."""
    try:
        yield
    except sqlite3.OperationalError as error:
        if is_busy(error):
            raise StoreBusy() from error
        raise


class Queries(SQLiteLedgerReads):
    """Reads, usable on a reader connection or inside a write transaction."""

    def __init__(self, conn: sqlite3.Connection | aiosqlite.Connection) -> None:
        self.conn = conn

    async def _one(self, sql: str, args: Sequence[Any]) -> Any:
        with busy_is_retryable():
            if isinstance(self.conn, sqlite3.Connection):
                return self.conn.execute(sql, args).fetchone()
            async with self.conn.execute(sql, args) as cursor:
                return await cursor.fetchone()

    async def _all(self, sql: str, args: Sequence[Any]) -> list[Any]:
        with busy_is_retryable():
            if isinstance(self.conn, sqlite3.Connection):
                return self.conn.execute(sql, args).fetchall()
            async with self.conn.execute(sql, args) as cursor:
                return list(await cursor.fetchall())

    async def conversation(
        self, scope: str | None, conversation_id: str, *, deleted: bool = False
    ) -> ConversationRecord | None:
        """``scope=None`` is for the operator's CLI only, which sees every scope; ``deleted=True`` also finds a
        deleted conversation kept for its forks."""
        row = await self._one(
            f"SELECT {CONV_COLUMNS} FROM conversations WHERE id = ? AND (? IS NULL OR tenant = ?)"
            " AND (? OR deleted_at IS NULL)",
            (conversation_id, scope, scope, deleted),
        )
        return ConversationRecord(*row) if row else None

    async def conversation_by_key(self, scope: str, key: str) -> ConversationRecord | None:
        row = await self._one(
            f"SELECT {CONV_COLUMNS} FROM conversations WHERE tenant = ? AND (external_key = ? OR id = ?)"
            " AND deleted_at IS NULL ORDER BY external_key = ? DESC LIMIT 1",
            (scope, key, key, key),
        )
        return ConversationRecord(*row) if row else None

    async def response(self, scope: str, response_id: str) -> ResponseRecord | None:
        """A response or checkpoint the Responses door issued to ``scope`` (None for another scope's)."""
        row = await self._one(
            f"SELECT {RESPONSE_COLUMNS} FROM responses WHERE id = ? AND scope = ?", (response_id, scope)
        )
        return ResponseRecord(*row) if row else None

    async def conversations_by_key(self, key: str) -> list[ConversationRecord]:
        """The conversations clients of any tenant named ``key`` (for the operator's CLI, which sees every
        tenant): two at most, enough to tell a unique key from an ambiguous one."""
        rows = await self._all(
            f"SELECT {CONV_COLUMNS} FROM conversations WHERE external_key = ? AND deleted_at IS NULL LIMIT 2", (key,)
        )
        return [ConversationRecord(*r) for r in rows]

    async def conversations(
        self, scope: str | None = None, limit: int = 1000, *, deleted: bool = False
    ) -> list[ConversationRecord]:
        where, args = ("tenant = ?", [scope]) if scope is not None else ("1", [])
        rows = await self._all(
            f"SELECT {CONV_COLUMNS} FROM conversations WHERE {where} AND (? OR deleted_at IS NULL)"
            " ORDER BY updated_at DESC LIMIT ?",
            (*args, deleted, limit),
        )
        return [ConversationRecord(*r) for r in rows]

    async def chain_exists(self, chain_hash: str) -> bool:
        # Deleted conversations need no filter here: the prefix one keeps is copied in a live fork of the same
        # tenant (chain hashes and all), and the lookups that name a conversation skip deleted ones.
        return await self._one("SELECT 1 FROM messages WHERE chain_hash = ? LIMIT 1", (chain_hash,)) is not None

    async def chain_in_conversation(self, conversation_id: str, seq: int, chain_hash: str) -> bool:
        row = await self._one(
            "SELECT 1 FROM messages WHERE conversation_id = ? AND seq = ? AND chain_hash = ?",
            (conversation_id, seq, chain_hash),
        )
        return row is not None

    async def chain_in_any(self, conversation_ids: Sequence[str], chain_hash: str) -> bool:
        row = await self._one(
            "SELECT 1 FROM messages WHERE chain_hash = ? AND conversation_id IN"
            f" ({','.join('?' * len(conversation_ids))}) LIMIT 1",
            (chain_hash, *conversation_ids),
        )
        return row is not None

    async def descendants(self, scope: str, conversation_id: str, limit: int = 1000) -> list[str]:
        """Ids of the conversations forked from ``conversation_id``, directly or through other forks."""
        rows = await self._all(
            "WITH RECURSIVE family(id) AS (SELECT id FROM conversations WHERE parent_id = ? AND tenant = ?"
            " UNION SELECT c.id FROM conversations c JOIN family f ON c.parent_id = f.id)"
            " SELECT c.id FROM family f JOIN conversations c ON c.id = f.id WHERE c.deleted_at IS NULL LIMIT ?",
            (conversation_id, scope, limit),
        )
        return [str(r[0]) for r in rows]

    async def family(self, conversation_id: str) -> list[ConversationRecord]:
        """Every conversation forked from ``conversation_id``, directly or through other forks, deleted included."""
        rows = await self._all(
            "WITH RECURSIVE family(id) AS (SELECT id FROM conversations WHERE parent_id = ?"
            " UNION SELECT c.id FROM conversations c JOIN family f ON c.parent_id = f.id)"
            f" SELECT {', '.join('c.' + c.strip() for c in CONV_COLUMNS.split(','))} FROM family f"
            " JOIN conversations c ON c.id = f.id",
            (conversation_id,),
        )
        return [ConversationRecord(*r) for r in rows]

    async def conversations_with_chain(self, scope: str, chain_hash: str) -> list[ConversationRecord]:
        rows = await self._all(
            f"SELECT {', '.join('c.' + c.strip() for c in CONV_COLUMNS.split(','))} FROM messages m"
            " JOIN conversations c ON c.id = m.conversation_id WHERE m.chain_hash = ? AND c.tenant = ?"
            " AND c.deleted_at IS NULL",
            (chain_hash, scope),
        )
        return [ConversationRecord(*r) for r in rows]

    async def messages(self, conversation_id: str, start: int = 0, end: int | None = None) -> list[MessageRecord]:
        rows = await self._all(
            f"SELECT {MSG_COLUMNS} FROM messages WHERE conversation_id = ? AND seq >= ? AND seq < ? ORDER BY seq",
            (conversation_id, start, end if end is not None else 2**62),
        )
        return [MessageRecord(*r) for r in rows]

    async def messages_by_id(self, message_ids: Sequence[int]) -> list[MessageRecord]:
        rows = await self._all(
            f"SELECT {MSG_COLUMNS} FROM messages WHERE id IN ({','.join('?' * len(message_ids))}) ORDER BY seq",
            tuple(message_ids),
        )
        return [MessageRecord(*r) for r in rows]

    async def source_messages(self, summary_id: str) -> list[MessageRecord]:
        rows = await self._all(
            f"SELECT {', '.join('m.' + c.strip() for c in MSG_COLUMNS.split(','))} FROM summary_sources ss"
            " JOIN messages m ON m.id = ss.message_id WHERE ss.summary_id = ? ORDER BY ss.ordinal",
            (summary_id,),
        )
        return [MessageRecord(*r) for r in rows]

    async def forward_overrides(self, conversation_id: str, end: int) -> dict[int, str]:
        rows = await self._all(
            "SELECT seq, forward_json FROM messages WHERE conversation_id = ? AND seq < ? AND forward_json IS NOT NULL",
            (conversation_id, end),
        )
        return {seq: text for seq, text in rows}

    async def running_sums(self, conversation_id: str, seqs: Sequence[int]) -> dict[int, running.Running] | None:
        """The stored running sums of messages ``seqs`` (``proxy.store.running``); None when one is unknown."""
        wanted = sorted({s for s in seqs if s >= 0})
        rows = []
        if wanted:
            rows = await self._all(
                f"SELECT seq, {running.COLUMNS} FROM messages WHERE conversation_id = ?"
                f" AND seq IN ({','.join('?' * len(wanted))})",
                (conversation_id, *wanted),
            )
        return running.found(rows, wanted)

    async def token_sums(self, conversation_id: str, end: int) -> tuple[int, int]:
        """(forwarded, sent) tokens of messages [0, end)."""
        sums = await self.running_sums(conversation_id, [end - 1])
        if sums is not None:
            return sums[end - 1][0], sums[end - 1][1]
        row = await self._one(
            "SELECT coalesce(sum(token_count), 0), coalesce(sum(sent_token_count), 0) FROM messages"
            " WHERE conversation_id = ? AND seq < ?",
            (conversation_id, end),
        )
        return int(row[0]), int(row[1])

    async def context_summaries(self, conversation_id: str) -> list[SummaryRecord]:
        rows = await self._all(
            f"SELECT {', '.join('s.' + c.strip() for c in SUM_COLUMNS.split(','))} FROM context_items ci"
            " JOIN summaries s ON s.id = ci.summary_id WHERE ci.conversation_id = ? ORDER BY ci.ordinal",
            (conversation_id,),
        )
        return [SummaryRecord(*r) for r in rows]

    async def summary(self, summary_id: str) -> SummaryRecord | None:
        row = await self._one(f"SELECT {SUM_COLUMNS} FROM summaries WHERE id = ?", (summary_id,))
        return SummaryRecord(*row) if row else None

    async def child_summaries(self, summary_id: str) -> list[SummaryRecord]:
        rows = await self._all(
            f"SELECT {', '.join('s.' + c.strip() for c in SUM_COLUMNS.split(','))} FROM summary_sources ss"
            " JOIN summaries s ON s.id = ss.child_summary_id WHERE ss.summary_id = ? ORDER BY ss.ordinal",
            (summary_id,),
        )
        return [SummaryRecord(*r) for r in rows]

    async def parent_summary_ids(self, summary_id: str) -> list[str]:
        rows = await self._all("SELECT summary_id FROM summary_sources WHERE child_summary_id = ?", (summary_id,))
        return [str(r[0]) for r in rows]

    async def roles(self, conversation_id: str, start: int, end: int) -> list[str]:
        rows = await self._all(
            "SELECT role FROM messages WHERE conversation_id = ? AND seq >= ? AND seq < ? ORDER BY seq",
            (conversation_id, start, end),
        )
        return [str(r[0]) for r in rows]

    async def raw_token_counts(self, conversation_id: str, start: int, end: int, stubbed_upto: int) -> list[int]:
        rows = await self._all(
            "SELECT CASE WHEN seq < ? AND compact_token_count IS NOT NULL THEN compact_token_count"
            " ELSE token_count END FROM messages WHERE conversation_id = ? AND seq >= ? AND seq < ? ORDER BY seq",
            (stubbed_upto, conversation_id, start, end),
        )
        return [int(r[0]) for r in rows]

    async def raw_token_sum(self, conversation_id: str, start: int, end: int, stubbed_upto: int) -> int:
        """Tokens of messages [start, end) as assembled: the compact form where stubbing applies."""
        sums = await self.running_sums(conversation_id, running.raw_points(start, end, stubbed_upto))
        if sums is not None:
            return running.raw_sum(sums, start, end, stubbed_upto)
        row = await self._one(
            "SELECT coalesce(sum(CASE WHEN seq < ? AND compact_token_count IS NOT NULL"
            " THEN compact_token_count ELSE token_count END), 0) FROM messages"
            " WHERE conversation_id = ? AND seq >= ? AND seq < ?",
            (stubbed_upto, conversation_id, start, end),
        )
        return int(row[0])

    async def patches(self, conversation_id: str, start: int, end: int) -> list[tuple[int, str | None, str | None]]:
        """(seq, forward patches, compact patches) of messages in [start, end) that have any."""
        rows = await self._all(
            "SELECT seq, forward_json, compact_json FROM messages WHERE conversation_id = ? AND seq >= ? AND seq < ?"
            " AND (forward_json IS NOT NULL OR compact_json IS NOT NULL) ORDER BY seq",
            (conversation_id, start, end),
        )
        return [(int(r[0]), r[1], r[2]) for r in rows]

    async def file(self, scope: str, file_id: str) -> FileRecord | None:
        row = await self._one(f"SELECT {FILE_COLUMNS} FROM files WHERE tenant = ? AND id = ?", (scope, file_id))
        return FileRecord(*row) if row else None

    async def file_owner(self, scope: str | None, file_id: str) -> tuple[str, str] | None:
        """(scope, conversation) that stored ``file_id``; ``scope=None`` is for the operator's CLI only."""
        row = await self._one(
            "SELECT tenant, conversation_id FROM files WHERE id = ? AND (? IS NULL OR tenant = ?)",
            (file_id, scope, scope),
        )
        return (row[0], row[1]) if row else None

    async def files_of_message(self, message_id: int) -> list[FileRecord]:
        rows = await self._all(
            f"SELECT {', '.join('f.' + c.strip() for c in FILE_COLUMNS.split(','))} FROM message_files mf"
            " JOIN files f ON f.id = mf.file_id WHERE mf.message_id = ?",
            (message_id,),
        )
        return [FileRecord(*r) for r in rows]

    async def last_sent(self, conversation_id: str) -> str | None:
        row = await self._one("SELECT sent_json FROM last_sent WHERE conversation_id = ?", (conversation_id,))
        return str(row[0]) if row else None

    async def compaction_lease(self, conversation_id: str) -> tuple[str, float] | None:
        """(owner, expires_at) of the compaction lease of ``conversation_id``, expired or not, if there is one."""
        row = await self._one(
            "SELECT owner, expires_at FROM compaction_leases WHERE conversation_id = ?", (conversation_id,)
        )
        return (str(row[0]), float(row[1])) if row else None

    async def known_file_paths(self, paths: Sequence[str]) -> set[str]:
        """Those of ``paths`` (relative to the data directory) that a ``files`` row names."""
        known: set[str] = set()
        for start in range(0, len(paths), 500):
            chunk = list(paths[start : start + 500])
            rows = await self._all(f"SELECT path FROM files WHERE path IN ({','.join('?' * len(chunk))})", chunk)
            known |= {str(r[0]) for r in rows}
        return known

    async def replaceable_answer(self, conversation_id: str) -> int | None:
        """The seq of the answer the proxy relayed and stored, while it may still be replaced: it is the last
        message, and no summary and no fork reaches it."""
        row = await self._one(
            "SELECT r.seq FROM relayed_answers r JOIN conversations c ON c.id = r.conversation_id"
            " JOIN messages m ON m.conversation_id = r.conversation_id AND m.seq = r.seq"
            " WHERE r.conversation_id = ? AND r.seq = c.message_count - 1 AND c.summarized_upto <= r.seq"
            " AND NOT EXISTS (SELECT 1 FROM summary_sources s WHERE s.message_id = m.id)"
            " AND NOT EXISTS"
            " (SELECT 1 FROM conversations f WHERE f.parent_id = r.conversation_id AND f.fork_seq > r.seq)",
            (conversation_id,),
        )
        return int(row[0]) if row else None
