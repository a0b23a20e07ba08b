"""A large request is stored in bounded write transactions (``proxy.engine.chunks``), each a valid state: a
prefix of the request's messages (their standing instructions are read later, in runs of their own: the ledger
is the same as if read in one); a failure between two leaves that prefix,
and the request sent again stores the rest, each message once. Structure, not time: the store's write units
are counted and their appends measured (``tests.support.engine.WriteLog``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from proxy.engine.chunks import ChunkBounds, chunk_end, stored_bytes
from proxy.engine.doctor import check_database
from proxy.engine.ingest import export_conversation
from proxy.engine.intercept import Interception
from proxy.engine.standing import reader
from proxy.store.location import Location
from proxy.store.records import NewMessage
from tests.support.engine import (
    InjectedCrash,
    WriteLog,
    assistant,
    elsewhere,
    open_engine,
    read_ledger,
    row_count,
    run,
    user,
)  # fmt: skip
from tests.support.rule_dense import rule_dense_request

BOUNDS = ChunkBounds(messages=6, bytes=3000)
SYSTEM = {"role": "system", "content": "You are helpful."}


def transcript() -> list[dict[str, Any]]:
    """12 rule-dense user messages of about 700 characters and their short answers (23 messages): every
    user message sets standing instructions, some replacing earlier ones."""
    return [SYSTEM, *rule_dense_request(12, size=700, seed=3)]


def plain() -> Interception:
    return Interception({}, [], [], [])


def new(text: str) -> tuple[Interception, NewMessage]:
    return plain(), NewMessage("user", text, None, None, None, text, 1, 1, "chain")


def test_chunk_end_stops_at_the_count_or_the_bytes_and_takes_at_least_one_message() -> None:
    prepared = {i: new("x" * 100) for i in range(10)}  # 200 bytes each: the JSON and the text
    assert chunk_end(ChunkBounds(messages=3, bytes=10_000), prepared, 0, 10) == 3
    assert chunk_end(ChunkBounds(messages=100, bytes=1000), prepared, 2, 10) == 7  # 5 × 200 bytes
    assert chunk_end(ChunkBounds(messages=100, bytes=10), prepared, 4, 10) == 5  # one message, whatever its size
    assert chunk_end(ChunkBounds(messages=100, bytes=10_000), prepared, 8, 10) == 10
    assert chunk_end(ChunkBounds(), prepared, 10, 10) == 10
    with pytest.raises(ValueError):
        ChunkBounds(messages=0)


async def ledger_of(store: Any, conversation_id: str) -> list[tuple[Any, ...]]:
    """The conversation's items, ids aside: what they say, where, and by which statement they were replaced."""
    items = await store.read.ledger(conversation_id, include_superseded=True)
    by_id = {item.id: item for item in items}
    return sorted(
        (i.seq, i.kind, i.slot, i.value, i.text, i.role, i.state, i.superseded_seq,
         by_id[i.superseded_by].text if i.superseded_by else None)
        for i in items
    )  # fmt: skip


