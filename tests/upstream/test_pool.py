"""The aiohttp client of the calls the proxy sends itself (``proxy.upstream.pool``), against raw loopback servers
that misbehave as real ones do: each failure reaches the caller as the same ``UpstreamError`` the httpx and
LiteLLM paths give, never a hang, a 500 or an aiohttp exception."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, ClassVar

import httpx
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


# --- a hostile review's findings: each failed against the first version of the pool --------------------------


def headers_of(request: bytes) -> dict[str, str]:
    head = request.split(b"\r\n\r\n", 1)[0].decode()
    return {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in head.split("\r\n")[1:])}


def captured(calls: Callable[[Upstream, ResolvedModel], Awaitable[Any]]) -> list[bytes]:
    requests: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            requests.append(await read_request(reader))
            writer.write(reply(ANSWER))
            await writer.drain()

    run(serve, calls)
    return requests


def one_call(upstream: Upstream, model: ResolvedModel) -> Awaitable[Any]:
    return upstream.complete(model, dict(BODY))


def test_a_netrc_file_does_not_take_the_place_of_the_deployments_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiohttp with ``trust_env`` reads ~/.netrc, and then refused every call that carries its own key."""
    netrc = tmp_path / "netrc"
    netrc.write_text("default login netrc-user password netrc-secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    assert [headers_of(r)["authorization"] for r in captured(one_call)] == ["Bearer sk-pool-1"]


def test_the_environments_openai_organization_and_project_are_sent_as_litellm_sends_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_ORG_ID", "org-review")
    monkeypatch.setenv("OPENAI_PROJECT_ID", "proj-review")
    sent = {}
    for path in ("litellm", "direct"):
        monkeypatch.setattr(direct, "ENABLED", path == "direct")
        headers = headers_of(captured(one_call)[0])
        sent[path] = (headers.get("openai-organization"), headers.get("openai-project"))
    assert sent["direct"] == sent["litellm"] == ("org-review", "proj-review")


def test_an_upstream_that_never_reads_a_large_body_is_a_timeout_not_a_hang() -> None:
    """aiohttp has no write timeout: the exchange up to the answer's headers is bounded by the call's timeouts."""

    async def deaf(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.Event().wait()  # never reads the body

    big = {**BODY, "messages": [{"role": "user", "content": "x" * (32 << 20)}]}

    async def calls(upstream: Upstream, model: ResolvedModel) -> str:
        try:
            await asyncio.wait_for(upstream.complete(model, big), 30)
        except TimeoutError:
            return "hung"
        except UpstreamError as error:
            return type(error).__name__
        return "answered"

    assert run(deaf, calls, timeout=1) == "UpstreamTimeoutError"


def test_waiting_for_a_pooled_connection_is_bounded_by_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """With every connection to a host busy, the next call waits at most its pool and connect timeouts."""
    monkeypatch.setattr(pool, "LIMIT_PER_HOST", 2)

    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        while True:
            writer.write(b"3\r\n:\n\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.2)

    async def calls(upstream: Upstream, model: ResolvedModel) -> str:
        url = model.litellm_params["api_base"] + "/chat/completions"
        timeout = httpx.Timeout(1, connect=1)
        held = [await pool.send(url, b"{}", {"content-type": "application/json"}, timeout) for _ in range(2)]
        try:
            await asyncio.wait_for(pool.send(url, b"{}", {}, timeout), 10)
            return "sent"
        except TimeoutError:
            return "hung"
        except httpx.TimeoutException as exc:
            return type(exc).__name__
        finally:
            for response in held:
                await response.aclose()

    assert run(trickle, calls, timeout=1) in ("ConnectTimeout", "PoolTimeout", "WriteTimeout")


class Chunks:
    """An aiohttp answer's body, in chunks of ``size`` bytes, and what ``pool.Response`` reads of it."""

    status = 200
    headers: ClassVar[dict[str, str]] = {}

    def __init__(self, data: bytes, size: int) -> None:
        self.content = self
        self._data, self._size = data, size

    async def iter_chunked(self, n: int) -> Any:
        for i in range(0, len(self._data), self._size):
            yield self._data[i : i + self._size]


def test_lines_are_read_whole_across_chunks_of_any_size() -> None:
    """Line ends split across chunks, ``\\r\\n`` and ``\\n``, a long event and a last line without its end: each
    chunk is searched once (the first version split the whole buffer again at every chunk, quadratic in a long
    event's length)."""

    async def lines(data: bytes, size: int) -> list[str]:
        response = pool.Response(Chunks(data, size), "http://upstream.test")  # type: ignore[arg-type]
        return [line async for line in response.aiter_lines()]

    small = b"data: {}\r\n\r\ndata: [DONE]\n\n: tail"
    assert asyncio.run(lines(small, 1)) == ["data: {}", "", "data: [DONE]", "", ": tail"]
    event = b"data: " + b"x" * (1 << 20) + b"\r\n\r\ndata: [DONE]\n\n: tail"
    for size in (7, 1 << 14, len(event)):
        assert asyncio.run(lines(event, size)) == ["data: " + "x" * (1 << 20), "", "data: [DONE]", "", ": tail"]
