"""The Messages door's upstream call, whichever kind of deployment serves the model: an Anthropic one gets the
Messages request natively and its events are relayed as they came (``proxy.upstream.anthropic``); any other
gets the request translated to Chat Completions and its answer translated back (``proxy.upstream.translate``).
Either way the door sees one shape: a whole Messages answer, or a stream of ``(bytes, event)`` pairs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from proxy.relay.turn import Services
from proxy.upstream.anthropic import MessagesStream
from proxy.upstream.routing import ResolvedModel
from proxy.upstream.translate import ChatToMessagesStream, chat_to_messages, messages_to_chat, sse_bytes

Events = AsyncIterator[tuple[bytes, dict[str, Any]]]


@dataclass
class Opened:
    """A stream being answered: its events, and how to close it (once)."""

    events: Events
    close: Any


async def complete(
    state: Services, target: ResolvedModel, body: dict[str, Any], headers: dict[str, str], native: bool
) -> dict[str, Any]:
    if native:
        return await state.upstream.messages(target, body, headers)
    result = await state.upstream.complete(target, messages_to_chat(body))
    return chat_to_messages(result, body["model"])


async def open_stream(
    state: Services,
    target: ResolvedModel,
    body: dict[str, Any],
    headers: dict[str, str],
    native: bool,
    input_tokens: int = 0,
) -> Opened:
    """Open the upstream's stream (its first event read, so an early failure raises here). ``input_tokens``: the
    proxy's count of what it forwards, for a translated stream's ``message_start`` (a Chat Completions stream
    reports its usage only at its end, and Claude Code reads the context's size from ``message_start``)."""
    if native:
        stream = await state.upstream.open_messages_stream(target, body, headers)
        first = await _first(stream)
        return Opened(_native(stream, first), stream.aclose)
    chat = await state.upstream.open_stream(target, {**messages_to_chat(body), "stream": True})
    return Opened(_translated(chat, body["model"], input_tokens), chat.aclose)


async def _first(stream: MessagesStream) -> Any:
    try:
        return await stream.next_event()
    except BaseException:
        await stream.aclose()
        raise


async def _native(stream: MessagesStream, first: Any) -> Events:
    event = first
    while event is not None:
        yield event.raw, event.data
        event = await stream.next_event()


async def _translated(chunks: Any, model: str, input_tokens: int) -> Events:
    translator = ChatToMessagesStream(model, input_tokens=input_tokens)
    async for chunk in chunks:
        for event in translator.feed(chunk):
            yield sse_bytes(event), event
    for event in translator.finish():
        yield sse_bytes(event), event
