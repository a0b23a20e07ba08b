"""The PostgreSQL store as several replicas use it: two stores (two connection pools, as two replicas have) on
one real database, racing on the same conversations; payloads one replica stored, read by another; locks that
end with their transaction; driver errors as a retryable 503."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from proxy.engine.answers import record_answer
from proxy.engine.canonical import chain_hashes
from proxy.engine.ingest import Ingestor, Thresholds, export_conversation
from proxy.store.base import Phrase
from proxy.store.errors import StoreBusy
from proxy.store.location import Location
from proxy.store.postgres import store as postgres
from proxy.store.postgres.migrations import MIGRATIONS
from proxy.store.postgres.search import PostgresSearches
from proxy.store.postgres.store import PostgresBlobs, PostgresStore
from proxy.store.records import NewMessage
from proxy.wire.http import to_proxy_error
from tests.support.engine import assistant, row_count, rows, run, user


@contextlib.asynccontextmanager
async def replicas(dsn: str, count: int = 2) -> AsyncIterator[list[tuple[Ingestor, PostgresStore, PostgresBlobs]]]:
    opened: list[tuple[Ingestor, PostgresStore, PostgresBlobs]] = []
    try:
        for _ in range(count):
            store = PostgresStore(dsn)
            await store.open()
            blobs = PostgresBlobs(store)
            opened.append((Ingestor(store, blobs, Thresholds(25000, 2000)), store, blobs))
        yield opened
    finally:
        for _, store, _ in opened:
            await store.close()


def test_identical_first_requests_on_two_replicas_create_one_conversation(pg_dsn: str) -> None:
    async def scenario() -> None:
        async with replicas(pg_dsn) as pair:
            transcript = [user("the very first message"), assistant("an answer"), user("a question")]
            results = await asyncio.gather(*(pair[i % 2][0].ingest("t", transcript) for i in range(12)))
            assert len({r.conversation_id for r in results}) == 1
            assert sorted(r.action for r in results) == ["new"] + ["same"] * 11
            store = pair[0][1]
            assert await row_count(store, "conversations") == 1
            assert await row_count(store, "messages") == 3

    run(scenario())


def test_concurrent_continuations_on_two_replicas_append_once_and_fork_once(pg_dsn: str) -> None:
    async def scenario() -> None:
        async with replicas(pg_dsn) as pair:
            opening = [user("opening"), assistant("hello")]
            first = await pair[0][0].ingest("t", opening)
            same = [*opening, user("same continuation")]
            other = [*opening, user("another branch")]
            requests = [same] * 6 + [other] * 6
            results = await asyncio.gather(*(pair[i % 2][0].ingest("t", t) for i, t in enumerate(requests)))
            for branch in (same, other):
                ids = {r.conversation_id for r, t in zip(results, requests, strict=True) if t is branch}
                assert len(ids) == 1  # each branch landed in one conversation
            actions = sorted(r.action for r in results)
            assert actions.count("append") == 1 and actions.count("fork") == 1, actions
            store = pair[0][1]
            assert await row_count(store, "conversations") == 2
            assert await row_count(store, "messages") == 3 + 3  # the fork holds its own copy of the prefix
            for result, transcript in zip(results, requests, strict=True):
                assert await export_conversation(store, pair[0][2], "t", result.conversation_id or "") == transcript
            assert first.conversation_id in {r.conversation_id for r in results}

    run(scenario())


def test_a_payload_stored_by_one_replica_is_read_by_another(pg_dsn: str, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with replicas(pg_dsn) as pair:
            document = "".join(f"line {i}: the quick brown fox\n" for i in range(12000))  # far over the threshold
            message = user(f'<file name="notes.txt">\n{document}</file>\nsummarise it')
            stored = await pair[0][0].ingest("t", [message])
            assert stored.messages[-1] != message  # forwarded as a stub
            assert await export_conversation(pair[1][1], pair[1][2], "t", stored.conversation_id or "") == [message]
            assert not any(tmp_path.iterdir())  # no replica's disk holds anything
            (path,) = [r[0] for r in await rows(pair[1][1], "SELECT path FROM files")]
            assert document.encode() in await pair[1][2].load(path)

    run(scenario())


def advisory_locks(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone()
    assert row is not None
    return int(row[0])


def test_locks_end_with_their_transaction(pg_dsn: str) -> None:
    async def scenario() -> None:
        async with replicas(pg_dsn, 1) as (single,):
            ingestor, store, _ = single
            await ingestor.ingest("t", [user("one")])
            async with store.write() as tx:
                await tx.lock_identity("t", "k")
                await tx.lock_conversation("conv_x")
                assert advisory_locks(pg_dsn) == 2  # seen from another connection while the transaction runs
            assert advisory_locks(pg_dsn) == 0

    run(scenario())


def test_a_lost_connection_is_a_retryable_503(pg_dsn: str) -> None:
    async def scenario() -> None:
        async with replicas(pg_dsn, 1) as (single,):
            _, store, _ = single
            with pytest.raises(StoreBusy) as info:
                async with store.write() as tx:
                    await tx.touch("conv_none")
                    with psycopg.connect(pg_dsn, autocommit=True) as admin:  # the server ends the session
                        admin.execute(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                        )
                    await tx.touch("conv_none")
            reported = to_proxy_error(info.value)
            assert (reported.status, reported.code) == (503, "store_busy")
            assert await store.read.conversations() == []  # the pool replaced the lost connections

    run(scenario())


def test_the_schema_is_applied_once_by_replicas_starting_together(pg_dsn: str) -> None:
    async def scenario() -> None:
        stores = [PostgresStore(pg_dsn) for _ in range(4)]
        await asyncio.gather(*(s.open() for s in stores))
        try:
            applied = await rows(stores[0], "SELECT name FROM lcm.migrations")
            assert [r[0] for r in applied] == [name for name, _ in MIGRATIONS]  # each one once
            assert await stores[1].integrity() == []
        finally:
            for s in stores:
                await s.close()

    run(scenario())


def test_a_postgres_location_keeps_nothing_on_disk(pg_dsn: str, tmp_path: Path) -> None:
    location = Location(tmp_path / "unused", pg_dsn)
    store, blobs = location.stores()
    assert (store.kind, type(blobs).__name__) == ("postgresql", "PostgresBlobs")
    assert "@" not in location.describe() or ":" not in location.describe().split("@")[0].split("//")[1]
    assert not (tmp_path / "unused").exists()


async def waiting_for_a_lock(dsn: str) -> None:
    """Until some session waits for an advisory lock (a condition, polled: not a fixed sleep)."""
    query = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    for _ in range(2000):
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            row = await (await conn.execute(query)).fetchone()
        if row is not None and row[0] > 0:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("nobody waited for the conversation's lock")


def test_a_replica_deciding_on_a_conversation_waits_for_another_replica_writing_it(pg_dsn: str) -> None:
    """Replica B stores the answer it relayed for [q1] while replica A holds the conversation's lock and appends
    the client's next turn: B waits, then sees the conversation moved on and stores nothing (the client's
    request already carried the answer). Without the lock B would decide on what it read before A's commit."""

    async def scenario() -> None:
        async with replicas(pg_dsn) as pair:
            (a, store_a, _), (b, _, _) = pair
            first = await a.ingest("t", [user("q1")])
            cid = first.conversation_id or ""
            async with store_a.write() as tx:
                await tx.lock_conversation(cid)
                late = asyncio.create_task(record_answer(b, "t", cid, 1, first.tip_chain, assistant("a1"), 1.0))
                await waiting_for_a_lock(pg_dsn)
                assert not late.done()
                theirs = assistant("the client's own a1")
                chain = chain_hashes("t", [user("q1"), theirs])[-1]
                record = NewMessage("assistant", orjson.dumps(theirs).decode(), None, None, None, "a1", 5, 5, chain)
                await tx.append_messages(cid, 1, [record])
            assert await late is False
            (conversation,) = await store_a.read.conversations()
            assert conversation.message_count == 2

    run(scenario())


