"""A client's message made into the row the store keeps: intercepted, counted, hashed, made searchable.

Interception, patching and counting are CPU work proportional to the message (a message may carry thousands
of base64 parts): a large message is handled in a worker thread, in two passes around its explorations,
which run on the event loop (they read the store and may call the summary model).
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Coroutine, Iterator, Mapping
from typing import Any, TypeVar

import orjson

from proxy.dialects import Dialect
from proxy.engine.intercept import Interception, Interceptor, Payload, apply_patches
from proxy.store.base import BlobBatch
from proxy.store.records import NewMessage
from proxy.types import Message, Messages


async def prepare_message(
    interceptor: Interceptor, message: Message, chain: str, tool_names: Mapping[str, str], batch: BlobBatch
) -> tuple[Interception, NewMessage]:
    """``message`` intercepted (new payloads added to ``batch`` and written) and its row to store."""
    off_loop = weight(message) >= OFF_LOOP_CHARS
    deferred = _DeferredExplorations(interceptor)
    if off_loop:
        interception = await asyncio.to_thread(deferred.intercept, message, tool_names)
    else:
        interception = deferred.intercept(message, tool_names)
    summaries = {file_id: await interceptor.explore(payload) for file_id, payload in deferred.wanted.items()}

    def finish() -> NewMessage:
        deferred.fill(interception, summaries)
        record = message_record(interceptor, message, chain, interception, batch)
        if batch.unwritten:
            batch.write()  # one worker-thread hop per message, however many files it carries
        return record

    record = await asyncio.to_thread(finish) if off_loop or interception.payloads else finish()
    return interception, record


def message_record(
    interceptor: Interceptor, message: Message, chain: str, interception: Interception, batch: BlobBatch
) -> NewMessage:
    dialect = interceptor.dialect
    for payload in interception.payloads:
        batch.add(payload.data, payload.file_id)
    forwarded = apply_patches(message, interception.forward_patches)
    forwarded_tokens = dialect.count(forwarded)
    compact_tokens = None
    if interception.compact_patches:
        compact_tokens = dialect.count(apply_patches(forwarded, interception.compact_patches))
    return NewMessage(
        role=dialect.role(message),
        original_json=orjson.dumps(interception.original).decode(),
        payload_paths=orjson.dumps(interception.paths).decode() if interception.paths else None,
        forward_json=orjson.dumps(interception.forward_patches).decode() if interception.forward_patches else None,
        compact_json=orjson.dumps(interception.compact_patches).decode() if interception.compact_patches else None,
        text=searchable_text(interceptor, forwarded, interception),
        token_count=forwarded_tokens,
        sent_token_count=dialect.count(message) if forwarded is not message else forwarded_tokens,
        chain_hash=chain,
        file_ids=tuple(p.file_id for p in interception.payloads),
        compact_token_count=compact_tokens,
    )


def searchable_text(interceptor: Interceptor, message: Message, interception: Interception) -> str:
    parts = interceptor.dialect.search_text(message)
    for payload in interception.payloads:
        if payload.kind == "base64":
            parts.append(f"[{payload.mime}: {payload.name} | {payload.file_id}]")
    return "\n".join(parts)


OFF_LOOP_CHARS = 64 * 1024  # text beyond which hashing and interception run in a worker thread
OFF_LOOP_VALUES = 512  # a value made of more parts than this counts as that much text without looking further

_T = TypeVar("_T")


def weight(value: Any) -> int:
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

    def intercept(self, message: Message, tool_names: Mapping[str, str]) -> Interception:
        original = self.interceptor
        marking = Interceptor(original.scope, original.large, original.tool, self._mark, original.dialect)
        return _run_now(marking.intercept(message, tool_names))

    def fill(self, interception: Interception, summaries: dict[str, str]) -> None:
        if not self.wanted:
            return
        marker = re.compile(re.escape(self._prefix) + "(file_[0-9a-f]+)\x00")

        def summary(match: re.Match[str]) -> str:
            return summaries[match.group(1)].strip()  # as stub_text would have placed it

        for patches in (interception.forward_patches, interception.compact_patches):
            patches[:] = [(path, marker.sub(summary, value)) for path, value in patches]


class ToolNames(Mapping[str, str]):
    """The names of a transcript's tool calls by call id, read from the newest message back only as far as a
    lookup needs: a tool result answers a call shortly before it, and a request prepares only its new
    messages (reading every message of a long transcript for them cost each request time in its length).
    The newest call with an id wins, as in the transcript read front to back."""

    def __init__(self, dialect: Dialect, transcript: Messages) -> None:
        self._dialect = dialect
        self._transcript = transcript
        self._next = len(transcript) - 1  # the newest message not read yet
        self._names: dict[str, str] = {}

    def _read_until(self, key: str | None) -> None:
        while (key is None or key not in self._names) and self._next >= 0:
            calls = {call.id: call.name for call in self._dialect.tool_calls(self._transcript[self._next])}
            for call_id, name in calls.items():
                self._names.setdefault(call_id, name)
            self._next -= 1

    def __getitem__(self, key: str) -> str:
        self._read_until(key)
        return self._names[key]

    def __iter__(self) -> Iterator[str]:
        self._read_until(None)
        return iter(self._names)

    def __len__(self) -> int:
        self._read_until(None)
        return len(self._names)
