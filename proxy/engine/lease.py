"""Compaction leases: one sweep of a conversation at a time, across every process on the same database.

In one process the engine keeps one sweep task per conversation; several workers (``serve --workers N``) and
the operator's ``lcm-proxy compact`` are separate processes, so the database is where they meet. Before a
sweep reads the state it works from, it takes its conversation's lease in a write transaction; it renews
the lease while it runs and deletes it when done. A sweep that finds the lease held waits for it, polling,
for as long as its caller allows (nothing else tells one process that another released a row), and then
works from whatever the holder committed, which is usually nothing left to do; a background sweep does not
wait at all. A holder that died (SIGKILL) stops renewing, and its lease is taken over once it expires.

The holder renews its lease every ``lcm_settings.compaction_lease_heartbeat_seconds`` (2 s) and a lease
expires three heartbeats after its last renewal (6 s), far within a request's inline deadline
(``inline_compaction_seconds``, 30 s): a replica killed mid-sweep blocks its conversation for seconds, not
for the whole deadline (it was 60 s, and the next request waited its 30 s and answered with messages
evicted). A row with a heartbeat rather than PostgreSQL's session advisory lock (which dies with its
connection): the row works on both stores, and a session lock would leak under PgBouncer's transaction
pooling, which the PostgreSQL store supports. A renewal that misses a heartbeat or two (a busy writer) is
covered by the third; one that misses all three lets another sweep take over, which wastes work and nothing
else (below).

The lease saves work, not correctness: a sweep's commit still re-checks the state it was computed from, so a
holder that lost its lease (stalled past the expiry) can only waste its work, never corrupt the context.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator

from proxy.store.base import Store

log = logging.getLogger("lcm_proxy.engine")

HEARTBEAT_SECONDS = 2.0  # how often a holder renews its lease (lcm_settings.compaction_lease_heartbeat_seconds)
HEARTBEATS_TO_EXPIRY = 3  # a lease not renewed for this many heartbeats belongs to a dead holder
POLL_SECONDS = 0.1  # how often a waiting sweep looks at the lease again


class CompactionLeases:
    def __init__(self, store: Store, heartbeat: float = HEARTBEAT_SECONDS) -> None:
        self.store = store
        self.heartbeat = heartbeat
        self.ttl = heartbeat * HEARTBEATS_TO_EXPIRY  # each renewal sets the expiry this far ahead
        self.process = f"{socket.gethostname()}:{os.getpid()}"

    async def _take(self, conversation_id: str, owner: str) -> bool:
        async with self.store.write() as tx:
            return await tx.take_compaction_lease(conversation_id, owner, self.ttl)

    async def _free(self, conversation_id: str) -> bool:
        """Whether the lease looks free (or expired) on a plain read: a waiting sweep polls with reads, and takes
        the write lock only to try its luck, so waiters do not crowd out the requests' own writes."""
        current = await self.store.read.compaction_lease(conversation_id)
        return current is None or current[1] <= time.time()

    @contextlib.asynccontextmanager
    async def hold(self, conversation_id: str, wait: float) -> AsyncIterator[bool]:
        """Hold the lease of ``conversation_id`` for the block, waiting at most ``wait`` seconds for another
        holder to release it; yields whether it is held (False: another sweep kept it, do nothing)."""
        owner = f"{self.process}:{secrets.token_hex(4)}"
        deadline = time.monotonic() + wait
        waited = False
        while not await self._free(conversation_id) or not await self._take(conversation_id, owner):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.info("compaction of %s skipped: another sweep holds it", conversation_id)
                yield False
                return
            if not waited:
                waited = True
                log.info("compaction of %s waits up to %.0f s for the sweep running elsewhere", conversation_id, wait)
            await asyncio.sleep(min(POLL_SECONDS, remaining))
        renewing = asyncio.create_task(self._renew(conversation_id, owner))
        try:
            yield True
        finally:
            renewing.cancel()
            await asyncio.gather(renewing, return_exceptions=True)
            try:
                async with self.store.write() as tx:
                    await tx.release_compaction_lease(conversation_id, owner)
            except Exception as error:  # it expires on its own
                log.warning("compaction lease of %s not released: %s", conversation_id, type(error).__name__)

    async def _renew(self, conversation_id: str, owner: str) -> None:
        while True:
            await asyncio.sleep(self.heartbeat)
            try:
                async with self.store.write() as tx:
                    held = await tx.renew_compaction_lease(conversation_id, owner, self.ttl)
            except Exception as error:  # the next renewal may get through; the lease has slack for it
                log.warning("compaction lease of %s not renewed: %s", conversation_id, type(error).__name__)
                continue
            if not held:
                log.warning("compaction of %s lost its lease (stalled past its expiry)", conversation_id)
                return
