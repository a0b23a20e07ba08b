"""An upstream that streams a chat answer far longer than any buffer between it and a client holds, as fast as
its reader reads: a raw asyncio server on 127.0.0.1, in a thread of its own.

``FakeUpstream`` (Starlette under uvicorn) spends about as long on a chunk as the proxy does; this one writes
its chunks faster than the proxy can relay them, so the proxy always has the upstream's data waiting, as it
does behind a fast provider once its client stopped reading. It says whether its reader hung up before the
last chunk (``hung_up``) once the stream has ended (``ended``): wait on the event, not on time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class Endless:
    """One server: its URL, and what became of the stream it sent (one per server)."""

    chunks: int  # content chunks to send, at most: more than any buffering on the way holds
    url: str = ""
    ended: threading.Event = field(default_factory=threading.Event)  # the stream ended, however it ended
    hung_up: bool = False  # the reader closed the connection before the last chunk
    sent: int = 0  # content chunks written

    def frame(self, data: str) -> bytes:
        payload = f"data: {data}\n\n".encode()
        return f"{len(payload):x}\r\n".encode() + payload + b"\r\n"  # one piece of a chunked body

    def chunk(self, delta: dict[str, object], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        event = {"id": "chatcmpl-endless", "object": "chat.completion.chunk", "created": 0, "model": "fake-model"}
        return self.frame(json.dumps({**event, "choices": [choice]}))

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            await reader.readexactly(length)
            if not head.startswith(b"POST /v1/chat/completions "):
                writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                await writer.drain()
                return
            await self.stream(writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def stream(self, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
            b"connection: close\r\n\r\n" + self.chunk({"role": "assistant", "content": ""})
        )
        try:
            for i in range(self.chunks):
                writer.write(self.chunk({"content": f" w{i}"}))
                self.sent += 1
                await writer.drain()
            writer.write(self.chunk({}, "stop") + self.frame("[DONE]") + b"0\r\n\r\n")
            await writer.drain()
        except ConnectionError:
            self.hung_up = True
        finally:
            self.ended.set()


@contextlib.contextmanager
def endless_upstream(chunks: int) -> Iterator[Endless]:
    """An ``Endless`` serving on 127.0.0.1 for the block."""
    upstream = Endless(chunks)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    stop: asyncio.Future[None] | None = None

    async def main() -> None:
        nonlocal stop
        server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0)
        upstream.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        stop = loop.create_future()
        started.set()
        async with server:
            await stop

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert started.wait(30), "the endless upstream did not start"
    try:
        yield upstream
    finally:

        def finish() -> None:
            if stop is not None and not stop.done():
                stop.set_result(None)

        loop.call_soon_threadsafe(finish)
        thread.join(timeout=10)
        loop.close()
