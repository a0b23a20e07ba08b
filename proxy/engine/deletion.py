"""Deleting conversations: one on request (``DELETE /lcm/conversations/{id}``, ``lcm-proxy delete``), all of a
tenant's, or those idle too long (``lcm-proxy purge``, ``lcm_settings.retention_days``).

**Forks.** A fork holds its own copy of the messages it shares with its parent, but its context names the
parent's summaries of that prefix (nothing is summarised twice), those summaries link to the parent's
messages, and recall reaches into the parent's prefix (``proxy.engine.recall.scope.Scope``). So a conversation that
live forks (directly or through other forks) still share a prefix with cannot vanish whole. Deleting it
leaves a *tombstone*: its row, marked ``deleted_at``, keeping only its messages up to the furthest point any
live fork left it and the summaries live rows reference (with everything they link to). Its key,
instructions, context and bookkeeping go at once, the rest of its messages and summaries too, and payload
files no other message refers to. A tombstone is invisible to everything done for a client: listings, the
``/lcm/`` views, export, lookups by id or key, and identity matching (a new request with the same opening
never continues it: the store's chain lookups skip it, and what it keeps is copied in a live fork anyway);
only a fork's recall scope and the doctor walk through it. When its last live fork goes, the tombstone goes,
and so does a tombstoned ancestor that nothing live needs any more. Deleting a fork never touches a live
parent.

Each deletion is one write transaction holding the locks of the conversation and of the tombstoned ancestors
it trims (in that order: child first), so concurrent deletions of sibling forks see each other's result.
Payload contents no row names any more are deleted after the commit (``Blobs.forget``), then the store is
scrubbed (``Store.scrub``: what that does per backend is in ``proxy.store.sqlite.delete`` and
``proxy.store.postgres.delete``). Once the transaction commits, nothing deleted is reachable any more (no read,
search or recall finds it); the scrub only takes its traces out of the database's files, and its cost grows
with the store, not with what was deleted. So the server does not scrub per deletion: its ``Scrubber`` runs
in the background, one pass for all the deletions asked for while the previous pass ran, in bounded steps
that leave the writer to other requests between them, and ``DELETE /lcm/conversations/{id}`` answers
``"scrub": "pending"`` (``GET /lcm/scrub`` says when it is done). The operator's commands (``lcm-proxy delete``
and ``purge``) have no scrubber: they scrub to the end before they exit.

Every deletion logs one INFO line on ``lcm_proxy.audit``: who asked (tenant, and through what: ``api``,
``cli``, ``retention``), which conversation, how much went. Never content, never keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from proxy.engine.errors import NotFound
from proxy.store.base import Blobs, Store, Writes
from proxy.store.records import ConversationRecord, Removed

audit = logging.getLogger("lcm_proxy.audit")
log = logging.getLogger("lcm_proxy.deletion")

PURGE_BATCH = 100  # conversations listed at a time by a purge
RETENTION_INTERVAL = 3600.0  # seconds between retention passes


@dataclass(frozen=True)
class Deleted:
    """One deletion: the conversation asked for, and everything that went with it (tombstoned ancestors
    that nothing live needed any more)."""

    id: str
    tenant: str  # the conversation's scope, as its record names it (``ConversationRecord.tenant``)
    messages: int
    summaries: int
    files: int
    forks: int  # live forks that keep a prefix of it (0: nothing of it is left)
    kept_messages: int  # messages [0, kept_messages) kept for them
    scrub: str = "done"  # "done" (scrubbed before it returned), "pending" (the Scrubber's ``ticket``), "skipped"
    ticket: int = 0  # the Scrubber's pass number that scrubs it (``Scrubber.wait``)

    def as_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "deleted": True,
            "messages": self.messages,
            "summaries": self.summaries,
            "files": self.files,
            "kept_for_forks": {"forks": self.forks, "messages": self.kept_messages},
            "scrub": self.scrub,
        }


def shared_prefix(conversation_id: str, family: Sequence[ConversationRecord]) -> tuple[int, int]:
    """(messages of ``conversation_id`` that live conversations forked from it still share, how many such
    live conversations there are). A fork of a fork shares at most what its own parent shares."""
    children: dict[str, list[ConversationRecord]] = {}
    for record in family:
        children.setdefault(record.parent_id or "", []).append(record)
    keep, live = 0, 0
    stack: list[tuple[str, float]] = [(conversation_id, math.inf)]
    seen: set[str] = set()
    while stack:
        node, bound = stack.pop()
        for child in children.get(node, []):
            if child.id in seen:
                continue
            seen.add(child.id)
            shared = min(bound, child.fork_seq or 0)
            if child.deleted_at is None:
                live += 1
                keep = max(keep, int(shared))
            stack.append((child.id, shared))
    return keep, live


class Scrubber:
    """The server's scrub after deletions, in the background: ``request`` (a deletion committed) returns at
    once with a ticket; a task runs ``Store.scrub`` for every ticket given out so far, so deletions made while a
    pass runs share the next one (a hundred deletions in a burst cost two passes, not a hundred). The store
    scrubs in bounded steps and gives the writer back between them. ``stop`` lets a pass asked for finish:
    scrubbing is a promise made to whoever deleted."""

    RETRY_MAX = 300.0  # seconds: the longest wait between two tries of a pass that keeps failing

    def __init__(self, store: Store, *, retry_after: float = 5.0) -> None:
        """``retry_after``: the wait before retrying a pass whose scrub failed, doubled after every failure in a
        row (up to ``RETRY_MAX``); the tickets of a failed pass stay pending until a pass succeeds."""
        self.store = store
        self.retry_after = retry_after
        self.requested = 0  # tickets given out
        self.completed = 0  # every ticket up to this one is scrubbed
        self.passes = 0
        self.failures = 0  # passes in a row whose scrub failed
        self._stopping = asyncio.Event()
        self._latest: dict[str, int] = {}  # scope -> the ticket of its latest deletion still being scrubbed
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    @property
    def pending(self) -> bool:
        return self.completed < self.requested

    def status(self, scope: str | None = None) -> dict[str, object]:
        """Whether the deletions of ``scope`` (None: anyone's) are scrubbed yet. Per scope: whether another
        tenant deleted something lately is none of a tenant's business."""
        latest = self.requested if scope is None else self._latest.get(scope, 0)
        return {"scrub": "pending" if latest > self.completed else "done"}

    def request(self, scope: str = "") -> int:
        """Ask for a pass after what was deleted so far (by ``scope``); the ticket ``wait`` takes."""
        self.requested += 1
        self._latest[scope] = self.requested
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="lcm-scrub")
        return self.requested

    async def wait(self, ticket: int) -> None:
        """Until the pass of ``ticket`` is done (a test; an operator who needs to know)."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.completed >= ticket)

    async def stop(self) -> None:
        """Let a pass under way finish (a failed one is not retried any more: its deletions stay unscrubbed until
        the next deletion after a restart, or the database's own checkpoint and autovacuum)."""
        self._stopping.set()
        if self._task is not None and not self._task.done():
            log.info("finishing the scrub of deleted conversations before stopping")
            await asyncio.shield(self._task)

    async def _run(self) -> None:
        while self.completed < self.requested:
            target = self.requested
            scrubbed = await scrub_store(self.store)
            self.passes += 1
            if not scrubbed:
                self.failures += 1
                if self._stopping.is_set():
                    return
                delay = min(self.retry_after * 2 ** (self.failures - 1), self.RETRY_MAX)
                log.warning("the scrub after deleting is still pending; retrying in %.0f s", delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), delay)
                if self._stopping.is_set():
                    return
                continue
            self.failures = 0
            async with self._changed:
                self.completed = target
                self._latest = {scope: t for scope, t in self._latest.items() if t > target}
                self._changed.notify_all()


