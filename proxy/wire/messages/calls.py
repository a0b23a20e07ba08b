"""The Messages door's upstream call, whichever kind of deployment serves the model: an Anthropic one gets the
Messages request natively and its events are relayed as they came (``proxy.upstream.anthropic``); any other
gets the request translated to Chat Completions and its answer translated back (``proxy.upstream.translate``).
Either way the door sees one shape: a whole Messages answer, or a stream of ``(bytes, event)`` pairs.

With ``recall`` (the conversation has summaries or stubs, and the model calls tools), a translated request
runs the recall-tool loop of the chat door (``proxy.relay.toolloop``) on its Chat Completions form, a native one
the same loop in Anthropic's tool format (``recall_loop``): the proxy runs the ``lcm_*`` calls itself and the
client sees one ordinary answer."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from proxy.relay import unoffered
from proxy.relay.toolloop import RecallLoop, RunTool, with_recall_tools
from proxy.relay.turn import Services
from proxy.upstream.anthropic import MessagesStream
from proxy.upstream.routing import ResolvedModel
from proxy.upstream.translate import ChatToMessagesStream, chat_to_messages, messages_to_chat, sse_bytes
from proxy.upstream.translate import sse_bytes as sse_event
from proxy.wire.messages.recall_loop import MessagesRecallLoop

Events = AsyncIterator[tuple[bytes, dict[str, Any]]]


@dataclass
class Recall:
    """The recall tools of one request: how a call is run, how many rounds, and the tokens left for them."""

    run_tool: RunTool
    max_rounds: int
    room: int

    def loop(self, state: Services, target: ResolvedModel) -> RecallLoop:
        """The loop on a translated request's Chat Completions form."""
        return RecallLoop(state.upstream, target, self.run_tool, self.max_rounds, self.room)

    def native(self, state: Services, target: ResolvedModel, headers: dict[str, str]) -> MessagesRecallLoop:
        """The loop in Anthropic's tool format, for an Anthropic deployment."""
        return MessagesRecallLoop(state, target, headers, self.run_tool, self.max_rounds, self.room)


@dataclass
class Opened:
    """A stream being answered: its events, and how to close it (once)."""

    events: Events
    close: Any


async def complete(
    state: Services,
    target: ResolvedModel,
    body: dict[str, Any],
    headers: dict[str, str],
    native: bool,
    recall: Recall | None = None,
) -> dict[str, Any]:
    names = client_names(body)
    if native and recall is not None:
        return await recall.native(state, target, headers).complete(body)
    if native:
        return unoffered.messages_answer(await state.upstream.messages(target, body, headers), names)
    chat = messages_to_chat(body)
    if recall is not None:
        result = await recall.loop(state, target).complete(with_recall_tools(chat), chat.get("tools"))
    else:
        result = unoffered.chat_result(await state.upstream.complete(target, chat), names)
    return {**chat_to_messages(result, body["model"]), "id": message_id()}


def message_id() -> str:
    """A translated answer's own id. Not the upstream's chat id: servers that give every answer the same one exist,
    and Claude Code merges the blocks of answers that share an id into one message."""
    return "msg_" + secrets.token_hex(12)


def client_names(body: dict[str, Any]) -> set[str | None]:
    """The names of the client's own tools (a call to another ``lcm_`` name is not passed on)."""
    return {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}


async def open_stream(
    state: Services,
    target: ResolvedModel,
    body: dict[str, Any],
    headers: dict[str, str],
    native: bool,
    input_tokens: int = 0,
    recall: Recall | None = None,
) -> Opened:
    """Open the upstream's stream (its first event read, so an early failure raises here). ``input_tokens``: the
    proxy's count of what it forwards, for a translated stream's ``message_start`` (a Chat Completions stream
    reports its usage only at its end, and Claude Code reads the context's size from ``message_start``)."""
    if native and recall is not None:
        events, close = await recall.native(state, target, headers).open_stream(body)
        return Opened(events, close)
    if native:
        stream = await state.upstream.open_messages_stream(target, body, headers)
        first = await _first(stream)
        return Opened(_native(stream, first, unoffered.MessagesFilter(client_names(body))), stream.aclose)
    request = {**messages_to_chat(body), "stream": True}
    if recall is not None:
        looped = await recall.loop(state, target).open_stream(with_recall_tools(request), request.get("tools"), True)
        return Opened(_translated(looped, body["model"], input_tokens), looped.aclose)  # type: ignore[attr-defined]
    chat = await state.upstream.open_stream(target, request)
    filtered = unoffered.chat_stream(aiter(chat), client_names(body))
    return Opened(_translated(filtered, body["model"], input_tokens), filtered.aclose)


async def _first(stream: MessagesStream) -> Any:
    try:
        return await stream.next_event()
    except BaseException:
        await stream.aclose()
        raise


async def _native(stream: MessagesStream, first: Any, only: unoffered.MessagesFilter) -> Events:
    event = first
    while event is not None:
        data = only(event.data)
        if data is event.data:
            yield event.raw, data  # relayed as it came
        elif data is not None:
            yield sse_event(data), data
        event = await stream.next_event()


async def _translated(chunks: Any, model: str, input_tokens: int) -> Events:
    translator = ChatToMessagesStream(model, message_id=message_id(), input_tokens=input_tokens)
    async for chunk in chunks:
        for event in translator.feed(chunk):
            yield sse_bytes(event), event
    for event in translator.finish():
        yield sse_bytes(event), event
