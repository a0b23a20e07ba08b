"""The PostgreSQL store's reads (``Reads``), and the session both its reads and its transactions run on.

Reads take a pooled connection per statement in autocommit mode; inside a transaction the same queries run on
the transaction's connection. Driver errors are translated at one boundary (``translated``): a lost
connection, a deadlock, a timeout or a serialisation failure becomes ``StoreBusy``, a retryable 503; anything
else is a bug and stays as it is.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from proxy.store import running
from proxy.store.errors import StoreBusy
from proxy.store.postgres.ledger import PostgresLedgerReads
from proxy.store.records import ConversationRecord, FileRecord, MessageRecord, ResponseRecord, SummaryRecord

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


def prefixed(columns: str, alias: str) -> str:
    return ", ".join(f"{alias}.{c.strip()}" for c in columns.split(","))


# SQLSTATE classes a retry may get past: connection exceptions, insufficient resources (too many connections),
# transaction rollbacks (serialisation failure, deadlock), operator intervention (a cancelled statement or
# timeout, a shutting-down server), and a lock not available (lock_timeout).
RETRYABLE_CLASSES = ("08", "40", "53", "57")
RETRYABLE_STATES = ("55P03",)


def retryable(error: psycopg.Error) -> bool:
    """Whether ``error`` is about the database's state rather than the statement: a connection lost before the
    server said anything has no SQLSTATE at all; a statement the server cannot take (a word too long, a value
    out of range) fails the same way on every retry."""
    state = error.sqlstate
    return state is None or state[:2] in RETRYABLE_CLASSES or state in RETRYABLE_STATES


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """The one place where psycopg's operational errors (connection lost, deadlock, serialisation failure,
    statement timeout) become ``StoreBusy``: nothing was committed, and a retry shortly may well succeed."""
    try:
        yield
    except psycopg.OperationalError as error:
        if not retryable(error):
            raise
        raise StoreBusy(f"The database is unavailable or busy ({type(error).__name__}); retry.") from error


def text_safe(args: Sequence[Any]) -> Sequence[Any]:
    """PostgreSQL text cannot hold NUL. Stored JSON escapes it (``\\u0000``), so only derived text (search
    text, summaries, file names) and lookups ever carry one: it becomes U+FFFD, and such an id matches
    nothing, as it would not have on SQLite either."""
    if not any(isinstance(a, str) and "\x00" in a for a in args):
        return args
    return [a.replace("\x00", "\ufffd") if isinstance(a, str) else a for a in args]


class Session:
    """Runs statements either on a connection of its own (a transaction) or, one pooled connection per
    statement, in autocommit mode."""

    def __init__(self, pool: AsyncConnectionPool | None = None, conn: psycopg.AsyncConnection[Any] | None = None):
        self.pool = pool
        self.conn = conn

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        if self.conn is not None:
            yield self.conn
        else:
            assert self.pool is not None
            async with self.pool.connection() as conn:
                yield conn

    async def _one(self, sql: str, args: Sequence[Any] = ()) -> Any:
        with translated():
            async with self._connection() as conn:
                cursor = await conn.execute(sql, text_safe(args))
                return await cursor.fetchone()

    async def _all(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        with translated():
            async with self._connection() as conn:
                cursor = await conn.execute(sql, text_safe(args))
                return list(await cursor.fetchall())

    async def _run(self, sql: str, args: Sequence[Any] = ()) -> int:
        """Execute one statement; the number of rows it changed."""
        with translated():
            async with self._connection() as conn:
                cursor = await conn.execute(sql, text_safe(args))
                return cursor.rowcount

    async def _run_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Execute one statement once per row of arguments: psycopg sends them in a pipeline (one round trip for
        all, not one each, which a transaction holds its conversation's lock for)."""
        with translated():
            async with self._connection() as conn, conn.cursor() as cursor:
                await cursor.executemany(sql, [text_safe(row) for row in rows])


