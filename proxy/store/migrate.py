"""``lcm-proxy migrate --to postgresql://...``: copy an SQLite store, payload files included, into PostgreSQL.

Every id is kept as it is (conversations, messages, summaries and their row numbers, files), so each link
(summary sources, message files, context items, forks) means the same in the target; the sequences are then
moved past the copied ids, so rows the proxy writes later never collide with them.

Resumable without a progress file: every run walks every table in the source's order (parents before the
conversations forked from them, every other table by rowid) in batches, each inserted by one PostgreSQL
transaction with ``ON CONFLICT DO NOTHING``. A killed run leaves whole batches behind; the next run inserts what
is missing and compares each row already there with the source. A row that differs (the target holds another
store's data, or the source changed since the interrupted run) stops the run before its batch commits: nothing
in the target is ever overwritten.

The source is read in one SQLite read transaction: a consistent snapshot even while a proxy writes. A resumed
run reads a later state, though, so stop the proxy first. Payloads are read from the data directory, checked
against their ``files.sha256`` and stored in ``lcm.blobs`` under the same path; one that is missing or corrupt
is reported (exit status 1) and the others are still copied.
"""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import sys
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import psycopg

from proxy.store.errors import StoreBusy, UnsafePathError
from proxy.store.files import FileStore
from proxy.store.postgres.reads import text_safe
from proxy.store.postgres.store import PostgresStore, redacted
from proxy.store.postgres.words import tsvector
from proxy.store.sqlite.store import DB_NAME, SQLiteStore

BATCH_ROWS = 500  # rows per transaction (and at most 65,535 parameters per statement: 14 columns x 500 is far below)
BATCH_BYTES = 8 << 20  # text or payload bytes per transaction, whatever the row count
CONNECT_TIMEOUT = 10  # seconds
PAYLOADS = "payloads"  # lcm.blobs: the contents of the files rows
Row = tuple[Any, ...]


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[str, ...]  # the same in both schemas; never PostgreSQL's generated ``words``
    key: tuple[str, ...]  # the source's primary key
    words: str | None = None  # the column PostgreSQL's full-text ``words`` are folded from (SQLite has FTS tables)

    def key_of(self, row: Sequence[Any]) -> Row:
        return tuple(row[self.columns.index(k)] for k in self.key)


def _table(name: str, columns: str, key: str, words: str | None = None) -> Table:
    return Table(name, tuple(columns.split()), tuple(key.split()), words)


# In an order that satisfies the target's foreign keys. compaction_leases are not copied: they belong to
# the processes running now.
TABLES = (
    _table(
        "conversations",
        "id tenant external_key parent_id fork_seq instructions_json message_count token_count created_at"
        " updated_at summarized_upto stubbed_upto last_model deleted_at dialect continued linked_to ledger_upto",
        "id",
    ),
    _table(
        "messages",
        "id conversation_id seq role original_json payload_paths forward_json compact_json text token_count"
        " sent_token_count chain_hash created_at compact_token_count cum_tokens cum_sent_tokens cum_compact_tokens",
        "id",
        "text",
    ),
    _table("files", "id tenant conversation_id name mime kind bytes sha256 path exploration created_at", "id"),
    _table("message_files", "message_id file_id", "message_id file_id"),
    _table(
        "summaries",
        "pk id conversation_id kind depth start_seq end_seq content token_count source_token_count earliest_at"
        " latest_at descendant_count file_ids summarizer_model escalation created_at",
        "pk",
        "content",
    ),
    _table("summary_sources", "summary_id ordinal message_id child_summary_id", "summary_id ordinal"),
    _table("context_items", "conversation_id ordinal summary_id", "conversation_id ordinal"),
    _table("last_sent", "conversation_id sent_json updated_at", "conversation_id"),
    _table("relayed_answers", "conversation_id seq created_at", "conversation_id"),
    _table(
        "ledger_items",
        "id conversation_id kind slot value text seq message_id role created_at superseded_seq superseded_by state",
        "id",
    ),
)
SERIALS = (("messages", "id"), ("summaries", "pk"))


