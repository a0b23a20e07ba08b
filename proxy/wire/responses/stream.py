"""The Responses door's streams: the upstream's events relayed one by one, renumbered under the proxy's response
id, and added up to the response that is stored (``relay``); for an upstream slow to answer, the proxy's own
``response.created`` and a ``response.in_progress`` every ``PING_SECONDS`` first (``late``: Codex gives up on a
stream with no event for 300 s), the upstream's own opening events then not relayed; a stream that ends at once
in ``response.failed`` (``failed_stream``). Every stream ends in ``response.completed``, ``response.incomplete``
or ``response.failed``, never silently."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.background import BackgroundTask
from starlette.responses import Response

from proxy.engine.engine import Prepared
from proxy.errors import InternalError, UpstreamError
from proxy.wire.http import REPORTED, to_proxy_error
from proxy.wire.responses.calls import Opened
from proxy.wire.responses.events import ENDINGS, Numbering, Output, failure, shell, sse
from proxy.wire.responses.issued import response_id
from proxy.wire.responses.turn import Turn
from proxy.wire.streaming import ClosingStream

log = logging.getLogger("lcm_proxy.wire")

PING_SECONDS = 10.0
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class Guarded:
    """A stream's body that gives back what was taken for it even if it never starts: the server may fail to
    send the response's start (a client gone, a cancellation there), and closing an async generator that never
    ran skips its ``finally``, which is where the upstream's stream is closed and the priority slot left."""

    def __init__(self, body: AsyncIterator[bytes], unstarted: Callable[[], Awaitable[None]]) -> None:
        self.body = body
        self.unstarted: Callable[[], Awaitable[None]] | None = unstarted

    def __aiter__(self) -> Guarded:
        return self

    async def __anext__(self) -> bytes:
        self.unstarted = None  # the body's own ``finally`` takes over
        return await anext(self.body)

    async def aclose(self) -> None:
        release, self.unstarted = self.unstarted, None
        try:
            if release is not None:
                await release()
        finally:
            await self.body.aclose()  # type: ignore[attr-defined]


def streaming(body: AsyncIterator[bytes], headers: dict[str, str], background: BackgroundTask | None) -> Response:
    return ClosingStream(
        body, media_type="text/event-stream", headers={**SSE_HEADERS, **headers}, background=background
    )


def failed_stream(request: dict[str, Any], error: Any, headers: dict[str, str]) -> Response:
    """A stream that ends at once in ``response.failed`` (Codex reads a context that cannot fit from it)."""
    numbering = Numbering(response_id(), str(request.get("model", "")))

    async def events() -> AsyncIterator[bytes]:
        response = shell(numbering.response_id, numbering.model, request)
        yield sse(numbering({"type": "response.created", "response": response}))
        failed = {**response, "status": "failed", "error": failure(error)}
        yield sse(numbering({"type": "response.failed", "response": failed}))

    return streaming(events(), headers, None)


async def relay(
    turn: Turn, opened: Opened, prepared: Prepared | None, leave: Callable[[], None], numbering: Numbering | None = None
) -> AsyncGenerator[bytes, None]:
    """The upstream's events, renumbered under the proxy's id; the answer stored once the stream completed.
    With ``numbering`` the proxy's own opening events went out already: the upstream's are not relayed."""
    late = numbering is not None
    numbering = numbering or Numbering(turn.id, turn.model)
    output = Output()
    try:
        async for data in opened.events:
            output.feed(data)
            if late and data.get("type") in ("response.created", "response.in_progress"):
                continue
            if data.get("type") in ENDINGS:
                break
            yield sse(numbering(data))
        final = output.response()
        if final is None:
            cut = UpstreamError("The upstream's stream ended before its response.completed: the answer is incomplete.")
            yield failed(numbering, turn, cut)
            return
        kind_ = "response.completed" if final.get("status", "completed") == "completed" else "response.incomplete"
        if final.get("status") == "failed":
            kind_ = "response.failed"
        final = await turn.finished(final, prepared)
        yield sse(numbering({"type": kind_, "response": final}))
    except REPORTED as error:
        yield failed(numbering, turn, to_proxy_error(error))
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("unexpected error while relaying a Responses stream")
        yield failed(numbering, turn, InternalError("Internal error in lcm-proxy while streaming."))
    finally:
        try:
            await opened.close()
        finally:
            leave()


def failed(numbering: Numbering, turn: Turn, error: Any) -> bytes:
    response = {**shell(turn.id, turn.model, turn.call.body, "failed"), "error": failure(error)}
    return sse(numbering({"type": "response.failed", "response": response}))


async def late(turn: Turn, opening: asyncio.Future[Any], leave: Callable[[], None]) -> AsyncIterator[bytes]:
    numbering = Numbering(turn.id, turn.model)
    relayed = False
    try:
        start = shell(turn.id, turn.model, turn.call.body)
        yield sse(numbering({"type": "response.created", "response": start}))
        while not (await asyncio.wait({opening}, timeout=PING_SECONDS))[0]:
            yield sse(numbering({"type": "response.in_progress", "response": start}))
        opened, prepared = opening.result()
        relayed = True
        inner = relay(turn, opened, prepared, leave, numbering)
        try:
            async for chunk in inner:
                yield chunk
        finally:
            await inner.aclose()  # now, not when it is collected: it closes the upstream and leaves the slot
    except REPORTED as error:
        yield failed(numbering, turn, to_proxy_error(error))
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("unexpected error while opening a Responses stream")
        yield failed(numbering, turn, InternalError("Internal error in lcm-proxy while streaming."))
    finally:
        opening.cancel()
        if not relayed:
            try:
                if opening.done() and not opening.cancelled() and opening.exception() is None:
                    await opening.result()[0].close()  # opened just as the client left: nobody reads it
            finally:
                leave()
