"""The SQLite store: WAL, one serialised writer, separate reader connections.

Why separate connections: tasks that share one connection share its transaction, so a reader could see (or
a rollback could discard) another task's half-written unit. All writes go through ``write()`` on an
aiosqlite connection (its own thread), which holds an ``asyncio.Lock`` for this process and ``BEGIN
IMMEDIATE`` for every other process on the same file (several uvicorn workers): a deferred transaction that
reads and then writes fails at once with "database is locked" when another process committed in between,
ignoring busy_timeout. Writes stay off the event loop because ``BEGIN IMMEDIATE`` may wait for another
process and a checkpoint may fsync.

Reads on the request path (``read``) run on a plain ``sqlite3`` connection on the event loop itself: they
are indexed point and range reads served from the page cache in microseconds, and WAL readers never wait
for writers, while each hop to aiosqlite's thread and back costs ~60 µs — a re-sent one-message
conversation took 27 hops (1.6 ms of a 1.9 ms ``prepare``). Full-text search, regular-expression scans and
integrity checks, which can run long, use ``search`` (aiosqlite, its own thread) instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiosqlite

from proxy.store.records import FileRecord, NewMessage, SummaryRecord
from proxy.store.sqlite.connect import connect, connect_on_loop
from proxy.store.sqlite.delete import (
    CHECKPOINT_STEPS,
    FTS_TABLES,
    MAX_SCRUB_STEPS,
    SCRUB_PAGES,
    SQLiteRemoval,
    merge_step,
    truncate_wal,
    vacuum,
)
from proxy.store.sqlite.migrations import MIGRATIONS, apply_migrations
from proxy.store.sqlite.reads import FILE_COLUMNS, SUM_COLUMNS, Queries, busy_is_retryable

if TYPE_CHECKING:
    from proxy.store.sqlite.search import SQLiteSearches

DB_NAME = "lcm.sqlite3"
BUSY_TIMEOUT_MS = 10_000  # how long a write waits for another process's write lock before it gives up


class WriteTransaction(SQLiteRemoval, Queries):
    conn: aiosqlite.Connection

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self.conn = conn

    # This store's writers are serialised (one process: ``SQLiteStore._lock``; several: BEGIN IMMEDIATE), so
    # every transaction already holds every lock.
    async def lock_identity(self, tenant: str, key: str) -> None:
        pass

    async def lock_conversation(self, conversation_id: str) -> bool:
        return False

    async def put_blobs(self, blobs: Sequence[tuple[str, bytes]]) -> None:
        raise TypeError("the SQLite store keeps payloads in files (FileStore), not in the database")

    async def create_conversation(
        self,
        conversation_id: str,
        tenant: str,
        *,
        external_key: str | None = None,
        parent_id: str | None = None,
        fork_seq: int | None = None,
        instructions_json: str | None = None,
        dialect: str = "chat",
    ) -> None:
        now = time.time()
        await self.conn.execute(
            "INSERT INTO conversations (id, tenant, external_key, parent_id, fork_seq, instructions_json,"
            " created_at, updated_at, dialect) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (conversation_id, tenant, external_key, parent_id, fork_seq, instructions_json, now, now, dialect),
        )

    async def move_external_key(self, tenant: str, key: str, to_conversation: str) -> None:
        await self.conn.execute(
            "UPDATE conversations SET external_key = NULL WHERE tenant = ? AND external_key = ?", (tenant, key)
        )
        await self.conn.execute("UPDATE conversations SET external_key = ? WHERE id = ?", (key, to_conversation))

    async def copy_prefix(self, source_id: str, target_id: str, count: int) -> None:
        """Copy messages [0, count) of ``source_id`` (and their file links) into ``target_id``."""
        await self.conn.execute(
            "INSERT INTO messages (conversation_id, seq, role, original_json, payload_paths, forward_json,"
            " compact_json, text, token_count, sent_token_count, chain_hash, created_at, compact_token_count)"
            " SELECT ?, seq, role, original_json, payload_paths, forward_json, compact_json, text, token_count,"
            " sent_token_count, chain_hash, created_at, compact_token_count FROM messages"
            " WHERE conversation_id = ? AND seq < ? ORDER BY seq",
            (target_id, source_id, count),
        )
        await self.conn.execute(
            "INSERT OR IGNORE INTO message_files (message_id, file_id)"
            " SELECT t.id, mf.file_id FROM messages s JOIN message_files mf ON mf.message_id = s.id"
            " JOIN messages t ON t.conversation_id = ? AND t.seq = s.seq WHERE s.conversation_id = ? AND s.seq < ?",
            (target_id, source_id, count),
        )
        await self._refresh_counts(target_id)

    async def append_messages(self, conversation_id: str, first_seq: int, messages: Sequence[NewMessage]) -> None:
        now = time.time()
        for offset, m in enumerate(messages):
            cursor = await self.conn.execute(
                "INSERT INTO messages (conversation_id, seq, role, original_json, payload_paths, forward_json,"
                " compact_json, text, token_count, sent_token_count, chain_hash, created_at, compact_token_count)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    conversation_id, first_seq + offset, m.role, m.original_json, m.payload_paths, m.forward_json,
                    m.compact_json, m.text, m.token_count, m.sent_token_count, m.chain_hash, now,
                    m.compact_token_count,
                ),
            )  # fmt: skip
            for file_id in m.file_ids:
                await self.conn.execute(
                    "INSERT OR IGNORE INTO message_files (message_id, file_id) VALUES (?, ?)",
                    (cursor.lastrowid, file_id),
                )
        await self._refresh_counts(conversation_id)

    async def _refresh_counts(self, conversation_id: str) -> None:
        await self.conn.execute(
            "UPDATE conversations SET message_count = (SELECT count(*) FROM messages WHERE conversation_id = ?),"
            " token_count = (SELECT coalesce(sum(token_count), 0) FROM messages WHERE conversation_id = ?),"
            " updated_at = ? WHERE id = ?",
            (conversation_id, conversation_id, time.time(), conversation_id),
        )

    async def set_relayed_answer(self, conversation_id: str, seq: int, asked_at: float) -> None:
        """Record the message at ``seq`` as the answer relayed for a request that arrived at ``asked_at``."""
        await self.conn.execute(
            "INSERT OR REPLACE INTO relayed_answers (conversation_id, seq, created_at) VALUES (?, ?, ?)",
            (conversation_id, seq, asked_at),
        )

    async def relayed_answer_asked_at(self, conversation_id: str) -> float | None:
        row = await self._one("SELECT created_at FROM relayed_answers WHERE conversation_id = ?", (conversation_id,))
        return float(row[0]) if row else None

    async def drop_relayed_answer(self, conversation_id: str, seq: int) -> None:
        """Remove the relayed answer at ``seq`` (checked with ``replaceable_answer`` in this transaction)."""
        await self.conn.execute(
            "DELETE FROM message_files WHERE message_id IN"
            " (SELECT id FROM messages WHERE conversation_id = ? AND seq = ?)",
            (conversation_id, seq),
        )
        await self.conn.execute("DELETE FROM messages WHERE conversation_id = ? AND seq = ?", (conversation_id, seq))
        await self.conn.execute("DELETE FROM relayed_answers WHERE conversation_id = ?", (conversation_id,))
        await self._refresh_counts(conversation_id)

    async def set_instructions(self, conversation_id: str, instructions_json: str | None) -> None:
        await self.conn.execute(
            "UPDATE conversations SET instructions_json = ?, updated_at = ? WHERE id = ?",
            (instructions_json, time.time(), conversation_id),
        )

    async def touch(self, conversation_id: str) -> None:
        await self.conn.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (time.time(), conversation_id))

    async def insert_summary(self, record: SummaryRecord, message_ids: Sequence[int], child_ids: Sequence[str]) -> None:
        await self.conn.execute(
            f"INSERT INTO summaries ({SUM_COLUMNS}) VALUES ({', '.join('?' * 16)})",
            (
                record.id, record.conversation_id, record.kind, record.depth, record.start_seq, record.end_seq,
                record.content, record.token_count, record.source_token_count, record.earliest_at, record.latest_at,
                record.descendant_count, record.file_ids, record.summarizer_model, record.escalation, record.created_at,
            ),
        )  # fmt: skip
        sources = [(m, None) for m in message_ids] + [(None, c) for c in child_ids]
        await self.conn.executemany(
            "INSERT INTO summary_sources (summary_id, ordinal, message_id, child_summary_id) VALUES (?, ?, ?, ?)",
            [(record.id, i, m, c) for i, (m, c) in enumerate(sources)],
        )

    async def set_context(self, conversation_id: str, summary_ids: Sequence[str], summarized_upto: int) -> None:
        """Replace the summarised part of the active context (the swap of one compaction pass)."""
        await self.conn.execute("DELETE FROM context_items WHERE conversation_id = ?", (conversation_id,))
        await self.conn.executemany(
            "INSERT INTO context_items (conversation_id, ordinal, summary_id) VALUES (?, ?, ?)",
            [(conversation_id, i, s) for i, s in enumerate(summary_ids)],
        )
        await self.conn.execute(
            "UPDATE conversations SET summarized_upto = ?, stubbed_upto = max(stubbed_upto, ?) WHERE id = ?",
            (summarized_upto, summarized_upto, conversation_id),
        )

    async def set_stubbed_upto(self, conversation_id: str, seq: int) -> None:
        await self.conn.execute(
            "UPDATE conversations SET stubbed_upto = max(stubbed_upto, ?) WHERE id = ?", (seq, conversation_id)
        )

    async def set_last_sent(self, conversation_id: str, sent_json: str) -> None:
        # Nothing for a conversation deleted while its request ran.
        await self.conn.execute(
            "INSERT INTO last_sent (conversation_id, sent_json, updated_at) SELECT ?1, ?2, ?3"
            " WHERE EXISTS (SELECT 1 FROM conversations WHERE id = ?1 AND deleted_at IS NULL)"
            " ON CONFLICT(conversation_id) DO UPDATE"
            " SET sent_json = excluded.sent_json, updated_at = excluded.updated_at",
            (conversation_id, sent_json, time.time()),
        )

    async def set_last_model(self, conversation_id: str, model: str) -> None:
        await self.conn.execute("UPDATE conversations SET last_model = ? WHERE id = ?", (model, conversation_id))

    async def put_file(self, record: FileRecord) -> None:
        await self.conn.execute(
            f"INSERT OR IGNORE INTO files ({FILE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                record.id, record.tenant, record.conversation_id, record.name, record.mime, record.kind,
                record.bytes, record.sha256, record.path, record.exploration, record.created_at,
            ),
        )  # fmt: skip

    # Compaction leases: at most one sweep of a conversation at a time across processes (workers, the CLI). A
    # lease names its owner and expires unless renewed, so one whose holder died (SIGKILL) is taken over.

    async def take_compaction_lease(self, conversation_id: str, owner: str, ttl: float) -> bool:
        """Take the lease of ``conversation_id`` for ``ttl`` seconds if it is free, expired or already
        ``owner``'s; whether ``owner`` holds it now."""
        now = time.time()
        await self.conn.execute(
            "INSERT INTO compaction_leases (conversation_id, owner, expires_at) VALUES (?, ?, ?)"
            " ON CONFLICT(conversation_id) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at"
            " WHERE compaction_leases.expires_at <= ? OR compaction_leases.owner = excluded.owner",
            (conversation_id, owner, now + ttl, now),
        )
        held = await self.compaction_lease(conversation_id)
        return held is not None and held[0] == owner

    async def renew_compaction_lease(self, conversation_id: str, owner: str, ttl: float) -> bool:
        """Extend ``owner``'s lease; False when it is no longer ``owner``'s (it expired and was taken over)."""
        cursor = await self.conn.execute(
            "UPDATE compaction_leases SET expires_at = ? WHERE conversation_id = ? AND owner = ?",
            (time.time() + ttl, conversation_id, owner),
        )
        return cursor.rowcount > 0

    async def release_compaction_lease(self, conversation_id: str, owner: str) -> None:
        await self.conn.execute(
            "DELETE FROM compaction_leases WHERE conversation_id = ? AND owner = ?", (conversation_id, owner)
        )


