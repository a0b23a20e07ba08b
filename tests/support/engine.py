"""Helpers for engine-level tests: a real store (SQLite in the test's own data directory, or PostgreSQL in a
database of the test's own: the ``where`` fixture runs a test on both)."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from proxy.engine.doctor import check_database
from proxy.engine.ingest import Ingestor, Thresholds
from proxy.engine.standing.reader import LedgerReader
from proxy.store.location import Location
from proxy.store.sqlite.store import SQLiteStore


class ScriptedSummarizer:
    """Counts calls; answers with a fixed, recognisable summary."""

    def __init__(self, answer: str = "A document about testing.") -> None:
        self.answer = answer
        self.calls = 0

    async def summarize_text(self, text: str, *, name: str, max_tokens: int) -> str:
        self.calls += 1
        return self.answer


def located(where: Path | Location) -> Location:
    return where if isinstance(where, Location) else Location(where)


def elsewhere(where: Location, request: pytest.FixtureRequest) -> Location:
    """A second, empty store of the same kind as ``where``: a data directory beside it, or a database of its
    own (dropped after the test with the others)."""
    if where.database_url is None:
        return Location(where.data_dir / "elsewhere")
    return Location(where.data_dir / "elsewhere", request.getfixturevalue("pg_database_factory")())


@contextlib.asynccontextmanager
async def open_engine(
    where: Path | Location, large: int = 25000, tool: int = 2000
) -> AsyncIterator[tuple[Ingestor, Any, Any]]:
    """An ingestor on a fresh store; yields (ingestor, store, payload store). The store is typed ``Any``: tests
    reach into either backend."""
    store, files = located(where).stores()
    await store.open()
    try:
        yield Ingestor(store, files, Thresholds(large, tool)), store, files
        # Every database a test creates must pass doctor.
        problems = await check_database(store, files)
        assert problems == [], f"doctor found problems: {problems}"
    finally:
        await store.close()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def read_ledger(store: Any, files: Any, conversation_id: str) -> None:
    """Read the conversation's messages for standing instructions, as the engine does after a response or
    before the ledger is used (``proxy.engine.standing.reader``): the ingestor alone stores messages only."""
    await LedgerReader(store, files).catch_up(conversation_id)


async def rows(store: Any, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
    """Run ``sql`` (SQLite's dialect: ``?`` placeholders, unqualified tables) on either store."""
    if isinstance(store, SQLiteStore):
        async with store.search_conn.execute(sql, args) as cursor:
            return list(await cursor.fetchall())
    translated = re.sub(r"\b(FROM|JOIN|INTO|UPDATE)\s+(?!lcm\.)(\w+)", r"\1 lcm.\2", sql).replace("?", "%s")
    async with store.pool.connection() as conn:
        cursor = await conn.execute(translated, args)
        return list(await cursor.fetchall()) if cursor.description else []


async def execute(store: Any, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
    """Change rows behind the engine's back (a tampered database), committed, on either store; the rows a
    ``RETURNING`` clause gives back."""
    if isinstance(store, SQLiteStore):
        async with store.search_conn.execute(sql, args) as cursor:
            returned = list(await cursor.fetchall())
        await store.search_conn.commit()
        return returned
    return await rows(store, sql, args)


async def row_count(store: Any, table: str, where: str = "", args: tuple[Any, ...] = ()) -> int:
    found = await rows(store, f"SELECT count(*) FROM {table} {where}", args)
    return int(found[0][0])


async def unreachable_messages(store: Any, conversation_id: str) -> set[int]:
    """Seqs of stored messages of the conversation that the active context does not reach through the summary
    DAG (on either store: it walks ``search.summary_sources``)."""
    conversation = await store.read.conversation(None, conversation_id)
    assert conversation is not None
    seqs = {m.seq for m in await store.read.messages(conversation_id)}
    reached = {seq for seq in seqs if seq >= conversation.summarized_upto}
    stack = [s.id for s in await store.read.context_summaries(conversation_id)]
    while stack:
        for _, child, seq in await store.search.summary_sources(stack.pop()):
            if child is not None:
                stack.append(child)
            elif seq is not None:
                reached.add(seq)
    return seqs - reached


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


class WriteLog:
    """What each write transaction of a store appended: one list of (first seq, messages) per committed unit,
    built by wrapping the store's ``write`` (as ``bench/ledger.py`` times it); ``fail_at``: the unit (counted
    from 1) that raises ``InjectedCrash`` after its appends, so that it rolls back."""

    def __init__(self, store: Any, fail_at: int | None = None) -> None:
        self.store = store
        self.units: list[list[tuple[int, list[Any]]]] = []
        self.fail_at = fail_at
        self._write = store.write
        store.write = self._unit

    def restore(self) -> None:
        self.store.write = self._write

    @contextlib.asynccontextmanager
    async def _unit(self) -> AsyncIterator[Any]:
        appended: list[tuple[int, list[Any]]] = []
        async with self._write() as tx:
            inner = tx.append_messages

            async def append_messages(conversation_id: str, first_seq: int, messages: Any) -> None:
                appended.append((first_seq, list(messages)))
                await inner(conversation_id, first_seq, messages)

            tx.append_messages = append_messages
            yield tx
            if appended and self.fail_at is not None and len(self.appending) + 1 == self.fail_at:
                raise InjectedCrash(f"write unit {self.fail_at} failed before its commit")
        self.units.append(appended)

    @property
    def appending(self) -> list[list[tuple[int, list[Any]]]]:
        """The committed units that appended messages."""
        return [unit for unit in self.units if unit]


class InjectedCrash(Exception):
    """An exception a test injects into a write unit (a crash between two chunks of one request)."""
