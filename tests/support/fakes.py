"""A fake OpenAI-compatible upstream: a real Starlette app, served on loopback by the tests.

It records every request body exactly as it arrived on the socket, and answers from a script of ``Reply``
objects (first in, first out) or, when the script is empty, with an echo of the last user message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class Streamed:
    """What became of one streamed reply (``Reply.streamed``), set by the fake as it streams it: wait on its
    events, not on time."""

    finished: threading.Event = field(default_factory=threading.Event)  # the stream ended, however it ended
    cancelled: threading.Event = field(default_factory=threading.Event)  # the proxy hung up before the end
    chunks: int = 0  # content chunks sent


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
    # Streaming: after the content, keep the stream open and silent until the proxy hangs up (it never ends on
    # its own, so ``streamed.finished`` means the proxy closed it).
    hold_open: bool = False
    raw_body: bytes | None = None  # send these bytes instead of a JSON body (embeddings too)
    headers: dict[str, str] | None = None  # extra response headers (``retry-after``...) of a raw or error answer
    # Stream these pieces as text/event-stream, each sent as it comes; a number is a pause of that many seconds
    # (e.g. ``[event, *[b": ping\n\n", 0.05] * 100, finish]`` for an upstream that only keeps the line alive).
    raw_sse: list[bytes | float] | None = None
    usage: dict[str, int] = field(
        default_factory=lambda: {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
    )
    streamed: Streamed = field(default_factory=Streamed)


@dataclass
class Recorded:
    body: dict[str, Any]
    headers: dict[str, str]
    path: str = "/v1/chat/completions"  # the other OpenAI endpoints (``FakeUpstream.openai_routes``) record theirs


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
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                *self.openai_routes(),
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
            return StreamingResponse(self._raw_stream(reply), media_type="text/event-stream")
        if reply.raw_body is not None:
            return Response(
                reply.raw_body, status_code=reply.status, media_type="application/json", headers=reply.headers
            )
        if reply.status != 200:
            error = {
                "message": reply.error_message,
                "type": reply.error_type,
                "param": None,
                "code": reply.error_code,
            }
            return JSONResponse({"error": error}, status_code=reply.status, headers=reply.headers)
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

    async def _raw_stream(self, reply: Reply):  # type: ignore[no-untyped-def]
        try:
            for piece in reply.raw_sse or []:
                if isinstance(piece, bytes):
                    yield piece
                else:
                    await asyncio.sleep(piece)
        except asyncio.CancelledError:
            reply.streamed.cancelled.set()
            raise
        finally:
            reply.streamed.finished.set()

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
                reply.streamed.chunks += 1
                yield event([{"index": 0, "delta": {"content": piece}, "finish_reason": None}])
            if reply.hold_open:
                await asyncio.Event().wait()  # never set: only the proxy's hang-up (a cancellation) ends it
            for j, call in enumerate(reply.tool_calls or []):
                delta = {"tool_calls": [{"index": j, **call}]}
                yield event([{"index": 0, "delta": delta, "finish_reason": None}])
            finish = "tool_calls" if reply.tool_calls else "stop"
            yield event([{"index": 0, "delta": {}, "finish_reason": finish}])
            if (body.get("stream_options") or {}).get("include_usage"):
                yield event([], usage=reply.usage)
            yield "data: [DONE]\n\n"
        except asyncio.CancelledError:
            reply.streamed.cancelled.set()
            raise
        finally:
            reply.streamed.finished.set()

    # --- the rest of OpenAI's API: embeddings, legacy completions, moderations, audio, images ----------------
    # Each records what it received (multipart files as {"filename", "content_type", "content"}) and answers
    # in OpenAI's shape; a scripted ``Reply`` with an error status is answered as that error instead.

    def openai_routes(self) -> list[Route]:
        return [
            Route("/v1/embeddings", self.embeddings, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/moderations", self.moderations, methods=["POST"]),
            Route("/v1/audio/transcriptions", self.transcriptions, methods=["POST"]),
            Route("/v1/audio/translations", self.transcriptions, methods=["POST"]),
            Route("/v1/audio/speech", self.speech, methods=["POST"]),
            Route("/v1/images/generations", self.images, methods=["POST"]),
            Route("/v1/images/edits", self.images, methods=["POST"]),
        ]

    async def _record(self, request: Request) -> tuple[dict[str, Any], Reply]:
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            body: dict[str, Any] = {}
            async with request.form() as form:
                for key in form:  # a repeated field (``image[]``, several images) is recorded as a list
                    values = [v if isinstance(v, str) else await self._upload(v) for v in form.getlist(key)]
                    body[key] = values if len(values) > 1 else values[0]
        else:
            body = json.loads(await request.body())
        self.requests.append(Recorded(body=body, headers=dict(request.headers), path=request.url.path))
        reply = self.script.popleft() if self.script else Reply()
        if reply.delay:
            await asyncio.sleep(reply.delay)
        return body, reply

    @staticmethod
    async def _upload(upload: Any) -> dict[str, Any]:
        return {"filename": upload.filename, "content_type": upload.content_type, "content": await upload.read()}

    @staticmethod
    def _error(reply: Reply) -> Response | None:
        if reply.raw_body is not None:  # sent in 1 MB pieces, as a server writes a large body, its length declared
            raw, piece = reply.raw_body, 1 << 20
            headers = {**(reply.headers or {}), "content-length": str(len(raw))}

            async def pieces():  # type: ignore[no-untyped-def]
                for start in range(0, len(raw), piece):
                    yield raw[start : start + piece]

            return StreamingResponse(pieces(), status_code=reply.status, media_type="application/json", headers=headers)
        if reply.status == 200:
            return None
        error = {"message": reply.error_message, "type": reply.error_type, "param": None, "code": reply.error_code}
        return JSONResponse({"error": error}, status_code=reply.status, headers=reply.headers)

    async def embeddings(self, request: Request) -> Response:
        body, reply = await self._record(request)
        if (error := self._error(reply)) is not None:
            return error
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        vector = [0.25, -0.5, 1.0]
        embedding: Any = vector
        if body.get("encoding_format") == "base64":
            import base64
            import struct

            embedding = base64.b64encode(struct.pack("<3f", *vector)).decode()
        data = [{"object": "embedding", "index": i, "embedding": embedding} for i in range(len(inputs))]
        usage = {"prompt_tokens": 3 * len(inputs), "total_tokens": 3 * len(inputs)}
        return JSONResponse({"object": "list", "data": data, "model": body["model"], "usage": usage})

    async def completions(self, request: Request) -> Response:
        body, reply = await self._record(request)
        if (error := self._error(reply)) is not None:
            return error
        text = reply.content or ""
        base = {"id": "cmpl-fake", "object": "text_completion", "created": 1700000000, "model": body["model"]}
        if not body.get("stream"):
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}
            return JSONResponse({**base, "choices": [choice], "usage": reply.usage})

        async def events():  # type: ignore[no-untyped-def]
            for i, word in enumerate(text.split(" ")):
                if reply.cut_after is not None and i >= reply.cut_after:
                    return  # the connection ends without a finish_reason
                piece = word if i == 0 else " " + word
                choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": None}
                yield "data: " + json.dumps({**base, "choices": [choice]}) + "\n\n"
            choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": "stop"}
            yield "data: " + json.dumps({**base, "choices": [choice]}) + "\n\n"
            if (body.get("stream_options") or {}).get("include_usage"):
                yield "data: " + json.dumps({**base, "choices": [], "usage": reply.usage}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def moderations(self, request: Request) -> Response:
        body, reply = await self._record(request)
        if (error := self._error(reply)) is not None:
            return error
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        categories = {"harassment": False, "violence": True}
        scores = {"harassment": 0.01, "violence": 0.93}
        results = [{"flagged": True, "categories": categories, "category_scores": scores} for _ in inputs]
        return JSONResponse(
            {"id": "modr-fake", "model": body.get("model", "omni-moderation-latest"), "results": results}
        )

    async def transcriptions(self, request: Request) -> Response:
        body, reply = await self._record(request)
        if (error := self._error(reply)) is not None:
            return error
        text = reply.content or ""
        if body.get("response_format") in ("text", "srt", "vtt"):
            return Response(text, media_type="text/plain")
        return JSONResponse({"text": text, "usage": {"type": "duration", "seconds": 2}})

    async def speech(self, request: Request) -> Response:
        body, reply = await self._record(request)
        if (error := self._error(reply)) is not None:
            return error
        media = {"wav": "audio/wav", "opus": "audio/ogg"}.get(body.get("response_format", "mp3"), "audio/mpeg")
        return Response(b"ID3fake-audio:" + str(body["input"]).encode(), media_type=media)

    async def images(self, request: Request) -> Response:
        body, reply = await self._record(request)
        if (error := self._error(reply)) is not None:
            return error
        count = int(body.get("n") or 1)
        image = {"b64_json": "iVBORw0KGgo=", "revised_prompt": body["prompt"]}
        details = {"text_tokens": 5, "image_tokens": 0}
        usage = {"input_tokens": 5, "input_tokens_details": details, "output_tokens": 10, "total_tokens": 15}
        return JSONResponse({"created": 1700000000, "data": [image] * count, "usage": usage})


# The fake upstreams serving the whole session (or a module): conftest's autouse fixture resets each before every
# test, so nothing a test scripted or recorded is seen by the next.
SESSION_FAKES: list[FakeUpstream] = []


@contextlib.contextmanager
def session_fake(fake: FakeUpstream) -> Iterator[FakeUpstream]:
    """``fake`` reset before every test while the block runs."""
    SESSION_FAKES.append(fake)
    try:
        yield fake
    finally:
        SESSION_FAKES.remove(fake)


def reset_fake(fake: FakeUpstream) -> FakeUpstream:
    fake.requests.clear()
    fake.script.clear()
    fake.responder = None
    return fake


def wait_for(predicate: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())
