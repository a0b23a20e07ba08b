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
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeVar

import orjson

from proxy import tokens
from proxy.engine.canonical import chain_hashes, split_instructions
from proxy.engine.compaction import covering_prefix
from proxy.engine.errors import ConversationBusy, NotFound
from proxy.engine.explore import ExplorationBudget, TextSummarizer, exploration_summary
from proxy.engine.intercept import Interception, Interceptor, Payload, apply_patches, file_id_for, restore
from proxy.engine.summarize import Guard
from proxy.store.base import LONG_RANGE, BlobBatch, Blobs, Reads, Store, Writes, reads_for
from proxy.store.records import ConversationRecord, FileRecord, NewMessage
from proxy.types import Message, Messages

Action = Literal["none", "new", "append", "same", "earlier", "fork"]


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
class Located:
    conversation: ConversationRecord | None
    common: int  # messages shared by the request and that conversation
    client_key: bool = False  # the request's key is one the client chose (it follows forks), not an id we issued

    def action(self, request_count: int) -> Action:
        if self.conversation is None:
            return "new"
        stored = self.conversation.message_count
        if self.common == stored:
            return "append" if request_count > stored else "same"
        if self.common == request_count:
            return "earlier"
        return "fork"


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


class _NeedsPreparation(Exception):
    def __init__(self, indices: list[int]) -> None:
        self.indices = indices


TOUCH_INTERVAL = 60.0  # seconds: how stale "last activity" may get before a plain re-send refreshes it


def new_conversation_id() -> str:
    return "conv_" + secrets.token_hex(8)


async def _binary_search(count: int, present: Callable[[int], Awaitable[bool]]) -> int:
    """Largest k such that present(i) holds for every i < k; ``present`` must be prefix-closed."""
    low, high = 0, count
    while low < high:
        middle = (low + high + 1) // 2
        if await present(middle - 1):
            low = middle
        else:
            high = middle - 1
    return low


async def locate(q: Reads, tenant: str, chains: list[str], key: str | None) -> Located:
    if key is not None:
        conversation = await q.conversation_by_key(tenant, key)
        if conversation is None:
            return Located(None, 0, client_key=True)
        client_key = conversation.external_key == key
        limit = min(len(chains), conversation.message_count)
        common = await _binary_search(limit, lambda i: q.chain_in_conversation(conversation.id, i, chains[i]))
        located = Located(conversation, common, client_key)
        if client_key or located.action(len(chains)) != "fork":
            return located
        # An id the proxy issued names that conversation for good. A client that keeps sending it with a
        # transcript that went elsewhere continues the fork its first such request made, not a new fork per
        # request: the longest prefix among the conversation's descendants, if longer.
        family = await q.descendants(tenant, conversation.id)
        if not family:
            return located
        deeper = await _longest_prefix(q, tenant, chains, family)
        return deeper if deeper.conversation is not None and deeper.common > common else located
    return await _longest_prefix(q, tenant, chains, None)


async def locate_locked(
    tx: Writes, tenant: str, chains: list[str], key: str | None, expected: str | None = None
) -> Located:
    """``locate`` inside a write transaction, holding the locks that make its answer final until the commit:
    the identity locks (the client's key, the first message's chain: every conversation this transcript could
    continue starts with it) so that concurrent first requests create one conversation, then the lock of the
    conversation found, re-reading once it is held (another replica may have written it meanwhile). The
    conversation an earlier read ``expected`` is locked first, so that in the common case one read suffices."""
    for identity in sorted({k for k in (key, chains[0] if chains else None) if k is not None}):
        await tx.lock_identity(tenant, identity)
    held: set[str] = set()
    if expected is not None and await tx.lock_conversation(expected):
        held.add(expected)
    while True:
        located = await locate(tx, tenant, chains, key)
        found = located.conversation
        if found is None or found.id in held:
            return located
        if len(held) >= 4:
            raise ConversationBusy("Other requests kept moving this conversation while this one was stored; retry.")
        held.add(found.id)
        if not await tx.lock_conversation(found.id):
            return located  # this store's writers are serialised: nothing can have changed


