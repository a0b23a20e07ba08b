"""Bounded write transactions at ingest: a request's new messages are stored in chunks, one transaction each.

There is one writer (SQLite serialises every writer of the database; PostgreSQL serialises the writers of one
conversation), and a transaction holds it for as long as its inserts take: the rows, their full-text index
(trigram FTS5 costs about a quarter of a millisecond per kilobyte here) and their payload files' rows (their
standing instructions are read later: ``proxy.engine.standing.reader``). One 1.2 MB request held it for
300 ms, and every other tenant's write waited. So the ingestor appends at most ``ChunkBounds.messages``
messages and about ``ChunkBounds.bytes`` bytes per transaction (always at least one message), and the writer
goes to whoever waits for it between two chunks.

Each chunk is a valid state on its own, as if the client had sent the request's transcript only up to there:
the conversation holds a prefix of the request's messages and the payload files they name. Each chunk's
transaction decides again where the transcript belongs (``locate_locked``), so a request that fails or is
cancelled between chunks leaves that prefix, and the same request sent again finds it and appends the rest,
each message once; a concurrent request on the same conversation meets it exactly as it would meet the
shorter request that the stored prefix is.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from proxy.engine.errors import ConversationBusy
from proxy.engine.identity import Action
from proxy.engine.intercept import Interception
from proxy.store.records import NewMessage

PAYLOAD_BYTES = 4096  # what a payload file's row and publication (a rename, a folder synced) count for
ATTEMPTS = 5  # write transactions of one chunk that find the conversation moved, before the request is a 409

Outcome = tuple[str, Action, int, str | None]  # conversation id, action, messages appended, forked from
Commit = Callable[[str | None], Awaitable[tuple[Outcome, int]]]  # one chunk's transaction: (outcome, its end)


@dataclass(frozen=True)
class ChunkBounds:
    """At most ``messages`` messages and about ``bytes`` bytes of stored text per write transaction (a message
    bigger than that alone is a chunk of its own)."""

    messages: int = 128
    bytes: int = 32 * 1024

    def __post_init__(self) -> None:
        if self.messages < 1 or self.bytes < 1:
            raise ValueError("a chunk holds at least one message")


def stored_bytes(interception: Interception, message: NewMessage) -> int:
    """What storing one prepared message writes, roughly: its JSON forms and text (each indexed or stored),
    and a fixed share per payload file it names."""
    forms = (message.original_json, message.forward_json, message.compact_json, message.text)
    return sum(len(form) for form in forms if form) + PAYLOAD_BYTES * len(interception.payloads)


def chunk_end(
    bounds: ChunkBounds, prepared: Mapping[int, tuple[Interception, NewMessage]], start: int, end: int
) -> int:
    """Where the chunk of messages [start, end) that begins at ``start`` ends: the longest run within
    ``bounds``, at least one message (a message not prepared yet counts for nothing: the transaction that
    finds it missing sends it back to be prepared, and the chunk is computed again)."""
    stop, size = start, 0
    while stop < end and stop - start < bounds.messages:
        found = prepared.get(stop)
        size += stored_bytes(*found) if found is not None else 0
        if size > bounds.bytes and stop > start:
            break
        stop += 1
    return stop


class NeedsPreparation(Exception):
    """A chunk's transaction found messages of the request not prepared yet (another request moved the
    conversation meanwhile): it rolls back, they are prepared outside the writer, and it runs again."""

    def __init__(self, indices: list[int]) -> None:
        self.indices = indices


async def store_in_chunks(
    commit: Commit,
    prepare: Callable[[int], Awaitable[Any]],
    end: int,
    expected: str | None,
) -> Outcome:
    """Store the request's new messages (up to ``end``) chunk by chunk: ``commit(expected)`` is one chunk's write
    transaction (it returns where its chunk ended). The outcome: the last chunk's
    conversation, the first chunk's action, all messages appended."""
    first: Outcome | None = None
    appended = 0
    while True:
        (conversation_id, action, count, forked_from), stop = await settle(functools.partial(commit, expected), prepare)
        appended += count
        first = first or (conversation_id, action, count, forked_from)
        forked_from = first[3] or forked_from
        if stop >= end:
            return conversation_id, first[1], appended, forked_from
        expected = conversation_id


async def settle(
    commit: Callable[[], Awaitable[tuple[Outcome, int]]],
    prepare: Callable[[int], Awaitable[Any]],
) -> tuple[Outcome, int]:
    """Run ``commit`` (one write transaction) until it finds every message it needs prepared;
    ``ConversationBusy`` after ``ATTEMPTS`` that found it moved."""
    attempts = 0
    while attempts < ATTEMPTS:
        attempts += 1
        try:
            # Shielded: a cancelled request must not abandon a half-written unit (see Store.write).
            return await asyncio.shield(commit())
        except NeedsPreparation as missing:
            # Another request moved the conversation meanwhile: prepare the extra messages outside the write
            # lock (interception may call the summarizer), then decide again.
            for i in missing.indices:
                await prepare(i)
    raise ConversationBusy("Other requests kept changing this conversation while this one was stored; send it again.")
