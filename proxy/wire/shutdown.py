"""Requests cut short by the server's shutdown still get OpenAI's error shape.

When its graceful-shutdown period ends, uvicorn cancels the requests still running. One cancelled before its
response began (waiting for an inline compaction, or for a slow upstream) would get uvicorn's own
``text/plain`` "Internal Server Error", which SDKs do not retry. This middleware answers it with a 503 in
OpenAI's error JSON instead; SDKs retry that, on another replica or once the proxy is back. Nothing of the
request is lost: whatever it stored was committed whole before, and a retry finds it.
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.errors import ShuttingDownError
from proxy.wire.http import error_response


class AnswerOnShutdown:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if started or task is None:
                raise
            task.uncancel()  # the cancellation is answered here: the task ends normally with the 503
            error = ShuttingDownError("lcm-proxy is shutting down; the request was not answered. Retry it.")
            await error_response(error, {"retry-after": "1"})(scope, receive, send)
