"""A streaming client that stops reading and then closes: the proxy notices while its send is blocked and
hangs up on the upstream, as it does for a client that simply hangs up (``test_upstream_errors``).

Such a client leaves the proxy a backlog: once its close is seen, every send returns at once and the
upstream's data is already buffered, so a cancellation that lands only at a wait not over yet never landed,
and the proxy relayed the upstream's whole answer to nobody, holding its memory (40 such clients: none
cancelled after 95 s, 298 → 759 MB). The upstream here (``tests.support.endless``) streams faster than the
proxy relays and more than every buffer on the way holds; ``SendWatch`` says when the proxy's send to the
client blocked.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.app import create_app
from tests.support.endless import endless_upstream
from tests.support.proxies import assert_doctor_passes, make_config
from tests.support.servers import serve_in_thread

CHUNKS = 400_000  # about 60 MB of SSE: far more than the sockets and buffers between upstream and client hold


class SendWatch:
    """Outermost ASGI middleware: ``blocked`` is set once a send of a response's body had to wait. uvicorn's send
    waits only when the connection's transport has paused writing (the client is not reading what it has);
    otherwise it returns without yielding to the event loop, before a callback scheduled with ``call_soon`` can
    run, so the callback runs only if the send waited."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.blocked = threading.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def watched(message: Message) -> None:
            if message["type"] != "http.response.body":
                await send(message)
                return
            returned = False

            def waited() -> None:
                if not returned:
                    self.blocked.set()

            check = asyncio.get_running_loop().call_soon(waited)
            try:
                await send(message)
            finally:
                returned = True
                check.cancel()

        await self.app(scope, receive, watched)


def _request(model: str) -> bytes:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def test_a_client_that_stops_reading_and_then_closes_cancels_the_upstream_stream(
    upstream_url: str, tmp_path: Path
) -> None:
    with endless_upstream(CHUNKS) as upstream:
        model = {
            "model_name": "endless",
            "litellm_params": {"model": "openai/fake-model", "api_base": f"{upstream.url}/v1", "api_key": "sk-x"},
            "model_info": {"max_input_tokens": 100000},
        }
        # The proxy's wait for a chunk outlasts this test's: its own timeout cannot be what ends the stream.
        config = make_config(upstream_url, tmp_path / "data", models=[model], request_timeout=600)
        watch = SendWatch(create_app(config))
        with serve_in_thread(watch) as url:
            address = urlsplit(url)
            client = socket.socket()
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window, filled at once
            try:
                client.connect((address.hostname, address.port))
                client.sendall(_request("endless"))
                received = b""
                while b" w3" not in received:  # a little of the answer, then no more reading
                    data = client.recv(4096)
                    assert data, f"the proxy closed the stream: {received!r}"
                    received += data
                assert received.startswith(b"HTTP/1.1 200 ")
                assert watch.blocked.wait(60), "the proxy's send to the client never blocked"
            finally:
                client.close()
            assert upstream.ended.wait(120), f"the upstream's stream is still open ({upstream.sent} chunks sent)"
            assert upstream.hung_up, f"the proxy relayed the whole answer to nobody ({upstream.sent} chunks)"
            assert upstream.sent < CHUNKS
            assert httpx.get(f"{url}/healthz", timeout=30).status_code == 200
    assert_doctor_passes([config.general_settings.location()])
