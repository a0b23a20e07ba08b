"""Streamed responses that stop, and close what feeds them, as soon as the client is gone (``ClosingStream``).

Starlette's ``StreamingResponse`` watches for ``http.disconnect`` beside the sending, and then cancels it. A
cancellation only lands at a wait that is not over yet (anyio delivers it to a task whose awaited future is
still pending). A client that stopped reading and then closed leaves the proxy a backlog: when its close is
seen, the upstream's data is already buffered and every send returns at once (the connection is gone), so
every wait of the sender is over before the cancellation can land. It relayed the upstream's whole answer to
nobody, holding the upstream's connection and its memory (40 such clients: none cancelled after 95 s, 298 →
759 MB); a client that simply hung up, with nothing buffered, was cancelled at once.

``ClosingStream`` also checks, before each chunk, whether the client is gone, and stops there. However the
body ends, its iterator is then closed (``aclose``): that closes the upstream's stream now, not when the
iterator happens to be collected.
"""

from __future__ import annotations

import logging

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

log = logging.getLogger("lcm_proxy.wire")

# The most the closing of a body's iterator (the upstream's connection) may take once its client is gone.
CLOSE_SECONDS = 10.0


class ClosingStream(StreamingResponse):
    """A ``StreamingResponse`` that stops between two chunks once the client is gone, and closes its body."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        gone = anyio.Event()
        try:
            async with anyio.create_task_group() as group:

                async def watch() -> None:
                    await self.listen_for_disconnect(receive)
                    gone.set()  # seen by the sender between two chunks, when it does not wait
                    group.cancel_scope.cancel()  # and when it waits: for the upstream, or for a send

                group.start_soon(watch)
                try:
                    await self._send_body(send, gone)
                except OSError:  # a server of ASGI 2.4 raises it from a send to a connection that is gone
                    log.debug("the client left during a streamed response")
                group.cancel_scope.cancel()  # the body is sent, or the client gone: stop watching
        finally:
            await self._close_body()
        if self.background is not None:
            await self.background()

    async def _send_body(self, send: Send, gone: anyio.Event) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for chunk in self.body_iterator:
            if gone.is_set():
                return  # nobody reads the rest: the body is closed, and with it the upstream's stream
            body = chunk if isinstance(chunk, bytes | memoryview) else chunk.encode(self.charset)
            await send({"type": "http.response.body", "body": body, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _close_body(self) -> None:
        close = getattr(self.body_iterator, "aclose", None)
        if close is None:
            return
        with anyio.move_on_after(CLOSE_SECONDS, shield=True):
            try:
                await close()
            except Exception:  # closing a broken connection must not mask how the response ended
                log.debug("error while closing a streamed response's body", exc_info=True)


async def aclose_iterator(iterator: object) -> None:
    """Close an async iterator that can be closed (an async generator; ``UpstreamStream``'s own iterator)."""
    close = getattr(iterator, "aclose", None)
    if close is not None:
        await close()