async def scrub_store(store: Store, *, full: bool = False) -> bool:
    """``Store.scrub``; whether it ran. What it could not do is a warning, not the deletion's failure: the rows
    are gone, and the next scrub (a ``Scrubber``'s retry, the next deletion's, or the database's own checkpoint
    and autovacuum) gets there. The warning names the error's type only (a driver's message may quote data)."""
    try:
        notes = await store.scrub(full=full)
    except Exception as exc:
        log.warning("the store could not be scrubbed after deleting (%s)", type(exc).__name__)
        return False
    for note in notes:
        log.warning("after deleting: %s", note)
    return True


class Deleter:
    def __init__(self, store: Store, files: Blobs, scrubber: Scrubber | None = None) -> None:
        """``scrubber``: the server's, which scrubs in the background; without one (the CLI, retention in a
        process of its own) every ``delete`` and ``purge`` scrubs before it returns."""
        self.store = store
        self.files = files
        self.scrubber = scrubber

    async def delete(
        self,
        scope: str | None,
        conversation_id: str,
        *,
        via: str,
        scrub: bool = True,
        full: bool = False,
        idle_before: float | None = None,
    ) -> Deleted:
        """Delete one conversation of ``scope`` (None: the operator's, any scope) by its id, then scrub the
        store (``full``: rewriting its tables) unless ``scrub`` is False: with a ``Scrubber``, in the background
        (the result says ``scrub="pending"`` and its ticket), else before it returns. An unknown id, a conversation of
        another scope and one deleted already are all ``NotFound``. Shielded: a caller that goes away (a
        client hanging up) does not leave the payloads or the scrub of a committed deletion undone.
        ``idle_before`` (a purge): only if its last activity, read under its lock, is still before that time (a
        client may have continued it since the purge listed it); else ``NotFound`` too."""
        return await asyncio.shield(self._delete(scope, conversation_id, via, scrub, full, idle_before))

    async def _delete(
        self, scope: str | None, conversation_id: str, via: str, scrub: bool, full: bool, idle_before: float | None
    ) -> Deleted:
        async with self.store.write() as tx:
            await tx.lock_conversation(conversation_id)
            record = await tx.conversation(scope, conversation_id)
            if record is None:
                raise NotFound(f"no conversation {conversation_id}")
            if idle_before is not None and record.updated_at >= idle_before:
                raise NotFound(f"conversation {conversation_id} is in use again")
            removed, forks = await self._remove(tx, record)
        if removed.paths:
            async with self.store.write() as tx:
                await self.files.forget(tx, removed.paths)
        deleted = Deleted(
            record.id, record.tenant, removed.messages, removed.summaries, removed.files, forks, removed.kept_messages
        )
        audit.info(
            "deleted conversation %s of tenant %r via %s: %d messages, %d summaries, %d files removed%s",
            deleted.id,
            deleted.tenant,
            via,
            deleted.messages,
            deleted.summaries,
            deleted.files,
            f"; its first {deleted.kept_messages} messages are kept for {forks} live fork(s)" if forks else "",
        )
        if not scrub:
            return dataclasses.replace(deleted, scrub="skipped")
        if self.scrubber is not None and not full:
            return dataclasses.replace(deleted, scrub="pending", ticket=self.scrubber.request(scope or ""))
        await self.scrub(full=full)
        return deleted

    async def _remove(self, tx: Writes, record: ConversationRecord) -> tuple[Removed, int]:
        """Remove ``record`` (a tombstone if live forks share its prefix), then trim or remove each tombstoned
        ancestor up to the first live one, which this deletion leaves as it is."""
        keep, forks = shared_prefix(record.id, await tx.family(record.id))
        total = await tx.remove_conversation(record.id, keep)
        current = record
        while current.parent_id is not None:
            # A live parent is left alone, and not locked either: a request continuing it may hold its lock
            # and wait for this conversation's. A deleted one is only ever locked by deletions.
            parent = await tx.conversation(None, current.parent_id, deleted=True)
            if parent is None or parent.deleted_at is None:
                break
            if await tx.lock_conversation(parent.id):  # another deletion may have removed it meanwhile
                reread = await tx.conversation(None, parent.id, deleted=True)
                if reread is None:
                    break
                parent = reread
            keep, _ = shared_prefix(parent.id, await tx.family(parent.id))
            total += await tx.remove_conversation(parent.id, keep)
            current = parent
        return total, forks

    async def scrub(self, *, full: bool = False) -> None:
        """Scrub now, to the end (``scrub_store``)."""
        await scrub_store(self.store, full=full)

    async def candidates(self, scope: str | None, before: float | None, limit: int) -> list[ConversationRecord]:
        """What a purge would delete (at most ``limit``): conversations of ``scope`` (None: all) last active
        before ``before`` (None: whenever), oldest first."""
        return await self.store.search.idle_conversations(before, scope, limit)

    async def purge(
        self,
        scope: str | None,
        before: float | None,
        *,
        via: str,
        full: bool = False,
        stop: Callable[[], bool] | None = None,
    ) -> list[Deleted]:
        """Delete every conversation ``candidates`` names (the fork rule applies to each), one transaction
        each, then scrub once. ``stop``: asked between deletions, True ends the purge early."""
        if scope is None and before is None:
            raise ValueError("a purge names a tenant or a cutoff")
        done: list[Deleted] = []
        tried: set[str] = set()
        while stop is None or not stop():
            batch = [c for c in await self.candidates(scope, before, PURGE_BATCH) if c.id not in tried]
            if not batch:
                break
            for record in batch:
                if stop is not None and stop():
                    break
                tried.add(record.id)
                try:
                    done.append(await self.delete(record.tenant, record.id, via=via, scrub=False, idle_before=before))
                except NotFound:
                    continue  # deleted meanwhile (another worker's retention pass, an API call), or in use again
        if self.scrubber is not None and done and not full:  # retention: the server's pass, waited for
            await self.scrubber.wait(self.scrubber.request())
        elif done or full:
            await self.scrub(full=full)
        return done


