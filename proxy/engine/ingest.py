"""Ingest: reconcile a request's transcript with the store, append only what is new.

Rules (docs/architecture.md, "Request lifecycle" step 5), with T the request's transcript (instructions removed), S
the stored conversation it belongs to and p the length of their common prefix:

* p == len(S) < len(T): continuation — append T[p:].
* p == len(T) == len(S): identical re-send (retry) — write nothing.
* p == len(T) < len(S): the client re-sent an earlier point (regenerate) — write nothing; this request
  is served from T alone.
* otherwise T diverges from S (an edited turn): fork a new conversation that starts with S's first p
  messages; S stays exactly as it was.

S is the conversation named by ``X-LCM-Conversation-Id`` when the client sends one, otherwise the
tenant's conversation with the longest stored prefix of T (ties: the one whose end T reaches, then the
most recently active). A key the client chose follows its forks; an id the proxy issued keeps naming its
conversation, and when T diverges from it, S is the longest-prefix match among that conversation's own
forks (a client that keeps echoing the id continues the fork its edit made). A fork records its parent
only when the two share at least one message. The decision is taken again inside the write transaction,
so concurrent requests for one conversation (from any process) neither duplicate nor lose a message.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace

import orjson

from proxy.dialects import CHAT, Dialect, count_messages, split_instructions
from proxy.engine.chunks import ChunkBounds, NeedsPreparation, Outcome, chunk_end, store_in_chunks
from proxy.engine.compaction import covering_prefix
from proxy.engine.explore import TextSummarizer
from proxy.engine.explore.request import request_explorer
from proxy.engine.export import export_conversation
from proxy.engine.identity import Action, Located, locate, locate_locked, new_conversation_id, replaces_relayed_answer
from proxy.engine.intercept import Interception, Interceptor, Payload, apply_patches, file_id_for
from proxy.engine.rows import ToolNames, prepare_message
from proxy.engine.seen import Fingerprint, Seen
from proxy.engine.summarize import Guard
from proxy.store.base import BlobBatch, Blobs, Store, Writes, reads_for
from proxy.store.records import ConversationRecord, FileRecord, NewMessage
from proxy.types import Message, Messages


@dataclass(frozen=True)
class Thresholds:
    large_file_tokens: int
    tool_result_tokens: int
    exploration_tokens: int = 400
    # Per request: at most this many summary-model calls explore stored payloads (each one also charged to
    # the hourly cap), and none once this many seconds have passed; the rest get deterministic summaries.
    exploration_calls: int = 4
    exploration_seconds: float = 30.0


@dataclass(frozen=True)
class IngestResult:
    conversation_id: str | None
    action: Action
    appended: int
    forked_from: str | None
    messages: Messages  # what to forward: instructions + transcript with stubs applied
    tokens_sent: int  # of the transcript as the client sent it (instructions included)
    tokens_forwarded: int
    tip_chain: str | None = None  # chain hash of the transcript's last message (where a relayed answer goes)


LOOP_TURN = 0.02  # seconds of preparing messages on the event loop before it serves others
TOUCH_INTERVAL = 60.0  # seconds: how stale "last activity" may get before a plain re-send refreshes it


@dataclass(frozen=True)
class Incoming:
    """What one request brings to the store: its transcript (instructions removed) and how it is identified."""

    scope: str
    transcript: Messages
    chains: list[str]
    conversation_key: str | None
    instructions_json: str | None
    model: str | None
    dialect: Dialect
    continues: bool = False  # the client compacted the transcript itself: it continues the keyed conversation
    link_key: str | None = None  # a sub-agent's: the key of the conversation of the agent that started it


Prepared = dict[int, tuple[Interception, NewMessage]]


class Ingestor:
    def __init__(
        self,
        store: Store,
        files: Blobs,
        thresholds: Thresholds,
        guard: Guard | None = None,
        standing: bool = True,
        chunks: ChunkBounds | None = None,
        seen: Seen | None = None,
    ) -> None:
        self.store = store
        self.files = files
        self.thresholds = thresholds
        self.guard = guard  # the engine's breaker and hourly call cap; None: no hourly cap (tests)
        # Keep the ledger of standing instructions (``proxy.engine.standing``; its reader reads the messages stored
        # here after the response). When it is off, what is stored is marked read: nothing reads it later.
        self.standing = standing
        self.chunks = chunks or ChunkBounds()  # what one write transaction appends at most (``proxy.engine.chunks``)
        self.seen = seen if seen is not None else Seen()  # transcripts handled before (``proxy.engine.seen``)

    async def ingest(
        self,
        scope: str,
        messages: Messages,
        *,
        conversation_key: str | None = None,
        summarizer: TextSummarizer | None = None,
        model: str | None = None,
        thresholds: Thresholds | None = None,
        dialect: Dialect = CHAT,
        continues: bool = False,
        link_key: str | None = None,
        seen: Fingerprint | None = None,
    ) -> IngestResult:
        """Store what is new in ``messages`` (of ``dialect``); ``thresholds`` (the request's, scaled to its
        model's window) decide what is intercepted, by default the ingestor's own. ``continues``: the client
        replaced its transcript with its own summary (``Incoming.continues``). ``seen``: the door's fingerprint
        of ``messages`` (``proxy.engine.seen``), else the ingestor takes one."""
        instructions, transcript = split_instructions(dialect, messages)
        if not transcript:
            count = count_messages(dialect, messages)
            return IngestResult(None, "none", 0, None, messages, count, count)
        instructions_json = orjson.dumps(instructions).decode() if instructions else None
        chains = await self.seen.chains(scope, messages, len(instructions), dialect.name, seen)
        incoming = Incoming(
            scope, transcript, chains, conversation_key, instructions_json, model, dialect, continues, link_key
        )
        limits = thresholds or self.thresholds
        explorations: dict[str, str] = {}
        explorer = self.explorer(scope, summarizer, explorations)
        interceptor = Interceptor(scope, limits.large_file_tokens, limits.tool_result_tokens, explorer, dialect)
        tool_names = ToolNames(dialect, transcript)

        # Prepare outside the write lock: interception may write files and call the summarizer. New payload
        # files wait in the batch's pending folder until the transaction that stores their rows publishes them;
        # whatever is not published when this request is done with them (refused, failed, cancelled) is deleted.
        batch = self.files.batch(scope)
        try:
            first_guess = await locate(self.store.read, scope, incoming.chains, conversation_key)
            prepared: Prepared = {}

            async def prepare(i: int) -> tuple[Interception, NewMessage]:
                if i not in prepared:
                    chain = incoming.chains[i]
                    prepared[i] = await self.prepare_message(interceptor, transcript[i], chain, tool_names, batch)
                return prepared[i]

            turn = time.perf_counter()
            for i in range(first_guess.common, len(transcript)):
                await prepare(i)
                if time.perf_counter() - turn > LOOP_TURN:  # thousands of messages: others are served between
                    await asyncio.sleep(0)
                    turn = time.perf_counter()
            if _plain_retry(first_guess, incoming):
                # A retry of what is stored: nothing to write, so no write transaction (the hot path of clients
                # that re-send the same transcript, and of every multi-round tool loop).
                assert first_guess.conversation is not None
                outcome: Outcome = (first_guess.conversation.id, first_guess.action(len(transcript)), 0, None)
            else:
                # A bounded write transaction per chunk. Its standing instructions are read after the response
                # (``proxy.engine.standing.reader``), or before the ledger is next needed.
                end, guess = len(transcript), first_guess.conversation
                commit = functools.partial(self._commit, incoming, prepared, explorations, batch)
                expected = guess.id if guess else None
                outcome = await store_in_chunks(commit, prepare, end, expected)
        finally:
            if batch.holds_files:
                await asyncio.to_thread(batch.discard)
        return await self._result(incoming, outcome, instructions, messages)

    async def _result(
        self, incoming: Incoming, outcome: Outcome, instructions: Messages, messages: Messages
    ) -> IngestResult:
        """What to forward: the request's own list, or a copy with the stored stubs applied."""
        conversation_id, action, appended, forked_from = outcome
        transcript = incoming.transcript
        # The overrides of the whole transcript (its stubs: off the loop when long); the token sums are two stored
        # running sums (``proxy.store.running``), read on the request path however long the transcript.
        overrides = await reads_for(self.store, len(transcript)).forward_overrides(conversation_id, len(transcript))
        forwarded_tokens, sent_tokens = await self.store.read.token_sums(conversation_id, len(transcript))
        instruction_tokens = count_messages(incoming.dialect, instructions)
        forwarded = list(instructions)
        changed = False
        for seq, message in enumerate(transcript if overrides else ()):
            patches = overrides.get(seq)
            if patches is None:
                forwarded.append(message)
            else:
                forwarded.append(apply_patches(message, [(p, v) for p, v in orjson.loads(patches)]))
                changed = True
        return IngestResult(
            conversation_id=conversation_id,
            action=action,
            appended=appended,
            forked_from=forked_from,
            messages=forwarded if changed else messages,  # zero-cost: the very same list when nothing changed
            tokens_sent=sent_tokens + instruction_tokens,
            tokens_forwarded=forwarded_tokens + instruction_tokens,
            tip_chain=incoming.chains[-1],
        )

    async def _commit(
        self,
        incoming: Incoming,
        prepared: Prepared,
        explorations: dict[str, str],
        batch: BlobBatch,
        expected: str | None = None,
    ) -> tuple[Outcome, int]:
        """One write transaction: decide again under the locks, place the transcript, append the first chunk of
        what is new (``proxy.engine.chunks``). Returns the outcome and where the chunk ended."""
        async with self.store.write() as tx:
            located, action = await self._decide(tx, incoming, expected)
            conversation = located.conversation
            if conversation is None or action == "fork":
                conversation_id, forked_from = await self._create(tx, incoming, located)
                start = located.common
            else:
                conversation_id, forked_from = conversation.id, None
                start = conversation.message_count if action == "append" else len(incoming.transcript)
                # An "earlier" re-send (a title request, a sub-agent) must not rewrite the conversation's
                # instructions: export would pair them with messages they were never sent with.
                if action != "earlier" and conversation.instructions_json != incoming.instructions_json:
                    await tx.set_instructions(conversation_id, incoming.instructions_json)
            model = incoming.model
            if model is not None and (conversation is None or action == "fork" or conversation.last_model != model):
                await tx.set_last_model(conversation_id, model)
            # The chunk (``proxy.engine.chunks``), checked for messages not prepared yet within itself only (every
            # chunk of a large request holds the writer); if it holds one, all are prepared and it is computed again.
            end = len(incoming.transcript)
            stop = chunk_end(self.chunks, prepared, start, end)
            if any(i not in prepared for i in range(start, stop)):
                # Rolls the transaction back; nothing was written.
                raise NeedsPreparation([i for i in range(start, end) if i not in prepared])
            new = [prepared[i] for i in range(start, stop)]
            if new:
                await self._append(tx, incoming.scope, conversation_id, start, new, explorations, batch)
                read_upto = conversation.ledger_upto if conversation is not None else 0
                if not self.standing and (start == 0 or read_upto >= start):
                    # No ledger is kept: nothing to read, now or later (as if read, nothing said).
                    await tx.set_ledger_upto(conversation_id, stop)
            elif action in ("same", "earlier"):
                await tx.touch(conversation_id)
            return (conversation_id, action, len(new), forked_from), stop

    async def _decide(self, tx: Writes, incoming: Incoming, expected: str | None) -> tuple[Located, Action]:
        """The conversation the transcript belongs to, and what to do with it, final until the commit."""
        located = await locate_locked(tx, incoming.scope, incoming.chains, incoming.conversation_key, expected)
        action = located.action(len(incoming.transcript))
        if action == "fork" and await replaces_relayed_answer(tx, located, incoming.transcript, incoming.dialect):
            # The client re-sent the answer the proxy stored when it relayed it, in its own version: the
            # client's wins, in place (not a fork).
            assert located.conversation is not None
            await tx.drop_relayed_answer(located.conversation.id, located.common)
            located = Located(
                replace(located.conversation, message_count=located.common), located.common, located.client_key
            )
            action = "append"
        return located, action

    async def _create(self, tx: Writes, incoming: Incoming, located: Located) -> tuple[str, str | None]:
        """A new conversation, or a fork of ``located``'s: (its id, the conversation it was forked from)."""
        conversation = located.conversation
        conversation_id = new_conversation_id()
        # A fork shares the prefix before the point where it left its parent; with nothing in common
        # (a key sent with an unrelated transcript) there is no lineage, and none must be recorded:
        # recall reaches into a parent's prefix. The exception: a transcript the client compacted itself, sent
        # under its own key, continues that conversation (all of it stays in recall's scope, nothing is copied).
        continued = incoming.continues and located.client_key and located.common == 0 and conversation is not None
        parent = conversation.id if conversation is not None and (located.common > 0 or continued) else None
        assert conversation is not None or parent is None
        fork_seq = (conversation.message_count if continued else located.common) if conversation else None
        await tx.create_conversation(
            conversation_id,
            incoming.scope,
            external_key=incoming.conversation_key if conversation is None else None,
            parent_id=parent,
            fork_seq=fork_seq if parent else None,
            instructions_json=incoming.instructions_json,
            dialect=incoming.dialect.name,
            continued=bool(continued),
            linked_to=await self._linked(tx, incoming),
        )
        forked_from = None
        if conversation is not None and parent is not None and not continued:
            await self._share_prefix(tx, conversation, conversation_id, located.common)
            forked_from = conversation.id
        # The client's own key follows its current version of the conversation; an id the proxy issued
        # keeps naming the conversation it was issued for.
        if conversation is not None and incoming.conversation_key is not None and located.client_key:
            await tx.move_external_key(incoming.scope, incoming.conversation_key, conversation_id)
        return conversation_id, forked_from

    @staticmethod
    async def _linked(tx: Writes, incoming: Incoming) -> str | None:
        if incoming.link_key is None:
            return None
        linked = await tx.conversation_by_key(incoming.scope, incoming.link_key)
        return linked.id if linked is not None else None

    @staticmethod
    async def _share_prefix(tx: Writes, parent: ConversationRecord, fork_id: str, common: int) -> None:
        await tx.copy_prefix(parent.id, fork_id, common)
        # The fork shares the parent's summaries of the common prefix (nothing is summarised twice).
        shared, upto = await covering_prefix(tx, await tx.context_summaries(parent.id), common)
        if shared:
            await tx.set_context(fork_id, [s.id for s in shared], upto)
        await tx.set_stubbed_upto(fork_id, min(parent.stubbed_upto, common))

    async def _append(
        self,
        tx: Writes,
        scope: str,
        conversation_id: str,
        start: int,
        new: list[tuple[Interception, NewMessage]],
        explorations: dict[str, str],
        batch: BlobBatch,
    ) -> None:
        paths: list[str] = []
        for interception, _ in new:
            for payload in interception.payloads:
                exploration = explorations.get(payload.file_id)
                record = self.file_record(scope, conversation_id, payload, exploration, batch)
                paths.append(record.path)
                await tx.put_file(record)
        await tx.append_messages(conversation_id, start, [m for _, m in new])
        if paths:
            # Last, before the commit: a committed row never names a missing file, and a unit that failed
            # before this point published nothing (its pending files are discarded by the caller).
            await batch.publish(tx, paths)

    def file_record(
        self, scope: str, conversation_id: str, payload: Payload, exploration: str | None, batch: BlobBatch
    ) -> FileRecord:
        # Every payload of a prepared message was added to the batch by prepare_message, which hashed it there.
        sha, path = batch.location(payload.file_id) or batch.add(payload.data, payload.file_id)
        return FileRecord(
            id=payload.file_id,
            tenant=scope,
            conversation_id=conversation_id,
            name=payload.name,
            mime=payload.mime,
            kind=payload.kind,
            bytes=len(payload.data),
            sha256=sha,
            path=path,
            exploration=exploration,
            created_at=time.time(),
        )

    def explorer(
        self, scope: str, summarizer: TextSummarizer | None, explorations: dict[str, str]
    ) -> Callable[[Payload], Awaitable[str]]:
        """The exploration of one request's payloads, within its budget of summary-model calls."""
        t = self.thresholds
        limits = (t.exploration_tokens, t.exploration_calls, t.exploration_seconds)
        return request_explorer(self.store.read, self.guard, scope, summarizer, explorations, *limits)

    async def prepare_message(
        self, interceptor: Interceptor, message: Message, chain: str, tool_names: Mapping[str, str], batch: BlobBatch
    ) -> tuple[Interception, NewMessage]:
        """``proxy.engine.rows.prepare_message``, through the ingestor (where tests observe it)."""
        return await prepare_message(interceptor, message, chain, tool_names, batch)


def _plain_retry(guess: Located, incoming: Incoming) -> bool:
    """Whether the request re-sends what is stored, recently touched, with nothing to update."""
    conversation, action = guess.conversation, guess.action(len(incoming.transcript))
    return (
        conversation is not None
        and action in ("same", "earlier")
        and (action == "earlier" or conversation.instructions_json == incoming.instructions_json)
        and (incoming.model is None or conversation.last_model == incoming.model)
        and time.time() - conversation.updated_at < TOUCH_INTERVAL
    )


__all__ = ["IngestResult", "Ingestor", "Thresholds", "export_conversation", "file_id_for", "locate"]
