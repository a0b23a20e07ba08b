"""A streamed Chat Completions answer as a Responses event stream, for a Codex client served by a deployment
that only speaks chat (the request side and whole answers: ``proxy.upstream.translate_responses``).

The events come in the order Codex and OpenAI's SDK consume them, each with a ``sequence_number`` rising from
0: ``response.created``, ``response.in_progress``; per output item ``response.output_item.added``, then for a
message ``response.content_part.added``, ``response.output_text.delta``..., ``response.output_text.done``,
``response.content_part.done``, or for a function call ``response.function_call_arguments.delta``...,
``response.function_call_arguments.done``; ``response.output_item.done`` with the COMPLETE item (Codex builds
its history from these alone); and last ``response.completed`` with the whole response and its usage
(``response.incomplete`` instead, as OpenAI sends it, when the answer stopped at its length or a content
filter). One item is open at a time: text after a tool call opens a new message item. A custom tool's call
(whose chat arguments are ``{"input": ...}``) is announced when it starts and given whole when it ends.

``ResponsesEvents`` is the pure translator (``start``, ``feed`` a chunk, ``finish``); ``ChatToResponsesStream``
runs it over an open chat stream and yields ``proxy.upstream.sse_events.Event``s, the same class a native
``ResponsesStream`` yields. An upstream error mid-stream leaves as the ``UpstreamError`` it is (the door makes
it a ``response.failed``); closing delegates to the chat stream.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from proxy.types import JSONObject
from proxy.upstream.sse_events import Event, sse_bytes
from proxy.upstream.translate_responses import (
    call_item,
    custom_tools,
    incomplete_details,
    message_item,
    new_id,
    response_object,
    usage_to_responses,
)


def _obj(value: Any) -> JSONObject:
    return value if isinstance(value, dict) else {}


class ResponsesEvents:
    """One streamed chat answer as Responses events: ``start`` once, ``feed`` each chunk, ``finish`` once."""

    def __init__(self, request: JSONObject, response_id: str) -> None:
        self.request = request
        self.response_id = response_id
        self.created_at = time.time()
        self.custom = custom_tools(request)
        self.sequence = 0
        self.output: list[JSONObject] = []  # the finished items, in output order
        self.open: JSONObject | None = None  # the open item: {"kind", "id", ...} (text so far, call fields)
        self.calls: dict[Any, str] = {}  # chat tool-call index -> the call_id last started there
        self.usage: Any = None
        self.finish_reason: Any = None
        self.finished = False

    def _event(self, kind: str, **fields: Any) -> JSONObject:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def _response(self, status: str, usage: JSONObject | None = None, incomplete: JSONObject | None = None) -> Any:
        return response_object(self.request, self.response_id, self.created_at, status, list(self.output), usage,
                               incomplete)  # fmt: skip

    def start(self) -> list[JSONObject]:
        return [
            self._event("response.created", response=self._response("in_progress")),
            self._event("response.in_progress", response=self._response("in_progress")),
        ]

    @property
    def _index(self) -> int:
        return len(self.output)

    def _open_text(self) -> list[JSONObject]:
        events = self._close()
        self.open = {"kind": "text", "id": new_id("msg_"), "text": ""}
        item = message_item(self.open["id"], "", status="in_progress")
        item["content"] = []
        part = {"type": "output_text", "text": "", "annotations": []}
        return [
            *events,
            self._event("response.output_item.added", output_index=self._index, item=item),
            self._event("response.content_part.added", item_id=self.open["id"], output_index=self._index,
                        content_index=0, part=part),
        ]  # fmt: skip

    def _open_call(self, call_id: str, name: str) -> list[JSONObject]:
        events = self._close()
        custom = name in self.custom
        item_id = new_id("ctc_" if custom else "fc_")
        self.open = {"kind": "call", "id": item_id, "call_id": call_id, "name": name, "arguments": "", "custom": custom}
        item = call_item(call_id, name, "", custom, item_id)
        if custom:
            item["input"] = ""
        else:
            item["status"] = "in_progress"
        return [*events, self._event("response.output_item.added", output_index=self._index, item=item)]

    def _close(self) -> list[JSONObject]:
        """The events ending the open item; the item joins ``output``."""
        item, self.open = self.open, None
        if item is None:
            return []
        at = {"item_id": item["id"], "output_index": self._index}
        events: list[JSONObject] = []
        if item["kind"] == "text":
            done = message_item(item["id"], item["text"])
            events.append(self._event("response.output_text.done", **at, content_index=0, text=item["text"],
                                      logprobs=[]))  # fmt: skip
            events.append(self._event("response.content_part.done", **at, content_index=0, part=done["content"][0]))
        else:
            done = call_item(item["call_id"], item["name"], item["arguments"], item["custom"], item["id"])
            if not item["custom"]:
                events.append(self._event("response.function_call_arguments.done", **at, name=item["name"],
                                          arguments=item["arguments"]))  # fmt: skip
        events.append(self._event("response.output_item.done", output_index=self._index, item=done))
        self.output.append(done)
        return events

    def _tool_call(self, position: int, call: JSONObject) -> list[JSONObject]:
        events: list[JSONObject] = []
        index = call.get("index", position)
        function = _obj(call.get("function"))
        call_id = call.get("id")
        # A new index is a new call; so is a new id at a known index (some providers number every call 0).
        if index not in self.calls or (isinstance(call_id, str) and call_id and call_id != self.calls[index]):
            self.calls[index] = call_id = str(call_id or new_id("call_"))
            events += self._open_call(call_id, str(function.get("name") or ""))
        elif not (self.open is not None and self.open["kind"] == "call" and self.open["call_id"] == self.calls[index]):
            return []  # more of a call whose item is already done: nowhere to put it
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments and self.open is not None:
            self.open["arguments"] += arguments
            if not self.open["custom"]:
                events.append(self._event("response.function_call_arguments.delta", item_id=self.open["id"],
                                          output_index=self._index, delta=arguments))  # fmt: skip
        return events

    def feed(self, chunk: JSONObject) -> list[JSONObject]:
        """One chat chunk -> zero or more Responses events."""
        if self.finished:
            return []
        events: list[JSONObject] = []
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        choice = _obj(choices[0]) if isinstance(choices, list) and choices else {}
        delta = _obj(choice.get("delta"))
        text = delta.get("content")
        if isinstance(text, str) and text:
            if self.open is None or self.open["kind"] != "text":
                events += self._open_text()
            assert self.open is not None
            self.open["text"] += text
            events.append(self._event("response.output_text.delta", item_id=self.open["id"], output_index=self._index,
                                      content_index=0, delta=text, logprobs=[]))  # fmt: skip
        calls = delta.get("tool_calls")
        for position, call in enumerate(calls if isinstance(calls, list) else []):
            if isinstance(call, dict):
                events += self._tool_call(position, call)
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]
        return events

    def finish(self) -> list[JSONObject]:
        """The closing events: the open item's, then ``response.completed`` (or ``.incomplete``). Idempotent."""
        if self.finished:
            return []
        self.finished = True
        events = self._close()
        incomplete = incomplete_details(self.finish_reason)
        status = "incomplete" if incomplete else "completed"
        response = self._response(status, usage_to_responses(self.usage), incomplete)
        events.append(self._event(f"response.{status}", response=response))
        return events