async def _longest_prefix(q: Reads, tenant: str, chains: list[str], among: list[str] | None) -> Located:
    """The conversation (of ``among``, or of the whole tenant) sharing the longest prefix with ``chains``."""

    async def present(i: int) -> bool:
        return await q.chain_exists(chains[i]) if among is None else await q.chain_in_any(among, chains[i])

    common = await _binary_search(len(chains), present)
    if common == 0:
        return Located(None, 0)
    candidates = await q.conversations_with_chain(tenant, chains[common - 1])
    if among is not None:
        candidates = [c for c in candidates if c.id in among]
    if not candidates:  # the hash belongs to another tenant's chain: cannot happen, chains are tenant-seeded
        return Located(None, 0)
    best = max(candidates, key=lambda c: (c.message_count == common, c.updated_at))
    return Located(best, common)


async def replaces_relayed_answer(q: Reads, located: Located, transcript: Messages) -> bool:
    """Whether the request differs from its conversation only in the answer the proxy relayed and stored last
    (``proxy.engine.answers``): the client's version then replaces it."""
    conversation, common = located.conversation, located.common
    if conversation is None or common != conversation.message_count - 1 or common >= len(transcript):
        return False
    if transcript[common].get("role") != "assistant":
        return False
    return await q.replaceable_answer(conversation.id) == common


