"""A fake OpenAI-compatible upstream: a real Starlette app, served on loopback by the tests.

It records every request body exactly as it arrived on the socket, and answers from a script of ``Reply``
objects (first in, first out) or, when the script is empty, with an echo of the last user message.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class Reply:
    content: str | None = "Hello from the fake upstream."
    tool_calls: list[dict[str, Any]] | None = None
    status: int = 200
    error_message: str = ""
    error_type: str = "invalid_request_error"
    error_code: str | None = None
    delay: float = 0.0  # seconds before answering (headers included)
    chunk_delay: float = 0.0  # seconds between streamed chunks
    cut_after: int | None = None  # streaming: drop the connection after this many content chunks
    raw_body: bytes | None = None  # send these bytes instead of a JSON body
    # Stream these pieces as text/event-stream, each sent as it comes; a number is a pause of that many seconds
    # (e.g. ``[event, *[b": ping\n\n", 0.05] * 100, finish]`` for an upstream that only keeps the line alive).
    raw_sse: list[bytes | float] | None = None
    usage: dict[str, int] = field(
        default_factory=lambda: {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
    )


@dataclass
class Recorded:
    body: dict[str, Any]
    headers: dict[str, str]


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


class FakeUpstream:
    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.script: deque[Reply] = deque()
        # Called with the request body when the script is empty; returns the reply (e.g. a scripted model).
        self.responder: Callable[[dict[str, Any]], Reply] | None = None
        self.stream_finished = threading.Event()  # set when a streaming generator ends (done or cancelled)
        self.stream_cancelled = threading.Event()
        self.chunks_sent = 0
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
            ]
        )

    def enqueue(self, *replies: Reply) -> None:
        self.script.extend(replies)

    @property
    def last(self) -> Recorded:
        return self.requests[-1]

    async def models(self, request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": "fake-model", "object": "model", "created": 0, "owned_by": "t"}],
            }
        )

    async def chat(self, request: Request) -> Response:
        body = json.loads(await request.body())
        self.requests.append(Recorded(body=body, headers=dict(request.headers)))
        if self.script:
            reply = self.script.popleft()
        elif self.responder is not None:
            reply = self.responder(body)
        else:
            reply = Reply(content=f"echo: {_last_user_text(body['messages'])}")
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.raw_sse is not None:
            return StreamingResponse(self._raw_stream(reply.raw_sse), media_type="text/event-stream")
        if reply.raw_body is not None:
            return Response(reply.raw_body, status_code=reply.status, media_type="application/json")
        if reply.status != 200:
            error = {
                "message": reply.error_message,
                "type": reply.error_type,
                "param": None,
                "code": reply.error_code,
            }
            return JSONResponse({"error": error}, status_code=reply.status)
        if body.get("stream"):
            return StreamingResponse(self._stream(body, reply), media_type="text/event-stream")
        message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None}
        if reply.tool_calls:
            message["tool_calls"] = reply.tool_calls
        return JSONResponse(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": 1700000000,
                "model": body["model"],
                "system_fingerprint": "fp_fake",
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "logprobs": None,
                        "finish_reason": "tool_calls" if reply.tool_calls else "stop",
                    }
                ],
                "usage": reply.usage,
            }
        )

    async def _raw_stream(self, pieces: list[bytes | float]):  # type: ignore[no-untyped-def]
        try:
            for piece in pieces:
                if isinstance(piece, bytes):
                    yield piece
                else:
                    await asyncio.sleep(piece)
        except asyncio.CancelledError:
            self.stream_cancelled.set()
            raise
        finally:
            self.stream_finished.set()

    async def _stream(self, body: dict[str, Any], reply: Reply):  # type: ignore[no-untyped-def]
        base = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": body["model"],
        }

        def event(choices: list[dict[str, Any]], **extra: Any) -> str:
            return "data: " + json.dumps({**base, "choices": choices, **extra}) + "\n\n"

        try:
            words = (reply.content or "").split(" ") if reply.content else []
            pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]
            yield event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
            for i, piece in enumerate(pieces):
                if reply.cut_after is not None and i >= reply.cut_after:
                    return
                if reply.chunk_delay:
                    await asyncio.sleep(reply.chunk_delay)
                self.chunks_sent += 1
                yield event([{"index": 0, "delta": {"content": piece}, "finish_reason": None}])
            for j, call in enumerate(reply.tool_calls or []):
                delta = {"tool_calls": [{"index": j, **call}]}
                yield event([{"index": 0, "delta": delta, "finish_reason": None}])
            finish = "tool_calls" if reply.tool_calls else "stop"
            yield event([{"index": 0, "delta": {}, "finish_reason": finish}])
            if (body.get("stream_options") or {}).get("include_usage"):
                yield event([], usage=reply.usage)
            yield "data: [DONE]\n\n"
        except asyncio.CancelledError:
            self.stream_cancelled.set()
            raise
        finally:
            self.stream_finished.set()


def wait_for(predicate: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())
