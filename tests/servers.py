"""Run an ASGI app under a real uvicorn server on 127.0.0.1, in a background thread (like httpx's tests)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn


class _ThreadServer(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # only the main thread may install them
        pass


@contextlib.contextmanager
def serve_in_thread(app: Any, host: str = "127.0.0.1") -> Iterator[str]:
    """Yield the server's base URL (``http://127.0.0.1:PORT``) while it runs."""
    config = uvicorn.Config(app, host=host, port=0, log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
    server = _ThreadServer(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("server failed to start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