class PostgresReads(Session, PostgresLedgerReads):
    async def conversation(
        self, scope: str | None, conversation_id: str, *, deleted: bool = False
    ) -> ConversationRecord | None:
        row = await self._one(
            f"SELECT {CONV_COLUMNS} FROM lcm.conversations WHERE id = %s AND (%s::text IS NULL OR tenant = %s)"
            " AND (%s OR deleted_at IS NULL)",
            (conversation_id, scope, scope, deleted),
        )
        return ConversationRecord(*row) if row else None

    async def conversation_by_key(self, scope: str, key: str) -> ConversationRecord | None:
        row = await self._one(
            f"SELECT {CONV_COLUMNS} FROM lcm.conversations WHERE tenant = %s AND (external_key = %s OR id = %s)"
            " AND deleted_at IS NULL ORDER BY (external_key IS NOT DISTINCT FROM %s) DESC LIMIT 1",
            (scope, key, key, key),
        )
        return ConversationRecord(*row) if row else None

    async def response(self, scope: str, response_id: str) -> ResponseRecord | None:
        """A response or checkpoint the Responses door issued to ``scope`` (None for another scope's)."""
        row = await self._one(
            f"SELECT {RESPONSE_COLUMNS} FROM lcm.responses WHERE id = %s AND scope = %s", (response_id, scope)
        )
        return ResponseRecord(*row) if row else None

    async def conversations_by_key(self, key: str) -> list[ConversationRecord]:
        rows = await self._all(
            f"SELECT {CONV_COLUMNS} FROM lcm.conversations WHERE external_key = %s AND deleted_at IS NULL LIMIT 2",
            (key,),
        )
        return [ConversationRecord(*r) for r in rows]

    async def conversations(
        self, scope: str | None = None, limit: int = 1000, *, deleted: bool = False
    ) -> list[ConversationRecord]:
        rows = await self._all(
            f"SELECT {CONV_COLUMNS} FROM lcm.conversations WHERE (%s::text IS NULL OR tenant = %s)"
            " AND (%s OR deleted_at IS NULL) ORDER BY updated_at DESC LIMIT %s",
            (scope, scope, deleted, limit),
        )
        return [ConversationRecord(*r) for r in rows]

    async def chain_exists(self, chain_hash: str) -> bool:
        # No filter for deleted conversations: see the SQLite store's (``Queries.chain_exists``).
        return await self._one("SELECT 1 FROM lcm.messages WHERE chain_hash = %s LIMIT 1", (chain_hash,)) is not None

    async def chain_in_conversation(self, conversation_id: str, seq: int, chain_hash: str) -> bool:
        row = await self._one(
            "SELECT 1 FROM lcm.messages WHERE conversation_id = %s AND seq = %s AND chain_hash = %s",
            (conversation_id, seq, chain_hash),
        )
        return row is not None

    async def chain_in_any(self, conversation_ids: Sequence[str], chain_hash: str) -> bool:
        row = await self._one(
            "SELECT 1 FROM lcm.messages WHERE chain_hash = %s AND conversation_id = ANY(%s) LIMIT 1",
            (chain_hash, list(conversation_ids)),
        )
        return row is not None

    async def descendants(self, scope: str, conversation_id: str, limit: int = 1000) -> list[str]:
        rows = await self._all(
            "WITH RECURSIVE family(id) AS (SELECT id FROM lcm.conversations WHERE parent_id = %s AND tenant = %s"
            " UNION SELECT c.id FROM lcm.conversations c JOIN family f ON c.parent_id = f.id)"
            " SELECT c.id FROM family f JOIN lcm.conversations c ON c.id = f.id WHERE c.deleted_at IS NULL LIMIT %s",
            (conversation_id, scope, limit),
        )
        return [str(r[0]) for r in rows]

    async def family(self, conversation_id: str) -> list[ConversationRecord]:
        rows = await self._all(
            "WITH RECURSIVE family(id) AS (SELECT id FROM lcm.conversations WHERE parent_id = %s"
            " UNION SELECT c.id FROM lcm.conversations c JOIN family f ON c.parent_id = f.id)"
            f" SELECT {prefixed(CONV_COLUMNS, 'c')} FROM family f JOIN lcm.conversations c ON c.id = f.id",
            (conversation_id,),
        )
        return [ConversationRecord(*r) for r in rows]

    async def conversations_with_chain(self, scope: str, chain_hash: str) -> list[ConversationRecord]:
        rows = await self._all(
            f"SELECT {prefixed(CONV_COLUMNS, 'c')} FROM lcm.messages m"
            " JOIN lcm.conversations c ON c.id = m.conversation_id WHERE m.chain_hash = %s AND c.tenant = %s"
            " AND c.deleted_at IS NULL",
            (chain_hash, scope),
        )
        return [ConversationRecord(*r) for r in rows]

    async def messages(self, conversation_id: str, start: int = 0, end: int | None = None) -> list[MessageRecord]:
        rows = await self._all(
            f"SELECT {MSG_COLUMNS} FROM lcm.messages WHERE conversation_id = %s AND seq >= %s AND seq < %s"
            " ORDER BY seq",
            (conversation_id, start, end if end is not None else 2**31 - 1),
        )
        return [MessageRecord(*r) for r in rows]

    async def messages_by_id(self, message_ids: Sequence[int]) -> list[MessageRecord]:
        rows = await self._all(
            f"SELECT {MSG_COLUMNS} FROM lcm.messages WHERE id = ANY(%s) ORDER BY seq", (list(message_ids),)
        )
        return [MessageRecord(*r) for r in rows]

    async def source_messages(self, summary_id: str) -> list[MessageRecord]:
        rows = await self._all(
            f"SELECT {prefixed(MSG_COLUMNS, 'm')} FROM lcm.summary_sources ss"
            " JOIN lcm.messages m ON m.id = ss.message_id WHERE ss.summary_id = %s ORDER BY ss.ordinal",
            (summary_id,),
        )
        return [MessageRecord(*r) for r in rows]

    async def forward_overrides(self, conversation_id: str, end: int) -> dict[int, str]:
        rows = await self._all(
            "SELECT seq, forward_json FROM lcm.messages WHERE conversation_id = %s AND seq < %s"
            " AND forward_json IS NOT NULL",
            (conversation_id, end),
        )
        return {int(seq): text for seq, text in rows}

    async def running_sums(self, conversation_id: str, seqs: Sequence[int]) -> dict[int, running.Running] | None:
        """See ``proxy.store.sqlite.reads.Queries.running_sums``."""
        wanted = sorted({s for s in seqs if s >= 0})
        rows = []
        if wanted:
            rows = await self._all(
                f"SELECT seq, {running.COLUMNS} FROM lcm.messages WHERE conversation_id = %s AND seq = ANY(%s)",
                (conversation_id, wanted),
            )
        return running.found(rows, wanted)

    async def token_sums(self, conversation_id: str, end: int) -> tuple[int, int]:
        sums = await self.running_sums(conversation_id, [end - 1])
        if sums is not None:
            return sums[end - 1][0], sums[end - 1][1]
        row = await self._one(
            "SELECT coalesce(sum(token_count), 0), coalesce(sum(sent_token_count), 0) FROM lcm.messages"
            " WHERE conversation_id = %s AND seq < %s",
            (conversation_id, end),
        )
        return int(row[0]), int(row[1])

    async def context_summaries(self, conversation_id: str) -> list[SummaryRecord]:
        rows = await self._all(
            f"SELECT {prefixed(SUM_COLUMNS, 's')} FROM lcm.context_items ci"
            " JOIN lcm.summaries s ON s.id = ci.summary_id WHERE ci.conversation_id = %s ORDER BY ci.ordinal",
            (conversation_id,),
        )
        return [SummaryRecord(*r) for r in rows]

    async def summary(self, summary_id: str) -> SummaryRecord | None:
        row = await self._one(f"SELECT {SUM_COLUMNS} FROM lcm.summaries WHERE id = %s", (summary_id,))
        return SummaryRecord(*row) if row else None

    async def child_summaries(self, summary_id: str) -> list[SummaryRecord]:
        rows = await self._all(
            f"SELECT {prefixed(SUM_COLUMNS, 's')} FROM lcm.summary_sources ss"
            " JOIN lcm.summaries s ON s.id = ss.child_summary_id WHERE ss.summary_id = %s ORDER BY ss.ordinal",
            (summary_id,),
        )
        return [SummaryRecord(*r) for r in rows]

    async def parent_summary_ids(self, summary_id: str) -> list[str]:
        rows = await self._all("SELECT summary_id FROM lcm.summary_sources WHERE child_summary_id = %s", (summary_id,))
        return [str(r[0]) for r in rows]

    async def roles(self, conversation_id: str, start: int, end: int) -> list[str]:
        rows = await self._all(
            "SELECT role FROM lcm.messages WHERE conversation_id = %s AND seq >= %s AND seq < %s ORDER BY seq",
            (conversation_id, start, end),
        )
        return [str(r[0]) for r in rows]

    _ASSEMBLED = "CASE WHEN seq < %s AND compact_token_count IS NOT NULL THEN compact_token_count ELSE token_count END"

    async def raw_token_counts(self, conversation_id: str, start: int, end: int, stubbed_upto: int) -> list[int]:
        rows = await self._all(
            f"SELECT {self._ASSEMBLED} FROM lcm.messages WHERE conversation_id = %s AND seq >= %s AND seq < %s"
            " ORDER BY seq",
            (stubbed_upto, conversation_id, start, end),
        )
        return [int(r[0]) for r in rows]

    async def raw_token_sum(self, conversation_id: str, start: int, end: int, stubbed_upto: int) -> int:
        sums = await self.running_sums(conversation_id, running.raw_points(start, end, stubbed_upto))
        if sums is not None:
            return running.raw_sum(sums, start, end, stubbed_upto)
        row = await self._one(
            f"SELECT coalesce(sum({self._ASSEMBLED}), 0) FROM lcm.messages"
            " WHERE conversation_id = %s AND seq >= %s AND seq < %s",
            (stubbed_upto, conversation_id, start, end),
        )
        return int(row[0])

    async def patches(self, conversation_id: str, start: int, end: int) -> list[tuple[int, str | None, str | None]]:
        rows = await self._all(
            "SELECT seq, forward_json, compact_json FROM lcm.messages WHERE conversation_id = %s AND seq >= %s"
            " AND seq < %s AND (forward_json IS NOT NULL OR compact_json IS NOT NULL) ORDER BY seq",
            (conversation_id, start, end),
        )
        return [(int(r[0]), r[1], r[2]) for r in rows]

    async def file(self, scope: str, file_id: str) -> FileRecord | None:
        row = await self._one(f"SELECT {FILE_COLUMNS} FROM lcm.files WHERE tenant = %s AND id = %s", (scope, file_id))
        return FileRecord(*row) if row else None

    async def file_owner(self, scope: str | None, file_id: str) -> tuple[str, str] | None:
        row = await self._one(
            "SELECT tenant, conversation_id FROM lcm.files WHERE id = %s AND (%s::text IS NULL OR tenant = %s)",
            (file_id, scope, scope),
        )
        return (row[0], row[1]) if row else None

    async def files_of_message(self, message_id: int) -> list[FileRecord]:
        rows = await self._all(
            f"SELECT {prefixed(FILE_COLUMNS, 'f')} FROM lcm.message_files mf"
            " JOIN lcm.files f ON f.id = mf.file_id WHERE mf.message_id = %s",
            (message_id,),
        )
        return [FileRecord(*r) for r in rows]

    async def last_sent(self, conversation_id: str) -> str | None:
        row = await self._one("SELECT sent_json FROM lcm.last_sent WHERE conversation_id = %s", (conversation_id,))
        return str(row[0]) if row else None

    async def compaction_lease(self, conversation_id: str) -> tuple[str, float] | None:
        """The expiry is kept on the database's clock (replicas' clocks may disagree) and given back on this
        replica's, so that comparing it with ``time.time()`` agrees with what ``take_compaction_lease`` will
        decide."""
        row = await self._one(
            "SELECT owner, expires_at - extract(epoch from clock_timestamp()) FROM lcm.compaction_leases"
            " WHERE conversation_id = %s",
            (conversation_id,),
        )
        return (str(row[0]), time.time() + float(row[1])) if row else None

    async def known_file_paths(self, paths: Sequence[str]) -> set[str]:
        rows = await self._all("SELECT path FROM lcm.files WHERE path = ANY(%s)", (list(paths),))
        return {str(r[0]) for r in rows}

    async def replaceable_answer(self, conversation_id: str) -> int | None:
        row = await self._one(
            "SELECT r.seq FROM lcm.relayed_answers r JOIN lcm.conversations c ON c.id = r.conversation_id"
            " JOIN lcm.messages m ON m.conversation_id = r.conversation_id AND m.seq = r.seq"
            " WHERE r.conversation_id = %s AND r.seq = c.message_count - 1 AND c.summarized_upto <= r.seq"
            " AND NOT EXISTS (SELECT 1 FROM lcm.summary_sources s WHERE s.message_id = m.id)"
            " AND NOT EXISTS (SELECT 1 FROM lcm.conversations f WHERE f.parent_id = r.conversation_id"
            " AND f.fork_seq > r.seq)",
            (conversation_id,),
        )
        return int(row[0]) if row else None
