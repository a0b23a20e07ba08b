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
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import aiosqlite

from proxy.store.sqlite.connect import connect, connect_on_loop
from proxy.store.sqlite.delete import (
    CHECKPOINT_STEPS,
    FTS_TABLES,
    MAX_SCRUB_STEPS,
    SCRUB_PAGES,
    merge_step,
    truncate_wal,
    vacuum,
)
from proxy.store.sqlite.migrations import MIGRATIONS, apply_migrations
from proxy.store.sqlite.reads import Queries, busy_is_retryable
from proxy.store.sqlite.search import SQLiteSearches
from proxy.store.sqlite.writes import WriteTransaction

DB_NAME = "lcm.sqlite3"
BUSY_TIMEOUT_MS = 10_000  # how long a write waits for another process's write lock before it gives up


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
                    yield WriteTransaction(writer, Queries(self._loop_reader) if self._loop_reader else None)
            except BaseException:
                await _uncancellable(writer.rollback())
                raise
            with busy_is_retryable():
                await _uncancellable(writer.commit())