async def _undo(begin: asyncio.Future[Any], writer: aiosqlite.Connection) -> None:
    with contextlib.suppress(Exception):
        await begin
        await writer.rollback()


async def _uncancellable(step: Awaitable[Any]) -> Any:
    """Run ``step`` to its end even if the caller is cancelled meanwhile, as often as anyio repeats the
    cancellation, then let the cancellation through: the writer's lock must not be released while a BEGIN,
    ROLLBACK or COMMIT of this unit is still queued on its connection."""
    task = asyncio.ensure_future(step)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                raise  # the step itself was cancelled, not its caller
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result


class SQLiteStore:
    kind = "sqlite"

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.path = data_dir / DB_NAME
        self._writer: aiosqlite.Connection | None = None
        self._reader: aiosqlite.Connection | None = None
        self._loop_reader: sqlite3.Connection | None = None
        self._lock = asyncio.Lock()
        self.scrub_pages = SCRUB_PAGES  # FTS5 pages per scrub step
        self.scrub_steps = 0  # merge steps taken by scrubs so far

    async def open(self) -> None:
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Create the file 0600 before SQLite does (it would honour the umask, often 0644).
        if not self.path.exists():
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        os.chmod(self.path, 0o600)
        self._writer = await connect(self.path, BUSY_TIMEOUT_MS)
        await apply_migrations(self._writer)
        self._reader = await connect(self.path, BUSY_TIMEOUT_MS)
        self._loop_reader = connect_on_loop(self.path)
        for suffix in ("-wal", "-shm"):
            sidecar = Path(str(self.path) + suffix)
            if sidecar.exists():
                os.chmod(sidecar, 0o600)

    async def close(self) -> None:
        if self._loop_reader is not None:
            self._loop_reader.close()
        for conn in (self._reader, self._writer):
            if conn is not None:
                await conn.close()
        self._reader = self._writer = self._loop_reader = None

    @property
    def read(self) -> Queries:
        """Short reads for the request path, on the event loop (see the module docstring)."""
        assert self._loop_reader is not None, "store is not open"
        return Queries(self._loop_reader)

    @property
    def search(self) -> SQLiteSearches:
        """Queries that may run long (full-text search, scans, checks), on a reader in its own thread."""
        from proxy.store.sqlite.search import SQLiteSearches  # it builds on Queries, defined here

        assert self._reader is not None, "store is not open"
        return SQLiteSearches(self._reader)

    @property
    def search_conn(self) -> aiosqlite.Connection:
        """The search reader itself, for SQL of this store's own (tests, maintenance)."""
        assert self._reader is not None, "store is not open"
        return self._reader

    async def integrity(self) -> list[str]:
        """SQLite's own checks (pages, foreign keys, both full-text indexes) and pending migrations. On a
        connection of their own: FTS5 (SQLite 3.51) checked its indexes against the structure a long-lived
        connection had cached, and reported as corrupt the segments another connection had merged since."""
        assert self._reader is not None, "store is not open"
        reader = await connect(self.path, BUSY_TIMEOUT_MS)
        try:
            return await self._integrity(reader)
        finally:
            await reader.close()

    async def _integrity(self, reader: aiosqlite.Connection) -> list[str]:
        problems: list[str] = []
        async with reader.execute("PRAGMA integrity_check") as cursor:
            if (await cursor.fetchone() or ("",))[0] != "ok":
                problems.append("SQLite integrity_check failed")
        async with reader.execute("PRAGMA foreign_key_check") as cursor:
            for row in await cursor.fetchall():
                problems.append(f"foreign key violation in {row[0]} (rowid {row[1]}) -> {row[2]}")
        async with reader.execute("SELECT name FROM _migrations") as cursor:
            applied = {r[0] for r in await cursor.fetchall()}
        problems += [f"migration {name} not applied" for name, _ in MIGRATIONS if name not in applied]
        for table in ("messages_fts", "summaries_fts"):
            try:
                await reader.execute(f"INSERT INTO {table}({table}, rank) VALUES ('integrity-check', 1)")
            except sqlite3.DatabaseError as error:
                problems.append(f"full-text index {table} is out of sync with its table ({error})")
        return problems

    async def scrub(self, *, full: bool = False) -> list[str]:
        """After deletions: old index entries and page images out of the files (``proxy.store.sqlite.delete``),
        in bounded steps, each holding the writer briefly; between steps the writer goes to whoever waits for
        it (``asyncio.Lock`` is first come, first served), and the scrub pauses as long as its step took, so
        other processes' writers get their turn too. ``full``: then ``VACUUM``, in one long step."""
        assert self._reader is not None, "store is not open"
        for table in FTS_TABLES:
            pages = -self.scrub_pages  # negative: start a merge of every segment
            for step in range(MAX_SCRUB_STEPS):
                start = time.monotonic()
                worked = await self._scrub_step(merge_step, table, pages)
                self.scrub_steps += 1
                if not worked:
                    break
                pages = self.scrub_pages  # positive: carry on with the merge started
                if step % CHECKPOINT_STEPS == CHECKPOINT_STEPS - 1:
                    # The merge writes pages fast: checkpoint them here, off the writer, before SQLite's own
                    # automatic checkpoint (at 1,000 pages) runs inside some commit (a request's, or a step's)
                    # and holds the writer while it copies them and syncs the file.
                    await self._reader.execute("PRAGMA wal_checkpoint(PASSIVE)")
                await asyncio.sleep(time.monotonic() - start)
        if full:
            await self._scrub_step(vacuum)
        notes: list[str] = await self._scrub_step(truncate_wal)
        return notes

    async def _scrub_step(self, step: Any, *args: Any) -> Any:
        assert self._writer is not None, "store is not open"
        async with self._lock:
            if self._writer.in_transaction:
                await self._writer.rollback()
            with busy_is_retryable():
                return await _uncancellable(step(self._writer, *args))

    @contextlib.asynccontextmanager
    async def write(self) -> AsyncIterator[WriteTransaction]:
        assert self._writer is not None, "store is not open"
        async with self._lock:
            if self._writer.in_transaction:  # a unit abandoned by cancellation; never build on it
                await self._writer.rollback()
            writer = self._writer
            begin = asyncio.ensure_future(writer.execute("BEGIN IMMEDIATE"))
            try:
                with busy_is_retryable():
                    await asyncio.shield(begin)
            except asyncio.CancelledError:
                # The BEGIN still runs in the writer's thread (it may wait for another process's lock). Let it
                # finish and undo it before the lock is released, or the next unit's BEGIN would fail inside
                # this abandoned transaction ("cannot start a transaction within a transaction").
                await _uncancellable(_undo(begin, writer))
                raise
            try:
                with busy_is_retryable():
                    yield WriteTransaction(writer)
            except BaseException:
                await _uncancellable(writer.rollback())
                raise
            with busy_is_retryable():
                await _uncancellable(writer.commit())
