"""Responses stream events as the client receives them.

Every event the door sends is re-numbered (``sequence_number`` rises from 0 across the whole stream, whatever
the upstream or a translation numbered) and names the response by the proxy's own id (``Numbering``). A stream
is read as Codex reads it (``Output``): the items of ``response.output_item.done`` are the answer (deltas are for
display), and ``response.completed`` (or ``response.incomplete``) ends it; a stream ends with one of those or
with ``response.failed``, never silently.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from proxy.errors import ProxyError

ENDINGS = ("response.completed", "response.incomplete", "response.failed")


def sse(data: dict[str, Any]) -> bytes:
    return b"event: " + str(data.get("type", "message")).encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class Numbering:
    """The door's own sequence numbers and response id on every event."""

    def __init__(self, response_id: str, model: str) -> None:
        self.response_id = response_id
        self.model = model
        self.next = 0

    def __call__(self, data: dict[str, Any]) -> dict[str, Any]:
        data = {**data, "sequence_number": self.next}
        self.next += 1
        response = data.get("response")
        if isinstance(response, dict):
            data["response"] = {**response, "id": self.response_id, "model": self.model}
        return data


class Output:
    """What a stream adds up to: its complete output items, in order, and its final response."""

    def __init__(self) -> None:
        self.items: dict[int, dict[str, Any]] = {}
        self.final: dict[str, Any] | None = None

    def feed(self, data: dict[str, Any]) -> None:
        kind = data.get("type")
        if kind == "response.output_item.done" and isinstance(data.get("item"), dict):
            index = data.get("output_index")
            self.items[index if isinstance(index, int) else len(self.items)] = data["item"]
        elif kind in ENDINGS and isinstance(data.get("response"), dict):
            self.final = data["response"]

    @property
    def ended(self) -> bool:
        return self.final is not None

    def response(self) -> dict[str, Any] | None:
        """The final response, its output the items the stream delivered (a completed event may leave it empty)."""
        if self.final is None:
            return None
        output = self.final.get("output")
        if not output and self.items:
            return {**self.final, "output": [self.items[i] for i in sorted(self.items)]}
        return self.final


def shell(response_id: str, model: str, request: dict[str, Any], status: str = "in_progress") -> dict[str, Any]:
    """A response object with no output yet, echoing the request's settings as OpenAI's does."""
    return {
        "id": response_id, "object": "response", "created_at": int(time.time()), "status": status, "model": model,
        "output": [], "error": None, "incomplete_details": None, "instructions": request.get("instructions"),
        "tools": request.get("tools") or [], "tool_choice": request.get("tool_choice", "auto"),
        "parallel_tool_calls": request.get("parallel_tool_calls", True), "temperature": request.get("temperature"),
        "top_p": request.get("top_p"), "max_output_tokens": request.get("max_output_tokens"),
        "previous_response_id": request.get("previous_response_id"), "store": request.get("store", True),
        "metadata": request.get("metadata") or {}, "usage": None,
    }  # fmt: skip


def failure(error: ProxyError) -> dict[str, Any]:
    return {"code": error.code or error.type, "message": error.message}


def whole(response: dict[str, Any], request: dict[str, Any]) -> list[dict[str, Any]]:
    """A finished response as the events of a stream (the proxy's own answers: compactions, digests)."""
    start = shell(response["id"], response["model"], request)
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": start},
        {"type": "response.in_progress", "response": start},
    ]
    for index, item in enumerate(response.get("output") or []):
        opened = {**item, "status": "in_progress"}
        if item.get("type") == "message":
            opened["content"] = []
        events.append({"type": "response.output_item.added", "output_index": index, "item": opened})
        if item.get("type") == "message":
            for part_index, part in enumerate(item.get("content") or []):
                where = {"item_id": item.get("id"), "output_index": index, "content_index": part_index}
                empty = {**part, "text": ""}
                events.append({"type": "response.content_part.added", **where, "part": empty})
                text = part.get("text", "")
                events.append({"type": "response.output_text.delta", **where, "delta": text, "logprobs": []})
                events.append({"type": "response.output_text.done", **where, "text": text, "logprobs": []})
                events.append({"type": "response.content_part.done", **where, "part": part})
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append({"type": "response.completed", "response": response})
    return events
