"""Processes the overhead benchmark measures, each on its own port: ``python -m bench.servers KIND PORT [UPSTREAM]``.

* ``fake``    — the fake OpenAI-compatible upstream (tests/support/fakes.py) under uvicorn, which also answers
  Anthropic's ``POST /v1/messages`` (``messages``) and OpenAI's ``POST /v1/responses`` (``responses``): the
  least valid answers, streamed or not, no checks;
* ``aiohttp`` — a bare pass-through forwarder (Starlette + aiohttp): the floor for a Python proxy;
* ``litellm`` — a bare forwarder that calls ``litellm.acompletion`` and nothing else.

Both forwarders stream when the client asks for it, and answer ``GET /healthz`` once they are ready.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

SSE = "text/event-stream"


async def healthz(request: Request) -> Response:
    return PlainTextResponse("ok")


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


async def messages(request: Request) -> Response:
    """Anthropic's ``POST /v1/messages`` in its shape, the least of it: the chat fake's echo of the last user text
    as one text block; streamed, one ``text_delta`` per word as the chat fake sends one chunk per word, so the
    native and the translated paths carry the same pieces. Nothing is validated or recorded."""
    body = orjson.loads(await request.body())
    last = body["messages"][-1]["content"]
    text = "echo: " + (last if isinstance(last, str) else " ".join(b.get("text", "") for b in last))
    usage = {"input_tokens": 11, "output_tokens": 7}
    message = {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": usage,
    }
    if not body.get("stream"):
        return Response(orjson.dumps(message), media_type="application/json")

    async def events() -> AsyncIterator[bytes]:
        start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
        yield _event("message_start", {"message": start})
        yield _event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
        words = text.split(" ")
        for i, word in enumerate(words):
            delta = {"type": "text_delta", "text": word if i == 0 else " " + word}
            yield _event("content_block_delta", {"index": 0, "delta": delta})
        yield _event("content_block_stop", {"index": 0})
        end = {"delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 7}}
        yield _event("message_delta", end)
        yield _event("message_stop", {})

    return StreamingResponse(events(), media_type=SSE)


def _last_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))


async def responses(request: Request) -> Response:
    """OpenAI's ``POST /v1/responses`` in its shape, the least of it (``tests/support/fake_responses.py`` is the
    strict one): the chat fake's echo of the last user text as one assistant message; streamed, the events the
    SDK and Codex read, one ``response.output_text.delta`` per word as the chat fake sends one chunk per word.
    Nothing is validated, stored or recorded."""
    body = orjson.loads(await request.body())
    items = body["input"]
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    last = next((item for item in reversed(items) if item.get("role") == "user"), {"content": ""})
    text = "echo: " + _last_text(last["content"])
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    message = {"type": "message", "id": "msg_fake", "status": "completed", "role": "assistant", "content": [part]}
    usage = {
        "input_tokens": 11,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 18,
    }
    response = {
        "id": "resp_fake",
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": body["model"],
        "output": [message],
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "store": body.get("store", True),
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "metadata": {},
    }
    if not body.get("stream"):
        return Response(orjson.dumps(response), media_type="application/json")

    async def events() -> AsyncIterator[bytes]:
        numbers = itertools.count()

        def event(kind: str, **fields: Any) -> bytes:
            return _event(kind, {"sequence_number": next(numbers), **fields})

        start = {**response, "status": "in_progress", "output": [], "usage": None}
        yield event("response.created", response=start)
        yield event("response.in_progress", response=start)
        at = {"item_id": "msg_fake", "output_index": 0}
        yield event(
            "response.output_item.added", output_index=0, item={**message, "status": "in_progress", "content": []}
        )
        yield event("response.content_part.added", **at, content_index=0, part={**part, "text": ""})
        for i, word in enumerate(text.split(" ")):
            delta = word if i == 0 else " " + word
            yield event("response.output_text.delta", **at, content_index=0, delta=delta, logprobs=[])
        yield event("response.output_text.done", **at, content_index=0, text=text, logprobs=[])
        yield event("response.content_part.done", **at, content_index=0, part=part)
        yield event("response.output_item.done", output_index=0, item=message)
        yield event("response.completed", response=response)

    return StreamingResponse(events(), media_type=SSE)


def aiohttp_forwarder(upstream: str) -> Starlette:
    import aiohttp

    sessions: list[aiohttp.ClientSession] = []

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with aiohttp.ClientSession() as session:
            sessions.append(session)
            yield

    async def chat(request: Request) -> Response:
        # A pure pass-through of any door's path: the body is never parsed; the upstream's content type says
        # whether to stream.
        upstream_response = await sessions[0].post(
            f"{upstream}{request.url.path}", data=await request.body(), headers={"content-type": "application/json"}
        )
        if upstream_response.content_type != SSE:
            async with upstream_response:
                body = await upstream_response.read()
            return Response(body, status_code=upstream_response.status, media_type="application/json")

        async def relay() -> AsyncIterator[bytes]:
            async with upstream_response:
                async for chunk in upstream_response.content.iter_any():
                    yield chunk

        return StreamingResponse(relay(), status_code=upstream_response.status, media_type=SSE)

    return Starlette(
        routes=[
            *(
                Route(path, chat, methods=["POST"])
                for path in ("/v1/chat/completions", "/v1/messages", "/v1/responses")
            ),
            Route("/healthz", healthz),
        ],
        lifespan=lifespan,
    )


def litellm_forwarder(upstream: str) -> Starlette:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    async def chat(request: Request) -> Response:
        body = orjson.loads(await request.body())
        stream = bool(body.get("stream"))
        result = await litellm.acompletion(
            model=f"openai/{body['model']}",
            messages=body["messages"],
            stream=stream,
            api_base=f"{upstream}/v1",
            api_key="k",
            max_retries=0,
            num_retries=0,
        )
        if not stream:
            return Response(orjson.dumps(result.model_dump()), media_type="application/json")

        async def relay() -> AsyncIterator[bytes]:
            # The least a LiteLLM-based proxy does per chunk: dump LiteLLM's chunk object back to JSON.
            async for chunk in result:
                yield b"data: " + orjson.dumps(chunk.model_dump(exclude_none=True)) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(relay(), media_type=SSE)

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/healthz", healthz)])


def main() -> None:
    kind, port = sys.argv[1], int(sys.argv[2])
    if kind == "fake":
        from tests.support.fakes import FakeUpstream

        fake = FakeUpstream()
        # The tests read what the fake recorded; a benchmark would only pile up every request body in memory
        # (thousands of 300-message transcripts).
        fake.requests = deque(maxlen=1)  # type: ignore[assignment]
        fake.app.router.routes.append(Route("/v1/messages", messages, methods=["POST"]))
        fake.app.router.routes.append(Route("/v1/responses", responses, methods=["POST"]))
        app: Any = fake.app
    elif kind == "aiohttp":
        app = aiohttp_forwarder(sys.argv[3])
    elif kind == "litellm":
        app = litellm_forwarder(sys.argv[3])
    else:
        raise SystemExit(f"unknown server kind {kind}")
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