class Retention:
    """``lcm_settings.retention_days``: a background task that purges conversations idle longer than that, at
    startup and then every ``interval`` seconds. Workers and replicas may each run one: a deletion is one
    locked transaction, and a conversation another one deleted first is skipped. All the work runs off the
    event loop (the store's writer and search connections, a worker thread for files); ``stop`` lets the
    deletion in progress finish, then ends the task."""

    def __init__(self, deleter: Deleter, days: int, interval: float = RETENTION_INTERVAL) -> None:
        self.deleter = deleter
        self.days = days
        self.interval = interval
        self.passes = 0
        self._stop = asyncio.Event()
        self._passed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # the one it runs on (tests wait on it from elsewhere)

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._run(), name="lcm-retention")

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    async def wait_for_pass(self, count: int) -> None:
        """Until ``count`` passes have finished (tests)."""
        async with self._passed:
            await self._passed.wait_for(lambda: self.passes >= count)

    async def _run(self) -> None:
        while not self._stop.is_set():
            try:
                cutoff = time.time() - self.days * 86400
                deleted = await self.deleter.purge(None, cutoff, via="retention", stop=self._stop.is_set)
                if deleted:
                    log.info("retention: deleted %d conversation(s) idle for %d days or more", len(deleted), self.days)
            except Exception:
                log.exception("retention: the purge failed; it runs again in %.0f s", self.interval)
            async with self._passed:
                self.passes += 1
                self._passed.notify_all()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=self.interval)


__all__ = ["Deleted", "Deleter", "Retention", "Scrubber", "scrub_store", "shared_prefix"]
