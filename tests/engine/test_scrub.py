"""The scrub after deletions (``proxy.engine.deletion.Scrubber``, ``Store.scrub``) and the rate limit of
``DELETE /lcm/conversations/{id}``: one tenant deleting must not stall every other tenant's writes.

* SQLite's scrub merges the full-text indexes in bounded steps and gives the writer back between them: a
  write queued while a scrub runs commits before the scrub ends (before: the whole merge held the writer,
  and the write waited for all of it).
* The server's deletions are scrubbed in the background, many deletions in one pass; the deletion itself is
  one transaction, after which nothing deleted is found; once the pass is done, nothing of it is in the files.
* ``DELETE`` is limited per key: a 429 in OpenAI's shape with Retry-After, another key unaffected.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from proxy.app import create_app
from proxy.config.lcm import LcmSettings
from proxy.engine.deletion import Deleter, Scrubber
from proxy.engine.engine import ContextEngine
from proxy.store.location import Location
from proxy.store.sqlite.store import SQLiteStore
from tests.support.deletion import BIG, SETTINGS, Echo, holding, turns
from tests.support.engine import rows, run
from tests.support.proxies import make_config

MARKER = "ZqScrubWombat4242"


async def populated(where: Location, conversations: int) -> tuple[ContextEngine, Any, Any, list[str]]:
    """A store with ``conversations`` conversations of tenant ``t`` (the first one holding ``MARKER``), each
    ingested in its own transactions: the full-text indexes hold many segments."""
    store, files = where.stores()
    await store.open()
    engine = ContextEngine(store, files, SETTINGS)
    ids = []
    for c in range(conversations):
        prepared = await engine.prepare("t", turns(3, f"Topic{c}", MARKER if c == 0 else ""), BIG, Echo())
        assert prepared.conversation_id is not None
        ids.append(prepared.conversation_id)
    return engine, store, files, ids


def test_sqlite_scrub_gives_the_writer_back_between_bounded_steps(tmp_path: Path, monkeypatch: Any) -> None:
    async def scenario() -> None:
        engine, store, files, ids = await populated(Location(tmp_path), 12)
        try:
            assert isinstance(store, SQLiteStore)
            store.scrub_pages = 2  # small steps, so that this small index takes several
            await Deleter(store, files).delete("t", ids[0], via="cli", scrub=False)
            assert holding(tmp_path, MARKER)  # the index pages still hold it: the scrub below has work to do

            # Every statement the writer connection runs, in order.
            writer = store._writer
            assert writer is not None
            executed: list[str] = []
            run_sql = writer.execute

            def logged(sql: str, *args: Any) -> Any:
                executed.append(sql)
                return run_sql(sql, *args)

            monkeypatch.setattr(writer, "execute", logged)

            async def another_tenants_write() -> None:
                async with store.write() as tx:
                    await tx.lock_conversation(ids[1])
                    await writer.execute("UPDATE conversations SET updated_at = updated_at WHERE id = 'marked'")

            scrubbing = asyncio.create_task(store.scrub())
            writing = asyncio.create_task(another_tenants_write())  # queued for the writer behind the scrub
            assert await asyncio.gather(scrubbing, writing) == [[], None]

            merges = [i for i, sql in enumerate(executed) if "'merge'" in sql or "'optimize'" in sql]
            wrote = next(i for i, sql in enumerate(executed) if "'marked'" in sql)
            assert len(merges) >= 3  # bounded steps, not one whole-index merge per index
            assert merges[0] < wrote < merges[-1]  # the other write went in between steps, not after them all
            assert not any("'optimize'" in sql for sql in executed)
            assert executed[-1] == "PRAGMA wal_checkpoint(TRUNCATE)"
            assert holding(tmp_path, MARKER) == []  # and the scrub, completed, left nothing of it
        finally:
            await engine.close()
            await store.close()

    run(scenario())


async def found(store: Any, word: str) -> list[Any]:
    """Rows the full-text index finds for ``word`` (SQLite's FTS5, PostgreSQL's tsvector column)."""
    if isinstance(store, SQLiteStore):
        return await rows(store, "SELECT rowid FROM messages_fts WHERE messages_fts MATCH ?", (word,))
    return await rows(store, "SELECT id FROM messages WHERE words::text LIKE ?", (f"%{word.lower()}%",))


def test_server_deletions_are_scrubbed_in_the_background_many_in_one_pass(where: Location) -> None:
    async def scenario() -> None:
        engine, store, files, ids = await populated(where, 6)
        try:
            assert await found(store, MARKER)
            scrubber = Scrubber(store)
            deleter = Deleter(store, files, scrubber)
            # The first pass waits at a gate until the other deletions are made: they come while it runs.
            gate, scrub, started = asyncio.Event(), store.scrub, []

            async def gated(*, full: bool = False) -> list[str]:
                started.append(full)
                await gate.wait()
                return await scrub(full=full)

            store.scrub = gated

            first = await deleter.delete("t", ids[0], via="api")
            # Committed: nothing deleted is found any more, while its scrub is still to run.
            assert (first.scrub, first.as_json()["scrub"], scrubber.status("t")["scrub"]) == ("pending",) * 3
            assert scrubber.status("another tenant") == {"scrub": "done"}  # nothing of theirs; nor a hint of t's
            assert await found(store, MARKER) == []
            others = [await deleter.delete("t", cid, via="api") for cid in ids[1:4]]
            assert started == [False]  # the first pass runs, and the deletions since did not start others
            gate.set()
            await scrubber.wait(max(d.ticket for d in others))

            assert scrubber.status("t") == scrubber.status() == {"scrub": "done"}
            assert scrubber.passes == 2  # four deletions: the first, the rest
            assert started == [False, False]
            if isinstance(store, SQLiteStore):
                assert holding(where.data_dir, MARKER) == []  # not in lcm.sqlite3, its -wal, nor any file
            else:
                async with store.pool.connection() as conn:
                    cursor = await conn.execute(
                        "SELECT relname FROM pg_stat_user_tables WHERE schemaname = 'lcm' AND last_vacuum IS NOT NULL"
                    )
                    vacuumed = {r[0] for r in await cursor.fetchall()}
                assert {"messages", "summaries", "files", "blobs", "conversations"} <= vacuumed
            await scrubber.stop()
        finally:
            await engine.close()
            await store.close()

    run(scenario())


def test_a_failed_scrub_stays_pending_and_is_retried(where: Location, caplog: pytest.LogCaptureFixture) -> None:
    """A pass whose ``Store.scrub`` raises does not count as done: the status stays "pending", the failure is a
    warning without content, and the pass is retried (after a backoff) until it succeeds."""

    async def scenario() -> None:
        engine, store, files, ids = await populated(where, 1)
        try:
            scrubber = Scrubber(store, retry_after=0.0)
            deleter = Deleter(store, files, scrubber)
            scrub, calls, retrying, gate = store.scrub, [], asyncio.Event(), asyncio.Event()

            async def failing_once(*, full: bool = False) -> list[str]:
                calls.append(full)
                if len(calls) == 1:
                    raise RuntimeError("disk I/O error")
                retrying.set()
                await gate.wait()
                return await scrub(full=full)

            store.scrub = failing_once
            deleted = await deleter.delete("t", ids[0], via="api")
            await asyncio.wait_for(retrying.wait(), 30)  # before the fix: never retried, so this times out
            # The first pass failed; the retry is under way: nothing is scrubbed yet, and the status says so.
            assert scrubber.status("t") == scrubber.status() == {"scrub": "pending"}
            assert scrubber.completed < deleted.ticket
            gate.set()
            await scrubber.wait(deleted.ticket)
            assert scrubber.status("t") == {"scrub": "done"} and len(calls) == 2
            warnings = [r for r in caplog.records if r.levelname == "WARNING" and "scrub" in r.getMessage()]
            assert warnings and all(MARKER not in r.getMessage() for r in warnings)
            if isinstance(store, SQLiteStore):
                assert holding(where.data_dir, MARKER) == []
            await scrubber.stop()
        finally:
            await engine.close()
            await store.close()

    run(scenario())


def test_stopping_does_not_wait_for_a_store_that_keeps_failing(where: Location) -> None:
    """``stop`` lets a pass under way finish, but does not wait out the retries of one that keeps failing."""

    async def scenario() -> None:
        engine, store, files, ids = await populated(where, 1)
        try:
            scrubber = Scrubber(store, retry_after=3600.0)
            failed = asyncio.Event()

            async def failing(*, full: bool = False) -> list[str]:
                failed.set()
                raise RuntimeError("disk I/O error")

            store.scrub = failing
            await Deleter(store, files, scrubber).delete("t", ids[0], via="api")
            await failed.wait()
            await asyncio.wait_for(scrubber.stop(), 30)
            assert scrubber.status() == {"scrub": "pending"}
        finally:
            await engine.close()
            await store.close()

    run(scenario())


ALICE_KEY, BOB_KEY = "sk-alice-0000000", "sk-bob-11111111"
KEYS = [{"key": ALICE_KEY, "tenant": "alice"}, {"key": BOB_KEY, "tenant": "bob"}]


def test_delete_is_rate_limited_per_key(upstream_url: str, tmp_path: Path) -> None:
    config = make_config(
        upstream_url, tmp_path / "data", {"delete_rate_per_minute": 1, "delete_burst": 2}, None, api_keys=KEYS
    )
    alice = {"authorization": f"Bearer {ALICE_KEY}"}
    bob = {"authorization": f"Bearer {BOB_KEY}"}
    with TestClient(create_app(config)) as client:
        unknown = "/lcm/conversations/conv_0123456789abcdef"
        assert [client.delete(unknown, headers=alice).status_code for _ in range(2)] == [404, 404]  # the burst

        limited = client.delete(unknown, headers=alice)

        assert limited.status_code == 429
        assert limited.json() == {
            "error": {
                "message": limited.json()["error"]["message"],
                "type": "requests",
                "param": None,
                "code": "rate_limit_exceeded",
            }
        }
        assert 1 <= int(limited.headers["retry-after"]) <= 60  # a token a minute
        assert client.delete(unknown, headers=bob).status_code == 404  # another key has its own bucket
        assert client.get("/lcm/scrub", headers=alice).json() == {"scrub": "done"}


def test_delete_limit_can_be_turned_off() -> None:
    assert LcmSettings().delete_rate_per_minute == 30.0
    assert LcmSettings(delete_rate_per_minute=None).delete_rate_per_minute is None
    with pytest.raises(ValueError):
        LcmSettings(delete_rate_per_minute=0)