class Ingestor:
    def __init__(self, store: Store, files: Blobs, thresholds: Thresholds, guard: Guard | None = None) -> None:
        self.store = store
        self.files = files
        self.thresholds = thresholds
        self.guard = guard  # the engine's breaker and hourly call cap; None: no hourly cap (tests)

    async def ingest(
        self,
        tenant: str,
        messages: Messages,
        *,
        conversation_key: str | None = None,
        summarizer: TextSummarizer | None = None,
        model: str | None = None,
        thresholds: Thresholds | None = None,
    ) -> IngestResult:
        """Store what is new in ``messages``; ``thresholds`` (the request's, scaled to its model's window)
        decide what is intercepted, by default the ingestor's own."""
        instructions, transcript = split_instructions(messages)
        if not transcript:
            count = tokens.count_messages(messages)
            return IngestResult(None, "none", 0, None, messages, count, count)
        # Hashing canonical forms is CPU work proportional to the request: a large one goes to a worker thread,
        # so that the event loop keeps serving other requests meanwhile.
        if _weight(transcript) >= OFF_LOOP_CHARS:
            chains = await asyncio.to_thread(chain_hashes, tenant, transcript)
        else:
            chains = chain_hashes(tenant, transcript)
        tool_names = {
            str(call.get("id")): str(call["function"].get("name", ""))
            for m in transcript
            for call in (m.get("tool_calls") or [])
            if isinstance(call, dict) and isinstance(call.get("function"), dict)
        }
        explorations: dict[str, str] = {}
        explorer = self.explorer(tenant, summarizer, explorations)
        limits = thresholds or self.thresholds
        interceptor = Interceptor(tenant, limits.large_file_tokens, limits.tool_result_tokens, explorer)

        # Prepare outside the write lock: interception may write files and call the summarizer. New payload
        # files wait in the batch's pending folder until the transaction that stores their rows publishes them;
        # whatever is not published when this request is done with them (refused, failed, cancelled) is deleted.
        batch = self.files.batch(tenant)
        try:
            first_guess = await locate(self.store.read, tenant, chains, conversation_key)
            prepared: dict[int, tuple[Interception, NewMessage]] = {}

            async def prepare(i: int) -> tuple[Interception, NewMessage]:
                if i not in prepared:
                    prepared[i] = await self.prepare_message(interceptor, transcript[i], chains[i], tool_names, batch)
                return prepared[i]

            for i in range(first_guess.common, len(transcript)):
                await prepare(i)

            instructions_json = orjson.dumps(instructions).decode() if instructions else None
            guess = first_guess.conversation
            action_guess = first_guess.action(len(transcript))
            action: Action
            if (
                guess is not None
                and action_guess in ("same", "earlier")
                and (action_guess == "earlier" or guess.instructions_json == instructions_json)
                and (model is None or guess.last_model == model)
                and time.time() - guess.updated_at < TOUCH_INTERVAL
            ):
                # A retry of what is stored: nothing to write, so no write transaction (the hot path of clients
                # that re-send the same transcript, and of every multi-round tool loop).
                conversation_id, action, appended, forked_from = guess.id, action_guess, 0, None
            else:
                commit = functools.partial(
                    self._commit,
                    tenant,
                    transcript,
                    chains,
                    conversation_key,
                    instructions_json,
                    prepared,
                    explorations,
                    model,
                    batch,
                    guess.id if guess is not None else None,
                )
                conversation_id, action, appended, forked_from = await self._write(commit, prepare)
        finally:
            if batch.holds_files:
                await asyncio.to_thread(batch.discard)
        q = reads_for(self.store, len(transcript))  # every message of the transcript: off the loop when long
        overrides = await q.forward_overrides(conversation_id, len(transcript))
        forwarded_tokens, sent_tokens = await q.token_sums(conversation_id, len(transcript))
        instruction_tokens = tokens.count_messages(instructions)
        forwarded = list(instructions)
        changed = False
        for seq, message in enumerate(transcript):
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
            tip_chain=chains[-1],
        )

    async def _write(
        self,
        commit: Callable[[], Awaitable[tuple[str, Action, int, str | None]]],
        prepare: Callable[[int], Awaitable[tuple[Interception, NewMessage]]],
    ) -> tuple[str, Action, int, str | None]:
        """Run ``commit`` (one write transaction) until it finds every message it needs prepared."""
        for _attempt in range(5):
            try:
                # Shielded: a cancelled request must not abandon a half-written unit (see Store.write).
                return await asyncio.shield(commit())
            except _NeedsPreparation as missing:
                # Another request moved the conversation meanwhile: prepare the extra messages outside the
                # write lock (interception may call the summarizer), then decide again.
                for i in missing.indices:
                    await prepare(i)
        raise ConversationBusy(
            "Other requests kept changing this conversation while this one was stored; send it again."
        )

    async def _commit(
        self,
        tenant: str,
        transcript: Messages,
        chains: list[str],
        key: str | None,
        instructions_json: str | None,
        prepared: dict[int, tuple[Interception, NewMessage]],
        explorations: dict[str, str],
        model: str | None,
        batch: BlobBatch,
        expected: str | None = None,
    ) -> tuple[str, Action, int, str | None]:
        async with self.store.write() as tx:
            located = await locate_locked(tx, tenant, chains, key, expected)
            action = located.action(len(transcript))
            if action == "fork" and await replaces_relayed_answer(tx, located, transcript):
                # The client re-sent the answer the proxy stored when it relayed it, in its own version: the
                # client's wins, in place (not a fork).
                assert located.conversation is not None
                await tx.drop_relayed_answer(located.conversation.id, located.common)
                located = Located(
                    replace(located.conversation, message_count=located.common), located.common, located.client_key
                )
                action = "append"
            conversation = located.conversation
            forked_from = None
            start = len(transcript)
            if conversation is None or action == "fork":
                conversation_id = new_conversation_id()
                # A fork shares the prefix before the point where it left its parent; with nothing in common
                # (a key sent with an unrelated transcript) there is no lineage, and none must be recorded:
                # recall reaches into a parent's prefix.
                parent = conversation.id if conversation is not None and located.common > 0 else None
                await tx.create_conversation(
                    conversation_id,
                    tenant,
                    external_key=key if conversation is None else None,
                    parent_id=parent,
                    fork_seq=located.common if parent else None,
                    instructions_json=instructions_json,
                )
                if conversation is not None and parent is not None:
                    await tx.copy_prefix(conversation.id, conversation_id, located.common)
                    forked_from = conversation.id
                    # The fork shares the parent's summaries of the common prefix (nothing is summarised twice).
                    shared, upto = await covering_prefix(
                        tx, await tx.context_summaries(conversation.id), located.common
                    )
                    if shared:
                        await tx.set_context(conversation_id, [s.id for s in shared], upto)
                    await tx.set_stubbed_upto(conversation_id, min(conversation.stubbed_upto, located.common))
                # The client's own key follows its current version of the conversation; an id the proxy issued
                # keeps naming the conversation it was issued for.
                if conversation is not None and key is not None and located.client_key:
                    await tx.move_external_key(tenant, key, conversation_id)
                start = located.common
            else:
                conversation_id = conversation.id
                if action == "append":
                    start = conversation.message_count
                # An "earlier" re-send (a title request, a sub-agent) must not rewrite the conversation's
                # instructions: export would pair them with messages they were never sent with.
                if action != "earlier" and conversation.instructions_json != instructions_json:
                    await tx.set_instructions(conversation_id, instructions_json)
            if model is not None and (conversation is None or action == "fork" or conversation.last_model != model):
                await tx.set_last_model(conversation_id, model)
            missing = [i for i in range(start, len(transcript)) if i not in prepared]
            if missing:
                raise _NeedsPreparation(missing)  # rolls the transaction back; nothing was written
            new = [prepared[i] for i in range(start, len(transcript))]
            paths: list[str] = []
            for interception, _ in new:
                for payload in interception.payloads:
                    exploration = explorations.get(payload.file_id)
                    record = self.file_record(tenant, conversation_id, payload, exploration, batch)
                    paths.append(record.path)
                    await tx.put_file(record)
            if new:
                await tx.append_messages(conversation_id, start, [m for _, m in new])
                if paths:
                    # Last, before the commit: a committed row never names a missing file, and a unit that failed
                    # before this point published nothing (its pending files are discarded by the caller).
                    await batch.publish(tx, paths)
            elif action in ("same", "earlier"):
                await tx.touch(conversation_id)
            return conversation_id, action, len(new), forked_from

    def file_record(
        self, tenant: str, conversation_id: str, payload: Payload, exploration: str | None, batch: BlobBatch
    ) -> FileRecord:
        # Every payload of a prepared message was added to the batch by prepare_message, which hashed it there.
        sha, path = batch.location(payload.file_id) or batch.add(payload.data, payload.file_id)
        return FileRecord(
            id=payload.file_id,
            tenant=tenant,
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
        self, tenant: str, summarizer: TextSummarizer | None, explorations: dict[str, str]
    ) -> Callable[[Payload], Awaitable[str]]:
        """The exploration of one request's payloads, within its budget of summary-model calls."""
        thresholds = self.thresholds
        budget = ExplorationBudget(
            thresholds.exploration_calls, thresholds.exploration_seconds, self.guard, f"explore:{tenant}"
        )

        async def explore(payload: Payload) -> str:
            if payload.file_id in explorations:  # the same payload twice in one request
                return explorations[payload.file_id]
            known = await self.store.read.file(tenant, payload.file_id)
            if known is not None and known.exploration:
                summary = known.exploration
            elif payload.text is None:
                summary = f"Kind: binary ({payload.mime}), {len(payload.data)} bytes."
            else:
                model = getattr(summarizer, "model", None)
                usable = summarizer is not None and not (
                    self.guard is not None and isinstance(model, str) and self.guard.breaker_open(model)
                )
                summary = await exploration_summary(
                    payload.name,
                    payload.mime,
                    payload.text,
                    summarizer if usable else None,
                    max_tokens=thresholds.exploration_tokens,
                    budget=budget,
                )
            explorations[payload.file_id] = summary
            return summary

        return explore

    async def prepare_message(
        self, interceptor: Interceptor, message: Message, chain: str, tool_names: dict[str, str], batch: BlobBatch
    ) -> tuple[Interception, NewMessage]:
        # Interception, patching, counting and hashing are CPU work proportional to the message (a message may
        # carry thousands of base64 parts): a large message is handled in a worker thread, in two passes around
        # its explorations, which run here (they read the store and may call the summary model).
        off_loop = _weight(message) >= OFF_LOOP_CHARS
        deferred = _DeferredExplorations(interceptor)
        if off_loop:
            interception = await asyncio.to_thread(deferred.intercept, message, tool_names)
        else:
            interception = deferred.intercept(message, tool_names)
        summaries = {file_id: await interceptor.explore(payload) for file_id, payload in deferred.wanted.items()}

        def finish() -> NewMessage:
            deferred.fill(interception, summaries)
            record = self._message_record(message, chain, interception, batch)
            if batch.unwritten:
                batch.write()  # one worker-thread hop per message, however many files it carries
            return record

        record = await asyncio.to_thread(finish) if off_loop or interception.payloads else finish()
        return interception, record

    @staticmethod
    def _message_record(message: Message, chain: str, interception: Interception, batch: BlobBatch) -> NewMessage:
        for payload in interception.payloads:
            batch.add(payload.data, payload.file_id)
        forwarded = apply_patches(message, interception.forward_patches)
        forwarded_tokens = tokens.count_message(forwarded)
        compact_tokens = None
        if interception.compact_patches:
            compact_tokens = tokens.count_message(apply_patches(forwarded, interception.compact_patches))
        return NewMessage(
            role=str(message.get("role")),
            original_json=orjson.dumps(interception.original).decode(),
            payload_paths=orjson.dumps(interception.paths).decode() if interception.paths else None,
            forward_json=orjson.dumps(interception.forward_patches).decode() if interception.forward_patches else None,
            compact_json=orjson.dumps(interception.compact_patches).decode() if interception.compact_patches else None,
            text=searchable_text(forwarded, interception),
            token_count=forwarded_tokens,
            sent_token_count=tokens.count_message(message) if forwarded is not message else forwarded_tokens,
            chain_hash=chain,
            file_ids=tuple(p.file_id for p in interception.payloads),
            compact_token_count=compact_tokens,
        )