class Progress:
    """One bar per table on a terminal; a line per table otherwise (a log keeps no carriage returns)."""

    WIDTH = 30

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream
        self.tty = stream is not None and stream.isatty()
        self.name, self.total, self.done = "", 0, 0

    def start(self, name: str, total: int) -> None:
        self.name, self.total, self.done = name, total, 0
        self._draw()

    def advance(self, rows: int) -> None:
        self.done += rows
        self._draw()

    def finish(self) -> None:
        if self.stream is None:
            return
        if self.tty:
            self.stream.write("\n")
        else:
            self.stream.write(f"migrate: {self.name}: {self.done}/{self.total}\n")
        self.stream.flush()

    def _draw(self) -> None:
        if self.stream is None or not self.tty:
            return
        filled = self.WIDTH * self.done // self.total if self.total else self.WIDTH
        bar = "#" * filled + "." * (self.WIDTH - filled)
        self.stream.write(f"\r{self.name:<16} [{bar}] {self.done}/{self.total}")
        self.stream.flush()


class MigrateError(Exception):
    """The run stopped; nothing of the batch in hand was written (the message says why)."""


@dataclass
class Outcome:
    source: dict[str, int] = field(default_factory=dict)
    target: dict[str, int] = field(default_factory=dict)
    copied: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # payloads that could not be copied

    def mismatches(self) -> list[str]:
        return [
            f"{name}: {count} in SQLite, {self.target.get(name, 0)} in PostgreSQL"
            for name, count in self.source.items()
            if self.target.get(name) != count
        ]


def _batches(rows: Iterable[Row], max_rows: int, max_bytes: int) -> Iterator[list[Row]]:
    batch: list[Row] = []
    size = 0
    for row in rows:
        batch.append(row)
        size += sum(len(v) for v in row if isinstance(v, str | bytes))
        if len(batch) >= max_rows or size >= max_bytes:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _parents_first(parents: dict[str, str | None]) -> list[str]:
    """Conversation ids, each after the conversation it was forked from (the target checks parent_id)."""
    depth: dict[str, int] = {}
    for start in parents:
        chain: list[str] = []
        node: str | None = start
        while node is not None and node not in depth and node in parents:
            chain.append(node)
            if len(chain) > len(parents):
                raise MigrateError(f"conversation {start}: its parent links form a cycle")
            node = parents[node]
        level = depth.get(node, -1) if node is not None else -1
        for item in reversed(chain):
            level += 1
            depth[item] = level
    return sorted(parents, key=lambda c: (depth[c], c))