def test_a_word_at_postgresqls_length_limit_is_stored_and_searched(pg_dsn: str) -> None:
    """PostgreSQL refuses words over 2046 bytes in a tsvector: such words are left out of the index (as SQLite's
    tokenizer keeps them), never a 503 that no retry gets past."""

    async def scenario() -> None:
        async with replicas(pg_dsn, 1) as ((ingestor, store, _),):
            for size in (2046, 2047, 2048, 5000):
                word = "ab" * (size // 2) + "c" * (size % 2)
                result = await ingestor.ingest("t", [user(f"marker{size} {word}")])
                assert result.action == "new"
                hits = await store.search.search_messages(result.conversation_id or "", [Phrase((word,))], 9, 5)
                assert [h[1] for h in hits] == ([0] if size <= 2046 else [])
                found = await store.search.search_messages(
                    result.conversation_id or "", [Phrase((f"marker{size}",))], 9, 5
                )
                assert [h[1] for h in found] == [0]

    run(scenario())


def test_full_text_ranking_counts_each_terms_documents_once(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rarity weights of a search are computed once per term, not once per matching message (a plan that
    recomputed them was quadratic in the conversation's length and timed out past ~1,500 messages)."""
    issued: list[tuple[str, Sequence[Any]]] = []
    original = PostgresSearches._search_all

    async def capture(self: PostgresSearches, sql: str, args: Sequence[Any]) -> list[Any]:
        issued.append((sql, args))
        return await original(self, sql, args)

    monkeypatch.setattr(PostgresSearches, "_search_all", capture)

    async def scenario() -> None:
        async with replicas(pg_dsn, 1) as ((ingestor, store, _),):
            transcript = [user(f"error number {i} in the login service") for i in range(60)]
            result = await ingestor.ingest("t", transcript)
            await store.search.search_messages(result.conversation_id or "", [Phrase(("error",))], 60, 40)
            sql, args = issued[-1]
            async with store.pool.connection() as conn:
                cursor = await conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, args)
                plan = json.dumps((await cursor.fetchone())[0])  # type: ignore[index]
            loops = [
                node["Actual Loops"]
                for node in _nodes(json.loads(plan)[0]["Plan"])
                if "hits" in str(node.get("CTE Name", ""))
            ]
            assert loops and max(loops) <= 2, loops  # the hits are scanned per term, not per hit

    run(scenario())


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(n for child in node.get("Plans", []) for n in _nodes(child))]


def test_a_writer_waiting_too_long_for_a_conversations_lock_gets_a_retryable_503(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica that froze holding a conversation's lock costs the others a 503 after the lock timeout, not every
    pooled connection."""
    monkeypatch.setattr(postgres, "LOCK_TIMEOUT_MS", 300)

    async def scenario() -> None:
        async with replicas(pg_dsn) as ((a, store_a, _), (_, store_b, _)):
            first = await a.ingest("t", [user("q1")])
            cid = first.conversation_id or ""
            async with store_a.write() as held:
                await held.lock_conversation(cid)
                with pytest.raises(StoreBusy):
                    async with store_b.write() as waiting:
                        await waiting.lock_conversation(cid)
            assert await store_b.read.conversation("t", cid) is not None  # replica b still serves

    run(scenario())


def test_a_role_that_cannot_create_schemas_starts_once_the_schema_is_there(pg_dsn: str) -> None:
    """Least privilege: the proxy's role may use the lcm schema without the right to create one."""
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute("DROP ROLE IF EXISTS lcm_app")
        admin.execute("CREATE ROLE lcm_app LOGIN")
        name = admin.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        admin.execute(f'REVOKE CREATE ON DATABASE "{name}" FROM PUBLIC')

    async def scenario() -> None:
        owner = PostgresStore(pg_dsn)
        await owner.open()  # the migration, by a role that may create the schema
        await owner.close()
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute("GRANT USAGE ON SCHEMA lcm TO lcm_app")
            admin.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA lcm TO lcm_app")
            admin.execute("GRANT USAGE ON ALL SEQUENCES IN SCHEMA lcm TO lcm_app")
        app_dsn = psycopg.conninfo.make_conninfo(pg_dsn, user="lcm_app")
        async with replicas(app_dsn, 1) as ((ingestor, _, _),):
            assert (await ingestor.ingest("t", [user("hello")])).action == "new"

    try:
        run(scenario())
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute("DROP OWNED BY lcm_app")
            admin.execute("DROP ROLE lcm_app")