class ChatToResponsesStream:
    """An open chat stream (``UpstreamStream``, or any async iterable of chunks with ``aclose``) read as
    Responses ``Event``s: iterate it, or call ``next_event`` (None at the end)."""

    def __init__(self, stream: Any, request: JSONObject, response_id: str) -> None:
        self._stream = stream
        self.translator = ResponsesEvents(request, response_id)
        self._events: AsyncIterator[Event] | None = None

    def on_close(self, hook: Callable[[], None]) -> None:
        self._stream.on_close(hook)

    async def _generate(self) -> AsyncIterator[Event]:
        for event in self.translator.start():
            yield Event(sse_bytes(event), event)
        async for chunk in self._stream:
            for event in self.translator.feed(chunk):
                yield Event(sse_bytes(event), event)
        for event in self.translator.finish():
            yield Event(sse_bytes(event), event)

    async def next_event(self) -> Event | None:
        if self._events is None:
            self._events = self._generate()
        return await anext(self._events, None)

    async def __aiter__(self) -> AsyncIterator[Event]:
        while (event := await self.next_event()) is not None:
            yield event

    async def aclose(self) -> None:
        try:
            if self._events is not None:
                await self._events.aclose()  # type: ignore[attr-defined]
        finally:
            await self._stream.aclose()
