"""The Messages door's streams: the upstream's events relayed as they come and added up to the stored answer
(``relay``); for an upstream slow to answer, the proxy's own ``message_start`` and ``ping`` events first
(``late``; Claude Code gives up on a stream silent for 300 s), the upstream's ``message_start`` then not
relayed and its usage joined to the final ``message_delta``; the reported usage shifted when
``client_usage: client`` asks for the client's own count (``with_usage_shift``)."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.background import BackgroundTask
from starlette.responses import Response

from proxy.engine.engine import Prepared
from proxy.errors import InternalError, UpstreamError
from proxy.relay.turn import Record
from proxy.wire.http import REPORTED, to_proxy_error
from proxy.wire.messages.answer import PING, Accumulator, event
from proxy.wire.messages.calls import Events, Opened
from proxy.wire.messages.validation import anthropic_error, worded
from proxy.wire.streaming import ClosingStream

log = logging.getLogger("lcm_proxy.wire")

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
PING_SECONDS = 10.0


def streaming(body: AsyncIterator[bytes], headers: dict[str, str], background: BackgroundTask | None) -> Response:
    return ClosingStream(
        body, media_type="text/event-stream", headers={**SSE_HEADERS, **headers}, background=background
    )


async def pinged(events: Events) -> AsyncIterator[tuple[bytes, dict[str, Any] | None]]:
    """The events, with a ``ping`` (and None for its event) whenever the upstream is silent ``PING_SECONDS``."""
    source = aiter(events)
    while True:
        step = asyncio.ensure_future(anext(source))
        try:
            while not (await asyncio.wait({step}, timeout=PING_SECONDS))[0]:
                yield PING, None
        except BaseException:
            step.cancel()
            raise
        try:
            yield step.result()
        except StopAsyncIteration:
            return


async def relay(
    opened: Opened, record: Record | None, leave: Callable[[], None], skip_start: bool = False, shift: int = 0
) -> AsyncIterator[bytes]:
    """The upstream's events as they came; the answer stored once the stream reached ``message_stop``.
    ``shift``: input tokens added to the reported usage (``client_usage``)."""
    answer = Accumulator()
    started: dict[str, Any] = {}
    try:
        async for raw, data in pinged(opened.events):
            if data is None:
                yield raw
                continue
            answer.feed(data)
            if skip_start and data.get("type") == "message_start":
                started = (data.get("message") or {}).get("usage") or {}
                continue
            if skip_start and data.get("type") == "message_delta" and started:
                usage = {**{k: v for k, v in started.items() if k != "output_tokens"}, **(data.get("usage") or {})}
                data = {**data, "usage": usage}
                raw = event(data)
            if shift:
                raw = event(with_usage_shift(data, shift))
            yield raw
        if not answer.complete:  # the upstream's stream ended before message_stop: say so, never a silent cut
            cut = UpstreamError("The upstream's stream ended before its message_stop: the answer is incomplete.")
            yield event(anthropic_error(cut))
        elif record is not None:
            await record(answer.message())
    except REPORTED as error:
        yield event(anthropic_error(worded(to_proxy_error(error))))
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("unexpected error while relaying a Messages stream")
        yield event(anthropic_error(InternalError("Internal error in lcm-proxy while streaming.")))
    finally:
        try:
            await opened.close()
        finally:
            leave()


def with_usage_shift(data: dict[str, Any], shift: int) -> dict[str, Any]:
    """An answer, or a ``message_start`` / ``message_delta`` event, with ``shift`` more input tokens."""
    if not shift:
        return data
    if data.get("type") == "message_start" and isinstance(data.get("message"), dict):
        return {**data, "message": with_usage_shift(data["message"], shift)}
    usage = data.get("usage")
    if not isinstance(usage, dict) or not isinstance(usage.get("input_tokens"), int):
        return data
    return {**data, "usage": {**usage, "input_tokens": usage["input_tokens"] + shift}}


def message_start(model: str) -> bytes:
    usage = {"input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    message: dict[str, Any] = {
        "id": "msg_lcm_" + secrets.token_hex(12), "type": "message", "role": "assistant", "model": model,
        "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage,
    }  # fmt: skip
    return event({"type": "message_start", "message": message})


Outcome = Callable[[Prepared | None], tuple[Record | None, int]]  # where the answer goes, and the usage shift


async def late(
    model: str, opening: Awaitable[tuple[Opened, Prepared | None]], leave: Callable[[], None], outcome: Outcome
) -> AsyncIterator[bytes]:
    """A stream whose upstream was slow to answer: the proxy's ``message_start``, pings, then the upstream's.
    ``outcome`` tells, for the context finally sent, where the answer is recorded and the usage shift."""
    task = asyncio.ensure_future(opening)
    relayed = False
    try:
        yield message_start(model)
        while not (await asyncio.wait({task}, timeout=PING_SECONDS))[0]:
            yield PING
        opened, prepared = task.result()
        relayed = True
        record, shift = outcome(prepared)
        async for chunk in relay(opened, record, leave, skip_start=True, shift=shift):
            yield chunk
    except REPORTED as error:
        yield event(anthropic_error(worded(to_proxy_error(error))))
    finally:
        task.cancel()
        if not relayed:
            try:
                if task.done() and not task.cancelled() and task.exception() is None:
                    await task.result()[0].close()  # opened just as the client left: nobody reads it
            finally:
                leave()
