"""The aiohttp client of the calls the proxy sends itself (``proxy.upstream.pool``), against raw loopback servers
that misbehave as real ones do: each failure reaches the caller as the same ``UpstreamError`` the httpx and
LiteLLM paths give, never a hang, a 500 or an aiohttp exception."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest

from proxy.config.settings import GeneralSettings
from proxy.errors import UpstreamConnectionError, UpstreamError, UpstreamTimeoutError
from proxy.upstream import direct, pool
from proxy.upstream.client import Upstream
from proxy.upstream.routing import ResolvedModel

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ANSWER = orjson.dumps(
    {"id": "c1", "object": "chat.completion", "created": 1, "model": "m",
     "choices": [{"index": 0, "message": {"role": "assistant", "content": "yo"}, "finish_reason": "stop"}]}
)  # fmt: skip
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


@pytest.fixture(autouse=True)
def chat_path(monkeypatch: pytest.MonkeyPatch) -> str:
    """The direct path with aiohttp (the conftest's fixture of the same name runs both paths)."""
    monkeypatch.setattr(direct, "ENABLED", True)
    monkeypatch.setattr(pool, "HTTPX", False)
    return "direct"


def target(port: int) -> ResolvedModel:
    params = {"model": "openai/m", "api_base": f"http://127.0.0.1:{port}/v1", "api_key": "sk-pool-1"}
    return ResolvedModel(alias="m", litellm_params=params, max_input_tokens=None, max_output_tokens=None)


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    return head + await reader.readexactly(length)


def reply(body: bytes, *extra: bytes) -> bytes:
    head = [b"HTTP/1.1 200 OK", b"content-type: application/json", b"content-length: %d" % len(body), *extra]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def run(handler: Handler, calls: Callable[[Upstream, ResolvedModel], Awaitable[Any]], timeout: float = 5) -> Any:
    """Serve ``handler`` (given each connection's number) on a loopback port and make ``calls`` against it."""

    async def main() -> Any:
        count = 0

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal count
            count += 1
            try:
                await handler(reader, writer, count)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        upstream = Upstream(GeneralSettings(request_timeout=timeout, connect_timeout=timeout, upstream_retries=0))
        try:
            return await calls(upstream, target(port))
        finally:
            await pool.close()
            server.close()

    return asyncio.run(main())


def test_a_refused_connection_is_a_connection_error() -> None:
    async def calls(upstream: Upstream, model: ResolvedModel) -> None:
        await upstream.complete(model, dict(BODY))

    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        try:
            await calls(Upstream(GeneralSettings(request_timeout=5)), target(port))
        finally:
            await pool.close()

    with pytest.raises(UpstreamConnectionError) as caught:
        asyncio.run(main())
    assert caught.value.status == 502 and "sk-pool-1" not in str(caught.value)


def test_an_upstream_that_never_answers_is_a_timeout() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        await reader.read()  # holds the connection, says nothing

    with pytest.raises(UpstreamTimeoutError) as caught:
        run(silent, lambda upstream, model: upstream.complete(model, dict(BODY)), timeout=0.5)
    assert caught.value.status == 504


def test_an_answer_cut_before_its_declared_length_is_a_bad_gateway() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        whole = reply(ANSWER)
        writer.write(whole.replace(b"content-length: %d" % len(ANSWER), b"content-length: 9999"))
        await writer.drain()

    with pytest.raises(UpstreamError) as caught:
        run(cut, lambda upstream, model: upstream.complete(model, dict(BODY)))
    assert caught.value.status == 502


def test_a_kept_alive_connection_the_upstream_closed_is_not_a_failure() -> None:
    """The upstream closes its keep-alive connection after each answer (a server's idle timeout): the next call
    opens a new one and succeeds, and the upstream saw each request once."""
    seen: list[int] = []

    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        seen.append(n)
        writer.write(reply(ANSWER))  # keep-alive implied (HTTP/1.1), then closed
        await writer.drain()

    async def calls(upstream: Upstream, model: ResolvedModel) -> list[str]:
        answers = []
        for _ in range(3):
            answers.append((await upstream.complete(model, dict(BODY)))["choices"][0]["message"]["content"])
            await asyncio.sleep(0)  # let the close arrive (or not) before the next call
        return answers

    assert run(once, calls) == ["yo", "yo", "yo"]
    assert len(seen) == 3


def test_no_cookie_travels_from_one_call_to_the_next() -> None:
    """An upstream's Set-Cookie is not kept: the next call, perhaps another tenant's, must not carry it."""
    requests: list[bytes] = []

    async def cookie(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            requests.append(await read_request(reader))
            writer.write(reply(ANSWER, b"set-cookie: session=tenant-a-secret; Path=/"))
            await writer.drain()

    async def calls(upstream: Upstream, model: ResolvedModel) -> None:
        for _ in range(2):
            await upstream.complete(model, dict(BODY))

    run(cookie, calls)
    assert len(requests) == 2 and all(b"tenant-a-secret" not in request for request in requests)


def test_a_stream_event_larger_than_aiohttps_line_limit_is_read_whole() -> None:
    """A streamed tool call's arguments may come in one large event: lines are not capped at aiohttp's 128 KiB."""
    big = "x" * 300_000
    chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"role": "assistant", "content": big}, "finish_reason": "stop"}]}  # fmt: skip

    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        events = b"data: " + orjson.dumps(chunk) + b"\n\ndata: [DONE]\n\n"
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n" % len(events)
        writer.write(head + events)
        await writer.drain()

    async def calls(upstream: Upstream, model: ResolvedModel) -> str:
        opened = await upstream.open_stream(model, {**BODY, "stream": True})
        text = ""
        try:
            async for piece in opened:
                text += "".join((c.get("delta") or {}).get("content") or "" for c in piece.get("choices", []))
        finally:
            await opened.aclose()
        return text

    assert run(stream, calls) == big
