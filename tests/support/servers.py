"""Run an ASGI app under a real uvicorn server on 127.0.0.1, in a background thread (like httpx's tests)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
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


T = TypeVar("T")


@dataclass
class Probes:
    """``/healthz`` timings taken while a request was being handled."""

    latencies: list[float] = field(default_factory=list)  # every probe sent while the request was handled
    counted: int = 0  # of them, those sent while ``counting()`` held


def probe_healthz_while(
    url: str,
    send: Callable[[], T],
    started: Callable[[], bool] = lambda: True,
    counting: Callable[[], bool] = lambda: False,
) -> tuple[Probes, T]:
    """Run ``send()`` in a thread and time ``/healthz`` every 10 ms, from when ``started()`` holds until ``send``
    returns: the probes (each asserted 200) and what ``send`` returned. A probe sent while the request is
    handled counts, however late it ends."""
    outcome: list[T] = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append(send())
        finally:
            done.set()

    probes = Probes()
    with httpx.Client(timeout=60) as client:
        client.get(f"{url}/healthz")  # connect before the measurement
        sender = threading.Thread(target=run)
        sender.start()
        while not done.wait(0.01 if started() else 0.001):  # paced by the event, not a synchronisation
            if not started():
                continue
            counted = counting()
            begin = time.perf_counter()
            response = client.get(f"{url}/healthz")
            probes.latencies.append(time.perf_counter() - begin)
            probes.counted += counted
            assert response.status_code == 200
        sender.join()
    assert outcome, "the request got no answer"
    return probes, outcome[0]