class Migration:
    def __init__(
        self,
        data_dir: Path,
        url: str,
        *,
        batch_rows: int = BATCH_ROWS,
        batch_bytes: int = BATCH_BYTES,
        progress: Progress | None = None,
        after_batch: Callable[[str, int], None] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.url = url
        self.batch_rows = batch_rows
        self.batch_bytes = batch_bytes
        self.progress = progress or Progress(None)
        self.after_batch = after_batch  # (table, rows done so far) after each committed batch: tests stop here
        self.outcome = Outcome()

    async def run(self) -> Outcome:
        source = SQLiteStore(self.data_dir)
        await source.open()  # brings an older store's schema up to date, as every operator command does
        await source.close()
        db = sqlite3.connect((self.data_dir / DB_NAME).resolve().as_uri() + "?mode=ro", uri=True, isolation_level=None)
        target = PostgresStore(self.url, pool_size=2)
        try:
            db.execute("BEGIN")  # one snapshot for the whole run
            parents = dict(db.execute("SELECT id, parent_id FROM conversations").fetchall())
            # Fails at once with the server's own reason, where the pool would retry for its timeout.
            probe = await psycopg.AsyncConnection.connect(self.url, connect_timeout=CONNECT_TIMEOUT)
            await probe.close()
            await target.open()  # applies the schema
            await self._refuse_foreign(target, set(parents))
            for table in TABLES:
                total = db.execute(f"SELECT count(*) FROM {table.name}").fetchone()[0]
                rows = self._rows(db, table, parents)
                try:
                    await self._copy(target, table, total, rows)
                finally:
                    rows.close()  # its cursor, while the connection is still open
                if table.name == "files":
                    await self._copy_payloads(target, db)
            async with target.pool.connection() as conn:
                for name, column in SERIALS:
                    await conn.execute(
                        f"SELECT setval(pg_get_serial_sequence('lcm.{name}', '{column}'), max({column}))"
                        f" FROM lcm.{name} HAVING max({column}) IS NOT NULL"
                    )
                for table in TABLES:
                    self.outcome.source[table.name] = db.execute(f"SELECT count(*) FROM {table.name}").fetchone()[0]
                    cursor = await conn.execute(f"SELECT count(*) FROM lcm.{table.name}")
                    self.outcome.target[table.name] = (await cursor.fetchone() or (0,))[0]
                self.outcome.source[PAYLOADS] = db.execute("SELECT count(DISTINCT path) FROM files").fetchone()[0]
                cursor = await conn.execute("SELECT count(*) FROM lcm.blobs")
                self.outcome.target[PAYLOADS] = (await cursor.fetchone() or (0,))[0]
        finally:
            db.close()
            await target.close()
        return self.outcome

    async def _refuse_foreign(self, target: PostgresStore, source_ids: set[str]) -> None:
        """A database that already holds other conversations is not a place to copy into: message ids and
        summary row numbers would collide with its own."""
        async with target.pool.connection() as conn:
            cursor = await conn.execute("SELECT id FROM lcm.conversations")
            async for (conversation_id,) in cursor:
                if conversation_id not in source_ids:
                    raise MigrateError(
                        f"the target already holds conversation {conversation_id}, which this SQLite store does not:"
                        " migrate into an empty database (or one an earlier run of this migration filled)"
                    )

    def _rows(self, db: sqlite3.Connection, table: Table, parents: dict[str, str | None]) -> Generator[Row, None, None]:
        columns = ", ".join(table.columns)
        if table.name != "conversations":
            yield from db.execute(f"SELECT {columns} FROM {table.name} ORDER BY rowid")
            return
        order = _parents_first(parents)
        for start in range(0, len(order), BATCH_ROWS):
            ids = order[start : start + BATCH_ROWS]
            marks = ", ".join("?" * len(ids))
            found = {r[0]: r for r in db.execute(f"SELECT {columns} FROM conversations WHERE id IN ({marks})", ids)}
            yield from (found[i] for i in ids)

    async def _copy(self, target: PostgresStore, table: Table, total: int, rows: Iterable[Row]) -> None:
        self.progress.start(table.name, total)
        copied = done = 0
        columns = ", ".join(table.columns) + (", words" if table.words else "")
        one = "(" + ", ".join(["%s"] * len(table.columns) + (["%s::tsvector"] if table.words else [])) + ")"
        for read in _batches(rows, self.batch_rows, self.batch_bytes):
            batch = [tuple(text_safe(row)) for row in read]  # NUL as the PostgreSQL store writes it
            values = [[*row, tsvector(row[table.columns.index(table.words)])] if table.words else row for row in batch]
            async with target.pool.connection() as conn, conn.transaction():
                cursor = await conn.execute(
                    f"INSERT INTO lcm.{table.name} ({columns}) VALUES {', '.join([one] * len(batch))}"
                    f" ON CONFLICT DO NOTHING RETURNING {', '.join(table.key)}",
                    [value for row in values for value in row],
                )
                inserted = {tuple(r) for r in await cursor.fetchall()}
                there = [row for row in batch if table.key_of(row) not in inserted]
                if there:
                    await self._compare(conn, table, there)
            copied += len(inserted)
            done += len(batch)
            self.progress.advance(len(batch))
            if self.after_batch is not None:
                self.after_batch(table.name, done)
        self.progress.finish()
        self.outcome.copied[table.name] = copied

    async def _compare(self, conn: Any, table: Table, rows: list[Row]) -> None:
        """Rows the insert skipped must be in the target exactly as in the source."""
        first = table.key[0]
        cursor = await conn.execute(
            f"SELECT {', '.join(table.columns)} FROM lcm.{table.name} WHERE {first} = ANY(%s)",
            ([table.key_of(r)[0] for r in rows],),
        )
        stored = {table.key_of(r): tuple(r) for r in await cursor.fetchall()}
        for row in rows:
            key = ", ".join(map(str, table.key_of(row)))
            found = stored.get(table.key_of(row))
            if found is None:
                raise MigrateError(f"{table.name} ({key}): another row of the target holds one of its unique values")
            differ = [c for c, a, b in zip(table.columns, row, found, strict=True) if a != b]
            if differ:
                raise MigrateError(
                    f"{table.name} ({key}): the target holds other data ({', '.join(differ)}); nothing was"
                    " overwritten. The target holds another store's data, or the source changed since an earlier"
                    " run (stop the proxy before migrating)"
                )

    async def _copy_payloads(self, target: PostgresStore, db: sqlite3.Connection) -> None:
        files = FileStore(self.data_dir)
        wanted = db.execute("SELECT path, min(sha256), min(id) FROM files GROUP BY path ORDER BY path").fetchall()
        self.progress.start(PAYLOADS, len(wanted))
        copied = 0
        for start in range(0, len(wanted), self.batch_rows):
            chunk = wanted[start : start + self.batch_rows]
            async with target.pool.connection() as conn:
                cursor = await conn.execute(
                    "SELECT path, encode(sha256(content), 'hex') FROM lcm.blobs WHERE path = ANY(%s)",
                    ([path for path, _, _ in chunk],),
                )
                stored: dict[str, str] = dict(await cursor.fetchall())
            for batch in _batches(self._unstored(files, chunk, stored), self.batch_rows, self.batch_bytes):
                async with target.pool.connection() as conn, conn.transaction():
                    marks = ", ".join(["(%s, %s)"] * len(batch))
                    cursor = await conn.execute(
                        f"INSERT INTO lcm.blobs (path, content) VALUES {marks} ON CONFLICT DO NOTHING RETURNING path",
                        [value for row in batch for value in row],
                    )
                    copied += len(await cursor.fetchall())
            self.progress.advance(len(chunk))
            if self.after_batch is not None:
                self.after_batch(PAYLOADS, start + len(chunk))
        self.progress.finish()
        self.outcome.copied[PAYLOADS] = copied

    def _unstored(self, files: FileStore, chunk: list[Row], stored: dict[str, str]) -> Iterator[Row]:
        """(path, content) of the payloads of ``chunk`` the target lacks, read as the batches take them (at
        most one batch in memory)."""
        for path, sha, file_id in chunk:
            if path in stored:
                if stored[path] != sha:
                    raise MigrateError(f"payload {path} ({file_id}): the target holds other content")
                continue
            content = self._payload(files, path, sha, file_id)
            if content is not None:
                yield path, content

    def _payload(self, files: FileStore, path: str, sha: str, file_id: str) -> bytes | None:
        try:
            content = files.read(path)
        except (UnsafePathError, OSError) as error:
            reason = getattr(error, "strerror", None) or str(error)
            self.outcome.problems.append(f"{file_id}: payload {path} cannot be read ({reason}); not copied")
            return None
        if hashlib.sha256(content).hexdigest() != sha:
            self.outcome.problems.append(f"{file_id}: payload {path} does not match its sha256; not copied")
            return None
        return content


def report(outcome: Outcome, where: str, out: TextIO) -> int:
    """The counts on both sides and what went wrong; the exit status (1 if anything differs)."""
    print(f"{'table':<18}{'sqlite':>10}{'postgresql':>12}{'copied now':>12}", file=out)
    for name, count in outcome.source.items():
        row = f"{name:<18}{count:>10}{outcome.target.get(name, 0):>12}{outcome.copied.get(name, 0):>12}"
        print(row, file=out)
    problems = outcome.problems + outcome.mismatches()
    for problem in problems:
        print(f"problem: {problem}", file=out)
    print(f"{where}: {'OK' if not problems else f'{len(problems)} problem(s)'}", file=out)
    return 1 if problems else 0


def run_migrate(data_dir: Path, url: str, *, batch_rows: int = BATCH_ROWS) -> int:

    where = redacted(url)
    migration = Migration(data_dir, url, batch_rows=batch_rows, progress=Progress(sys.stderr))
    try:
        outcome = asyncio.run(migration.run())
    except MigrateError as error:
        print(f"lcm-proxy migrate: refused: {error}", file=sys.stderr)
        return 1
    except (psycopg.Error, StoreBusy) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"lcm-proxy migrate: {where}: {first} (run the same command again to resume)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("lcm-proxy migrate: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    return report(outcome, where, sys.stdout)
