"""An open streamed completion: the upstream's SSE events read as sent, checked, and cut off when idle.

For providers that speak OpenAI's format the proxy reads the SSE lines itself (see ``sse_chunks``); for the
others LiteLLM translates the chunks (``proxy.upstream.client``). Either way the chunks reach the rest of the proxy
through ``UpstreamStream``, which owns three guarantees:

* **Every failure is an ``UpstreamError``**: the provider's own error event with its fields, a stream cut
  before its ``finish_reason`` (``upstream_stream_truncated``), an event the proxy cannot read
  (``upstream_bad_stream``: not JSON, or a field in a shape no reader can use, checked by
  ``proxy.upstream.rounds.check_chunk``). Nothing malformed reaches code that would fail with a 500.
* **The timeout counts data, not bytes.** httpx's read timeout restarts on every byte, so an upstream that
  sends SSE comments (``: ping``) forever would never time out. The wait for each next *chunk* has its own
  deadline (the model's ``stream_timeout``, else its ``timeout``), and comments do not reset it.
* **It is closed exactly once**, whatever ends it.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import orjson

from proxy.errors import UpstreamError, UpstreamTimeoutError
from proxy.types import Chunk
from proxy.upstream.errors import DEFAULT_UPSTREAM, is_cut_off, map_litellm_exceptions, redact_upstream_message
from proxy.upstream.pool import Answer
from proxy.upstream.rounds import bad_stream, check_chunk
from proxy.upstream.shapes import chunk_to_json

log = logging.getLogger("lcm_proxy.upstream")


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def truncated() -> UpstreamError:
    return UpstreamError(
        "The upstream provider closed the stream before the response was complete.",
        status=502,
        code="upstream_stream_truncated",
    )


async def sse_chunks(
    response: Answer, include_usage: bool, credentials: Iterable[str] = (), upstream: str = DEFAULT_UPSTREAM
) -> AsyncIterator[Chunk]:
    """An OpenAI-compatible upstream's own SSE events, relayed as sent.

    LiteLLM has opened the call (routing, credentials, timeouts, error mapping), but for a provider that
    already speaks OpenAI's format its per-chunk work only costs: the OpenAI SDK builds a pydantic object
    per event and LiteLLM rebuilds it as its own (~0.35 ms of CPU per chunk), rewrites ``created``, wraps
    the usage chunk in a fake choice and reports a cut stream as a clean "stop". Reading the response's
    lines ourselves keeps the upstream's chunks exactly as sent."""
    started: set[int] = set()  # choice indexes seen, and those that finished (n > 1 streams interleave them)
    finished: set[int] = set()
    data_lines: list[str] = []
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            data_lines.append(line[5:].lstrip())
            continue
        if line or not data_lines:
            continue  # comments (": keep-alive"), event:/id:/retry: fields, repeated blank lines
        payload, data_lines = "\n".join(data_lines), []
        if payload == "[DONE]":
            break
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise bad_stream(upstream, "an event that is not JSON") from None
        if isinstance(event, dict) and event.get("error") and not event.get("choices"):
            _raise_stream_error(event["error"], credentials)
        choices = check_chunk(event, upstream)
        for choice in choices:
            started.add(choice.get("index", 0))
            if choice.get("finish_reason"):
                finished.add(choice.get("index", 0))
        if event.get("usage") is not None and not choices and not include_usage:
            continue  # a usage chunk the client did not ask for
        yield event
    if not started or started - finished:
        raise truncated()  # some choice (or the whole answer) never reached its finish_reason


def _raise_stream_error(error: Any, credentials: Iterable[str] = ()) -> None:
    """An error event inside the upstream's stream, as the OpenAI SDK would have raised it."""
    body: dict[str, Any] = error if isinstance(error, dict) else {"message": str(error)}
    code = body.get("code")
    status = code if isinstance(code, int) and 400 <= code < 600 else 502
    raise UpstreamError(
        redact_upstream_message(
            str(body.get("message") or "The upstream provider reported an error mid-stream."), credentials
        ),
        status=status,
        type=redact_upstream_message(str(body.get("type") or "upstream_error"), credentials),
        code=redact_upstream_message(str(code), credentials) if code is not None else None,
    )


class UpstreamStream:
    """An open streamed completion: async-iterates OpenAI chunk dicts, always closed exactly once."""

    def __init__(
        self,
        wrapper: Any,
        chunks: AsyncIterator[Chunk],
        timeout: float,
        credentials: Iterable[str] = (),
        upstream: str = DEFAULT_UPSTREAM,
    ) -> None:
        self._wrapper = wrapper
        self._chunks = chunks
        self._timeout = timeout
        self._credentials = tuple(credentials)
        self._upstream = upstream
        self._first: Chunk | None = None
        self._closed: Callable[[], None] | None = None

    def on_close(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` (idempotent) once the stream is closed, or collected unclosed (never iterated)."""
        self._closed = hook
        weakref.finalize(self, hook)

    async def prime(self) -> None:
        """Read the first chunk now: failures before the first byte become a real HTTP status."""
        self._first = await self.next_chunk()

    async def next_chunk(self) -> Chunk | None:
        """The next chunk, or None at the end; every failure leaves as an ``UpstreamError``."""
        try:
            async with asyncio.timeout(self._timeout):  # per chunk: keep-alive comments do not reset it
                with map_litellm_exceptions(self._timeout, self._credentials, self._upstream):
                    return await anext(self._chunks, None)
        except TimeoutError:
            raise UpstreamTimeoutError(f"{_capital(self._upstream)} sent no data for {self._timeout:g} s.") from None
        except UpstreamError as error:
            # A connection that breaks mid-body is a cut-off stream too, not the provider's own error.
            if (
                isinstance(error, UpstreamTimeoutError)
                or error.code == "upstream_stream_truncated"
                or not is_cut_off(error)
            ):
                raise
            raise truncated() from error

    async def __aiter__(self) -> AsyncIterator[Chunk]:
        try:
            chunk, self._first = self._first, None
            while chunk is not None:
                yield chunk
                chunk = await self.next_chunk()
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        try:
            for close in (getattr(self._chunks, "aclose", None), getattr(self._wrapper, "aclose", None)):
                if close is not None:
                    try:
                        await close()
                    except Exception:  # closing a broken connection must never mask the real outcome
                        log.debug("error while closing upstream stream", exc_info=True)
        finally:
            if self._closed is not None:
                self._closed()


async def litellm_chunks(wrapper: Any, include_usage: bool) -> AsyncIterator[Chunk]:
    """Chunks as LiteLLM translated them: providers that do not speak OpenAI's wire format."""
    async for chunk in wrapper:
        # LiteLLM turns an upstream stream that ends without a finish_reason into a clean "stop". A client
        # must learn its answer was cut, so a finish the upstream never sent becomes an error instead.
        finished = any(getattr(c, "finish_reason", None) for c in getattr(chunk, "choices", []) or [])
        if finished and getattr(wrapper, "received_finish_reason", "unknown") is None:
            raise truncated()
        data = chunk_to_json(chunk, include_usage)
        if data is not None:
            yield data
