"""How the SQLite store's connections are opened: WAL (switched once, waiting out other processes), the busy
timeout, and the pragmas every connection carries."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path

import aiosqlite

from proxy.store.sqlite.reads import is_busy

PRAGMAS = (
    "PRAGMA synchronous=NORMAL",  # WAL + NORMAL: durable across process crashes, no fsync per commit
    "PRAGMA foreign_keys=ON",
    "PRAGMA secure_delete=ON",  # deleted content is zeroed, never left in free space (``sqlite_delete``)
)


async def _switch_to_wal(conn: aiosqlite.Connection, busy_timeout_ms: int) -> None:
    """``PRAGMA journal_mode=WAL``, waiting out other processes doing the same. On a new file, connections of
    several processes (``--workers``) switching it at once get "database is locked" at once: SQLite skips the
    busy handler where waiting could deadlock (a shared lock upgrading to exclusive). It is retried here, up to
    the busy timeout, as the busy handler would have waited."""
    deadline = time.monotonic() + busy_timeout_ms / 1000
    while True:
        try:
            await conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if not is_busy(error) or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.01)


async def connect(path: Path, busy_timeout_ms: int) -> aiosqlite.Connection:
    """A connection in its own thread, waiting at most ``busy_timeout_ms`` for another process's lock."""
    conn = aiosqlite.connect(path, isolation_level=None)  # we issue BEGIN/COMMIT ourselves
    # aiosqlite's worker thread is not a daemon: a store left open (a crashed lifespan, a failed test holding
    # it in a traceback) kept the interpreter from ever exiting. A daemon thread dies with the process; SQLite
    # rolls back whatever transaction it had open, so the file stays consistent. (Before aiosqlite 0.20 the
    # connection object was itself the thread.)
    worker: threading.Thread = getattr(conn, "_thread", None) or conn  # type: ignore[assignment]
    worker.daemon = True
    await conn
    await conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
    await _switch_to_wal(conn, busy_timeout_ms)
    for pragma in PRAGMAS:
        await conn.execute(pragma)
    return conn


def connect_on_loop(path: Path) -> sqlite3.Connection:
    """The request path's reader, on the event loop itself (``sqlite`` says why)."""
    conn = sqlite3.connect(path, isolation_level=None)
    for pragma in ("PRAGMA journal_mode=WAL", *PRAGMAS):  # open() switched the file to WAL already: no wait
        conn.execute(pragma)
    # A WAL reader only waits during another connection's recovery; never stall the loop for long.
    conn.execute("PRAGMA busy_timeout=2000")
    conn.execute("PRAGMA query_only=ON")
    return conn
