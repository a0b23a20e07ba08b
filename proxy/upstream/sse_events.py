"""Typed SSE streams read natively (Anthropic's Messages, OpenAI's Responses): each event's bytes as received,
parsed once and checked against the shape its readers rely on.

A native stream is relayed to its client as it came, so the bytes are kept (``Event.raw``); the proxy still
reads every event (the door's accumulator, the recall loop), so each is parsed and its shape checked here,
where a malformed event becomes a 502 ``upstream_bad_stream`` naming the upstream rather than a 500 later.
What each format requires of its events is the subclass's ``SHAPES`` (and ``well_formed`` for rules a table
cannot say). Translated streams (``proxy.upstream.translate``, ``proxy.upstream.translate_responses``) yield
the same ``Event`` so a door handles native and translated events alike.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson

from proxy.errors import UpstreamError
from proxy.upstream.errors import capital, map_litellm_exceptions
from proxy.upstream.pool import Answer

MAX_EVENT_BYTES = 16 << 20  # one event larger than this is a broken stream, not an answer


@dataclass
class Event:
    """One SSE event: its bytes as received (relayed unchanged) and its parsed data."""

    raw: bytes
    data: dict[str, Any]

    @property
    def type(self) -> str:
        return str(self.data.get("type", ""))


def sse_bytes(event: dict[str, Any]) -> bytes:
    """One event as an SSE frame: ``event: <type>`` and its compact JSON."""
    return b"event: " + str(event.get("type", "")).encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def has_shape(data: dict[str, Any], shapes: dict[str, tuple[tuple[str, type], ...]]) -> bool:
    """Whether ``data`` holds every field its type requires, each of the right JSON type (bools are no ints)."""
    for key, kind in shapes.get(str(data.get("type")), ()):
        value = data.get(key)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return False
    return True


class EventStream:
    """An open SSE stream of JSON events: each parsed once and checked; closed exactly once."""

    # What an event of each type must hold for its readers to use it: type -> ((field, JSON type), ...).
    SHAPES: ClassVar[dict[str, tuple[tuple[str, type], ...]]] = {}
    END: ClassVar[bytes | None] = None  # a data line that ends the stream without being an event (``[DONE]``)

    def __init__(
        self, response: Answer, upstream: str, timeout: float | None = None, credentials: tuple[str, ...] = ()
    ) -> None:
        self._response = response
        self._upstream = upstream
        self._timeout = timeout
        self._credentials = credentials
        self._chunks = response.aiter_raw(1 << 16)
        self._buffer = b""
        self._closed = False
        self._hooks: list[Callable[[], None]] = []

    def on_close(self, hook: Callable[[], None]) -> None:
        self._hooks.append(hook)

    def well_formed(self, data: dict[str, Any]) -> bool:
        return has_shape(data, self.SHAPES)

    async def next_event(self) -> Event | None:
        while True:
            cut = self._buffer.find(b"\n\n")
            if cut >= 0:
                block, self._buffer = self._buffer[: cut + 2], self._buffer[cut + 2 :]
                event = self._parse(block)
                if event is not None:
                    return event
                continue
            if len(self._buffer) > MAX_EVENT_BYTES:
                raise UpstreamError(f"{capital(self._upstream)} sent an event too large to relay.", status=502)
            with map_litellm_exceptions(self._timeout, self._credentials, self._upstream):
                chunk = await anext(self._chunks, None)
            if chunk is None:
                return self._parse(self._buffer) if self._buffer.strip() else None
            self._buffer += chunk.replace(b"\r\n", b"\n")

    def _parse(self, block: bytes) -> Event | None:
        data = b"".join(line[5:].strip() for line in block.split(b"\n") if line.startswith(b"data:"))
        if not data or data == self.END:
            return None  # a comment, an empty block, or an end marker
        try:
            parsed = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise UpstreamError(
                f"{capital(self._upstream)} sent a stream event that is not JSON.", status=502
            ) from None
        if not isinstance(parsed, dict) or not self.well_formed(parsed):
            raise UpstreamError(
                f"{capital(self._upstream)} sent a malformed stream event.", status=502, code="upstream_bad_stream"
            )
        return Event(block if block.endswith(b"\n\n") else block + b"\n\n", parsed)

    async def __aiter__(self) -> AsyncIterator[Event]:
        while (event := await self.next_event()) is not None:
            yield event

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._response.aclose()
        finally:
            for hook in self._hooks:
                hook()