OFF_LOOP_CHARS = 64 * 1024  # text beyond which hashing and interception run in a worker thread
OFF_LOOP_VALUES = 512  # a value made of more parts than this counts as that much text without looking further

_T = TypeVar("_T")


def _weight(value: Any) -> int:
    """Characters of text in ``value``, counted up to ``OFF_LOOP_CHARS`` and at a bounded cost: whether
    handling it is worth a worker thread (values of many parts are, without counting them all)."""
    total, visited, stack = 0, 0, [value]
    while stack and total < OFF_LOOP_CHARS:
        item = stack.pop()
        visited += 1
        if visited > OFF_LOOP_VALUES:
            return OFF_LOOP_CHARS
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return total


def _run_now(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine that never suspends, in the calling thread (no event loop needed)."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        result: _T = done.value
        return result
    coroutine.close()
    raise RuntimeError("interception awaited something: it cannot run outside the event loop")


class _DeferredExplorations:
    """Interception with its explorations left for later, so that it can run in a worker thread.

    Each stub gets a marker where its exploration summary goes (unguessable: it carries a per-message nonce),
    ``wanted`` lists the payloads to explore, and ``fill`` puts the summaries in place. The result is the
    interception the interceptor's own explorer would have produced."""

    def __init__(self, interceptor: Interceptor) -> None:
        self.interceptor = interceptor
        self.wanted: dict[str, Payload] = {}
        self._prefix = ""  # made on the first payload: most messages have none, and every request prepares many

    async def _mark(self, payload: Payload) -> str:
        if not self._prefix:
            self._prefix = f"\x00lcm-exploration:{secrets.token_hex(16)}:"
        self.wanted.setdefault(payload.file_id, payload)
        return f"{self._prefix}{payload.file_id}\x00"

    def intercept(self, message: Message, tool_names: dict[str, str]) -> Interception:
        original = self.interceptor
        marking = Interceptor(original.tenant, original.large, original.tool, self._mark)
        return _run_now(marking.intercept(message, tool_names))

    def fill(self, interception: Interception, summaries: dict[str, str]) -> None:
        if not self.wanted:
            return
        marker = re.compile(re.escape(self._prefix) + "(file_[0-9a-f]+)\x00")

        def summary(match: re.Match[str]) -> str:
            return summaries[match.group(1)].strip()  # as stub_text would have placed it

        for patches in (interception.forward_patches, interception.compact_patches):
            patches[:] = [(path, marker.sub(summary, value)) for path, value in patches]


def searchable_text(message: Message, interception: Interception) -> str:
    parts: list[str] = []
    content = message.get("content")
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        for part in content:
            if not isinstance(part, dict):
                continue
            if isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part.get("refusal"), str):
                parts.append(part["refusal"])
    for call in message.get("tool_calls") or []:
        fn = call.get("function") if isinstance(call, dict) else None
        fn = fn if isinstance(fn, dict) else {}
        parts.append(f"{fn.get('name', '')}({fn.get('arguments', '')})")
    for payload in interception.payloads:
        if payload.kind == "base64":
            parts.append(f"[{payload.mime}: {payload.name} | {payload.file_id}]")
    return "\n".join(parts)


async def export_conversation(store: Store, files: Blobs, tenant: str | None, conversation_id: str) -> Messages:
    """The transcript exactly as the client last sent it: instructions + restored messages."""
    q = store.read
    conversation = await q.conversation(tenant, conversation_id)
    if conversation is None:
        raise NotFound(f"no conversation {conversation_id}")
    out: Messages = list(orjson.loads(conversation.instructions_json)) if conversation.instructions_json else []
    for start in range(0, conversation.message_count, LONG_RANGE):  # a page at a time, off the event loop
        for record in await store.search.messages(conversation_id, start, start + LONG_RANGE):
            original = orjson.loads(record.original_json)
            if record.payload_paths:
                contents = {f.id: await files.load(f.path) for f in await q.files_of_message(record.id)}
                original = restore(original, orjson.loads(record.payload_paths), contents.__getitem__)
            out.append(original)
    return out


__all__ = ["IngestResult", "Ingestor", "Thresholds", "export_conversation", "file_id_for", "locate"]