async def ingest_in_one_unit(where: Location, messages: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The ledger the same transcript gets when it is stored in one transaction."""
    async with open_engine(where) as (ingestor, store, files):
        ingestor.chunks = ChunkBounds(messages=10_000, bytes=1 << 30)
        log = WriteLog(store)
        result = await ingestor.ingest("t", messages)
        assert len(log.appending) == 1
        await read_ledger(store, files, result.conversation_id)  # one run of 128 messages at most
        return await ledger_of(store, result.conversation_id)


def test_a_large_request_commits_in_bounded_units_with_the_ledger_of_one(
    where: Location, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    messages = transcript()

    async def scenario() -> None:
        async with open_engine(where) as (ingestor, store, files):
            ingestor.chunks = BOUNDS
            log = WriteLog(store)
            result = await ingestor.ingest("t", messages)
            assert (result.action, result.appended) == ("new", 23)
            units = log.appending
            assert len(units) >= 4
            seqs = []
            for unit in units:
                assert len(unit) == 1  # one append per unit
                first, appended = unit[0]
                assert 1 <= len(appended) <= BOUNDS.messages
                size = sum(stored_bytes(plain(), m) for m in appended)
                assert len(appended) == 1 or size <= BOUNDS.bytes
                seqs += range(first, first + len(appended))
            assert seqs == list(range(23))  # in order, each message once
            assert await export_conversation(store, files, "t", result.conversation_id) == messages
            assert await ledger_of(store, result.conversation_id) == []  # read after the response, not here
            with monkeypatch.context() as patched:
                patched.setattr(reader, "CHUNK", 5)  # read in runs of 5 messages, one transaction each
                await read_ledger(store, files, result.conversation_id)
            chunked = await ledger_of(store, result.conversation_id)
        assert chunked  # the messages did set standing instructions
        assert chunked == await ingest_in_one_unit(elsewhere(where, request), messages)

    run(scenario())


def test_a_failure_between_chunks_leaves_a_prefix_and_the_retry_stores_each_message_once(where: Location) -> None:
    messages = transcript()

    async def scenario() -> None:
        async with open_engine(where) as (ingestor, store, files):
            ingestor.chunks = BOUNDS
            await ingestor.ingest("t", messages[:3])  # a conversation to continue
            log = WriteLog(store, fail_at=3)  # the third chunk fails before its commit
            with pytest.raises(InjectedCrash):
                await ingestor.ingest("t", messages)
            kept = [seq for unit in log.appending for first, ms in unit for seq in range(first, first + len(ms))]
            assert kept == list(range(2, 2 + len(kept))) and len(kept) >= 2
            # A valid state: a prefix of the request, with the items of those messages only, doctor clean.
            (conversation,) = await store.read.conversations()
            assert conversation.message_count == 2 + len(kept) < 23
            assert await export_conversation(store, files, "t", conversation.id) == messages[: 3 + len(kept)]
            assert {item.seq for item in await store.read.ledger(conversation.id, True)} <= set(range(2 + len(kept)))
            assert await check_database(store, files) == []
            log.restore()

            again = await ingestor.ingest("t", messages)  # the client sends it again
            assert (again.conversation_id, again.action) == (conversation.id, "append")
            assert again.appended == 23 - conversation.message_count
            assert await row_count(store, "messages") == 23
            assert await export_conversation(store, files, "t", conversation.id) == messages
            await read_ledger(store, files, conversation.id)
            seqs = {item.seq for item in await store.read.ledger(conversation.id, True)}
            assert seqs and max(seqs) > 2 + len(kept)  # the rest's standing instructions were recorded too

    run(scenario())


def test_concurrent_copies_of_a_large_request_store_each_message_once(where: Location) -> None:
    """A client that retries while its first attempt is still being stored: the two interleave chunk by chunk,
    and every transaction decides again from what is stored."""
    messages = transcript()

    async def scenario() -> None:
        async with open_engine(where) as (ingestor, store, files):
            ingestor.chunks = ChunkBounds(messages=2, bytes=1 << 20)
            first, second = await asyncio.gather(ingestor.ingest("t", messages), ingestor.ingest("t", messages))
            assert first.conversation_id == second.conversation_id
            assert first.appended + second.appended == 23
            assert await row_count(store, "conversations") == 1
            assert await row_count(store, "messages") == 23
            assert await export_conversation(store, files, "t", first.conversation_id) == messages

    run(scenario())


def test_an_edited_history_forks_in_chunks_and_leaves_the_original_intact(where: Location) -> None:
    messages = transcript()

    async def scenario() -> None:
        async with open_engine(where) as (ingestor, store, files):
            ingestor.chunks = BOUNDS
            original = await ingestor.ingest("t", messages)
            edited = [*messages[:3], user("Actually, something else."), assistant("Sure."), *messages[3:]]
            edited[-1] = user("The last one, edited.")
            log = WriteLog(store)
            fork = await ingestor.ingest("t", edited)
            assert (fork.action, fork.forked_from) == ("fork", original.conversation_id)
            assert len(log.appending) > 1
            assert await export_conversation(store, files, "t", fork.conversation_id) == edited
            assert await export_conversation(store, files, "t", original.conversation_id) == messages

    run(scenario())


def test_between_two_chunks_the_event_loop_reads_nothing(where: Location, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between two chunks the next one's ledger is read through the store's reader off the event loop (SQLite's
    request-path reader, ``Store.read``, runs on the loop) and planned in a worker thread: from the first chunk's
    commit to the last one's, ``Store.read`` is not used at all."""
    messages = transcript()

    async def scenario() -> None:
        async with open_engine(where) as (ingestor, store, _):
            ingestor.chunks = BOUNDS
            await ingestor.ingest("t", messages[:3])  # a conversation with a ledger, continued in chunks
            events: list[str] = []
            loop_reader = type(store).read
            monkeypatch.setattr(type(store), "read", property(lambda s: Recorded(loop_reader.fget(s), events)))
            log = WriteLog(store)
            inner = store.write

            @contextlib.asynccontextmanager
            async def unit() -> AsyncIterator[Any]:
                async with inner() as tx:
                    yield tx
                events.append("unit")

            store.write = unit
            result = await ingestor.ingest("t", messages)
            assert result.appended == 21 and len(log.appending) >= 3
            first, last = events.index("unit"), len(events) - 1 - events[::-1].index("unit")
            assert events[first : last + 1] == ["unit"] * len(log.appending), events

    run(scenario())


class Recorded:
    """A store's reader whose every call is noted in ``events`` as "read"."""

    def __init__(self, reads: Any, events: list[str]) -> None:
        self._reads, self._events = reads, events

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._reads, name)
        if not callable(found):
            return found

        def call(*args: Any, **kwargs: Any) -> Any:
            self._events.append("read")
            return found(*args, **kwargs)

        return call
