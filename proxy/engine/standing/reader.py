"""The ledger's reader, off the request's path: messages are read for standing instructions after the response.

Reading a message for standing instructions (``flow.heard``: extraction, and the language of one it takes
nothing from) was the largest part of the proxy's own work on a turn, and it ran before the request was
forwarded. Yet the ledger is only forwarded (the ``Standing`` block, and the masking of superseded statements)
once compaction started, and its reserve counts only near the context share. So ingest stores the messages
alone, and this reader reads them:

* **after the response**: ``schedule`` starts a background task once the turn is answered (the wire layer's
  after-response hook, ``ContextEngine.after_response``), which reads every message of the conversation not
  read yet, the relayed answer among them. Only once the conversation holds half its soft threshold
  (``proxy.engine.engine.READ_AHEAD``): before that the ledger is neither forwarded nor reserved for, and most
  conversations never get there, so their messages are never read;
* **before the ledger is used** (``catch_up``, awaited): when a request's assembly may need it (its reserve
  near the context share, compaction started), before a sweep's summariser is shown the ledger and before it
  records what the model read (``proposals``), and before the admin API or the CLI show or change it.

What was read is the conversation's watermark ``ledger_upto`` (messages [0, ledger_upto) were read): one
transaction writes a run of messages' items (``Intake.write``, as ingest wrote them) and moves the watermark,
under the conversation's lock, after checking that the watermark and the messages (the chain hash of the run's
last message: it hashes all before it) are still those that were read. So a message is read once however many
requests, tasks or processes race, a crash at any point leaves the watermark and the items consistent, and what
is not read yet is read by the next catch-up or background read. A fork starts with its parent's watermark up
to the fork point (``copy_prefix``) and reads the rest against its own items; a relayed answer replaced in place
or a deletion that keeps a prefix takes the watermark back with the items (``_truncate_ledger``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import orjson

from proxy.dialects import by_name
from proxy.engine.errors import ConversationBusy
from proxy.engine.intercept import apply_patches, restore
from proxy.engine.standing.flow import LedgerMoved
from proxy.engine.standing.intake import Intake
from proxy.store.base import Blobs, Store
from proxy.store.records import ConversationRecord, MessageRecord
from proxy.types import Message

log = logging.getLogger("lcm_proxy.engine")

CHUNK = 128  # messages read per transaction (as ingest appends them: ``proxy.engine.chunks``)
ATTEMPTS = 5  # transactions that find the conversation or its ledger moved, before a catch-up gives up


class LedgerReader:
    """The background reads of this process, one task per conversation (single flight), and the catch-up."""

    def __init__(self, store: Store, files: Blobs, enabled: bool = True) -> None:
        self.store = store
        self.files = files
        self.enabled = enabled  # the ledger is kept (``standing_instructions`` is not "off")
        self.running: dict[str, asyncio.Task[bool]] = {}
        self._again: set[str] = set()  # conversations whose task reads once more (messages came while it ran)
        self._writing: set[asyncio.Future[bool | None]] = set()  # shielded write transactions (``close`` waits)
        self.read_messages = 0  # messages read by this process (tests, benchmarks)

    def schedule(self, conversation_id: str) -> asyncio.Task[bool] | None:
        """Read the conversation's unread messages in the background: its running task (which then looks once
        more, for messages stored since it looked), or a new one."""
        if not self.enabled:
            return None
        task = self.running.get(conversation_id)
        if task is not None and not task.done():
            self._again.add(conversation_id)
            return task
        task = asyncio.create_task(self._run(conversation_id))
        self.running[conversation_id] = task
        return task

    async def catch_up(self, conversation_id: str, conversation: ConversationRecord | None = None) -> None:
        """Read every message of the conversation not read yet, now: the ledger is about to be used. With the
        ``conversation`` as just read, nothing is done when it was read to its end. Raises ``ConversationBusy``
        when it could not be read (the request is refused rather than shown a ledger that may be stale)."""
        if not self.enabled or (conversation is not None and conversation.ledger_upto >= conversation.message_count):
            return
        task = self.schedule(conversation_id)
        assert task is not None
        # Shielded: a request that goes away does not abandon the read (see ``Store.write``).
        if not await asyncio.shield(task):
            raise ConversationBusy(f"The standing instructions of {conversation_id} could not be read; retry.")

    async def _run(self, conversation_id: str) -> bool:
        try:
            while True:
                self._again.discard(conversation_id)
                await self.read(conversation_id)
                if conversation_id not in self._again:
                    return True
        except Exception:
            log.exception("reading the standing instructions of %s failed", conversation_id)
            return False
        finally:
            if self.running.get(conversation_id) is asyncio.current_task():
                del self.running[conversation_id]
                self._again.discard(conversation_id)

    async def read(self, conversation_id: str) -> None:
        """Read the conversation's messages from its watermark to its end, a run of ``CHUNK`` per transaction."""
        stalled, done = 0, False
        while not done:
            conversation = await self.store.read.conversation(None, conversation_id)
            if conversation is None or conversation.ledger_upto >= conversation.message_count:
                return  # deleted, or read to its end
            start = conversation.ledger_upto
            end = min(conversation.message_count, start + CHUNK)
            read = await self._read_run(conversation, start, end)
            if read is not None:
                stalled, done = 0, read  # done: the run reached the end the transaction saw
            else:
                stalled += 1
                if stalled >= ATTEMPTS:
                    raise ConversationBusy(f"{conversation_id} kept changing while it was read")

    async def _read_run(self, conversation: ConversationRecord, start: int, end: int) -> bool | None:
        """Read messages [start, end) and write their items with the watermark: whether that was the end of the
        conversation; None when it moved meanwhile (another reader read them, a relayed answer was replaced):
        the caller looks again."""
        cid = conversation.id
        records = await self.store.search.messages(cid, start, end)  # whole rows: the reader off the loop
        if [r.seq for r in records] != list(range(start, end)):
            return None
        intake = Intake(by_name(conversation.dialect))
        for record in records:
            intake.add(record.seq, await self.forwarded(record))
        await intake.read()
        # The open items only when the run said something (most say nothing: the watermark alone moves).
        await intake.prepare(await self.store.read.ledger(cid) if intake.stated(start, end) else [], start, end)
        for _attempt in range(ATTEMPTS):
            try:
                writing = asyncio.ensure_future(self._write(cid, start, end, records[-1].chain_hash, intake))
                self._writing.add(writing)
                writing.add_done_callback(self._writing.discard)
                return await asyncio.shield(writing)
            except LedgerMoved as moved:  # the ledger changed since it was read (a summariser's, a pin): plan again
                await intake.prepare(moved.items, moved.start, end)
        return None

    async def _write(self, cid: str, start: int, end: int, chain: str, intake: Intake) -> bool | None:
        async with self.store.write() as tx:
            await tx.lock_conversation(cid)
            current = await tx.conversation(None, cid)
            if current is None or current.ledger_upto != start or current.message_count < end:
                return None
            if not await tx.chain_in_conversation(cid, end - 1, chain):  # hashes every message up to it
                return None
            await intake.write(tx, cid, start, end)
            await tx.set_ledger_upto(cid, end)
        self.read_messages += end - start
        return end >= current.message_count

    async def forwarded(self, record: MessageRecord) -> Message:
        """A stored message as it was forwarded when it was stored (what ingest read): the client's message,
        its payloads restored where no stub replaces them, with the stubs in place."""
        message: Message = orjson.loads(record.original_json)
        patches = [(p, v) for p, v in orjson.loads(record.forward_json)] if record.forward_json else []
        paths = orjson.loads(record.payload_paths) if record.payload_paths else []
        if any(not _covered(path, patches) for path in paths):
            contents = {f.id: await self.files.load(f.path) for f in await self.store.read.files_of_message(record.id)}
            message = restore(message, paths, contents.__getitem__)
        return apply_patches(message, patches) if patches else message

    async def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait for the running reads (tests, shutdown)."""
        tasks = [t for t in self.running.values() if not t.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)

    async def close(self) -> None:
        for task in list(self.running.values()):
            task.cancel()
        await self.wait_idle(timeout=5)
        if self._writing:  # a cancelled read's transaction runs to its end before the store closes
            await asyncio.wait(list(self._writing), timeout=5)


def _covered(path: Sequence[object], patches: Sequence[tuple[Sequence[object], str]]) -> bool:
    """Whether a stub replaces what is at ``path`` (a patch at it, or at a part that holds it)."""
    return any(list(path[: len(p)]) == list(p) for p, _ in patches)
