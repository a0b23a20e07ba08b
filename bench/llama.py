"""llama.cpp on loopback for the benchmarks and the real-model tests: ``xllamacpp`` (llama.cpp's own server,
embedded) in a child process, so its threads never share the GIL with the client or the proxy under test."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

LLAMA_SERVER = """
import sys, time
import xllamacpp as xlc
path, port, n_ctx, threads, parallel = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
p = xlc.CommonParams()
p.model.path = path
p.n_ctx = n_ctx
p.n_parallel = parallel
p.hostnames = ["127.0.0.1"]
p.port = port
p.cpuparams.n_threads = threads
p.cpuparams_batch.n_threads = threads
p.use_jinja = True
server = xlc.Server(p)
print("ready", flush=True)
while True:
    time.sleep(3600)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def llama_server(model: Path, window: int, threads: int, parallel: int = 1) -> Iterator[str]:
    """Serve ``model`` with llama.cpp (``n_ctx = window``, ``parallel`` slots) in a child process; yield its
    base URL."""
    port = free_port()
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            [sys.executable, "-c", LLAMA_SERVER, str(model), str(port), str(window), str(threads), str(parallel)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 300
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                if process.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(
                        "llama.cpp server did not start:\n" + log.read()[-2000:].decode(errors="replace")
                    )
                time.sleep(0.5)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
